//! LUKS verbs with cryptsetup's names and options: `format`, `dump`,
//! `add-key`, `remove-key`, `change-key`, `kill-slot`, `header-backup`,
//! `header-restore`, `is-luks`, `uuid`; plus [`read_passphrase`] and
//! [`luks_table`] for the other command groups (`map --luks`, `open`).
//!
//! Only argument handling, prompts and confirmations live here; all header
//! and key work is in the `luks` crate, and so is the luksDump text
//! (`luks::dump`). Exit codes follow cryptsetup: 1 wrong parameters or bad
//! header, 2 bad passphrase / no permission, 4 wrong device.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use luks::{ErrorKind, FormatOptions, Hash, Header, KdfRequest, Volume};
use zeroize::Zeroizing;

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Format a LUKS1/LUKS2 volume (cryptsetup luksFormat).
    #[command(alias = "luksFormat")]
    Format(FormatArgs),
    /// Show the LUKS header (cryptsetup luksDump).
    #[command(alias = "luksDump")]
    Dump(DumpArgs),
    /// Add a passphrase to a free keyslot (cryptsetup luksAddKey).
    #[command(alias = "luksAddKey")]
    AddKey(AddKeyArgs),
    /// Remove the keyslot a passphrase opens (cryptsetup luksRemoveKey).
    #[command(alias = "luksRemoveKey")]
    RemoveKey(RemoveKeyArgs),
    /// Replace a passphrase (cryptsetup luksChangeKey).
    #[command(alias = "luksChangeKey")]
    ChangeKey(AddKeyArgs),
    /// Wipe one keyslot (cryptsetup luksKillSlot).
    #[command(alias = "luksKillSlot")]
    KillSlot(KillSlotArgs),
    /// Save the LUKS header and keyslots to a file (cryptsetup luksHeaderBackup).
    #[command(alias = "luksHeaderBackup")]
    HeaderBackup(BackupArgs),
    /// Write a saved header back (cryptsetup luksHeaderRestore).
    #[command(alias = "luksHeaderRestore")]
    HeaderRestore(BackupArgs),
    /// Exit 0 if DEVICE holds a LUKS header (cryptsetup isLuks).
    #[command(alias = "isLuks")]
    IsLuks(IsLuksArgs),
    /// Print (or with --uuid set) the volume UUID (cryptsetup luksUUID).
    #[command(alias = "luksUUID")]
    Uuid(UuidArgs),
}

/// Options every LUKS command shares.
#[derive(Args, Clone)]
pub struct Common {
    /// Device or image file with the LUKS volume.
    pub device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// Read the passphrase from this file (`-` = stdin) instead of prompting.
    #[arg(long, short = 'd')]
    pub key_file: Option<PathBuf>,
    /// Skip this many bytes of the key file.
    #[arg(long, value_name = "BYTES")]
    pub keyfile_offset: Option<u64>,
    /// Read only this many bytes of the key file.
    #[arg(long, short = 'l', value_name = "BYTES")]
    pub keyfile_size: Option<u64>,
    /// Use only this keyslot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q')]
    pub batch_mode: bool,
}

/// Key-derivation options (cryptsetup's names).
#[derive(Args, Clone)]
pub struct KdfArgs {
    /// pbkdf2, argon2i or argon2id (default: argon2id for LUKS2, pbkdf2 for LUKS1).
    #[arg(long)]
    pub pbkdf: Option<String>,
    /// Hash for PBKDF2, AF and the digest (`-h`, as in cryptsetup).
    #[arg(long, short = 'h', default_value = "sha256")]
    pub hash: String,
    /// Unlock time to aim for, milliseconds.
    #[arg(long, short = 'i', default_value_t = luks::kdf::DEFAULT_ITER_TIME_MS)]
    pub iter_time: u32,
    /// Fixed iterations (PBKDF2) or time cost (Argon2), no benchmark.
    #[arg(long)]
    pub pbkdf_force_iterations: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long)]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 threads.
    #[arg(long)]
    pub pbkdf_parallel: Option<u32>,
}

