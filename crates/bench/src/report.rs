//! Results: per-cell records, derived ratios (% of raw, of the bound, of
//! classic), the readable table, and the JSON/CSV files.
//!
//! The JSON layout is documented in docs/BENCHMARKING.md; bump
//! [`SCHEMA_VERSION`] on any incompatible change.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::driver::{RepResult, Rw, Workload};
use crate::stats::{self, Percentiles, Summary};
use crate::target::{Cipher, Mode};
use crate::{CryptoSpeed, Error, Options};

/// Version of the results JSON layout.
pub const SCHEMA_VERSION: u32 = 1;

/// Which part of the run a cell belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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
    /// The bound io·c/(io+c) in MiB/s (io = raw, c = crypto at this bs).
    pub bound_mib_s: Option<f64>,
    /// Median throughput as % of the bound.
    pub pct_bound: Option<f64>,
    /// Median throughput as % of the same cipher's classic mode.
    pub pct_classic: Option<f64>,
}

impl CellResult {
    /// Aggregates repetitions: medians and spread.
    pub fn from_reps(
        phase: Phase,
        target: &str,
        cipher: Option<Cipher>,
        mode: Option<Mode>,
        w: &Workload,
        reps: Vec<RepResult>,
    ) -> Self {
        let n = reps.len();
        let errors = reps.iter().map(|r| r.errors).sum();
        let error = reps.iter().find_map(|r| r.first_error.clone());
        let ok: Vec<RepResult> = reps.into_iter().filter(|r| r.ops > 0).collect();
        let mib: Vec<f64> = ok
            .iter()
            .map(|r| stats::mib_per_s(r.bytes_per_s()))
            .collect();
        let iops: Vec<f64> = ok.iter().map(RepResult::iops).collect();
        let cpu: Vec<f64> = ok.iter().filter_map(RepResult::cpu_s_per_gib).collect();
        let lats: Vec<Percentiles> = ok
            .into_iter()
            .filter_map(|mut r| Percentiles::of_ns(&mut r.lat_ns))
            .collect();
        let mut c = Self::from_parts(phase, target, cipher, mode, w, n, &mib, &iops, &lats, &cpu);
        c.errors = errors;
        c.error = error;
        c
    }

    /// Builds a cell from per-repetition MiB/s, IOPS, latency percentiles
    /// and CPU s/GiB (medians taken here).
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        phase: Phase,
        target: &str,
        cipher: Option<Cipher>,
        mode: Option<Mode>,
        w: &Workload,
        reps: usize,
        mib: &[f64],
        iops: &[f64],
        lats: &[Percentiles],
        cpu: &[f64],
    ) -> Self {
        Self {
            phase,
            target: target.to_string(),
            cipher,
            mode: if cipher.is_some() { mode } else { None },
            rw: w.rw,
            bs: w.bs,
            qd: w.qd,
            jobs: w.jobs,
            reps,
            mib_s: Summary::of(mib),
            iops: stats::median(iops),
            lat_us: Percentiles::median_of(lats),
            cpu_s_per_gib: stats::median(cpu),
            errors: 0,
            error: None,
            pct_raw: None,
            bound_mib_s: None,
            pct_bound: None,
            pct_classic: None,
        }
    }

    /// Median MiB/s (None when nothing completed).
    pub fn mib(&self) -> Option<f64> {
        self.mib_s.map(|s| s.median)
    }

    fn same_workload(&self, o: &CellResult) -> bool {
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

/// The machine the numbers come from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// CPU model (from /proc/cpuinfo).
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Total memory in bytes.
    pub mem_total_bytes: u64,
    /// Kernel release.
    pub kernel: String,
    /// CPU flags that matter for AES (`aes`, `vaes`, `avx2`, `avx512f`).
    pub cpu_flags: Vec<String>,
}

