//! `ucrypt bench`: the seeds' experiment as one command.
//!
//! The seeds measure dm-crypt on a ramdisk (no hardware bias) with the null
//! cipher (no crypto cost), compare plain vs default vs inline dm-crypt,
//! relate the result to the bound `io·c/(io+c)`, then sweep block size ×
//! queue depth × jobs (Le Moal's heatmaps). This crate does the same
//! in-process over [`datapath::Engine`] and a [`backend::MemBackend`]:
//!
//! ```text
//!   plan (headline 4k QD1 1 job, then bs × QD × jobs sweep)
//!     │ for each cell, repetitions interleaved over targets
//!     ▼
//!   driver::run ── jobs × QD ──► Engine(raw | null/aes × classic/inline/adaptive)
//!     │                                     │
//!     ▼                                     ▼
//!   CellResult (MiB/s, IOPS, p50/p99/p99.9, CPU s/GiB)   MemBackend ramdisk
//!     │
//!     ▼
//!   report (table, JSON, CSV) + heatmap (PNG, SVG) in results/bench-<time>/
//! ```
//!
//! `--via fio` / `--peers` ([`external`]) and `--dm-crypt` ([`dmcrypt`])
//! run the same jobs through fio against other block-device servers or the
//! kernel.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::{Backend, MemBackend};

pub mod dmcrypt;
pub mod driver;
pub mod external;
pub mod heatmap;
pub mod report;
pub mod stats;
pub mod target;

pub use driver::{Rw, Workload};
pub use report::{CellResult, Phase, Report};
pub use target::{Cipher, Mode, Target};

