//! Where a daemon's files live and how to tell a live daemon from a dead
//! one.
//!
//! Per volume `NAME` the runtime directory ([`dir`], used only once
//! [`check_dir`] accepted it: ours, a real directory, not writable by
//! others, and so are its parents) holds:
//!
//! ```text
//!   NAME.lock       the name's claim: locked by whoever serves NAME (lock.rs)
//!   NAME.pid        pid of the serving daemon (written once it is ready)
//!   NAME.ctl.sock   control socket (0600): one request line, one reply line
//!   NAME.nbd.sock   default NBD socket (0600)
//!   NAME.fuse/      default FUSE mountpoint (holding the file NAME)
//!   NAME.log        a detached daemon's stdout/stderr
//! ```
//!
//! A volume is alive while its `NAME.lock` is held ([`NameLock`]); the pid
//! file only says which process serves it. Sockets are made by
//! [`SocketFile::bind`], which never replaces anything but a stale socket
//! of ours.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{invalid, Error, ErrorKind, Result};

mod lock;
mod socket;

pub use lock::{NameLock, FD_ENV as NAME_LOCK_FD_ENV};
pub use socket::SocketFile;

/// The runtime directory: `$UCRYPT_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/ucrypt`, else `/run/ucrypt` as root, else
/// `/tmp/ucrypt-$UID`.
///
/// Whichever it is, it is only used after [`check_dir`] accepted it: a
/// directory (not a symlink) owned by us that nobody else can write to, so
/// no other local user can plant or swap the files in it.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UCRYPT_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        // Absolute: the detached daemon runs in `/`.
        return std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ucrypt");
    }
    let uid = euid();
    if uid == 0 {
        return PathBuf::from("/run/ucrypt");
    }
    PathBuf::from(format!("/tmp/ucrypt-{uid}"))
}

/// Our effective uid.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Checks that `d` is safe to keep runtime files in: a real directory (a
/// symlink is refused, not followed), owned by our effective uid, not
/// writable by group or others, under parents that nobody but root and
/// us can rename it in ([`check_parents`]). `Ok(false)` if it does not
/// exist.
///
/// Fails with [`ErrorKind::PermissionDenied`] naming what is wrong.
pub fn check_dir(d: &Path) -> Result<bool> {
    let m = match std::fs::symlink_metadata(d) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("Cannot check runtime directory {}", d.display()),
            )
            .with_source(e))
        }
    };
    let refuse = |why: String| {
        Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("Refusing insecure runtime directory {}: {why}", d.display()),
        ))
    };
    if m.file_type().is_symlink() {
        return refuse("it is a symbolic link".into());
    }
    if !m.is_dir() {
        return refuse("it is not a directory".into());
    }
    let me = euid();
    if m.uid() != me {
        return refuse(format!("owned by uid {}, not by uid {me}", m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return refuse(format!(
            "mode {:04o} lets others write to it (use 0700)",
            m.mode() & 0o7777
        ));
    }
    check_parents(d)?;
    Ok(true)
}

/// Checks every parent of `d` up to `/`, as OpenSSH's `secure_path` and
/// systemd do: each owned by root or by us, and not writable by group or
/// others unless sticky (as `/tmp` is), so nobody else can rename `d` or
/// swap it for their own. Parents are resolved first (a symlinked
/// `/var/run` is checked where it leads).
pub fn check_parents(d: &Path) -> Result<()> {
    let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let parent = std::fs::canonicalize(parent).map_err(|e| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("Cannot check runtime directory {}", d.display()),
        )
        .with_source(e)
    })?;
    let me = euid();
    for a in parent.ancestors() {
        let m = std::fs::metadata(a).map_err(|e| {
            Error::new(
                ErrorKind::PermissionDenied,
                format!("Cannot check {}", a.display()),
            )
            .with_source(e)
        })?;
        let refuse = |why: String| {
            Err(Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "Refusing insecure runtime directory {}: its parent {} {why}",
                    d.display(),
                    a.display()
                ),
            ))
        };
        if m.uid() != 0 && m.uid() != me {
            return refuse(format!(
                "is owned by uid {}, not by root or uid {me}",
                m.uid()
            ));
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return refuse(format!(
                "has mode {:04o}: others can write to it and it is not sticky",
                m.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// The runtime directory if it exists and passes [`check_dir`]; `None` if
/// it does not exist.
pub fn verified_dir() -> Result<Option<PathBuf>> {
    let d = dir();
    Ok(check_dir(&d)?.then_some(d))
}

/// Creates the runtime directory (0700) if missing and verifies it with
/// [`check_dir`] (also when it already existed).
pub fn ensure_dir() -> Result<PathBuf> {
    let d = dir();
    let cannot = |e: std::io::Error| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("Cannot create runtime directory {}", d.display()),
        )
        .with_source(e)
    };
    if !check_dir(&d)? {
        if let Some(parent) = d.parent() {
            std::fs::create_dir_all(parent).map_err(cannot)?;
        }
        // Not recursive: the leaf must be ours, made here with 0700.
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(cannot(e)),
        }
        if !check_dir(&d)? {
            return Err(cannot(std::io::Error::from(std::io::ErrorKind::NotFound)));
        }
    }
    Ok(d)
}

