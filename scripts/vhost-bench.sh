#!/usr/bin/env bash
# vhost-user-blk side by side, one run, one client (crates/vhost/examples/
# vhost_load.rs on libblkio), one LUKS1 image on tmpfs, three servers:
#   ucrypt      ucrypt open --export vhost-user-blk (decrypts)
#   qsd-raw     qemu-storage-daemon, raw file node over the same image (no crypto)
#   qsd-luks    qemu-storage-daemon, luks node over the same image
# Cells: 4k QD1 (1 queue), 4k QD32 (2 queues x 16), 1M QD8 (1 queue); random
# reads. Prints each cell's IOPS/MB/s, the ratios, and the bound io*c/(io+c)
# with io = qsd-raw and c = one core's AES-256-XTS speed (openssl
# speed), all measured in this run.
#   bash scripts/vhost-bench.sh [SECONDS per cell, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-5}"
cargo build --release -q -p ucrypt-cli -p ucrypt-vhost --example vhost_load
BIN=target/release/ucrypt
LOAD=target/release/examples/vhost_load
D=$(mktemp -d /dev/shm/vhost-bench.XXXXXX)
PIDS=()
cleanup() {
  UCRYPT_RUNTIME_DIR="$D/rt" "$BIN" close vb >/dev/null 2>&1 || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
IMG="$D/img"
truncate -s 1G "$IMG"
printf 'bench passphrase' > "$D/key"
cryptsetup luksFormat -q --type luks1 --pbkdf-force-iterations 1000 "$IMG" "$D/key"
# Fill the data area so reads decrypt real ciphertext everywhere.
dd if=/dev/urandom of="$IMG" bs=1M seek=2 count=1022 conv=notrunc status=none
UCRYPT_RUNTIME_DIR="$D/rt" "$BIN" open --key-file "$D/key" --mode adaptive --export vhost-user-blk="$D/u.sock" \
  --num-queues 2 "$IMG" vb >/dev/null

qsd() { # NAME BLOCKDEV-ARGS...
  local sock="$D/$1.sock"; shift
  qemu-storage-daemon --object "secret,id=s0,file=$D/key" "$@" \
    --export "type=vhost-user-blk,id=e0,node-name=n0,addr.type=unix,addr.path=$sock,num-queues=2,writable=off" &
  PIDS+=($!)
  for _ in $(seq 100); do [ -S "$sock" ] && return 0; sleep 0.1; done
  echo "qemu-storage-daemon did not start" >&2; exit 1
}
qsd raw --blockdev "driver=file,node-name=n0,filename=$IMG,cache.direct=off,locking=off,read-only=on"
qsd luks --blockdev "driver=file,node-name=f0,filename=$IMG,cache.direct=off,locking=off,read-only=on" \
  --blockdev "driver=luks,node-name=n0,file=f0,key-secret=s0,read-only=on"

# c: one core's AES-256-XTS (the 512-bit key of aes-xts-plain64), by OpenSSL
# (this host's kernel has no crypto API for `cryptsetup benchmark`).
C_MBPS=$(openssl speed -evp aes-256-xts -bytes 65536 -seconds 2 2>/dev/null \
  | awk '/^AES-256-XTS/ {sub("k", "", $2); print $2 / 1000}')
echo "crypto c = $C_MBPS MB/s (openssl speed -evp aes-256-xts, 64 KiB blocks, one core)"

cell() { nice -n 19 "$LOAD" "$D/$1.sock" "$2" "$3" "$4" "$SECS" read | sed 's/.*mbps=//'; }
echo "MB/s per cell:"
printf '%-10s %10s %10s %10s %10s %8s %8s %8s\n' cell qsd-raw qsd-luks ucrypt bound ucr/raw ucr/luks ucr/bnd
for spec in "4k-QD1 4096 1 1" "4k-QD32x2q 4096 16 2" "1M-QD8 1048576 8 1"; do
  set -- $spec
  raw=$(cell raw "$2" "$3" "$4"); luks=$(cell luks "$2" "$3" "$4"); u=$(cell u "$2" "$3" "$4")
  awk -v n="$1" -v r="$raw" -v l="$luks" -v u="$u" -v c="$C_MBPS" 'BEGIN {
    b = r * c / (r + c);
    printf "%-10s %10.1f %10.1f %10.1f %10.1f %7.2fx %7.2fx %8.2f\n", n, r, l, u, b, u / r, u / l, u / b }'
done