impl Machine {
    /// Reads /proc.
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let flags = field("flags").unwrap_or_default();
        let cpu_flags = ["aes", "vaes", "avx2", "avx512f"]
            .iter()
            .filter(|f| flags.split_whitespace().any(|x| x == **f))
            .map(|f| f.to_string())
            .collect();
        let mem_total_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .map(str::to_string)
            })
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
        Self {
            cpu_model: field("model name").unwrap_or_else(|| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_total_bytes,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".into(), |s| s.trim().to_string()),
            cpu_flags,
        }
    }

    /// One line: `AMD EPYC, 2 CPUs (aes avx2), 23.5 GiB, Linux 6.18`.
    pub fn describe(&self) -> String {
        format!(
            "{}, {} CPUs ({}), {:.1} GiB RAM, Linux {}",
            self.cpu_model,
            self.cpus,
            if self.cpu_flags.is_empty() {
                "no AES-NI".into()
            } else {
                self.cpu_flags.join(" ")
            },
            self.mem_total_bytes as f64 / stats::GIB,
            self.kernel
        )
    }
}

/// The options as recorded in the JSON.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OptionsRecord {
    /// quick / default / full.
    pub profile: String,
    /// Ramdisk bytes.
    pub size_bytes: u64,
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
    /// `in-process` or `fio`.
    pub via: String,
    /// What was asked.
    pub options: OptionsRecord,
    /// Crypto throughput measured in this run.
    pub crypto: Vec<CryptoSpeed>,
    /// Every cell.
    pub cells: Vec<CellResult>,
    /// Targets that could not run.
    pub skipped: Vec<Skipped>,
}

/// Fills `pct_raw`, `bound_mib_s`, `pct_bound` and `pct_classic` from the
/// other cells of the same workload.
pub fn derive(cells: &mut [CellResult], crypto: &[CryptoSpeed]) {
    let snapshot: Vec<CellResult> = cells.to_vec();
    for (i, c) in snapshot.iter().enumerate() {
        let Some(mine) = c.mib() else { continue };
        let peer = |pred: &dyn Fn(&CellResult) -> bool| {
            snapshot
                .iter()
                .find(|o| o.same_workload(c) && pred(o))
                .and_then(CellResult::mib)
        };
        let out = &mut cells[i];
        let raw = peer(&|o| o.target == "raw");
        if let Some(raw) = raw {
            out.pct_raw = stats::percent(mine, raw);
        }
        if let (Some(cipher), Some(raw)) = (c.cipher, raw) {
            let speed = crypto
                .iter()
                .find(|s| s.cipher == cipher.spec() && s.bs == c.bs);
            if let Some(s) = speed {
                let cs = if c.rw.is_write() {
                    s.encrypt_mib_s
                } else {
                    s.decrypt_mib_s
                };
                let b = stats::bound(raw, cs);
                if b > 0.0 {
                    out.bound_mib_s = Some(b);
                    out.pct_bound = stats::percent(mine, b);
                }
            }
        }
        if c.cipher.is_some() {
            let classic = c
                .mode
                .and_then(|m| c.target.strip_suffix(m.name()))
                .map(|p| format!("{p}classic"));
            if let Some(cl) = classic.and_then(|name| peer(&|o| o.target == name)) {
                out.pct_classic = stats::percent(mine, cl);
            }
        }
    }
}

/// `4k`, `64k`, `1M`.
pub fn fmt_bs(bs: u32) -> String {
    if bs >= 1 << 20 && bs % (1 << 20) == 0 {
        format!("{}M", bs >> 20)
    } else if bs >= 1024 && bs % 1024 == 0 {
        format!("{}k", bs >> 10)
    } else {
        bs.to_string()
    }
}

fn opt(v: Option<f64>, prec: usize, suffix: &str) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}{suffix}"),
        Some(_) => "inf".into(),
        None => "-".into(),
    }
}

