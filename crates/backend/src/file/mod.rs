//! `FileBackend`: regular files and block devices through io_uring.
//!
//! ```text
//!   thread A ── read_at ──► ring A (thread-local) ─┐
//!   thread B ── write_at ─► ring B (thread-local) ─┼─► fd_direct (O_DIRECT)  aligned requests
//!   thread C ── flush ────► ring C (thread-local) ─┘   fd_buffered           everything else
//! ```
//!
//! # One ring per thread, for batches
//!
//! Every thread that hands a `FileBackend` a batch gets its own io_uring
//! (created on first use, closed when the thread exits). Threads never
//! share a ring: no lock and no completion thread (whose wake-up would cost
//! a cross-core round trip per request). The rings are shared by every
//! `FileBackend` used on that thread (the file descriptor travels in the
//! SQE). A single synchronous operation (`read_at`, `write_at`, `flush`)
//! is a positioned syscall on either engine: one `io_uring_enter` would
//! only replace one `pread`, and measured slower (see `submit`).
//!
//! # Batches: queue depth from one thread
//!
//! [`Backend::read_batch`] / [`Backend::write_batch`] take the requests a
//! caller has in flight together (a worker that found several queued, the
//! write thread's sorted tree, the requests the engine gathered from a
//! frontend's queue: see [`Backend::batches`]) and put them all on the
//! calling thread's
//! ring: up to 64 SQEs per `io_uring_enter`, refilled as CQEs arrive, so
//! one thread keeps the device at that depth. The ring stays per thread
//! rather than one shared ring with a submission thread: a shared ring
//! needs a lock or a hand-off between submitters, and the hand-off's wake
//! costs more than the syscall a batch saves at queue depth 1. O_DIRECT
//! entries whose memory is not aligned go through the thread's 8 MiB
//! aligned arena, registered with the ring (`READ_FIXED`/`WRITE_FIXED`, no
//! page pinning per IO); what does not fit, or needs more than one SQE,
//! takes the single-operation path inside the batch. FUA stays per entry
//! (`RWF_DSYNC`, or one fdatasync after the batch for
//! [`FuaMode::WriteThenFlush`] before any FUA entry is reported).
//!
//! # Completion-driven entries
//!
//! [`Backend::submit_async`] (inline and adaptive's gathered requests) goes
//! to one ring per backend instead, shared by its submitters under a lock,
//! with a completion thread that runs each entry's callback as its CQE
//! arrives (`aio.rs`): the submitter never waits, so a frontend keeps the
//! device at its whole queue depth.
//!
//! Where io_uring is unavailable (an old kernel, `io_uring_disabled`, a
//! seccomp filter) the backend uses positioned syscalls (`pread`, `pwritev2`,
//! `fdatasync`) with the same semantics; [`FileBackend::io_engine`] says
//! which one is in use and [`FileOptions::engine`] can force either.
//! On a file that takes no nowait IO (tmpfs) io_uring runs each read and
//! write on an io-wq worker thread, a hop per request that `pread` on the
//! caller's thread does not pay: there, transfers under [`HOP_MIN`] take
//! the syscalls on either engine ([`FileBackend::takes_nowait`]). A
//! thread that the kernel refuses a ring later (e.g. a ring limit) uses the
//! syscalls for its own operations instead of failing them.
//!
//! # O_DIRECT and buffered IO
//!
//! The file is opened twice: buffered, and with `O_DIRECT` when the
//! filesystem or device allows it. A request whose offset and length are
//! multiples of the direct-IO alignment (`statx` `STATX_DIOALIGN`, or the
//! logical block size of a block device) goes to the `O_DIRECT` descriptor;
//! if only its memory is misaligned it is copied through an aligned bounce
//! buffer. Other requests go to the buffered descriptor. Mixing is coherent:
//! Linux writes back and invalidates cached pages over the range of every
//! direct IO. [`DirectIo::Never`] keeps everything buffered and
//! [`DirectIo::Required`] fails the open when `O_DIRECT` is refused and
//! rejects unaligned requests.
//!
//! # Durability and space
//!
//! flush → `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC` (fdatasync). FUA →
//! a write with `RWF_DSYNC` ([`FuaMode::Dsync`], `can_fua`) or a write then
//! fdatasync ([`FuaMode::WriteThenFlush`]). discard → `fallocate(PUNCH_HOLE |
//! KEEP_SIZE)` on files, `BLKDISCARD` on block devices, when
//! [`FileOptions::allow_discard`]; write-zeroes → `fallocate(ZERO_RANGE |
//! KEEP_SIZE)` (then `PUNCH_HOLE`) on files, `BLKZEROOUT` on block devices.
//! These three are plain syscalls: io_uring would hand them to a worker
//! thread anyway. When the filesystem or device answers `EOPNOTSUPP`, the
//! backend remembers it and falls back to the next method, ending with the
//! trait's zero-buffer emulation.
//!
//! Short transfers are continued where they stopped; `EINTR` and `EAGAIN`
//! (in a CQE or from `io_uring_enter`) are retried.
//!
//! # Layout
//!
//! As cloud-hypervisor's `block` crate keeps one module per engine:
//!
//! ```text
//!   options.rs   FileOptions, DirectIo, FuaMode, IoEngine, FileStats
//!   mod.rs       FileBackend: routing (direct/buffered), the Backend
//!                trait, and `submit`, the one point where an operation
//!                ([`Op`]) goes to an engine
//!   open.rs      FileBackend::open: claim or lock, size, O_DIRECT, engine
//!   zero.rs      discard and write_zeroes: the kernel's, else written zeroes
//!   batch.rs     read_batch / write_batch: routing each entry, one ring
//!                submission, FUA per entry
//!   aio.rs       submit_async: one shared ring per backend and a
//!                completion thread that runs each entry's callback
//!   uring.rs     the io_uring engine: one ring per thread, run_batch, arena
//!   sync.rs      the syscall engine: pread / pwritev2 / fdatasync
//!   blockdev.rs  block-device ioctls: size, logical block, discard, zeroout
//!   dio.rs       O_DIRECT support: statx alignment, aligned bounce buffers
//!   lock.rs      the advisory OFD lock a regular file is held under, a
//!                block device's exclusive claim, and the Claim a verb
//!                rewriting a file or device in place holds
//!   mapped.rs    a file on tmpfs lent through a shared mapping (Direct)
//!   sigbus.rs    a SIGBUS on that mapping turned into an IO error
//! ```

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::{
    check_range, AsyncOp, Backend, Caps, Direct, Error, ErrorKind, IoPath, ReadOp, WriteOp,
};

