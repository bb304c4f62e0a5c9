#!/bin/sh
# Opt-in part (UCRYPT_VM_PARTS=ublkresize, with a 6.16+ kernel:
# UCRYPT_VM_KERNEL_SUITE=trixie-backports): `ucrypt resize` on a volume
# exported over ublk passes the new size on with UBLK_CMD_UPDATE_SIZE, and the
# kernel's /dev/ublkbN takes it: its size shrinks and grows, a read of the
# whole device ends at the new end, the data below it is unchanged. Sourced
# by suite.sh.

W=/tmp/ublkresize
mkdir -p "$W"
img="$W/r.img"
truncate -s 40M "$img"
kv=$(uname -r)
major=${kv%%.*}; minor=${kv#*.}; minor=${minor%%.*}
check "ublkresize: the kernel is 6.16 or later ($kv)" \
  sh -c "[ $major -gt 6 ] || { [ $major -eq 6 ] && [ $minor -ge 16 ]; }"
check "ublkresize: cryptsetup luksFormat" cryptsetup luksFormat -q --type luks2 $FAST_KDF \
  --key-file "$KEY" "$img"
before=$(echo /dev/ublkb*)
if check "ublkresize: ucrypt open --export ublk" ucrypt open --key-file "$KEY" --export ublk "$img" u-rs; then
  d=""; for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) d=$x ;; esac; done
  full=$(blockdev --getsize64 "$d" 2>/dev/null)
  pattern "$W/pat" 8
  check "ublkresize: write 8 MiB on $d" dd if="$W/pat" of="$d" bs=1M oflag=direct conv=fsync
  check "ublkresize: ucrypt resize --size 16384 (8 MiB)" ucrypt resize --size 16384 u-rs
  check "ublkresize: the kernel sees 8 MiB" sh -c "i=0; until [ \$(blockdev --getsize64 $d) = 8388608 ]; do
      i=\$((i+1)); [ \$i -lt 50 ] || { blockdev --getsize64 $d; exit 1; }; sleep 0.1; done"
  check "ublkresize: /sys/block says 16384 sectors" sh -c "[ \$(cat /sys/block/${d#/dev/}/size) = 16384 ]"
  check "ublkresize: the 8 MiB left are the data written" sh -c \
    "dd if=$d bs=1M iflag=direct 2>/dev/null | cmp - '$W/pat'"
  check "ublkresize: reading the whole device ends at 8 MiB" sh -c \
    "[ \$(dd if=$d bs=1M iflag=direct 2>/dev/null | wc -c) = 8388608 ]"
  check "ublkresize: ucrypt resize (whole device) grows it back" ucrypt resize u-rs
  check "ublkresize: the kernel sees the full size again" sh -c "i=0; until [ \$(blockdev --getsize64 $d) = $full ]; do
      i=\$((i+1)); [ \$i -lt 50 ] || { blockdev --getsize64 $d; exit 1; }; sleep 0.1; done"
  check "ublkresize: ucrypt close" ucrypt close u-rs
fi
rm -f "$img" "$W/pat"