impl Report {
    /// The readable table: the headline first (like the seeds' tables),
    /// then the crypto speeds, then a one-line summary per heatmap.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let head: Vec<&CellResult> = self
            .cells
            .iter()
            .filter(|c| c.phase == Phase::Headline)
            .collect();
        let o = &self.options;
        let _ = writeln!(
            s,
            "ucrypt bench ({}, {}), {} MiB ramdisk, median of {} x {} ms",
            self.via,
            o.profile,
            o.size_bytes >> 20,
            o.reps,
            o.runtime_ms
        );
        let _ = writeln!(s, "machine: {}", self.machine.describe());
        let mut workloads: Vec<(u32, usize, usize)> = Vec::new();
        for c in &head {
            if !workloads.contains(&(c.bs, c.qd, c.jobs)) {
                workloads.push((c.bs, c.qd, c.jobs));
            }
        }
        for (bs, qd, jobs) in workloads {
            let head: Vec<&CellResult> = head
                .iter()
                .copied()
                .filter(|c| (c.bs, c.qd, c.jobs) == (bs, qd, jobs))
                .collect();
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "{} sequential, QD{qd}, {jobs} job{}:",
                fmt_bs(bs),
                if jobs == 1 { "" } else { "s" }
            );
            head_table(&mut s, &head);
        }
        let crypto4k: Vec<&CryptoSpeed> = self.crypto.iter().filter(|c| c.bs == 4096).collect();
        if !crypto4k.is_empty() {
            let _ = writeln!(s);
            for c in crypto4k {
                let _ = writeln!(
                    s,
                    "crypto c (1 thread, 4k): {:<22} encrypt {:>9} MiB/s  decrypt {:>9} MiB/s",
                    c.cipher,
                    opt(Some(c.encrypt_mib_s), 0, ""),
                    opt(Some(c.decrypt_mib_s), 0, "")
                );
            }
            let _ = writeln!(
                s,
                "bound = io·c/(io+c), io = raw's MiB/s in the same cell (seed 002)"
            );
        }
        for c in head.iter().filter(|c| c.error.is_some()) {
            let _ = writeln!(
                s,
                "error: {} {}: {} failed request(s): {}",
                c.target,
                c.rw.name(),
                c.errors,
                c.error.as_deref().unwrap_or("")
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "skipped: {}: {}", k.target, k.reason);
        }
        let sweep: Vec<&CellResult> = self
            .cells
            .iter()
            .filter(|c| c.phase == Phase::Sweep)
            .collect();
        if !sweep.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "sweep: {} cells (bs {} × QD {:?} × jobs {:?} × {}), median of {} × {} ms; % of classic (min / median / max):",
                sweep.len(),
                o.bs.iter().map(|&b| fmt_bs(b)).collect::<Vec<_>>().join(","),
                o.qd,
                o.jobs,
                o.rw.iter().map(|r| r.name()).collect::<Vec<_>>().join(","),
                o.sweep_reps,
                o.sweep_runtime_ms
            );
            let mut names: Vec<&str> = Vec::new();
            for c in &sweep {
                if c.pct_classic.is_some()
                    && c.mode != Some(Mode::Classic)
                    && !names.contains(&c.target.as_str())
                {
                    names.push(&c.target);
                }
            }
            for name in names {
                for &rw in &o.rw {
                    let v: Vec<&&CellResult> = sweep
                        .iter()
                        .filter(|c| c.target == name && c.rw == rw && c.pct_classic.is_some())
                        .collect();
                    let p: Vec<f64> = v.iter().filter_map(|c| c.pct_classic).collect();
                    let (Some(min), Some(max)) = (
                        v.iter().min_by(|a, b| {
                            a.pct_classic
                                .unwrap_or(0.0)
                                .total_cmp(&b.pct_classic.unwrap_or(0.0))
                        }),
                        v.iter().max_by(|a, b| {
                            a.pct_classic
                                .unwrap_or(0.0)
                                .total_cmp(&b.pct_classic.unwrap_or(0.0))
                        }),
                    ) else {
                        continue;
                    };
                    let at = |c: &CellResult| format!("{} QD{} j{}", fmt_bs(c.bs), c.qd, c.jobs);
                    let _ = writeln!(
                        s,
                        "  {:<16} {:<9} {:>4.0}% ({})  {:>4.0}%  {:>4.0}% ({})",
                        name,
                        rw.name(),
                        min.pct_classic.unwrap_or(0.0),
                        at(min),
                        stats::median(&p).unwrap_or(0.0),
                        max.pct_classic.unwrap_or(0.0),
                        at(max)
                    );
                }
            }
        }
        s
    }

    /// CSV of every cell (one header line).
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "phase,target,cipher,mode,rw,bs,qd,jobs,reps,mib_s,mib_s_min,mib_s_max,spread_pct,mb_s,iops,\
             p50_us,p99_us,p999_us,cpu_s_per_gib,errors,pct_raw,bound_mib_s,pct_bound,pct_classic\n",
        );
        let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
        for c in &self.cells {
            let phase = match c.phase {
                Phase::Headline => "headline",
                Phase::Sweep => "sweep",
            };
            let _ = writeln!(
                s,
                "{phase},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                c.target,
                c.cipher.map_or("", |c| c.spec()).replace(',', ";"),
                c.mode.map_or("", Mode::name),
                c.rw.name(),
                c.bs,
                c.qd,
                c.jobs,
                c.reps,
                f(c.mib()),
                f(c.mib_s.map(|m| m.min)),
                f(c.mib_s.map(|m| m.max)),
                f(c.mib_s.map(|m| m.spread_pct)),
                f(c.mib().map(stats::mib_to_mb)),
                f(c.iops),
                f(c.lat_us.map(|l| l.p50)),
                f(c.lat_us.map(|l| l.p99)),
                f(c.lat_us.map(|l| l.p999)),
                f(c.cpu_s_per_gib),
                c.errors,
                f(c.pct_raw),
                f(c.bound_mib_s),
                f(c.pct_bound),
                f(c.pct_classic),
            );
        }
        s
    }

    /// JSON (see docs/BENCHMARKING.md). Non-finite numbers become null.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Writes table.txt, results.json, cells.csv and the heatmaps into
    /// `dir`; returns the files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Output {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files = Vec::new();
        let mut put = |name: &str, bytes: &[u8]| -> Result<(), Error> {
            let p = dir.join(name);
            std::fs::write(&p, bytes).map_err(|source| Error::Output {
                path: p.clone(),
                source,
            })?;
            files.push(p);
            Ok(())
        };
        put("table.txt", self.table().as_bytes())?;
        put("results.json", self.json().as_bytes())?;
        put("cells.csv", self.csv().as_bytes())?;
        for map in crate::heatmap::build(self) {
            put(&format!("{}.svg", map.file_stem), map.svg().as_bytes())?;
            put(&format!("{}.png", map.file_stem), &map.png()?)?;
        }
        Ok(files)
    }
}

