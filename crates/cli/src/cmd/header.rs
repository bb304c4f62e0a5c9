//! cryptsetup's remaining LUKS header verbs: `token add|remove|import|
//! export|unassign`, `config`, `erase` (`luksErase`), `repair`, `convert`
//! and `luksConvertKey`. Arguments and printing only; the verbs and their
//! messages are `luks::ops::admin`. Messages and exit codes are
//! cryptsetup 2.6's: success is silent unless `-v` (then "Command
//! successful." on stdout), refusals exit 1, a wrong passphrase 2.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use luks::ops::{self, admin, Done};

use crate::cmd::luks::{KeyFileArgs, Terminal};
use crate::global::Globals;
use crate::CmdResult;

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Manage LUKS2 tokens (cryptsetup token add|remove|import|export|unassign).
    Token(TokenArgs),
    /// Set LUKS2 label, subsystem or a keyslot's priority (cryptsetup config).
    Config(ConfigArgs),
    /// Destroy every keyslot: the volume becomes unusable (cryptsetup luksErase).
    #[command(alias = "luksErase")]
    Erase(PlainArgs),
    /// Rewrite a damaged or inconsistent LUKS header; upgrade reencryption
    /// metadata of cryptsetup before 2.4 with the passphrase (cryptsetup repair).
    Repair(RepairArgs),
    /// Convert between LUKS1 and LUKS2 in place (cryptsetup convert).
    Convert(ConvertArgs),
    /// Re-seal a keyslot with another PBKDF (cryptsetup luksConvertKey).
    #[command(name = "convert-key", alias = "luksConvertKey")]
    #[command(disable_help_flag = true)]
    ConvertKey(ConvertKeyArgs),
}

/// The LUKS device and its detached header (every LUKS verb takes them).
#[derive(Args, Clone)]
pub struct Base {
    /// Device or image file with the LUKS volume.
    pub device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
}

/// `ucrypt token ACTION DEVICE`.
#[derive(Args)]
pub struct TokenArgs {
    /// add (a luks2-keyring token, --key-description), remove (--token-id),
    /// import (--json-file or stdin), export (to stdout or --json-file) or
    /// unassign (--token-id, --key-slot).
    #[arg(value_parser = PossibleValuesParser::new(ops::TokenAction::NAMES)
        .try_map(|a| ops::TokenAction::named(&a).ok_or("no such token action")))]
    action: ops::TokenAction,
    #[command(flatten)]
    base: Base,
    /// Token id.
    #[arg(long)]
    token_id: Option<u32>,
    /// Keyslot to assign (add, import) or unassign.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
    /// Token JSON file for import (default stdin) or export (default stdout).
    #[arg(long)]
    json_file: Option<PathBuf>,
    /// Kernel keyring description of the passphrase (token add).
    #[arg(long)]
    key_description: Option<String>,
    /// Replace the token at --token-id.
    #[arg(long)]
    token_replace: bool,
    /// Accepted as in cryptsetup; token verbs never unlock a keyslot.
    #[arg(long)]
    token_only: bool,
}

/// `ucrypt config DEVICE`.
#[derive(Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    base: Base,
    /// Set the LUKS2 label (empty or absent with --subsystem clears it).
    #[arg(long)]
    label: Option<String>,
    /// Set the LUKS2 subsystem (empty or absent with --label clears it).
    #[arg(long)]
    subsystem: Option<String>,
    /// Keyslot priority: ignore, normal or prefer (needs --key-slot).
    #[arg(long)]
    priority: Option<String>,
    /// Keyslot for --priority.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
}

/// `ucrypt erase DEVICE`.
#[derive(Args)]
pub struct PlainArgs {
    #[command(flatten)]
    base: Base,
}

/// `ucrypt repair DEVICE`.
#[derive(Args)]
pub struct RepairArgs {
    #[command(flatten)]
    base: Base,
    /// The passphrase for reencryption metadata to upgrade.
    #[command(flatten)]
    key: KeyFileArgs,
    /// The keyslot of that passphrase.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
}

