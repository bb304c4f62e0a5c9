//! `ucrypt bitlkDump`: a BitLocker volume's metadata as cryptsetup prints
//! it, and with `--dump-volume-key` its volume key (the FVEK). Opening is
//! `open --type bitlk` (`cmd/daemon.rs`, resolved in `daemon::resolve`).

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::luks::KeyFileArgs;
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// BitLocker subcommands.
#[derive(Subcommand)]
pub enum Commands {
    /// Show a BitLocker volume's metadata (cryptsetup bitlkDump).
    #[command(name = "bitlkDump", alias = "bitlk-dump")]
    BitlkDump(DumpArgs),
}

/// `ucrypt bitlkDump`.
#[derive(Args)]
pub struct DumpArgs {
    /// The BitLocker device or image.
    pub(crate) device: PathBuf,
    /// The passphrase, recovery password or .BEK startup key for
    /// --dump-volume-key.
    #[command(flatten)]
    pub(crate) key: KeyFileArgs,
    /// Print the volume key (asks for a passphrase; `--dump-master-key`
    /// works too).
    #[arg(long, alias = "dump-master-key")]
    pub(crate) dump_volume_key: bool,
    /// With --dump-volume-key: write the key to this file instead
    /// (`--master-key-file` works too).
    #[arg(long, alias = "master-key-file", requires = "dump_volume_key")]
    pub(crate) volume_key_file: Option<PathBuf>,
    /// Read-only (accepted as cryptsetup accepts it: a dump never writes).
    #[arg(long, short = 'r')]
    pub(crate) readonly: bool,
}

impl Commands {
    /// Runs the subcommand.
    pub fn run(self, g: &Globals) -> CmdResult {
        match self {
            Self::BitlkDump(a) => dump(a, g),
        }
    }
}

/// `bitlkDump` (also `dump` of a BitLocker device).
pub(crate) fn dump(a: DumpArgs, g: &Globals) -> CmdResult {
    let _ = a.readonly;
    let path = a.device.display().to_string();
    if !a.dump_volume_key {
        let f = std::fs::File::open(&a.device).map_err(|_| {
            Failure::new(4, format!("Device {path} does not exist or access denied."))
        })?;
        let m = bitlk::Metadata::read(&f, &path).map_err(failure)?;
        print!("{}", m.dump(&path));
        return Ok(());
    }
    let (_, m) = daemon::resolve::load_bitlk_metadata(&a.device)?;
    confirm_key_dump(g)?;
    let prompt = format!("Enter passphrase for {path}: ");
    let key = g
        .prompting()
        .unlock(a.key.key_file.as_deref(), a.key.range(), &prompt, |p| {
            m.volume_key(p).map_err(daemon::resolve::bitlk_as_luks)
        })?;
    let stored = match &a.volume_key_file {
        Some(f) => {
            write_key(f, &key)?;
            Some(f.display().to_string())
        }
        None => None,
    };
    let text = m.dump_volume_key(&path, &key, stored.as_deref());
    super::luks::write_unbuffered(&text)
        .map_err(|e| Failure::new(1, format!("Cannot write to standard output: {e}")))
}

/// cryptsetup's question before a volume key dump of a BitLocker or
/// FileVault 2 device, asked at a terminal unless `--batch-mode`.
pub(crate) fn confirm_key_dump(g: &Globals) -> Result<(), Failure> {
    if std::io::stdin().is_terminal() && !g.batch_mode {
        eprintln!(
            "The header dump with volume key is sensitive information\n\
             that allows access to encrypted partition without a passphrase.\n\
             This dump should be stored encrypted in a safe place."
        );
        eprint!("Are you sure? (Type 'yes' in capital letters): ");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        if line.trim_end() != "YES" {
            return Err(Failure::new(1, "Operation aborted."));
        }
    }
    Ok(())
}

/// Writes the key to `path` (created 0600, as cryptsetup does).
pub(crate) fn write_key(path: &std::path::Path, key: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(key))
        .map_err(|e| {
            Failure::new(
                1,
                format!("Cannot write volume key to file {}: {e}", path.display()),
            )
        })
}

/// cryptsetup's exit code for a `bitlk` error: 2 for a wrong key, 4 for
/// an unreadable device, else 1.
fn failure(e: bitlk::Error) -> Failure {
    let code = match e.kind() {
        bitlk::ErrorKind::WrongKey => 2,
        bitlk::ErrorKind::Io => 4,
        _ => 1,
    };
    Failure::new(code, e.to_string())
}
