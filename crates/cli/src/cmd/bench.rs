//! SKELETON: owner replaces this module.
use clap::Subcommand;

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Run the seeds' ramdisk experiment.
    Bench,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        Err(Failure::usage("not built yet"))
    }
}