/// `ucrypt format`.
#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct FormatArgs {
    #[command(flatten)]
    common: Common,
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    #[command(flatten)]
    kdf: KdfArgs,
    /// luks2 (default) or luks1.
    #[arg(long = "type", short = 'M', default_value = "luks2")]
    luks_type: String,
    /// Cipher in dm-crypt form.
    #[arg(long, short = 'c', default_value = "aes-xts-plain64")]
    cipher: String,
    /// Volume key size in bits (default 512 for XTS, else 256).
    #[arg(long, short = 's')]
    key_size: Option<u32>,
    /// Encryption sector size (LUKS2).
    #[arg(long)]
    sector_size: Option<u32>,
    /// LUKS2 label.
    #[arg(long)]
    label: Option<String>,
    /// LUKS2 subsystem.
    #[arg(long)]
    subsystem: Option<String>,
    /// Volume UUID.
    #[arg(long)]
    uuid: Option<String>,
    /// Data offset in 512-byte sectors.
    #[arg(long)]
    offset: Option<u64>,
    /// Use the volume key from this file instead of a random one.
    #[arg(long)]
    volume_key_file: Option<PathBuf>,
    /// Overwrite an existing LUKS header.
    #[arg(long)]
    force: bool,
    /// Passphrase file, as cryptsetup's `luksFormat DEVICE [KEYFILE]`
    /// (same as --key-file).
    #[arg(conflicts_with = "key_file")]
    key_file_arg: Option<PathBuf>,
}

/// `ucrypt dump`.
#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    common: Common,
    /// Print the volume key (needs a passphrase).
    #[arg(long)]
    dump_volume_key: bool,
    /// Print the LUKS2 JSON metadata as cryptsetup does.
    #[arg(long, conflicts_with = "dump_volume_key")]
    dump_json_metadata: bool,
    /// Print the header as ucrypt's JSON document (docs/JSON.md).
    #[arg(long, conflicts_with_all = ["dump_volume_key", "dump_json_metadata"])]
    json: bool,
}

/// `ucrypt add-key` / `change-key`.
#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct AddKeyArgs {
    #[command(flatten)]
    common: Common,
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    #[command(flatten)]
    kdf: KdfArgs,
    /// File with the new passphrase (`-` = stdin); prompts if absent.
    new_key_file: Option<PathBuf>,
    /// Skip this many bytes of the new key file.
    #[arg(long, value_name = "BYTES")]
    new_keyfile_offset: Option<u64>,
    /// Read only this many bytes of the new key file.
    #[arg(long, value_name = "BYTES")]
    new_keyfile_size: Option<u64>,
    /// Unlock with this volume key file instead of a passphrase.
    #[arg(long)]
    volume_key_file: Option<PathBuf>,
}

/// `ucrypt remove-key`.
#[derive(Args)]
pub struct RemoveKeyArgs {
    #[command(flatten)]
    common: Common,
    /// File with the passphrase to remove (same as --key-file).
    remove_key_file: Option<PathBuf>,
}

/// `ucrypt kill-slot`.
#[derive(Args)]
pub struct KillSlotArgs {
    /// Device or image file.
    device: PathBuf,
    /// Keyslot to wipe.
    slot: u32,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// A remaining passphrase, from this file (`-` = stdin).
    #[arg(long, short = 'd')]
    key_file: Option<PathBuf>,
    /// Do not ask for a remaining passphrase or confirmation.
    #[arg(long, short = 'q')]
    batch_mode: bool,
}

/// `ucrypt header-backup` / `header-restore`.
#[derive(Args)]
pub struct BackupArgs {
    /// Device or image file.
    device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// The backup file.
    #[arg(long)]
    header_backup_file: PathBuf,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q')]
    batch_mode: bool,
}

