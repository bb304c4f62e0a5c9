//! The answer to `status`: a volume's mapping, configuration and live
//! counters, as they cross the control socket, and their text (the
//! [`Display`](std::fmt::Display) of [`Status`], in `cryptsetup status`'s
//! layout).

use std::fmt;

use datapath::{CryptMode, EngineConfig, Stats};
use serde::{Deserialize, Serialize};

use super::{flag_words, mode, mode_name, Flags, Ping};
use crate::resolve::VolumeType;

/// A volume's mapping, configuration and live statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Who serves it, and where.
    pub ping: Ping,
    /// Plain, LUKS1 or LUKS2.
    pub volume_type: VolumeType,
    /// Cipher specification (`aes-xts-plain64`).
    pub cipher: String,
    /// Key size in bits.
    pub keysize_bits: usize,
    /// The backing device.
    pub device: String,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Data offset on the device, in 512-byte sectors.
    pub offset_sectors: u64,
    /// IV offset, in 512-byte sectors.
    pub iv_offset: u64,
    /// Size of the decrypted device, in 512-byte sectors.
    pub size_sectors: u64,
    /// Writes are refused.
    pub read_only: bool,
    /// Suspended by `luksSuspend`: IO waits, the key is wiped.
    #[serde(default)]
    pub suspended: bool,
    /// Discards are passed down.
    pub allow_discards: bool,
    /// Performance flags in effect.
    pub flags: Flags,
    /// Data-path mode in effect.
    #[serde(with = "mode")]
    pub mode: CryptMode,
    /// Seconds since the daemon started serving.
    pub uptime_s: u64,
    /// Engine counters.
    pub stats: Stats,
    /// NBD connection counters (NBD exports only).
    pub nbd: Option<NbdStats>,
    /// vhost-user-blk counters, per queue (vhost-user-blk exports only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<VhostStats>,
    /// Which transport carries a FUSE export's requests (FUSE exports
    /// only; absent from an older daemon's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<FuseStatus>,
    /// How the backing device is read and written (absent from an older
    /// daemon's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStatus>,
    /// Every target of a mapping of several (empty for one target, which
    /// the fields above describe): what `dmsetup status` lists per line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,
    /// The online reencryption this daemon runs or ran (absent when
    /// none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencryption: Option<super::Reencryption>,
}

/// A FUSE export's transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseStatus {
    /// `io_uring` (FUSE over io_uring) or `dev-fuse` (/dev/fuse reads and
    /// writes).
    pub transport: String,
    /// Requests answered over the ring so far.
    pub ring_requests: u64,
}

/// One target of a multi-target mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    /// First sector in the mapping (512-byte units).
    pub start: u64,
    /// Length in 512-byte sectors.
    pub len: u64,
    /// `crypt` or `linear`.
    pub target: String,
    /// Cipher spec (crypt only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cipher: Option<String>,
    /// Key size in bits (0 for linear).
    pub keysize_bits: usize,
    /// Where the target starts on the device, in 512-byte sectors.
    pub offset_sectors: u64,
    /// IV offset in 512-byte sectors (0 for linear).
    pub iv_offset: u64,
    /// Encryption sector size in bytes (512 for linear).
    pub sector_size: u32,
}

impl TargetStatus {
    /// The status of every target of `t` (empty when it has only one).
    pub fn list(t: &crypto::table::Targets) -> Vec<TargetStatus> {
        use crypto::table::Target;
        if t.count() < 2 {
            return Vec::new();
        }
        t.targets()
            .iter()
            .map(|x| TargetStatus {
                start: x.start(),
                len: x.len(),
                target: x.kind().to_owned(),
                cipher: match x {
                    Target::Crypt(c) => Some(c.cipher.as_str().to_owned()),
                    Target::Linear(_) | Target::Zero(_) => None,
                },
                keysize_bits: match x {
                    Target::Crypt(c) => c.key().len() * 8,
                    Target::Linear(_) | Target::Zero(_) => 0,
                },
                offset_sectors: x.offset(),
                iv_offset: match x {
                    Target::Crypt(c) => c.iv_offset,
                    Target::Linear(_) | Target::Zero(_) => 0,
                },
                sector_size: x.sector_size(),
            })
            .collect()
    }
}

