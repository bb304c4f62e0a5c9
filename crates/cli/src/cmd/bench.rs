//! `ucrypt bench`: argument parsing for the seeds' experiment; the work is
//! in the `bench` crate (docs/BENCHMARKING.md describes the output).
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Run the seeds' ramdisk experiment: raw vs null/AES dm-crypt modes,
    /// headline table, bs × QD × jobs sweep, heatmaps, JSON/CSV.
    Bench(BenchArgs),
}

/// Options of `ucrypt bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Short run (CI): all targets briefly, a 3 bs × 2 QD × 2 jobs sweep.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Long run: more repetitions, longer, 8 jobs, random IO, both ciphers swept.
    #[arg(long)]
    full: bool,
    /// Headline targets: names (raw, null-classic, aes-inline …), `null`, `aes`, `all`.
    #[arg(long, value_name = "LIST")]
    targets: Option<String>,
    /// Sweep targets (heatmaps need raw and <cipher>-classic with inline/adaptive).
    #[arg(long, value_name = "LIST")]
    sweep_targets: Option<String>,
    /// Skip the sweep (headline table only).
    #[arg(long)]
    no_sweep: bool,
    /// Sweep block sizes, e.g. 4k,64k,1M.
    #[arg(long, value_name = "LIST")]
    bs: Option<String>,
    /// Sweep queue depths per job, e.g. 1,4,16,64.
    #[arg(long, value_name = "LIST")]
    qd: Option<String>,
    /// Sweep job (thread) counts, e.g. 1,2,4.
    #[arg(long, value_name = "LIST")]
    jobs: Option<String>,
    /// Sweep directions: read,write,randread,randwrite.
    #[arg(long, value_name = "LIST")]
    rw: Option<String>,
    /// Length of one headline repetition (e.g. 250ms, 1s).
    #[arg(long, value_name = "TIME")]
    runtime: Option<String>,
    /// Length of one sweep repetition.
    #[arg(long, value_name = "TIME")]
    sweep_runtime: Option<String>,
    /// Warm-up per target before each cell.
    #[arg(long, value_name = "TIME")]
    warmup: Option<String>,
    /// Headline repetitions.
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
    /// Sweep repetitions.
    #[arg(long, value_name = "N")]
    sweep_reps: Option<usize>,
    /// Ramdisk size (e.g. 512M, 1G; at most 2G by default profiles).
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,
    /// Results folder (default ./results/bench-<UTC time>/).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Drive the jobs with fio over NBD (`ucrypt open --export nbd`,
    /// raw baseline = nbdkit memory) instead of in-process.
    #[arg(long, value_name = "HOW", value_parser = ["fio", "in-process"])]
    via: Option<String>,
    /// With --via fio: add nbdkit (luks filter) and qemu-storage-daemon (raw, luks).
    #[arg(long)]
    peers: bool,
    /// Run the seeds' experiment on the kernel's dm-crypt (needs root,
    /// device-mapper, brd, fio) and print which flags to use.
    #[arg(long)]
    dm_crypt: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        match self {
            Commands::Bench(a) => a.run(),
        }
    }
}

fn list<T>(s: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, Failure> {
    let v: Option<Vec<T>> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(&parse)
        .collect();
    match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(Failure::usage(format!("Invalid {what} list `{s}`"))),
    }
}

fn duration(s: &Option<String>, what: &str) -> Result<Option<std::time::Duration>, Failure> {
    s.as_deref()
        .map(|s| {
            bench::stats::parse_duration(s)
                .ok_or_else(|| Failure::usage(format!("Invalid {what} `{s}` (e.g. 250ms, 2s)")))
        })
        .transpose()
}

fn bench_failure(e: bench::Error) -> Failure {
    match e {
        bench::Error::Usage(_) => Failure::usage(e.to_string()),
        bench::Error::Missing(_) => Failure::device(e.to_string()),
        _ => Failure {
            code: 1,
            message: e.to_string(),
        },
    }
}

impl BenchArgs {
    fn options(&self) -> Result<bench::Options, Failure> {
        let mut o = if self.quick {
            bench::Options::quick()
        } else if self.full {
            bench::Options::full()
        } else {
            bench::Options::standard()
        };
        if let Some(t) = &self.targets {
            o.targets = bench::Target::parse_list(t).map_err(bench_failure)?;
        }
        if let Some(t) = &self.sweep_targets {
            o.sweep_targets = bench::Target::parse_list(t).map_err(bench_failure)?;
        }
        if self.no_sweep {
            o.sweep_targets.clear();
        }
        if let Some(s) = &self.bs {
            o.bs = list(s, "block size", |x| {
                bench::stats::parse_size(x).and_then(|v| u32::try_from(v).ok())
            })?;
        }
        if let Some(s) = &self.qd {
            o.qd = list(s, "queue depth", |x| x.parse().ok())?;
        }
        if let Some(s) = &self.jobs {
            o.jobs = list(s, "jobs", |x| x.parse().ok())?;
        }
        if let Some(s) = &self.rw {
            o.rw = list(s, "rw", bench::Rw::parse)?;
        }
        if let Some(d) = duration(&self.runtime, "run time")? {
            o.runtime = d;
        }
        if let Some(d) = duration(&self.sweep_runtime, "sweep run time")? {
            o.sweep_runtime = d;
        }
        if let Some(d) = duration(&self.warmup, "warm-up")? {
            o.warmup = d;
        }
        if let Some(n) = self.reps {
            o.reps = n;
        }
        if let Some(n) = self.sweep_reps {
            o.sweep_reps = n;
        }
        if let Some(s) = &self.size {
            o.size = bench::stats::parse_size(s)
                .ok_or_else(|| Failure::usage(format!("Invalid size `{s}` (e.g. 512M, 1G)")))?;
        }
        if let Some(p) = &self.out {
            o.out = p.clone();
        }
        o.progress = !self.no_progress;
        o.validate().map_err(bench_failure)?;
        Ok(o)
    }

    fn run(self) -> CmdResult {
        let opts = self.options()?;
        if self.dm_crypt {
            let text = bench::dmcrypt::run(&opts).map_err(bench_failure)?;
            print!("{text}");
            return Ok(());
        }
        let report = if self.via.as_deref() == Some("fio") || self.peers {
            let exe = std::env::current_exe()
                .map_err(|e| Failure::usage(format!("Cannot find the ucrypt binary: {e}")))?;
            let plan = bench::external::FioPlan {
                ucrypt_targets: opts.targets.clone(),
                peers: self.peers,
                ucrypt_exe: exe,
            };
            bench::external::run(&opts, &plan).map_err(bench_failure)?
        } else {
            eprintln!(
                "bench: {} profile, about {:.0} s (in-process, {} MiB ramdisk){}",
                opts.profile,
                opts.estimate_secs(),
                opts.size >> 20,
                if opts.profile == "quick" {
                    ""
                } else {
                    "; --quick for a short run"
                }
            );
            bench::run(&opts).map_err(bench_failure)?
        };
        print!("{}", report.table());
        let files = report.write(&opts.out).map_err(bench_failure)?;
        println!();
        println!("results: {}", opts.out.display());
        for f in files {
            println!("  {}", f.display());
        }
        Ok(())
    }
}
