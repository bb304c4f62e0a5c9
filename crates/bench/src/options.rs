//! What `ucrypt bench` can be told, and its profiles: `quick` (CI),
//! `default`, `full` and `grid` (the data path's acceptance grid, formerly
//! `datapath/examples/grid.rs`).

use std::path::PathBuf;
use std::time::Duration;

use crate::driver::Rw;
use crate::error::OptionsError;
use crate::plan::{Plan, Shape};
use crate::stats::{parse_duration, parse_size};
use crate::target::{Cipher, Mode, Target};

/// Everything `ucrypt bench` can be told.
#[derive(Debug, Clone)]
pub struct Options {
    /// Profile name recorded in the results (`quick`, `default`, `full`, `grid`).
    pub profile: String,
    /// Ramdisk size in bytes.
    pub size: u64,
    /// Sector size of the encrypted targets (512 … 4096).
    pub sector_size: u32,
    /// Targets of the headline table.
    pub targets: Vec<Target>,
    /// Workload shapes of the headline (each in every direction of
    /// `headline_rw`).
    pub headline: Vec<Shape>,
    /// Directions of the headline: sequential read and write, except where
    /// a runner says otherwise (Ceph: random, as librbd reads ahead).
    pub headline_rw: Vec<Rw>,
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
    /// Sweep repetitions (rounds).
    pub sweep_reps: usize,
    /// Adaptive fuses crypto with the ramdisk's copy (off: moves bytes as
    /// inline does, to tell fusing from scheduling).
    pub fuse: bool,
    /// Adaptive hands off and splits whatever the load (what splitting
    /// gives on an idle machine).
    pub force_split: bool,
    /// Print each engine's per-path counts after every cell (stderr).
    pub engine_stats: bool,
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
            sector_size: 512,
            targets: Target::all(),
            headline: vec![Shape { bs: 4096, qd: 1 }],
            headline_rw: vec![Rw::Read, Rw::Write],
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
            fuse: true,
            force_split: false,
            engine_stats: false,
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

    /// `--profile grid`: the data path's acceptance grid. bs {4k, 64k, 1M,
    /// 4M} × QD {1, 16} × jobs {1, 2}, read and write, raw and the null
    /// and AES-XTS ciphers (4096-byte sectors) classic / inline / adaptive
    /// on a 512 MiB ramdisk; 3 rounds of 250 ms whose order rotates per
    /// round; the table gives each mode's best round and adaptive's ratio
    /// to max(classic, inline). No headline.
    pub fn grid() -> Self {
        let mut sweep_targets = sweep_set(Cipher::Null);
        sweep_targets.extend(
            sweep_set(Cipher::AesXts)
                .into_iter()
                .filter(|t| *t != Target::RAW),
        );
        Self {
            profile: "grid".into(),
            size: 512 << 20,
            sector_size: 4096,
            targets: Vec::new(),
            sweep_targets,
            bs: vec![4 << 10, 64 << 10, 1 << 20, 4 << 20],
            qd: vec![1, 16],
            jobs: vec![1, 2],
            sweep_runtime: Duration::from_millis(250),
            warmup: Duration::from_millis(60),
            reps: 1,
            sweep_reps: 3,
            ..Self::standard()
        }
    }

    /// The profile called `name`.
    pub fn profile(name: &str) -> Result<Self, OptionsError> {
        match name {
            "quick" => Ok(Self::quick()),
            "default" => Ok(Self::standard()),
            "full" => Ok(Self::full()),
            "grid" => Ok(Self::grid()),
            _ => Err(OptionsError::UnknownProfile(name.into())),
        }
    }

    /// The targets a runner with servers must start: the headline's, then
    /// the sweep's that are not among them (a sweep-only target is swept,
    /// not measured in the headline).
    pub fn served_targets(&self) -> Vec<Target> {
        let mut v = self.targets.clone();
        for t in &self.sweep_targets {
            if !v.contains(t) {
                v.push(*t);
            }
        }
        v
    }

    /// Rough wall-time estimate in seconds (for the banner).
    pub fn estimate_secs(&self) -> f64 {
        let plan = Plan::new(self);
        plan.cost(self.targets.len(), self.sweep_targets.len(), self.warmup)
            .as_secs_f64()
    }

    /// Checks the options (also done by every runner).
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.size < 1 << 20 || self.size % 512 != 0 {
            return Err(OptionsError::RamdiskSize);
        }
        if ![512, 1024, 2048, 4096].contains(&self.sector_size) {
            return Err(OptionsError::SectorSize(self.sector_size));
        }
        let all_bs = self.bs.iter().chain(self.headline.iter().map(|s| &s.bs));
        if let Some(&bs) = all_bs
            .clone()
            .find(|&&b| b == 0 || b % 512 != 0 || u64::from(b) > self.size)
        {
            return Err(OptionsError::BlockSize(bs));
        }
        if let Some(&bs) = all_bs.clone().find(|&&b| b % self.sector_size != 0) {
            return Err(OptionsError::BlockNotSectors {
                bs,
                sector_size: self.sector_size,
            });
        }
        if self.qd.contains(&0) || self.jobs.contains(&0) || self.headline.iter().any(|s| s.qd == 0)
        {
            return Err(OptionsError::ZeroDepth);
        }
        if self.reps == 0 || self.sweep_reps == 0 {
            return Err(OptionsError::ZeroReps);
        }
        if self.runtime.is_zero() || self.sweep_runtime.is_zero() {
            return Err(OptionsError::ZeroRuntime);
        }
        if self.targets.is_empty() && self.sweep_targets.is_empty() {
            return Err(OptionsError::NothingToRun);
        }
        Ok(())
    }
}

