#!/bin/sh
# Part 2: the kernel's NBD client (Debian's nbd-client) on ucrypt's unix-socket
# NBD export: /dev/nbd0, one connection and four (-C 4). Sourced by suite.sh.

V=/dev/vdb
S="$UCRYPT_RUNTIME_DIR/n1.nbd.sock"
N=/dev/nbd0
M=/mnt/n1
mkdir -p "$M"
mounted() { grep -q " $M " /proc/mounts; }

check "nbd: ucrypt format (LUKS1)" ucrypt format -q $FAST_KDF --type luks1 -d "$KEY" "$V"
check "nbd: open --export nbd" ucrypt open --export nbd --key-file "$KEY" "$V" n1
check "nbd: nbd-client attaches /dev/nbd0 (unix socket)" nbd-client -u "$S" "$N"
vsize=$(ucrypt status n1 | sed -n 's/^ *size: *\([0-9]*\) sectors.*/\1/p')
check "nbd: device size = volume size" sh -c "[ -n '$vsize' ] && [ \$(blockdev --getsize64 $N) = \$(( $vsize * 512 )) ]"
check "nbd: fio verify 4k-1M QD16" fio --name=v --filename="$N" --direct=1 --ioengine=libaio \
  --rw=randwrite --bsrange=4k-1m --iodepth=16 --size=48m --verify=crc32c --verify_fatal=1 --do_verify=1
check "nbd: mkfs.ext4" mkfs.ext4 -q -F "$N"
check "nbd: mount" mount -t ext4 "$N" "$M"
run sh -c "mkdir -p $M/tree && cp -a /lib/modules $M/tree/ && dd if=/dev/urandom of=$M/tree/big bs=1M count=16 2>/dev/null &&
  for i in \$(seq 1 30); do dd if=/dev/urandom of=$M/tree/f\$i bs=\$((i * 733)) count=1 2>/dev/null; done &&
  cd $M && find tree -type f | sort | xargs sha256sum > /tmp/n1.sums"
check "nbd: write a tree" sh -c "mounted() { grep -q ' $M ' /proc/mounts; }; mounted && [ \$(wc -l < /tmp/n1.sums) -gt 30 ]"
CHECK_TIMEOUT=60 check "nbd: umount" umount "$M"
check "nbd: disconnect (nbd-client -d)" nbd-client -d "$N"
check "nbd: device detached" sh -c "i=0; while [ \$(cat /sys/block/nbd0/size) != 0 ] && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i+1)); done; [ \$(cat /sys/block/nbd0/size) = 0 ]"

# Reconnect with four connections (multi-conn): the same filesystem comes back.
check "nbd: reconnect with -C 4" nbd-client -u "$S" "$N" -C 4
check "nbd: fsck.ext4 -fn clean after reconnect" fsck.ext4 -fn "$N"
check "nbd: mount again" mount -t ext4 "$N" "$M"
check "nbd: every checksum intact" sh -c "grep -q ' $M ' /proc/mounts && cd $M && sha256sum -c /tmp/n1.sums"
# One file per job (fio's default names): jobs sharing a file would overwrite
# each other's verify patterns.
check "nbd: fio verify over 4 connections (4 jobs, QD8)" fio --name=m --directory="$M" --size=4m \
  --numjobs=4 --direct=1 --ioengine=libaio --rw=randwrite --bs=16k --iodepth=8 \
  --verify=crc32c --verify_fatal=1 --do_verify=1
CHECK_TIMEOUT=60 check "nbd: umount (second)" umount "$M"
check "nbd: fsck.ext4 -fn clean after multi-connection writes" fsck.ext4 -fn "$N"
check "nbd: disconnect (second)" nbd-client -d "$N"
check "nbd: close" ucrypt close n1
check "nbd: socket removed on close" sh -c "[ ! -e $S ]"
