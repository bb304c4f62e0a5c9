#!/bin/sh
# Part 8: LUKS2 reencryption between cryptsetup on the kernel's dm-crypt
# (online: the volume active while it moves, named with --active-name as
# cryptsetup wants for a file-backed mapping) and ucrypt, both ways, on one
# plaintext checked after every step:
#  a) cryptsetup reencrypts online and is interrupted mid-way (SIGINT);
#     ucrypt opens the half-done volume and reads the plaintext, then
#     `ucrypt reencrypt --resume-only` finishes it, and dm-crypt reads it;
#  b) ucrypt starts a reencryption and is interrupted mid-way; cryptsetup
#     finishes it online (`reencrypt --resume-only` on the active device);
#  c) ucrypt reencrypts a whole volume; dm-crypt reads the new ciphertext;
#  d) ucrypt reencrypts online (`--active-name`) a volume it serves to the
#     kernel's NBD client while fio writes and verifies through it;
#     dm-crypt then reads what the NBD client last read.
# Sourced by suite.sh with lib.sh loaded.

W=/tmp/reenc
mkdir -p "$W"
SIZE_MIB=48
pattern "$W/pat" "$SIZE_MIB"
# The plaintext of the volume, as dm-crypt sees it, equals the pattern.
dm_reads_pattern() { # NAME IMG
  cryptsetup open --key-file "$KEY" "$2" "$1" &&
    dd if="/dev/mapper/$1" bs=1M count="$SIZE_MIB" iflag=direct 2>/dev/null | cmp - "$W/pat"
  rc=$?; cryptsetup close "$1" 2>/dev/null; return $rc
}
in_reencryption() { cryptsetup luksDump "$1" 2>/dev/null | grep -q 'online-reencrypt'; }
fresh_volume() { # IMG: LUKS2 (4096-byte sectors) holding the pattern, written by dm-crypt
  rm -f "$1"; truncate -s $((SIZE_MIB + 16))M "$1"
  cryptsetup luksFormat -q --type luks2 $FAST_KDF --sector-size 4096 --key-file "$KEY" "$1" &&
    cryptsetup open --key-file "$KEY" "$1" fresh &&
    dd if="$W/pat" of=/dev/mapper/fresh bs=1M oflag=direct conv=fsync 2>/dev/null &&
    cryptsetup close fresh
}
# interrupt IMG CMD...: runs CMD and sends it SIGINT as soon as IMG's header
# shows a data segment of fixed length (the reencryption point has moved),
# so the interruption lands mid-way however fast the guest runs.
interrupt() {
  i_img=$1; shift
  "$@" >"$LOGDIR/interrupt.log" 2>&1 &
  i_p=$!; i_n=0
  while kill -0 "$i_p" 2>/dev/null && [ "$i_n" -lt 3000 ]; do
    if cryptsetup luksDump "$i_img" 2>/dev/null | grep -q 'length: [0-9]'; then
      kill -INT "$i_p" 2>/dev/null; break
    fi
    i_n=$((i_n + 1)); sleep 0.05
  done
  wait "$i_p"
  return 0
}

# a) cryptsetup online, interrupted; ucrypt opens it and finishes it.
img="$W/a.img"
fcheck "reencrypt: a: volume with the pattern" fresh_volume "$img"
run cryptsetup open --key-file "$KEY" "$img" ra
interrupt "$img" cryptsetup reencrypt -q $FAST_KDF --hotzone-size 1M --key-file "$KEY" --active-name ra
run cryptsetup close ra
fcheck "reencrypt: a: cryptsetup left the volume mid-way" in_reencryption "$img"
check "reencrypt: a: ucrypt map reads the half-reencrypted volume" sh -c "
  ucrypt map --read --luks '$img' -d '$KEY' | head -c $((SIZE_MIB * 1048576)) | cmp - '$W/pat'"
