//! The completion-driven io_uring engine ([`Backend::submit_async`]): one
//! ring per `FileBackend`, shared by its submitters, and one completion
//! thread that reaps CQEs and runs each entry's callback as its IO
//! completes.
//!
//! ```text
//!   submitter A ─┐ push SQEs + io_uring_enter       ┌─► done(buf, res)  (entry 3)
//!   submitter B ─┴─ (under the SQ lock, no wait) ─► ring ─► completion thread
//!                                                          └─► done(buf, res)  (entry 1)
//! ```
//!
//! Submitters never wait for IO: a frontend keeps reading requests while
//! earlier ones are in flight, so the device sees the caller's whole queue
//! depth instead of one batch at a time. Each entry owns its buffer (and,
//! for O_DIRECT with unaligned memory, an aligned bounce buffer) until its
//! callback runs; the ring holds its own duplicates of the backend's
//! descriptors, so a resubmitted short transfer never meets a closed or
//! reused descriptor. Short transfers are continued, `EINTR`/`EAGAIN`
//! retried; FUA is `RWF_DSYNC` or, for [`FuaMode::WriteThenFlush`], an
//! fdatasync on the completion thread before the callback.
//!
//! A submitter about to block until entries complete (a full queue) may
//! reap instead ([`Aio::reap`], the backend's [`Backend::reap`]): it waits
//! on the ring itself, briefly, and runs the callbacks of the CQEs it finds
//! on its own thread, so the IO it waits for releases it without a wake-up
//! by the completion thread. Whoever reads the CQ holds the CQ lock while
//! it copies the CQEs out.
//!
//! The backend's `Drop` stops the thread once every entry has completed
//! (joining it, unless the drop runs on that thread: the last reference
//! can go with a callback).
// FFI: SQEs pointing at buffers the entries own until their CQE. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use io_uring::{opcode, squeue, types, IoUring};

use super::dio::{aligned_mem, AlignedBuf};
use super::{sync, Counters, FileBackend, FuaMode, Op, Route};
use crate::{check_range, AsyncKind, AsyncOp, Backend, Error, ErrorKind};

/// SQ entries of the ring (the CQ gets four times as many; the kernel
/// keeps overflowing CQEs, so more entries than this may be in flight).
const SQ_ENTRIES: u32 = 256;
/// The user data of the NOP that wakes the completion thread to stop.
const WAKE: u64 = u64::MAX;
/// `IORING_ENTER_GETEVENTS`.
const GETEVENTS: u32 = 1;
/// `IORING_ENTER_EXT_ARG`.
const EXT_ARG: u32 = 1 << 3;
/// Longest a reaping submitter waits on the ring for a first CQE before it
/// goes back to its own wait (a queue slot may come from elsewhere).
const REAP_WAIT_NS: u32 = 1_000_000;
/// While submitters reap, the completion thread wakes at least this often
/// to run the CQEs they left (a submitter that stopped reaping). As long
/// as [`REAP_WAIT_NS`]: at 250 us its wakes cost ~3x the context switches
/// per IO (4k QD32 random reads on a virtio disk: 0.17 against 0.06; fio
/// 0.03) and 10-17% more CPU per IO (the engine raw over the file, the former filebench, `perf stat`, medians
/// of 3 interleaved rounds). The price: CQEs a submitter leaves when it
/// stops reaping wait up to this long.
const STANDBY_NS: u32 = 1_000_000;

/// One backend's ring, its entries in flight and its completion thread.
pub(super) struct Aio {
    ring: IoUring,
    /// Serialises pushing SQEs and submitting them.
    sq: Mutex<()>,
    /// Serialises reading the CQ (the completion thread, reapers).
    cq: Mutex<()>,
    /// Calls of [`Aio::reap`] that found entries in flight: while it
    /// moves, the completion thread stands back.
    reaps: AtomicU64,
    slab: Mutex<Slab>,
    /// Wakes the completion thread parked with nothing in flight.
    work: Condvar,
    stop: AtomicBool,
    /// Duplicates of the backend's descriptors (see the module doc).
    buffered: File,
    direct: Option<File>,
    fua: FuaMode,
    stats: Arc<Counters>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Entries in flight, indexed by their SQE's user data.
#[derive(Default)]
struct Slab {
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
    live: usize,
}

impl Slab {
    fn insert(&mut self, e: Entry) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(e);
                i
            }
            None => {
                self.entries.push(Some(e));
                self.entries.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) -> Option<Entry> {
        let e = self.entries.get_mut(i)?.take()?;
        self.free.push(i);
        self.live -= 1;
        Some(e)
    }
}

