#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine with the toolchains:
# installs the reference tools, then runs every test with tools required
# (a missing tool is a failure here, not a skip).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
export UCRYPT_REQUIRE_TOOLS=1
cargo build --release --workspace --locked
# cargo-fuzz over the LUKS header parsers, briefly, on the seed corpus of real
# cryptsetup headers (SKIP line if this machine has no nightly toolchain).
FUZZ_SECONDS="${FUZZ_SECONDS:-30}" bash scripts/fuzz.sh
cargo test --release --workspace --locked --no-fail-fast
bash scripts/vm-test.sh