/// Command-line changes to a profile, as typed: lists comma-separated
/// (`4k,64k`), sizes with a unit (`512M`), durations with one (`250ms`).
/// [`Options::with_overrides`] parses and applies them; `ucrypt-bench`
/// fills them from its command line (part of [`crate::BenchArgs`]).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Headline targets: names (raw, null-classic, aes-inline …), `null`, `aes`, `all`.
    pub targets: Option<String>,
    /// Sweep targets (heatmaps need raw and <cipher>-classic with inline/adaptive).
    pub sweep_targets: Option<String>,
    /// Skip the sweep (headline table only).
    pub no_sweep: bool,
    /// Sweep block sizes, e.g. 4k,64k,1M.
    pub bs: Option<String>,
    /// Sweep queue depths per job, e.g. 1,4,16,64.
    pub qd: Option<String>,
    /// Sweep job (thread) counts, e.g. 1,2,4.
    pub jobs: Option<String>,
    /// Sweep directions: read,write,randread,randwrite.
    pub rw: Option<String>,
    /// Length of one headline repetition (e.g. 250ms, 1s).
    pub runtime: Option<String>,
    /// Length of one sweep repetition.
    pub sweep_runtime: Option<String>,
    /// Length of one sweep repetition in seconds (e.g. 0.25).
    pub seconds: Option<f64>,
    /// Warm-up per target before each cell.
    pub warmup: Option<String>,
    /// Headline repetitions.
    pub reps: Option<usize>,
    /// Sweep repetitions (rounds; their target order rotates per round).
    pub sweep_reps: Option<usize>,
    /// Sector size of the encrypted in-process targets (512 … 4096).
    pub sector_size: Option<u32>,
    /// Adaptive moves bytes as inline does (no fused copy and crypto pass).
    pub no_fuse: bool,
    /// Adaptive hands off and splits whatever the load.
    pub force_split: bool,
    /// Print each engine's per-path request counts after every cell (stderr;
    /// with `--via fio`, each served ucrypt's `status` counters).
    pub engine_stats: bool,
    /// Ramdisk size (e.g. 512M, 1G; at most 2G by default profiles).
    pub size: Option<String>,
    /// Results folder (default ./results/bench-<UTC time>/).
    pub out: Option<PathBuf>,
    /// No progress bar (as given: [`crate::BenchArgs::no_progress`]).
    pub no_progress: bool,
}

impl Options {
    /// Profile `profile` with `o` applied, then [validated](Options::validate).
    /// A value that does not parse is an [`OptionsError`] naming it.
    pub fn with_overrides(profile: &str, o: &Overrides) -> Result<Self, OptionsError> {
        let mut p = Self::profile(profile)?;
        if let Some(t) = &o.targets {
            p.targets = Target::parse_list(t)?;
        }
        if let Some(t) = &o.sweep_targets {
            p.sweep_targets = Target::parse_list(t)?;
        }
        if o.no_sweep {
            p.sweep_targets.clear();
        }
        if let Some(s) = &o.bs {
            p.bs = list(s, "block size", |x| {
                parse_size(x).and_then(|v| u32::try_from(v).ok())
            })?;
        }
        if let Some(s) = &o.qd {
            p.qd = list(s, "queue depth", |x| x.parse().ok())?;
        }
        if let Some(s) = &o.jobs {
            p.jobs = list(s, "jobs", |x| x.parse().ok())?;
        }
        if let Some(s) = &o.rw {
            p.rw = list(s, "rw", Rw::parse)?;
        }
        if let Some(d) = duration(&o.runtime, "run time")? {
            p.runtime = d;
        }
        if let Some(d) = duration(&o.sweep_runtime, "sweep run time")? {
            p.sweep_runtime = d;
        }
        if let Some(s) = o.seconds {
            p.sweep_runtime = Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| OptionsError::Invalid {
                    what: "seconds",
                    value: s.to_string(),
                    example: "0.25",
                })?;
        }
        if let Some(n) = o.sector_size {
            p.sector_size = n;
        }
        p.fuse = !o.no_fuse;
        p.force_split = o.force_split;
        p.engine_stats = o.engine_stats;
        if let Some(d) = duration(&o.warmup, "warm-up")? {
            p.warmup = d;
        }
        if let Some(n) = o.reps {
            p.reps = n;
        }
        if let Some(n) = o.sweep_reps {
            p.sweep_reps = n;
        }
        if let Some(s) = &o.size {
            p.size = parse_size(s).ok_or_else(|| OptionsError::Invalid {
                what: "size",
                value: s.clone(),
                example: "512M, 1G",
            })?;
        }
        if let Some(d) = &o.out {
            p.out = d.clone();
        }
        p.progress = !o.no_progress;
        p.validate()?;
        Ok(p)
    }
}

