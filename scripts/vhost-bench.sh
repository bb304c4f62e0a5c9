#!/usr/bin/env bash
# vhost-user-blk side by side, one run, one client (libblkio in the bench
# process): `ucrypt bench --via vhost --peers` (docs/BENCHMARKING.md,
# "--via vhost"). Servers: ucrypt open --export vhost-user-blk per mode,
# qemu-storage-daemon raw (the bound's io) and luks; each its own image in
# /dev/shm. Headline 4k QD1 and 1M QD8 (one queue), sweep 4k QD16 x 2
# queues; reads and writes; median of interleaved rounds; the bound
# io*c/(io+c) with c = ucrypt's one-core XTS from the same run.
#   bash scripts/vhost-bench.sh [extra ucrypt bench options, e.g. --quick]
# UCRYPT_BASE=/path/to/other/ucrypt (one that has --via vhost) runs the same bench with that binary
# right after (two runs, not interleaved: compare their raw columns before
# their ucrypt ones).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ucrypt-cli
ARGS=(bench --via vhost --peers --targets aes-classic,aes-inline,aes-adaptive
  --sweep-targets aes-classic,aes-inline,aes-adaptive
  --runtime 1500ms --seconds 1.5 --reps 3 --rounds 3 --no-progress)
OUT=${OUT:-results/vhost-bench-$(date -u +%Y%m%dT%H%M%SZ)}
target/release/ucrypt "${ARGS[@]}" --out "$OUT" "$@"
if [ -n "${UCRYPT_BASE:-}" ]; then
  echo "== UCRYPT_BASE=$UCRYPT_BASE"
  "$UCRYPT_BASE" "${ARGS[@]}" --out "$OUT-base" "$@"
fi
