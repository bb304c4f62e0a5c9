//! `ucrypt tcryptDump` (cryptsetup's spelling; also `tcrypt-dump`): a
//! TrueCrypt/VeraCrypt header's fields, or with `--dump-volume-key` the
//! chain's keys, printed as cryptsetup 2.6.1 prints them. The header
//! search is `daemon::tcrypt` over the `tcrypt` crate; this module parses
//! and prints.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use luks::ops::Ui as _;

use crate::cmd::luks::Terminal;
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Show a TrueCrypt/VeraCrypt header (cryptsetup tcryptDump).
    #[command(name = "tcryptDump", alias = "tcrypt-dump")]
    TcryptDump(DumpArgs),
}

/// Arguments of `tcryptDump`.
#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct DumpArgs {
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// A TrueCrypt keyfile (repeatable; mixed in the order given).
    #[arg(long, short = 'd')]
    key_file: Vec<PathBuf>,
    /// Only this PBKDF2 hash.
    #[arg(long, short = 'h')]
    hash: Option<String>,
    /// Only cipher chains containing this.
    #[arg(long, short = 'c')]
    cipher: Option<String>,
    /// The header options.
    #[command(flatten)]
    tcrypt: TcryptArgs,
    /// Print the volume key (`--dump-master-key` as cryptsetup spells it too).
    #[arg(long, alias = "dump-master-key")]
    dump_volume_key: bool,
    /// The TrueCrypt/VeraCrypt device or image file.
    device: PathBuf,
}

/// cryptsetup's TCRYPT options (`open`, `map`, `tcryptDump`).
#[derive(Args, Clone, Debug, Default)]
pub struct TcryptArgs {
    /// Use the hidden volume's header (TrueCrypt/VeraCrypt).
    #[arg(long)]
    pub tcrypt_hidden: bool,
    /// Use the system encryption header (TrueCrypt/VeraCrypt).
    #[arg(long)]
    pub tcrypt_system: bool,
    /// Use the backup header at the device's end (TrueCrypt/VeraCrypt).
    #[arg(long)]
    pub tcrypt_backup: bool,
    /// Scan for VeraCrypt headers too (the default; accepted as cryptsetup 2.6 does).
    #[arg(long, hide = true)]
    pub veracrypt: bool,
    /// Do not try VeraCrypt's KDFs and header magic.
    #[arg(long, conflicts_with = "veracrypt")]
    pub disable_veracrypt: bool,
    /// VeraCrypt Personal Iteration Multiplier.
    #[arg(long, value_name = "PIM")]
    pub veracrypt_pim: Option<u32>,
    /// crypttab's key file field for a TCRYPT line (not an option): the
    /// passphrase is its first line.
    #[arg(skip)]
    pub passphrase_file: Option<PathBuf>,
    /// crypttab's `tcrypt-keyfile=` options (not an option): keyfiles
    /// after `--key-file`'s.
    #[arg(skip)]
    pub keyfiles: Vec<PathBuf>,
}

impl TcryptArgs {
    /// The switches as the daemon's header search takes them.
    pub fn given(&self) -> daemon::tcrypt::TcryptArgs {
        daemon::tcrypt::TcryptArgs {
            tcrypt_hidden: self.tcrypt_hidden,
            tcrypt_system: self.tcrypt_system,
            tcrypt_backup: self.tcrypt_backup,
            veracrypt: self.veracrypt,
            disable_veracrypt: self.disable_veracrypt,
            veracrypt_pim: self.veracrypt_pim,
            passphrase_file: self.passphrase_file.clone(),
            keyfiles: self.keyfiles.clone(),
        }
    }
}

impl Commands {
    /// Runs the command.
    pub fn run(self, g: &Globals) -> CmdResult {
        match self {
            Self::TcryptDump(a) => dump(a, g),
        }
    }
}

fn dump(a: DumpArgs, g: &Globals) -> CmdResult {
    let switches = a.tcrypt.given();
    let given = daemon::tcrypt::Given {
        device: &a.device,
        keyfiles: &a.key_file,
        hash: a.hash.as_deref(),
        cipher: a.cipher.as_deref(),
        args: &switches,
        prompting: g.prompting(),
    };
    dump_given(given, a.dump_volume_key, g)
}

/// `dump --type tcrypt`: `tcryptDump` with every hash and cipher chain.
pub(crate) fn dump_device(
    device: &Path,
    keyfiles: &[PathBuf],
    args: &daemon::tcrypt::TcryptArgs,
    dump_volume_key: bool,
    g: &Globals,
) -> CmdResult {
    let given = daemon::tcrypt::Given {
        device,
        keyfiles,
        hash: None,
        cipher: None,
        args,
        prompting: g.prompting(),
    };
    dump_given(given, dump_volume_key, g)
}

fn dump_given(given: daemon::tcrypt::Given<'_>, dump_volume_key: bool, g: &Globals) -> CmdResult {
    let name = given.device.display().to_string();
    // cryptsetup asks only at a terminal (piped stdin holds the passphrase).
    if dump_volume_key
        && !g.batch_mode
        && std::io::stdin().is_terminal()
        && !Terminal.confirm(
            "Header dump with volume key is sensitive information\n\
             which allows access to encrypted partition without passphrase.\n\
             This dump should be always stored encrypted on safe place.",
        )
    {
        return Err(Failure::new(1, "Operation aborted."));
    }
    let vol = given.load()?;
    let mut out = std::io::stdout().lock();
    let r = if dump_volume_key {
        out.write_all(&vol.dump_volume_key(&name))
    } else {
        out.write_all(vol.dump(&name).as_bytes())
    };
    r.map_err(|e| Failure::new(1, format!("Cannot write the dump: {e}")))
}
