//! cryptsetup's remaining LUKS header verbs: `token add|remove|import|
//! export|unassign`, `config`, `erase` (`luksErase`), `repair`, `convert`
//! and `luksConvertKey`. Argument handling, prompts and messages only; the
//! header work is in the `luks` crate. Messages and exit codes are
//! cryptsetup 2.6's: success is silent unless `-v` (then "Command
//! successful." on stdout), refusals exit 1, a wrong passphrase 2.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use luks::{Priority, Repair, TokenPlacement, Volume};

use crate::cmd::luks::{fail, KdfArgs};
use crate::{CmdResult, Failure};

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
    /// Rewrite a damaged or inconsistent LUKS header (cryptsetup repair).
    Repair(PlainArgs),
    /// Convert between LUKS1 and LUKS2 in place (cryptsetup convert).
    Convert(ConvertArgs),
    /// Re-seal a keyslot with another PBKDF (cryptsetup luksConvertKey).
    #[command(name = "convert-key", alias = "luksConvertKey")]
    #[command(disable_help_flag = true)]
    ConvertKey(ConvertKeyArgs),
}

/// Options of every verb here.
#[derive(Args, Clone)]
pub struct Base {
    /// Device or image file with the LUKS volume.
    pub device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q')]
    pub batch_mode: bool,
    /// Say "Command successful." (and what was done) on success.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Accepted as in cryptsetup; implies --verbose.
    #[arg(long)]
    pub debug: bool,
}

/// A token verb.
#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum TokenAction {
    /// Add a luks2-keyring token (--key-description).
    Add,
    /// Remove a token (--token-id).
    Remove,
    /// Import a token's JSON (--json-file, or stdin).
    Import,
    /// Print a token's JSON (or write it to --json-file).
    Export,
    /// Remove a keyslot from a token (--token-id, --key-slot).
    Unassign,
}

/// `ucrypt token ACTION DEVICE`.
#[derive(Args)]
pub struct TokenArgs {
    /// add, remove, import, export or unassign.
    action: TokenAction,
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

/// `ucrypt erase|repair DEVICE`.
#[derive(Args)]
pub struct PlainArgs {
    #[command(flatten)]
    base: Base,
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
    kdf: KdfArgs,
    /// The keyslot's passphrase, from this file (`-` = stdin).
    #[arg(long, short = 'd')]
    key_file: Option<PathBuf>,
    /// Skip this many bytes of the key file.
    #[arg(long, value_name = "BYTES")]
    keyfile_offset: Option<u64>,
    /// Read only this many bytes of the key file.
    #[arg(long, short = 'l', value_name = "BYTES")]
    keyfile_size: Option<u64>,
    /// Convert only this keyslot.
    #[arg(long, short = 'S')]
    key_slot: Option<u32>,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        let (base, r) = match self {
            Self::Token(a) => (a.base.clone(), token(a)),
            Self::Config(a) => (a.base.clone(), config(a)),
            Self::Erase(a) => (a.base.clone(), erase(&a.base)),
            Self::Repair(a) => (a.base.clone(), repair(&a.base)),
            Self::Convert(a) => (a.base.clone(), convert(a)),
            Self::ConvertKey(a) => (a.base.clone(), convert_key(a)),
        };
        r?;
        if base.verbose || base.debug {
            println!("Command successful.");
        }
        Ok(())
    }
}

fn load(b: &Base) -> Result<Volume, Failure> {
    if !backend::device_exists(&b.device) {
        return Err(Failure::device(format!(
            "Device {} does not exist or access denied",
            b.device.display()
        )));
    }
    let vol = Volume::load(&b.device, b.header.as_deref()).map_err(|e| match e.kind() {
        luks::ErrorKind::NotLuks => Failure::usage(format!(
            "Device {} is not a valid LUKS device.",
            b.header.as_deref().unwrap_or(&b.device).display()
        )),
        _ => fail(e),
    })?;
    for w in vol.header().warnings() {
        eprintln!("WARNING: {w}");
    }
    Ok(vol)
}

/// cryptsetup's "Are you sure?" (refused when stdin is no terminal).
fn confirm(b: &Base, warning: &str) -> CmdResult {
    if b.batch_mode {
        return Ok(());
    }
    if std::io::stdin().is_terminal() {
        eprint!(
            "\nWARNING!\n========\n{warning}\n\nAre you sure? (Type 'yes' in capital letters): "
        );
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_ok() && line.trim_end() == "YES" {
            return Ok(());
        }
    }
    Err(Failure::usage(format!(
        "{warning} Not confirmed (use --batch-mode)."
    )))
}

