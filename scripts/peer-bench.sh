#!/usr/bin/env bash
# Peer comparison of the NBD export, all measured with fio's nbd engine and the
# same job file, in one run (ratios, not absolute numbers, are the point):
#
#   4k QD1 : ucrypt (aes-xts-plain64)  vs  nbdkit memory plugin (raw, no crypto)
#   1M QD8 : ucrypt (aes-xts-plain64)  vs  nbdkit --filter=luks file
#                                      vs  qemu-storage-daemon luks driver
#
# Every encrypted peer serves the SAME LUKS1 image (made by cryptsetup; the
# nbdkit filter and qemu's driver read LUKS1 only), kept on tmpfs so the disk
# is out of the picture. ucrypt opens it with --type luks when LUKS support is
# built in, else as --type plain with the volume key and payload offset from
# `cryptsetup luksDump --dump-volume-key` (identical bytes on disk).
# Each export is pre-filled so no peer serves unallocated (free) zero pages.
#
# Usage: scripts/peer-bench.sh            (RUNTIME=10 SIZE_MB=256 by default)
# Needs: fio nbdkit qemu-storage-daemon cryptsetup python3 (scripts/install-test-deps.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
SIZE_MB=${SIZE_MB:-256}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
[ -x "$UCRYPT" ] || cargo build --release -p ucrypt-cli
for t in fio nbdkit qemu-storage-daemon cryptsetup python3; do
  command -v "$t" >/dev/null || { echo "peer-bench: $t not found (run scripts/install-test-deps.sh)" >&2; exit 1; }
done

