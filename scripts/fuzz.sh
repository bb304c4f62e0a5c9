#!/usr/bin/env bash
# Runs every cargo-fuzz target for a short time on the seed corpus of real
# cryptsetup headers (tests/data/luks). Needs a nightly toolchain; installs
# cargo-fuzz from crates.io if missing. Prints SKIP (exit 0) without nightly.
#   FUZZ_SECONDS=60 bash scripts/fuzz.sh       # per target
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
for target in $(cargo +nightly fuzz list --fuzz-dir fuzz); do
  mkdir -p "$work/$target"
  # New inputs go to the temp corpus (first dir); the seeds stay read-only.
  echo "fuzz: $target for ${secs}s"
  cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$work/$target" tests/data/luks -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536
done
echo "fuzz: all targets ran without a crash"
