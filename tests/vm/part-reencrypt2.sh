#!/bin/sh
# Part 8b: LUKS2 encryption, decryption and each resilience mode between
# cryptsetup on the kernel's dm-crypt (online: the device active while the
# data moves) and ucrypt, each interrupted mid-way and finished by the other
# tool, on one plaintext pattern checked after every step:
#  e) encryption with the header in the device (`--reduce-device-size`,
#     resilience datashift) and with a detached `--header` (checksum):
#     cryptsetup encrypts a loop device online as NAME, interrupted; `ucrypt
#     map` reads the plaintext mid-way, `ucrypt reencrypt --resume-only`
#     finishes it, dm-crypt reads the pattern; and ucrypt starts it,
#     interrupted, cryptsetup opens the half-encrypted device on dm-crypt
#     (reads the pattern) and finishes it online;
#  x) decryption with a detached header, the same two ways; at the end the
#     device holds the plaintext;
#  r) a new volume key with `--resilience journal` and `none`: cryptsetup
#     online, interrupted; ucrypt reads mid-way and finishes; dm-crypt reads;
#  n) `ucrypt open` of a volume cryptsetup left mid-reencryption, served to
#     the kernel's NBD client: the pattern read through /dev/nbd3 mid-way,
#     then `ucrypt reencrypt --resume-only --active-name` finishes it under
#     fio's verifying writes, and dm-crypt reads what the NBD client last read.
# Sourced by suite.sh with lib.sh loaded.

W=/tmp/reenc2
mkdir -p "$W"
SIZE_MIB=32
pattern "$W/pat" "$SIZE_MIB"
# pat_is FILE_OR_DEV: its first SIZE_MIB MiB are the pattern.
pat_is() { dd if="$1" bs=1M count="$SIZE_MIB" 2>/dev/null | cmp - "$W/pat"; }
# dm_reads NAME IMG [ARGS...]: dm-crypt (cryptsetup open with ARGS) reads the pattern.
dm_reads() {
  d_name=$1; d_img=$2; shift 2
  cryptsetup open --key-file "$KEY" "$@" "$d_img" "$d_name" &&
    dd if="/dev/mapper/$d_name" bs=1M count="$SIZE_MIB" iflag=direct 2>/dev/null | cmp - "$W/pat"
  d_rc=$?; cryptsetup close "$d_name" 2>/dev/null; return $d_rc
}
# map_reads IMG [ARGS...]: `ucrypt map --read` reads the pattern.
map_reads() {
  m_img=$1; shift
  ucrypt map --read --luks "$m_img" -d "$KEY" "$@" | head -c $((SIZE_MIB * 1048576)) | cmp - "$W/pat"
}
# in_reencryption HEADER: the header still records a reencryption.
in_reencryption() { cryptsetup luksDump "$1" 2>/dev/null | grep -q 'online-reencrypt'; }
# midway HEADER: in reencryption after `interrupt` (else its output shown).
midway() { in_reencryption "$1" || { cat "$LOGDIR/interrupt.log"; return 1; }; }
midway_in() { midway "$1" && cryptsetup luksDump "$1" | grep -q "Resilience: *$2\$"; } # HEADER MODE
# A plaintext device image: the pattern, then EXTRA_MIB MiB of zeros.
plain_image() { # IMG EXTRA_MIB
  rm -f "$1"; cp "$W/pat" "$1" && truncate -s $((SIZE_MIB + $2))M "$1"
}
# A LUKS2 volume with a detached header holding the pattern, written by dm-crypt.
detached_volume() { # IMG HDR
  rm -f "$1" "$2"; truncate -s ${SIZE_MIB}M "$1"
  cryptsetup luksFormat -q --type luks2 $FAST_KDF --key-file "$KEY" --header "$2" "$1" &&
    cryptsetup open --key-file "$KEY" --header "$2" "$1" fresh &&
    dd if="$W/pat" of=/dev/mapper/fresh bs=1M oflag=direct conv=fsync 2>/dev/null &&
    cryptsetup close fresh
}
# A LUKS2 volume (header inside) holding the pattern, written by dm-crypt.
fresh_volume() { # IMG
  rm -f "$1"; truncate -s $((SIZE_MIB + 16))M "$1"
  cryptsetup luksFormat -q --type luks2 $FAST_KDF --sector-size 4096 --key-file "$KEY" "$1" &&
    cryptsetup open --key-file "$KEY" "$1" fresh &&
    dd if="$W/pat" of=/dev/mapper/fresh bs=1M oflag=direct conv=fsync 2>/dev/null &&
    cryptsetup close fresh
}