/// `ucrypt is-luks`.
#[derive(Args)]
pub struct IsLuksArgs {
    /// Device or image file.
    device: PathBuf,
    /// Require this type (luks1 or luks2).
    #[arg(long = "type")]
    luks_type: Option<String>,
    /// Say why on failure.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Accepted as in cryptsetup (nothing to confirm here).
    #[arg(long, short = 'q')]
    batch_mode: bool,
}

/// `ucrypt uuid`.
#[derive(Args)]
pub struct UuidArgs {
    /// Device or image file.
    device: PathBuf,
    /// Detached header file.
    #[arg(long)]
    header: Option<PathBuf>,
    /// Set this UUID instead of printing it.
    #[arg(long)]
    uuid: Option<String>,
    /// Accepted as in cryptsetup (nothing to confirm here).
    #[arg(long, short = 'q')]
    batch_mode: bool,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        match self {
            Self::Format(a) => format(a),
            Self::Dump(a) => dump(a),
            Self::AddKey(a) => add_key(a, false),
            Self::ChangeKey(a) => add_key(a, true),
            Self::RemoveKey(a) => remove_key(a),
            Self::KillSlot(a) => kill_slot(a),
            Self::HeaderBackup(a) => {
                let vol = load(&a.device, a.header.as_deref())?;
                vol.header_backup(&a.header_backup_file).map_err(fail)
            }
            Self::HeaderRestore(a) => {
                let h = Volume::header_restore(
                    &a.device,
                    a.header.as_deref(),
                    &a.header_backup_file,
                    a.batch_mode,
                )
                .map_err(fail)?;
                eprintln!(
                    "Restored LUKS{} header with UUID {}.",
                    h.version(),
                    h.uuid()
                );
                Ok(())
            }
            Self::IsLuks(a) => is_luks(a),
            Self::Uuid(a) => {
                let mut vol = load(&a.device, a.header.as_deref())?;
                match a.uuid {
                    Some(u) => vol.set_uuid(Some(&u)).map(|_| ()).map_err(fail),
                    None => {
                        println!("{}", vol.header().uuid());
                        Ok(())
                    }
                }
            }
        }
    }
}

/// Reads a passphrase: `key_file` (`-` = stdin, binary-safe), else a
/// terminal prompt without echo (asked twice when `verify`), else one line
/// of piped stdin, as cryptsetup does.
pub fn read_passphrase(
    key_file: Option<&Path>,
    prompt: &str,
    verify: bool,
) -> Result<crypto::Secret, Failure> {
    luks::passphrase::read(key_file, prompt, verify).map_err(fail)
}

impl Common {
    /// The part of `--key-file` that is the key.
    fn range(&self) -> luks::passphrase::KeyfileRange {
        luks::passphrase::KeyfileRange {
            offset: self.keyfile_offset.unwrap_or(0),
            size: self.keyfile_size,
        }
    }

    /// Reads the passphrase from `--key-file` (its range) or a prompt.
    fn passphrase(&self, prompt: &str, verify: bool) -> Result<crypto::Secret, Failure> {
        luks::passphrase::read_range(self.key_file.as_deref(), self.range(), prompt, verify)
            .map_err(fail)
    }
}

/// Unlocks the LUKS volume on `device` and returns the dm-crypt table
/// cryptsetup would load for it (`ucrypt map --luks`).
pub fn luks_table(
    device: &Path,
    header: Option<&Path>,
    key_file: Option<&Path>,
    key_slot: Option<u32>,
) -> Result<crypto::table::Table, Failure> {
    unlock(device, header, key_file, key_slot).map(|(t, _)| t)
}

/// [`luks_table`] and the LUKS version (`ucrypt open`): the header is read
/// first, so a device that is no LUKS volume fails before the prompt.
pub fn unlock(
    device: &Path,
    header: Option<&Path>,
    key_file: Option<&Path>,
    key_slot: Option<u32>,
) -> Result<(crypto::table::Table, daemon::resolve::VolumeType), Failure> {
    unlock_as(device, header, key_file, key_slot, None)
}

