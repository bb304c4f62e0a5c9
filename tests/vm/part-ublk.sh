#!/bin/sh
# Part 1: ucrypt's ublk frontend through the kernel's ublk_drv: /dev/ublkbN.
# Sourced by suite.sh with lib.sh loaded.

# The ublk block device a freshly opened volume got: the one not in $1.
new_ublk() {
  for d in /dev/ublkb*; do
    case " $1 " in *" $d "*) ;; *) [ -b "$d" ] && echo "$d" && return 0 ;; esac
  done
  return 1
}

# The ublk crate's own tests, which skip on hosts without ublk_drv.
check "ublk: crate tests (serve, stop_if_idle) in a real kernel" sh -c '
  UCRYPT_REQUIRE_TOOLS=1 /vm/bin/ublk-tests --test-threads=1 \
    serves_engine_as_block_device stop_if_idle_refuses_a_device_in_use > /tmp/ublk-tests.out 2>&1
  rc=$?; cat /tmp/ublk-tests.out
  [ $rc -eq 0 ] && ! grep -q SKIP /tmp/ublk-tests.out && grep -q "2 passed" /tmp/ublk-tests.out'

U=/dev/vda
check "ublk: ucrypt format (LUKS2, 4096-byte sectors)" \
  ucrypt format -q $FAST_KDF --sector-size 4096 -d "$KEY" "$U"
before=$(echo /dev/ublkb*)
check "ublk: open --export ublk" \
  ucrypt open --export ublk --allow-discards --key-file "$KEY" "$U" u1
cat "$LOGDIR/last.log" | sed 's/^/    > /'
D=$(new_ublk "$before") || D=""
info "ublk device: ${D:-none}; status: $(ucrypt status u1 2>&1 | tr '\n' ';')"
if [ -z "$D" ]; then
  fail "ublk: device node appears" "no new /dev/ublkbN after open"
  return 0 2>/dev/null || exit 0
fi
pass "ublk: device node appears"
B=$(basename "$D")

check "ublk: logical and physical block size = 4096 (the volume's sector size)" sh -c "
  [ \$(cat /sys/block/$B/queue/logical_block_size) = 4096 ] &&
  [ \$(cat /sys/block/$B/queue/physical_block_size) = 4096 ] &&
  [ \$(blockdev --getss $D) = 4096 ]"

# fio verify: 4k..1M, QD1 and QD32, direct IO (the page cache would hide the device).
check "ublk: fio verify 4k QD1" fio --name=qd1 --filename="$D" --direct=1 --ioengine=libaio \
  --rw=randwrite --bs=4k --iodepth=1 --size=2m --offset=0 --verify=crc32c --verify_fatal=1 --do_verify=1
check "ublk: fio verify 4k-1M QD32" fio --name=qd32 --filename="$D" --direct=1 --ioengine=libaio \
  --rw=randwrite --bsrange=4k-1m --iodepth=32 --size=64m --offset=64m --verify=crc32c \
  --verify_fatal=1 --do_verify=1
check "ublk: fio verify 64k QD16 x2 jobs" fio --name=j --filename="$D" --direct=1 --ioengine=libaio \
  --rw=randwrite --bs=64k --iodepth=16 --numjobs=2 --size=16m --offset=160m --offset_increment=32m \
  --verify=md5 --verify_fatal=1 --do_verify=1

# Discards pass with --allow-discards.
check "ublk: discard passes (--allow-discards)" sh -c "
  [ \$(cat /sys/block/$B/queue/discard_max_bytes) -gt 0 ] && blkdiscard -o 0 -l 1048576 $D"

# A filesystem: mkfs, mount, a tree with checksums.
M=/mnt/u1
mkdir -p "$M"
check "ublk: mkfs.ext4" mkfs.ext4 -q -F "$D"
check "ublk: mount" mount -t ext4 "$D" "$M"
run sh -c "mkdir -p $M/tree && cp -a /lib/modules $M/tree/ && dd if=/dev/urandom of=$M/tree/big bs=1M count=24 2>/dev/null &&
  for i in \$(seq 1 50); do dd if=/dev/urandom of=$M/tree/f\$i bs=\$((i * 517)) count=1 2>/dev/null; done &&
  cd $M && find tree -type f | sort | xargs sha256sum > /tmp/u1.sums"
check "ublk: write a tree" sh -c "grep -q ' $M ' /proc/mounts && [ \$(wc -l < /tmp/u1.sums) -gt 50 ]"
# (A close that stops the device anyway shuts the filesystem down and may hang:
# bounded, so the rest of the suite still runs.)
CHECK_TIMEOUT=30 expect_fail "ublk: close while mounted is refused" ucrypt close u1
check "ublk: device still there after refused close" sh -c "[ -b $D ] && [ -f $M/tree/big ]"
CHECK_TIMEOUT=60 check "ublk: umount" umount "$M"
check "ublk: close" ucrypt close u1
check "ublk: device gone after close" sh -c "i=0; while [ -e $D ] && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i+1)); done; [ ! -e $D ]"
before=$(echo /dev/ublkb*)
check "ublk: reopen" ucrypt open --export ublk --allow-discards --key-file "$KEY" "$U" u1
D=$(new_ublk "$before") || D=/dev/ublkb-missing
check "ublk: fsck.ext4 -fn clean after reopen" fsck.ext4 -fn "$D"
check "ublk: mount again" mount -t ext4 -o ro "$D" "$M"
check "ublk: every checksum intact" sh -c "grep -q ' $M ' /proc/mounts && cd $M && sha256sum -c /tmp/u1.sums"
run umount "$M"

# kill -9 of the daemon: IO fails (no hang), and the next open works.
pid=$(cat "$UCRYPT_RUNTIME_DIR/u1.pid" 2>/dev/null)
check "ublk: daemon pid known" sh -c "[ -n '$pid' ] && kill -0 '$pid'"
run kill -9 "$pid"
sleep 1
CHECK_TIMEOUT=60 expect_fail "ublk: IO on a killed daemon's device fails, no hang" \
  dd if="$D" of=/dev/null bs=4096 count=16 iflag=direct
info "after kill: $(ls /dev/ublk* 2>&1 | tr '\n' ' ')"
before=$(echo /dev/ublkb*)
run ucrypt close u1
check "ublk: open after kill -9 works" ucrypt open --export ublk --key-file "$KEY" "$U" u1
D=$(new_ublk "$before") || D=/dev/ublkb-missing
check "ublk: data intact after the kill" fsck.ext4 -fn "$D"
check "ublk: close after recovery" ucrypt close u1