mod aio;
mod batch;
mod blockdev;
mod dio;
mod lock;
mod mapped;
mod open;
mod options;
mod sigbus;
mod sync;
mod uring;
mod zero;

use dio::{aligned_mem, with_bounce};
pub use lock::Claim;
pub use options::{DirectIo, FileOptions, FileStats, FuaMode, IoEngine};

/// A regular file or block device accessed with io_uring.
pub struct FileBackend {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    /// Offset, length and memory alignment for the O_DIRECT descriptor.
    dio_align: u64,
    /// Every descriptor takes nowait IO (see [`FileBackend::takes_nowait`]).
    nowait: bool,
    is_blockdev: bool,
    /// Bytes addressable; re-read by [`FileBackend::refresh_size`].
    size: AtomicU64,
    opts: FileOptions,
    engine: IoEngine,
    discard_ok: AtomicBool,
    zero_range_ok: AtomicBool,
    punch_ok: AtomicBool,
    stats: Arc<Counters>,
    /// The completion-driven ring, created by the first
    /// [`Backend::submit_async`] (`None`: the kernel refused it; entries
    /// then complete synchronously).
    aio: OnceLock<Option<Arc<aio::Aio>>>,
    /// The file's pages, lent to fused crypto: a file on tmpfs with the
    /// automatic engine (`mapped.rs`).
    mapped: Option<mapped::Mapped>,
}

#[derive(Default)]
struct Counters {
    direct_ops: AtomicU64,
    buffered_ops: AtomicU64,
    bounced_ops: AtomicU64,
    syncs: AtomicU64,
    dsync_writes: AtomicU64,
    discards: AtomicU64,
    zeroes: AtomicU64,
    uring_ops: AtomicU64,
    syscall_ops: AtomicU64,
    uring_batches: AtomicU64,
    reaped_ops: AtomicU64,
}