impl fmt::Display for TargetStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.start, self.len, self.target)?;
        if let Some(c) = &self.cipher {
            write!(
                f,
                " {c}, {} bits, iv_offset {}, sector size {}",
                self.keysize_bits, self.iv_offset, self.sector_size
            )?;
        }
        write!(f, ", device offset {}", self.offset_sectors)
    }
}

/// The backing device's IO path: the interface, O_DIRECT, and counters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IoStatus {
    /// `io_uring`, `pread/pwrite`, `librbd` or `memory`.
    pub engine: String,
    /// O_DIRECT alignment in bytes when aligned requests bypass the page
    /// cache; absent when everything is buffered (or not a file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_align: Option<u64>,
    /// Operations since open by how they went: `ring` / `syscall` (which
    /// interface ran them), `reaped` (ring completions a submitter ran
    /// itself), `direct` / `bounced` (O_DIRECT, through an aligned copy
    /// when the memory was not aligned) / `buffered`.
    #[serde(default)]
    pub counters: std::collections::BTreeMap<String, u64>,
}

impl From<backend::IoPath> for IoStatus {
    fn from(p: backend::IoPath) -> Self {
        Self {
            engine: p.engine,
            direct_align: p.direct_align,
            counters: p
                .counters
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }
}

impl fmt::Display for IoStatus {
    /// `io_uring, O_DIRECT (4096-byte alignment); bounced 0, buffered 2, ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.engine)?;
        match self.direct_align {
            Some(a) => write!(f, ", O_DIRECT ({a}-byte alignment)")?,
            None if !self.counters.is_empty() => f.write_str(", buffered")?,
            None => {}
        }
        for (i, (k, v)) in self.counters.iter().enumerate() {
            f.write_str(if i == 0 { "; " } else { ", " })?;
            write!(f, "{k} {v}")?;
        }
        Ok(())
    }
}

/// Version of the `status --json` and `list --json` documents (see
/// docs/JSON.md); raised on any incompatible change.
pub const JSON_SCHEMA: u32 = 1;

impl Status {
    /// `status --json`: this status as one JSON object, `schema` first
    /// (docs/JSON.md).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Doc<'a> {
            schema: u32,
            #[serde(flatten)]
            status: &'a Status,
        }
        let doc = Doc {
            schema: JSON_SCHEMA,
            status: self,
        };
        // Serialising a Status cannot fail: string keys, finite or null
        // floats (serde_json writes non-finite ones as null).
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    }

    /// The configuration part as an [`EngineConfig`] (other fields default).
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            mode: self.mode,
            flags: self.flags.into(),
            allow_discards: self.allow_discards,
            read_only: self.read_only,
            max_read_size: self.flags.max_read_size,
            max_write_size: self.flags.max_write_size,
            ..EngineConfig::default()
        }
    }
}