/// `ucrypt convert DEVICE --type luks1|luks2`.
#[derive(Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    base: Base,
    /// Target format: luks1 or luks2.
    #[arg(long = "type", short = 'M')]
    luks_type: String,
}

/// `ucrypt convert-key DEVICE`.
#[derive(Args)]
pub struct ConvertKeyArgs {
    #[command(flatten)]
    base: Base,
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    #[command(flatten)]
    kdf: super::kdf::KdfArgs,
    #[command(flatten)]
    key: KeyFileArgs,
    /// Convert only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
}

impl Commands {
    /// Runs the command.
    pub fn run(self, g: &Globals) -> CmdResult {
        let ui = &mut Terminal;
        let done = match self {
            Self::Token(a) => {
                let req = ops::TokenRequest {
                    action: a.action,
                    id: a.token_id,
                    key_slot: a.key_slot,
                    json_file: a.json_file,
                    key_description: a.key_description,
                    replace: a.token_replace,
                };
                admin::token(&a.base.target(g), &req, ui)
            }
            Self::Config(a) => {
                let req = ops::ConfigRequest {
                    label: a.label,
                    subsystem: a.subsystem,
                    priority: a.priority,
                    key_slot: a.key_slot,
                };
                admin::config(&a.base.target(g), &req, ui)
            }
            Self::Erase(a) => admin::erase(&a.base.target(g), ui),
            Self::Repair(a) => repair(&a, g, ui),
            Self::Convert(a) => admin::convert(&a.base.target(g), &a.luks_type, ui),
            Self::ConvertKey(a) => {
                let req = ops::ConvertKeyRequest {
                    key: a.key.source(g.prompting()),
                    key_slot: a.key_slot,
                    kdf: a.kdf.choice(g.verbose()),
                };
                admin::convert_key(&a.base.target(g), &req, ui)
            }
        };
        match done? {
            Done::TokenJson(text) => {
                print!("{text}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
            Done::Repaired(found) => found.iter().for_each(|f| eprintln!("Repaired: {f}")),
            done if g.verbose() => done.verbose().iter().for_each(|l| println!("{l}")),
            _ => {}
        }
        Ok(())
    }
}

/// cryptsetup's question before it upgrades old reencryption metadata.
const UPGRADE_QUESTION: &str = "Unprotected LUKS2 reencryption metadata detected. \
    Please verify the reencryption operation is desirable (see luksDump output)\n\
    and continue (upgrade metadata) only if you acknowledge the operation as genuine.";

/// repair: reencryption metadata of cryptsetup before 2.4 upgraded with
/// the passphrase (`luks::reencrypt::upgrade`), any other header through
/// `admin::repair`.
fn repair(a: &RepairArgs, g: &Globals, ui: &mut Terminal) -> luks::Result<Done> {
    let meta = a.base.header.as_deref().unwrap_or(&a.base.device);
    if !matches!(luks::reencrypt::needs_upgrade(meta, &g.access()), Ok(true)) {
        return admin::repair(&a.base.target(g), ui);
    }
    if !g.batch_mode && !ops::Ui::confirm(ui, UPGRADE_QUESTION) {
        return Err(luks::Error::new(
            luks::ErrorKind::InvalidArgument,
            "Operation aborted.",
        ));
    }
    let pass = a.key.source(g.prompting()).read(
        "Enter passphrase to protect and upgrade reencryption metadata: ",
        false,
    )?;
    luks::reencrypt::upgrade(&a.base.device, meta, &g.access(), &pass, a.key_slot)?;
    Ok(Done::Nothing)
}

impl Base {
    fn target(&self, g: &Globals) -> ops::Target {
        ops::Target {
            device: self.device.clone(),
            header: self.header.clone(),
            batch: g.batch_mode,
            access: g.access(),
        }
    }
}
