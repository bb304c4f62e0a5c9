//! Children that get Ctrl-C as they would at a terminal.
//!
//! A test run started in the background of a non-interactive shell (`cmd
//! &`, nohup) inherits SIGINT and SIGQUIT ignored, and an ignored signal
//! stays ignored across exec: a `kill -INT` a test sends to its ucrypt
//! would then do nothing. The tests that check what Ctrl-C does give the
//! child the default actions first, as a shell does for a foreground
//! command at a terminal.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::{signal, SigHandler, Signal};

/// Restores SIGINT's and SIGQUIT's default action in `cmd`'s child.
pub fn default_interrupt(cmd: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the forked child before exec and only
    // calls sigaction (through `signal`), which is async-signal-safe; it
    // touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [Signal::SIGINT, Signal::SIGQUIT] {
                signal(sig, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            }
            Ok(())
        })
    }
}
