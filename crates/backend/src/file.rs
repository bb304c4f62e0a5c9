//! `FileBackend`: regular files and block devices through io_uring.
//!
//! ```text
//!   thread A ── read_at ──► ring A (thread-local) ─┐
//!   thread B ── write_at ─► ring B (thread-local) ─┼─► fd_direct (O_DIRECT)  aligned requests
//!   thread C ── flush ────► ring C (thread-local) ─┘   fd_buffered           everything else
//! ```
//!
//! # One ring per thread
//!
//! Every thread that calls into a `FileBackend` gets its own small io_uring
//! (created on first use, closed when the thread exits) and runs each
//! operation to completion on it: push one SQE, `io_uring_enter` until its
//! CQE arrives. Threads never share a ring, so a synchronous `read_at` from N
//! threads is N requests in flight in the kernel, with no lock and no
//! completion thread (whose wake-up would cost a cross-core round trip per
//! request). The data path gets queue depth by calling from several threads.
//! The rings are shared by every `FileBackend` used on that thread (the file
//! descriptor travels in the SQE).
//!
//! Where io_uring is unavailable (an old kernel, `io_uring_disabled`, a
//! seccomp filter) the backend uses positioned syscalls (`pread`, `pwritev2`,
//! `fdatasync`) with the same semantics; [`FileBackend::io_engine`] says
//! which one is in use and [`FileOptions::engine`] can force either. A
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

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use io_uring::{opcode, squeue, types, IoUring};

use crate::{check_range, emulate_write_zeroes, Backend, Caps, Error, ErrorKind};

/// How to use `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// O_DIRECT for aligned requests when the file allows it, buffered
    /// otherwise.
    #[default]
    Auto,
    /// Always buffered (page cache).
    Never,
    /// O_DIRECT only: the open fails if refused, unaligned requests fail.
    Required,
}

/// How to make a FUA write durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FuaMode {
    /// One write with `RWF_DSYNC` (reported as `can_fua`).
    #[default]
    Dsync,
    /// A plain write followed by fdatasync (FUA emulated).
    WriteThenFlush,
}

/// Which system interface performs reads, writes and syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoEngine {
    /// One io_uring per calling thread.
    Uring,
    /// `pread` / `pwritev2` / `fdatasync`.
    Syscalls,
}

/// Options for [`FileBackend::open`].
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Open read-only; writes, discards and zeroing fail.
    pub read_only: bool,
    /// O_DIRECT policy.
    pub direct: DirectIo,
    /// FUA implementation.
    pub fua: FuaMode,
    /// Pass discards down as punch hole / BLKDISCARD; when false, discard
    /// is emulated by write-zeroes.
    pub allow_discard: bool,
    /// Fail the open if the file or device is smaller than this many bytes.
    pub min_size: u64,
    /// Force an IO engine; `None` = io_uring when the kernel allows it.
    pub engine: Option<IoEngine>,
    /// Claim a block device exclusively (`O_EXCL`, as mount does): the open
    /// fails with `EBUSY` while it is mounted or claimed by another opener.
    /// Ignored for regular files.
    pub exclusive: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            direct: DirectIo::Auto,
            fua: FuaMode::Dsync,
            allow_discard: true,
            min_size: 0,
            engine: None,
            exclusive: false,
        }
    }
}

/// Operation counters, for status output and tests ("did FUA reach the
/// disk?") without tracing syscalls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Read/write transfers issued on the O_DIRECT descriptor.
    pub direct_ops: u64,
    /// Read/write transfers issued on the buffered descriptor.
    pub buffered_ops: u64,
    /// Direct transfers copied through an aligned bounce buffer.
    pub bounced_ops: u64,
    /// fdatasync operations completed (flushes and emulated FUA).
    pub syncs: u64,
    /// Writes issued with `RWF_DSYNC` (native FUA).
    pub dsync_writes: u64,
    /// Native discards (punch hole / BLKDISCARD) completed.
    pub discards: u64,
    /// Native zeroing operations (fallocate / BLKZEROOUT) completed.
    pub zeroes: u64,
    /// Reads, writes and syncs submitted through io_uring.
    pub uring_ops: u64,
    /// Reads, writes and syncs done with plain syscalls.
    pub syscall_ops: u64,
}

/// A regular file or block device accessed with io_uring.
pub struct FileBackend {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    /// Offset, length and memory alignment for the O_DIRECT descriptor.
    dio_align: u64,
    is_blockdev: bool,
    size: u64,
    opts: FileOptions,
    engine: IoEngine,
    discard_ok: AtomicBool,
    zero_range_ok: AtomicBool,
    punch_ok: AtomicBool,
    stats: Counters,
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
}

