//! The data path: requests in, encrypted IO out.
//!
//! SKELETON CONTRACT (the data-path owner fills in the modes; keep these
//! signatures stable, frontends and the bench code against them):
//!
//! ```text
//!   frontends (nbd, fuse, bench, cli map)
//!        │  Engine::submit(Request, callback)
//!        ▼
//!   Engine ── check once (range, alignment, flags) ── mode dispatch
//!        │                                             classic | inline | adaptive
//!        ▼
//!   crypto::SectorCrypt          backend::Backend
//! ```

use std::sync::{Arc, RwLock};

use backend::Backend;
use crypto::SectorCrypt;

/// Errors completing a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Request beyond the end of the device.
    #[error("Request out of range: offset {offset} length {len} device size {size}")]
    OutOfRange {
        /// Byte offset requested.
        offset: u64,
        /// Length requested.
        len: u64,
        /// Device size.
        size: u64,
    },
    /// Offset or length not a multiple of the sector size.
    #[error("Request not aligned to the {sector_size}-byte sector size")]
    Misaligned {
        /// The volume's sector size.
        sector_size: u32,
    },
    /// Operation not permitted (read-only, discards disabled, too large).
    #[error("Operation not supported: {0}")]
    Unsupported(&'static str),
    /// The backend failed.
    #[error("Backend IO error")]
    Io(#[from] std::io::Error),
    /// Engine shutting down.
    #[error("Engine is shut down")]
    Shutdown,
}

/// dm-crypt data-path mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// dm-crypt's performance flags (table optional parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerfFlags {
    /// `same_cpu_crypt`
    pub same_cpu_crypt: bool,
    /// `submit_from_crypt_cpus`
    pub submit_from_crypt_cpus: bool,
    /// `no_read_workqueue`
    pub no_read_workqueue: bool,
    /// `no_write_workqueue`
    pub no_write_workqueue: bool,
}

/// Engine configuration; can be swapped live with [`Engine::reconfigure`].
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
        }
    }
}

/// What a request does.
#[derive(Debug)]
pub enum Op {
    /// Read `len` bytes.
    Read {
        /// Bytes to read.
        len: u32,
    },
    /// Write `data` (ownership passes to the engine).
    Write {
        /// Plaintext.
        data: Vec<u8>,
    },
    /// Make all completed writes durable.
    Flush,
    /// Discard `len` bytes.
    Discard {
        /// Bytes.
        len: u32,
    },
    /// Write `len` zero bytes (plaintext zeroes).
    WriteZeroes {
        /// Bytes.
        len: u32,
    },
}

/// One request, byte-addressed on the decrypted device.
#[derive(Debug)]
pub struct Request {
    /// The operation.
    pub op: Op,
    /// Byte offset on the decrypted device.
    pub offset: u64,
    /// Forced unit access: durable before completion.
    pub fua: bool,
}

/// The result of a request: read data for reads, `None` otherwise.
pub type Completion = Result<Option<Vec<u8>>, Error>;

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

/// The engine. `Send + Sync`; share it with `Arc`.
pub struct Engine {
    vol: RwLock<Volume>,
    cfg: RwLock<EngineConfig>,
}

impl Engine {
    /// Starts an engine over `vol`.
    pub fn new(vol: Volume, cfg: EngineConfig) -> Result<Self, Error> {
        Ok(Self { vol: RwLock::new(vol), cfg: RwLock::new(cfg) })
    }

    /// Submits a request; `done` runs exactly once, on some engine or
    /// caller thread. Blocks while `queue_depth` requests are in flight.
    pub fn submit(&self, req: Request, done: impl FnOnce(Completion) + Send + 'static) {
        done(self.run(req));
    }

