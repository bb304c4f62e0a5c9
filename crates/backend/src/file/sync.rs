//! The syscall engine: positioned `pread` / `pwritev2` / `fdatasync`, used
//! where io_uring is unavailable or not wanted ([`super::IoEngine::Syscalls`]).
// FFI: positioned read/write and sync syscalls. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use super::Op;

/// Runs `op` with plain syscalls; returns the bytes transferred.
pub(super) fn run(op: Op<'_>) -> io::Result<usize> {
    match op {
        Op::Read { fd, buf, offset } => {
            let (ptr, n) = (buf.as_mut_ptr(), buf.len());
            // SAFETY: `ptr` is valid for `n` writable bytes (`buf`, borrowed
            // exclusively for the whole call).
            cvt_retry(|| unsafe { libc::pread(fd, ptr.cast(), n, offset as i64) })
        }
        Op::Write {
            fd,
            buf,
            offset,
            flags,
        } => {
            let iov = libc::iovec {
                iov_base: buf.as_ptr() as *mut _,
                iov_len: buf.len(),
            };
            // SAFETY: the iovec describes the readable bytes of `buf`,
            // borrowed for the duration of the call; the kernel only reads.
            cvt_retry(|| unsafe { libc::pwritev2(fd, &iov, 1, offset as i64, flags) })
        }
        // SAFETY: plain syscall on an fd the caller owns; no memory passed.
        Op::Fdatasync { fd } => cvt_retry(|| unsafe { libc::fdatasync(fd) as isize }),
    }
}

/// True when `fd` takes nowait IO (the kernel's `FMODE_NOWAIT`): a read
/// into `buf` at offset 0 with `RWF_NOWAIT` is refused with `EOPNOTSUPP`
/// only where the file cannot do it (checked before any data moves; a
/// read that would block answers `EAGAIN`). io_uring hands every
/// read and write on such a file to an io-wq worker thread (tmpfs, for
/// one, on 6.18); `IoEngine::Auto` then keeps the syscalls. `buf` must be
/// non-empty (and aligned for an O_DIRECT `fd`).
pub(super) fn takes_nowait(fd: RawFd, buf: &mut [u8]) -> bool {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the iovec describes `buf`'s writable bytes, borrowed
    // exclusively for the call.
    let r = unsafe { libc::preadv2(fd, &iov, 1, 0, libc::RWF_NOWAIT) };
    r >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EOPNOTSUPP)
}

/// `fallocate(fd, mode, offset, len)` (punch hole, zero range): a plain
/// syscall, as io_uring would hand it to a worker thread anyway.
pub(super) fn fallocate(fd: RawFd, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an fd the caller owns; no memory passed.
    cvt_retry(|| unsafe { libc::fallocate(fd, mode, offset as i64, len as i64) as isize }).map(drop)
}

/// Runs a syscall returning -1/errno, retrying EINTR and EAGAIN.
pub(super) fn cvt_retry(mut f: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
            return Err(e);
        }
    }
}