/// Largest single transfer handed to the kernel (io_uring lengths are u32).
const MAX_XFER: usize = 1 << 30;

/// Smallest transfer that goes to io_uring on a file that takes no nowait
/// IO (tmpfs). There every ring IO runs on an io-wq worker thread and its
/// completion wakes another; below this size those two hops cost more
/// than the copy they overlap, and `pread` / `pwritev2` on the submitting
/// thread wins (vhost-user-blk, 4 KiB reads at queue depth 32 x 2 queues
/// on tmpfs: 3.1x the ring in one A/B run). Larger transfers keep the
/// ring, where the worker's copy overlaps the submitter's work (1 MiB at
/// queue depth 8 measured 5-50% slower with `pread` in the same runs).
pub const HOP_MIN: usize = 128 << 10;

impl FileBackend {
    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True for a block device, false for a regular file.
    pub fn is_block_device(&self) -> bool {
        self.is_blockdev
    }

    /// The O_DIRECT alignment in bytes, or `None` when O_DIRECT is not in use.
    pub fn direct_alignment(&self) -> Option<u64> {
        self.direct.as_ref().map(|_| self.dio_align)
    }

    /// False when the file takes no nowait IO (tmpfs): io_uring would run
    /// each of its reads and writes on an io-wq worker thread, so
    /// transfers under [`HOP_MIN`] bytes use the syscalls on the calling
    /// thread even on the io_uring engine.
    pub fn takes_nowait(&self) -> bool {
        self.nowait
    }

    /// Whether a read or write of `len` bytes goes to a ring (a batch's or
    /// `submit_async`'s) rather than the syscalls on the calling thread:
    /// not empty, not over [`MAX_XFER`], and not under [`HOP_MIN`] on a
    /// file that takes no nowait IO ([`FileBackend::takes_nowait`]).
    fn ring_takes(&self, len: usize) -> bool {
        len > 0 && len <= MAX_XFER && (self.nowait || len >= HOP_MIN)
    }

    /// True when the file's pages are lent to fused crypto
    /// ([`Backend::direct`]): a file on tmpfs opened with the automatic
    /// engine. (A fault on the mapping later stops the lending; this still
    /// answers true.)
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// After a discard or write-zeroes (done or not): the mapping no
    /// longer knows those pages hold data.
    fn forget_pages(&self, offset: u64, len: u64) {
        if let Some(m) = &self.mapped {
            m.forget(offset, len.min(self.size().saturating_sub(offset)));
        }
    }

    /// The interface doing the IO.
    pub fn io_engine(&self) -> IoEngine {
        self.engine
    }

