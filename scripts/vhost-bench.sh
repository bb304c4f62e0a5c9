#!/usr/bin/env bash
# vhost-user-blk side by side, one run, one client (crates/vhost/examples/
# vhost_load.rs on libblkio), one LUKS1 image on tmpfs, three servers:
#   ucrypt      ucrypt open --export vhost-user-blk (decrypts)
#   qsd-raw     qemu-storage-daemon, raw file node over the same image (no crypto)
#   qsd-luks    qemu-storage-daemon, luks node over the same image
# Cells: 4k QD1 (1 queue), 4k QD32 (2 queues x 16), 1M QD8 (1 queue); random
# reads. Prints each cell's IOPS/MB/s, the ratios, and the bound io*c/(io+c)
# with io = qsd-raw and c = one core's AES-256-XTS speed (openssl
# speed), all measured in this run. Each cell runs ROUNDS times (default 3),
# servers interleaved within a round, and the median is reported (a shared
# machine's load changes hit every server alike).
# UCRYPT_BASE=/path/to/other/ucrypt adds a fourth server, the same export
# from that binary, and a before/after ratio column (an A/B in one run).
#   bash scripts/vhost-bench.sh [SECONDS per cell, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-5}"
ROUNDS=${ROUNDS:-3}
BASE=${UCRYPT_BASE:-}
# Two invocations: `--example` limits a build to the examples, so the
# ucrypt binary would otherwise be left as it was.
cargo build --release -q -p ucrypt-cli
cargo build --release -q -p ucrypt-vhost --example vhost_load
BIN=target/release/ucrypt
LOAD=target/release/examples/vhost_load
D=$(mktemp -d /dev/shm/vhost-bench.XXXXXX)
PIDS=()
cleanup() {
  UCRYPT_RUNTIME_DIR="$D/rt" "$BIN" close vb >/dev/null 2>&1 || true
  [ -z "$BASE" ] || UCRYPT_RUNTIME_DIR="$D/rt" "$BASE" close vbase >/dev/null 2>&1 || true
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
if [ -n "$BASE" ]; then
  # A second read-only opener of the same image (both only read).
  cp --sparse=always "$IMG" "$D/img-base"
  UCRYPT_RUNTIME_DIR="$D/rt" "$BASE" open --key-file "$D/key" --mode adaptive \
    --export vhost-user-blk="$D/base.sock" --num-queues 2 "$D/img-base" vbase >/dev/null
fi

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
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
SERVERS="raw luks u"
[ -z "$BASE" ] || SERVERS="$SERVERS base"
echo "MB/s per cell (median of $ROUNDS interleaved rounds, ${SECS}s each; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)):"
printf '%-10s %10s %10s %10s %10s %8s %8s %8s' cell qsd-raw qsd-luks ucrypt bound ucr/raw ucr/luks ucr/bnd
[ -z "$BASE" ] && echo || printf ' %10s %8s\n' base new/base
for spec in "4k-QD1 4096 1 1" "4k-QD32x2q 4096 16 2" "1M-QD8 1048576 8 1"; do
  set -- $spec
  declare -A runs=()
  for _ in $(seq "$ROUNDS"); do
    for s in $SERVERS; do runs[$s]+="$(cell "$s" "$2" "$3" "$4") "; done
  done
  raw=$(median ${runs[raw]}); luks=$(median ${runs[luks]}); u=$(median ${runs[u]})
  base=0; [ -z "$BASE" ] || base=$(median ${runs[base]})
  awk -v n="$1" -v r="$raw" -v l="$luks" -v u="$u" -v c="$C_MBPS" -v base="$base" 'BEGIN {
    b = r * c / (r + c);
    printf "%-10s %10.1f %10.1f %10.1f %10.1f %7.2fx %7.2fx %8.2f", n, r, l, u, b, u / r, u / l, u / b
    if (base > 0) printf " %10.1f %7.2fx\n", base, u / base; else printf "\n" }'
done
