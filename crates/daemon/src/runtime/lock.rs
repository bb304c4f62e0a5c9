//! A volume name's claim: `NAME.lock` in the runtime directory, held with
//! an exclusive OFD lock (`F_OFD_SETLK`, whole file) by whoever serves
//! `NAME`, for as long as it does.
//!
//! ```text
//!  open NAME (parent) ── NameLock::acquire ── prompt, resolve ── spawn ─┐
//!        the lock's descriptor, inherited (UCRYPT_NAME_LOCK_FD) ◄───────┘
//!  serve --spec-stdin NAME (child) ──── NameLock::adopt ── serve ── release
//!  status, list, close ── NameLock::held (F_OFD_GETLK: asks, never takes)
//! ```
//!
//! The lock belongs to the open file description, not to a process: the
//! detached daemon inherits the very descriptor its parent locked, so the
//! name is held without a gap from the parent's claim (before the
//! passphrase prompt) to the daemon's exit, and a second `open NAME`,
//! whatever its spelling, finds it taken. OFD locks rather than `flock`
//! because `F_OFD_GETLK` answers "is it held?" without taking the lock, so
//! `status` or `list` never make a concurrent `open` fail.
//!
//! The file is removed by its holder just before it lets go; an acquirer
//! checks after locking that the path still names the file it locked (or
//! starts over), so a remover and an acquirer never both think they hold
//! the name.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};

use crate::error::{Error, ErrorKind, Result};

/// The environment variable naming the inherited lock descriptor.
pub const FD_ENV: &str = "UCRYPT_NAME_LOCK_FD";

/// A held volume name. Dropping it lets go of the name without removing
/// the lock file; [`NameLock::release`] removes it first.
#[derive(Debug)]
pub struct NameLock {
    file: File,
    path: PathBuf,
}

impl NameLock {
    /// Takes `path` (`NAME.lock`) for volume `name`, creating it (0600)
    /// if missing, without waiting: [`ErrorKind::Busy`] ("Device NAME
    /// already exists") when someone else holds it.
    pub fn acquire(path: &Path, name: &str) -> Result<Self> {
        // A holder may remove the file between our open and our lock:
        // then we locked an orphan, and start over on the new file.
        for _ in 0..64 {
            let file = open(path, true)?;
            match set_lock(&file, libc::F_WRLCK) {
                Ok(true) => {}
                Ok(false) => return Err(exists(name, path)),
                Err(e) => return Err(cannot(path, e)),
            }
            if same_file(&file, path) {
                return Ok(Self {
                    file,
                    path: path.to_owned(),
                });
            }
        }
        Err(exists(name, path))
    }

    /// The lock the parent `open` passed on ([`FD_ENV`]), if there is
    /// one and it is `path`'s. The inherited descriptor keeps holding the
    /// lock for as long as this process lives (it is never closed here);
    /// the returned value is a second description of the same file, to
    /// check and remove it by. `None` when nothing was passed on.
    pub fn adopt(path: &Path, name: &str) -> Result<Option<Self>> {
        let Some(fd) = std::env::var(FD_ENV)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
        else {
            return Ok(None);
        };
        // Only an open descriptor of our lock file is taken over: anything
        // else (a stale variable) is ignored.
        let inherited = format!("/proc/self/fd/{fd}");
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&inherited)
        else {
            return Ok(None);
        };
        if !same_file(&file, path) {
            return Ok(None);
        }
        // Held: by the inherited description, which the parent locked. Not
        // held (the parent's went away unlocked): take it here.
        if !Self::held(path) && !set_lock(&file, libc::F_WRLCK).map_err(|e| cannot(path, e))? {
            return Err(exists(name, path));
        }
        Ok(Some(Self {
            file,
            path: path.to_owned(),
        }))
    }

    /// Makes the lock's descriptor inheritable and returns its number, for
    /// a child to [`adopt`](NameLock::adopt) through [`FD_ENV`]. Call it
    /// right before spawning the child, and [`NameLock::seal`] after.
    pub fn share(&self) -> Result<RawFd> {
        fcntl(&self.file, FcntlArg::F_SETFD(FdFlag::empty()))
            .map_err(|e| cannot(&self.path, e.into()))?;
        Ok(self.file.as_raw_fd())
    }

    /// Makes the descriptor close-on-exec again (after [`NameLock::share`]).
    pub fn seal(&self) {
        let _ = fcntl(&self.file, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }

    /// Removes the lock file, then lets go of the name.
    pub fn release(self) {
        if same_file(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Whether someone (anyone but this description) holds the lock at
    /// `path`; asks with `F_OFD_GETLK` and takes nothing. A missing file
    /// is not held.
    pub fn held(path: &Path) -> bool {
        let Ok(file) = open(path, false) else {
            return false;
        };
        let mut fl = whole_file(libc::F_WRLCK);
        match fcntl(&file, FcntlArg::F_OFD_GETLK(&mut fl)) {
            Ok(_) => fl.l_type != libc::F_UNLCK as libc::c_short,
            // A filesystem without locks: nobody can hold one.
            Err(_) => false,
        }
    }
}

/// Opens the lock file, never through a symlink; `create` makes it 0600.
fn open(path: &Path, create: bool) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| cannot(path, e))
}

/// `F_OFD_SETLK` of `kind` on the whole file: `Ok(false)` when someone
/// else holds a conflicting lock.
fn set_lock(file: &File, kind: libc::c_int) -> std::io::Result<bool> {
    let fl = whole_file(kind);
    match fcntl(file, FcntlArg::F_OFD_SETLK(&fl)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn whole_file(kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        // To the end, however the file grows.
        l_len: 0,
        // OFD locks require 0 here.
        l_pid: 0,
    }
}

/// Whether `path` (not followed) is the file open as `file`.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn exists(name: &str, path: &Path) -> Error {
    let pid = path
        .with_extension("pid")
        .to_str()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<u32>().ok());
    let by = pid
        .map(|p| format!(" (served by pid {p})"))
        .unwrap_or_default();
    Error::new(
        ErrorKind::Busy,
        format!("Device {name} already exists{by}."),
    )
}

fn cannot(path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!("Cannot lock {}", path.display()),
    )
    .with_source(e)
}
