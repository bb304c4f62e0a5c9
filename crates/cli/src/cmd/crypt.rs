//! `ucrypt map` and `ucrypt benchmark`: a dm-crypt table applied to a file
//! or block device without any frontend, and `cryptsetup benchmark`'s
//! in-memory cipher table.
//!
//! ```text
//!  map --read :  device[offset .. offset+len] ──decrypt──▶ stdout   (like dd if=/dev/mapper/x)
//!  map --write:  stdin ──(size checked first)──encrypt──▶ device     (like dd of=/dev/mapper/x)
//! ```
//!
//! The map core (and where its table comes from) lives in
//! [`crate::map`], the benchmark in [`crate::benchmark`]; this module reads
//! the arguments and prints.

use std::path::PathBuf;

use crate::map::{Direction, Source};
use clap::{Args, Subcommand};
use luks::ops::Ui as _;
use zeroize::Zeroizing;

use crate::cmd::luks::{KeyFilesArgs, Terminal};
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// Commands of this group.
// Parsed once per process: the size of `Map` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Commands {
    /// Decrypt a dm-crypt table's range to stdout (--read) or encrypt stdin
    /// onto it (--write), with no frontend.
    Map(MapArgs),
    /// Measure cipher throughput in memory (like cryptsetup benchmark).
    Benchmark(BenchmarkArgs),
}

/// Arguments of `ucrypt map`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("direction").required(true).args(["read", "write"])))]
#[command(group(clap::ArgGroup::new("source").required(true).args(["table", "luks", "bitlk", "fvault2", "tcrypt"])))]
#[command(disable_help_flag = true)]
pub struct MapArgs {
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// dm-crypt table line: `<start> <len> crypt <cipher> <key> <iv_offset>
    /// <device> <offset> [<#opt> <opt>...]`; <device> is a file or block device.
    /// `-` reads the table from stdin (--read only), a path without blanks reads
    /// it from that file; a table of several lines (crypt and `<start> <len>
    /// linear <device> <offset>` targets, contiguous, one device) is mapped as
    /// one device. A <key> of `-` takes the raw key from --key-file (one-line
    /// tables). A hex key on the command line is visible in `ps` (warned).
    #[arg(long)]
    pub table: Option<String>,
    /// Map the LUKS volume on this device instead of a table line (the table
    /// cryptsetup would load; unlocked by passphrase or --key-file).
    #[arg(long, value_name = "DEVICE")]
    pub luks: Option<PathBuf>,
    /// Map the BitLocker volume on this device (the table cryptsetup would
    /// load; unlocked by passphrase, recovery password, or a .BEK file as
    /// --key-file).
    #[arg(long, value_name = "DEVICE")]
    pub bitlk: Option<PathBuf>,
    /// Map the FileVault 2 volume on this device (read-only: --read only;
    /// unlocked by passphrase or --key-file).
    #[arg(long, value_name = "DEVICE", conflicts_with = "write")]
    pub fvault2: Option<PathBuf>,
    /// Map the TrueCrypt/VeraCrypt volume on this device (the table
    /// cryptsetup would load; --key-file is a TrueCrypt keyfile, the
    /// passphrase a prompt or a line of stdin; --read only unless typed).
    #[arg(long, value_name = "DEVICE")]
    pub tcrypt: Option<PathBuf>,
    /// Only this PBKDF2 hash (with --tcrypt).
    #[arg(long, short = 'h', requires = "tcrypt")]
    pub hash: Option<String>,
    /// Only cipher chains containing this (with --tcrypt).
    #[arg(long, short = 'c', requires = "tcrypt")]
    pub cipher: Option<String>,
    /// TCRYPT header options (with --tcrypt).
    #[command(flatten)]
    pub tcrypt_args: super::tcrypt::TcryptArgs,
    /// Detached LUKS header file (with --luks).
    #[arg(long, requires = "luks")]
    pub header: Option<PathBuf>,
    /// The key file: with --luks the passphrase (its range as open takes
    /// it); with --table the raw key for the table's `-` key field; with
    /// --tcrypt a TrueCrypt keyfile, repeatable.
    #[command(flatten)]
    pub key: KeyFilesArgs,
    /// With --bitlk or --fvault2: the volume key from this file instead of
    /// a passphrase (`--master-key-file` works too).
    #[arg(long, alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// Try only this keyslot (with --luks).
    #[arg(long, short = 'S', requires = "luks")]
    pub key_slot: Option<u32>,
    /// LUKS2 tokens (with --luks): --token-id, --token-only, --token-type and their devices.
    #[command(flatten)]
    pub tokens: super::tokens::TokenUnlockArgs,
    /// Decrypt the whole mapped range to stdout.
    #[arg(long)]
    pub read: bool,
    /// Encrypt stdin onto the device (length: whole sectors, at most the mapping).
    #[arg(long)]
    pub write: bool,
}

