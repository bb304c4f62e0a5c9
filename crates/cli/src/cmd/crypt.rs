//! SKELETON: owner replaces this module.
use clap::Subcommand;

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Measure cipher throughput in memory (like cryptsetup benchmark).
    Benchmark,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        Err(Failure::usage("not built yet"))
    }
}
