#!/usr/bin/env bash
# The main job: build ucrypt and run the seeds' experiment on the built-in
# in-memory ramdisk (`ucrypt bench`). The experiment itself needs no root;
# only a missing build dependency is installed with apt. Extra arguments go
# to `ucrypt bench` (e.g. --quick, --full, --via fio, --peers), which runs the
# ucrypt-bench binary built beside ucrypt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-build-deps.sh
cargo build --release --locked -p ucrypt-cli --bins
exec ./target/release/ucrypt bench "$@"
