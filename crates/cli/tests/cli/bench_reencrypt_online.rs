//! `scripts/bench-reencrypt-online.sh` end to end on a small image (one
//! round, 1 s cells, one read and one write cell): it serves the image,
//! measures each cell idle, during an unthrottled and a rate-limited
//! online reencryption, and checks the plaintext at the end. The figures
//! are not looked at (the machine is not idle); the run must succeed and
//! print its storage header, a row per cell and the check's verdict. Run
//! again with write cells writing another pattern than the one the volume
//! holds, the same check must fail the script: a result it cannot tell
//! from a right one would not be checked.

use std::path::Path;
use std::process::{Command, Output};

use testutil::{Capability, TempDir};

const CELLS: &str = "randread:4k:1 randwrite:1M:8";

/// Runs the script on a 48 MiB image in a tmpfs directory of its own.
fn run(extra: &[(&str, &str)]) -> Output {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = TempDir::new_in(Path::new("/dev/shm"), "bench-reenc-online");
    let out = Command::new("bash")
        .arg(repo.join("scripts/bench-reencrypt-online.sh"))
        .env("UCRYPT", testutil::ucrypt_bin())
        .env("DIR", dir.path())
        .env("SIZE", "48")
        .env("RUNTIME", "1")
        .env("ROUNDS", "1")
        .env("CELLS", CELLS)
        .envs(extra.iter().copied())
        .output()
        .expect("run bench-reencrypt-online.sh");
    // The script removes its work directory whatever happened.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        dir.path().display()
    );
    out
}

fn ready(test: &str) -> bool {
    testutil::require_all(
        test,
        &[
            Capability::Tool("cryptsetup"),
            Capability::Tool("fio"),
            Capability::Tool("python3"),
            Capability::ShmTmpfs,
        ],
    )
}

#[test]
fn bench_reencrypt_online_runs_and_checks_the_plaintext() {
    if !ready("bench_reencrypt_online_runs_and_checks_the_plaintext") {
        return;
    }
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("in ") && stdout.contains("(tmpfs, ucrypt's backing file "),
        "no storage header: {stdout}"
    );
    assert!(
        stdout.contains("plaintext through ucrypt unchanged"),
        "{stdout}"
    );
    // A per-round row and a median row for each cell, every figure a
    // number.
    for cell in ["randread-4k-QD1", "randwrite-1M-QD8"] {
        let rows: Vec<&str> = stdout.lines().filter(|l| l.contains(cell)).collect();
        assert_eq!(rows.len(), 2, "{cell}: {stdout}");
        let round: Vec<&str> = rows[0].split_whitespace().collect();
        assert_eq!(round.len(), 10, "{}", rows[0]);
        for v in &round[2..] {
            v.parse::<f64>()
                .unwrap_or_else(|_| panic!("{cell}: {v:?} in {}", rows[0]));
        }
    }
}

#[test]
fn bench_reencrypt_online_fails_when_the_plaintext_changed() {
    if !ready("bench_reencrypt_online_fails_when_the_plaintext_changed") {
        return;
    }
    let out = run(&[("WRITE_PATTERN", "0x01020304")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("the plaintext changed: sha256 "),
        "{stdout}{stderr}"
    );
    assert!(
        !stdout.contains("plaintext through ucrypt unchanged"),
        "{stdout}"
    );
}