# hdr_json HDR: HDR's JSON metadata, read without cryptsetup's metadata
# lock, when it records a reencryption.
hdr_json() {
  dd if="$1" bs=4096 skip=1 count=3 2>/dev/null | tr -d '\000' | grep -a 'online-reencrypt'
}
# interrupt HDR CMD...: runs CMD and sends it SIGINT once HDR's metadata
# differs from the first seen with the reencryption recorded (the next
# commit: a hotzone has moved), so the interruption lands mid-way however
# fast the guest runs. The JSON is read directly: a luksDump poll, slowed
# by the lock, missed a whole datashift encryption by ucrypt under TCG.
interrupt() {
  i_hdr=$1; shift
  "$@" >"$LOGDIR/interrupt.log" 2>&1 &
  i_p=$!; i_n=0; i_first=""
  while kill -0 "$i_p" 2>/dev/null && [ "$i_n" -lt 6000 ]; do
    i_s=$(hdr_json "$i_hdr")
    if [ -n "$i_s" ]; then
      if [ -z "$i_first" ]; then i_first=$i_s
      elif [ "$i_s" != "$i_first" ]; then kill -INT "$i_p" 2>/dev/null; break; fi
    fi
    i_n=$((i_n + 1)); sleep 0.05
  done
  wait "$i_p"
  return 0
}
# interrupt_data IMG OFFSET CMD...: the same, but SIGINT once the 4 KiB at
# byte OFFSET of IMG change (the first hotzone was written): with
# `--resilience none` cryptsetup writes no metadata between hotzones, only
# when it stops.
interrupt_data() {
  i_img=$1; i_off=$(($2 / 4096)); shift 2
  i_old=$(dd if="$i_img" bs=4096 skip="$i_off" count=1 2>/dev/null | sha256sum)
  "$@" >"$LOGDIR/interrupt.log" 2>&1 &
  i_p=$!; i_n=0
  while kill -0 "$i_p" 2>/dev/null && [ "$i_n" -lt 6000 ]; do
    if [ "$(dd if="$i_img" bs=4096 skip="$i_off" count=1 2>/dev/null | sha256sum)" != "$i_old" ]; then
      kill -INT "$i_p" 2>/dev/null; break
    fi
    i_n=$((i_n + 1)); sleep 0.05
  done
  wait "$i_p"
  return 0
}
# A free loop device over IMG, printed.
loop_of() { l_dev=$(losetup -f) && losetup "$l_dev" "$1" && echo "$l_dev"; }

# e1) cryptsetup encrypts online with a data shift, interrupted; ucrypt finishes.
img="$W/e1.img"
fcheck "reencrypt2: e1: plaintext device with the pattern" plain_image "$img" 8
loop=$(loop_of "$img")
interrupt "$img" cryptsetup reencrypt -q --encrypt --type luks2 $FAST_KDF --key-file "$KEY" \
  --reduce-device-size 8M --hotzone-size 1M "$loop" e1
run cryptsetup close e1
run losetup -d "$loop"
fcheck "reencrypt2: e1: cryptsetup left the encryption (datashift) mid-way" midway "$img"
fcheck "reencrypt2: e1: ucrypt map reads the half-encrypted device" map_reads "$img"
check "reencrypt2: e1: ucrypt reencrypt --resume-only finishes the encryption" \
  ucrypt reencrypt -q --resume-only --key-file "$KEY" "$img"
fexpect_fail "reencrypt2: e1: no reencryption left" in_reencryption "$img"
fcheck "reencrypt2: e1: dm-crypt reads the pattern" dm_reads e1 "$img"

# e2) ucrypt encrypts with a data shift, interrupted; cryptsetup finishes online.
img="$W/e2.img"
fcheck "reencrypt2: e2: plaintext device with the pattern" plain_image "$img" 8
interrupt "$img" ucrypt reencrypt -q --encrypt --type luks2 $FAST_KDF --key-file "$KEY" \
  --reduce-device-size 8M --hotzone-size 1M "$img"
fcheck "reencrypt2: e2: ucrypt left the encryption (datashift) mid-way" midway "$img"
check "reencrypt2: e2: cryptsetup open of ucrypt's half-encrypted device" \
  cryptsetup open --key-file "$KEY" "$img" e2
fcheck "reencrypt2: e2: dm-crypt reads the pattern mid-way" pat_is /dev/mapper/e2
check "reencrypt2: e2: cryptsetup reencrypt --resume-only (online) finishes it" \
  cryptsetup reencrypt -q --resume-only --key-file "$KEY" --active-name e2
