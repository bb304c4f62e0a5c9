//! How an engine is set up: the [`Volume`] it serves and the
//! [`EngineConfig`] it runs it with (mode, dm-crypt flags, queue depth,
//! read-only, discards, classic mode's request split sizes), which [`Engine::reconfigure`](crate::Engine::reconfigure)
//! can swap live.

use std::sync::Arc;

use backend::Backend;
use crypto::SectorCrypt;

/// dm-crypt data-path mode (an open set: modes get added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CryptMode {
    /// dm-crypt's queued pipeline (kcryptd_io, kcryptd, dmcrypt_write).
    /// `no_read_workqueue`/`no_write_workqueue` in [`PerfFlags`] make one
    /// direction inline, exactly like the upstream flags.
    #[default]
    Classic,
    /// Both directions inline (`force_inline`).
    Inline,
    /// Per-request choice (ours).
    Adaptive,
}

impl CryptMode {
    /// The mode's name: `classic`, `inline` or `adaptive`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Inline => "inline",
            Self::Adaptive => "adaptive",
        }
    }
}

/// dm-crypt's performance flags (table optional parameters), defined
/// once in `crypto::perf`; `high_priority` runs the classic pipeline's
/// threads at nice -20 (see `mode::classic`).
pub use crypto::perf::PerfFlags;

/// dm-crypt's default `max_read_size` and `max_write_size` module
/// parameters (Linux 6.11): 128 KiB.
pub const DEFAULT_MAX_IO_SIZE: u32 = 128 << 10;

/// Engine configuration; can be swapped live with [`crate::Engine::reconfigure`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Pipeline mode.
    pub mode: CryptMode,
    /// dm-crypt flags.
    pub flags: PerfFlags,
    /// Maximum requests in flight; `submit` blocks beyond it.
    pub queue_depth: usize,
    /// Crypt worker threads for classic/adaptive (0 = number of CPUs).
    pub workers: usize,
    /// Pass discards down (`allow_discards`).
    pub allow_discards: bool,
    /// Refuse writes.
    pub read_only: bool,
    /// Classic mode: queued reads larger than this are split into pieces
    /// of this size that go through the queues on their own, as Linux
    /// 6.11's dm-crypt splits bios at its `max_read_size` module parameter
    /// (here per volume); rounded down to the sector size. 0: no cut, the
    /// pipeline before 6.11 and ucrypt's default: its pieces are copied
    /// into the whole request where the kernel's share the bio's pages,
    /// and on a file every FUA piece is a sync of its own, which measured
    /// slower here. [`DEFAULT_MAX_IO_SIZE`] is the kernel's default.
    pub max_read_size: u32,
    /// The same for writes (`max_write_size`), at most 1 MiB as in the
    /// kernel (a write's bounce buffer is one bio's worth of pages).
    pub max_write_size: u32,
}

impl EngineConfig {
    /// The piece size classic mode splits queued reads (`write` false) or
    /// writes into for `sector_size`-byte sectors, as dm-crypt's
    /// `get_max_request_size` computes it: the module parameter, writes at
    /// most 1 MiB, rounded down to the sector size, at least one sector;
    /// `u64::MAX` (no cut) when the size is 0.
    pub fn max_io_size(&self, write: bool, sector_size: u32) -> u64 {
        let v = if write {
            self.max_write_size
        } else {
            self.max_read_size
        };
        if v == 0 {
            return u64::MAX;
        }
        let mut v = u64::from(v);
        if write {
            v = v.min(1 << 20);
        }
        let align = u64::from(sector_size.max(512));
        (v / align * align).max(align)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            mode: CryptMode::Classic,
            flags: PerfFlags::default(),
            queue_depth: 128,
            workers: 0,
            allow_discards: false,
            read_only: false,
            max_read_size: 0,
            max_write_size: 0,
        }
    }
}

/// Describes where the volume lives on the backend and how it is encrypted.
pub struct Volume {
    /// Storage holding ciphertext.
    pub backend: Arc<dyn Backend>,
    /// Sector cipher; `None` = no encryption (the raw baseline).
    pub crypt: Option<Arc<SectorCrypt>>,
    /// Byte offset of sector 0 on the backend (table `<offset>` * 512).
    pub data_offset: u64,
    /// Size of the decrypted device in bytes.
    pub size: u64,
    /// Logical sector size (512 when `crypt` is `None`).
    pub sector_size: u32,
}

/// One target of a multi-target [`Mapping`] (a dm table line).
#[derive(Clone)]
pub struct Target {
    /// Length in bytes (a multiple of the mapping's logical block size).
    pub len: u64,
    /// Byte offset of the target's first sector on the backend (the
    /// line's `<offset>` * 512).
    pub offset: u64,
    /// The target's cipher (its `iv_offset`, sector size and
    /// `iv_large_sectors` inside, sectors counted from the target's
    /// start); `None` for a `linear` or `zero` target.
    pub crypt: Option<Arc<SectorCrypt>>,
    /// A `zero` target (dm-zero): reads give zeros, writes are dropped,
    /// the backend is not touched (`offset` and `crypt` unused).
    pub zero: bool,
}

/// A mapping made of several targets on one backend, contiguous from
/// byte 0 in the order given (a multi-line dm table). Its logical sector
/// size is the largest of its targets' sector sizes. See
/// [`Engine::with_mapping`](crate::Engine::with_mapping) and
/// [`Engine::reload_mapping`](crate::Engine::reload_mapping).
#[derive(Clone)]
pub struct Mapping {
    /// Storage holding ciphertext.
    pub backend: Arc<dyn Backend>,
    /// The targets, in order.
    pub targets: Vec<Target>,
}
