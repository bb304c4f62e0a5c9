//! `ucrypt fvault2Dump`: a FileVault 2 volume's metadata as cryptsetup
//! prints it, and with `--dump-volume-key` its volume key. Opening is
//! `open --type fvault2` (read-only; resolved in `daemon::resolve`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::luks::KeyFileArgs;
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// FileVault 2 subcommands.
#[derive(Subcommand)]
pub enum Commands {
    /// Show a FileVault 2 volume's metadata (cryptsetup fvault2Dump).
    #[command(name = "fvault2Dump", alias = "fvault2-dump")]
    Fvault2Dump(DumpArgs),
}

/// `ucrypt fvault2Dump`.
#[derive(Args)]
pub struct DumpArgs {
    /// The FileVault 2 device or image.
    pub(crate) device: PathBuf,
    /// The passphrase for --dump-volume-key.
    #[command(flatten)]
    pub(crate) key: KeyFileArgs,
    /// Print the volume key too (asks for the passphrase;
    /// `--dump-master-key` works too).
    #[arg(long, alias = "dump-master-key")]
    pub(crate) dump_volume_key: bool,
    /// With --dump-volume-key: also write the key to this file
    /// (`--master-key-file` works too).
    #[arg(long, alias = "master-key-file", requires = "dump_volume_key")]
    pub(crate) volume_key_file: Option<PathBuf>,
}

impl Commands {
    /// Runs the subcommand.
    pub fn run(self, g: &Globals) -> CmdResult {
        match self {
            Self::Fvault2Dump(a) => dump(a, g),
        }
    }
}

/// `fvault2Dump` (also `dump` of a FileVault 2 device).
pub(crate) fn dump(a: DumpArgs, g: &Globals) -> CmdResult {
    let path = a.device.display().to_string();
    let (_, m) = daemon::resolve::load_fvault2_metadata(&a.device)?;
    if !a.dump_volume_key {
        print!("{}", m.dump(&path));
        return Ok(());
    }
    super::bitlk::confirm_key_dump(g)?;
    let prompt = format!("Enter passphrase for {path}: ");
    let key = g
        .prompting()
        .unlock(a.key.key_file.as_deref(), a.key.range(), &prompt, |p| {
            m.volume_key(p).map_err(daemon::resolve::fvault2_as_luks)
        })?;
    if let Some(f) = &a.volume_key_file {
        super::bitlk::write_key(f, &key)?;
    }
    super::luks::write_unbuffered(&m.dump_volume_key(&path, &key))
        .map_err(|e| Failure::new(1, format!("Cannot write to standard output: {e}")))
}