/// Errors of the bench.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad options.
    #[error("{0}")]
    Usage(String),
    /// A target could not be built (cipher unsupported, engine failed).
    #[error("{0}")]
    Target(String),
    /// A required program, device or privilege is missing.
    #[error("{0}")]
    Missing(String),
    /// An external program failed or printed something unexpected.
    #[error("{0}")]
    External(String),
    /// Writing results failed.
    #[error("Cannot write {path}")]
    Output {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Everything `ucrypt bench` can be told.
#[derive(Debug, Clone)]
pub struct Options {
    /// Profile name recorded in the results (`quick`, `default`, `full`).
    pub profile: String,
    /// Ramdisk size in bytes.
    pub size: u64,
    /// Targets of the headline table.
    pub targets: Vec<Target>,
    /// Targets of the sweep (heatmaps need raw, classic and inline/adaptive
    /// of the same cipher).
    pub sweep_targets: Vec<Target>,
    /// Sweep directions/patterns.
    pub rw: Vec<Rw>,
    /// Sweep block sizes in bytes.
    pub bs: Vec<u32>,
    /// Sweep queue depths.
    pub qd: Vec<usize>,
    /// Sweep job counts.
    pub jobs: Vec<usize>,
    /// Run time of one headline repetition.
    pub runtime: Duration,
    /// Run time of one sweep repetition.
    pub sweep_runtime: Duration,
    /// Warm-up run before each cell's repetitions (per target).
    pub warmup: Duration,
    /// Headline repetitions.
    pub reps: usize,
    /// Sweep repetitions.
    pub sweep_reps: usize,
    /// Results folder.
    pub out: PathBuf,
    /// Show a progress bar (only when stderr is a terminal).
    pub progress: bool,
}

impl Options {
    /// The default run (~1–2 minutes): every target in the headline, the
    /// full bs × QD × jobs sweep over raw and AES-XTS classic/inline/adaptive.
    pub fn standard() -> Self {
        Self {
            profile: "default".into(),
            size: 1 << 30,
            targets: Target::all(),
            sweep_targets: sweep_set(Cipher::AesXts),
            rw: vec![Rw::Read, Rw::Write],
            bs: vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20],
            qd: vec![1, 4, 16, 64],
            jobs: vec![1, 2, 4],
            runtime: Duration::from_millis(250),
            sweep_runtime: Duration::from_millis(40),
            warmup: Duration::from_millis(20),
            reps: 5,
            sweep_reps: 3,
            out: default_out_dir(),
            progress: true,
        }
    }

    /// `--quick` (CI): all headline targets briefly, a 3 × 2 × 2 sweep.
    pub fn quick() -> Self {
        Self {
            profile: "quick".into(),
            size: 256 << 20,
            bs: vec![4 << 10, 64 << 10, 1 << 20],
            qd: vec![1, 16],
            jobs: vec![1, 2],
            runtime: Duration::from_millis(60),
            sweep_runtime: Duration::from_millis(20),
            warmup: Duration::from_millis(10),
            reps: 3,
            sweep_reps: 3,
            ..Self::standard()
        }
    }

    /// `--full`: longer runs, more repetitions, 8 jobs, both ciphers swept.
    pub fn full() -> Self {
        let mut sweep_targets = sweep_set(Cipher::Null);
        sweep_targets.extend(
            sweep_set(Cipher::AesXts)
                .into_iter()
                .filter(|t| *t != Target::RAW),
        );
        Self {
            profile: "full".into(),
            size: 2 << 30,
            sweep_targets,
            rw: vec![Rw::Read, Rw::Write, Rw::RandRead, Rw::RandWrite],
            jobs: vec![1, 2, 4, 8],
            runtime: Duration::from_secs(1),
            sweep_runtime: Duration::from_millis(200),
            warmup: Duration::from_millis(50),
            reps: 5,
            sweep_reps: 5,
            ..Self::standard()
        }
    }

    /// Rough wall-time estimate in seconds (for the banner).
    pub fn estimate_secs(&self) -> f64 {
        let head = self.targets.len() as f64
            * 2.0
            * (self.warmup + self.runtime * self.reps as u32).as_secs_f64();
        let mut sweep = 0.0;
        for &bs in &self.bs {
            for &qd in &self.qd {
                for &jobs in &self.jobs {
                    let w = Workload {
                        rw: Rw::Read,
                        bs,
                        qd,
                        jobs,
                        runtime: self.sweep_runtime,
                    };
                    let rep = (self.sweep_runtime + drain_estimate(&w)).as_secs_f64();
                    sweep += self.warmup.as_secs_f64() + rep * self.sweep_reps as f64;
                }
            }
        }
        head + sweep * (self.rw.len() * self.sweep_targets.len()) as f64
    }

    /// Checks the options (also done by [`run`]).
    pub fn validate(&self) -> Result<(), Error> {
        if self.size < 1 << 20 || self.size % 512 != 0 {
            return Err(Error::Usage(
                "The ramdisk size must be at least 1 MiB and a multiple of 512".into(),
            ));
        }
        if let Some(bs) = self
            .bs
            .iter()
            .find(|&&b| b == 0 || b % 512 != 0 || u64::from(b) > self.size)
        {
            return Err(Error::Usage(format!(
                "Block size {bs} is not a non-zero multiple of 512 no larger than the ramdisk"
            )));
        }
        if self.qd.contains(&0) || self.jobs.contains(&0) {
            return Err(Error::Usage(
                "Queue depth and jobs must be at least 1".into(),
            ));
        }
        if self.reps == 0 || self.sweep_reps == 0 {
            return Err(Error::Usage("Repetitions must be at least 1".into()));
        }
        if self.runtime.is_zero() || self.sweep_runtime.is_zero() {
            return Err(Error::Usage("Run time must be positive".into()));
        }
        Ok(())
    }
}

/// Time to drain what a workload keeps in flight, at an assumed 1.5 GB/s
/// (for estimates and the progress bar only).
fn drain_estimate(w: &Workload) -> Duration {
    Duration::from_secs_f64((u64::from(w.bs) * (w.qd * w.jobs) as u64) as f64 / 1.5e9)
}

/// raw + `cipher` classic/inline/adaptive: what the heatmaps need.
pub fn sweep_set(cipher: Cipher) -> Vec<Target> {
    vec![
        Target::RAW,
        Target::new(cipher, Mode::Classic),
        Target::new(cipher, Mode::Inline),
        Target::new(cipher, Mode::Adaptive),
    ]
}

/// `./results/bench-<UTC timestamp>/`.
pub fn default_out_dir() -> PathBuf {
    PathBuf::from("results").join(format!("bench-{}", timestamp_compact()))
}

/// UTC now as `20261121T111500Z`.
pub fn timestamp_compact() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(['-', ':'], "")
}

/// Crypto throughput of one cipher at one buffer size, single thread.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CryptoSpeed {
    /// Cipher spec.
    pub cipher: String,
    /// Buffer size in bytes.
    pub bs: u32,
    /// Encryption MiB/s (infinite is reported as null: a no-op cipher).
    pub encrypt_mib_s: f64,
    /// Decryption MiB/s.
    pub decrypt_mib_s: f64,
}

