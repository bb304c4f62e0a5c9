#!/usr/bin/env bash
# Peer comparison of the NBD export, all measured with fio's nbd engine and the
# same job file, in one run (ratios, not absolute numbers, are the point):
#
#   4k QD1 : ucrypt (aes-xts-plain64)  vs  nbdkit memory plugin (raw, no crypto)
#   1M QD8 : ucrypt (aes-xts-plain64)  vs  nbdkit memory (raw: the transport's ceiling)
#                                      vs  nbdkit --filter=luks file
#                                      vs  qemu-storage-daemon luks driver
#
# Every encrypted peer serves the SAME LUKS1 image (made by cryptsetup; the
# nbdkit filter and qemu's driver read LUKS1 only), kept on tmpfs so the disk
# is out of the picture. ucrypt opens it with --type luks when LUKS support is
# built in, else as --type plain with the volume key and payload offset from
# `cryptsetup luksDump --dump-volume-key` (identical bytes on disk).
# Each export is pre-filled so no peer serves unallocated (free) zero pages.
#
# Usage: scripts/peer-bench.sh   (env: RUNTIME=10 s per run, ROUNDS=3, SIZE_MB=256)
# UCRYPT_BASE=/path/to/other/ucrypt adds that binary's adaptive export as one
# more peer, measured in the same rounds, and prints new/base ratios (a
# before/after A/B that stays meaningful on a loaded machine).
# Needs: fio nbdkit qemu-storage-daemon cryptsetup python3 (scripts/install-test-deps.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-3}
SIZE_MB=${SIZE_MB:-256}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
BASE=${UCRYPT_BASE:-}
[ -x "$UCRYPT" ] || cargo build --release -p ucrypt-cli
for t in fio nbdkit qemu-storage-daemon cryptsetup python3; do
  command -v "$t" >/dev/null || { echo "peer-bench: $t not found (run scripts/install-test-deps.sh)" >&2; exit 1; }
done

