#!/bin/sh
# Part 3: the kernel's dm-crypt and ucrypt side by side.
#  a) volumes ucrypt formats open in cryptsetup, and read what ucrypt wrote;
#  b) volumes cryptsetup formats open in ucrypt, and read what dm-crypt wrote
#     (LUKS1; LUKS2 with 512- and 4096-byte sectors);
#  c) every dm-crypt table form ucrypt claims gives byte-identical ciphertext
#     through the kernel's dm-crypt and through `ucrypt map` (AES, and
#     serpent/twofish/camellia), and a serpent LUKS2 volume opens in cryptsetup.
# Sourced by suite.sh with lib.sh loaded.

W=/tmp/dmc
mkdir -p "$W"
pattern "$W/pat" 8   # 8 MiB of random data
head -c 4194304 /dev/urandom > "$W/pat2"

# a + b, for each LUKS variant: NAME TYPE SECTOR
for v in "luks1 luks1 512" "luks2-512 luks2 512" "luks2-4096 luks2 4096"; do
  set -- $v; name=$1; type=$2; ss=$3
  ssarg=""; [ "$type" = luks2 ] && ssarg="--sector-size $ss"
  img="$W/$name-u.img"; truncate -s 48M "$img"

  # a) ucrypt formats and writes; cryptsetup (dm-crypt) opens and reads.
  check "dm-crypt: $name: ucrypt format" ucrypt format -q $FAST_KDF --type "$type" $ssarg -d "$KEY" "$img"
  check "dm-crypt: $name: ucrypt map --write" sh -c "ucrypt map --write --luks '$img' -d '$KEY' < '$W/pat'"
  check "dm-crypt: $name: cryptsetup opens the ucrypt volume" cryptsetup open --key-file "$KEY" "$img" "u-$name"
  check "dm-crypt: $name: dm-crypt reads what ucrypt wrote" sh -c "
    [ \$(blockdev --getss /dev/mapper/u-$name) = $ss ] &&
    dd if=/dev/mapper/u-$name bs=1M count=8 iflag=direct 2>/dev/null | cmp - '$W/pat'"
  # dm-crypt writes 4 MiB at 16 MiB; ucrypt must read it back.
  run dd if="$W/pat2" of="/dev/mapper/u-$name" bs=1M seek=16 oflag=direct conv=fsync
  check "dm-crypt: $name: cryptsetup close" cryptsetup close "u-$name"
  check "dm-crypt: $name: ucrypt reads what dm-crypt wrote (ucrypt-made volume)" sh -c "
    ucrypt map --read --luks '$img' -d '$KEY' | dd bs=1M skip=16 count=4 iflag=fullblock 2>/dev/null | cmp - '$W/pat2'"
  rm -f "$img"

  # b) cryptsetup formats and writes through dm-crypt; ucrypt opens and reads.
  img="$W/$name-c.img"; truncate -s 48M "$img"
  csarg="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
  [ "$type" = luks1 ] && csarg="--pbkdf-force-iterations 1000"
  check "dm-crypt: $name: cryptsetup luksFormat" cryptsetup luksFormat -q --type "$type" $csarg $ssarg \
    --key-file "$KEY" "$img"
  check "dm-crypt: $name: cryptsetup open + dm-crypt writes" sh -c "
    cryptsetup open --key-file '$KEY' '$img' c-$name &&
    dd if='$W/pat' of=/dev/mapper/c-$name bs=1M oflag=direct conv=fsync 2>/dev/null &&
    cryptsetup close c-$name"
  check "dm-crypt: $name: ucrypt map reads what dm-crypt wrote" sh -c "
    ucrypt map --read --luks '$img' -d '$KEY' | head -c 8388608 | cmp - '$W/pat'"
  # And through a frontend: ucrypt serves the cryptsetup volume over ublk.
  before=$(echo /dev/ublkb*)
  if check "dm-crypt: $name: ucrypt open --export ublk of the cryptsetup volume" \
      ucrypt open --export ublk --key-file "$KEY" "$img" "c-$name"; then
    d=""; for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) d=$x ;; esac; done
    check "dm-crypt: $name: /dev/ublkbN reads what dm-crypt wrote" sh -c "
      [ -b '$d' ] && [ \$(blockdev --getss $d) = $ss ] &&
      dd if=$d bs=1M count=8 iflag=direct 2>/dev/null | cmp - '$W/pat'"
    run ucrypt close "c-$name"
  fi
  rm -f "$img"
done