/// Measures `SectorCrypt` encrypt/decrypt throughput on a `bs` buffer for
/// about `budget` each, with the same measurement as `ucrypt benchmark`
/// (`crypto::speed::throughput`).
pub fn measure_crypto(cipher: Cipher, bs: u32, budget: Duration) -> Result<CryptoSpeed, Error> {
    let c = cipher.build()?;
    let t = crypto::speed::throughput(&c, bs as usize, budget);
    Ok(CryptoSpeed {
        cipher: cipher.spec().into(),
        bs,
        encrypt_mib_s: stats::mib_per_s(t.encrypt_bytes_per_sec),
        decrypt_mib_s: stats::mib_per_s(t.decrypt_bytes_per_sec),
    })
}

/// Runs the in-process bench and returns the report (not yet written).
pub fn run(opts: &Options) -> Result<Report, Error> {
    opts.validate()?;
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let t0 = Instant::now();
    let mem = MemBackend::new(opts.size).map_err(|e| {
        Error::Target(format!(
            "Cannot allocate a {} MiB ramdisk: {e}",
            opts.size >> 20
        ))
    })?;
    let backend: Arc<dyn Backend> = Arc::new(mem);
    prefill(&*backend)?;

    // Engines for every target; a target that cannot start is skipped.
    let max_qd =
        opts.qd.iter().max().copied().unwrap_or(1) * opts.jobs.iter().max().copied().unwrap_or(1);
    let mut all: Vec<Target> = opts.targets.clone();
    all.extend(
        opts.sweep_targets
            .iter()
            .filter(|t| !opts.targets.contains(t)),
    );
    let mut engines: HashMap<Target, Arc<datapath::Engine>> = HashMap::new();
    let mut skipped = Vec::new();
    for t in &all {
        match t.engine(Arc::clone(&backend), max_qd.max(1)) {
            Ok(e) => {
                engines.insert(*t, Arc::new(e));
            }
            Err(e) => skipped.push(report::Skipped {
                target: t.to_string(),
                reason: e.to_string(),
            }),
        }
    }
    let head_targets: Vec<Target> = opts
        .targets
        .iter()
        .copied()
        .filter(|t| engines.contains_key(t))
        .collect();
    let sweep_targets: Vec<Target> = opts
        .sweep_targets
        .iter()
        .copied()
        .filter(|t| engines.contains_key(t))
        .collect();

    // Crypto throughput of every cipher in use at every block size.
    let mut crypto_speeds = Vec::new();
    let mut ciphers: Vec<Cipher> = all
        .iter()
        .filter(|t| engines.contains_key(t))
        .filter_map(|t| t.cipher)
        .collect();
    ciphers.dedup();
    ciphers.sort_by_key(|c| c.short());
    ciphers.dedup();
    let mut sizes: Vec<u32> = vec![4096];
    if !sweep_targets.is_empty() {
        sizes.extend(&opts.bs);
    }
    sizes.sort_unstable();
    sizes.dedup();
    let crypto_budget = (opts.sweep_runtime / 2).max(Duration::from_millis(10));
    for &c in &ciphers {
        for &bs in &sizes {
            crypto_speeds.push(measure_crypto(c, bs, crypto_budget)?);
        }
    }

    // The plan, for the progress bar.
    let head_w: Vec<Workload> = [Rw::Read, Rw::Write]
        .into_iter()
        .map(|rw| Workload {
            rw,
            bs: 4096,
            qd: 1,
            jobs: 1,
            runtime: opts.runtime,
        })
        .collect();
    let mut sweep_w = Vec::new();
    if sweep_targets.len() > 1 {
        for &rw in &opts.rw {
            for &bs in &opts.bs {
                for &jobs in &opts.jobs {
                    for &qd in &opts.qd {
                        sweep_w.push(Workload {
                            rw,
                            bs,
                            qd,
                            jobs,
                            runtime: opts.sweep_runtime,
                        });
                    }
                }
            }
        }
    }
    let cost = |w: &Workload, reps: usize, n: usize| {
        let rep = w.runtime + drain_estimate(w);
        ((opts.warmup + rep * reps as u32) * n as u32).as_millis() as u64
    };
    let total: u64 = head_w
        .iter()
        .map(|w| cost(w, opts.reps, head_targets.len()))
        .sum::<u64>()
        + sweep_w
            .iter()
            .map(|w| cost(w, opts.sweep_reps, sweep_targets.len()))
            .sum::<u64>();
    let bar = progress_bar(opts.progress, total);

    let mut cells = Vec::new();
    for w in &head_w {
        bar.set_message(format!("headline {} 4k QD1", w.rw.name()));
        cells.extend(run_cell(
            &engines,
            &head_targets,
            w,
            opts.reps,
            opts,
            Phase::Headline,
            &bar,
        ));
    }
    for w in &sweep_w {
        bar.set_message(format!(
            "sweep {} bs={} QD{} jobs={}",
            w.rw.name(),
            report::fmt_bs(w.bs),
            w.qd,
            w.jobs
        ));
        cells.extend(run_cell(
            &engines,
            &sweep_targets,
            w,
            opts.sweep_reps,
            opts,
            Phase::Sweep,
            &bar,
        ));
    }
    bar.finish_and_clear();
    for e in engines.values() {
        let _ = e.shutdown();
    }
    report::derive(&mut cells, &crypto_speeds);
    Ok(Report {
        schema_version: report::SCHEMA_VERSION,
        tool: format!("ucrypt bench {}", env!("CARGO_PKG_VERSION")),
        started,
        duration_s: t0.elapsed().as_secs_f64(),
        machine: report::Machine::detect(),
        via: "in-process".into(),
        options: report::OptionsRecord::from(opts),
        crypto: crypto_speeds,
        cells,
        skipped,
    })
}

