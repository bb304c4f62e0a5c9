//! Engine counters and latency histograms, cheap enough for the inline path.
//!
//! Hand-written. Every completed request updates a handful of relaxed
//! atomics in one of [`SHARDS`] cache-line-aligned shards, picked per thread,
//! so two submitting threads never bounce the same line between cores. A
//! snapshot ([`StatsCore::snapshot`]) sums the shards; it may be a few
//! requests stale, never torn in a way that matters for monitoring.
//!
//! Latency is sampled: one completion in [`LATENCY_SAMPLE`] per thread
//! (the first included) is timed, so most requests read the clock once
//! rather than twice; the percentiles come from the sample.
//!
//! Latency uses a log-linear histogram: each power of two of nanoseconds is
//! divided into [`SUB`] buckets, so any percentile is reported within 25 %
//! of the true value whatever the range (ns to minutes), with no allocation
//! and no lock.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

use crate::CryptMode;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

/// Per-direction counters. Serialized as `ucrypt status --json` shows
/// them: the latency percentiles flattened in, without the per-mode counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
    /// Requests whose crypto was split across cores (adaptive; on a backend
    /// that keeps its bytes in memory, their IO too).
    pub split: u64,
    /// Requests handed whole to a warm helper on another core (adaptive).
    pub offloaded: u64,
    /// Requests per mode they ran under.
    #[serde(skip)]
    pub by_mode: ModeCounts,
    /// Latency percentiles since start.
    #[serde(flatten)]
    pub latency: Latency,
}

/// Engine statistics snapshot: what `ucrypt status` reports (serialized
/// without the failed flush/discard count and the mode, which status
/// shows elsewhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
    /// Flushes and discards that failed.
    #[serde(skip)]
    pub other_errors: u64,
    /// The mode now configured.
    #[serde(skip)]
    pub mode: CryptMode,
}

/// Request counts per [`CryptMode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModeCounts {
    /// Under [`CryptMode::Classic`].
    pub classic: u64,
    /// Under [`CryptMode::Inline`].
    pub inline: u64,
    /// Under [`CryptMode::Adaptive`].
    pub adaptive: u64,
}

/// Number of counter shards (threads map onto them round-robin).
const SHARDS: usize = 8;
/// Sub-buckets per power of two (must be a power of two).
const SUB: usize = 4;
const SUB_BITS: u32 = SUB.trailing_zeros();
/// Buckets per histogram: 64 powers of two × `SUB`.
const BUCKETS: usize = 64 * SUB;

/// Which counters a completion updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Reads.
    Read = 0,
    /// Writes and write-zeroes.
    Write = 1,
    /// Flushes.
    Flush = 2,
    /// Discards.
    Discard = 3,
}

/// How a request was carried out (for the inline / queued / split counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Entirely in the submitting context.
    Inline,
    /// Through at least one worker queue (classic pipeline).
    Queued,
    /// Crypto split across cores (adaptive).
    Split,
    /// Handed whole to another core's warm helper (adaptive).
    Offload,
}

struct DirCounters {
    requests: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    inline: AtomicU64,
    queued: AtomicU64,
    split: AtomicU64,
    offloaded: AtomicU64,
    by_mode: [AtomicU64; 3],
    hist: [AtomicU64; BUCKETS],
}

impl DirCounters {
    fn new() -> Self {
        Self {
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            inline: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            split: AtomicU64::new(0),
            offloaded: AtomicU64::new(0),
            by_mode: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            hist: [const { AtomicU64::new(0) }; BUCKETS],
        }
    }
}

#[repr(align(128))]
struct Shard {
    dirs: [DirCounters; 2],
    flushes: AtomicU64,
    discards: AtomicU64,
    other_errors: AtomicU64,
}

/// The engine's live counters.
pub(crate) struct StatsCore {
    shards: Box<[Shard]>,
    pub(crate) reconfigurations: AtomicU64,
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Completions on this thread since its last latency sample.
    static SINCE_SAMPLE: Cell<u32> = const { Cell::new(0) };
}

/// One completion in this many per thread has its latency measured.
pub(crate) const LATENCY_SAMPLE: u32 = 8;

/// True when this thread's completion should be timed (the first, then
/// every [`LATENCY_SAMPLE`]th).
pub(crate) fn sample_latency() -> bool {
    SINCE_SAMPLE.with(|c| {
        let n = c.get();
        c.set(if n + 1 >= LATENCY_SAMPLE { 0 } else { n + 1 });
        n == 0
    })
}

fn shard_index() -> usize {
    SHARD.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT_THREAD.fetch_add(1, Relaxed) % SHARDS;
            s.set(i);
        }
        i
    })
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros();
    let sub = (ns >> (log - SUB_BITS)) as usize & (SUB - 1);
    ((log - SUB_BITS + 1) as usize) * SUB + sub
}

/// Midpoint of a bucket in nanoseconds.
fn bucket_mid(b: usize) -> f64 {
    if b < SUB {
        return b as f64;
    }
    let log = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    let lo = (1u64 << log) + (sub << (log - SUB_BITS));
    let width = 1u64 << (log - SUB_BITS);
    lo as f64 + width as f64 / 2.0
}

impl StatsCore {
    pub(crate) fn new() -> Self {
        let shards = (0..SHARDS)
            .map(|_| Shard {
                dirs: [DirCounters::new(), DirCounters::new()],
                flushes: AtomicU64::new(0),
                discards: AtomicU64::new(0),
                other_errors: AtomicU64::new(0),
            })
            .collect();
        Self {
            shards,
            reconfigurations: AtomicU64::new(0),
        }
    }

