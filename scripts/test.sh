#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine with the toolchains:
# installs the reference tools, then runs every test with tools required
# (a missing tool is a failure here, not a skip).
#
# Every test that skips (testutil::require / skip / skip_kernel) appends
# `test<TAB>reason<TAB>kind` to $UCRYPT_SKIP_LOG; cargo hides the stderr of
# passing tests, so this script prints that list at the end, also when a
# step fails (the exit status is kept). With UCRYPT_REQUIRE_TOOLS=1 only
# `kernel` skips (things this kernel cannot do, e.g. no ublk_drv) may appear.
set -euo pipefail
cd "$(dirname "$0")/.."

UCRYPT_SKIP_LOG="$(mktemp "${TMPDIR:-/tmp}/ucrypt-skips.XXXXXX")"
export UCRYPT_SKIP_LOG
fuzz_out="$(mktemp "${TMPDIR:-/tmp}/ucrypt-fuzz.XXXXXX")"

# Wall time of each step, printed at the end (where CI's time goes).
STEPS=()
step_name=
step_t0=$SECONDS
step() {
  [ -z "$step_name" ] || STEPS+=("$step_name=$((SECONDS - step_t0))")
  step_name=$1
  step_t0=$SECONDS
}

report_skips() {
  local rc=$?
  set +e
  step ""
  # scripts/fuzz.sh prints `SKIP fuzz: <why>` and exits 0 without nightly.
  sed -n 's/^SKIP fuzz: \(.*\)$/scripts\/fuzz.sh\t\1\tprerequisite/p' "$fuzz_out" >>"$UCRYPT_SKIP_LOG"
  local n
  n=$(grep -c . "$UCRYPT_SKIP_LOG")
  echo
  echo "== skipped tests: $n =="
  if [ "$n" -gt 0 ]; then
    sort "$UCRYPT_SKIP_LOG" | awk -F'\t' '{ printf "  %-12s %s: %s\n", $3, $1, $2 }'
    local other
    other=$(awk -F'\t' '$3 != "kernel"' "$UCRYPT_SKIP_LOG" | grep -c .)
    if [ "${UCRYPT_REQUIRE_TOOLS:-}" = 1 ] && [ "$other" -gt 0 ]; then
      echo "  ($other skip(s) above are not kernel limits although UCRYPT_REQUIRE_TOOLS=1)"
    fi
  fi
  rm -f "$UCRYPT_SKIP_LOG" "$fuzz_out"
  # What each misuse row did (crates/cli/tests/cli/misuse.rs writes it).
  local misuse=target/tmp/misuse-report.txt
  if [ -f "$misuse" ]; then
    echo
    echo "== misuse matrix: $(grep -c "^\(ok\|FAIL\|skip\)" "$misuse") rows =="
    cat "$misuse"
  fi
  echo
  echo "== wall time per step (s): ${STEPS[*]}, total ${SECONDS} =="
  stop_ceph
  exit "$rc"
}

# One throwaway Ceph cluster for every RBD test binary (each makes its own
# pool on it; see crates/testutil/src/ceph.rs), started while the fuzz step
# runs and stopped after the cargo tests, or at exit whatever happened.
ceph_dir="$(mktemp -d "${TMPDIR:-/tmp}/ucrypt-ceph.XXXXXX")"
ceph_pid=
stop_ceph() {
  [ -n "$ceph_dir" ] || return 0
  [ -z "$ceph_pid" ] || wait "$ceph_pid" 2>/dev/null
  bash scripts/ceph-test-cluster.sh stop "$ceph_dir/ceph" >/dev/null 2>&1 || true
  rm -rf "$ceph_dir"
  ceph_dir=
  unset UCRYPT_CEPH_CONF
}
trap report_skips EXIT
rm -f target/tmp/misuse-report.txt # this run's report only

step install-deps
bash scripts/install-test-deps.sh
export UCRYPT_REQUIRE_TOOLS=1
# No crate may grow a module cycle (docs/ARCHITECTURE.md, "Layout").
python3 scripts/module-cycles.py
step build
cargo build --release --workspace --locked
bash scripts/ceph-test-cluster.sh start "$ceph_dir/ceph" >"$ceph_dir/conf" 2>"$ceph_dir/start.log" &
ceph_pid=$!
# cargo-fuzz over every parser (13 targets), briefly, on its seed corpus
# (real cryptsetup headers, NBD sessions, ...): a check that each harness
# builds and its seeds and first mutations pass; long campaigns are run
# apart (FUZZ_SECONDS=600 bash scripts/fuzz.sh TARGET). SKIP line if this
# machine has no nightly toolchain.
step fuzz
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" bash scripts/fuzz.sh 2>&1 | tee "$fuzz_out"
if wait "$ceph_pid"; then
  UCRYPT_CEPH_CONF="$(cat "$ceph_dir/conf")"
  export UCRYPT_CEPH_CONF
else
  # Each RBD test binary then starts its own (and reports its own failure).
  echo "test.sh: no shared Ceph test cluster:" >&2
  cat "$ceph_dir/start.log" >&2
fi
ceph_pid=
step cargo-test
# Most of the cli binary's tests wait on child processes (ucrypt daemons,
# cryptsetup, fio, qemu tools): with two threads on two cores it used about
# one core. Four threads keep both busy; the whole binary passed that way
# with two other builds running beside it. RUST_TEST_THREADS set by the
# caller wins.
RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}" \
  cargo test --release --workspace --locked --no-fail-fast
stop_ceph
step guest
bash scripts/vm-test.sh