/// One entry in flight.
struct Entry {
    op: AsyncOp,
    fd: RawFd,
    /// `RWF_*` flags of a write.
    flags: libc::c_int,
    /// FUA emulated: fdatasync after the write, before the callback.
    flush_after: bool,
    /// Aligned copy for O_DIRECT when the buffer's memory is not aligned.
    bounce: Option<AlignedBuf>,
    /// Bytes moved so far.
    moved: usize,
}

impl Entry {
    fn write(&self) -> bool {
        matches!(self.op.kind, AsyncKind::Write { .. })
    }

    /// The SQE for what remains of the transfer.
    fn sqe(&mut self, token: u64) -> squeue::Entry {
        let len = self.op.buf.len();
        let base = match &mut self.bounce {
            Some(b) => b.as_mut_slice().as_mut_ptr(),
            None => self.op.buf.as_mut_ptr(),
        };
        // In bounds: `moved < len` while the entry is pending.
        let p = base.wrapping_add(self.moved);
        let n = (len - self.moved) as u32;
        let at = self.op.offset + self.moved as u64;
        let fd = types::Fd(self.fd);
        let sqe = if self.write() {
            opcode::Write::new(fd, p, n)
                .offset(at)
                .rw_flags(self.flags)
                .build()
        } else {
            opcode::Read::new(fd, p, n).offset(at).build()
        };
        sqe.user_data(token)
    }