# c) Table forms: the same plaintext through dm-crypt (dmsetup on a loop device)
# and through `ucrypt map --write` must leave identical bytes on disk; and
# `ucrypt map --read` must decrypt dm-crypt's bytes.
K256=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
K512=$(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n')
LEN=2048           # mapping length in 512-byte sectors (1 MiB)
head -c $((LEN * 512)) /dev/urandom > "$W/tpat"
# same_ct LABEL CIPHER KEY IV_OFFSET OFFSET [OPT...]
same_ct() {
  label=$1 cipher=$2 key=$3 ivoff=$4 off=$5; shift 5
  opts=""; [ $# -gt 0 ] && opts="$# $*"
  kimg="$W/t-kern.img"; uimg="$W/t-ucrypt.img"
  rm -f "$kimg" "$uimg"
  truncate -s $(( (off + LEN) * 512 )) "$kimg"
  truncate -s $(( (off + LEN) * 512 )) "$uimg"
  loop=$(losetup -f) && losetup "$loop" "$kimg" || { fail "table $label" "losetup"; return; }
  if check "table $label: dm-crypt accepts it" \
      dmsetup create vmt --table "0 $LEN crypt $cipher $key $ivoff $loop $off $opts"; then
    run dd if="$W/tpat" of=/dev/mapper/vmt bs=64k oflag=direct conv=fsync
    run dmsetup remove vmt
  fi
  losetup -d "$loop"
  check "table $label: ucrypt map --write gives dm-crypt's ciphertext" sh -c "
    ucrypt map --write --table '0 $LEN crypt $cipher $key $ivoff $uimg $off $opts' < '$W/tpat' &&
    cmp '$kimg' '$uimg'"
  check "table $label: ucrypt map --read decrypts dm-crypt's bytes" sh -c "
    ucrypt map --read --table '0 $LEN crypt $cipher $key $ivoff $kimg $off $opts' | cmp - '$W/tpat'"
}
same_ct "aes-xts-plain64"                aes-xts-plain64           "$K512" 0     0
same_ct "aes-xts-plain64 iv_offset+offset" aes-xts-plain64         "$K512" 12345 8
same_ct "aes-xts-plain"                  aes-xts-plain             "$K256" 7     0
same_ct "aes-xts-plain64be"              aes-xts-plain64be         "$K512" 0     0
same_ct "aes-cbc-essiv:sha256"           aes-cbc-essiv:sha256      "$K256" 100   16
same_ct "aes-cbc-plain"                  aes-cbc-plain             "$K256" 0     0
same_ct "aes-cbc-plain64"                aes-cbc-plain64           "$K256" 3     0
same_ct "aes-cbc-benbi"                  aes-cbc-benbi             "$K256" 0     0
same_ct "aes-cbc-null"                   aes-cbc-null              "$K256" 0     0
same_ct "aes-cbc-eboiv"                  aes-cbc-eboiv             "$K256" 0     0
same_ct "aes-ecb"                        aes-ecb                   "$K256" 0     0
same_ct "cipher_null-ecb"                cipher_null-ecb           "-"     0     0
same_ct "capi:xts(aes)-plain64"          'capi:xts(aes)-plain64'   "$K512" 64    0
same_ct "capi:cbc(aes)-essiv:sha256"     'capi:cbc(aes)-essiv:sha256' "$K256" 0  0
same_ct "capi:ecb(cipher_null)"          'capi:ecb(cipher_null)'   "-"     0     0
same_ct "sector_size:4096"               aes-xts-plain64           "$K512" 0     0  sector_size:4096
same_ct "sector_size:4096 iv_large_sectors" aes-xts-plain64        "$K512" 0     8  sector_size:4096 iv_large_sectors
same_ct "sector_size:4096 iv_offset"     aes-xts-plain64           "$K512" 800   0  sector_size:4096
same_ct "sector_size:1024 essiv"         aes-cbc-essiv:sha256      "$K256" 16    0  sector_size:1024
same_ct "sector_size:2048 iv_large_sectors plain" aes-cbc-plain    "$K256" 4     0  sector_size:2048 iv_large_sectors
# Ciphers beside AES (the guest kernel loads serpent/twofish/camellia_generic
# on demand from the crypto dirs the initramfs carries).
same_ct "serpent-xts-plain64"            serpent-xts-plain64       "$K512" 9     0
same_ct "twofish-xts-plain64 4096"       twofish-xts-plain64       "$K256" 0     0  sector_size:4096
same_ct "camellia-xts-plain64be"         camellia-xts-plain64be    "$K512" 0     0
same_ct "serpent-cbc-essiv:sha256"       serpent-cbc-essiv:sha256  "$K256" 5     0
same_ct "twofish-cbc-benbi"              twofish-cbc-benbi         "$K256" 0     0
same_ct "camellia-cbc-plain"             'capi:cbc(camellia)-plain' "$K256" 3    0

# A LUKS2 volume ucrypt formats with a non-AES cipher opens in cryptsetup.
img="$W/serpent.img"; truncate -s 24M "$img"
check "dm-crypt: serpent-xts LUKS2: ucrypt format" ucrypt format -q $FAST_KDF --type luks2 \
  -c serpent-xts-plain64 -s 512 -d "$KEY" "$img"
check "dm-crypt: serpent-xts LUKS2: ucrypt map --write" sh -c "head -c 4194304 '$W/pat' | ucrypt map --write --luks '$img' -d '$KEY'"
if check "dm-crypt: serpent-xts LUKS2: cryptsetup opens it" cryptsetup open --key-file "$KEY" "$img" u-serpent; then
  check "dm-crypt: serpent-xts LUKS2: dm-crypt reads what ucrypt wrote" sh -c "
    dd if=/dev/mapper/u-serpent bs=1M count=4 iflag=direct 2>/dev/null | cmp - '$W/pat' -n 4194304"
  run cryptsetup close u-serpent
fi
rm -f "$img"