    fn run(&self, req: Request) -> Completion {
        let vol = self.vol.read().unwrap();
        let ss = vol.sector_size as u64;
        let len = match &req.op {
            Op::Read { len } | Op::Discard { len } | Op::WriteZeroes { len } => *len as u64,
            Op::Write { data } => data.len() as u64,
            Op::Flush => 0,
        };
        if req.offset % ss != 0 || len % ss != 0 {
            return Err(Error::Misaligned { sector_size: vol.sector_size });
        }
        if req.offset.checked_add(len).is_none_or(|e| e > vol.size) {
            return Err(Error::OutOfRange { offset: req.offset, len, size: vol.size });
        }
        let sector = req.offset / 512;
        let at = vol.data_offset + req.offset;
        match req.op {
            Op::Read { len } => {
                let mut buf = vec![0; len as usize];
                vol.backend.read_at(&mut buf, at)?;
                if let Some(c) = &vol.crypt {
                    c.decrypt(sector, &mut buf);
                }
                Ok(Some(buf))
            }
            Op::Write { mut data } => {
                if let Some(c) = &vol.crypt {
                    c.encrypt(sector, &mut data);
                }
                vol.backend.write_at(&data, at, req.fua)?;
                Ok(None)
            }
            Op::WriteZeroes { len } => {
                let mut data = vec![0; len as usize];
                if let Some(c) = &vol.crypt {
                    c.encrypt(sector, &mut data);
                }
                vol.backend.write_at(&data, at, req.fua)?;
                Ok(None)
            }
            Op::Flush => {
                vol.backend.flush()?;
                Ok(None)
            }
            Op::Discard { .. } => Err(Error::Unsupported("discard")),
        }
    }

    /// Blocking read helper.
    pub fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, Error> {
        self.run(Request { op: Op::Read { len }, offset, fua: false }).map(|d| d.unwrap_or_default())
    }

    /// Blocking write helper.
    pub fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), Error> {
        self.run(Request { op: Op::Write { data }, offset, fua }).map(|_| ())
    }

    /// Blocking flush helper.
    pub fn flush(&self) -> Result<(), Error> {
        self.run(Request { op: Op::Flush, offset: 0, fua: false }).map(|_| ())
    }

    /// Switches mode/flags live: suspend (drain), swap, resume.
    pub fn reconfigure(&self, cfg: EngineConfig) -> Result<(), Error> {
        *self.cfg.write().unwrap() = cfg;
        Ok(())
    }

    /// Replaces the whole volume (table reload) live: drain, swap, resume.
    pub fn reload(&self, vol: Volume) -> Result<(), Error> {
        *self.vol.write().unwrap() = vol;
        Ok(())
    }

    /// Current configuration.
    pub fn config(&self) -> EngineConfig {
        self.cfg.read().unwrap().clone()
    }

    /// Decrypted device size in bytes.
    pub fn size(&self) -> u64 {
        self.vol.read().unwrap().size
    }

    /// Logical sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.vol.read().unwrap().sector_size
    }

    /// A snapshot of the engine's counters (for `status` and the bench).
    pub fn stats(&self) -> Stats {
        Stats::default()
    }

    /// Drains in-flight requests, flushes, stops worker threads.
    pub fn shutdown(&self) -> Result<(), Error> {
        self.flush()
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

/// Per-direction counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DirStats {
    /// Completed requests.
    pub requests: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Requests that completed with an error.
    pub errors: u64,
    /// Requests handled inline (no queue hop).
    pub inline: u64,
    /// Requests handled through worker queues.
    pub queued: u64,
    /// Latency percentiles since start.
    pub latency: Latency,
}

/// Engine statistics snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Reads.
    pub read: DirStats,
    /// Writes (including write-zeroes).
    pub write: DirStats,
    /// Flushes completed.
    pub flushes: u64,
    /// Discards completed.
    pub discards: u64,
    /// Requests in flight now.
    pub in_flight: u64,
    /// Highest in-flight count seen.
    pub max_in_flight: u64,
    /// Live reconfigurations performed.
    pub reconfigurations: u64,
}