/// [`unlock`] requiring one LUKS version (`open --type luks1|luks2`): any
/// other is "not a valid LUKS device", exit 1, as in cryptsetup.
pub fn unlock_as(
    device: &Path,
    header: Option<&Path>,
    key_file: Option<&Path>,
    key_slot: Option<u32>,
    want: Option<daemon::resolve::VolumeType>,
) -> Result<(crypto::table::Table, daemon::resolve::VolumeType), Failure> {
    let vol = daemon::resolve::Luks::load(device, header)?;
    if want.is_some_and(|w| w != vol.version()) {
        return Err(Failure::usage(format!(
            "Device {} is not a valid LUKS device",
            header.unwrap_or(device).display()
        )));
    }
    for w in vol.warnings() {
        eprintln!("WARNING: {w}");
    }
    let pass = read_passphrase(
        key_file,
        &format!("Enter passphrase for {}: ", device.display()),
        false,
    )?;
    Ok((vol.unlock(&pass, key_slot)?, vol.version()))
}

/// Maps a `luks::Error` to cryptsetup's exit codes (see [`Failure`]).
pub fn fail(e: luks::Error) -> Failure {
    Failure::from(e)
}

fn load(device: &Path, header: Option<&Path>) -> Result<Volume, Failure> {
    if !device.exists() {
        return Err(Failure::device(format!(
            "Device {} does not exist or access denied",
            device.display()
        )));
    }
    let vol = Volume::load(device, header).map_err(|e| match e.kind() {
        ErrorKind::NotLuks => Failure::usage(format!(
            "Device {} is not a valid LUKS device",
            header.unwrap_or(device).display()
        )),
        _ => fail(e),
    })?;
    for w in vol.header().warnings() {
        eprintln!("WARNING: {w}");
    }
    Ok(vol)
}

fn kdf_request(k: &KdfArgs, default_kind: &str) -> Result<KdfRequest, Failure> {
    Ok(KdfRequest {
        kind: k.pbkdf.clone().unwrap_or_else(|| default_kind.to_string()),
        hash: Hash::parse(&k.hash).map_err(fail)?,
        iter_time_ms: k.iter_time,
        force_iterations: k.pbkdf_force_iterations,
        memory_kib: k.pbkdf_memory,
        parallel: k.pbkdf_parallel,
    })
}