/// Creates `path` afresh for writing with `mode`: a stale file (or a
/// symlink planted to redirect us) is unlinked, and the new file is
/// opened with `O_EXCL | O_NOFOLLOW`, so no existing file is ever opened
/// through this name. Anything else there (a directory, a socket) is
/// refused (`AlreadyExists`, "exists and is not a regular file"). Call it
/// only inside a directory [`check_dir`] accepted, holding the volume's
/// [`NameLock`].
pub fn create_file(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() || m.file_type().is_symlink() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "it exists and is not a regular file",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Paths of one volume's runtime files.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `NAME.lock`
    pub lock: PathBuf,
    /// `NAME.pid`
    pub pid: PathBuf,
    /// `NAME.ctl.sock`
    pub ctl: PathBuf,
    /// `NAME.nbd.sock`
    pub nbd: PathBuf,
    /// `NAME.fuse`
    pub fuse: PathBuf,
    /// `NAME.log`
    pub log: PathBuf,
}

impl Paths {
    /// The files of volume `name` in `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        Self {
            lock: dir.join(format!("{name}.lock")),
            pid: dir.join(format!("{name}.pid")),
            ctl: dir.join(format!("{name}.ctl.sock")),
            nbd: dir.join(format!("{name}.nbd.sock")),
            fuse: dir.join(format!("{name}.fuse")),
            log: dir.join(format!("{name}.log")),
        }
    }

    /// The files of volume `name` in the runtime directory.
    pub fn of(name: &str) -> Self {
        Self::new(&dir(), name)
    }
}

/// What [`claim`] found, and the name it holds.
#[derive(Debug)]
pub struct Claim {
    /// The volume's runtime files.
    pub paths: Paths,
    /// The volume's name, held until this is dropped or released.
    pub lock: NameLock,
    /// A dead daemon's FUSE mount had to be detached.
    pub detached_stale_mount: bool,
}

/// Claims volume `name` for a new daemon: checks the name, creates the
/// runtime directory, takes the name's [`NameLock`] (refused with
/// [`ErrorKind::Busy`], "Device NAME already exists", while anyone holds
/// it) and removes what a dead daemon left behind. With `inherited` (the
/// detached daemon) the lock its parent passed on is adopted instead,
/// so the name is never free in between.
pub fn claim(name: &str, inherited: bool) -> Result<Claim> {
    check_name(name)?;
    let paths = Paths::new(&ensure_dir()?, name);
    let adopted = if inherited {
        NameLock::adopt(&paths.lock, name)?
    } else {
        None
    };
    let lock = match adopted {
        Some(l) => l,
        None => NameLock::acquire(&paths.lock, name)?,
    };
    // Ours now: whatever a crashed daemon left behind must not block us.
    // (An adopted claim was cleaned by the parent, and nothing is written
    // before the daemon runs.)
    let detached_stale_mount = clean_files(&paths);
    Ok(Claim {
        paths,
        lock,
        detached_stale_mount,
    })
}

/// Volume names become file names: keep them to a safe alphabet.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "Invalid volume name {name:?}: use 1-64 characters from A-Z a-z 0-9 - _ . (not starting with '.')"
        )))
    }
}

