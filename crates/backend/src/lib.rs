//! Storage backends: where ciphertext lives.
//!
//! ```text
//!   datapath::Engine
//!        │  read_at / write_at(fua) / flush / discard / write_zeroes
//!        ▼
//!   dyn Backend ──┬── MemBackend    page-aligned anonymous memory (brd analog)
//!                 ├── FileBackend   regular files and block devices, io_uring
//!                 │                 (a file on tmpfs also lends its pages: mapped)
//!                 ├── RbdBackend    Ceph RBD images over librbd's aio (`rbd:POOL/IMAGE[@SNAP]`)
//!                 └── FaultBackend  wraps any backend: injected errors and delays
//!                                   (tests only: the `testing` feature)
//! ```
//!
//! # The contract
//!
//! A [`Backend`] is a byte-addressed device of fixed [`Backend::size`]. Every
//! operation but [`Backend::submit_async`] is synchronous, and all may be
//! called from many threads at once; the
//! data path gets parallelism by calling from several threads, or by
//! handing several independent requests to one call
//! ([`Backend::read_batch`] / [`Backend::write_batch`], which a backend with
//! a submission queue sends to the kernel together), never by relying on a
//! backend's internal queue. Every operation checks its range
//! with [`check_range`]: a request that does not lie inside `0..size` fails
//! with [`std::io::ErrorKind::InvalidInput`] and touches nothing. Concurrent
//! overlapping writes leave each byte with the value of one of the writers
//! (as a disk does); they never corrupt memory or other ranges.
//!
//! # Capabilities and emulation
//!
//! [`Caps`] tells what a backend does *natively*; everything is always
//! available, the flags only tell the cost (the model is nbdkit's
//! `can_fua`/`can_zero` with `NBDKIT_FUA_EMULATE`/`NBDKIT_ZERO_EMULATE`):
//!
//! | operation | native (`Caps` flag set) | emulation (flag clear) |
//! |-----------|--------------------------|------------------------|
//! | `write_at(.., fua = true)` | `can_fua`: e.g. `RWF_DSYNC` write | write, then [`Backend::flush`] ([`emulate_fua_write`]) |
//! | `write_zeroes` | `can_write_zeroes`: e.g. `FALLOC_FL_ZERO_RANGE`, `BLKZEROOUT`, memset | the provided method writes zero buffers in chunks of at most [`ZERO_CHUNK`] bytes |
//! | `discard` | `can_discard`: punch hole, `BLKDISCARD`, `MADV_DONTNEED` | the provided method calls `write_zeroes`, so the range still reads back zero |
//!
//! A backend that implements an operation natively overrides the provided
//! method and sets the flag. After `discard` the range reads back zero on
//! every backend in this crate except a block device whose own discard does
//! not zero (then the content is device-defined, as for `blkdiscard`); use
//! `write_zeroes` when zeroes are required. `write_zeroes` always leaves
//! zeroes.
//!
//! # Completion-driven IO
//!
//! [`Backend::submit_async`] takes reads and writes with owned buffers and
//! a callback per entry ([`AsyncOp`]), and returns once they are submitted.
//! A backend that answers [`Backend::completes_async`] (the file backend on
//! io_uring) runs each callback on its completion thread as that entry's IO
//! completes, in any order; [`on_completion_thread`] is true there. The
//! provided method runs the entries synchronously and calls each callback
//! before returning, so every backend takes the call.
//!
//! Errors are [`std::io::Error`]s so the data path can pass them on; those
//! raised by this crate carry an [`Error`] as their inner error.

// Unsafe code only in the FFI modules that allow it (file::{uring, sync,
// blockdev, dio, mapped, sigbus}, lend, mem and rbd::ffi), each block with
// a SAFETY note.
#![deny(unsafe_code)]

use std::io;

#[cfg(feature = "testing")]
mod fault;
mod file;
mod lend;
mod mem;
mod op;
mod page_alloc;
pub mod rbd;

#[cfg(feature = "testing")]
pub use fault::{FaultBackend, FaultRule, OpCounts, OpKinds, RuleId, Trigger};
pub use file::{Claim, DirectIo, FileBackend, FileOptions, FileStats, FuaMode, IoEngine, HOP_MIN};
pub use mem::MemBackend;
pub use op::OpKind;
pub use page_alloc::PageAlignLarge;
pub use rbd::RbdBackend;

