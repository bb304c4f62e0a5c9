//! The io_uring engine: one ring per calling thread, used for batches
//! ([`run_batch`]): it fills the ring with up to [`RING_ENTRIES`] SQEs,
//! submits them with one `io_uring_enter` and refills it as CQEs arrive, so
//! the kernel sees the caller's whole queue depth at once. (Single
//! operations use the syscall engine: see `FileBackend::submit`.)
//!
//! A thread the kernel refuses a ring (a ring limit, `io_uring_disabled`,
//! a seccomp filter) is marked and uses the syscall engine from then on.
// FFI: SQEs pointing at caller buffers, run to completion. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

use crate::{Error, ErrorKind};

/// One transfer of a batch: the memory, where it goes, and its outcome.
/// It borrows the caller's buffer for `'a` (exclusively for a read).
pub(super) struct Xfer<'a> {
    /// Descriptor (direct or buffered).
    fd: RawFd,
    /// Start of the caller's buffer.
    ptr: *mut u8,
    /// Bytes to move (at most `MAX_XFER`).
    len: usize,
    /// Device offset of the first byte.
    offset: u64,
    /// A write (the kernel only reads `ptr`) rather than a read.
    write: bool,
    /// `RWF_*` flags of a write.
    flags: libc::c_int,
    /// Goes through this thread's aligned (registered) arena: O_DIRECT
    /// with caller memory that is not aligned.
    bounce: bool,
    /// Where in the arena, once assigned (null: not assigned).
    slot: *mut u8,
    /// Bytes moved so far (short transfers continue from here).
    done: usize,
    /// Outcome once known.
    pub(super) res: Option<io::Result<()>>,
    _buf: std::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> Xfer<'a> {
    /// A read of `buf.len()` bytes (at most `MAX_XFER`) at `offset`.
    pub(super) fn read(fd: RawFd, buf: &'a mut [u8], offset: u64) -> Self {
        Self::new(fd, buf.as_mut_ptr(), buf.len(), offset, false, 0)
    }

    /// A write of `buf` (at most `MAX_XFER` bytes) at `offset` with
    /// `RWF_*` `flags`.
    pub(super) fn write(fd: RawFd, buf: &'a [u8], offset: u64, flags: libc::c_int) -> Self {
        // The kernel only reads through the pointer of a write.
        Self::new(fd, buf.as_ptr().cast_mut(), buf.len(), offset, true, flags)
    }

    /// Sends this transfer through the thread's aligned arena (the caller
    /// checked the alignment the descriptor needs is at most
    /// [`ARENA_ALIGN`]); one that finds no room in the arena is left
    /// without a result for the caller's single-operation path.
    pub(super) fn bounced(mut self) -> Self {
        self.bounce = true;
        self
    }

    fn new(
        fd: RawFd,
        ptr: *mut u8,
        len: usize,
        offset: u64,
        write: bool,
        flags: libc::c_int,
    ) -> Self {
        debug_assert!(len <= super::MAX_XFER);
        Self {
            fd,
            ptr,
            len,
            offset,
            write,
            flags,
            bounce: false,
            slot: std::ptr::null_mut(),
            done: 0,
            res: None,
            _buf: std::marker::PhantomData,
        }
    }

    /// The SQE for what remains of this transfer (`fixed`: the arena is a
    /// registered buffer, index 0).
    fn sqe(&self, token: u64, fixed: bool) -> squeue::Entry {
        // In bounds: `done < len` while the transfer is pending.
        let base = if self.bounce { self.slot } else { self.ptr };
        let p = base.wrapping_add(self.done);
        let n = xfer_len(self.len - self.done);
        let at = self.offset + self.done as u64;
        if self.bounce && fixed {
            return if self.write {
                opcode::WriteFixed::new(types::Fd(self.fd), p, n, 0)
                    .offset(at)
                    .rw_flags(self.flags)
                    .build()
                    .user_data(token)
            } else {
                opcode::ReadFixed::new(types::Fd(self.fd), p, n, 0)
                    .offset(at)
                    .build()
                    .user_data(token)
            };
        }
        if self.write {
            opcode::Write::new(types::Fd(self.fd), p, n)
                .offset(at)
                .rw_flags(self.flags)
                .build()
                .user_data(token)
        } else {
            opcode::Read::new(types::Fd(self.fd), p, n)
                .offset(at)
                .build()
                .user_data(token)
        }
    }

    /// Applies a CQE result; true if the transfer must be submitted again.
    fn finish(&mut self, res: i32) -> bool {
        if res < 0 {
            if matches!(-res, libc::EINTR | libc::EAGAIN) {
                return true;
            }
            self.res = Some(Err(io::Error::from_raw_os_error(-res)));
            return false;
        }
        if res == 0 && self.len > 0 {
            let offset = self.offset + self.done as u64;
            let kind = if self.write {
                ErrorKind::WriteZero { offset }
            } else {
                ErrorKind::ShortRead { offset }
            };
            self.res = Some(Err(Error::new(kind).into()));
            return false;
        }
        self.done += res as usize;
        if self.done < self.len {
            return true;
        }
        if self.bounce && !self.write {
            // SAFETY: `slot` holds `len` bytes the kernel just filled, in
            // the arena this thread owns; `ptr` is the caller's buffer of
            // `len` bytes, borrowed exclusively by this Xfer; they are
            // distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(self.slot, self.ptr, self.len) };
        }
        self.res = Some(Ok(()));
        false
    }
}

/// Alignment of the arena and of every slot in it.
pub(super) const ARENA_ALIGN: usize = 4096;
/// Bytes of this thread's arena: bounced transfers of one batch beyond it
/// take the single-operation path.
const ARENA_LEN: usize = 8 << 20;

