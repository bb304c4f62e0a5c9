//! cryptsetup's lock files in `/run/cryptsetup`, taken as cryptsetup takes
//! them so that ucrypt, cryptsetup and systemd-cryptsetup take turns:
//! - a block device's metadata lock, a `flock` on `L_MAJOR:MINOR` (not on
//!   the device node), shared while its header is read and exclusive
//!   while it is written ([`LockFile::bdev`]);
//! - a named lock `LN_NAME`, such as a LUKS2 reencryption's
//!   `LN_LUKS2-reencryption-UUID`, held exclusively by the one process
//!   moving the data ([`LockFile::named`]).
//!
//! The lock file is shared by every process that locks the device and is
//! removed by the last one out, so taking it must check, once the `flock`
//! is held, that the file is still the one the path names (another
//! process may have removed it meanwhile), and try again if not; leaving
//! it removes the file only when an exclusive lock can be had at once (no
//! one else holds or waits on this file) and the path still names it.
//! The directory is created (0700) when missing, as cryptsetup does. Where
//! it cannot be used (no `/run`, no permission to create it) the caller
//! locks the device node instead: cryptsetup would refuse to run there,
//! which would make every header verb fail without root.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{
    flock, fstat, major, minor, mkdirat, openat, statat, unlinkat, AtFlags, FlockOperation, Mode,
    OFlags, CWD,
};

/// cryptsetup's compiled-in lock directory (Debian's, and upstream's
/// default `DEFAULT_LUKS2_LOCK_PATH`).
const LOCK_DIR: &str = "/run/cryptsetup";

/// A held lock on one of cryptsetup's lock files; released (and the file
/// removed when no one else uses it) on drop.
pub(crate) struct LockFile {
    dir: OwnedFd,
    name: String,
    file: File,
}

impl LockFile {
    /// Takes `op` (shared or exclusive, waiting) on the lock file of block
    /// device `rdev`; `Ok(None)` when the lock directory cannot be used.
    pub(crate) fn bdev(rdev: u64, op: FlockOperation) -> io::Result<Option<Self>> {
        Self::take(format!("L_{}:{}", major(rdev), minor(rdev)), op)
    }

    /// Takes `op` on cryptsetup's named lock `name` (file `LN_name`); with
    /// a non-blocking `op`, an error of kind `WouldBlock` while another
    /// process holds it. `Ok(None)` when the lock directory cannot be used.
    pub(crate) fn named(name: &str, op: FlockOperation) -> io::Result<Option<Self>> {
        Self::take(format!("LN_{name}"), op)
    }

    fn take(name: String, op: FlockOperation) -> io::Result<Option<Self>> {
        let Some(dir) = open_dir() else {
            return Ok(None);
        };
        loop {
            let fd = openat(
                &dir,
                name.as_str(),
                OFlags::CREATE | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )?;
            flock_waiting(&fd, op)?;
            if names(&dir, &name, &fd) {
                return Ok(Some(Self {
                    dir,
                    name,
                    file: File::from(fd),
                }));
            }
            // Removed (and maybe created anew) by a process leaving it
            // while this one waited: take the file the path names now.
        }
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        if flock(&self.file, FlockOperation::NonBlockingLockExclusive).is_ok()
            && names(&self.dir, &self.name, self.file.as_fd())
        {
            let _ = unlinkat(&self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

/// Whether `name` in `dir` is still the file `fd` has open.
fn names(dir: &OwnedFd, name: &str, fd: impl AsFd) -> bool {
    match (fstat(fd), statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)) {
        (Ok(a), Ok(b)) => a.st_ino == b.st_ino && a.st_dev == b.st_dev,
        _ => false,
    }
}

/// The lock directory, created (0700) if missing; `None` when it cannot
/// be opened or created, or is not a directory.
fn open_dir() -> Option<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match openat(CWD, LOCK_DIR, flags, Mode::empty()) {
        Ok(d) => Some(d),
        Err(rustix::io::Errno::NOENT) => {
            match mkdirat(CWD, LOCK_DIR, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(_) => return None,
            }
            openat(CWD, LOCK_DIR, flags, Mode::empty()).ok()
        }
        Err(_) => None,
    }
}

/// `flock(fd, op)`, taken again when a signal interrupts the wait.
pub(crate) fn flock_waiting(
    fd: impl std::os::fd::AsFd,
    op: FlockOperation,
) -> rustix::io::Result<()> {
    loop {
        match flock(&fd, op) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r,
        }
    }
}