fn token(a: TokenArgs) -> CmdResult {
    let mut vol = load(&a.base)?;
    let at = TokenPlacement {
        id: a.token_id,
        keyslot: a.key_slot,
        replace: a.token_replace,
    };
    let need_id = || {
        a.token_id.ok_or_else(|| {
            Failure::usage("Action requires specific token. Use --token-id parameter.")
        })
    };
    match a.action {
        TokenAction::Add => {
            let d = a.key_description.as_deref().ok_or_else(|| {
                Failure::usage("--key-description parameter is mandatory for token add action.")
            })?;
            let id = vol.token_add_keyring(d, at).map_err(fail)?;
            if a.base.verbose || a.base.debug {
                println!("Token {id} created.");
            }
        }
        TokenAction::Import => {
            let json = match &a.json_file {
                Some(p) if p != Path::new("-") => std::fs::read(p)
                    .map_err(|e| Failure::usage(format!("Cannot read {}: {e}", p.display())))?,
                _ => {
                    let mut v = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut v)
                        .map_err(|e| Failure::usage(format!("Cannot read stdin: {e}")))?;
                    v
                }
            };
            let id = vol.token_import(&json, at).map_err(fail)?;
            if a.base.verbose || a.base.debug {
                println!("Token {id} created.");
            }
        }
        TokenAction::Remove => {
            let id = need_id()?;
            vol.token_remove(id).map_err(fail)?;
            if a.base.verbose || a.base.debug {
                println!("Token {id} removed.");
            }
        }
        TokenAction::Export => {
            let text = vol.token_export(need_id()?).map_err(fail)?;
            match &a.json_file {
                Some(p) if p != Path::new("-") => std::fs::write(p, text)
                    .map_err(|e| Failure::usage(format!("Cannot write {}: {e}", p.display())))?,
                _ => {
                    print!("{text}");
                    let _ = std::io::stdout().flush();
                }
            }
        }
        TokenAction::Unassign => {
            let id = need_id()?;
            let slot = a.key_slot.ok_or_else(|| {
                Failure::usage("Action requires specific keyslot. Use --key-slot parameter.")
            })?;
            vol.token_unassign(id, slot).map_err(fail)?;
        }
    }
    Ok(())
}

fn config(a: ConfigArgs) -> CmdResult {
    let priority = match &a.priority {
        Some(p) => Some(Priority::parse(p).map_err(fail)?),
        None => None,
    };
    if priority.is_some() && a.key_slot.is_none() {
        return Err(Failure::usage("Keyslot specification is required."));
    }
    let mut vol = load(&a.base)?;
    if a.label.is_some() || a.subsystem.is_some() {
        // As cryptsetup's crypt_set_label: the one not given is cleared.
        vol.set_label(
            Some(a.label.as_deref().unwrap_or("")),
            Some(a.subsystem.as_deref().unwrap_or("")),
        )
        .map_err(fail)?;
    }
    if let (Some(p), Some(s)) = (priority, a.key_slot) {
        vol.set_priority(s, p).map_err(fail)?;
    }
    if a.label.is_none() && a.subsystem.is_none() && priority.is_none() {
        // cryptsetup rewrites the header unchanged; so does this.
        vol.set_label(None, None).map_err(fail)?;
    }
    Ok(())
}

fn erase(b: &Base) -> CmdResult {
    let mut vol = load(b)?;
    confirm(
        b,
        &format!(
            "This operation will erase all keyslots on device {}.\nDevice will become unusable after this operation.",
            b.device.display()
        ),
    )?;
    for slot in vol.erase().map_err(fail)? {
        if b.verbose || b.debug {
            println!("Key slot {slot} removed.");
        }
    }
    Ok(())
}

fn repair(b: &Base) -> CmdResult {
    let mut vol = load(b)?;
    match vol.repair().map_err(fail)? {
        Repair::Clean => {
            if b.verbose || b.debug {
                println!("No known problems detected for LUKS header.");
            }
        }
        Repair::Fixed(found) => {
            for f in found {
                eprintln!("Repaired: {f}");
            }
        }
    }
    Ok(())
}

fn convert(a: ConvertArgs) -> CmdResult {
    let version = match a.luks_type.as_str() {
        "luks1" => 1,
        "luks2" => 2,
        t => {
            return Err(Failure::usage(format!(
                "Invalid LUKS type {t:?}, only luks1 and luks2 are supported."
            )))
        }
    };
    let mut vol = load(&a.base)?;
    if vol.header().version() == version {
        return Err(Failure::usage(format!(
            "Device is already LUKS{version} type."
        )));
    }
    confirm(
        &a.base,
        &format!(
            "This operation will convert {} to LUKS{version} format.",
            a.base.header.as_deref().unwrap_or(&a.base.device).display()
        ),
    )?;
    vol.convert(version).map_err(fail)
}

fn convert_key(a: ConvertKeyArgs) -> CmdResult {
    let mut vol = load(&a.base)?;
    if vol.header().version() != 2 {
        return Err(Failure::usage(format!(
            "Device {} is not a valid LUKS2 device.",
            a.base.header.as_deref().unwrap_or(&a.base.device).display()
        )));
    }
    let range = luks::passphrase::KeyfileRange {
        offset: a.keyfile_offset.unwrap_or(0),
        size: a.keyfile_size,
    };
    let prompt = match a.key_slot {
        Some(s) => format!("Enter passphrase for keyslot {s}: "),
        None => "Enter passphrase for keyslot to be converted: ".to_string(),
    };
    let pass =
        luks::passphrase::read_range(a.key_file.as_deref(), range, &prompt, false).map_err(fail)?;
    let kdf = a.kdf.choice().request(2).map_err(fail)?;
    let slot = vol.convert_key(&pass, a.key_slot, &kdf).map_err(fail)?;
    if a.base.verbose || a.base.debug {
        println!("Key slot {slot} created.");
    }
    Ok(())
}