// Block-device ioctls (linux/fs.h), not all exported by the libc crate.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Largest single transfer handed to the kernel (io_uring lengths are u32).
const MAX_XFER: usize = 1 << 30;

impl FileBackend {
    /// Opens `path` (a regular file or block device).
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let open_err = |e: io::Error| {
            Error::new(ErrorKind::Open {
                path: shown.clone(),
            })
            .with_source(e)
        };
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        let mut buffered = oo.open(&path).map_err(open_err)?;
        let meta = buffered.metadata().map_err(open_err)?;
        let is_blockdev = meta.file_type().is_block_device();
        if is_blockdev && opts.exclusive {
            // The claim lives as long as this descriptor; the O_DIRECT one
            // below is a plain open, which an exclusive claim allows.
            buffered = oo
                .clone()
                .custom_flags(libc::O_EXCL)
                .open(&path)
                .map_err(|e| {
                    open_err(e).with_context("exclusive open refused: mounted or in use")
                })?;
        }
        if !is_blockdev && !meta.is_file() {
            return Err(Error::new(ErrorKind::NotABlockDevice { path: shown }));
        }
        let size = if is_blockdev {
            blockdev_size(&buffered).map_err(open_err)?
        } else {
            meta.len()
        };
        if size < opts.min_size {
            return Err(Error::new(ErrorKind::TooSmall {
                path: shown,
                size,
                required: opts.min_size,
            }));
        }
        let direct = match opts.direct {
            DirectIo::Never => None,
            DirectIo::Auto => oo.clone().custom_flags(libc::O_DIRECT).open(&path).ok(),
            DirectIo::Required => Some(
                oo.clone()
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .map_err(|e| open_err(e).with_context("O_DIRECT required but refused"))?,
            ),
        };
        let dio_align = match &direct {
            Some(_) if is_blockdev => blockdev_logical_block(&buffered).unwrap_or(4096),
            Some(_) => statx_dio_align(&path).unwrap_or(4096),
            None => 0,
        };
        let engine = match opts.engine {
            Some(e) => e,
            None if with_ring(|_| Ok(())).is_ok() => IoEngine::Uring,
            None => IoEngine::Syscalls,
        };
        if engine == IoEngine::Uring {
            with_ring(|_| Ok(())).map_err(|e| open_err(e).with_context("io_uring unavailable"))?;
        }
        let discard_ok = opts.allow_discard && (!is_blockdev || blockdev_discards(&buffered));
        Ok(Self {
            path,
            buffered,
            direct,
            dio_align,
            is_blockdev,
            size,
            opts: opts.clone(),
            engine,
            discard_ok: AtomicBool::new(discard_ok),
            zero_range_ok: AtomicBool::new(true),
            punch_ok: AtomicBool::new(true),
            stats: Counters::default(),
        })
    }

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
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("Request at offset {offset} length {len} is not aligned to the {a}-byte O_DIRECT alignment"),
                ));
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

    /// The engine for an operation on this thread: io_uring unless this
    /// thread could not get a ring (then positioned syscalls, same result).
    fn engine_here(&self) -> IoEngine {
        if self.engine == IoEngine::Uring && thread_ring_ready() {
            self.stats.uring_ops.fetch_add(1, Ordering::Relaxed);
            IoEngine::Uring
        } else {
            self.stats.syscall_ops.fetch_add(1, Ordering::Relaxed);
            IoEngine::Syscalls
        }
    }

    fn fdatasync(&self) -> io::Result<()> {
        let fd = self.buffered.as_raw_fd();
        match self.engine_here() {
            IoEngine::Uring => {
                let sqe = opcode::Fsync::new(types::Fd(fd))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build();
                // SAFETY: an fsync SQE references no memory; the fd is owned
                // by `self`, borrowed until `run_sqe` returns after its CQE.
                retry_cqe(|| unsafe { with_ring(|r| run_sqe(r, &sqe)) })?;
            }
            IoEngine::Syscalls => {
                // SAFETY: plain syscall on an fd owned by self.
                cvt_retry(|| unsafe { libc::fdatasync(fd) as isize })?;
            }
        }
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes through `fd`, continuing short reads.
    fn read_fd(&self, fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let n = (buf.len() - done).min(MAX_XFER);
            let at = offset + done as u64;
            let ptr = buf[done..].as_mut_ptr();
            let got = match self.engine_here() {
                IoEngine::Uring => {
                    let sqe = opcode::Read::new(types::Fd(fd), ptr, n as u32)
                        .offset(at)
                        .build();
                    // SAFETY: the SQE points at `buf[done..done+n]`, which is
                    // exclusively borrowed by this function; `run_sqe` does not
                    // return until the kernel has posted this SQE's CQE (or
                    // provably never consumed it), so the buffer outlives the
                    // kernel's use of it. The fd is owned by `self`.
                    retry_cqe(|| unsafe { with_ring(|r| run_sqe(r, &sqe)) })?
                }
                IoEngine::Syscalls => {
                    // SAFETY: `ptr` is valid for `n` writable bytes (inside buf).
                    cvt_retry(|| unsafe { libc::pread(fd, ptr.cast(), n, at as i64) })?
                }
            };
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
            let ptr = buf[done..].as_ptr();
            let put = match self.engine_here() {
                IoEngine::Uring => {
                    let sqe = opcode::Write::new(types::Fd(fd), ptr, n as u32)
                        .offset(at)
                        .rw_flags(flags)
                        .build();
                    // SAFETY: the SQE points at `buf[done..done+n]`, borrowed
                    // by this function; `run_sqe` returns only after the CQE
                    // arrived (or the SQE was never consumed), so the buffer
                    // outlives the kernel's use of it. The fd is owned by self.
                    retry_cqe(|| unsafe { with_ring(|r| run_sqe(r, &sqe)) })?
                }
                IoEngine::Syscalls => {
                    let iov = libc::iovec {
                        iov_base: ptr as *mut _,
                        iov_len: n,
                    };
                    // SAFETY: the iovec describes `n` readable bytes of buf,
                    // borrowed for the duration of the call.
                    cvt_retry(|| unsafe { libc::pwritev2(fd, &iov, 1, at as i64, flags) })?
                }
            };
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
        let fd = self.buffered.as_raw_fd();
        // SAFETY: plain syscall on an fd owned by self; no memory passed.
        cvt_retry(|| unsafe { libc::fallocate(fd, mode, offset as i64, len as i64) as isize })
            .map(drop)
    }

    fn blk_ioctl(&self, req: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
        let range = [offset, len];
        let fd = self.buffered.as_raw_fd();
        // SAFETY: BLKDISCARD/BLKZEROOUT read a `u64[2]` that lives on this
        // stack frame for the whole (synchronous) call.
        cvt_retry(|| unsafe { libc::ioctl(fd, req as _, range.as_ptr()) as isize }).map(drop)
    }

    /// Block-device ranges must be logical-block aligned; returns the
    /// aligned inner range and the unaligned ends to be zeroed by writes.
    fn split_blk(&self, offset: u64, len: u64) -> (u64, u64) {
        let a = blockdev_logical_block(&self.buffered).unwrap_or(512);
        let start = offset.next_multiple_of(a);
        let end = (offset + len) / a * a;
        if start < end {
            (start, end)
        } else {
            (offset, offset)
        }
    }

    /// Zeroes the parts of `offset..offset+len` outside `inner` with writes.
    fn zero_edges(&self, offset: u64, len: u64, inner: (u64, u64)) -> io::Result<()> {
        if inner.0 == inner.1 {
            return emulate_write_zeroes(self, offset, len);
        }
        emulate_write_zeroes(self, offset, inner.0 - offset)?;
        emulate_write_zeroes(self, inner.1, offset + len - inner.1)
    }
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
            .field("size", &self.size)
            .field("block_device", &self.is_blockdev)
            .field("direct_alignment", &self.direct_alignment())
            .field("engine", &self.engine)
            .finish()
    }
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps {
            can_discard: self.discard_ok.load(Ordering::Relaxed),
            can_fua: self.opts.fua == FuaMode::Dsync,
            can_write_zeroes: true,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
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
        check_range(self.size, offset, buf.len() as u64)?;
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

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.check_writable()?;
        if len == 0 {
            return Ok(());
        }
        if self.discard_ok.load(Ordering::Relaxed) {
            let r = if self.is_blockdev {
                let inner = self.split_blk(offset, len);
                if inner.0 == inner.1 {
                    // Less than one logical block: nothing to discard; the
                    // trait promises zeroes, so zero it.
                    return self.write_zeroes(offset, len);
                }
                self.blk_ioctl(BLKDISCARD, inner.0, inner.1 - inner.0)
                    .and_then(|()| self.zero_edges(offset, len, inner))
            } else {
                self.fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
            };
            match r {
                Ok(()) => {
                    self.stats.discards.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if is_unsupported(&e) => self.discard_ok.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.check_writable()?;
        if len == 0 {
            return Ok(());
        }
        if self.is_blockdev {
            let inner = self.split_blk(offset, len);
            if inner.0 != inner.1 && self.zero_range_ok.load(Ordering::Relaxed) {
                match self.blk_ioctl(BLKZEROOUT, inner.0, inner.1 - inner.0) {
                    Ok(()) => {
                        self.stats.zeroes.fetch_add(1, Ordering::Relaxed);
                        return self.zero_edges(offset, len, inner);
                    }
                    Err(e) if is_unsupported(&e) => {
                        self.zero_range_ok.store(false, Ordering::Relaxed)
                    }
                    Err(e) => return Err(e),
                }
            }
            return emulate_write_zeroes(self, offset, len);
        }
        for (flag, ok) in [
            (libc::FALLOC_FL_ZERO_RANGE, &self.zero_range_ok),
            (libc::FALLOC_FL_PUNCH_HOLE, &self.punch_ok),
        ] {
            if !ok.load(Ordering::Relaxed) {
                continue;
            }
            match self.fallocate(flag | libc::FALLOC_FL_KEEP_SIZE, offset, len) {
                Ok(()) => {
                    self.stats.zeroes.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if is_unsupported(&e) => ok.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        emulate_write_zeroes(self, offset, len)
    }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS | libc::EINVAL)
    )
}

fn aligned_mem(p: *const u8, align: u64) -> bool {
    (p as usize) & (align.max(1) as usize - 1) == 0
}

/// Runs a syscall returning -1/errno, retrying EINTR and EAGAIN.
fn cvt_retry(mut f: impl FnMut() -> isize) -> io::Result<usize> {
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
fn thread_ring_ready() -> bool {
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

thread_local! {
    /// This thread's aligned bounce buffer for O_DIRECT with unaligned memory.
    static BOUNCE: RefCell<AlignedBuf> = const { RefCell::new(AlignedBuf::empty()) };
}

/// Bounce buffers kept per thread up to this size; larger ones are freed.
const BOUNCE_KEEP: usize = 4 << 20;

fn with_bounce<T>(
    len: usize,
    align: usize,
    f: impl FnOnce(&mut [u8]) -> io::Result<T>,
) -> io::Result<T> {
    BOUNCE.with(|cell| {
        let mut b = cell.borrow_mut();
        if b.len < len || b.align < align {
            *b = AlignedBuf::new(len, align.max(4096))?;
        }
        let r = f(&mut b.as_mut_slice()[..len]);
        if b.len > BOUNCE_KEEP {
            *b = AlignedBuf::empty();
        }
        r
    })
}

/// A heap buffer with a chosen alignment (zero-initialised).
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    align: usize,
}

impl AlignedBuf {
    const fn empty() -> Self {
        Self {
            ptr: std::ptr::null_mut(),
            len: 0,
            align: 1,
        }
    }

    fn new(len: usize, align: usize) -> io::Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "Bad bounce buffer layout"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "Cannot allocate a bounce buffer",
            ));
        }
        Ok(Self { ptr, len, align })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is a live allocation of `len` initialised bytes owned
        // by self, and `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated in `new` with exactly this layout.
            unsafe {
                std::alloc::dealloc(
                    self.ptr,
                    std::alloc::Layout::from_size_align_unchecked(self.len.max(1), self.align),
                )
            };
        }
    }
}

fn blockdev_size(f: &File) -> io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer, which is valid.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut size) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn blockdev_logical_block(f: &File) -> Option<u64> {
    let mut bs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int to the pointer, which is valid.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKSSZGET as _, &mut bs) };
    (r >= 0 && bs > 0).then_some(bs as u64)
}

/// True unless sysfs says the device cannot discard (unknown → try it).
fn blockdev_discards(f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = f.metadata() else { return true };
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let p = format!("/sys/dev/block/{major}:{minor}/queue/discard_max_bytes");
    match std::fs::read_to_string(p) {
        Ok(s) => s.trim().parse::<u64>().map_or(true, |n| n > 0),
        Err(_) => true,
    }
}

/// The O_DIRECT alignment of a regular file from `statx(STATX_DIOALIGN)`:
/// the larger of the memory and offset alignments, or None when unknown.
fn statx_dio_align(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out
    // pointer, both alive for the call.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_DIOALIGN, &mut st) };
    if r != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let a = u64::from(st.stx_dio_mem_align.max(st.stx_dio_offset_align));
    (a > 0 && a.is_power_of_two()).then_some(a)
}
