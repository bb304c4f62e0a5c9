//! Advisory open-file-description locks on backing files, as qemu locks
//! images: a read-write open holds a whole-file write lock, a read-only
//! open a read lock, so a second writer (another daemon, `map --write`)
//! is refused while readers share.
//!
//! OFD locks (`F_OFD_SETLK`) belong to the open file description, not the
//! process: they are released when the descriptor is closed, are not lost
//! when another descriptor of the same file is closed, and conflict
//! between descriptors of one process too.

// FFI: fcntl(2) with a `struct flock`. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

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
    for cmd in [libc::F_OFD_GETLK, libc::F_GETLK] {
        let mut fl = whole_file(write);
        // SAFETY: `fl` is a valid, writable flock that outlives the call.
        let rc = unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) };
        if rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short && fl.l_pid > 0 {
            return Holder::Pid(fl.l_pid);
        }
    }
    Holder::Unknown
}