/// A thread's aligned bounce arena for O_DIRECT batches, registered with
/// its ring when the kernel allows (READ_FIXED / WRITE_FIXED then skip
/// pinning the pages on every IO: where registered buffers pay).
struct Arena {
    buf: super::dio::AlignedBuf,
    fixed: bool,
}

impl Arena {
    fn new(ring: &IoUring) -> io::Result<Self> {
        let mut buf = super::dio::AlignedBuf::new(ARENA_LEN, ARENA_ALIGN)?;
        let iov = libc::iovec {
            iov_base: buf.as_mut_slice().as_mut_ptr().cast(),
            iov_len: ARENA_LEN,
        };
        // SAFETY: the iovec describes the arena's live allocation; the
        // arena is dropped after the ring (field order in ThreadRing), and
        // the ring only touches it for SQEs this thread waits for.
        let fixed = unsafe { ring.submitter().register_buffers(&[iov]) }.is_ok();
        Ok(Self { buf, fixed })
    }
}

/// Runs every transfer of `xs` whose `res` is `None` on this thread's ring,
/// keeping up to [`RING_ENTRIES`] in flight, and sets each one's `res`.
///
/// When the ring itself fails (it is then retired), the transfers still
/// without a result were never seen by the kernel; the caller runs them on
/// the single-operation path.
///
/// Each `Xfer` borrows its buffer for longer than this call, and the
/// caller owns the fds. This returns only once every SQE it pushed has been
/// reaped, or with the unreaped ones provably never consumed (then
/// `with_ring` drops the ring, so they are never submitted): the kernel
/// never touches a buffer after its borrow ends.
pub(super) fn run_batch(xs: &mut [Xfer<'_>]) {
    let _ = with_thread_ring(|tr| {
        let fixed = place_bounced(tr, xs);
        let ring = &mut tr.ring;
        let cap = ring.params().sq_entries() as usize;
        let mut pending: VecDeque<usize> = (0..xs.len())
            .filter(|&i| xs[i].res.is_none() && (!xs[i].bounce || !xs[i].slot.is_null()))
            .collect();
        // Pushed and not yet reaped.
        let mut out = 0usize;
        loop {
            while out < cap {
                let Some(i) = pending.pop_front() else { break };
                let sqe = xs[i].sqe(i as u64, fixed);
                // SAFETY: the SQE points into a buffer the Xfer borrows
                // for longer than this call and at an fd the caller owns;
                // we return only after reaping it or with it unconsumed.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    pending.push_front(i);
                    break;
                }
                out += 1;
            }
            if out == 0 {
                return Ok::<(), io::Error>(());
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    if ring.submission().len() == out {
                        // Nothing of ours reached the kernel: safe to give
                        // up (with_ring retires the ring).
                        return Err(e);
                    }
                    // Some are in flight: their buffers stay borrowed until
                    // their CQEs arrive, so keep waiting, after a pause.
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            for cqe in ring.completion() {
                let i = cqe.user_data() as usize;
                out -= 1;
                if xs[i].finish(cqe.result()) {
                    pending.push_back(i);
                }
            }
        }
    });
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

/// Gives each bounced transfer of `xs` a slot in the thread's arena
/// (creating it on first need) and copies writes in; returns whether the
/// arena is a registered buffer. Transfers without a slot keep a null one.
fn place_bounced(tr: &mut ThreadRing, xs: &mut [Xfer<'_>]) -> bool {
    if !xs.iter().any(|x| x.bounce && x.res.is_none()) {
        return false;
    }
    if tr.arena.is_none() {
        tr.arena = Arena::new(&tr.ring).ok();
    }
    let Some(a) = tr.arena.as_mut() else {
        return false;
    };
    let base = a.buf.as_mut_slice().as_mut_ptr();
    let mut used = 0usize;
    for x in xs.iter_mut().filter(|x| x.bounce && x.res.is_none()) {
        let need = x.len.div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
        if used + need > ARENA_LEN {
            continue;
        }
        x.slot = base.wrapping_add(used);
        used += need;
        if x.write {
            // SAFETY: `ptr` is the caller's `len` readable bytes (borrowed
            // by the Xfer); `slot` is `len` bytes of the arena, which this
            // thread owns and no IO is using (the ring is idle between
            // batches); distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(x.ptr, x.slot, x.len) };
        }
    }
    a.fixed
}

/// A thread's ring and its bounce arena; the ring is declared first so it
/// is dropped (and its registration with it) before the arena's memory.
struct ThreadRing {
    ring: IoUring,
    arena: Option<Arena>,
}

thread_local! {
    /// This thread's ring; `None` until first use or after it was retired.
    static RING: RefCell<Option<ThreadRing>> = const { RefCell::new(None) };
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

/// Entries per thread ring: the most SQEs one batch keeps in flight (a
/// single operation uses one).
const RING_ENTRIES: u32 = 64;

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
    with_thread_ring(|tr| f(&mut tr.ring))
}

/// Calls `f` with this thread's ring and arena, creating the ring first if
/// needed; a ring left with unconsumed SQEs is retired afterwards.
fn with_thread_ring<T>(f: impl FnOnce(&mut ThreadRing) -> io::Result<T>) -> io::Result<T> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(ThreadRing {
                ring: new_ring()?,
                arena: None,
            });
        }
        // Invariant: set just above.
        let tr = slot.as_mut().expect("ring initialised above");
        let r = f(tr);
        if ring_retired(&mut tr.ring) {
            *slot = None;
        }
        r
    })
}

/// A ring whose submission queue still holds an entry after a failed
/// `run_batch` must not be used again (that entry points at a dead buffer).
fn ring_retired(ring: &mut IoUring) -> bool {
    !ring.submission().is_empty()
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