check "reencrypt: a: ucrypt reencrypt --resume-only finishes it" \
  ucrypt reencrypt -q --resume-only --key-file "$KEY" "$img"
fexpect_fail "reencrypt: a: no reencryption left" in_reencryption "$img"
fcheck "reencrypt: a: dm-crypt reads the pattern after ucrypt finished" dm_reads_pattern ra "$img"

# b) ucrypt starts, interrupted; cryptsetup finishes online.
img="$W/b.img"
fcheck "reencrypt: b: volume with the pattern" fresh_volume "$img"
interrupt "$img" ucrypt reencrypt -q $FAST_KDF --hotzone-size 1M --key-file "$KEY" "$img"
fcheck "reencrypt: b: ucrypt left the volume mid-way" in_reencryption "$img"
check "reencrypt: b: cryptsetup open of ucrypt's half-reencrypted volume" \
  cryptsetup open --key-file "$KEY" "$img" rb
check "reencrypt: b: dm-crypt reads the pattern mid-way" sh -c "
  dd if=/dev/mapper/rb bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null | cmp - '$W/pat'"
check "reencrypt: b: cryptsetup reencrypt --resume-only (online) finishes it" \
  cryptsetup reencrypt -q --resume-only --key-file "$KEY" --active-name rb
run cryptsetup close rb
fexpect_fail "reencrypt: b: no reencryption left" in_reencryption "$img"
fcheck "reencrypt: b: dm-crypt reads the pattern after cryptsetup finished" dm_reads_pattern rb "$img"

# c) ucrypt whole; the volume key changed and dm-crypt reads the plaintext.
img="$W/c.img"
fcheck "reencrypt: c: volume with the pattern" fresh_volume "$img"
old=$(dd if="$img" bs=1M skip=16 count=1 2>/dev/null | sha256sum)
check "reencrypt: c: ucrypt reencrypt" ucrypt reencrypt -q $FAST_KDF --key-file "$KEY" "$img"
check "reencrypt: c: the ciphertext changed" sh -c "
  [ \"\$(dd if='$img' bs=1M skip=16 count=1 2>/dev/null | sha256sum)\" != '$old' ]"
fcheck "reencrypt: c: dm-crypt reads the pattern" dm_reads_pattern rc "$img"

# d) ucrypt online under the guest's NBD client and fio's verifying writes.
img="$W/d.img"
fcheck "reencrypt: d: volume with the pattern" fresh_volume "$img"
S="$UCRYPT_RUNTIME_DIR/rd.nbd.sock"
check "reencrypt: d: ucrypt open (NBD)" ucrypt open --export nbd --key-file "$KEY" "$img" rd
check "reencrypt: d: nbd-client attaches /dev/nbd2" nbd-client -u "$S" /dev/nbd2
fio --name=d --filename=/dev/nbd2 --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite \
  --bs=4k-64k --size=${SIZE_MIB}M --verify=crc32c --verify_fatal=1 --loops=2 \
  >"$LOGDIR/reenc-fio.log" 2>&1 &
fio_pid=$!
check "reencrypt: d: ucrypt reencrypt --active-name while fio writes" \
  ucrypt reencrypt -q --active-name rd --key-file "$KEY" --hotzone-size 1M --rate 16
fcheck "reencrypt: d: fio's verify passed" wait "$fio_pid"
check "reencrypt: d: read back through NBD" sh -c "
  dd if=/dev/nbd2 of='$W/d.nbd' bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null"
run nbd-client -d /dev/nbd2
check "reencrypt: d: close" ucrypt close rd
fexpect_fail "reencrypt: d: no reencryption left" in_reencryption "$img"
check "reencrypt: d: dm-crypt reads what NBD read" sh -c "
  cryptsetup open --key-file '$KEY' '$img' rd &&
  dd if=/dev/mapper/rd bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null | cmp - '$W/d.nbd';
  rc=\$?; cryptsetup close rd; exit \$rc"
rm -rf "$W"
