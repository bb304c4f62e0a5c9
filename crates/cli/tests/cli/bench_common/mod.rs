//! What the `ucrypt bench` tests share: run one bench command that writes
//! its results into a folder, require that it succeeded, and hand back the
//! printed table and the parsed `results.json`.

use std::path::Path;
use std::process::Command;

/// Runs `cmd` (a `ucrypt bench … --out OUT_DIR` command) and asserts it
/// succeeded (its stdout and stderr in the message otherwise); returns its
/// stdout and `OUT_DIR/results.json`.
pub fn run(cmd: &mut Command, out_dir: &Path) -> (String, serde_json::Value) {
    let (stdout, _, v) = run_with_stderr(cmd, out_dir);
    (stdout, v)
}

/// [`run`], also returning what the bench printed on stderr.
pub fn run_with_stderr(cmd: &mut Command, out_dir: &Path) -> (String, String, serde_json::Value) {
    let out = cmd.output().expect("run ucrypt bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let json = std::fs::read_to_string(out_dir.join("results.json")).expect("results.json");
    let v = serde_json::from_str(&json).expect("results.json parses");
    (stdout, stderr, v)
}

/// Runs `cmd` (a `ucrypt bench …` that must refuse to start) and asserts
/// it failed before printing anything; returns its stderr.
#[allow(dead_code)] // not every bench test binary checks a refusal
pub fn refused(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run ucrypt bench");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "must fail: {stderr}");
    assert!(out.stdout.is_empty(), "fails before measuring anything");
    stderr
}
