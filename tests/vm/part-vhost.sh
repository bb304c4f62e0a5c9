#!/bin/sh
# Part 5: a vhost-user-blk disk. The host-side ucrypt (started by
# scripts/vm-test.sh before qemu) serves a LUKS1 volume over vhost-user-blk
# with 2 queues; here it is /dev/vdc (checked by its serial first). After the guest powers off, the host
# closes ucrypt and decrypts the backing file with qemu-img's luks driver (an
# independent oracle): its checksum must equal the one printed here.

D=/dev/vdc
M=/mnt/vh
mkdir -p "$M"
# The disk is found by its serial (GET_ID), never by name alone: a wrong
# guess would test (and overwrite) one of the scratch drives instead.
WANT=$(sed -n 's/.*vmtest\.vhost_serial=\([^ ]*\).*/\1/p' /proc/cmdline)
if ! check "vhost: /dev/vdc answers GET_ID with the LUKS UUID's first 20 characters ($WANT)" \
    sh -c "[ -b $D ] && [ ${#WANT} = 20 ] && [ \"\$(cat /sys/block/vdc/serial)\" = '$WANT' ]"; then
  for b in /sys/block/vd*; do info "vhost: $b serial '$(cat "$b/serial" 2>/dev/null)' size $(cat "$b/size")"; done
  return 0 2>/dev/null || exit 0
fi
check "vhost: two queues" sh -c "[ \$(ls /sys/block/vdc/mq | wc -l) = 2 ]"
check "vhost: size is the LUKS data area (256 MiB - 2 MiB header)" sh -c "[ \$(cat /sys/block/vdc/size) = 520192 ]"
check "vhost: fio verify 4k-1M QD16" fio --name=v --filename="$D" --direct=1 --ioengine=libaio \
  --rw=randwrite --bsrange=4k-1m --iodepth=16 --size=32m --verify=crc32c --verify_fatal=1 --do_verify=1
check "vhost: mkfs.ext4" mkfs.ext4 -q -F "$D"
check "vhost: mount" mount -t ext4 "$D" "$M"
run sh -c "mkdir -p $M/tree && cp -a /lib/modules $M/tree/ && dd if=/dev/urandom of=$M/tree/big bs=1M count=8 2>/dev/null &&
  cd $M && find tree -type f | sort | xargs sha256sum > /tmp/vh.sums"
check "vhost: write a tree" sh -c "[ \$(wc -l < /tmp/vh.sums) -gt 10 ]"
CHECK_TIMEOUT=60 check "vhost: umount" umount "$M"
check "vhost: fsck.ext4 -fn clean" fsck.ext4 -fn "$D"
check "vhost: mount again, every checksum intact" sh -c "mount -t ext4 $D $M && cd $M && sha256sum -c /tmp/vh.sums >/dev/null && cd / && umount $M"
sync
info "vhost-sha256 $(sha256sum "$D" | cut -d' ' -f1)"