    /// Counters since open.
    pub fn stats(&self) -> FileStats {
        let c = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FileStats {
            direct_ops: l(&c.direct_ops),
            buffered_ops: l(&c.buffered_ops),
            bounced_ops: l(&c.bounced_ops),
            syncs: l(&c.syncs),
            dsync_writes: l(&c.dsync_writes),
            discards: l(&c.discards),
            zeroes: l(&c.zeroes),
            uring_ops: l(&c.uring_ops),
            syscall_ops: l(&c.syscall_ops),
            uring_batches: l(&c.uring_batches),
            reaped_ops: l(&c.reaped_ops),
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.opts.read_only {
            return Err(Error::new(ErrorKind::ReadOnly).into());
        }
        Ok(())
    }

    /// Picks the descriptor for a transfer: `Some(fd)` direct or buffered.
    fn route(&self, offset: u64, len: usize) -> io::Result<Route> {
        if let Some(d) = &self.direct {
            let a = self.dio_align;
            // The alignment is a power of two (statx / BLKSSZGET / 4096).
            if (offset | len as u64) & (a - 1) == 0 {
                return Ok(Route::Direct(d.as_raw_fd()));
            }
            if self.opts.direct == DirectIo::Required {
                return Err(Error::new(ErrorKind::Unaligned {
                    offset,
                    len: len as u64,
                    align: a,
                })
                .into());
            }
        }
        Ok(Route::Buffered(self.buffered.as_raw_fd()))
    }

    fn count_route(&self, r: &Route) {
        let c = match r {
            Route::Direct(_) => &self.stats.direct_ops,
            Route::Buffered(_) => &self.stats.buffered_ops,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The one dispatch point for a single operation: positioned syscalls
    /// on either engine, returning the bytes transferred (0 for a sync).
    ///
    /// A synchronous caller with one operation gains nothing from a ring:
    /// `io_uring_enter` replaces `pread` one for one, and on tmpfs the
    /// kernel hands ring reads to a worker thread (measured here: fio 4k
    /// QD1 on tmpfs, io_uring 35k IOPS against psync 115k; O_DIRECT on a
    /// virtio disk 8.4k against 9.4k). The ring is for batches
    /// ([`Backend::read_batch`] / [`Backend::write_batch`]), where one
    /// `io_uring_enter` carries many operations.
    fn submit(&self, op: Op<'_>) -> io::Result<usize> {
        self.stats.syscall_ops.fetch_add(1, Ordering::Relaxed);
        sync::run(op)
    }

    fn fdatasync(&self) -> io::Result<()> {
        let fd = self.buffered.as_raw_fd();
        self.submit(Op::Fdatasync { fd })?;
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes through `fd`, continuing short reads.
    fn read_fd(&self, fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let n = (buf.len() - done).min(MAX_XFER);
            let at = offset + done as u64;
            let got = self.submit(Op::Read {
                fd,
                buf: &mut buf[done..done + n],
                offset: at,
            })?;
            if got == 0 {
                return Err(Error::new(ErrorKind::ShortRead { offset: at }).into());
            }
            done += got;
        }
        Ok(())
    }

    /// Writes all of `buf` through `fd` (with `RWF_DSYNC` when `dsync`).
    fn write_fd(&self, fd: RawFd, buf: &[u8], offset: u64, dsync: bool) -> io::Result<()> {
        let flags = if dsync { libc::RWF_DSYNC } else { 0 };
        let mut done = 0usize;
        while done < buf.len() {
            let n = (buf.len() - done).min(MAX_XFER);
            let at = offset + done as u64;
            let put = self.submit(Op::Write {
                fd,
                buf: &buf[done..done + n],
                offset: at,
                flags,
            })?;
            if put == 0 {
                return Err(Error::new(ErrorKind::WriteZero { offset: at }).into());
            }
            done += put;
        }
        if dsync {
            self.stats.dsync_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        sync::fallocate(self.buffered.as_raw_fd(), mode, offset, len)
    }
}

/// One operation as both engines perform it; [`FileBackend::submit`]
/// hands it to the engine of the calling thread.
enum Op<'a> {
    /// Read into `buf` (at most [`MAX_XFER`] bytes) at `offset`.
    Read {
        fd: RawFd,
        buf: &'a mut [u8],
        offset: u64,
    },
    /// Write `buf` (at most [`MAX_XFER`] bytes) at `offset`, with
    /// `RWF_*` `flags`.
    Write {
        fd: RawFd,
        buf: &'a [u8],
        offset: u64,
        flags: libc::c_int,
    },
    /// fdatasync.
    Fdatasync { fd: RawFd },
}

/// Where a transfer goes.
enum Route {
    Direct(RawFd),
    Buffered(RawFd),
}

impl std::fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBackend")
            .field("path", &self.path)
            .field("size", &self.size())
            .field("block_device", &self.is_blockdev)
            .field("direct_alignment", &self.direct_alignment())
            .field("engine", &self.engine)
            .field("nowait", &self.nowait)
            .finish()
    }
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn refresh_size(&self) -> io::Result<u64> {
        FileBackend::refresh_size(self)
    }

    fn io_path(&self) -> IoPath {
        let s = self.stats();
        IoPath {
            engine: match self.engine {
                IoEngine::Uring => "io_uring",
                // `open` resolves Auto; Syscalls is the only other answer.
                _ => "pread/pwrite",
            }
            .into(),
            direct_align: self.direct_alignment(),
            counters: self
                .mapped
                .as_ref()
                .map(|m| ("lent", m.lent.load(Ordering::Relaxed)))
                .into_iter()
                .chain([
                    ("ring", s.uring_ops),
                    ("syscall", s.syscall_ops),
                    ("reaped", s.reaped_ops),
                    ("direct", s.direct_ops),
                    ("bounced", s.bounced_ops),
                    ("buffered", s.buffered_ops),
                ])
                .collect(),
        }
    }

    fn caps(&self) -> Caps {
        Caps {
            can_discard: self.discard_ok.load(Ordering::Relaxed),
            can_fua: self.opts.fua == FuaMode::Dsync,
            can_write_zeroes: true,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        let route = self.route(offset, buf.len())?;
        self.count_route(&route);
        match route {
            Route::Direct(fd) if !aligned_mem(buf.as_ptr(), self.dio_align) => {
                self.stats.bounced_ops.fetch_add(1, Ordering::Relaxed);
                with_bounce(buf.len(), self.dio_align as usize, |b| {
                    self.read_fd(fd, b, offset)?;
                    buf.copy_from_slice(b);
                    Ok(())
                })
            }
            Route::Direct(fd) | Route::Buffered(fd) => self.read_fd(fd, buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        self.check_writable()?;
        let dsync = fua && self.opts.fua == FuaMode::Dsync;
        let route = self.route(offset, buf.len())?;
        self.count_route(&route);
        match route {
            Route::Direct(fd) if !aligned_mem(buf.as_ptr(), self.dio_align) => {
                self.stats.bounced_ops.fetch_add(1, Ordering::Relaxed);
                with_bounce(buf.len(), self.dio_align as usize, |b| {
                    b.copy_from_slice(buf);
                    self.write_fd(fd, b, offset, dsync)
                })?
            }
            Route::Direct(fd) | Route::Buffered(fd) => self.write_fd(fd, buf, offset, dsync)?,
        }
        if fua && !dsync {
            self.fdatasync()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.fdatasync()
    }

    fn direct(&self) -> Option<&dyn Direct> {
        self.mapped.as_ref().map(|_| self as &dyn Direct)
    }

    fn batches(&self) -> bool {
        self.engine == IoEngine::Uring
    }

    fn read_batch(&self, ops: &mut [ReadOp<'_>]) -> Vec<io::Result<()>> {
        self.read_batch_ring(ops)
    }

    fn write_batch(&self, ops: &[WriteOp<'_>]) -> Vec<io::Result<()>> {
        self.write_batch_ring(ops)
    }

    fn completes_async(&self) -> bool {
        self.engine == IoEngine::Uring
    }

    fn submit_async(&self, ops: Vec<AsyncOp>) {
        if self.engine != IoEngine::Uring {
            return crate::run_async_inline(self, ops);
        }
        match self.aio.get_or_init(|| aio::Aio::start(self).ok()) {
            Some(a) => a.submit(self, ops),
            None => crate::run_async_inline(self, ops),
        }
    }

    fn reap(&self) -> usize {
        self.aio
            .get()
            .and_then(Option::as_ref)
            .map_or(0, |a| a.reap())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.discard_range(offset, len);
        self.forget_pages(offset, len);
        r
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.zero_range(offset, len);
        self.forget_pages(offset, len);
        r
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        // Entries in flight hold buffers the kernel writes: wait for them.
        if let Some(Some(a)) = self.aio.get() {
            a.shutdown();
        }
    }
}

/// Lends the mapping of a file on tmpfs; a range it cannot lend (past the
/// size at open, or after a fault stopped the lending) goes through a
/// buffer and the syscalls instead, as one piece.
impl Direct for FileBackend {
    fn read_with(&self, offset: u64, len: u64, f: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        if let Some(m) = &self.mapped {
            if let mapped::Lent::Done = m.read_with(&self.buffered, &self.path, offset, len, f)? {
                return Ok(());
            }
        }
        let mut buf = vec![0u8; len as usize];
        self.read_at(&mut buf, offset)?;
        f(0, &buf);
        Ok(())
    }

    fn write_with(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        f: &mut dyn FnMut(usize, &mut [u8]),
    ) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.check_writable()?;
        if let Some(m) = &self.mapped {
            // tmpfs: the store is as durable as a pwrite, FUA or not.
            if let mapped::Lent::Done = m.write_with(&self.path, offset, len, f)? {
                return Ok(());
            }
        }
        let mut buf = vec![0u8; len as usize];
        f(0, &mut buf);
        self.write_at(&buf, offset, fua)
    }
}