/// What a backend can do natively; the rest is emulated (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Discard (TRIM / punch hole) is supported natively.
    pub can_discard: bool,
    /// Forced unit access writes are supported natively.
    pub can_fua: bool,
    /// Efficient zeroing is supported natively.
    pub can_write_zeroes: bool,
}

/// How a backend does its IO, as `ucrypt status` shows it: the interface,
/// and counters since open (names and values, in display order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoPath {
    /// The interface: `io_uring`, `pread/pwrite`, `librbd`, `memory`
    /// (empty: the backend does not say).
    pub engine: String,
    /// Direct IO: the O_DIRECT memory and offset alignment in bytes, when
    /// requests that meet it bypass the page cache.
    pub direct_align: Option<u64>,
    /// Counters since open, e.g. `("direct", 10)`.
    pub counters: Vec<(&'static str, u64)>,
}

/// A byte-addressed storage device.
///
/// Implementations must be safe to call concurrently from many threads.
pub trait Backend: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Native capabilities.
    fn caps(&self) -> Caps;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`; durable on return when `fua`.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;

    /// In-place access to the stored bytes, for backends that keep them in
    /// memory; `None` (the default) for the rest.
    fn direct(&self) -> Option<&dyn Direct> {
        None
    }

    /// True when [`Backend::read_batch`] / [`Backend::write_batch`] put a
    /// batch's entries in flight together (a submission queue), so a caller
    /// gains by gathering requests it has in flight; false (the default)
    /// when they run one after another.
    fn batches(&self) -> bool {
        false
    }

    /// How this backend does its IO and what it has done, for `status`
    /// (the default: nothing to say).
    fn io_path(&self) -> IoPath {
        IoPath::default()
    }

    /// Re-reads the device's size (a grown file, block device or image)
    /// and returns it, for a live `resize`; the default, for devices whose
    /// size cannot change under the daemon, returns [`Backend::size`].
    fn refresh_size(&self) -> io::Result<u64> {
        Ok(self.size())
    }

    /// Discards `len` bytes at `offset`.
    ///
    /// Provided: emulated by [`Backend::write_zeroes`], so the range reads
    /// back zero.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    /// Makes `len` bytes at `offset` read back as zero.
    ///
    /// Provided: emulated by writing zero buffers of at most [`ZERO_CHUNK`]
    /// bytes with [`Backend::write_at`].
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        emulate_write_zeroes(self, offset, len)
    }

    /// Reads every entry of `ops`; returns one result per entry, in order.
    ///
    /// The entries are independent requests the caller has in flight at
    /// once (e.g. the reads a worker found queued): a backend with a
    /// submission queue hands them to the kernel together, one system call
    /// for the batch. Each entry has exactly the semantics of
    /// [`Backend::read_at`], and entries may complete in any order.
    ///
    /// Provided: [`Backend::read_at`] on each entry in turn.
    fn read_batch(&self, ops: &mut [ReadOp<'_>]) -> Vec<io::Result<()>> {
        ops.iter_mut()
            .map(|o| self.read_at(o.buf, o.offset))
            .collect()
    }

    /// True when [`Backend::submit_async`] returns before the IO completes
    /// and calls each entry's callback from a completion thread; false (the
    /// default) when it completes every entry before returning.
    fn completes_async(&self) -> bool {
        false
    }

    /// Submits every entry of `ops`; each entry's `done` runs exactly once
    /// with its buffer and result: a read's buffer filled (all of it, or
    /// the result is an error), a write's buffer given back. Each entry has
    /// the semantics of [`Backend::read_at`] / [`Backend::write_at`] (a FUA
    /// write is durable before its `done` runs with `Ok`); entries are
    /// independent and complete in any order.
    ///
    /// A callback may run on the calling thread (always, for a backend that
    /// does not [`Backend::completes_async`]; for an entry refused at once,
    /// on one that does) or on the backend's completion thread, where it
    /// must not wait for another entry of this backend to complete. A
    /// callback that panics does not keep the others from running.
    ///
    /// Provided: [`run_async_inline`], each entry in turn on this thread.
    fn submit_async(&self, ops: Vec<AsyncOp>) {
        run_async_inline(self, ops)
    }

    /// Runs, on the calling thread, the callbacks of entries of
    /// [`Backend::submit_async`] whose IO has completed; returns how many.
    ///
    /// A submitter that is about to block until some of this backend's
    /// entries complete (a full queue) calls it first, so it reaps the
    /// completions itself, as fio does, instead of sleeping until the
    /// completion thread has run them and woken it. A backend may wait here
    /// for the first completion while entries are in flight (the file
    /// backend does, briefly); with nothing in flight it returns 0 at once.
    /// The callbacks run as entries refused at once do: not on a completion
    /// thread, so the caller must not hold what a callback takes. A
    /// callback's panic is reported by the panic hook and dropped, as on a
    /// completion thread (the caller's own request must still be
    /// submitted).
    ///
    /// Provided: nothing to reap (0).
    fn reap(&self) -> usize {
        0
    }

    /// Writes every entry of `ops`; returns one result per entry, in order.
    ///
    /// As [`Backend::read_batch`]: each entry has exactly the semantics of
    /// [`Backend::write_at`] (an entry with `fua` is durable when its result
    /// is `Ok`), entries may be carried out in any order, so the caller must
    /// not put two overlapping writes in one batch when it cares which one
    /// lands last.
    ///
    /// Provided: [`Backend::write_at`] on each entry in turn.
    fn write_batch(&self, ops: &[WriteOp<'_>]) -> Vec<io::Result<()>> {
        ops.iter()
            .map(|o| self.write_at(o.buf, o.offset, o.fua))
            .collect()
    }
}

/// One read of a [`Backend::read_batch`].
#[derive(Debug)]
pub struct ReadOp<'a> {
    /// Filled with the bytes at `offset`.
    pub buf: &'a mut [u8],
    /// Byte offset on the device.
    pub offset: u64,
}

/// One write of a [`Backend::write_batch`].
#[derive(Debug, Clone, Copy)]
pub struct WriteOp<'a> {
    /// The bytes to write.
    pub buf: &'a [u8],
    /// Byte offset on the device.
    pub offset: u64,
    /// Durable on success (forced unit access).
    pub fua: bool,
}

/// The callback of an [`AsyncOp`]: the entry's buffer and its result.
pub type AsyncDone = Box<dyn FnOnce(Vec<u8>, io::Result<()>) + Send>;

/// One entry of [`Backend::submit_async`].
pub struct AsyncOp {
    /// Read or write.
    pub kind: AsyncKind,
    /// Byte offset on the device.
    pub offset: u64,
    /// A read fills all of it; a write writes all of it.
    pub buf: Vec<u8>,
    /// Runs once the entry completed.
    pub done: AsyncDone,
}

/// What an [`AsyncOp`] does (an open set: e.g. flush or discard could join).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncKind {
    /// Fill the buffer with the bytes at the offset.
    Read,
    /// Write the buffer at the offset; durable on success when `fua`.
    Write {
        /// Forced unit access.
        fua: bool,
    },
}

impl std::fmt::Debug for AsyncOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncOp")
            .field("kind", &self.kind)
            .field("offset", &self.offset)
            .field("len", &self.buf.len())
            .finish()
    }
}

impl AsyncOp {
    /// Calls `done` with the buffer and `res`, returning its panic instead
    /// of unwinding (so a submitter can complete the other entries first).
    pub fn finish(self, res: io::Result<()>) -> Option<Box<dyn std::any::Any + Send>> {
        let (done, buf) = (self.done, self.buf);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || done(buf, res))).err()
    }
}

/// The synchronous [`Backend::submit_async`]: each entry with
/// [`Backend::read_at`] / [`Backend::write_at`], its callback right after;
/// the first callback panic is re-raised once every entry has completed.
pub fn run_async_inline<B: Backend + ?Sized>(b: &B, ops: Vec<AsyncOp>) {
    let mut panicked = None;
    for mut op in ops {
        let res = match op.kind {
            AsyncKind::Read => b.read_at(&mut op.buf, op.offset),
            AsyncKind::Write { fua } => b.write_at(&op.buf, op.offset, fua),
        };
        panicked = panicked.or(op.finish(res));
    }
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

thread_local! {
    static COMPLETION_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True on a backend's completion thread (where [`AsyncOp`] callbacks of a
/// backend that [`Backend::completes_async`] run): a callback there must
/// never block waiting for IO of that backend.
pub fn on_completion_thread() -> bool {
    COMPLETION_THREAD.with(|c| c.get())
}

/// Marks the calling thread as a completion thread (see
/// [`on_completion_thread`]): a backend that [`Backend::completes_async`]
/// calls it on each thread that runs [`AsyncOp`] callbacks.
pub fn mark_completion_thread() {
    COMPLETION_THREAD.with(|c| c.set(true));
}

/// In-place access to a backend's stored bytes (the ramdisk has it).
///
/// It lets the data path encrypt straight into the device and decrypt
/// straight out of it: one pass over the data where
/// [`Backend::read_at`]/[`Backend::write_at`] cost a copy plus a pass.
///
/// Both calls check the range as every operation does, then hand the range
/// to `f` as consecutive pieces, in order: `f(offset_in_request, bytes)`.
/// Piece boundaries fall on multiples of [`DIRECT_ALIGN`] bytes of device
/// offset, so a request aligned to a sector size of at most that is cut
/// only between sectors. While `f` runs on a piece, nobody writes those
/// bytes (and for `write_with` nobody reads them either), with the same
/// guarantees as `read_at`/`write_at`. `f` must not call the backend.
pub trait Direct {
    /// Lends `offset..offset+len` for reading.
    fn read_with(&self, offset: u64, len: u64, f: &mut dyn FnMut(usize, &[u8])) -> io::Result<()>;
    /// Lends `offset..offset+len` for writing; `f` must write every byte of
    /// each piece (what it finds there before is unspecified: the old
    /// contents in the ramdisk and a mapped file, zeroes where a mapped
    /// file lends a buffer instead). Durable on return when `fua`.
    fn write_with(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        f: &mut dyn FnMut(usize, &mut [u8]),
    ) -> io::Result<()>;
}

/// Pieces lent by [`Direct`] start and end on multiples of this many bytes
/// of device offset (besides the ends of the request).
pub const DIRECT_ALIGN: u64 = 4096;

// Shared and boxed backends are backends, so wrappers such as FaultBackend
// can hold an `Arc<dyn Backend>` or a `Box<dyn Backend>`.
macro_rules! forward_backend {
    ($($ptr:ident)::+) => {
        impl<B: Backend + ?Sized> Backend for $($ptr)::+<B> {
            fn size(&self) -> u64 {
                (**self).size()
            }
            fn caps(&self) -> Caps {
                (**self).caps()
            }
            fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
                (**self).read_at(buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
                (**self).write_at(buf, offset, fua)
            }
            fn flush(&self) -> io::Result<()> {
                (**self).flush()
            }
            fn direct(&self) -> Option<&dyn Direct> {
                (**self).direct()
            }
            fn batches(&self) -> bool {
                (**self).batches()
            }
            fn refresh_size(&self) -> io::Result<u64> {
                (**self).refresh_size()
            }
            fn io_path(&self) -> IoPath {
                (**self).io_path()
            }
            fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
                (**self).discard(offset, len)
            }
            fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
                (**self).write_zeroes(offset, len)
            }
            fn read_batch(&self, ops: &mut [ReadOp<'_>]) -> Vec<io::Result<()>> {
                (**self).read_batch(ops)
            }
            fn completes_async(&self) -> bool {
                (**self).completes_async()
            }
            fn submit_async(&self, ops: Vec<AsyncOp>) {
                (**self).submit_async(ops)
            }
            fn reap(&self) -> usize {
                (**self).reap()
            }
            fn write_batch(&self, ops: &[WriteOp<'_>]) -> Vec<io::Result<()>> {
                (**self).write_batch(ops)
            }
        }
    };
}
forward_backend!(std::sync::Arc);
forward_backend!(Box);

/// Opens a device named on the command line: `rbd:POOL/IMAGE[@SNAP]` as an
/// [`RbdBackend`] reaching its cluster as `ceph` says (`read_only`,
/// `allow_discard` and `min_size` of `opts` apply), anything else as a
/// [`FileBackend`] path.
pub fn open_device(
    path: &std::path::Path,
    opts: &FileOptions,
    ceph: &rbd::RbdConfig,
) -> Result<Box<dyn Backend>, Error> {
    match rbd::RbdSpec::of_path(path) {
        Some(spec) => {
            let o = rbd::RbdOptions {
                read_only: opts.read_only,
                allow_discard: opts.allow_discard,
                min_size: opts.min_size,
            };
            Ok(Box::new(RbdBackend::open_with(&spec?, &o, ceph)?))
        }
        None => Ok(Box::new(FileBackend::open(path, opts)?)),
    }
}

/// Whether a device named on the command line can be tried: an existing
/// path, or any `rbd:` name (only the cluster can say whether that image
/// exists; opening it says why not).
pub fn device_exists(path: &std::path::Path) -> bool {
    rbd::is_rbd(path) || path.exists()
}

/// Largest zero buffer the write-zeroes emulation writes at once (1 MiB).
pub const ZERO_CHUNK: usize = 1 << 20;

/// The write-zeroes emulation: zero buffers of at most [`ZERO_CHUNK`] bytes
/// written with [`Backend::write_at`] (not FUA).
pub fn emulate_write_zeroes<B: Backend + ?Sized>(b: &B, offset: u64, len: u64) -> io::Result<()> {
    check_range(b.size(), offset, len)?;
    let chunk = usize::try_from(len).unwrap_or(ZERO_CHUNK).min(ZERO_CHUNK);
    let zeroes = vec![0u8; chunk];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk as u64) as usize;
        b.write_at(&zeroes[..n], offset + done, false)?;
        done += n as u64;
    }
    Ok(())
}

/// The FUA emulation: a plain write followed by [`Backend::flush`].
pub fn emulate_fua_write<B: Backend + ?Sized>(b: &B, buf: &[u8], offset: u64) -> io::Result<()> {
    b.write_at(buf, offset, false)?;
    b.flush()
}

/// Checks that `len` bytes at `offset` lie inside a device of `size` bytes.
///
/// This is the one range check every backend performs before touching data.
pub fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::new(ErrorKind::OutOfRange { offset, len, size }).into()),
    }
}

/// An error raised by this crate; converted into [`std::io::Error`] at the
/// trait boundary (with a matching [`std::io::ErrorKind`]). The workspace's
/// shape (docs/ARCHITECTURE.md, "Errors"), except that the [`ErrorKind`]
/// is the message and `context` a note shown after it.
#[derive(Debug, thiserror::Error)]
#[error("{kind}{}", context.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
pub struct Error {
    kind: ErrorKind,
    context: Option<String>,
    #[source]
    source: Option<io::Error>,
}

/// What went wrong; stable for callers to match on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request does not lie inside the device.
    #[error("Request out of range: offset {offset} length {len} device size {size}")]
    OutOfRange {
        /// Byte offset requested.
        offset: u64,
        /// Length requested.
        len: u64,
        /// Device size.
        size: u64,
    },
    /// The backing file or device could not be opened or inspected.
    #[error("Cannot open backing device {path}")]
    Open {
        /// The path given.
        path: String,
    },
    /// Another open of the backing file holds a conflicting advisory lock
    /// (it is open read-write elsewhere, or we want to write while others
    /// read).
    #[error("Backing device {path} is in use (locked by {holder})")]
    Locked {
        /// The path given.
        path: String,
        /// Who holds it: `process PID` or `another process`.
        holder: String,
    },
    /// A block device claimed exclusively elsewhere: mounted, mapped
    /// (dm, a ucrypt daemon) or being rewritten by a header verb; the
    /// exclusive open (`O_EXCL`) was refused with `EBUSY`. cryptsetup's
    /// words.
    #[error("Cannot use device {path} which is in use (already mapped or mounted).")]
    InUse {
        /// The path given.
        path: String,
    },
    /// The backing file or device is smaller than required.
    #[error("Backing device {path} is too small: {size} bytes, at least {required} required")]
    TooSmall {
        /// The path given.
        path: String,
        /// Its size.
        size: u64,
        /// The minimum asked for.
        required: u64,
    },
    /// The path is neither a regular file nor a block device.
    #[error("Backing device {path} is not a regular file or block device")]
    NotABlockDevice {
        /// The path given.
        path: String,
    },
    /// A write or discard on a backend opened read-only.
    #[error("Backend is read-only")]
    ReadOnly,
    /// A memory mapping could not be created.
    #[error("Cannot allocate a {size}-byte ramdisk")]
    Alloc {
        /// Bytes asked for.
        size: u64,
    },
    /// The device returned fewer bytes than asked for before its end.
    #[error("Short read at offset {offset}: device ended")]
    ShortRead {
        /// Byte offset where the read stopped.
        offset: u64,
    },
    /// The device accepted no bytes of a write.
    #[error("Write made no progress at offset {offset}")]
    WriteZero {
        /// Byte offset where the write stopped.
        offset: u64,
    },
    /// With [`DirectIo::Required`], a request whose offset or length is
    /// not a multiple of the O_DIRECT alignment.
    #[error("Request at offset {offset} length {len} is not aligned to the {align}-byte O_DIRECT alignment")]
    Unaligned {
        /// Byte offset requested.
        offset: u64,
        /// Length requested.
        len: u64,
        /// The O_DIRECT alignment in bytes.
        align: u64,
    },
    /// An error injected by `FaultBackend` (the `testing` feature).
    #[cfg(feature = "testing")]
    #[error("Injected {} fault at offset {offset} length {len}", op.name())]
    Injected {
        /// Operation that failed.
        op: OpKind,
        /// Its byte offset.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// io_uring was required ([`IoEngine::Uring`]) but the kernel refuses
    /// it to this process (not built in, disabled by sysctl or seccomp, no
    /// memory for a ring); the source carries the errno.
    #[error("Cannot open backing device {path} (io_uring unavailable)")]
    IoUringUnavailable {
        /// The path given.
        path: String,
    },
    /// An operation on an open device failed (the source says why).
    #[error("IO error on backing device {path}")]
    Io {
        /// The device given.
        path: String,
    },
    /// A kernel feature this backend needs is missing.
    #[error("Not supported by this kernel or device: {0}")]
    Unsupported(&'static str),
}

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind) -> Self {
        Self {
            kind,
            context: None,
            source: None,
        }
    }

    /// Adds the OS error that caused it.
    pub fn with_source(mut self, source: io::Error) -> Self {
        self.source = Some(source);
        self
    }

    /// Adds a short human-readable context.
    pub fn with_context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    /// The stable kind.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The `ErrorKind` of a backend error carried inside an [`io::Error`].
    pub fn kind_of(err: &io::Error) -> Option<&ErrorKind> {
        err.get_ref()
            .and_then(|e| e.downcast_ref::<Error>())
            .map(Error::kind)
    }

    fn io_kind(&self) -> io::ErrorKind {
        match &self.kind {
            ErrorKind::OutOfRange { .. } | ErrorKind::Unaligned { .. } => {
                io::ErrorKind::InvalidInput
            }
            ErrorKind::TooSmall { .. } | ErrorKind::NotABlockDevice { .. } => {
                io::ErrorKind::InvalidInput
            }
            ErrorKind::ReadOnly => io::ErrorKind::PermissionDenied,
            ErrorKind::Locked { .. } | ErrorKind::InUse { .. } => io::ErrorKind::ResourceBusy,
            ErrorKind::Alloc { .. } => io::ErrorKind::OutOfMemory,
            ErrorKind::ShortRead { .. } => io::ErrorKind::UnexpectedEof,
            ErrorKind::WriteZero { .. } => io::ErrorKind::WriteZero,
            ErrorKind::Unsupported(_) | ErrorKind::IoUringUnavailable { .. } => {
                io::ErrorKind::Unsupported
            }
            ErrorKind::Open { .. } | ErrorKind::Io { .. } => match &self.source {
                Some(s) => s.kind(),
                None => io::ErrorKind::Other,
            },
            #[cfg(feature = "testing")]
            ErrorKind::Injected { .. } => match &self.source {
                Some(s) => s.kind(),
                None => io::ErrorKind::Other,
            },
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        // Keep the OS errno visible to callers that map errors to errno
        // (NBD, ublk) while the message names what failed.
        io::Error::new(e.io_kind(), e)
    }
}

/// The raw OS errno behind an error from this crate, if any: the errno of an
/// [`io::Error`] itself, or of the source inside a crate [`Error`]. Frontends
/// use it to answer with the right errno.
pub fn raw_os_error(err: &io::Error) -> Option<i32> {
    err.raw_os_error().or_else(|| {
        err.get_ref()
            .and_then(|e| e.downcast_ref::<Error>())
            .and_then(|e| e.source.as_ref())
            .and_then(io::Error::raw_os_error)
    })
}
