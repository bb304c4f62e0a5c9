//! SKELETON: owner replaces this module.
use clap::Subcommand;

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Format a LUKS volume.
    Format,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        Err(Failure::usage("not built yet"))
    }
}
