//! The records a run produces, below the runners that fill them and the
//! report and heatmaps that read them: what a runner measures
//! ([`RunTarget`]), one repetition ([`Rep`], [`DiskReqs`]), a cell over
//! repetitions ([`CellResult`]), the whole run ([`Report`], [`Skipped`],
//! [`OptionsRecord`], the [`Machine`]). `report` renders them (text, CSV,
//! JSON files), `heatmap` draws them, `runner` produces them.
//!
//! The JSON layout is documented in docs/BENCHMARKING.md; bump
//! [`SCHEMA_VERSION`] on any incompatible change.

mod machine;

use crate::driver::{Rw, Workload};
use crate::stats::{self, Percentiles, Summary};
use crate::target::{Cipher, Mode};
use crate::{CryptoSpeed, Options};

pub use machine::Machine;

/// Something a runner can measure.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTarget {
    /// Name in the tables (`raw`, `aes-inline`, `ucrypt-aes-inline`, `qsd-luks` …).
    pub name: String,
    /// Cipher (None for raw baselines).
    pub cipher: Option<Cipher>,
    /// Data-path mode (None for raw and for peers).
    pub mode: Option<Mode>,
    /// Takes part in the headline.
    pub headline: bool,
    /// Takes part in the sweep.
    pub swept: bool,
}

/// One measured repetition, whatever ran it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rep {
    /// Requests completed successfully.
    pub ops: u64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Requests per second.
    pub iops: f64,
    /// Completion latency percentiles of this repetition.
    pub lat: Option<Percentiles>,
    /// CPU seconds per GiB moved (client and server).
    pub cpu_s_per_gib: Option<f64>,
    /// Failed requests (or 1 for a failed fio run).
    pub errors: u64,
    /// The first error message.
    pub error: Option<String>,
    /// What reached the block device under the file (`--via file` on a
    /// disk), measured around this repetition.
    pub disk: Option<DiskReqs>,
}

/// Requests a block device completed during a repetition (from
/// `/sys/block/DEV/stat`; the whole device, so other IO on it counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DiskReqs {
    /// Average KiB per read request (None: no reads).
    pub read_kib: Option<f64>,
    /// Average KiB per write request (None: no writes).
    pub write_kib: Option<f64>,
}

/// Version of the results JSON layout.
pub const SCHEMA_VERSION: u32 = 1;

/// Which part of the run a cell belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Phase {
    /// 4k sequential, QD1, one job (the seeds' workload).
    Headline,
    /// The bs × QD × jobs sweep.
    Sweep,
}

/// One measured cell: a target under one workload, over repetitions.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellResult {
    /// Headline or sweep.
    pub phase: Phase,
    /// Target name (`raw`, `aes-inline`, `fio:nbdkit-memory`, …).
    pub target: String,
    /// Cipher, `null` for raw.
    pub cipher: Option<Cipher>,
    /// Data-path mode, `null` for raw and external targets.
    pub mode: Option<Mode>,
    /// fio-style direction.
    pub rw: Rw,
    /// Block size in bytes.
    pub bs: u32,
    /// Queue depth per job.
    pub qd: usize,
    /// Jobs (threads).
    pub jobs: usize,
    /// Repetitions measured.
    pub reps: usize,
    /// Throughput in MiB/s over repetitions (null if nothing completed).
    pub mib_s: Option<Summary>,
    /// MiB/s of every repetition, in round order (0 for a failed one):
    /// index i of two targets of a cell ran in the same round.
    pub rounds_mib_s: Vec<f64>,
    /// Median IOPS.
    pub iops: Option<f64>,
    /// Median latency percentiles in µs.
    pub lat_us: Option<Percentiles>,
    /// Median CPU seconds per GiB moved (whole process).
    pub cpu_s_per_gib: Option<f64>,
    /// Failed requests over all repetitions.
    pub errors: u64,
    /// The first error message.
    pub error: Option<String>,
    /// Median throughput as % of the raw target in the same cell.
    pub pct_raw: Option<f64>,
    /// The serial bound io·c/(io+c) in MiB/s (io = the storage's own rate,
    /// [`io_target`]'s cell; c = crypto at this bs on one thread).
    pub bound_mib_s: Option<f64>,
    /// The physical ceiling min(io, cores·c) in MiB/s: crypto spread over
    /// every CPU and overlapped with the IO (only beside a `disk` cell:
    /// the storage's own rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_mib_s: Option<f64>,
    /// Median throughput as % of the bound.
    pub pct_bound: Option<f64>,
    /// Median throughput as % of the same cipher's classic mode.
    pub pct_classic: Option<f64>,
    /// Median KiB per request the block device under the file saw
    /// (`--via file` on a disk; absent elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_kib_per_req: Option<DiskReqs>,
}

/// The median request sizes over repetitions that measured any.
fn disk_median(reps: &[Rep]) -> Option<DiskReqs> {
    let d: Vec<DiskReqs> = reps.iter().filter_map(|r| r.disk).collect();
    if d.is_empty() {
        return None;
    }
    let med = |f: fn(&DiskReqs) -> Option<f64>| {
        stats::median(&d.iter().filter_map(f).collect::<Vec<f64>>())
    };
    Some(DiskReqs {
        read_kib: med(|d| d.read_kib),
        write_kib: med(|d| d.write_kib),
    })
}