WORK=$(mktemp -d /dev/shm/ucrypt-peer.XXXXXX)
export UCRYPT_RUNTIME_DIR=$WORK/run
PIDS=()
cleanup() {
  "$UCRYPT" close peer >/dev/null 2>&1 || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- the LUKS1 image shared by all encrypted peers -------------------------
printf 'peer-bench-passphrase' >"$WORK/pass"
truncate -s $((SIZE_MB + 2))M "$WORK/luks.img"
cryptsetup luksFormat -q --type luks1 --cipher aes-xts-plain64 --key-size 512 --hash sha256 \
  --pbkdf-force-iterations 1000 --key-file "$WORK/pass" "$WORK/luks.img"
DUMP=$(cryptsetup luksDump -q --dump-volume-key --key-file "$WORK/pass" "$WORK/luks.img")
KEY=$(printf '%s\n' "$DUMP" | python3 -c '
import sys, re
t = sys.stdin.read()
m = re.search(r"(?:MK dump|Volume key):\s*((?:[0-9a-f]{2}\s+)+)", t)
print("".join(m.group(1).split()))')
OFFSET=$(printf '%s\n' "$DUMP" | awk '/Payload offset:/ {print $3}')
SECTORS=$(( $(stat -c %s "$WORK/luks.img") / 512 - OFFSET ))

# ---- helpers ---------------------------------------------------------------
# fio_run NAME URI RW BS QD -> prints "iops MiB/s"
fio_run() {
  local out
  out=$(fio --name="$1" --ioengine=nbd --uri="$2" --rw="$3" --bs="$4" --iodepth="$5" \
    --size=${SIZE_MB}M --time_based --runtime="$RUNTIME" --ramp_time=1 --randrepeat=0 \
    --output-format=json 2>/dev/null)
  printf '%s' "$out" | python3 -c '
import json, sys
t = sys.stdin.read()  # fio nbd prints "fio: connected to NBD server" first
j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.0f %.1f" % (d["iops"], d["bw_bytes"] / 2**20))'
}
fill() { fio --name=fill --ioengine=nbd --uri="$1" --rw=write --bs=1M --iodepth=8 --size=${SIZE_MB}M >/dev/null; }
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

declare -A R
measure() { # LABEL URI : runs the four jobs used in the table
  local label=$1 uri=$2
  R[$label,4k,randread]=$(fio_run "$label" "$uri" randread 4k 1)
  R[$label,4k,randwrite]=$(fio_run "$label" "$uri" randwrite 4k 1)
  R[$label,1M,randread]=$(fio_run "$label" "$uri" randread 1M 8)
  R[$label,1M,randwrite]=$(fio_run "$label" "$uri" randwrite 1M 8)
}

# ---- nbdkit memory (raw baseline) -----------------------------------------
nbdkit -f -U "$WORK/mem.sock" memory size=${SIZE_MB}M & PIDS+=($!)
wait_sock "$WORK/mem.sock"
MEM="nbd+unix:///?socket=$WORK/mem.sock"
fill "$MEM"
R[mem,4k,randread]=$(fio_run mem "$MEM" randread 4k 1)
R[mem,4k,randwrite]=$(fio_run mem "$MEM" randwrite 4k 1)
R[mem,1M,randread]=$(fio_run mem "$MEM" randread 1M 8)
R[mem,1M,randwrite]=$(fio_run mem "$MEM" randwrite 1M 8)
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

# ---- ucrypt, each data-path mode switched live with `ucrypt refresh` -------
if "$UCRYPT" open --type luks --key-file "$WORK/pass" "$WORK/luks.img" peer >/dev/null 2>&1; then
  HOW="--type luks"
else
  HOW="--type plain (volume key from luksDump)"
  "$UCRYPT" open --type plain --table "0 $SECTORS crypt aes-xts-plain64 $KEY 0 $WORK/luks.img $OFFSET" \
    "$WORK/luks.img" peer >/dev/null
fi
UC="nbd+unix:///?socket=$UCRYPT_RUNTIME_DIR/peer.nbd.sock"
fill "$UC"
for mode in inline adaptive classic; do
  "$UCRYPT" refresh peer --mode "$mode" >/dev/null
  measure "ucrypt-$mode" "$UC"
done
"$UCRYPT" close peer

# ---- nbdkit luks filter -----------------------------------------------------
nbdkit -f -U "$WORK/nk.sock" --filter=luks file "$WORK/luks.img" passphrase=+"$WORK/pass" & PIDS+=($!)
wait_sock "$WORK/nk.sock"
measure nbdkit-luks "nbd+unix:///?socket=$WORK/nk.sock"
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

# ---- qemu-storage-daemon luks driver ---------------------------------------
qemu-storage-daemon \
  --object secret,id=sec0,file="$WORK/pass" \
  --blockdev driver=file,node-name=f0,filename="$WORK/luks.img" \
  --blockdev driver=luks,node-name=l0,file=f0,key-secret=sec0 \
  --nbd-server addr.type=unix,addr.path="$WORK/qsd.sock" \
  --export type=nbd,id=e0,node-name=l0,writable=on & PIDS+=($!)
wait_sock "$WORK/qsd.sock"
measure qsd-luks "nbd+unix:///l0?socket=$WORK/qsd.sock"  # export name = node name
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

# ---- report -----------------------------------------------------------------
echo
echo "fio nbd engine, ${SIZE_MB} MiB export on tmpfs, ${RUNTIME}s per job, $(nproc) CPUs; ucrypt opened as $HOW"
echo
echo "| job | peer | IOPS | MiB/s | ucrypt-inline | ucrypt-adaptive | ucrypt-classic |"
echo "|---|---|---:|---:|---:|---:|---:|"
row() { # JOB-KEY PEER LABEL
  local k=$1 p=$2 job=$3 base
  base=${R[$p,$k]}
  local bi=${base%% *} bm=${base##* }
  local cells=""
  for m in inline adaptive classic; do
    local u=${R[ucrypt-$m,$k]}
    local ui=${u%% *}
    cells+=" $(python3 -c "print('%s IOPS = %.2fx' % ($ui, $ui / max($bi, 1)))") |"
  done
  echo "| $job | $p | $bi | $bm |$cells"
}
row 4k,randread mem "4k randread QD1"
row 4k,randwrite mem "4k randwrite QD1"
for p in nbdkit-luks qsd-luks; do
  row 1M,randread $p "1M randread QD8"
  row 1M,randwrite $p "1M randwrite QD8"
done
echo
echo "Goals: >= 0.95x of nbdkit memory at 4k QD1; >= 4x of nbdkit-luks and qsd-luks at 1M QD8."
