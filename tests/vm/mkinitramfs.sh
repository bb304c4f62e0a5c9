#!/usr/bin/env bash
# Builds the guest's base initramfs (uncompressed newc cpio): busybox, the host
# tools the suite drives (fio, nbd-client, cryptsetup, dmsetup, e2fsprogs,
# blkdiscard) with the shared libraries ldd names, and the kernel modules the
# suite needs with their dependencies, decompressed and indexed by depmod so
# that the guest's busybox modprobe (also the kernel's on-demand loader) works.
#
# Usage: mkinitramfs.sh KERNEL_ROOT OUT.cpio
# The ucrypt binary and the suite scripts go in a second, small archive that
# vm-test.sh appends (the kernel reads concatenated cpio archives), so the base
# archive is cached across ucrypt rebuilds.
set -euo pipefail
KROOT="$1"
OUT="$2"
KVER=$(ls "$KROOT/lib/modules")
die() { echo "mkinitramfs: $*" >&2; exit 1; }
[ -f "$KROOT/boot/vmlinuz-$KVER" ] || die "no kernel image in $KROOT/boot"

STAGE=$(mktemp -d "${OUT}.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,etc,proc,sys,dev,run,tmp,mnt,var/tmp}
ln -s ../lib "$STAGE/usr/lib"

# busybox: the shell and every applet, as links.
BB=$(command -v busybox) || die "busybox not found (apt-get install busybox-static)"
# ldd succeeds only on dynamic executables.
if ldd "$BB" >/dev/null 2>&1; then die "$BB is not static (install busybox-static)"; fi
cp "$BB" "$STAGE/bin/busybox"
for a in $("$BB" --list); do
  [ -e "$STAGE/bin/$a" ] || ln -s busybox "$STAGE/bin/$a"
done
for a in modprobe insmod poweroff reboot halt; do ln -sf ../bin/busybox "$STAGE/sbin/$a"; done

# Host tools and their libraries (copied to the same paths).
copy_with_libs() {
  local f="$1" dst lib
  dst="$STAGE$f"
  mkdir -p "$(dirname "$dst")"
  cp -L "$f" "$dst"
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    [ -e "$STAGE$lib" ] && continue
    mkdir -p "$STAGE$(dirname "$lib")"
    cp -L "$lib" "$STAGE$lib"
  done
}
TOOLS=(fio nbd-client cryptsetup dmsetup mke2fs e2fsck blkdiscard blkid)
for t in "${TOOLS[@]}"; do
  p=$(PATH=/usr/sbin:/sbin:/usr/bin:/bin command -v "$t") || die "host tool '$t' not found (scripts/install-vm-deps.sh installs it)"
  copy_with_libs "$p"
  # Guest PATH has /usr/sbin:/usr/bin first, so the real tool wins over busybox.
done
ln -sf mke2fs "$STAGE/usr/sbin/mkfs.ext4"
ln -sf e2fsck "$STAGE/usr/sbin/fsck.ext4"
# glibc loads libgcc_s at thread cancellation; cryptsetup's libs use threads.
for l in /lib/x86_64-linux-gnu/libgcc_s.so.1; do
  [ -e "$STAGE$l" ] || { mkdir -p "$STAGE$(dirname "$l")"; cp -L "$l" "$STAGE$l"; }
done
# Debian keeps libs under /lib/x86_64-linux-gnu and /usr/lib/x86_64-linux-gnu; both
# resolve through /usr/lib -> lib above.
echo "root:x:0:0:root:/root:/bin/sh" > "$STAGE/etc/passwd"
echo "root:x:0:" > "$STAGE/etc/group"

# Kernel modules: whole crypto dirs (dm-crypt loads ciphers on demand) plus the
# dependency closure of the drivers the suite uses.
# dm_zero: cryptsetup maps a BitLocker volume's metadata areas to zero targets.
MODS=(virtio_blk virtio_console ublk_drv nbd dm_crypt dm_integrity dm_zero brd null_blk ext4 loop
      xts essiv aesni_intel crypto_null authenc)
# Accelerated variants that later kernels fold into built-in library code
# (6.17+: sha256 lives in lib/crypto, no sha256_ssse3 module): taken when present.
# The TPM's TIS driver (part tpm): built in on Debian's kernels, taken when a
# kernel has it as a module.
OPT_MODS=(sha256_ssse3 tpm_tis)
depmod -b "$KROOT" "$KVER"
MD="lib/modules/$KVER"
want=$(mktemp)
for m in "${MODS[@]}"; do
  modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null | awk '$1=="insmod" {print $2}' >> "$want" \
    || die "module $m not found in $KROOT"
done
for m in "${OPT_MODS[@]}"; do
  modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null | awk '$1=="insmod" {print $2}' >> "$want" || true
done
( cd "$KROOT/$MD" && find kernel/crypto kernel/arch/x86/crypto kernel/lib/crypto -name '*.ko*' ) \
  | sed "s|^|$KROOT/$MD/|" >> "$want"
sort -u "$want" | while read -r ko; do
  rel="${ko#"$KROOT/"}"; rel="${rel#./}"; rel="${rel#"$KROOT/./"}"
  rel=$(echo "$rel" | sed "s|^.*/lib/modules/|lib/modules/|")
  mkdir -p "$STAGE/$(dirname "$rel")"
  case "$ko" in
    *.xz) xz -dc "$ko" > "$STAGE/${rel%.xz}" ;;
    *.zst) zstd -qdc "$ko" > "$STAGE/${rel%.zst}" ;;
    *) cp "$ko" "$STAGE/$rel" ;;
  esac
done
rm -f "$want"
cp "$KROOT/$MD/modules.builtin" "$KROOT/$MD/modules.order" "$STAGE/$MD/"
[ -f "$KROOT/$MD/modules.builtin.modinfo" ] && cp "$KROOT/$MD/modules.builtin.modinfo" "$STAGE/$MD/"
depmod -b "$STAGE" "$KVER"

( cd "$STAGE" && find . | LC_ALL=C sort | cpio -o -H newc --quiet ) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
