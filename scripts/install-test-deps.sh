#!/usr/bin/env bash
# Installs what the test suite uses as independent references and real clients.
# Debian 12; needs root (or sudo). Idempotent.
set -euo pipefail
PKGS=(
  build-essential perl make pkg-config   # vendored OpenSSL build
  python3 python3-cryptography           # independent AES/XTS/CBC oracle
  cryptsetup-bin                         # LUKS reference (format/dump on plain files)
  fio                                    # real NBD client (nbd engine)
  nbdkit libnbd-bin                      # peers and nbdcopy/nbdinfo
  qemu-utils qemu-storage-daemon         # qemu-img convert/compare, qsd luks peer
  fuse3 e2fsprogs util-linux             # FUSE export -> loop -> mkfs.ext4 -> mount
  libclang-dev                           # bindgen in libublk-rs-sys (crates/ublk build)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