run cryptsetup close e2
fexpect_fail "reencrypt2: e2: no reencryption left" in_reencryption "$img"
fcheck "reencrypt2: e2: dm-crypt reads the pattern" dm_reads e2 "$img"

# e3) cryptsetup encrypts online with a detached header, interrupted; ucrypt finishes.
img="$W/e3.img"; hdr="$W/e3.hdr"
fcheck "reencrypt2: e3: plaintext device with the pattern" plain_image "$img" 0
rm -f "$hdr"
loop=$(loop_of "$img")
interrupt "$hdr" cryptsetup reencrypt -q --encrypt --type luks2 $FAST_KDF --key-file "$KEY" \
  --header "$hdr" --hotzone-size 1M "$loop" e3
run cryptsetup close e3
run losetup -d "$loop"
fcheck "reencrypt2: e3: cryptsetup left the encryption (--header) mid-way" midway "$hdr"
fcheck "reencrypt2: e3: ucrypt map reads the half-encrypted device" map_reads "$img" --header "$hdr"
check "reencrypt2: e3: ucrypt reencrypt --resume-only finishes the encryption" \
  ucrypt reencrypt -q --resume-only --header "$hdr" --key-file "$KEY" "$img"
fexpect_fail "reencrypt2: e3: no reencryption left" in_reencryption "$hdr"
fcheck "reencrypt2: e3: dm-crypt reads the pattern" dm_reads e3 "$img" --header "$hdr"

# e4) ucrypt encrypts with a detached header, interrupted; cryptsetup finishes online.
img="$W/e4.img"; hdr="$W/e4.hdr"
fcheck "reencrypt2: e4: plaintext device with the pattern" plain_image "$img" 0
rm -f "$hdr"
interrupt "$hdr" ucrypt reencrypt -q --encrypt --type luks2 $FAST_KDF --key-file "$KEY" \
  --header "$hdr" --hotzone-size 1M "$img"
fcheck "reencrypt2: e4: ucrypt left the encryption (--header) mid-way" midway "$hdr"
check "reencrypt2: e4: cryptsetup open of ucrypt's half-encrypted device" \
  cryptsetup open --key-file "$KEY" --header "$hdr" "$img" e4
fcheck "reencrypt2: e4: dm-crypt reads the pattern mid-way" pat_is /dev/mapper/e4
check "reencrypt2: e4: cryptsetup reencrypt --resume-only (online) finishes it" \
  cryptsetup reencrypt -q --resume-only --key-file "$KEY" --header "$hdr" --active-name e4
run cryptsetup close e4
fexpect_fail "reencrypt2: e4: no reencryption left" in_reencryption "$hdr"
fcheck "reencrypt2: e4: dm-crypt reads the pattern" dm_reads e4 "$img" --header "$hdr"

# x1) cryptsetup decrypts online (detached header), interrupted; ucrypt finishes.
img="$W/x1.img"; hdr="$W/x1.hdr"
fcheck "reencrypt2: x1: volume (detached header) with the pattern" detached_volume "$img" "$hdr"
run cryptsetup open --key-file "$KEY" --header "$hdr" "$img" x1
interrupt "$hdr" cryptsetup reencrypt -q --decrypt --key-file "$KEY" --header "$hdr" \
  --hotzone-size 1M --active-name x1
run cryptsetup close x1
fcheck "reencrypt2: x1: cryptsetup left the decryption mid-way" midway "$hdr"
fcheck "reencrypt2: x1: ucrypt map reads the half-decrypted device" map_reads "$img" --header "$hdr"
check "reencrypt2: x1: ucrypt reencrypt --resume-only finishes the decryption" \
  ucrypt reencrypt -q --resume-only --header "$hdr" --key-file "$KEY" "$img"
fexpect_fail "reencrypt2: x1: no reencryption left" in_reencryption "$hdr"
fcheck "reencrypt2: x1: the device holds the plaintext" pat_is "$img"

# x2) ucrypt decrypts (detached header), interrupted; cryptsetup finishes online.
img="$W/x2.img"; hdr="$W/x2.hdr"
fcheck "reencrypt2: x2: volume (detached header) with the pattern" detached_volume "$img" "$hdr"
interrupt "$hdr" ucrypt reencrypt -q --decrypt --header "$hdr" --key-file "$KEY" --hotzone-size 1M "$img"
fcheck "reencrypt2: x2: ucrypt left the decryption mid-way" midway "$hdr"
check "reencrypt2: x2: cryptsetup open of ucrypt's half-decrypted device" \
  cryptsetup open --key-file "$KEY" --header "$hdr" "$img" x2
