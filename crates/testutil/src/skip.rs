//! One way to skip a test, and a record of every skip.
//!
//! A test that needs something from the machine asks [`require`] (or
//! [`require_all`]) for a [`Capability`] and returns when it gets `false`.
//! A test that finds some other reason not to run calls [`skip`] or
//! [`skip_kernel`]. Nothing else in the tests prints `SKIP` or returns
//! early on a missing prerequisite.
//!
//! Two kinds of skip ([`SkipKind`]):
//!
//! - [`SkipKind::Prerequisite`]: a tool, device or privilege the CI machine
//!   provides (`scripts/install-test-deps.sh` installs the tools). With
//!   `UCRYPT_REQUIRE_TOOLS=1` (as `scripts/test.sh` and CI set) this is a
//!   failure, so a missing install never turns into a silent pass.
//! - [`SkipKind::Kernel`]: something this kernel cannot do (no ublk_drv,
//!   io_uring disabled) or the opposite condition a negative test needs. No
//!   install step can change it, so it skips even in CI.
//!
//! Either way the skip prints a `SKIP` line and, when `UCRYPT_SKIP_LOG` names
//! a file, appends one line `test<TAB>reason<TAB>kind` to it (cargo hides the
//! stderr of passing tests; `scripts/test.sh` prints the file at the end).

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Environment variable naming the file every skip is appended to.
pub const SKIP_LOG_ENV: &str = "UCRYPT_SKIP_LOG";

/// Environment variable that turns prerequisite skips into failures.
pub const REQUIRE_ENV: &str = "UCRYPT_REQUIRE_TOOLS";

/// True when `UCRYPT_REQUIRE_TOOLS=1`: missing prerequisites are failures.
pub fn tools_required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// Why a test did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipKind {
    /// Something CI provides is missing here; a failure when tools are required.
    Prerequisite,
    /// This kernel cannot do it (or the test needs it absent); always a skip.
    Kernel,
}

impl SkipKind {
    /// The word written in the skip log's third column.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipKind::Prerequisite => "prerequisite",
            SkipKind::Kernel => "kernel",
        }
    }
}

/// Something a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capability<'a> {
    /// A program on PATH (or in /usr/sbin, /sbin).
    Tool(&'a str),
    /// `python3 -c "import <module>"` works.
    PythonModule(&'a str),
    /// `/dev/fuse` exists (FUSE mounts).
    DevFuse,
    /// `/dev/loop-control` exists (loop devices can be attached).
    LoopDevices,
    /// The effective user is root (losetup, mount).
    Root,
    /// This kernel lets us set up an io_uring (kernel kind).
    IoUring,
    /// ublk_drv is loaded: `/dev/ublk-control` exists (kernel kind).
    UblkDriver,
    /// `/dev/shm` is a tmpfs mount (files there can be lent by mapping).
    ShmTmpfs,
}

impl Capability<'_> {
    /// Whether a missing capability is a prerequisite or a kernel limit.
    pub fn kind(&self) -> SkipKind {
        match self {
            Capability::IoUring | Capability::UblkDriver => SkipKind::Kernel,
            _ => SkipKind::Prerequisite,
        }
    }

    /// `None` when present here, else why not.
    pub fn missing(&self) -> Option<String> {
        let absent = |p: &str, what: &str| (!Path::new(p).exists()).then(|| format!("{p} {what}"));
        match *self {
            Capability::Tool(t) => crate::which(t)
                .is_none()
                .then(|| format!("`{t}` not found on PATH")),
            Capability::PythonModule(m) => {
                let ok = Command::new("python3")
                    .args(["-c", &format!("import {m}")])
                    .output()
                    .is_ok_and(|o| o.status.success());
                (!ok).then(|| format!("python3 module `{m}` not importable"))
            }
            Capability::DevFuse => absent("/dev/fuse", "is missing"),
            Capability::LoopDevices => absent("/dev/loop-control", "is missing (no loop devices)"),
            Capability::Root => (!is_root()).then(|| "not root".to_owned()),
            Capability::IoUring => io_uring::IoUring::new(2)
                .err()
                .map(|e| format!("io_uring unavailable on this kernel: {e}")),
            Capability::UblkDriver => absent(
                "/dev/ublk-control",
                "not found: this kernel has no ublk_drv loaded",
            ),
            Capability::ShmTmpfs => {
                (!shm_is_tmpfs()).then(|| "/dev/shm is not a tmpfs mount".into())
            }
        }
    }
}

/// True when `/dev/shm` is mounted as tmpfs (read from /proc/self/mounts).
fn shm_is_tmpfs() -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.nth(1) == Some("/dev/shm") && f.next() == Some("tmpfs")
        })
    })
}

/// True when the effective uid is 0 (read from /proc, no unsafe).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
            .unwrap_or(false)
    })
}

/// True if `cap` is present. Otherwise skips `test` with the capability's
/// kind (see the module docs) and returns false.
pub fn require(test: &str, cap: Capability<'_>) -> bool {
    match cap.missing() {
        None => true,
        Some(why) => skip_as(test, &why, cap.kind()),
    }
}

