#!/usr/bin/env bash
# Installs what the test suite uses as independent references and real clients.
# Debian 12; needs root (or sudo). Idempotent.
set -euo pipefail
# Build dependencies first (C toolchain, perl/make for vendored OpenSSL, libclang for libublk).
bash "$(dirname "$0")/install-build-deps.sh"
PKGS=(
  python3 python3-cryptography           # independent AES/XTS/CBC oracle
  cryptsetup-bin                         # LUKS reference (format/dump on plain files)
  jq xz-utils                            # cryptsetup's LUKS2 validation suite (fetched at test time)
  fio                                    # real NBD client (nbd engine)
  nbdkit libnbd-bin                      # peers and nbdcopy/nbdinfo
  qemu-utils qemu-system-common          # qemu-img convert/compare; qemu-storage-daemon (luks peer)
  fuse3 e2fsprogs util-linux             # FUSE export -> loop -> mkfs.ext4 -> mount
  ceph-mon ceph-osd ceph-mgr ceph-common # scripts/ceph-test-cluster.sh (RBD tests, ceph-bench)
  rbd-nbd librbd-dev librados-dev        # librbd client + its encryption; the RBD backend builds on it
  qemu-block-extra                       # qemu-storage-daemon's rbd driver (librbd LUKS peer)
  qemu-system-x86                        # a real qemu attaching vhost-user-blk with its default queues
  gdb                                    # stops cryptsetup reencrypt between two hotzones (interop tests)
  dislocker libbde-utils libfvde-utils   # BitLocker/FileVault 2 FUSE peers (scripts/bench-foreign.sh)
  swtpm swtpm-tools libtss2-tcti-swtpm0  # a software TPM2 and its TCTI (token tests)
  tpm2-tools systemd                     # tpm2_pcrextend; systemd-cryptenroll enrolls the test volumes
  softhsm2 p11-kit p11-kit-modules opensc # a PKCS#11 token, p11-kit's proxy module, pkcs11-tool
  keyutils                               # keyctl: luks2-keyring token tests
  man-db                                 # `man` reads the pages scripts/install.sh installs (install test)
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
# Kernel modules the tests use, loaded when this kernel ships them (best
# effort: a kernel without them makes those tests skip as `kernel` limits,
# which scripts/test.sh lists at the end).
if command -v modprobe >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  for m in loop fuse ublk_drv; do
    [ -d "/sys/module/$m" ] || $SUDO modprobe -q "$m" 2>/dev/null || true
  done
fi
