#!/usr/bin/env bash
# Encrypted RBD volumes side by side, one run, one fio nbd job per cell, on a
# throwaway single-node cluster (scripts/ceph-test-cluster.sh; or an existing
# one with CEPH_CONF=...):
#
#   ucrypt      ucrypt open rbd:rbd/IMG --mode adaptive (RBD backend, NBD export)
#   qsd-luks2   qemu-storage-daemon's rbd driver with librbd's LUKS2 encryption
#               (encrypt.format=luks2), exporting NBD
#   qsd-raw     the same qemu path over an unencrypted image: the ceiling
#
# Both encrypted images are formatted by `rbd encryption format IMG luks2` (the
# same on-disk format: aes-xts-plain64, 4096-byte sectors, 16 MiB header) and
# every image is filled through its own export before measuring, so reads hit
# written objects. Cells: 4k QD1, 4k QD16, 1M QD8 (RW=randread by default;
# RW=randwrite for writes), measured in ROUNDS rounds; a round runs the three
# peers back to back, in an order rotated from round to round. Prints the
# median MiB/s and IOPS, the same-run ratios (median of per-round ratios, with
# their lowest-highest range), and the bound io*c/(io+c) with io = the qsd-raw
# ceiling and c = one core's AES-XTS decryption (`ucrypt benchmark`;
# encryption for writes), all measured in this run; then every round's MiB/s,
# so an unstable ceiling shows.
#
# Usage: bash scripts/ceph-bench.sh   (env: RUNTIME=10 s per run, ROUNDS=5,
#        SIZE_MB=512, RW=randread, CEPH_CONF=existing cluster's ceph.conf)
# Needs: fio qemu-storage-daemon (qemu-block-extra) and the Ceph packages
# (scripts/install-test-deps.sh). Run it niced on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-5}
SIZE_MB=${SIZE_MB:-512}
RW=${RW:-randread}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
[ -x "$UCRYPT" ] || cargo build --release -p ucrypt-cli
for t in fio qemu-storage-daemon rbd python3; do
  command -v "$t" >/dev/null || {
    echo "ceph-bench: $t not found (run scripts/install-test-deps.sh)" >&2
    exit 1
  }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ucrypt-ceph-bench.XXXXXX")
export UCRYPT_RUNTIME_DIR=$WORK/run
PIDS=()
OWN_CLUSTER=0
cleanup() {
  set +e
  "$UCRYPT" close cb-uc >/dev/null 2>&1
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait "${PIDS[@]}" 2>/dev/null
  if [ "$OWN_CLUSTER" = 1 ]; then
    bash scripts/ceph-test-cluster.sh stop "$WORK/ceph"
  else
    for i in uc ql raw; do rbd -c "$CONF" rm --no-progress "rbd/$IMG_PREFIX-$i" >/dev/null 2>&1; done
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ -n "${CEPH_CONF:-}" ]; then
  CONF=$CEPH_CONF
  CLUSTER="existing cluster ($CONF)"
else
  OWN_CLUSTER=1
  CONF=$(bash scripts/ceph-test-cluster.sh start "$WORK/ceph")
  CLUSTER="throwaway single-node cluster (1 mon, 1 mgr, 1 bluestore-on-file OSD, pool size 1)"
fi
IMG_PREFIX="ceph-bench-$$"
rbdc() { rbd -c "$CONF" "$@"; }

# ---- images ---------------------------------------------------------------
printf 'ceph-bench passphrase' >"$WORK/pass"
rbdc create "rbd/$IMG_PREFIX-raw" --size "${SIZE_MB}M"
for i in uc ql; do
  rbdc create "rbd/$IMG_PREFIX-$i" --size "$((SIZE_MB + 16))M"
  rbdc encryption format "rbd/$IMG_PREFIX-$i" luks2 "$WORK/pass" &
done
wait

# ---- servers ----------------------------------------------------------------
wait_sock() {
  for _ in $(seq 600); do [ -S "$1" ] && return 0; sleep 0.1; done
  echo "ceph-bench: no socket $1" >&2
  exit 1
}
declare -A URI
"$UCRYPT" open --ceph-conf "$CONF" --key-file "$WORK/pass" --mode adaptive \
  "rbd:rbd/$IMG_PREFIX-uc" cb-uc >/dev/null
URI[ucrypt]="nbd+unix:///?socket=$UCRYPT_RUNTIME_DIR/cb-uc.nbd.sock"

qsd() { # NAME BLOCKDEV-OPTIONS
  qemu-storage-daemon --object "secret,id=s0,file=$WORK/pass" \
    --blockdev "driver=rbd,node-name=n0,pool=rbd,conf=$CONF,user=admin,$2" \
    --nbd-server "addr.type=unix,addr.path=$WORK/$1.sock" \
    --export type=nbd,id=e0,node-name=n0,writable=on >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  wait_sock "$WORK/$1.sock"
  URI[$1]="nbd+unix:///n0?socket=$WORK/$1.sock" # export name = node name
}
qsd qsd-luks2 "image=$IMG_PREFIX-ql,encrypt.format=luks2,encrypt.key-secret=s0"
qsd qsd-raw "image=$IMG_PREFIX-raw"
PEERS=(qsd-raw qsd-luks2 ucrypt)