    /// Records one completed request; `ns` is its latency when sampled.
    pub(crate) fn record(
        &self,
        dir: Dir,
        mode: CryptMode,
        path: Path,
        bytes: u64,
        ns: Option<u64>,
        ok: bool,
    ) {
        let shard = &self.shards[shard_index()];
        let d = match dir {
            Dir::Read => &shard.dirs[0],
            Dir::Write => &shard.dirs[1],
            Dir::Flush | Dir::Discard => {
                if ok {
                    let c = if dir == Dir::Flush {
                        &shard.flushes
                    } else {
                        &shard.discards
                    };
                    c.fetch_add(1, Relaxed);
                } else {
                    shard.other_errors.fetch_add(1, Relaxed);
                }
                return;
            }
        };
        d.requests.fetch_add(1, Relaxed);
        if ok {
            d.bytes.fetch_add(bytes, Relaxed);
        } else {
            d.errors.fetch_add(1, Relaxed);
        }
        match path {
            Path::Inline => &d.inline,
            Path::Queued => &d.queued,
            Path::Split => &d.split,
            Path::Offload => &d.offloaded,
        }
        .fetch_add(1, Relaxed);
        d.by_mode[mode as usize].fetch_add(1, Relaxed);
        if let Some(ns) = ns {
            d.hist[bucket_of(ns)].fetch_add(1, Relaxed);
        }
    }

    fn dir_snapshot(&self, i: usize) -> DirStats {
        let mut out = DirStats::default();
        let mut hist = [0u64; BUCKETS];
        let mut modes = [0u64; 3];
        for s in self.shards.iter() {
            let d = &s.dirs[i];
            out.requests += d.requests.load(Relaxed);
            out.bytes += d.bytes.load(Relaxed);
            out.errors += d.errors.load(Relaxed);
            out.inline += d.inline.load(Relaxed);
            out.queued += d.queued.load(Relaxed);
            out.split += d.split.load(Relaxed);
            out.offloaded += d.offloaded.load(Relaxed);
            for (m, c) in modes.iter_mut().zip(&d.by_mode) {
                *m += c.load(Relaxed);
            }
            for (h, c) in hist.iter_mut().zip(&d.hist) {
                *h += c.load(Relaxed);
            }
        }
        out.by_mode = ModeCounts {
            classic: modes[0],
            inline: modes[1],
            adaptive: modes[2],
        };
        out.latency = percentiles(&hist);
        out
    }

    /// Sums the shards: (read, write, flushes, discards, other errors).
    pub(crate) fn snapshot(&self) -> (DirStats, DirStats, u64, u64, u64) {
        let (mut f, mut d, mut e) = (0, 0, 0);
        for s in self.shards.iter() {
            f += s.flushes.load(Relaxed);
            d += s.discards.load(Relaxed);
            e += s.other_errors.load(Relaxed);
        }
        (self.dir_snapshot(0), self.dir_snapshot(1), f, d, e)
    }
}

fn percentiles(hist: &[u64; BUCKETS]) -> Latency {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return Latency::default();
    }
    let at = |q: f64| {
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &n) in hist.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_mid(b) / 1000.0;
            }
        }
        bucket_mid(BUCKETS - 1) / 1000.0
    };
    Latency {
        p50_us: at(0.50),
        p99_us: at(0.99),
        p999_us: at(0.999),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut last = 0;
        for ns in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            100,
            1000,
            4095,
            4096,
            1 << 20,
            123_456_789,
            u64::MAX / 2,
        ] {
            let b = bucket_of(ns);
            assert!(b >= last, "bucket order at {ns}");
            assert!(b < BUCKETS);
            last = b;
            if ns >= 8 {
                let mid = bucket_mid(b);
                let err = (mid - ns as f64).abs() / ns as f64;
                assert!(err <= 0.25, "{ns} -> bucket {b} mid {mid}");
            }
        }
    }

    #[test]
    fn one_completion_in_n_is_timed_per_thread() {
        std::thread::spawn(|| {
            let picks: Vec<bool> = (0..3 * LATENCY_SAMPLE).map(|_| sample_latency()).collect();
            assert!(picks[0], "the first completion is timed");
            assert_eq!(picks.iter().filter(|&&p| p).count(), 3);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn percentiles_follow_the_distribution() {
        let s = StatsCore::new();
        for i in 0..1000u64 {
            let ns = if i < 990 { 10_000 } else { 1_000_000 };
            s.record(
                Dir::Read,
                CryptMode::Inline,
                Path::Inline,
                4096,
                Some(ns),
                true,
            );
        }
        s.record(
            Dir::Write,
            CryptMode::Classic,
            Path::Queued,
            512,
            Some(5),
            false,
        );
        // Unsampled completions count everywhere but in the histogram.
        s.record(Dir::Read, CryptMode::Inline, Path::Inline, 4096, None, true);
        let (r, w, ..) = s.snapshot();
        assert_eq!(r.requests, 1001);
        assert_eq!(r.bytes, 4096 * 1001);
        assert_eq!(r.by_mode.inline, 1001);
        assert!((r.latency.p50_us - 10.0).abs() < 2.5, "{:?}", r.latency);
        assert!(
            (r.latency.p999_us - 1000.0).abs() < 250.0,
            "{:?}",
            r.latency
        );
        assert_eq!((w.requests, w.errors, w.bytes, w.queued), (1, 1, 0, 1));
    }
}