fn confirm(question: &str) -> bool {
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprint!("{question} (Type 'yes' in capital letters): ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).is_ok() && line.trim_end() == "YES"
}

fn format(a: FormatArgs) -> CmdResult {
    let version = match a.luks_type.as_str() {
        "luks2" | "luks" => 2,
        "luks1" => 1,
        t => {
            return Err(Failure::usage(format!(
                "Unknown LUKS type {t:?} (luks1 or luks2)"
            )))
        }
    };
    let mut common = a.common.clone();
    if a.key_file_arg.is_some() {
        common.key_file = a.key_file_arg.clone();
    }
    let c = &common;
    if !c.device.exists() {
        return Err(Failure::device(format!(
            "Device {} does not exist or access denied",
            c.device.display()
        )));
    }
    let meta = c.header.as_deref().unwrap_or(&c.device);
    let mut force = a.force;
    if !force && meta.exists() {
        if let Ok(Ok(_)) = std::fs::File::open(meta).map(|mut f| {
            let size = std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap_or(0);
            Header::read(&mut f, size)
        }) {
            if c.batch_mode
                || !confirm(&format!(
                    "WARNING: {} already contains a LUKS header. Overwrite it?",
                    meta.display()
                ))
            {
                return Err(Failure::usage(format!(
                    "{} already contains a LUKS header; use --force to overwrite it",
                    meta.display()
                )));
            }
            force = true;
        }
    }
    let mut kdf = kdf_request(&a.kdf, if version == 1 { "pbkdf2" } else { "argon2id" })?;
    kdf.hash = Hash::parse(&a.kdf.hash).map_err(fail)?;
    let volume_key = match &a.volume_key_file {
        Some(p) => Some(Zeroizing::new(std::fs::read(p).map_err(|e| {
            Failure::usage(format!("Cannot read {}: {e}", p.display()))
        })?)),
        None => None,
    };
    let opts = FormatOptions {
        version,
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        sector_size: a.sector_size,
        hash: kdf.hash,
        kdf,
        label: a.label.clone(),
        subsystem: a.subsystem.clone(),
        uuid: a.uuid.clone(),
        key_slot: c.key_slot,
        volume_key,
        data_offset: a.offset.map(|o| o * 512),
        force,
    };
    let pass = c.passphrase(
        &format!("Enter passphrase for {}: ", c.device.display()),
        true,
    )?;
    let vol = luks::format(&c.device, c.header.as_deref(), &opts, &pass).map_err(fail)?;
    for w in vol.header().warnings() {
        // cryptsetup prints its format warnings on stdout.
        println!("WARNING: {w}");
    }
    Ok(())
}

fn add_key(a: AddKeyArgs, change: bool) -> CmdResult {
    let c = &a.common;
    let mut vol = load(&c.device, c.header.as_deref())?;
    let (old_slot, vk) = match &a.volume_key_file {
        Some(p) => {
            let vk = Zeroizing::new(
                std::fs::read(p)
                    .map_err(|e| Failure::usage(format!("Cannot read {}: {e}", p.display())))?,
            );
            if !vol.verify_volume_key(&vk) {
                return Err(Failure::denied("Volume key does not match the volume"));
            }
            (None, crypto::Secret::from(vk))
        }
        None => {
            let pass = c.passphrase("Enter any existing passphrase: ", false)?;
            // For change-key, --key-slot picks the slot to change; for
            // add-key it is the target slot, so unlock through any slot.
            let try_slot = if change { c.key_slot } else { None };
            let (s, vk) = vol.unlock_key(&pass, try_slot).map_err(fail)?;
            (Some(s), vk)
        }
    };
    if a.new_key_file.is_some()
        && a.new_key_file == c.key_file
        && a.new_key_file.as_deref() == Some(Path::new("-"))
    {
        return Err(Failure::usage(
            "Only one of the old and the new passphrase can come from stdin",
        ));
    }
    let new = luks::passphrase::read_range(
        a.new_key_file.as_deref(),
        luks::passphrase::KeyfileRange {
            offset: a.new_keyfile_offset.unwrap_or(0),
            size: a.new_keyfile_size,
        },
        "Enter new passphrase for key slot: ",
        true,
    )
    .map_err(fail)?;
    let default_kind = match vol.header() {
        Header::V1(_) => "pbkdf2",
        Header::V2(_) => "argon2id",
    };
    let kdf = kdf_request(&a.kdf, default_kind)?;
    if !change {
        let slot = vol.add_key(&vk, &new, c.key_slot, &kdf).map_err(fail)?;
        eprintln!("Key slot {slot} created.");
        return Ok(());
    }
    let old = old_slot
        .ok_or_else(|| Failure::usage("change-key needs the old passphrase, not a volume key"))?;
    let slot = vol.change_key(old, &vk, &new, &kdf).map_err(fail)?;
    if slot == old {
        eprintln!("Key slot {old} changed.");
    } else {
        eprintln!("Key slot {old} changed (new passphrase in key slot {slot}).");
    }
    Ok(())
}

fn remove_key(a: RemoveKeyArgs) -> CmdResult {
    let c = &a.common;
    let mut vol = load(&c.device, c.header.as_deref())?;
    let kf = a.remove_key_file.as_deref().or(c.key_file.as_deref());
    let pass =
        luks::passphrase::read_range(kf, c.range(), "Enter passphrase to be deleted: ", false)
            .map_err(fail)?;
    let (slot, _vk) = vol.unlock_key(&pass, c.key_slot).map_err(fail)?;
    let last = vol.header().active_slots().len() == 1;
    if last
        && !c.batch_mode
        && !confirm(
            "WARNING: This is the last keyslot. The device will become unusable. Remove it?",
        )
    {
        return Err(Failure::usage(
            "Refusing to remove the last keyslot without --batch-mode",
        ));
    }
    vol.kill_slot(slot, true).map_err(fail)?;
    eprintln!("Key slot {slot} removed.");
    Ok(())
}

fn kill_slot(a: KillSlotArgs) -> CmdResult {
    let mut vol = load(&a.device, a.header.as_deref())?;
    let active = vol.header().active_slots();
    if !active.contains(&a.slot) {
        return Err(Failure::usage(format!("Keyslot {} is not active", a.slot)));
    }
    if !a.batch_mode {
        if active.len() == 1 {
            if !confirm(
                "WARNING: This is the last keyslot. The device will become unusable. Kill it?",
            ) {
                return Err(Failure::usage(
                    "Refusing to kill the last keyslot without --batch-mode",
                ));
            }
        } else {
            let pass = read_passphrase(
                a.key_file.as_deref(),
                "Enter any remaining passphrase: ",
                false,
            )?;
            let (s, _vk) = vol.unlock_key(&pass, None).map_err(fail)?;
            if s == a.slot {
                return Err(Failure::denied(
                    "Give a passphrase of a remaining keyslot, not of the one to kill",
                ));
            }
        }
    }
    vol.kill_slot(a.slot, true).map_err(fail)?;
    Ok(())
}

fn is_luks(a: IsLuksArgs) -> CmdResult {
    let res = std::fs::File::open(&a.device)
        .map_err(|e| Failure::device(format!("Cannot open {}: {e}", a.device.display())))
        .and_then(|mut f| {
            let size = std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap_or(0);
            Header::read(&mut f, size).map_err(fail)
        });
    let quiet_fail = |msg: String| Failure {
        code: 1,
        message: msg,
    };
    match res {
        Ok(h) => match a.luks_type.as_deref() {
            None => Ok(()),
            Some(t) if t == format!("luks{}", h.version()) || t == "luks" => Ok(()),
            Some(t) => Err(quiet_fail(format!(
                "Device {} is LUKS{}, not {t}",
                a.device.display(),
                h.version()
            ))),
        },
        Err(e) => {
            if a.verbose {
                eprintln!("{}", e.message);
            }
            Err(quiet_fail(format!(
                "Device {} is not a valid LUKS device",
                a.device.display()
            )))
        }
    }
}

fn dump(a: DumpArgs) -> CmdResult {
    let c = &a.common;
    let vol = load(&c.device, c.header.as_deref())?;
    let target = c.header.as_deref().unwrap_or(&c.device);
    if a.json {
        print!("{}", luks::summary::Summary::of(vol.header()).to_json());
        return Ok(());
    }
    if a.dump_json_metadata {
        let text = luks::dump::json_text(vol.header()).ok_or_else(|| {
            Failure::usage("Dump operation is not supported for this device type")
        })?;
        print!("{text}");
        return Ok(());
    }
    if a.dump_volume_key {
        if !c.batch_mode
            && !confirm("Header dump with volume key is sensitive information. Proceed?")
        {
            return Err(Failure::usage(
                "Volume key dump needs confirmation or --batch-mode",
            ));
        }
        let pass = c.passphrase(
            &format!("Enter passphrase for {}: ", c.device.display()),
            false,
        )?;
        let opened = vol.unlock(&pass, c.key_slot).map_err(fail)?;
        let text = luks::dump::volume_key_text(vol.header(), &opened, target);
        print!("{}", text.as_str());
        return Ok(());
    }
    print!("{}", luks::dump::header_text(vol.header(), target));
    Ok(())
}
