//! Where a daemon's files live and how to tell a live daemon from a dead
//! one.
//!
//! Per volume `NAME` the runtime directory ([`dir`]) holds:
//!
//! ```text
//!   NAME.pid        pid of the serving daemon (written once it is ready)
//!   NAME.ctl.sock   control socket (0600): one request line, one reply line
//!   NAME.nbd.sock   default NBD socket (0600)
//!   NAME.fuse/      default FUSE mountpoint (holding the file NAME)
//!   NAME.log        a detached daemon's stdout/stderr
//! ```

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::{invalid, Error, ErrorKind, Result};

/// The runtime directory: `$UCRYPT_RUNTIME_DIR`, else `/run/ucrypt` as root,
/// else `$XDG_RUNTIME_DIR/ucrypt`, else `/tmp/ucrypt-$UID`.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UCRYPT_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        // Absolute: the detached daemon runs in `/`.
        return std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d));
    }
    let uid = euid();
    if uid == 0 {
        return PathBuf::from("/run/ucrypt");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ucrypt");
    }
    PathBuf::from(format!("/tmp/ucrypt-{uid}"))
}

/// Our effective uid, read from `/proc/self` (owned by the process's euid).
pub fn euid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Creates the runtime directory (0700) if missing.
pub fn ensure_dir() -> Result<PathBuf> {
    let d = dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&d)
        .map_err(|e| {
            Error::new(
                ErrorKind::PermissionDenied,
                format!("Cannot create runtime directory {}", d.display()),
            )
            .with_source(e)
        })?;
    Ok(d)
}

/// Paths of one volume's runtime files.
#[derive(Debug, Clone)]
pub struct Paths {
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

/// What [`claim`] found.
#[derive(Debug)]
pub struct Claim {
    /// The volume's runtime files.
    pub paths: Paths,
    /// A dead daemon's FUSE mount had to be detached.
    pub detached_stale_mount: bool,
}

/// Claims volume `name` for a new daemon: checks the name, creates the
/// runtime directory, refuses ([`ErrorKind::Busy`]) when a live daemon
/// already serves `name` — unless that is process `me` — and removes what
/// a dead one left behind.
pub fn claim(name: &str, me: Option<u32>) -> Result<Claim> {
    check_name(name)?;
    let paths = Paths::new(&ensure_dir()?, name);
    if let Some(pid) = live_pid(&paths, name) {
        if Some(pid) != me {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("Device {name} already exists (served by pid {pid})."),
            ));
        }
    }
    // Whatever a crashed daemon left behind must not block us.
    let detached_stale_mount = clean_stale(&paths);
    Ok(Claim {
        paths,
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

/// The pid recorded for `name` if that process is alive and is a ucrypt
/// daemon serving `name` (guards against pid reuse after a crash).
pub fn live_pid(paths: &Paths, name: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(&paths.pid)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    pid_serves(pid, name).then_some(pid)
}

/// True if process `pid` exists and its command line is `… open … name`.
pub fn pid_serves(pid: u32, name: &str) -> bool {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
    // A zombie has an empty cmdline: treat it as dead.
    args.contains(&&b"open"[..]) && args.contains(&name.as_bytes())
}

/// Names of the volumes with a pid file in the runtime directory, sorted
/// (live or not: check with [`live_pid`]).
pub fn volumes() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir()) else {
        return Vec::new();
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
    names
}

/// Removes what a dead daemon left behind (pid file, sockets, dead FUSE
/// mount). Returns true if a stale FUSE mount had to be detached.
pub fn clean_stale(paths: &Paths) -> bool {
    let _ = std::fs::remove_file(&paths.pid);
    let _ = std::fs::remove_file(&paths.ctl);
    if let Ok(m) = std::fs::symlink_metadata(&paths.nbd) {
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(&paths.nbd);
        }
    }
    let detached = fuse::clean_stale_mount(&paths.fuse).unwrap_or(false);
    let _ = std::fs::remove_dir(&paths.fuse);
    detached
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(p.pid, Path::new("/r/v.pid"));
        assert_eq!(p.ctl, Path::new("/r/v.ctl.sock"));
        assert_eq!(p.nbd, Path::new("/r/v.nbd.sock"));
        assert_eq!(p.fuse, Path::new("/r/v.fuse"));
        assert_eq!(p.log, Path::new("/r/v.log"));
    }
}