WORK=$(mktemp -d /dev/shm/ucrypt-peer.XXXXXX)
export UCRYPT_RUNTIME_DIR=$WORK/run
PIDS=()
cleanup() {
  for m in inline adaptive classic; do "$UCRYPT" close "uc-$m" >/dev/null 2>&1 || true; done
  [ -z "$BASE" ] || "$BASE" close uc-base >/dev/null 2>&1 || true
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
# fio_run URI RW BS QD -> prints IOPS
fio_run() {
  local out
  out=$(fio --name=peer --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" \
    --size=${SIZE_MB}M --time_based --runtime="$RUNTIME" --ramp_time=1 --randrepeat=0 \
    --output-format=json 2>/dev/null)
  printf '%s' "$out" | python3 -c '
import json, sys
t = sys.stdin.read()  # fio nbd prints "fio: connected to NBD server" first
j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.0f" % d["iops"])'
}
fill() { fio --name=fill --ioengine=nbd --uri="$1" --rw=write --bs=1M --iodepth=8 --size=${SIZE_MB}M >/dev/null; }
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# ---- all servers up at once, each on its own copy of the image --------------
# Peers are then measured round-robin, ROUNDS times per job, and the median
# is reported: on a shared machine, load changes hit every peer alike.
declare -A URI
nbdkit -f -U "$WORK/mem.sock" memory size=${SIZE_MB}M & PIDS+=($!)
URI[mem]="nbd+unix:///?socket=$WORK/mem.sock"

HOW="--type luks"
for mode in inline adaptive classic; do
  cp --sparse=always "$WORK/luks.img" "$WORK/uc-$mode.img"
  if ! "$UCRYPT" open --type luks --key-file "$WORK/pass" --mode "$mode" "$WORK/uc-$mode.img" "uc-$mode" >/dev/null 2>&1; then
    HOW="--type plain (volume key and offset from luksDump)"
    "$UCRYPT" open --type plain --mode "$mode" \
      --table "0 $SECTORS crypt aes-xts-plain64 $KEY 0 $WORK/uc-$mode.img $OFFSET" "$WORK/uc-$mode.img" "uc-$mode" >/dev/null
  fi
  URI[ucrypt-$mode]="nbd+unix:///?socket=$UCRYPT_RUNTIME_DIR/uc-$mode.nbd.sock"
done

if [ -n "$BASE" ]; then
  cp --sparse=always "$WORK/luks.img" "$WORK/uc-base.img"
  "$BASE" open --type luks --key-file "$WORK/pass" --mode adaptive "$WORK/uc-base.img" uc-base >/dev/null
  URI[ucrypt-base]="nbd+unix:///?socket=$UCRYPT_RUNTIME_DIR/uc-base.nbd.sock"
fi

cp --sparse=always "$WORK/luks.img" "$WORK/nk.img"
nbdkit -f -U "$WORK/nk.sock" --filter=luks file "$WORK/nk.img" passphrase=+"$WORK/pass" & PIDS+=($!)
URI[nbdkit-luks]="nbd+unix:///?socket=$WORK/nk.sock"

cp --sparse=always "$WORK/luks.img" "$WORK/qsd.img"
qemu-storage-daemon \
  --object secret,id=sec0,file="$WORK/pass" \
  --blockdev driver=file,node-name=f0,filename="$WORK/qsd.img" \
  --blockdev driver=luks,node-name=l0,file=f0,key-secret=sec0 \
  --nbd-server addr.type=unix,addr.path="$WORK/qsd.sock" \
  --export type=nbd,id=e0,node-name=l0,writable=on & PIDS+=($!)
URI[qsd-luks]="nbd+unix:///l0?socket=$WORK/qsd.sock"  # export name = node name

wait_sock "$WORK/mem.sock"; wait_sock "$WORK/nk.sock"; wait_sock "$WORK/qsd.sock"
for p in "${!URI[@]}"; do fill "${URI[$p]}"; done

declare -A R
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
job() { # KEY RW BS QD PEERS...
  local key=$1 rw=$2 bs=$3 qd=$4; shift 4
  declare -A runs
  for _ in $(seq "$ROUNDS"); do
    for p in "$@"; do runs[$p]+="$(fio_run "${URI[$p]}" "$rw" "$bs" "$qd") "; done
  done
  for p in "$@"; do R[$p,$key]=$(median ${runs[$p]}); done
}
UCS=(ucrypt-inline ucrypt-adaptive ucrypt-classic)
[ -z "$BASE" ] || UCS+=(ucrypt-base)
job 4kr randread 4k 1 mem "${UCS[@]}"
job 4kw randwrite 4k 1 mem "${UCS[@]}"
job 1Mr randread 1M 8 mem nbdkit-luks qsd-luks "${UCS[@]}"
job 1Mw randwrite 1M 8 mem nbdkit-luks qsd-luks "${UCS[@]}"

# ---- report -----------------------------------------------------------------
echo
echo "fio nbd engine, ${SIZE_MB} MiB export on tmpfs, ${RUNTIME}s per run, median of ${ROUNDS} round-robin"
echo "rounds, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); ucrypt opened as $HOW"
echo
echo "| job | peer | peer IOPS | ucrypt inline | ucrypt adaptive | ucrypt classic |"
echo "|---|---|---:|---:|---:|---:|"
row() { # KEY PEER LABEL
  local k=$1 p=$2 base=${R[$2,$1]} cells=""
  for m in inline adaptive classic; do
    local u=${R[ucrypt-$m,$k]}
    cells+=" $(python3 -c "print('%s (%.2fx)' % ($u, $u / max($base, 1)))") |"
  done
  echo "| $3 | $p | $base |$cells"
}
row 4kr mem "4k randread QD1"
row 4kw mem "4k randwrite QD1"
for p in mem nbdkit-luks qsd-luks; do
  row 1Mr $p "1M randread QD8"
  row 1Mw $p "1M randwrite QD8"
done
# The bound io*c/(io+c): io = nbdkit memory at 1M QD8 (the transport), c =
# one core's AES-256-XTS by OpenSSL (the 512-bit key of aes-xts-plain64).
C_MBPS=$(openssl speed -evp aes-256-xts -bytes 65536 -seconds 2 2>/dev/null \
  | awk '/^AES-256-XTS/ {sub("k", "", $2); print $2 / 1000}')
echo
echo "Bound at 1M QD8 (c = $C_MBPS MB/s, openssl speed -evp aes-256-xts, 64 KiB, one core):"
echo "| job | nbdkit memory MB/s | bound MB/s | inline | adaptive | classic |"
echo "|---|---:|---:|---:|---:|---:|"
for k in 1Mr 1Mw; do
  python3 -c "
io = ${R[mem,$k]} * 1.048576; c = $C_MBPS; b = io * c / (io + c)
u = [x * 1.048576 / b for x in (${R[ucrypt-inline,$k]}, ${R[ucrypt-adaptive,$k]}, ${R[ucrypt-classic,$k]})]
print('| %s | %.0f | %.0f | %.2f | %.2f | %.2f |' % ('$k', io, b, *u))"
done
if [ -n "$BASE" ]; then
  echo
  echo "A/B in the same rounds: adaptive from this tree vs adaptive from $BASE"
  echo "| job | base IOPS | new IOPS | new/base |"
  echo "|---|---:|---:|---:|"
  for k in 4kr 4kw 1Mr 1Mw; do
    b=${R[ucrypt-base,$k]} n=${R[ucrypt-adaptive,$k]}
    echo "| $k | $b | $n | $(python3 -c "print('%.2f' % ($n / max($b, 1)))") |"
  done
fi
echo
echo "Goals: >= 0.95x of nbdkit memory at 4k QD1; >= 4x of nbdkit-luks and qsd-luks at 1M QD8."
echo "The 1M QD8 rows against nbdkit memory (no encryption at all) give the transport's"
echo "ceiling on this machine: no encrypted export can pass it, whatever its crypto."