/// [`require`] for each capability in turn; stops at the first missing one.
pub fn require_all(test: &str, caps: &[Capability<'_>]) -> bool {
    caps.iter().all(|&c| require(test, c))
}

/// Skips `test` for a missing prerequisite CI provides: logs it and returns
/// false, or panics when `UCRYPT_REQUIRE_TOOLS=1`.
pub fn skip(test: &str, why: &str) -> bool {
    skip_as(test, why, SkipKind::Prerequisite)
}

/// Skips `test` for something this kernel cannot do; logs it and returns
/// false even when `UCRYPT_REQUIRE_TOOLS=1`.
pub fn skip_kernel(test: &str, why: &str) -> bool {
    skip_as(test, why, SkipKind::Kernel)
}

/// Skips `test` with an explicit kind (see [`skip`] and [`skip_kernel`]).
pub fn skip_as(test: &str, why: &str, kind: SkipKind) -> bool {
    let name = test_name(test);
    if kind == SkipKind::Prerequisite && tools_required() {
        panic!("{name}: {why} and {REQUIRE_ENV}=1 (run scripts/test.sh to install test tools)");
    }
    match kind {
        SkipKind::Prerequisite => {
            eprintln!("SKIP {name}: {why} (run scripts/test.sh to install test tools)")
        }
        SkipKind::Kernel => eprintln!("SKIP {name}: {why} (this kernel; not installable)"),
    }
    if let Some(log) = std::env::var_os(SKIP_LOG_ENV).filter(|v| !v.is_empty()) {
        if let Err(e) = append_skip(Path::new(&log), &name, why, kind) {
            panic!(
                "{name}: cannot append to {SKIP_LOG_ENV}={}: {e}",
                log.to_string_lossy()
            );
        }
    }
    false
}

/// The line a skip adds to the log: `test<TAB>reason<TAB>kind<LF>`, with
/// tabs and line breaks inside the fields turned into spaces.
pub fn skip_line(test: &str, why: &str, kind: SkipKind) -> String {
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    format!("{}\t{}\t{}\n", clean(test), clean(why), kind.as_str())
}

/// Appends one skip line to `log` in a single write (O_APPEND), so test
/// processes running at the same time do not interleave their lines.
pub fn append_skip(log: &Path, test: &str, why: &str, kind: SkipKind) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    f.write_all(skip_line(test, why, kind).as_bytes())
}

/// `<test binary>::<test>`: libtest names each test's thread after its full
/// path, which is used when available (it is exact even when the caller
/// passed a short name); `--test-threads=1` runs tests on `main`, where the
/// caller's name is used.
fn test_name(given: &str) -> String {
    let thread = std::thread::current();
    let name = match thread.name() {
        Some(n) if n != "main" => n,
        _ => given,
    };
    match binary_name() {
        Some(bin) => format!("{bin}::{name}"),
        None => name.to_owned(),
    }
}

/// The test binary's name without cargo's `-<hash>` suffix.
fn binary_name() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let stem = exe.file_stem()?.to_str()?;
    let base = match stem.rsplit_once('-') {
        Some((b, hash)) if hash.len() == 16 && hash.bytes().all(|c| c.is_ascii_hexdigit()) => b,
        _ => stem,
    };
    Some(base.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_line_has_three_tab_separated_fields() {
        assert_eq!(
            skip_line("fuse::t", "/dev/fuse is missing", SkipKind::Prerequisite),
            "fuse::t\t/dev/fuse is missing\tprerequisite\n"
        );
        let l = skip_line("a\tb", "line one\nline\ttwo\r", SkipKind::Kernel);
        assert_eq!(l, "a b\tline one line two \tkernel\n");
        assert_eq!(l.trim_end().split('\t').count(), 3);
    }

    #[test]
    fn append_skip_appends_lines() {
        let dir = crate::TempDir::new("testutil-skiplog");
        let log = dir.join("skips.tsv");
        append_skip(&log, "x::a", "why a", SkipKind::Prerequisite).unwrap();
        append_skip(&log, "x::b", "why b", SkipKind::Kernel).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "x::a\twhy a\tprerequisite\nx::b\twhy b\tkernel\n"
        );
    }

    #[test]
    fn capability_kinds() {
        assert_eq!(Capability::UblkDriver.kind(), SkipKind::Kernel);
        assert_eq!(Capability::IoUring.kind(), SkipKind::Kernel);
        for c in [
            Capability::Tool("x"),
            Capability::PythonModule("x"),
            Capability::DevFuse,
            Capability::LoopDevices,
            Capability::Root,
        ] {
            assert_eq!(c.kind(), SkipKind::Prerequisite, "{c:?}");
        }
    }

    #[test]
    fn missing_names_what_is_missing() {
        assert_eq!(Capability::Tool("sh").missing(), None);
        let why = Capability::Tool("no-such-tool-ucrypt").missing().unwrap();
        assert_eq!(why, "`no-such-tool-ucrypt` not found on PATH");
    }

    #[test]
    fn test_name_is_the_thread_name_with_the_binary() {
        let n = test_name("ignored");
        assert!(
            n.ends_with("::skip::tests::test_name_is_the_thread_name_with_the_binary"),
            "{n}"
        );
        let from_other = std::thread::spawn(|| test_name("given")).join().unwrap();
        assert!(from_other.ends_with("::given"), "{from_other}");
        let bin = binary_name().unwrap();
        assert!(bin.starts_with("ucrypt_testutil"), "{bin}");
    }
}
