#!/bin/sh
# Part 3b: plain mode, `cryptsetup open --type plain` and `ucrypt open --type
# plain` with the same options and key must give the same ciphertext and
# plaintext. Sourced by suite.sh with lib.sh loaded.

W=/tmp/plain
mkdir -p "$W"
pattern "$W/pat" 2
# Plain mode as cryptsetup does it: dm-crypt writes a pattern through
# `cryptsetup open --type plain OPTS`; ucrypt, opened with the same OPTS and
# key over ublk, must read the pattern back from dm-crypt's bytes, and write
# byte-identical ciphertext onto a zeroed twin image.
PLEN=2 # MiB of each image (data written: all of the mapping)
printf 'plain passphrase\n' > "$W/ppass"
printf 'XYplainZ pass, only part of it is used\n' > "$W/ppass-range"
head -c 4096 /dev/urandom > "$W/pkey"
# plain_same LABEL STDIN_FILE OPT...
plain_same() {
  label=$1 input=$2; shift 2
  kimg="$W/p-kern.img"; uimg="$W/p-ucrypt.img"
  rm -f "$kimg" "$uimg"; truncate -s ${PLEN}M "$kimg"; truncate -s ${PLEN}M "$uimg"
  loop=$(losetup -f) && losetup "$loop" "$kimg" || { fail "plain $label" "losetup"; return; }
  if check "plain $label: cryptsetup open --type plain + dm-crypt writes" sh -c "
      cryptsetup open -q --type plain $* '$loop' kplain < '$input' &&
      n=\$(blockdev --getsize64 /dev/mapper/kplain) &&
      head -c \$n '$W/pat' > '$W/ppat' &&
      dd if='$W/ppat' of=/dev/mapper/kplain bs=64k oflag=direct conv=fsync 2>/dev/null"; then
    run cryptsetup close kplain
  fi
  losetup -d "$loop"
  for img in "$kimg" "$uimg"; do
    before=$(echo /dev/ublkb*)
    what=reads; [ "$img" = "$uimg" ] && what=writes
    if check "plain $label: ucrypt open --type plain ($what)" sh -c "
        ucrypt open --type plain $* --export ublk '$img' uplain < '$input'"; then
      d=""; for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) d=$x ;; esac; done
      if [ "$what" = reads ]; then
        check "plain $label: ucrypt reads dm-crypt's plaintext" sh -c "
          [ -b '$d' ] && [ \$(blockdev --getsize64 $d) = \$(stat -c %s '$W/ppat') ] &&
          dd if=$d bs=64k iflag=direct 2>/dev/null | cmp - '$W/ppat'"
      else
        run dd if="$W/ppat" of="$d" bs=64k oflag=direct conv=fsync
      fi
      run ucrypt close uplain
    fi
  done
  check "plain $label: ucrypt writes dm-crypt's ciphertext" cmp "$kimg" "$uimg"
  rm -f "$kimg" "$uimg" "$W/ppat"
}
plain_same "defaults (aes-cbc-essiv:sha256, ripemd160)" "$W/ppass"
plain_same "aes-xts-plain64 -s 512 -h sha256" "$W/ppass" -c aes-xts-plain64 -s 512 -h sha256
plain_same "--hash plain -d keyfile" /dev/null --hash plain -d "$W/pkey" -c aes-xts-plain64 -s 256
plain_same "--offset --skip --size" "$W/ppass" -c aes-xts-plain64 -s 512 -h sha512 \
  --offset 64 --skip 1000 --size 2048
plain_same "-d keyfile --keyfile-offset" /dev/null -d "$W/pkey" --keyfile-offset 100 -c twofish-cbc-plain64
plain_same "piped --keyfile-offset -l" "$W/ppass-range" -h sha256 --keyfile-offset 2 -l 13
plain_same "-d - (stdin key file) --keyfile-offset -h sha1" "$W/pkey" -d - --keyfile-offset 3 -h sha1 \
  -c aes-cbc-plain64 -s 128
plain_same "--sector-size 4096 --iv-large-sectors" "$W/ppass" -c aes-xts-plain64 -s 256 -h sha256 \
  --sector-size 4096 --iv-large-sectors
