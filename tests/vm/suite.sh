#!/bin/sh
# Runs the named parts (default: all) of the guest suite; each part is a
# part-NAME.sh sourced with lib.sh's helpers.
. /vm/lib.sh
modprobe -a virtio_blk ext4 loop dm_mod dm_crypt ublk_drv nbd xts essiv aesni_intel sha256_ssse3 \
  2>"$LOGDIR/modprobe.err" || info "modprobe: $(cat "$LOGDIR/modprobe.err")"
check "guest: modules and disks" sh -c '[ -e /dev/ublk-control ] && [ -b /dev/nbd0 ] && [ -b /dev/vda ] && [ -b /dev/vdb ] && [ -e /dev/mapper/control ]'
for p in ${*:-ublk nbd dmcrypt plain advisor seeds vhost live reencrypt reencrypt2 tpm foreign}; do
  if [ -f "/vm/part-$p.sh" ]; then
    info "part $p: start at $(cut -d' ' -f1 /proc/uptime)s"
    ( . "/vm/part-$p.sh" )
  else
    fail "part $p" "no /vm/part-$p.sh"
  fi
done