/// The pid serving the volume, from its pid file, if the name is held
/// ([`is_live`]); `None` for a dead volume, or a live one still starting
/// (no pid file yet).
pub fn live_pid(paths: &Paths) -> Option<u32> {
    if !is_live(paths) {
        return None;
    }
    std::fs::read_to_string(&paths.pid)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether someone holds the volume's name (its [`NameLock`]): a daemon
/// serving it, or an `open` of it still starting. Never in a directory
/// [`check_dir`] refuses (others could have planted the files).
pub fn is_live(paths: &Paths) -> bool {
    let Some(dir) = paths.lock.parent() else {
        return false;
    };
    check_dir(dir).unwrap_or(false) && NameLock::held(&paths.lock)
}

/// Process `pid`'s identity for [`has_exited`]: its start time (field 22
/// of `/proc/PID/stat`), or `None` when there is no such process.
pub fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, start)| start)
}

/// True once process `pid` (started at `started`, from [`start_time`]) has
/// closed its files: it is gone, a zombie, or the pid now names another
/// process. An empty `cmdline` is not enough: the kernel drops a dying
/// process's memory (and with it the command line) before its files, so
/// the volume's file lock may still be held then.
pub fn has_exited(pid: u32, started: u64) -> bool {
    match proc_stat(pid) {
        None => true,
        Some((state, start)) => start != started || matches!(state, 'Z' | 'X' | 'x'),
    }
}

/// The state letter and start time from `/proc/PID/stat`. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after
/// its last ')'.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    // After the state (field 3), start time is field 22: 18 fields on.
    let start = f.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Names of the volumes with a pid file in the runtime directory, sorted
/// (live or not: check with [`live_pid`]). None when the directory does
/// not exist (or cannot be read); an insecure one is refused as
/// [`check_dir`] refuses it.
pub fn volumes() -> Result<Vec<String>> {
    let Some(d) = verified_dir()? else {
        return Ok(Vec::new());
    };
    let Ok(entries) = std::fs::read_dir(d) else {
        return Ok(Vec::new());
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".pid"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    Ok(names)
}

/// Removes what a dead daemon left behind (pid file, sockets, dead FUSE
/// mount), if nobody holds the name: taken for the time of the cleaning,
/// so a daemon starting meanwhile is never cleaned away. Returns true if a
/// stale FUSE mount had to be detached.
pub fn clean_stale(paths: &Paths) -> bool {
    let Some(name) = paths
        .lock
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".lock"))
    else {
        return false;
    };
    let Ok(lock) = NameLock::acquire(&paths.lock, name) else {
        return false;
    };
    let detached = clean_files(paths);
    lock.release();
    detached
}

