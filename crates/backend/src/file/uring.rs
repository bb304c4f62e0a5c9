//! The io_uring engine: one small ring per calling thread, each operation
//! run to completion on it (push one SQE, `io_uring_enter` until its CQE).
//!
//! A thread the kernel refuses a ring (a ring limit, `io_uring_disabled`,
//! a seccomp filter) is marked and uses the syscall engine from then on.
// FFI: SQEs pointing at caller buffers, run to completion. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;

use io_uring::{opcode, squeue, types, IoUring};

use super::Op;

/// Runs `op` on this thread's ring; returns the bytes transferred.
pub(super) fn run(op: Op<'_>) -> io::Result<usize> {
    let sqe = match op {
        Op::Read { fd, buf, offset } => {
            opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), xfer_len(buf.len()))
                .offset(offset)
                .build()
        }
        Op::Write {
            fd,
            buf,
            offset,
            flags,
        } => opcode::Write::new(types::Fd(fd), buf.as_ptr(), xfer_len(buf.len()))
            .offset(offset)
            .rw_flags(flags)
            .build(),
        Op::Fdatasync { fd } => opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
    };
    // SAFETY: the SQE points at the buffer of `op` (if any), which the
    // caller borrows (exclusively for a read) for longer than this call,
    // and at an fd the caller owns. `run_sqe` does not return until the
    // kernel has posted this SQE's CQE, or with the SQE provably never
    // consumed (then `with_ring` retires the ring), so the buffer and fd
    // outlive the kernel's use of them.
    retry_cqe(|| unsafe { with_ring(|r| run_sqe(r, &sqe)) })
}

/// An SQE length; callers cut transfers to `MAX_XFER` (1 GiB) first.
fn xfer_len(n: usize) -> u32 {
    debug_assert!(n <= super::MAX_XFER);
    n as u32
}

/// Creates this thread's ring if needed: `Ok` when io_uring is usable here.
pub(super) fn probe() -> io::Result<()> {
    with_ring(|_| Ok(()))
}

/// True when `err` (from [`probe`]) means the kernel refuses io_uring to
/// this process: not built in (`ENOSYS`), disabled by the
/// `io_uring_disabled` sysctl or a seccomp filter (`EPERM`, `EACCES`), or
/// no room for a ring (`ENOMEM` from the locked-memory limit, `EMFILE`,
/// `ENFILE`). Judged by errno, never by message text.
pub(super) fn refused(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::ENOSYS | libc::EPERM | libc::EACCES | libc::ENOMEM | libc::EMFILE | libc::ENFILE
        )
    )
}

/// Runs an SQE submission until its CQE result is not EINTR/EAGAIN.
fn retry_cqe(mut f: impl FnMut() -> io::Result<i32>) -> io::Result<usize> {
    loop {
        let res = f()?;
        if res >= 0 {
            return Ok(res as usize);
        }
        if !matches!(-res, libc::EINTR | libc::EAGAIN) {
            return Err(io::Error::from_raw_os_error(-res));
        }
    }
}

thread_local! {
    /// This thread's ring; `None` until first use or after it was retired.
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

thread_local! {
    /// Set once the kernel refused this thread a ring; it then uses syscalls.
    static RING_REFUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True if this thread has its ring or can create it now.
pub(super) fn thread_ring_ready() -> bool {
    if RING_REFUSED.get() {
        return false;
    }
    let ok = with_ring(|_| Ok(())).is_ok();
    if !ok {
        RING_REFUSED.set(true);
    }
    ok
}

/// Entries per thread ring: each thread has at most one operation in flight.
const RING_ENTRIES: u32 = 4;

fn new_ring() -> io::Result<IoUring> {
    // Single issuer + deferred task running: completions run only in this
    // thread's io_uring_enter (cheapest for a synchronous caller). Older
    // kernels refuse the flags; fall back to a plain ring.
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES)
        .or_else(|_| IoUring::new(RING_ENTRIES))
}

/// Calls `f` with this thread's ring, creating it first if needed.
fn with_ring<T>(f: impl FnOnce(&mut IoUring) -> io::Result<T>) -> io::Result<T> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(new_ring()?);
        }
        // Invariant: set just above.
        let ring = slot.as_mut().expect("ring initialised above");
        let r = f(ring);
        if ring_retired(ring) {
            *slot = None;
        }
        r
    })
}

/// A ring whose submission queue still holds an entry after a failed
/// `run_sqe` must not be used again (that entry points at a dead buffer).
fn ring_retired(ring: &mut IoUring) -> bool {
    !ring.submission().is_empty()
}

/// Submits `sqe` on an idle `ring` and waits for its CQE; returns its result.
///
/// # Safety
///
/// Every buffer and fd `sqe` references must stay valid until this function
/// returns. It returns only once the CQE has been reaped, or with the SQE
/// still unconsumed in the submission queue (never seen by the kernel), in
/// which case the caller (`with_ring`) drops the ring so the SQE is never
/// submitted.
unsafe fn run_sqe(ring: &mut IoUring, sqe: &squeue::Entry) -> io::Result<i32> {
    const TOKEN: u64 = 0x7563_7279_7074; // "ucrypt"
    let sqe = sqe.clone().user_data(TOKEN);
    // SAFETY: forwarded from this function's contract.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("io_uring submission queue unexpectedly full"))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                if !ring.submission().is_empty() {
                    // Never consumed: the caller retires the ring.
                    return Err(e);
                }
                // In flight: the buffer must stay borrowed until the CQE
                // arrives, so keep waiting (after a pause, not a busy loop).
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        if let Some(cqe) = ring.completion().find(|c| c.user_data() == TOKEN) {
            return Ok(cqe.result());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_is_judged_by_errno() {
        for errno in [libc::ENOSYS, libc::EPERM, libc::EACCES, libc::ENOMEM] {
            assert!(refused(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::EINVAL, libc::EFAULT, libc::EIO] {
            assert!(!refused(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        assert!(!refused(&io::Error::other("io_uring unavailable")));
    }
}
