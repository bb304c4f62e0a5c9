#!/bin/sh
# Part 7: the verbs on an open volume beside cryptsetup on the kernel's
# dm-crypt, on one LUKS2 image opened by both: `status`'s cryptsetup lines,
# `resize` (--size, then the whole device), `luksSuspend` / `luksResume`
# (status marks it, IO waits until resume); the refusals' exit codes.
# Sourced by suite.sh.

W=/tmp/live
mkdir -p "$W"
img="$W/l.img"
truncate -s 40M "$img"
fields() { grep -E '^ +(type|cipher|keysize|sector size|offset|size|skipped|mode|flags):'; }
same_status() {
  cryptsetup status c-live | fields > "$W/c.st"
  ucrypt status u-live | fields > "$W/u.st"
  check "live: status lines as cryptsetup status ($1)" sh -c "cat '$W/c.st'; cat '$W/u.st'; cmp '$W/c.st' '$W/u.st'"
}
# Both tools' exit codes for the same verb must agree.
same_rc() {
  label=$1; shift
  cryptsetup "$@" c-live >/dev/null 2>&1; crc=$?
  ucrypt "$@" u-live >/dev/null 2>&1; urc=$?
  check "live: $label: exit $crc from both" sh -c "echo cryptsetup $crc ucrypt $urc; [ $crc = $urc ]"
}

check "live: cryptsetup luksFormat (4096-byte sectors)" cryptsetup luksFormat -q --type luks2 $FAST_KDF \
  --sector-size 4096 --key-file "$KEY" "$img"
check "live: cryptsetup open" cryptsetup open --key-file "$KEY" "$img" c-live
check "live: ucrypt open" ucrypt open --key-file "$KEY" "$img" u-live
same_status open

check "live: cryptsetup resize --size 8192" cryptsetup resize --key-file "$KEY" --size 8192 c-live
check "live: ucrypt resize --size 8192" ucrypt resize --size 8192 u-live
same_status "resize --size 8192"
same_rc "resize --size 8193 (misaligned)" resize --key-file "$KEY" --size 8193
check "live: cryptsetup resize (whole device)" cryptsetup resize --key-file "$KEY" c-live
check "live: ucrypt resize (whole device)" ucrypt resize u-live
same_status "resize to the device"

check "live: cryptsetup luksSuspend" cryptsetup luksSuspend c-live
check "live: ucrypt luksSuspend" ucrypt luksSuspend u-live
same_status suspended
# IO waits while suspended, and completes after resume.
S="$UCRYPT_RUNTIME_DIR/u-live.nbd.sock"
nbd-client -u "$S" /dev/nbd1 >/dev/null 2>&1 &
ncpid=$!
# Attached once the device has its size (up to 60 s on a slow guest).
i=0
while [ "$(cat /sys/block/nbd1/size 2>/dev/null || echo 0)" = 0 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
dd if=/dev/nbd1 of="$W/read" bs=4096 count=1 iflag=direct 2>/dev/null &
ddpid=$!
sleep 1
check "live: a read waits on the suspended volume" kill -0 "$ddpid"
check "live: cryptsetup luksResume" cryptsetup luksResume --key-file "$KEY" c-live
check "live: ucrypt luksResume" ucrypt luksResume --key-file "$KEY" u-live
check "live: the waiting read completes after resume" sh -c "wait $ddpid 2>/dev/null; i=0; while kill -0 $ddpid 2>/dev/null && [ \$i -lt 600 ]; do sleep 0.1; i=\$((i+1)); done; ! kill -0 $ddpid 2>/dev/null && [ -s '$W/read' ]"
same_status resumed
run nbd-client -d /dev/nbd1
wait "$ncpid" 2>/dev/null
run cryptsetup close c-live
check "live: ucrypt close" ucrypt close u-live
rm -f "$img"