impl CellResult {
    /// Aggregates repetitions of `target`: medians and spread over the
    /// repetitions that completed something.
    pub fn from_reps(phase: Phase, target: &RunTarget, w: &Workload, reps: Vec<Rep>) -> Self {
        let n = reps.len();
        let errors = reps.iter().map(|r| r.errors).sum();
        let error = reps.iter().find_map(|r| r.error.clone());
        let ok: Vec<&Rep> = reps.iter().filter(|r| r.ops > 0).collect();
        let mib: Vec<f64> = ok.iter().map(|r| stats::mib_per_s(r.bytes_per_s)).collect();
        let iops: Vec<f64> = ok.iter().map(|r| r.iops).collect();
        let cpu: Vec<f64> = ok.iter().filter_map(|r| r.cpu_s_per_gib).collect();
        let lats: Vec<Percentiles> = ok.iter().filter_map(|r| r.lat).collect();
        Self {
            phase,
            target: target.name.clone(),
            cipher: target.cipher,
            mode: if target.cipher.is_some() {
                target.mode
            } else {
                None
            },
            rw: w.rw,
            bs: w.bs,
            qd: w.qd,
            jobs: w.jobs,
            reps: n,
            mib_s: Summary::of(&mib),
            rounds_mib_s: reps
                .iter()
                .map(|r| {
                    if r.ops > 0 {
                        stats::mib_per_s(r.bytes_per_s)
                    } else {
                        0.0
                    }
                })
                .collect(),
            iops: stats::median(&iops),
            lat_us: Percentiles::median_of(&lats),
            cpu_s_per_gib: stats::median(&cpu),
            errors,
            error,
            pct_raw: None,
            bound_mib_s: None,
            ceiling_mib_s: None,
            pct_bound: None,
            pct_classic: None,
            disk_kib_per_req: disk_median(&reps),
        }
    }

    /// Median MiB/s (None when nothing completed).
    pub fn mib(&self) -> Option<f64> {
        self.mib_s.map(|s| s.median)
    }

    pub(crate) fn same_workload(&self, o: &CellResult) -> bool {
        self.phase == o.phase
            && self.rw == o.rw
            && self.bs == o.bs
            && self.qd == o.qd
            && self.jobs == o.jobs
    }
}

/// A target that could not run, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Skipped {
    /// Target name.
    pub target: String,
    /// Reason.
    pub reason: String,
}

/// The options as recorded in the JSON.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OptionsRecord {
    /// quick / default / full.
    pub profile: String,
    /// Ramdisk bytes.
    pub size_bytes: u64,
    /// Sector size of the encrypted targets.
    pub sector_size: u32,
    /// Headline targets.
    pub targets: Vec<String>,
    /// Sweep targets.
    pub sweep_targets: Vec<String>,
    /// Sweep directions.
    pub rw: Vec<Rw>,
    /// Sweep block sizes.
    pub bs: Vec<u32>,
    /// Sweep queue depths.
    pub qd: Vec<usize>,
    /// Sweep jobs.
    pub jobs: Vec<usize>,
    /// Headline repetition length, ms.
    pub runtime_ms: u64,
    /// Sweep repetition length, ms.
    pub sweep_runtime_ms: u64,
    /// Warm-up per target per cell, ms.
    pub warmup_ms: u64,
    /// Headline repetitions.
    pub reps: usize,
    /// Sweep repetitions.
    pub sweep_reps: usize,
}

impl From<&Options> for OptionsRecord {
    fn from(o: &Options) -> Self {
        Self {
            profile: o.profile.clone(),
            size_bytes: o.size,
            sector_size: o.sector_size,
            targets: o.targets.iter().map(ToString::to_string).collect(),
            sweep_targets: o.sweep_targets.iter().map(ToString::to_string).collect(),
            rw: o.rw.clone(),
            bs: o.bs.clone(),
            qd: o.qd.clone(),
            jobs: o.jobs.clone(),
            runtime_ms: o.runtime.as_millis() as u64,
            sweep_runtime_ms: o.sweep_runtime.as_millis() as u64,
            warmup_ms: o.warmup.as_millis() as u64,
            reps: o.reps,
            sweep_reps: o.sweep_reps,
        }
    }
}

/// A whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `ucrypt bench <version>`.
    pub tool: String,
    /// Start time, RFC 3339 UTC.
    pub started: String,
    /// Wall time of the run in seconds.
    pub duration_s: f64,
    /// Where the numbers come from.
    pub machine: Machine,
    /// `in-process`, `fio`, `file`, `vhost`, ... (see [`crate::runner::Runner::via`]).
    pub via: String,
    /// Where the bytes live, when `via` does not say it (`--via file`:
    /// the file, and O_DIRECT or the page cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// What was asked.
    pub options: OptionsRecord,
    /// Crypto throughput measured in this run.
    pub crypto: Vec<CryptoSpeed>,
    /// Every cell.
    pub cells: Vec<CellResult>,
    /// Targets that could not run.
    pub skipped: Vec<Skipped>,
}

/// The name of the storage's own rate under `--dir` ([`io_target`]).
pub const DISK_TARGET: &str = "disk";