/// A comma-separated list of values `parse` accepts (at least one).
fn list<T>(
    s: &str,
    what: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, OptionsError> {
    let v: Option<Vec<T>> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(&parse)
        .collect();
    match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(OptionsError::InvalidList {
            what,
            value: s.into(),
        }),
    }
}

/// An optional duration (`250ms`, `2s`).
fn duration(s: &Option<String>, what: &'static str) -> Result<Option<Duration>, OptionsError> {
    s.as_deref()
        .map(|s| {
            parse_duration(s).ok_or_else(|| OptionsError::Invalid {
                what,
                value: s.into(),
                example: "250ms, 2s",
            })
        })
        .transpose()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_external_run_serves_the_sweep_targets_too() {
        let aes = |m| Target::new(Cipher::AesXts, m);
        let o = Options {
            targets: vec![Target::RAW, aes(Mode::Inline)],
            sweep_targets: vec![aes(Mode::Classic), aes(Mode::Inline), aes(Mode::Adaptive)],
            ..Options::quick()
        };
        assert_eq!(
            o.served_targets(),
            vec![
                Target::RAW,
                aes(Mode::Inline),
                aes(Mode::Classic),
                aes(Mode::Adaptive)
            ]
        );
    }

    #[test]
    fn overrides_apply_in_order_and_name_bad_values() {
        let o = Overrides {
            bs: Some("4k, 64k".into()),
            qd: Some("1,16".into()),
            rw: Some("randread".into()),
            seconds: Some(0.5),
            sweep_runtime: Some("2s".into()),
            no_sweep: true,
            no_progress: true,
            ..Overrides::default()
        };
        let p = Options::with_overrides("quick", &o).unwrap();
        assert_eq!((p.bs, p.qd), (vec![4096, 65536], vec![1, 16]));
        assert_eq!(p.rw, vec![Rw::RandRead]);
        assert_eq!(p.sweep_runtime, Duration::from_millis(500));
        assert!(p.sweep_targets.is_empty() && !p.progress);
        for (o, msg) in [
            (
                Overrides {
                    qd: Some("1,x".into()),
                    ..Overrides::default()
                },
                "Invalid queue depth list `1,x`",
            ),
            (
                Overrides {
                    warmup: Some("soon".into()),
                    ..Overrides::default()
                },
                "Invalid warm-up `soon` (e.g. 250ms, 2s)",
            ),
            (
                Overrides {
                    seconds: Some(0.0),
                    ..Overrides::default()
                },
                "Invalid seconds `0` (e.g. 0.25)",
            ),
            (
                Overrides {
                    size: Some("big".into()),
                    ..Overrides::default()
                },
                "Invalid size `big` (e.g. 512M, 1G)",
            ),
        ] {
            let e = Options::with_overrides("quick", &o).unwrap_err();
            assert_eq!(e.to_string(), msg);
        }
    }

    #[test]
    fn profiles_are_valid_and_ordered() {
        let (q, d, f, g) = (
            Options::quick(),
            Options::standard(),
            Options::full(),
            Options::grid(),
        );
        for o in [&q, &d, &f, &g] {
            o.validate().unwrap();
            assert!(o.size <= 2 << 30, "ramdisk stays within 2 GiB");
            assert!(o.sweep_targets.contains(&Target::RAW));
            assert_eq!(Options::profile(&o.profile).unwrap().profile, o.profile);
        }
        assert!(q.estimate_secs() < d.estimate_secs() && d.estimate_secs() < f.estimate_secs());
        assert_eq!(d.bs.len() * d.qd.len() * d.jobs.len(), 6 * 4 * 3);
        // The grid: 4 bs × 2 QD × 2 jobs × 2 directions, 7 targets, no headline.
        assert_eq!(g.bs.len() * g.qd.len() * g.jobs.len() * g.rw.len(), 32);
        assert_eq!(g.sweep_targets.len(), 7);
        assert!(g.targets.is_empty());
        assert_eq!(g.sector_size, 4096);
        assert!(matches!(
            Options::profile("nope"),
            Err(OptionsError::UnknownProfile(_))
        ));
        let mut bad = q.clone();
        bad.qd = vec![0];
        assert_eq!(bad.validate(), Err(OptionsError::ZeroDepth));
        bad = q.clone();
        bad.bs = vec![1000];
        assert_eq!(bad.validate(), Err(OptionsError::BlockSize(1000)));
        bad = g.clone();
        bad.bs = vec![512];
        assert!(matches!(
            bad.validate(),
            Err(OptionsError::BlockNotSectors { bs: 512, .. })
        ));
        bad = q.clone();
        bad.targets.clear();
        bad.sweep_targets.clear();
        assert_eq!(bad.validate(), Err(OptionsError::NothingToRun));
    }
}
