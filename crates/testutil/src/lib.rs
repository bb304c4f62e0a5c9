//! Helpers shared by ucrypt's test suites (dev-dependency only).
//!
//! Interop tests need external programs (cryptsetup, fio, nbdkit, qemu-img,
//! python3 with `cryptography`). [`require_tool`] decides what happens when
//! one is missing: the test prints a clear `SKIP` line and returns, unless
//! `UCRYPT_REQUIRE_TOOLS=1` is set (as CI does), in which case it fails, so a
//! missing install never turns into a silent pass.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// True when `UCRYPT_REQUIRE_TOOLS=1`: missing tools are failures.
pub fn tools_required() -> bool {
    std::env::var("UCRYPT_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Returns true if `tool` is on PATH. Otherwise prints a SKIP message naming
/// the test and returns false, or panics when tools are required.
pub fn require_tool(test: &str, tool: &str) -> bool {
    if which(tool).is_some() {
        return true;
    }
    skip_or_fail(test, &format!("`{tool}` not found on PATH"))
}

/// Returns true if `python3 -c "import <module>"` works (e.g. `cryptography`).
pub fn require_python_module(test: &str, module: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return true;
    }
    skip_or_fail(test, &format!("python3 module `{module}` not importable"))
}

/// Reports a missing prerequisite: SKIP (false) or panic when required.
pub fn skip_or_fail(test: &str, why: &str) -> bool {
    if tools_required() {
        panic!("{test}: {why} and UCRYPT_REQUIRE_TOOLS=1 (run scripts/test.sh to install it)");
    }
    eprintln!("SKIP {test}: {why} (run scripts/test.sh to install test tools)");
    false
}

/// Full path of `tool` on PATH (also looks in /usr/sbin and /sbin).
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/ucrypt-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("ucrypt-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Path of the built `ucrypt` binary for CLI tests: `CARGO_BIN_EXE_ucrypt`
/// inside the cli crate, else `target/<profile>/ucrypt` next to the test exe.
pub fn ucrypt_bin() -> PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_ucrypt") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>/ucrypt
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join("ucrypt")
}