# ---- measuring --------------------------------------------------------------
# fio_run URI BS QD -> "MiB/s IOPS"
fio_run() {
  fio --name=ceph-bench --ioengine=nbd --uri="$1" --rw="$RW" --bs="$2" --iodepth="$3" \
    --size="${SIZE_MB}M" --time_based --runtime="$RUNTIME" --ramp_time=1 --randrepeat=0 \
    --output-format=json 2>/dev/null | python3 -c '
import json, sys
t = sys.stdin.read()  # fio nbd prints "fio: connected to NBD server" first
j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.1f %.0f" % (d["bw_bytes"] / 1048576, d["iops"]))'
}
for p in "${PEERS[@]}"; do
  fio --name=fill --ioengine=nbd --uri="${URI[$p]}" --rw=write --bs=1M --iodepth=8 \
    --size="${SIZE_MB}M" >/dev/null 2>&1
done

# c: one core's AES-XTS (512-bit key, 4096-byte sectors) in ucrypt's own code.
dir=decryption
[ "$RW" = randread ] || dir=encryption
C_MIBS=$("$UCRYPT" benchmark -c aes-xts-plain64 --json --no-openssl |
  python3 -c "import json, sys; print('%.0f' % json.load(sys.stdin)['ciphers'][0]['${dir}_mib_per_sec'])")

declare -A MIBS IOPS
CELLS=("4k QD1:4k:1" "4k QD16:4k:16" "1M QD8:1M:8")
# Every round runs each peer once, in a rotated order (round r starts with
# peer r mod 3), so a drift in the machine's load hits every peer alike;
# MIBS/IOPS keep every round's figure, in round order.
for cell in "${CELLS[@]}"; do
  IFS=: read -r name bs qd <<<"$cell"
  for r in $(seq 0 $((ROUNDS - 1))); do
    for k in 0 1 2; do
      p=${PEERS[$(((r + k) % 3))]}
      read -r b i < <(fio_run "${URI[$p]}" "$bs" "$qd")
      MIBS[$p,$name]+="$b "
      IOPS[$p,$name]+="$i "
    done
  done
done

# ---- report -------------------------------------------------------------------
echo
echo "fio nbd engine, $RW, ${SIZE_MB} MiB images on a $CLUSTER;"
echo "${RUNTIME}s per run, ${ROUNDS} rotated rounds (medians); $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "c = $C_MIBS MiB/s (ucrypt benchmark, aes-xts-plain64 512-bit key, 4096-byte sectors, $dir, one core)"
echo
echo "| cell | qsd raw (ceiling) | qsd librbd luks2 | ucrypt adaptive | ucrypt / librbd luks2 | bound io·c/(io+c) | ucrypt / bound |"
echo "|---|---:|---:|---:|---:|---:|---:|"
SPREAD=()
for cell in "${CELLS[@]}"; do
  name=${cell%%:*}
  out=$(python3 - "$name" "$C_MIBS" "${MIBS[qsd-raw,$name]}" "${IOPS[qsd-raw,$name]}" \
    "${MIBS[qsd-luks2,$name]}" "${IOPS[qsd-luks2,$name]}" \
    "${MIBS[ucrypt,$name]}" "${IOPS[ucrypt,$name]}" <<'EOF'
import statistics, sys
n, c = sys.argv[1], float(sys.argv[2])
rb, ri, lb, li, ub, ui = ([float(x) for x in a.split()] for a in sys.argv[3:])
med = statistics.median
bound = lambda io: io * c / (io + c)
# Same-run ratios: each round's ucrypt against that round's peers.
# A round whose peer moved nothing (a failed or starved fio run, shown as
# 0.0 below) has no ratio.
vs_luks = [u / l for u, l in zip(ub, lb) if l > 0] or [0.0]
vs_bound = [u / bound(r) for u, r in zip(ub, rb) if r > 0] or [0.0]
cell = lambda b, i: "%.1f MiB/s (%.0f IOPS)" % (med(b), med(i))
spread = lambda v: "%.2f-%.2f" % (min(v), max(v))
print("| %s | %s | %s | %s | %.2fx (%s) | %.1f MiB/s | %.2f (%s) |" % (
    n, cell(rb, ri), cell(lb, li), cell(ub, ui), med(vs_luks), spread(vs_luks),
    bound(med(rb)), med(vs_bound), spread(vs_bound)), flush=True)
pct = lambda v: 100 * (max(v) - min(v)) / max(med(v), 1e-9)
print("%s: qsd raw %s (spread %.0f%% of its median); qsd luks2 %s; ucrypt %s" % (
    n, " ".join("%.1f" % x for x in rb), pct(rb), " ".join("%.1f" % x for x in lb),
    " ".join("%.1f" % x for x in ub)))
EOF
  )
  head -n1 <<<"$out"
  SPREAD+=("$(tail -n1 <<<"$out")")
done
echo
echo "Ratios: median of the per-round ratios (a round runs the three peers back to"
echo "back), lowest-highest round in brackets. MiB/s of every round:"
printf '  %s\n' "${SPREAD[@]}"
echo
echo "Goals: ucrypt >= 1.0x the librbd-encrypted peer in every cell; >= 0.9 of the bound."
