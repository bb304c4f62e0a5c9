//! What a caller chooses when opening a [`super::FileBackend`] (O_DIRECT
//! policy, FUA method, IO engine, discards) and the counters it reports.

/// How to use `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
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
#[non_exhaustive]
pub enum FuaMode {
    /// One write with `RWF_DSYNC` (reported as `can_fua`).
    #[default]
    Dsync,
    /// A plain write followed by fdatasync (FUA emulated).
    WriteThenFlush,
}

/// Which system interface performs reads, writes and syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoEngine {
    /// Batches through one io_uring per calling thread (single operations
    /// are positioned syscalls, which are faster for them).
    Uring,
    /// `pread` / `pwritev2` / `fdatasync`.
    Syscalls,
    /// io_uring when the kernel allows it, the syscalls otherwise (the
    /// same as leaving [`FileOptions::engine`] `None`). Per file, io_uring
    /// then carries only what pays: on a file that takes no nowait IO
    /// (tmpfs, up to at least Linux 6.18; probed at open with a
    /// `RWF_NOWAIT` read) transfers under [`crate::HOP_MIN`] use the
    /// syscalls on the submitting thread, as io_uring would hand each to an
    /// io-wq worker thread ([`super::FileBackend::takes_nowait`]). A
    /// backend reports the engine it resolved to
    /// ([`super::FileBackend::io_engine`]), never this.
    Auto,
}

/// Options for [`FileBackend::open`](super::FileBackend::open).
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
    /// Claim a block device exclusively (`O_EXCL`, as mount and
    /// dm-crypt's table load do), read-only or not: the open fails with
    /// [`ErrorKind::InUse`](crate::ErrorKind::InUse) while the device is
    /// mounted, mapped, or claimed by another exclusive opener (another
    /// ucrypt daemon, a header verb rewriting it). The claim keeps them
    /// out in turn for as long as the backend lives; plain opens are not
    /// refused either way. On by default; `false` only for a reader that
    /// shares the device, as `dd` would (`ucrypt map` without `--write`).
    /// Ignored for regular files, which always take their advisory lock.
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
            exclusive: true,
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
    /// Reads and writes submitted through io_uring (in batches).
    pub uring_ops: u64,
    /// Reads, writes and syncs done with plain syscalls (single operations,
    /// and batches on the syscall engine).
    pub syscall_ops: u64,
    /// Batches ([`crate::Backend::read_batch`] / `write_batch`) handed to
    /// io_uring as one submission; their transfers count in `uring_ops`.
    pub uring_batches: u64,
    /// Entries of `submit_async` whose completion a submitter reaped on
    /// its own thread ([`crate::Backend::reap`]) instead of the ring's
    /// completion thread.
    pub reaped_ops: u64,
}
