//! `ucrypt bench`: runs the seeds' experiment and prints where its results
//! went. The options are `bench::BenchArgs` (clap-derived in the `bench`
//! crate, which applies them); docs/BENCHMARKING.md describes the output.

use clap::Subcommand;

use crate::{bench_failure, CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Run the ramdisk experiment (docs/BENCHMARKING.md): headline table,
    /// sweep, heatmaps, JSON/CSV; or the mode grid (`--profile grid`).
    Bench(bench::BenchArgs),
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        let Commands::Bench(a) = self;
        let opts = a.options().map_err(bench_failure)?;
        if let Some(req) = a.advisor().map_err(bench_failure)? {
            print!(
                "{}",
                bench::dmcrypt::run(&opts, &req).map_err(bench_failure)?
            );
            return Ok(());
        }
        let via = a
            .via(std::env::current_exe())
            .map_err(|e| Failure::usage(format!("Cannot find the ucrypt binary: {e}")))?;
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
