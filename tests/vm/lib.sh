#!/bin/sh
# Helpers shared by the guest suite's parts. Each check prints one line,
# `@@VMTEST PASS name` or `@@VMTEST FAIL name: why` (with the command's last
# output lines before it), which the host counts.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export DM_DISABLE_UDEV=1
export UCRYPT_RUNTIME_DIR=/run/ucrypt
LOGDIR=/tmp/vmlog
mkdir -p "$LOGDIR"

now() { cut -d' ' -f1 /proc/uptime; }
info() { echo "@@VMTEST INFO $*"; }
# Each result line ends with the guest uptime, to show where the time goes.
pass() { echo "@@VMTEST PASS $1 [t=$(now)s]"; }
fail() {
  echo "@@VMTEST FAIL $1: $2 [t=$(now)s]"
}

# check NAME CMD...: runs CMD (bounded by $CHECK_TIMEOUT seconds, default 300);
# passes when it exits 0.
check() {
  _name="$1"; shift
  _log="$LOGDIR/last.log"
  timeout "${CHECK_TIMEOUT:-300}" "$@" >"$_log" 2>&1
  _rc=$?
  if [ "$_rc" -eq 0 ]; then pass "$_name"; return 0; fi
  tail -n 15 "$_log" | sed 's/^/    | /'
  if [ "$_rc" -eq 143 ]; then fail "$_name" "timed out after ${CHECK_TIMEOUT:-300}s: $*"
  else fail "$_name" "exit $_rc: $*"; fi
  return 1
}

# expect_fail NAME CMD...: passes when CMD exits non-zero (within the timeout).
expect_fail() {
  _name="$1"; shift
  _log="$LOGDIR/last.log"
  timeout "${CHECK_TIMEOUT:-300}" "$@" >"$_log" 2>&1
  _rc=$?
  if [ "$_rc" -eq 0 ]; then
    tail -n 15 "$_log" | sed 's/^/    | /'
    fail "$_name" "succeeded but should have failed: $*"; return 1
  fi
  if [ "$_rc" -eq 143 ]; then fail "$_name" "timed out after ${CHECK_TIMEOUT:-300}s: $*"; return 1; fi
  sed 's/^/    > /' "$_log" | tail -n 3
  pass "$_name"
}

# fcheck NAME FUNC ARGS...: check for a part's shell functions (check
# runs its command under timeout(1), which cannot see them).
fcheck() {
  f_name=$1; shift
  if "$@" >"$LOGDIR/fcheck.log" 2>&1; then pass "$f_name"; return 0; fi
  tail -n 15 "$LOGDIR/fcheck.log" | sed 's/^/    | /'
  fail "$f_name" "failed: $*"; return 1
}
# fexpect_fail NAME FUNC ARGS...: passes when the function fails.
fexpect_fail() {
  f_name=$1; shift
  if "$@" >"$LOGDIR/fcheck.log" 2>&1; then fail "$f_name" "succeeded but should have failed: $*"; return 1; fi
  pass "$f_name"
}

# run CMD...: a setup step; its failure is reported by the caller's next check.
run() { "$@" >>"$LOGDIR/setup.log" 2>&1; }

# The passphrase every volume uses, and fast KDF settings (TCG is slow).
KEY=/tmp/key
printf 'vm-test passphrase' > "$KEY"
FAST_KDF="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"

# Deterministic pattern data: pattern FILE SIZE_MIB SEED
pattern() {
  dd if=/dev/urandom of="$1" bs=1M count="$2" 2>/dev/null
}
