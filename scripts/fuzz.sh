#!/usr/bin/env bash
# Runs every cargo-fuzz target for a short time on its seed corpus:
# fuzz/seeds/<target>/ (NBD sessions, dm table lines, cipher specs), or the
# real cryptsetup headers in tests/data/luks for luks_header. Needs a nightly
# toolchain; installs cargo-fuzz from crates.io if missing. Prints SKIP
# (exit 0) without nightly.
#   FUZZ_SECONDS=60 bash scripts/fuzz.sh            # every target
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh dm_table  # just these
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECONDS:-60}"
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "SKIP fuzz: no nightly toolchain (rustup toolchain install nightly)"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# Build cost, not fuzzing power: every dependency is rebuilt with nightly and
# the sanitizer, so the fuzz build links the system OpenSSL instead of
# compiling the vendored copy the product uses for its AVX-512 XTS (the
# targets parse headers and never measure speed), and lets LLVM split each
# crate over 16 codegen units instead of cargo-fuzz's default of one.
export OPENSSL_NO_VENDOR=1
build_opts=(--fuzz-dir fuzz --codegen-units 16)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
  cargo +nightly fuzz build "${build_opts[@]}" # all at once (one cargo run)
fi
# One target per CPU at a time (each libFuzzer run is single-threaded),
# each run's output printed whole when it ends; the first failure ends
# the script with its status once the runs in progress have ended.
fuzz_one() {
  local target=$1 seeds=fuzz/seeds/$1
  [ "$target" = luks_header ] && seeds=tests/data/luks
  [ -d "$seeds" ] || { echo "fuzz: no seed corpus $seeds for $target" >&2; return 1; }
  mkdir -p "$work/$target"
  # New inputs go to the temp corpus (first dir); the seeds stay read-only.
  echo "fuzz: $target for ${secs}s"
  cargo +nightly fuzz run "${build_opts[@]}" "$target" "$work/$target" "$seeds" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536
}
slots=$(nproc 2>/dev/null || echo 1)
declare -A running=()
failed=0
reap() {
  local pid rc=0
  wait -n -p pid "${!running[@]}" || rc=$?
  cat "$work/${running[$pid]}.log"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: ${running[$pid]} failed (exit $rc)" >&2
    [ "$failed" -ne 0 ] || failed=$rc
  fi
  unset "running[$pid]"
}
for target in "${targets[@]}"; do
  [ "$failed" -eq 0 ] || break
  while [ "${#running[@]}" -ge "$slots" ]; do reap; done
  fuzz_one "$target" >"$work/$target.log" 2>&1 &
  running[$!]=$target
done
while [ "${#running[@]}" -gt 0 ]; do reap; done
[ "$failed" -eq 0 ] || exit "$failed"
echo "fuzz: all targets ran without a crash"