fn head_table(s: &mut String, head: &[&CellResult]) {
    let _ = writeln!(
        s,
        "{:<24} {:>10} {:>11} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
        "target",
        "read MiB/s",
        "write MiB/s",
        "read",
        "write",
        "read",
        "write",
        "read p50",
        "write p50",
        "read",
        "write"
    );
    let _ = writeln!(
        s,
        "{:<24} {:>10} {:>11} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
        "", "", "", "% raw", "% raw", "% bound", "% bound", "µs", "µs", "±%", "±%"
    );
    let mut names: Vec<&str> = Vec::new();
    for c in head {
        if !names.contains(&c.target.as_str()) {
            names.push(&c.target);
        }
    }
    for name in names {
        let get = |rw: Rw| {
            head.iter()
                .find(|c| c.target == name && c.rw == rw)
                .copied()
        };
        let (r, w) = (get(Rw::Read), get(Rw::Write));
        let f = |c: Option<&CellResult>,
                 g: &dyn Fn(&CellResult) -> Option<f64>,
                 p: usize,
                 suf: &str| opt(c.and_then(g), p, suf);
        let tput = |c: Option<&CellResult>| match c {
            Some(c) if c.mib_s.is_none() => "error".to_string(),
            _ => f(c, &CellResult::mib, 1, ""),
        };
        let _ = writeln!(
            s,
            "{:<24} {:>10} {:>11} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
            name,
            tput(r),
            tput(w),
            f(r, &|c| c.pct_raw, 0, "%"),
            f(w, &|c| c.pct_raw, 0, "%"),
            f(r, &|c| c.pct_bound, 0, "%"),
            f(w, &|c| c.pct_bound, 0, "%"),
            f(r, &|c| c.lat_us.map(|l| l.p50), 1, ""),
            f(w, &|c| c.lat_us.map(|l| l.p50), 1, ""),
            f(r, &|c| c.mib_s.map(|m| m.spread_pct), 0, ""),
            f(w, &|c| c.mib_s.map(|m| m.spread_pct), 0, ""),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rep(bytes: u64, ms: u64) -> RepResult {
        RepResult {
            bytes,
            ops: bytes / 4096,
            elapsed: Duration::from_millis(ms),
            lat_ns: vec![1000; 3],
            ..RepResult::default()
        }
    }

    fn cell(
        target: &str,
        cipher: Option<Cipher>,
        mode: Mode,
        rw: Rw,
        mib_per_100ms: &[u64],
    ) -> CellResult {
        let w = Workload {
            rw,
            bs: 4096,
            qd: 1,
            jobs: 1,
            runtime: Duration::from_millis(100),
        };
        let reps = mib_per_100ms.iter().map(|&m| rep(m << 20, 100)).collect();
        CellResult::from_reps(Phase::Headline, target, cipher, Some(mode), &w, reps)
    }

    #[test]
    fn derive_ratios_and_bound() {
        // raw 200 MiB/s; null classic 80; inline 200; aes inline 100 with
        // c = 300 MiB/s → bound 200·300/500 = 120 → 83.3%.
        let mut cells = vec![
            cell("raw", None, Mode::Classic, Rw::Read, &[19, 20, 21]),
            cell(
                "null-classic",
                Some(Cipher::Null),
                Mode::Classic,
                Rw::Read,
                &[8, 8, 9],
            ),
            cell(
                "null-inline",
                Some(Cipher::Null),
                Mode::Inline,
                Rw::Read,
                &[20, 20, 20],
            ),
            cell(
                "aes-inline",
                Some(Cipher::AesXts),
                Mode::Inline,
                Rw::Read,
                &[10],
            ),
        ];
        assert_eq!(cells[0].mib(), Some(200.0));
        assert_eq!(cells[0].mib_s.unwrap().spread_pct, 10.0);
        let crypto = vec![CryptoSpeed {
            cipher: "aes-xts-plain64".into(),
            bs: 4096,
            encrypt_mib_s: 1.0,
            decrypt_mib_s: 300.0,
        }];
        derive(&mut cells, &crypto);
        assert_eq!(cells[0].pct_raw, Some(100.0));
        assert_eq!(cells[1].pct_raw, Some(40.0));
        assert_eq!(cells[2].pct_classic, Some(250.0));
        assert_eq!(cells[3].bound_mib_s, Some(120.0));
        assert!((cells[3].pct_bound.unwrap() - 83.333).abs() < 0.01);
        assert_eq!(cells[3].pct_classic, None);
        assert_eq!(
            cells[1].pct_bound, None,
            "no crypto speed measured for null"
        );
    }

    #[test]
    fn bs_names() {
        assert_eq!(fmt_bs(4096), "4k");
        assert_eq!(fmt_bs(4 << 20), "4M");
        assert_eq!(fmt_bs(1536), "1536");
    }
}
