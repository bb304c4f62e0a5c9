//! Helpers shared by ucrypt's test suites (dev-dependency only).
//!
//! - [`mod@skip`]: the one way a test skips. [`require`] checks a [`Capability`]
//!   (a tool, `/dev/fuse`, loop devices, root, io_uring, ublk_drv); a
//!   missing prerequisite is a SKIP, or a failure when
//!   `UCRYPT_REQUIRE_TOOLS=1` (as CI sets), so a missing install never turns
//!   into a silent pass. Things this kernel cannot do skip as
//!   [`SkipKind::Kernel`] even in CI. Every skip is appended to
//!   `UCRYPT_SKIP_LOG`, which `scripts/test.sh` prints at the end.
//! - [`rng`]: a seeded [`Rng`] from the rand project, so failures reproduce.
//! - [`ceph::Cluster`]: the RBD tests' throwaway Ceph cluster.
//! - [`TempDir`], [`LoopDevice`], [`which`], [`ucrypt_bin`], and [`run`] for a program
//!   (the `ucrypt` under test or a reference tool) with given stdin.
//! - [`cryptsetup_suite`]: cryptsetup 2.6.1's own test directory (GPL,
//!   fetched at test time, never stored here).
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

pub mod ceph;
pub mod rng;
pub mod skip;

pub use rand;
pub use rng::{random_bytes, Rng};
pub use skip::{
    is_root, require, require_all, skip, skip_as, skip_kernel, tools_required, Capability, SkipKind,
};

/// Returns true if `tool` is on PATH; otherwise skips (see [`require`]).
pub fn require_tool(test: &str, tool: &str) -> bool {
    require(test, Capability::Tool(tool))
}

/// Returns true if `python3 -c "import <module>"` works (e.g. `cryptography`);
/// otherwise skips (see [`require`]).
pub fn require_python_module(test: &str, module: &str) -> bool {
    require(test, Capability::PythonModule(module))
}

/// Reports a missing prerequisite: SKIP (false) or panic when required.
/// The same as [`skip()`].
pub fn skip_or_fail(test: &str, why: &str) -> bool {
    skip(test, why)
}

/// Full path of `tool` on PATH (also looks in /usr/sbin and /sbin).
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// cryptsetup 2.6.1's `tests/` directory (its validation suite, image
/// suites and scripts; GPL), fetched into `cache` by
/// `scripts/fetch-cryptsetup-tests.sh` (once: later calls find it there),
/// or `None` after a skip that says why it could not be fetched.
pub fn cryptsetup_suite(test: &str, cache: &Path) -> Option<PathBuf> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-cryptsetup-tests.sh");
    let fetch = Command::new("bash")
        .arg(script)
        .arg(cache)
        .output()
        .expect("bash runs");
    if !fetch.status.success() {
        skip(
            test,
            &format!(
                "cannot fetch cryptsetup's test suite: {}",
                String::from_utf8_lossy(&fetch.stderr).trim()
            ),
        );
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&fetch.stdout).trim()))
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/ucrypt-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Self {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// Creates `<base>/ucrypt-<tag>-<pid>-<n>` (e.g. on /dev/shm, for a
    /// tmpfs; check [`Capability::ShmTmpfs`] first).
    pub fn new_in(base: &Path, tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = base.join(format!("ucrypt-{tag}-{}-{n}", std::process::id()));
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

/// `luksFormat` arguments, the same for ucrypt and cryptsetup, for a
/// LUKS2 test volume made in milliseconds (pbkdf2 at 1000 iterations);
/// append `--key-file KEY DEVICE`.
pub const FAST_LUKS2_FORMAT: &[&str] = &[
    "luksFormat",
    "-q",
    "--type",
    "luks2",
    "--pbkdf",
    "pbkdf2",
    "--pbkdf-force-iterations",
    "1000",
];

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

/// Runs `prog` with `args` and waits for it, capturing stdout and stderr.
/// `prog` `ucrypt` means the binary under test ([`ucrypt_bin`]); anything
/// else is looked up on PATH. `stdin` is written to the program's standard
/// input (from a second thread, so a program that prints before reading
/// cannot deadlock), which is then closed; `None` gives an empty stdin.
///
/// Panics if the program cannot be started.
pub fn run(prog: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let bin = if prog == "ucrypt" {
        ucrypt_bin()
    } else {
        PathBuf::from(prog)
    };
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    let mut input = child.stdin.take().expect("piped stdin");
    std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(b) = stdin {
                // A program that exits without reading closes the pipe:
                // its exit status tells, not this write.
                let _ = input.write_all(b);
            }
        });
        child.wait_with_output().expect("wait for child")
    })
}

/// [`run`] with an empty stdin, asserting the program succeeded: its
/// stdout. A failure panics with the program, its arguments and its output.
pub fn run_ok(prog: &str, args: &[&str]) -> String {
    let o = run(prog, args, None);
    assert!(
        o.status.success(),
        "{prog} {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 stdout")
}

/// Runs a prepared command, asserting it succeeded: its output. A failure
/// panics with the command and its stdout and stderr.
pub fn run_cmd(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` if it
/// still does not after `bound`. For waits on other processes (a daemon
/// stopping, a device going away), whose speed a loaded or cold machine
/// can stretch far past the usual: give `bound` ample room.
pub fn wait_until(bound: std::time::Duration, what: &str, cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + bound;
    while !cond() {
        assert!(
            std::time::Instant::now() < end,
            "timed out after {bound:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A loop device attached to a file, detached when dropped.
pub struct LoopDevice(String);

impl LoopDevice {
    /// Attaches `file` (`losetup --find --show`, with `extra` options
    /// such as `--read-only`); `None`, a logged skip, when losetup cannot
    /// attach here (check [`Capability::LoopDevices`] and root first).
    pub fn attach(test: &str, file: &Path, extra: &[&str]) -> Option<Self> {
        let out = Command::new("losetup")
            .args(extra)
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .expect("run losetup");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            skip(test, &format!("losetup cannot attach here: {}", why.trim()));
            return None;
        }
        Some(Self(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }

    /// The device's path, `/dev/loopN`.
    pub fn path(&self) -> &str {
        &self.0
    }
}

impl Drop for LoopDevice {
    /// Detaches, and waits (up to 60 s) until the kernel has let go of the
    /// file: while another opener (udev probing after mkfs or umount) still
    /// has the device open, `losetup -d` only marks it for release.
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
        let name = self.0.trim_start_matches("/dev/");
        let backing = Path::new("/sys/block").join(name).join("loop/backing_file");
        let start = std::time::Instant::now();
        while backing.exists() && start.elapsed() < std::time::Duration::from_secs(60) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The volume key in the text of `cryptsetup luksDump --dump-volume-key`
/// (its `MK dump:` lines, hex); empty when there is none.
pub fn volume_key_from_dump(text: &str) -> Vec<u8> {
    let mut hex = String::new();
    let mut on = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("MK dump:") {
            on = true;
            hex.push_str(rest);
        } else if on && line.starts_with('\t') && !line.contains(':') {
            hex.push_str(line);
        } else if on {
            break;
        }
    }
    let hex: String = hex.split_whitespace().collect();
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex in MK dump"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_feeds_stdin_and_captures_both_outputs() {
        let o = run("sh", &["-c", "cat; echo err >&2; exit 3"], Some(b"hello\n"));
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout, b"hello\n");
        assert_eq!(o.stderr, b"err\n");
        let o = run("sh", &["-c", "cat"], None);
        assert!(o.status.success() && o.stdout.is_empty());
    }
}