fn run_cell(
    engines: &HashMap<Target, Arc<datapath::Engine>>,
    targets: &[Target],
    w: &Workload,
    reps: usize,
    opts: &Options,
    phase: Phase,
    bar: &indicatif::ProgressBar,
) -> Vec<CellResult> {
    let mut runs: Vec<Vec<driver::RepResult>> = vec![Vec::new(); targets.len()];
    if !opts.warmup.is_zero() {
        for t in targets {
            // A shallow warm-up: it wakes the engine's threads and caches
            // without draining a deep queue of large blocks twice.
            let warm = Workload {
                runtime: opts.warmup,
                qd: w.qd.min(4),
                ..*w
            };
            driver::run(&engines[t], &warm, opts.size);
            bar.inc(opts.warmup.as_millis() as u64);
        }
    }
    // Repetitions interleave targets so that background noise hits all alike.
    for _ in 0..reps {
        for (i, t) in targets.iter().enumerate() {
            runs[i].push(driver::run(&engines[t], w, opts.size));
            bar.inc((w.runtime + drain_estimate(w)).as_millis() as u64);
        }
    }
    targets
        .iter()
        .zip(runs)
        .map(|(t, r)| CellResult::from_reps(phase, &t.to_string(), t.cipher, Some(t.mode), w, r))
        .collect()
}

/// Writes a pattern over the whole ramdisk so reads touch real pages.
fn prefill(b: &dyn Backend) -> Result<(), Error> {
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i as u8) ^ 0x3c).collect();
    let size = b.size();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(chunk.len() as u64) as usize;
        b.write_at(&chunk[..n], off, false)
            .map_err(|e| Error::Target(format!("Cannot fill the ramdisk: {e}")))?;
        off += n as u64;
    }
    Ok(())
}

fn progress_bar(enabled: bool, total_ms: u64) -> indicatif::ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_ms);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_valid_and_ordered() {
        let (q, d, f) = (Options::quick(), Options::standard(), Options::full());
        for o in [&q, &d, &f] {
            o.validate().unwrap();
            assert!(o.size <= 2 << 30, "ramdisk stays within 2 GiB");
            assert!(o.sweep_targets.contains(&Target::RAW));
        }
        assert!(q.estimate_secs() < d.estimate_secs() && d.estimate_secs() < f.estimate_secs());
        assert_eq!(d.bs.len() * d.qd.len() * d.jobs.len(), 6 * 4 * 3);
        let mut bad = q.clone();
        bad.qd = vec![0];
        assert!(matches!(bad.validate(), Err(Error::Usage(_))));
        bad = q.clone();
        bad.bs = vec![1000];
        assert!(bad.validate().is_err());
    }

    #[test]
    fn drain_estimate_scales_with_bytes_in_flight() {
        let w = Workload {
            rw: Rw::Read,
            bs: 4 << 20,
            qd: 64,
            jobs: 4,
            runtime: Duration::ZERO,
        };
        let d = drain_estimate(&w).as_secs_f64();
        assert!((d - (1u64 << 30) as f64 / 1.5e9).abs() < 1e-6);
    }
}