/// `ucrypt status`'s text: `cryptsetup status`'s lines (type, cipher,
/// keysize, device, sizes, mode, flags), then ucrypt's own (data path,
/// export, clients, counters). No newline after the last line.
impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let in_use = self.nbd.is_some_and(|n| n.connections > 0);
        let in_use = if in_use { " and is in use" } else { "" };
        writeln!(f, "{} is active{in_use}.", self.ping.name)?;
        writeln!(f, "  type:    {}", self.volume_type.name())?;
        writeln!(f, "  cipher:  {}", self.cipher)?;
        writeln!(f, "  keysize: {} bits", self.keysize_bits)?;
        writeln!(
            f,
            "  key location: ucrypt daemon memory (pid {})",
            self.ping.pid
        )?;
        writeln!(f, "  device:  {}", self.device)?;
        writeln!(f, "  sector size:  {}", self.sector_size)?;
        writeln!(f, "  offset:  {} sectors", self.offset_sectors)?;
        writeln!(f, "  size:    {} sectors", self.size_sectors)?;
        if self.iv_offset != 0 {
            // cryptsetup prints the IV offset (--skip) only when set.
            writeln!(f, "  skipped: {} sectors", self.iv_offset)?;
        }
        let rw = if self.read_only {
            "readonly"
        } else {
            "read/write"
        };
        let suspended = if self.suspended { " (suspended)" } else { "" };
        writeln!(f, "  mode:    {rw}{suspended}")?;
        let flags = flag_words(self.allow_discards, &self.flags);
        if !flags.is_empty() {
            writeln!(f, "  flags:   {}", flags.join(" "))?;
        }
        if !self.targets.is_empty() {
            writeln!(f, "  targets: {}", self.targets.len())?;
            for t in &self.targets {
                writeln!(f, "    {t}")?;
            }
        }
        if let Some(r) = &self.reencryption {
            writeln!(f, "  reencryption: {r}")?;
        }
        writeln!(f, "  data path: {}", mode_name(self.mode))?;
        if let Some(io) = self.io.as_ref().filter(|io| !io.engine.is_empty()) {
            writeln!(f, "  io:      {io}")?;
        }
        let p = &self.ping;
        writeln!(f, "  export:  {} {}", p.export.name(), p.endpoint)?;
        if let Some(c) = &self.nbd {
            writeln!(
                f,
                "  clients: {} connected, {} accepted, {} disconnected for protocol errors",
                c.connections, c.accepted, c.protocol_errors
            )?;
        }
        if let Some(u) = &self.fuse {
            writeln!(
                f,
                "  fuse:    transport {}, {} requests over the ring",
                u.transport, u.ring_requests
            )?;
        }
        if let Some(v) = &self.vhost {
            let cache = if v.write_cache {
                "writeback"
            } else {
                "write-through"
            };
            writeln!(f, "  vhost:   {} connections, cache {cache}", v.connections)?;
            // A device offers up to 64 queues; list the ones the guest used.
            let used = |q: &&VhostQueueStats| {
                q.reads + q.writes + q.flushes + q.discards + q.write_zeroes + q.in_flight > 0
                    || q.io_errors + q.unsupported + q.malformed > 0
            };
            for (i, q) in v.queues.iter().enumerate().filter(|(_, q)| used(q)) {
                writeln!(
                    f,
                    "  queue {i}: {} reads ({} bytes), {} writes ({} bytes), {} flushes, {} discards, {} write-zeroes, {} io errors, {} unsupported, {} malformed, {} in flight",
                    q.reads, q.read_bytes, q.writes, q.write_bytes, q.flushes, q.discards,
                    q.write_zeroes, q.io_errors, q.unsupported, q.malformed, q.in_flight
                )?;
            }
        }
        for (dir, d) in [("read", &self.stats.read), ("write", &self.stats.write)] {
            writeln!(
                f,
                "  {dir}s:   {} requests, {} bytes, {} errors, {} inline, {} queued, p50 {:.1} us, p99 {:.1} us",
                d.requests, d.bytes, d.errors, d.inline, d.queued, d.latency.p50_us, d.latency.p99_us
            )?;
        }
        let st = &self.stats;
        write!(
            f,
            "  flushes: {}, discards: {}, in flight: {} (max {}), reconfigurations: {}",
            st.flushes, st.discards, st.in_flight, st.max_in_flight, st.reconfigurations
        )
    }
}

/// NBD server counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NbdStats {
    /// Clients connected now.
    pub connections: u64,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Connections dropped for protocol errors.
    pub protocol_errors: u64,
}

/// vhost-user-blk counters (see `vhost_blk::Stats`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct VhostStats {
    /// Hypervisor connections accepted since start.
    pub connections: u64,
    /// The guest's cache mode: writeback (true) or write-through.
    pub write_cache: bool,
    /// One entry per virtqueue.
    pub queues: Vec<VhostQueueStats>,
}

/// One virtqueue's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct VhostQueueStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Flushes.
    pub flushes: u64,
    /// Discards.
    pub discards: u64,
    /// Write-zeroes.
    pub write_zeroes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Answered VIRTIO_BLK_S_IOERR.
    pub io_errors: u64,
    /// Answered VIRTIO_BLK_S_UNSUPP.
    pub unsupported: u64,
    /// Malformed descriptor chains.
    pub malformed: u64,
    /// Requests in the engine now.
    pub in_flight: u64,
}

impl From<&vhost_blk::Stats> for VhostStats {
    fn from(s: &vhost_blk::Stats) -> Self {
        Self {
            connections: s.connections,
            write_cache: s.write_cache,
            queues: s
                .queues
                .iter()
                .map(|q| VhostQueueStats {
                    reads: q.reads,
                    writes: q.writes,
                    flushes: q.flushes,
                    discards: q.discards,
                    write_zeroes: q.write_zeroes,
                    read_bytes: q.read_bytes,
                    write_bytes: q.write_bytes,
                    io_errors: q.io_errors,
                    unsupported: q.unsupported,
                    malformed: q.malformed,
                    in_flight: q.in_flight,
                })
                .collect(),
        }
    }
}
