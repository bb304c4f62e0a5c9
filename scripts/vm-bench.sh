#!/usr/bin/env bash
# The seeds' experiment with both engines in one guest, for real: boots the
# guest test bench (scripts/vm-test.sh) with only its `seeds` part, at a
# bench size, and prints the table: brd raw in MiB/s, then kernel dm-crypt
# (default, no_read_workqueue, no_write_workqueue, both) and ucrypt over ublk
# (classic, inline, adaptive) as ratios to raw, for 4k QD1, 4k QD32 and
# 1M QD8, read and write.
#
#   bash scripts/vm-bench.sh                    # 512 MiB ramdisk, 5 s per cell
#   bash scripts/vm-bench.sh --size 1024 --seconds 10 --cpus 8
#
# Needs /dev/kvm for figures that mean anything: under TCG the guest's CPU
# is emulated and the ratios describe nothing physical (the table says which
# accelerator ran it; --allow-tcg runs anyway, e.g. to try the command).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=512 SECS=5 CPUS=$(( $(nproc) < 4 ? $(nproc) : 4 )) ALLOW_TCG=0
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE="$2"; shift 2 ;;
    --seconds) SECS="$2"; shift 2 ;;
    --cpus) CPUS="$2"; shift 2 ;;
    --allow-tcg) ALLOW_TCG=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "vm-bench: unknown argument $1" >&2; usage 2 >&2 ;;
  esac
done
[[ "$SIZE" =~ ^[0-9]+$ ]] && [ "$SIZE" -ge 16 ] || { echo "vm-bench: --size is MiB, at least 16" >&2; exit 2; }
[[ "$SECS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "vm-bench: --seconds is a number" >&2; exit 2; }
if [ "$ALLOW_TCG" = 0 ] && ! { [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; }; then
  echo "vm-bench: no usable /dev/kvm: under TCG the figures describe nothing physical." >&2
  echo "vm-bench: run it on a host with KVM, or pass --allow-tcg to run it anyway." >&2
  exit 4
fi
# The ramdisk lives in guest RAM next to the initramfs (~0.5 GiB unpacked).
MEM=$(( SIZE + 1536 ))
# Each cell runs 12 jobs × 8 rows; allow for boot and setup besides.
TIMEOUT=$(awk -v s="$SECS" -v m="$SIZE" 'BEGIN { printf "%d", 600 + 48 * (s + 2) + m / 10 }')
rc=0
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
UCRYPT_VM_PARTS=seeds UCRYPT_VM_SEEDS="$SIZE:$SECS" UCRYPT_VM_CPUS="$CPUS" UCRYPT_VM_MEM="$MEM" \
  UCRYPT_VM_TIMEOUT="${UCRYPT_VM_TIMEOUT:-$TIMEOUT}" bash scripts/vm-test.sh >"$OUT" 2>&1 || rc=$?
LOG="${UCRYPT_VM_CACHE:-target/vm-cache}/run/console.log"
echo "ucrypt vm-bench: the seeds' experiment in a Linux guest ($CPUS vCPUs, $SIZE MiB brd, $SECS s per cell)"
grep -a '^@@VMTEST INFO booted' "$LOG" 2>/dev/null | sed 's/^@@VMTEST INFO /guest: /' || true
grep -a '^@@VMTEST INFO seeds | ' "$LOG" 2>/dev/null | sed 's/^@@VMTEST INFO seeds | //' || true
if [ "$rc" -ne 0 ]; then
  echo "vm-bench: the guest run failed (exit $rc); rows it could not measure show '-'." >&2
  grep -a '^@@VMTEST FAIL' "$LOG" 2>/dev/null | sed 's/^@@VMTEST /  /' >&2 || true
  tail -n 8 "$OUT" | sed 's/^/  vm-test: /' >&2
  echo "vm-bench: console: $LOG" >&2
fi
exit "$rc"