/// Arguments of `ucrypt benchmark`.
#[derive(Args)]
pub struct BenchmarkArgs {
    /// Benchmark only this cipher, e.g. `aes-xts-plain64` or `aes-cbc`
    /// (the IV mode defaults to plain64; it does not change the speed).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Key size in bits (default: 512 for XTS, else 256).
    #[arg(long, short = 's')]
    pub key_size: Option<usize>,
    /// Encryption sector size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub sector_size: u32,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Skip the comparison with the system `openssl speed`.
    #[arg(long)]
    pub no_openssl: bool,
}

impl Commands {
    /// True when the command's standard output is data (`map --read`'s
    /// plaintext), so status lines must not go there.
    pub fn stdout_is_data(&self) -> bool {
        matches!(self, Self::Map(a) if a.read)
    }

    /// Runs the command.
    pub fn run(self, g: &Globals) -> CmdResult {
        match self {
            Self::Map(a) => {
                let prompting = g.prompting();
                let dir = if a.read {
                    Direction::Read
                } else {
                    Direction::Write
                };
                // The line may hold the key in hex: wipe it once parsed.
                let line = a.table.map(Zeroizing::new);
                if a.volume_key_file.is_some() && a.bitlk.is_none() && a.fvault2.is_none() {
                    return Err(Failure::usage(
                        "--volume-key-file is supported for --bitlk and --fvault2 only.",
                    ));
                }
                // Several key files: TrueCrypt's keyfile pool only.
                let key = if a.tcrypt.is_some() {
                    a.key.first()
                } else {
                    a.key.one()?
                };
                let (key_file, range) = (key.key_file.as_deref(), key.range());
                let keyfiles = &a.key.key_file;
                let switches = a.tcrypt_args.given();
                let tokens = a.tokens.options(g.verbose());
                let access = g.access();
                let source = match (&line, &a.luks, &a.bitlk, &a.fvault2) {
                    (_, _, _, Some(device)) => Source::Fvault2 {
                        device,
                        key_file,
                        range,
                        volume_key_file: a.volume_key_file.as_deref(),
                        prompting,
                    },
                    (_, _, Some(device), None) => Source::Bitlk {
                        device,
                        key_file,
                        range,
                        volume_key_file: a.volume_key_file.as_deref(),
                        prompting,
                    },
                    (None, None, None, None) if a.tcrypt.is_some() => {
                        Source::Tcrypt(daemon::tcrypt::Given {
                            device: a.tcrypt.as_deref().unwrap_or(std::path::Path::new("")),
                            keyfiles,
                            hash: a.hash.as_deref(),
                            cipher: a.cipher.as_deref(),
                            args: &switches,
                            prompting,
                        })
                    }
                    (Some(line), _, _, _) => Source::Table {
                        line,
                        key_file,
                        range,
                    },
                    (None, Some(device), None, None) => Source::Luks {
                        device,
                        header: a.header.as_deref(),
                        key_file,
                        range,
                        key_slot: a.key_slot,
                        tokens: &tokens,
                        prompting,
                        access: &access,
                    },
                    // clap's "source" group requires one of them.
                    (None, None, None, None) => {
                        return Err(Failure::usage(
                            "Give --table, --luks, --bitlk, --fvault2 or --tcrypt",
                        ))
                    }
                };
                let table = source.table(dir, |w| Terminal.warn(w))?;
                crate::map::map_stdio(&table, dir, &access.ceph)?;
                Ok(())
            }
            Self::Benchmark(a) => benchmark(&a),
        }
    }
}

/// `ucrypt benchmark`: [`crate::benchmark`] measures, this prints.
fn benchmark(a: &BenchmarkArgs) -> CmdResult {
    let req = crate::benchmark::Request {
        cipher: a.cipher.clone(),
        key_size: a.key_size,
        sector_size: a.sector_size,
        compare_openssl: !a.no_openssl,
    };
    let table = crate::benchmark::measure(&req).map_err(|e| Failure::usage(e.chain()))?;
    if a.json {
        println!("{}", table.json_text());
    } else {
        print!("{table}");
    }
    Ok(())
}