fcheck "reencrypt2: x2: dm-crypt reads the pattern mid-way" pat_is /dev/mapper/x2
check "reencrypt2: x2: cryptsetup reencrypt --resume-only (online) finishes it" \
  cryptsetup reencrypt -q --resume-only --key-file "$KEY" --header "$hdr" --active-name x2
# (cryptsetup 2.6.1 removes the mapping when this decryption ends.)
run cryptsetup close x2
fexpect_fail "reencrypt2: x2: no reencryption left" in_reencryption "$hdr"
fcheck "reencrypt2: x2: the device holds the plaintext" pat_is "$img"

# r) a new volume key, cryptsetup online with each other resilience mode,
#    interrupted; ucrypt reads mid-way and finishes.
for mode in journal none; do
  img="$W/r-$mode.img"
  fcheck "reencrypt2: r $mode: volume with the pattern" fresh_volume "$img"
  run cryptsetup open --key-file "$KEY" "$img" rr
  if [ "$mode" = none ]; then i_how="interrupt_data $img $((16 << 20))"; else i_how="interrupt $img"; fi
  $i_how cryptsetup reencrypt -q $FAST_KDF --key-file "$KEY" --resilience "$mode" \
    --hotzone-size 1M --active-name rr
  run cryptsetup close rr
  fcheck "reencrypt2: r $mode: cryptsetup left the volume mid-way (resilience $mode)" \
    midway_in "$img" "$mode"
  fcheck "reencrypt2: r $mode: ucrypt map reads the half-reencrypted volume" map_reads "$img"
  check "reencrypt2: r $mode: ucrypt reencrypt --resume-only finishes it" \
    ucrypt reencrypt -q --resume-only --key-file "$KEY" "$img"
  fexpect_fail "reencrypt2: r $mode: no reencryption left" in_reencryption "$img"
  fcheck "reencrypt2: r $mode: dm-crypt reads the pattern" dm_reads rr "$img"
done

# n) ucrypt serves over NBD a volume cryptsetup left mid-way, and finishes it
#    online under fio's verifying writes.
img="$W/n.img"
fcheck "reencrypt2: n: volume with the pattern" fresh_volume "$img"
run cryptsetup open --key-file "$KEY" "$img" rn
interrupt "$img" cryptsetup reencrypt -q $FAST_KDF --key-file "$KEY" --hotzone-size 1M --active-name rn
run cryptsetup close rn
fcheck "reencrypt2: n: cryptsetup left the volume mid-way" midway "$img"
S="$UCRYPT_RUNTIME_DIR/rn.nbd.sock"
check "reencrypt2: n: ucrypt open (NBD) of the half-reencrypted volume" \
  ucrypt open --export nbd --key-file "$KEY" "$img" rn
check "reencrypt2: n: nbd-client attaches /dev/nbd3" nbd-client -u "$S" /dev/nbd3
fcheck "reencrypt2: n: the NBD client reads the pattern mid-way" sh -c "
  dd if=/dev/nbd3 bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null | cmp - '$W/pat'"
fio --name=n --filename=/dev/nbd3 --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite \
  --bs=4k-64k --size=${SIZE_MIB}M --verify=crc32c --verify_fatal=1 --loops=2 \
  >"$LOGDIR/reenc2-fio.log" 2>&1 &
fio_pid=$!
check "reencrypt2: n: ucrypt reencrypt --resume-only --active-name while fio writes" \
  ucrypt reencrypt -q --resume-only --active-name rn --key-file "$KEY" --hotzone-size 1M --rate 16
fcheck "reencrypt2: n: fio's verify passed" wait "$fio_pid"
check "reencrypt2: n: read back through NBD" sh -c "
  dd if=/dev/nbd3 of='$W/n.nbd' bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null"
run nbd-client -d /dev/nbd3
check "reencrypt2: n: close" ucrypt close rn
fexpect_fail "reencrypt2: n: no reencryption left" in_reencryption "$img"
check "reencrypt2: n: dm-crypt reads what NBD read" sh -c "
  cryptsetup open --key-file '$KEY' '$img' rn &&
  dd if=/dev/mapper/rn bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null | cmp - '$W/n.nbd';
  rc=\$?; cryptsetup close rn; exit \$rc"
rm -rf "$W"
