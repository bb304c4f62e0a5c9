#!/usr/bin/env bash
# Long fuzz runs on a dev machine (not CI): runs TARGET niced, one worker,
# in checkpoints of SECS seconds until TOTAL executions are reached, and
# appends each checkpoint's final libFuzzer line ("#N DONE ... exec/s")
# to fuzz/LONG-RUNS.log, so a run cut short still counts what it did.
# New inputs go to fuzz/corpus/TARGET (kept between checkpoints, not in
# git); the seeds stay read-only. Stops at the first crash (libFuzzer
# writes it to fuzz/artifacts/TARGET/).
#   bash fuzz/long-run.sh luks_header 10000000 [SECS=900]
# Extra libFuzzer flags come from FUZZ_FLAGS (e.g. FUZZ_FLAGS=-detect_leaks=0:
# LeakSanitizer's stop-the-world check halves the NBD targets' rate on a loaded
# machine; ASan and panics are still caught). They are logged with each line.
set -euo pipefail
cd "$(dirname "$0")"
target=$1 total=$2 secs=${3:-900}
seeds=seeds/$target
[ "$target" = luks_header ] && seeds=../tests/data/luks
mkdir -p "corpus/$target"
log=LONG-RUNS.log
done_so_far=0
while [ "$done_so_far" -lt "$total" ]; do
  left=$((total - done_so_far))
  out=$(mktemp)
  rc=0
  nice -n 19 cargo +nightly fuzz run "$target" "corpus/$target" "$seeds" -- \
    -runs="$left" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 ${FUZZ_FLAGS:-} >"$out" 2>&1 || rc=$?
  line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$out" | tail -1 || true)
  n=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$line")
  echo "$(date -u +%FT%TZ) $target rc=$rc${FUZZ_FLAGS:+ [$FUZZ_FLAGS]} ${line:-no DONE line}" >>"$log"
  if [ "$rc" -ne 0 ] || [ -z "$n" ]; then
    tail -40 "$out" >&2
    echo "long-run: $target stopped (rc=$rc); output kept in $out" >&2
    exit 1
  fi
  rm -f "$out"
  done_so_far=$((done_so_far + n))
  echo "long-run: $target $done_so_far / $total" >&2
done
