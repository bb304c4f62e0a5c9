//! `ucrypt bench`: argument parsing for the seeds' experiment; the work is
//! in the `bench` crate (docs/BENCHMARKING.md describes the output).
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::{bench_failure, CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Run the ramdisk experiment (docs/BENCHMARKING.md): headline table,
    /// sweep, heatmaps, JSON/CSV; or the mode grid (`--profile grid`).
    Bench(BenchArgs),
}

/// Options of `ucrypt bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Profile: quick, default, full, or grid (the data path's mode grid).
    #[arg(long, value_name = "NAME", value_parser = ["quick", "default", "full", "grid"],
          conflicts_with_all = ["quick", "full"])]
    profile: Option<String>,
    /// Short run for CI (same as --profile quick).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Long run (same as --profile full).
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
    #[arg(long, value_name = "TIME", conflicts_with = "seconds")]
    sweep_runtime: Option<String>,
    /// Length of one sweep repetition in seconds (e.g. 0.25).
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// Warm-up per target before each cell.
    #[arg(long, value_name = "TIME")]
    warmup: Option<String>,
    /// Headline repetitions.
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
    /// Sweep repetitions (rounds; their target order rotates per round).
    #[arg(long, value_name = "N", visible_alias = "rounds")]
    sweep_reps: Option<usize>,
    /// Sector size of the encrypted in-process targets (512 … 4096).
    #[arg(long, value_name = "BYTES")]
    sector_size: Option<u32>,
    /// Adaptive moves bytes as inline does (no fused copy and crypto pass).
    #[arg(long)]
    no_fuse: bool,
    /// Adaptive hands off and splits whatever the load.
    #[arg(long)]
    force_split: bool,
    /// Print each engine's per-path request counts after every cell (stderr).
    #[arg(long)]
    engine_stats: bool,
    /// Ramdisk size (e.g. 512M, 1G; at most 2G by default profiles).
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,
    /// Results folder (default ./results/bench-<UTC time>/).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// fio over NBD (raw baseline: nbdkit memory) or in-process (default).
    #[arg(long, value_name = "HOW", value_parser = ["fio", "in-process"])]
    via: Option<String>,
    /// With --via fio: add nbdkit (luks filter) and qemu-storage-daemon (raw, luks).
    #[arg(long)]
    peers: bool,
    /// The dm-crypt flag advisor: measure the kernel's dm-crypt flags over
    /// brd (root, fio) and answer one `cryptsetup refresh` line.
    #[arg(long)]
    dm_crypt: bool,
    /// With --dm-crypt: the workload, db, vm, backup or seeds (default).
    #[arg(
        long,
        value_name = "PRESET",
        requires = "dm_crypt",
        conflicts_with = "fio_job"
    )]
    workload: Option<String>,
    /// With --dm-crypt: decide for this fio job file instead.
    #[arg(long, value_name = "FILE", requires = "dm_crypt")]
    fio_job: Option<PathBuf>,
    /// With --dm-crypt: the live mapping to start from (cipher, flags).
    #[arg(long, value_name = "NAME", requires = "dm_crypt")]
    mapping: Option<String>,
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

impl BenchArgs {
    fn options(&self) -> Result<bench::Options, Failure> {
        let profile = match (&self.profile, self.quick, self.full) {
            (Some(p), _, _) => p.as_str(),
            (None, true, _) => "quick",
            (None, _, true) => "full",
            _ => "default",
        };
        let o = bench::Overrides {
            targets: self.targets.clone(),
            sweep_targets: self.sweep_targets.clone(),
            no_sweep: self.no_sweep,
            bs: self.bs.clone(),
            qd: self.qd.clone(),
            jobs: self.jobs.clone(),
            rw: self.rw.clone(),
            runtime: self.runtime.clone(),
            sweep_runtime: self.sweep_runtime.clone(),
            seconds: self.seconds,
            warmup: self.warmup.clone(),
            reps: self.reps,
            sweep_reps: self.sweep_reps,
            sector_size: self.sector_size,
            no_fuse: self.no_fuse,
            force_split: self.force_split,
            engine_stats: self.engine_stats,
            size: self.size.clone(),
            out: self.out.clone(),
            no_progress: self.no_progress,
        };
        bench::Options::with_overrides(profile, &o).map_err(bench_failure)
    }

    fn run(self) -> CmdResult {
        let opts = self.options()?;
        if self.dm_crypt {
            let req = bench::dmcrypt::Request {
                workload: bench::advisor::AdvisorWorkload::new(
                    self.workload.as_deref(),
                    self.fio_job.as_deref(),
                )
                .map_err(bench_failure)?,
                mapping: self.mapping.clone(),
            };
            let text = bench::dmcrypt::run(&opts, &req).map_err(bench_failure)?;
            print!("{text}");
            return Ok(());
        }
        let via = if self.via.as_deref() == Some("fio") || self.peers {
            let exe = std::env::current_exe()
                .map_err(|e| Failure::usage(format!("Cannot find the ucrypt binary: {e}")))?;
            bench::Via::Fio {
                peers: self.peers,
                ucrypt_exe: exe,
            }
        } else {
            bench::Via::InProcess
        };
        let report = bench::run_via(&opts, via).map_err(bench_failure)?;
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
