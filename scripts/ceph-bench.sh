#!/usr/bin/env bash
# Encrypted RBD volumes side by side: starts a throwaway single-node cluster
# (scripts/ceph-test-cluster.sh; or uses an existing one with CEPH_CONF=...)
# and runs `ucrypt bench --ceph --peers` against it, which compares through
# fio's nbd engine, on images it makes and removes in the pool:
#
#   ucrypt-aes-adaptive  ucrypt open rbd:POOL/IMG --mode adaptive (NBD export)
#   qsd-luks2            qemu-storage-daemon's rbd driver with librbd's LUKS2
#   raw                  the same qemu path over an unencrypted image: the ceiling
#
# Both encrypted images are LUKS2 from `rbd encryption format` (the same
# on-disk format). Cells 4k QD1, 4k QD16, 1M QD8, random read and write, in
# rounds whose order rotates; medians, % of raw, the bound io*c/(io+c). See
# docs/BENCHMARKING.md (`--ceph`) for what the runner does.
#
# Usage: bash scripts/ceph-bench.sh [ucrypt bench options, e.g. --targets aes-inline,aes-adaptive]
#        (env: RUNTIME=10 s per run, ROUNDS=5, SIZE_MB=256, POOL=rbd,
#         CEPH_CONF=existing cluster's ceph.conf)
# Needs: fio, qemu-storage-daemon (qemu-block-extra) and the Ceph packages
# (scripts/install-test-deps.sh). Run it niced on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-5}
SIZE_MB=${SIZE_MB:-256}
POOL=${POOL:-rbd}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
[ -x "$UCRYPT" ] || cargo build --release -p ucrypt-cli

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ucrypt-ceph-bench.XXXXXX")
OWN_CLUSTER=0
cleanup() {
  if [ "$OWN_CLUSTER" = 1 ]; then bash scripts/ceph-test-cluster.sh stop "$WORK/ceph"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ -n "${CEPH_CONF:-}" ]; then
  CONF=$CEPH_CONF
  echo "ceph-bench: existing cluster ($CONF), pool $POOL" >&2
else
  OWN_CLUSTER=1
  CONF=$(bash scripts/ceph-test-cluster.sh start "$WORK/ceph")
  echo "ceph-bench: throwaway single-node cluster (1 mon, 1 mgr, 1 bluestore-on-file OSD, pool size 1)" >&2
fi

"$UCRYPT" --ceph-conf "$CONF" bench --ceph --ceph-pool "$POOL" --peers \
  --size "${SIZE_MB}M" --runtime "${RUNTIME}s" --reps "$ROUNDS" --warmup 1s "$@"