    /// Applies a CQE result: `None` when the rest must be submitted again.
    fn apply(&mut self, res: i32) -> Option<io::Result<()>> {
        if res < 0 {
            if matches!(-res, libc::EINTR | libc::EAGAIN) {
                return None;
            }
            return Some(Err(io::Error::from_raw_os_error(-res)));
        }
        let offset = self.op.offset + self.moved as u64;
        if res == 0 {
            let kind = if self.write() {
                ErrorKind::WriteZero { offset }
            } else {
                ErrorKind::ShortRead { offset }
            };
            return Some(Err(Error::new(kind).into()));
        }
        self.moved += res as usize;
        (self.moved >= self.op.buf.len()).then_some(Ok(()))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Aio {
    /// Creates the ring and starts its completion thread.
    pub(super) fn start(fb: &FileBackend) -> io::Result<Arc<Self>> {
        let ring = IoUring::builder()
            .setup_cqsize(SQ_ENTRIES * 4)
            .build(SQ_ENTRIES)
            .or_else(|_| IoUring::new(SQ_ENTRIES))?;
        let aio = Arc::new(Self {
            ring,
            sq: Mutex::new(()),
            cq: Mutex::new(()),
            reaps: AtomicU64::new(0),
            slab: Mutex::new(Slab::default()),
            work: Condvar::new(),
            stop: AtomicBool::new(false),
            buffered: fb.buffered.try_clone()?,
            direct: fb.direct.as_ref().map(File::try_clone).transpose()?,
            fua: fb.opts.fua,
            stats: fb.stats.clone(),
            thread: Mutex::new(None),
        });
        let a = aio.clone();
        let h = std::thread::Builder::new()
            .name("ucrypt-aio".into())
            .spawn(move || a.completions())?;
        *lock(&aio.thread) = Some(h);
        Ok(aio)
    }

    /// [`Backend::submit_async`] on this ring. Entries the ring cannot take
    /// (refused ranges, empty or huge transfers, no memory for a bounce
    /// buffer) or should not (under [`HOP_MIN`](super::HOP_MIN) on a file without nowait
    /// IO) complete on the calling thread.
    pub(super) fn submit(&self, fb: &FileBackend, ops: Vec<AsyncOp>) {
        let mut sqes = Vec::with_capacity(ops.len());
        let mut inline = Vec::new();
        let mut entries = Vec::with_capacity(ops.len());
        for op in ops {
            match self.entry(fb, op) {
                Ok(Ok(e)) => entries.push(e),
                Ok(Err(op)) => inline.push((op, None)),
                Err((op, e)) => inline.push((op, Some(e))),
            }
        }
        if !entries.is_empty() {
            let mut slab = lock(&self.slab);
            if slab.live == 0 {
                self.work.notify_one();
            }
            for e in entries {
                let i = slab.insert(e);
                // Invariant: inserted just above.
                let e = slab.entries[i].as_mut().expect("entry just inserted");
                sqes.push(e.sqe(i as u64));
            }
            drop(slab);
            fb.stats
                .uring_ops
                .fetch_add(sqes.len() as u64, Ordering::Relaxed);
            fb.stats.uring_batches.fetch_add(1, Ordering::Relaxed);
            self.push(&sqes);
        }
        let mut panicked = None;
        for (mut op, err) in inline {
            let res = match err {
                Some(e) => Err(e),
                None => match op.kind {
                    AsyncKind::Read => fb.read_at(&mut op.buf, op.offset),
                    AsyncKind::Write { fua } => fb.write_at(&op.buf, op.offset, fua),
                },
            };
            panicked = panicked.or(op.finish(res));
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    }

    /// Routes one operation: `Ok(Ok(entry))` for the ring, `Ok(Err(op))`
    /// for the synchronous path, `Err` when it is refused.
    #[allow(clippy::type_complexity)]
    fn entry(
        &self,
        fb: &FileBackend,
        op: AsyncOp,
    ) -> Result<Result<Entry, AsyncOp>, (AsyncOp, io::Error)> {
        let len = op.buf.len();
        let fua = match op.kind {
            AsyncKind::Read => None,
            AsyncKind::Write { fua } => Some(fua),
        };
        let checked = check_range(fb.size(), op.offset, len as u64)
            .and_then(|()| match fua {
                Some(_) => fb.check_writable(),
                None => Ok(()),
            })
            .and_then(|()| fb.route(op.offset, len));
        let route = match checked {
            Ok(r) => r,
            Err(e) => return Err((op, e)),
        };
        if !fb.ring_takes(len) {
            return Ok(Err(op));
        }
        fb.count_route(&route);
        let (fd, direct) = match (&route, &self.direct) {
            (Route::Direct(_), Some(d)) => (d.as_raw_fd(), true),
            _ => (self.buffered.as_raw_fd(), false),
        };
        let mut bounce = None;
        if direct && !aligned_mem(op.buf.as_ptr(), fb.dio_align) {
            // Page-aligned, as the batch arena and the single path's
            // bounce are: a 4 KiB IO then spans one page, not two.
            let align = (fb.dio_align as usize).max(super::uring::ARENA_ALIGN);
            let Ok(mut b) = AlignedBuf::new(len, align) else {
                return Ok(Err(op));
            };
            if fua.is_some() {
                b.as_mut_slice().copy_from_slice(&op.buf);
            }
            fb.stats.bounced_ops.fetch_add(1, Ordering::Relaxed);
            bounce = Some(b);
        }
        let dsync = fua == Some(true) && self.fua == FuaMode::Dsync;
        Ok(Ok(Entry {
            op,
            fd,
            flags: if dsync { libc::RWF_DSYNC } else { 0 },
            flush_after: fua == Some(true) && !dsync,
            bounce,
            moved: 0,
        }))
    }

    /// Pushes `sqes` and submits them (never waits for completions).
    ///
    /// A submission the kernel refuses for a passing reason (`EINTR`,
    /// `EAGAIN`, `EBUSY` while the completion queue overflows) is retried;
    /// the completion thread keeps reaping meanwhile.
    fn push(&self, sqes: &[squeue::Entry]) {
        let _g = lock(&self.sq);
        for sqe in sqes {
            loop {
                // SAFETY: the SQE points into a buffer its entry owns until
                // the completion thread has reaped its CQE, at a descriptor
                // this ring owns; the SQ lock makes us the only pusher.
                if unsafe { self.ring.submission_shared().push(sqe) }.is_ok() {
                    break;
                }
                self.enter_submit();
            }
        }
        self.enter_submit();
    }

    /// Submits what the SQ holds; the caller holds the SQ lock.
    fn enter_submit(&self) {
        loop {
            match self.ring.submit() {
                Ok(_) => return,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR)) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                // Anything else leaves the entries queued: they go with the
                // next submission (the ring itself is sound).
                Err(_) => return,
            }
        }
    }

    /// Copies the CQEs the CQ holds into `cqes` (under the CQ lock).
    fn drain(&self, cqes: &mut Vec<(u64, i32)>) {
        let _g = lock(&self.cq);
        // SAFETY: the CQ lock makes this thread the only one reading the CQ.
        let cq = unsafe { self.ring.completion_shared() };
        cqes.extend(cq.map(|c| (c.user_data(), c.result())));
    }

    /// [`Backend::reap`]: runs the callbacks of the entries whose CQEs are
    /// in the CQ on this thread; with none there yet and entries in
    /// flight, first waits on the ring for one (at most
    /// [`REAP_WAIT_NS`]). Returns the entries completed.
    pub(super) fn reap(&self) -> usize {
        if lock(&self.slab).live == 0 {
            return 0;
        }
        self.reaps.fetch_add(1, Ordering::AcqRel);
        let mut cqes = Vec::new();
        self.drain(&mut cqes);
        if cqes.is_empty() {
            let ts = types::Timespec::new().nsec(REAP_WAIT_NS);
            let args = types::SubmitArgs::new().timespec(&ts);
            // SAFETY: GETEVENTS with EXT_ARG and a getevents argument that
            // lives across the call; nothing is submitted. An error (the
            // timeout's ETIME, EINTR) only means there is nothing to reap.
            let _ = unsafe {
                self.ring
                    .submitter()
                    .enter(0, 1, GETEVENTS | EXT_ARG, Some(&args))
            };
            self.drain(&mut cqes);
        }
        let mut n = 0;
        for (token, res) in cqes {
            if token != WAKE && self.complete(token as usize, res) {
                n += 1;
            }
        }
        self.stats.reaped_ops.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// The completion thread: waits for CQEs, runs each finished entry's
    /// callback, resubmits short transfers; exits once stopped and idle.
    fn completions(&self) {
        crate::mark_completion_thread();
        let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(SQ_ENTRIES as usize);
        let mut seen = 0;
        loop {
            {
                // Nothing in flight: park in user space rather than in
                // io_uring_enter, so an exiting process never waits for
                // this thread's ring (its files, and their lock, go at
                // once).
                let mut slab = lock(&self.slab);
                while slab.live == 0 {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    slab = self.work.wait(slab).unwrap_or_else(|e| e.into_inner());
                }
            }
            let reaps = self.reaps.load(Ordering::Acquire);
            let r = if reaps != seen {
                // Submitters reap: stand back (wake for a full CQ, or
                // after STANDBY_NS to run what they left) so a CQE wakes
                // one thread, not two.
                seen = reaps;
                let ts = types::Timespec::new().nsec(STANDBY_NS);
                let args = types::SubmitArgs::new().timespec(&ts);
                // SAFETY: GETEVENTS with EXT_ARG and a getevents argument
                // that lives across the call; nothing is submitted.
                unsafe {
                    self.ring
                        .submitter()
                        .enter(0, SQ_ENTRIES, GETEVENTS | EXT_ARG, Some(&args))
                }
            } else {
                // SAFETY: GETEVENTS only (nothing submitted, no argument):
                // waits for one CQE.
                unsafe {
                    self.ring
                        .submitter()
                        .enter::<libc::sigset_t>(0, 1, GETEVENTS, None)
                }
            };
            if let Err(e) = r {
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ETIME)
                ) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.drain(&mut cqes);
            for (token, res) in cqes.drain(..) {
                if token != WAKE {
                    self.complete(token as usize, res);
                }
            }
        }
    }

    /// Handles the CQE of entry `i`: true when the entry completed (its
    /// callback ran), false when the rest of it was submitted again.
    fn complete(&self, i: usize, res: i32) -> bool {
        let mut slab = lock(&self.slab);
        let Some(Some(e)) = slab.entries.get_mut(i) else {
            return false;
        };
        let Some(outcome) = e.apply(res) else {
            let sqe = e.sqe(i as u64);
            drop(slab);
            self.push(&[sqe]);
            return false;
        };
        // Invariant: found just above.
        let mut e = slab.remove(i).expect("entry in flight");
        drop(slab);
        let outcome = outcome.and_then(|()| self.settle(&mut e));
        // A panicking callback has been reported by the panic hook; it
        // must not take the completion thread (and every entry) down.
        drop(e.op.finish(outcome));
        true
    }

    /// What a completed transfer still needs: a bounced read copied out,
    /// an emulated FUA write's fdatasync.
    fn settle(&self, e: &mut Entry) -> io::Result<()> {
        let write = e.write();
        if let (Some(b), false) = (&mut e.bounce, write) {
            e.op.buf.copy_from_slice(b.as_mut_slice());
        }
        if e.flags & libc::RWF_DSYNC != 0 {
            self.stats.dsync_writes.fetch_add(1, Ordering::Relaxed);
        }
        if e.flush_after {
            sync::run(Op::Fdatasync {
                fd: self.buffered.as_raw_fd(),
            })?;
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stops the completion thread once every entry has completed; joins
    /// it unless called from it.
    pub(super) fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        drop(lock(&self.slab));
        self.work.notify_all();
        let nop = opcode::Nop::new().build().user_data(WAKE);
        self.push(&[nop]);
        let h = lock(&self.thread).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}
