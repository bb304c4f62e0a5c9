//! `ucrypt bench`: hands over to the `ucrypt-bench` binary beside this one
//! (`src/bin/ucrypt-bench.rs`), which runs the seeds' experiment
//! (docs/BENCHMARKING.md). The experiment's plotting, fonts, PNG and
//! libblkio live there, so the `ucrypt` binary, which holds keys while it
//! serves, does not link them. Every option after `bench` (and `--help`)
//! goes to `ucrypt-bench` unchanged, the global and Ceph options given
//! before it are handed on, and `ucrypt-bench` replaces this process
//! (`exec`), so its exit code and signals are the command's own.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use clap::{Args, Subcommand};

use crate::global::Globals;
use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Run the ramdisk experiment (docs/BENCHMARKING.md): headline table,
    /// sweep, heatmaps, JSON/CSV; or the mode grid (`--profile grid`).
    /// Runs `ucrypt-bench`: `ucrypt bench --help` lists its options.
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
}

/// `ucrypt bench`'s arguments, handed to `ucrypt-bench` as they are.
#[derive(Args)]
pub struct BenchArgs {
    /// Options of `ucrypt-bench` (see `ucrypt bench --help`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_name = "OPTIONS"
    )]
    args: Vec<OsString>,
}

impl Commands {
    /// Replaces this process with `ucrypt-bench`; returns only if that
    /// could not start.
    pub fn run(self, globals: &Globals) -> CmdResult {
        let Commands::Bench(a) = self;
        let exe = beside("ucrypt-bench")
            .map_err(|e| Failure::device(format!("Cannot find ucrypt-bench: {e}")))?;
        let err = std::process::Command::new(&exe)
            .args(globals.to_args())
            .args(globals.ceph.to_args())
            .args(a.args)
            .exec();
        Err(Failure::device(format!(
            "Cannot run {}: {err}",
            exe.display()
        )))
    }
}

/// `name` in the directory of the running binary.
fn beside(name: &str) -> std::io::Result<std::path::PathBuf> {
    Ok(std::env::current_exe()?.with_file_name(name))
}