/// [`clean_stale`]'s work, for a caller holding the name.
fn clean_files(paths: &Paths) -> bool {
    let remove_if = |p: &Path, what: fn(&std::fs::Metadata) -> bool| {
        if std::fs::symlink_metadata(p).is_ok_and(|m| what(&m)) {
            let _ = std::fs::remove_file(p);
        }
    };
    remove_if(&paths.pid, |m| m.is_file());
    remove_if(&paths.ctl, |m| m.file_type().is_socket());
    remove_if(&paths.nbd, |m| m.file_type().is_socket());
    let detached = fuse::clean_stale_mount(&paths.fuse).unwrap_or(false);
    let _ = std::fs::remove_dir(&paths.fuse);
    detached
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by each test here while it has a child process: a child
    /// spawned by one test inherits whatever inheritable descriptor another
    /// test has open at that moment (the shared name lock below), and
    /// would keep that lock held after its own test let go.
    static CHILDREN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_child_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        CHILDREN.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn a_zombie_or_reaped_process_has_exited() {
        let _one = one_child_at_a_time();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let started = start_time(pid).expect("a running child has a start time");
        assert!(!has_exited(pid, started), "running");
        assert!(
            has_exited(pid, started + 1),
            "another process under the same pid"
        );
        child.kill().unwrap();
        // Not reaped yet: a zombie, its files closed. Count polls, no clock.
        let mut polls = 0;
        while !has_exited(pid, started) {
            polls += 1;
            assert!(polls < 10_000, "a killed child never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            matches!(proc_stat(pid), Some(('Z', _))),
            "{:?}",
            proc_stat(pid)
        );
        child.wait().unwrap();
        assert!(has_exited(pid, started), "reaped");
        assert_eq!(start_time(u32::MAX), None);
    }

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let _one = one_child_at_a_time();
        // A command name with spaces and parentheses, as /proc shows it.
        let dir = std::env::temp_dir().join(format!("ucrypt-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("a) S 1 (b");
        let _ = std::fs::remove_file(&odd);
        std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap();
        let mut child = std::process::Command::new(&odd)
            .arg("30")
            .spawn()
            .expect("spawn");
        let st = proc_stat(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let (state, start) = st.expect("stat of the odd-named child");
        // Alive: running, sleeping, or in uninterruptible sleep ('D'), as a
        // child still paging in its exec on a cold machine is (CI saw it).
        assert!(matches!(state, 'R' | 'S' | 'D'), "{state}");
        // Counted from the first ')' instead, field 22 would be field 19
        // (nice, 0 here). The child started no earlier than this process.
        let me = start_time(std::process::id()).expect("own start time");
        assert!(start >= me && start > 0, "{start} < {me}");
    }

    #[test]
    fn a_name_is_held_once_and_its_files_cleaned_only_when_free() {
        let dir = testutil::TempDir::new("runtime-lock");
        let paths = Paths::new(dir.path(), "v");
        assert!(!NameLock::held(&paths.lock), "no file, nobody holds it");
        let first = NameLock::acquire(&paths.lock, "v").unwrap();
        std::fs::write(&paths.pid, format!("{}\n", std::process::id())).unwrap();
        assert!(NameLock::held(&paths.lock));
        assert_eq!(live_pid(&paths), Some(std::process::id()));
        let e = NameLock::acquire(&paths.lock, "v").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert_eq!(
            e.to_string(),
            format!(
                "Device v already exists (served by pid {}).",
                std::process::id()
            )
        );
        // Held: a stale-file cleaner leaves everything alone.
        assert!(!clean_stale(&paths));
        assert!(paths.pid.exists());
        first.release();
        assert!(!paths.lock.exists(), "the holder removes its lock file");
        assert_eq!(live_pid(&paths), None, "a pid file alone is not alive");
        assert!(!clean_stale(&paths));
        assert!(!paths.pid.exists(), "free: the dead daemon's pid file goes");
        assert!(!paths.lock.exists());
        // Dropped without release: free again, and the file is reused.
        drop(NameLock::acquire(&paths.lock, "v").unwrap());
        assert!(!NameLock::held(&paths.lock));
        drop(NameLock::acquire(&paths.lock, "v").unwrap());
    }

    #[test]
    fn a_lock_passed_to_a_child_keeps_the_name_held() {
        let _one = one_child_at_a_time();
        // The child inherits the descriptor: the name stays taken while
        // the child lives, after this process let go of its own.
        let dir = testutil::TempDir::new("runtime-lock-child");
        let paths = Paths::new(dir.path(), "c");
        let lock = NameLock::acquire(&paths.lock, "c").unwrap();
        let fd = lock.share().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        lock.seal();
        assert!(std::fs::read_link(format!("/proc/{}/fd/{fd}", child.id())).is_ok());
        drop(lock);
        assert!(NameLock::held(&paths.lock), "held through the child");
        assert!(NameLock::acquire(&paths.lock, "c").is_err());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!NameLock::held(&paths.lock));
    }

    #[test]
    fn files_in_the_way_of_pid_and_log_files_are_refused() {
        let dir = testutil::TempDir::new("runtime-create");
        let p = dir.join("v.pid");
        std::fs::create_dir(&p).unwrap();
        let e = create_file(&p, 0o644).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(p.is_dir());
        let f = dir.join("v.log");
        std::fs::write(&f, b"old").unwrap();
        create_file(&f, 0o600).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"");
    }

    #[test]
    fn parents_writable_by_others_are_refused_unless_sticky() {
        use std::os::unix::fs::PermissionsExt;
        let dir = testutil::TempDir::new("runtime-parents");
        let open = dir.join("open");
        let run = open.join("run");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&run).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("is not sticky"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(check_dir(&run).unwrap(), "sticky, as /tmp");
    }

    #[test]
    fn names_are_checked() {
        for ok in ["a", "vol-1_x.y", &"n".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "../x", "sp ace", &"n".repeat(65)] {
            let e = check_name(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn paths_are_named_after_the_volume() {
        let p = Paths::new(Path::new("/r"), "v");
        assert_eq!(p.lock, Path::new("/r/v.lock"));
        assert_eq!(p.pid, Path::new("/r/v.pid"));
        assert_eq!(p.ctl, Path::new("/r/v.ctl.sock"));
        assert_eq!(p.nbd, Path::new("/r/v.nbd.sock"));
        assert_eq!(p.fuse, Path::new("/r/v.fuse"));
        assert_eq!(p.log, Path::new("/r/v.log"));
    }
}
