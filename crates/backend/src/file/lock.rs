//! Advisory open-file-description locks on backing files, as qemu locks
//! images: a read-write open holds a whole-file write lock, a read-only
//! open a read lock, so a second writer (another daemon, `map --write`)
//! is refused while readers share.
//!
//! OFD locks (`F_OFD_SETLK`) belong to the open file description, not the
//! process: they are released when the descriptor is closed, are not lost
//! when another descriptor of the same file is closed, and conflict
//! between descriptors of one process too.
//!
//! Block devices are claimed instead ([`open_exclusive`]: `O_EXCL`, the
//! kernel's holder claim, which mounts and dm tables take too).
//!
//! A [`Claim`] is what a verb that rewrites a file or device in place (a
//! LUKS header verb replacing the header) holds meanwhile: the same
//! exclusive claim of a block device, and on a regular file an OFD write
//! lock, so it is refused while any backend (a daemon, `map`) has the file
//! open, and a backend opened meanwhile is refused in turn.

// FFI: fcntl(2) with a `struct flock`. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::{Error, ErrorKind};

/// A file or block device held against every other user while a verb
/// rewrites it in place (see the module doc); released on drop.
#[derive(Debug)]
pub struct Claim {
    _file: File,
}

impl Claim {
    /// Claims `path`: a block device exclusively (`O_EXCL`), a regular
    /// file under an OFD write lock (when it cannot be opened for writing,
    /// only checked for other holders' locks). Refused with
    /// [`ErrorKind::InUse`] when the device is mounted, mapped or claimed
    /// elsewhere, [`ErrorKind::Locked`] when a backend holds the file's
    /// lock (read or write); [`ErrorKind::Open`] when `path` cannot be
    /// opened at all (the caller's own open then says why).
    pub fn take(path: &Path) -> Result<Self, Error> {
        let shown = path.display().to_string();
        let open_err = |e: io::Error| {
            Error::new(ErrorKind::Open {
                path: shown.clone(),
            })
            .with_source(e)
        };
        let meta = std::fs::metadata(path).map_err(open_err)?;
        if meta.file_type().is_block_device() {
            let file = open_exclusive(OpenOptions::new().read(true), path).map_err(|e| match e
                .raw_os_error()
            {
                Some(libc::EBUSY) => Error::new(ErrorKind::InUse {
                    path: shown.clone(),
                }),
                _ => open_err(e),
            })?;
            return Ok(Self { _file: file });
        }
        let (file, write) = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => (f, true),
            Err(_) => (File::open(path).map_err(open_err)?, false),
        };
        let fd = file.as_raw_fd();
        let held = if write {
            try_lock(fd, true).map_err(open_err)?
        } else {
            conflict(fd, true)
        };
        match held {
            None => Ok(Self { _file: file }),
            Some(h) => Err(Error::new(ErrorKind::Locked {
                path: shown,
                holder: h.to_string(),
            })),
        }
    }
}

/// Opens the block device `path` with `opts` and `O_EXCL`: the kernel's
/// exclusive claim, refused (`EBUSY`) while it is mounted or claimed by
/// another exclusive opener, held until the descriptor closes.
pub(crate) fn open_exclusive(opts: &OpenOptions, path: &Path) -> io::Result<File> {
    opts.clone().custom_flags(libc::O_EXCL).open(path)
}

/// Who holds a conflicting lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A process we could name (a classic POSIX lock reports its pid).
    Pid(i32),
    /// Someone: OFD locks report no pid (the kernel says -1).
    Unknown,
}

fn whole_file(write: bool) -> libc::flock {
    // SAFETY: `flock` is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if write { libc::F_WRLCK } else { libc::F_RDLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0; // to the end, however the file grows
    fl
}

/// Takes the lock on `fd` (write lock if `write`) without waiting.
/// `Ok(None)` when taken (or when the filesystem has no locks at all);
/// `Ok(Some(holder))` when someone else holds a conflicting lock.
pub(crate) fn try_lock(fd: RawFd, write: bool) -> io::Result<Option<Holder>> {
    let fl = whole_file(write);
    // SAFETY: `fl` is a valid flock that outlives the call; fd is open.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl as *const libc::flock) };
    if rc == 0 {
        return Ok(None);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(Some(holder(fd, write))),
        // Filesystems without lock support (some FUSE/network mounts):
        // nothing to coordinate with, as with qemu's locking=auto.
        Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => Ok(None),
        _ => Err(e),
    }
}

/// Asks who holds a lock conflicting with ours (`F_OFD_GETLK`, then the
/// classic `F_GETLK`, which names a pid for POSIX lock holders).
fn holder(fd: RawFd, write: bool) -> Holder {
    conflict(fd, write).unwrap_or(Holder::Unknown)
}

/// Whether someone holds a lock conflicting with a `write` (or read) lock
/// of ours, without taking one: `F_OFD_GETLK`, then the classic `F_GETLK`,
/// which names a pid for POSIX lock holders. `None` also when the file
/// system cannot say.
fn conflict(fd: RawFd, write: bool) -> Option<Holder> {
    let mut found = None;
    for cmd in [libc::F_OFD_GETLK, libc::F_GETLK] {
        let mut fl = whole_file(write);
        // SAFETY: `fl` is a valid, writable flock that outlives the call.
        let rc = unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) };
        if rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short {
            if fl.l_pid > 0 {
                return Some(Holder::Pid(fl.l_pid));
            }
            found = Some(Holder::Unknown);
        }
    }
    found
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Pid(p) => write!(f, "process {p}"),
            Holder::Unknown => f.write_str("another process"),
        }
    }
}
