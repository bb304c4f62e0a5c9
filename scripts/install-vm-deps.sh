#!/usr/bin/env bash
# Installs what the guest test harness (scripts/vm-test.sh) needs on the host,
# and fetches the guest kernel without installing it.
#
# Host packages: qemu (the guest), busybox-static (the guest's userland), and the
# tools copied into the guest's initramfs with their shared libraries (nbd-client,
# cryptsetup, dmsetup, e2fsprogs, fio, kmod for module dependency order; for the
# tpm part swtpm, which runs on the host, and systemd-cryptenroll, systemd's
# cryptsetup token plugin and tpm2-tools, which run in the guest).
#
# Kernel: Debian 12's `linux-image-6.12-amd64` (6.12 ships ublk_drv; the default
# 6.1 kernel does not). The versioned package it depends on is fetched with
# `apt-get download` and extracted with `dpkg-deb -x` into the cache dir given as
# $1 (default target/vm-cache); it is never installed on the host.
# Prints the extracted kernel root on the last line. Debian 12; needs root (or sudo).
# Idempotent: a cached kernel is reused.
#
# UCRYPT_VM_KERNEL_SUITE=SUITE (e.g. trixie-backports: Linux 6.16+, which has
# ublk's UPDATE_SIZE) takes the kernel from that Debian suite instead, through a
# private apt source list and package index under $CACHE/apt (the host's apt
# sources are not touched); its metapackage defaults to linux-image-amd64.
# Kernels packaged after 6.12 split into linux-binary-* (vmlinuz), linux-base-* and
# linux-modules-* under /usr/lib/modules/KVER: both are fetched, and the
# extracted root gets lib -> usr/lib and boot/vmlinuz-KVER links so that it
# looks like the 6.12 layout.
set -euo pipefail
CACHE="${1:-${UCRYPT_VM_CACHE:-$(cd "$(dirname "$0")/.." && pwd)/target/vm-cache}}"
SUITE="${UCRYPT_VM_KERNEL_SUITE:-}"
if [ -n "$SUITE" ]; then
  KPKG_META="${UCRYPT_VM_KERNEL_META:-linux-image-amd64}"
else
  KPKG_META="${UCRYPT_VM_KERNEL_META:-linux-image-6.12-amd64}"
fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

PKGS=(
  qemu-system-x86                 # qemu-system-x86_64 (KVM or TCG)
  busybox-static                  # the guest's shell and coreutils
  nbd-client                      # the kernel NBD client, run in the guest
  cryptsetup-bin dmsetup          # dm-crypt side by side in the guest
  e2fsprogs fio kmod cpio         # mkfs/fsck, IO verification, modprobe --show-depends, initramfs
  swtpm systemd tpm2-tools        # the tpm part: the guest's TPM2, systemd-cryptenroll and its token
  libtss2-tcti-device0            #   plugin, tpm2_pcrextend; tpm2-tss's /dev/tpmrm0 TCTI
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
updated=0
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq; updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

mkdir -p "$CACHE"
stamp="$CACHE/kernel.pkg"
if [ -f "$stamp" ] && [ -d "$CACHE/kernel/$(cat "$stamp")" ]; then
  echo "$CACHE/kernel/$(cat "$stamp")"
  exit 0
fi
APT=()
if [ -n "$SUITE" ]; then
  A="$CACHE/apt"
  mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
  echo "deb http://deb.debian.org/debian $SUITE main" > "$A/sources.list"
  APT=(-o "Dir::Etc::sourcelist=$A/sources.list" -o Dir::Etc::sourceparts=/nonexistent
       -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
  [ -n "$(ls "$A/lists" 2>/dev/null | grep -v partial)" ] || { apt-get "${APT[@]}" update -qq >&2; }
  updated=1
fi
# The metapackage depends on exactly one versioned image package.
kpkg=$(apt-cache "${APT[@]}" depends "$KPKG_META" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
if [ -z "$kpkg" ] && [ "$updated" -eq 0 ]; then
  $SUDO apt-get update -qq
  kpkg=$(apt-cache depends "$KPKG_META" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
fi
if [ -z "$kpkg" ]; then
  echo "install-vm-deps: no kernel package: apt-cache finds no '$KPKG_META'${SUITE:+ in $SUITE} (needs Debian 12 with bookworm-security or backports)" >&2
  exit 1
fi
# Split packaging (after 6.12): the image package only depends on these three
# (linux-base-* holds config, System.map, modules.builtin).
parts=$(apt-cache "${APT[@]}" depends "$kpkg" 2>/dev/null | awk '/Depends: linux-(base|binary|modules)-/ {print $2}' | sort -u)
dl="$CACHE/download"
rm -rf "$dl"; mkdir -p "$dl"
# apt-get download writes into the current directory; as root, apt drops to the
# _apt user, which must be able to write there.
chmod 0777 "$dl"
# shellcheck disable=SC2086 # $parts: package names, one per word
( cd "$dl" && apt-get "${APT[@]}" download -qq "$kpkg" $parts >&2 )
root="$CACHE/kernel/$kpkg"
rm -rf "$root.tmp"; mkdir -p "$root.tmp"
for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$root.tmp"; done
if [ ! -e "$root.tmp/lib/modules" ] && [ -d "$root.tmp/usr/lib/modules" ]; then
  ln -s usr/lib "$root.tmp/lib"
  kv=$(ls "$root.tmp/usr/lib/modules" | head -n1)
  mkdir -p "$root.tmp/boot"
  ln -s "../usr/lib/modules/$kv/vmlinuz" "$root.tmp/boot/vmlinuz-$kv"
fi
rm -rf "$root"; mv "$root.tmp" "$root"
rm -rf "$dl"
echo "$kpkg" > "$stamp"
echo "$root"
