//! LUKS verbs with cryptsetup's names and options: `format`, `dump`,
//! `add-key`, `remove-key`, `change-key`, `kill-slot`, `header-backup`,
//! `header-restore`, `is-luks`, `uuid`; plus the terminal the LUKS verbs
//! prompt on ([`Terminal`]).
//!
//! Only argument handling, prompts and printing live here; the verbs are
//! `luks::ops` (and the luksDump text `luks::dump`). Exit codes follow
//! cryptsetup: 1 wrong parameters or bad header, 2 bad passphrase / no
//! permission, 4 wrong device.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use luks::ops;
use luks::Volume;

use crate::cmd::header::Base;
use crate::global::Globals;
use crate::CmdResult;

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
    /// The device and its detached header.
    #[command(flatten)]
    pub dev: Base,
    /// The passphrase's key file and its range.
    #[command(flatten)]
    pub key: KeyFileArgs,
    /// Use only this keyslot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
}

/// `--key-file` and the part of it that is the key, as cryptsetup reads
/// it (every verb that reads a key file takes these three).
#[derive(Args, Clone, Debug, Default)]
pub struct KeyFileArgs {
    /// Read the passphrase (or a --table line's `-` key) from this file
    /// (`-` = stdin) instead of prompting.
    #[arg(long, short = 'd')]
    pub key_file: Option<PathBuf>,
    /// Skip this many bytes of the key file.
    #[arg(long, value_name = "BYTES")]
    pub keyfile_offset: Option<u64>,
    /// Read only this many bytes of the key file.
    #[arg(long, short = 'l', value_name = "BYTES")]
    pub keyfile_size: Option<u64>,
}

impl KeyFileArgs {
    /// The part of the key file that is the key.
    pub fn range(&self) -> luks::passphrase::KeyfileRange {
        luks::passphrase::KeyfileRange {
            offset: self.keyfile_offset.unwrap_or(0),
            size: self.keyfile_size,
        }
    }

    /// The key file and its range, as `luks::ops` takes them, a
    /// passphrase asked as `prompting` says.
    pub fn source(&self, prompting: luks::passphrase::Prompting) -> ops::KeySource {
        ops::KeySource {
            file: self.key_file.clone(),
            range: self.range(),
            prompting,
        }
    }
}

/// `--key-file` repeatable, as `open` and `map` take it: TrueCrypt mixes
/// every keyfile into its password pool; every other type takes one
/// (cryptsetup: "Only one --key-file argument is allowed.").
#[derive(Args, Clone, Debug, Default)]
pub struct KeyFilesArgs {
    /// Read the passphrase (or a --table line's `-` key) from this file
    /// (`-` = stdin) instead of prompting; with --type tcrypt a TrueCrypt
    /// keyfile, repeatable (mixed in the order given).
    #[arg(long, short = 'd', action = clap::ArgAction::Append)]
    pub key_file: Vec<PathBuf>,
    /// Skip this many bytes of the key file.
    #[arg(long, value_name = "BYTES")]
    pub keyfile_offset: Option<u64>,
    /// Read only this many bytes of the key file.
    #[arg(long, short = 'l', value_name = "BYTES")]
    pub keyfile_size: Option<u64>,
}

impl KeyFilesArgs {
    /// The options as a type that takes one key file: refused, with
    /// cryptsetup's message, when several were given.
    pub fn one(&self) -> Result<KeyFileArgs, crate::Failure> {
        if self.key_file.len() > 1 {
            return Err(crate::Failure::usage(
                "Only one --key-file argument is allowed.",
            ));
        }
        Ok(KeyFileArgs {
            key_file: self.key_file.first().cloned(),
            keyfile_offset: self.keyfile_offset,
            keyfile_size: self.keyfile_size,
        })
    }

    /// The one-file view with the first key file, for a type that takes
    /// them all besides (TrueCrypt: `key_file` lists every keyfile).
    pub fn first(&self) -> KeyFileArgs {
        KeyFileArgs {
            key_file: self.key_file.first().cloned(),
            keyfile_offset: self.keyfile_offset,
            keyfile_size: self.keyfile_size,
        }
    }
}

/// A size in cryptsetup's syntax (`luks::ops::parse_size`).
fn size_arg(s: &str) -> Result<u64, String> {
    ops::parse_size(s).ok_or_else(|| format!("invalid size {s:?}"))
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
    kdf: super::kdf::KdfArgs,
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
    #[arg(long, short = 'o')]
    offset: Option<u64>,
    /// Align the data at SECTORS boundaries (with --header: the data offset).
    #[arg(long, value_name = "SECTORS", conflicts_with = "offset")]
    align_payload: Option<u32>,
    /// LUKS2 header metadata area size (one copy: 16k to 4m, a power of 2).
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    luks2_metadata_size: Option<u64>,
    /// LUKS2 header keyslots area size (4 KiB aligned, at most 128m).
    #[arg(long, value_name = "BYTES", value_parser = size_arg)]
    luks2_keyslots_size: Option<u64>,
    #[command(flatten)]
    keyslot: super::kdf::KeyslotCipherArgs,
    /// Use the volume key from this file instead of a random one
    /// (`--master-key-file`, cryptsetup's older name, works too).
    #[arg(long, alias = "master-key-file")]
    volume_key_file: Option<PathBuf>,
    /// Accepted as cryptsetup does: keys come from getrandom(2), the
    /// kernel's one pool that /dev/random and /dev/urandom also read
    /// (the same since Linux 5.6), so both mean the same here.
    #[arg(long, conflicts_with = "use_urandom")]
    use_random: bool,
    /// See --use-random.
    #[arg(long)]
    use_urandom: bool,
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
    /// Print the volume key (needs a passphrase; `--dump-master-key`,
    /// cryptsetup's older name, works too).
    #[arg(long, alias = "dump-master-key")]
    dump_volume_key: bool,
    /// Print the LUKS2 JSON metadata as cryptsetup does.
    #[arg(long, conflicts_with = "dump_volume_key")]
    dump_json_metadata: bool,
    /// Print the header as ucrypt's JSON document (docs/JSON.md).
    #[arg(long, conflicts_with_all = ["dump_volume_key", "dump_json_metadata"])]
    json: bool,
    /// The header type: luks (LUKS1 or LUKS2), luks1, luks2, bitlk,
    /// fvault2 or tcrypt (default: LUKS, BitLocker or FileVault 2 by its
    /// signature; a TrueCrypt/VeraCrypt header has none: give tcrypt).
    #[arg(long = "type", value_parser = ["luks", "luks1", "luks2", "bitlk", "fvault2", "tcrypt"])]
    kind: Option<String>,
    /// BitLocker and FileVault 2 with --dump-volume-key: write the volume
    /// key to this file (`--master-key-file` works too).
    #[arg(long, alias = "master-key-file", requires = "dump_volume_key")]
    volume_key_file: Option<PathBuf>,
    /// The TCRYPT header options (with --type tcrypt).
    #[command(flatten)]
    tcrypt: super::tcrypt::TcryptArgs,
}

/// A header `dump` prints with another verb's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Foreign {
    Bitlk,
    Fvault2,
    Tcrypt,
}

/// The foreign type `dump` prints: the one `--type` names, else the one
/// whose metadata the device's signature announces and that parses (a
/// BitLocker To Go signature is a FAT boot sector's OEM name, so only the
/// whole metadata tells). `None`: a LUKS dump (which refuses what is no
/// LUKS header, as cryptsetup's luksDump).
fn foreign_type(a: &DumpArgs) -> Option<Foreign> {
    match a.kind.as_deref() {
        Some("bitlk") => return Some(Foreign::Bitlk),
        Some("fvault2") => return Some(Foreign::Fvault2),
        Some("tcrypt") => return Some(Foreign::Tcrypt),
        Some(_) => return None,
        None => {}
    }
    if a.common.dev.header.is_some() {
        return None;
    }
    let f = std::fs::File::open(&a.common.dev.device).ok()?;
    let mut head = [0u8; 512];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, 0).ok()?;
    if head.starts_with(b"LUKS\xba\xbe") || head.starts_with(b"SKUL\xba\xbe") {
        return None;
    }
    let path = a.common.dev.device.display().to_string();
    if matches!(&head[3..11], b"-FVE-FS-" | b"MSWIN4.1") && bitlk::Metadata::read(&f, &path).is_ok()
    {
        return Some(Foreign::Bitlk);
    }
    if &head[88..90] == b"CS" && fvault2::Metadata::read(&f, &path).is_ok() {
        return Some(Foreign::Fvault2);
    }
    None
}

/// `dump` of a BitLocker, FileVault 2 or TrueCrypt/VeraCrypt device: the
/// matching `*Dump` verb with the options `dump` shares with it.
fn dump_foreign(kind: Foreign, a: DumpArgs, g: &Globals) -> CmdResult {
    let c = a.common;
    if a.json || a.dump_json_metadata || c.key_slot.is_some() || c.dev.header.is_some() {
        return Err(crate::Failure::usage(
            "--json, --dump-json-metadata, --key-slot and --header are for LUKS devices",
        ));
    }
    if a.volume_key_file.is_some() && kind == Foreign::Tcrypt {
        return Err(crate::Failure::usage(
            "--volume-key-file is for BITLK and FVAULT2 devices",
        ));
    }
    match kind {
        Foreign::Bitlk => super::bitlk::dump(
            super::bitlk::DumpArgs {
                device: c.dev.device,
                key: c.key,
                dump_volume_key: a.dump_volume_key,
                volume_key_file: a.volume_key_file,
                readonly: false,
            },
            g,
        ),
        Foreign::Fvault2 => super::fvault2::dump(
            super::fvault2::DumpArgs {
                device: c.dev.device,
                key: c.key,
                dump_volume_key: a.dump_volume_key,
                volume_key_file: a.volume_key_file,
            },
            g,
        ),
        Foreign::Tcrypt => {
            if c.key.keyfile_offset.is_some() || c.key.keyfile_size.is_some() {
                return Err(crate::Failure::usage(
                    "--keyfile-offset and --keyfile-size are not for TCRYPT keyfiles",
                ));
            }
            super::tcrypt::dump_device(
                &c.dev.device,
                &c.key.key_file.into_iter().collect::<Vec<_>>(),
                &a.tcrypt.given(),
                a.dump_volume_key,
                g,
            )
        }
    }
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
    kdf: super::kdf::KdfArgs,
    /// File with the new passphrase (`-` = stdin); prompts if absent.
    new_key_file: Option<PathBuf>,
    /// The same as the NEW_KEY_FILE argument (cryptsetup's `--new-keyfile`).
    #[arg(
        long = "new-keyfile",
        value_name = "FILE",
        conflicts_with = "new_key_file"
    )]
    new_keyfile: Option<PathBuf>,
    /// Skip this many bytes of the new key file.
    #[arg(long, value_name = "BYTES")]
    new_keyfile_offset: Option<u64>,
    /// Read only this many bytes of the new key file.
    #[arg(long, value_name = "BYTES")]
    new_keyfile_size: Option<u64>,
    /// Unlock with this volume key file instead of a passphrase
    /// (`--master-key-file`, cryptsetup's older name, works too).
    #[arg(long, alias = "master-key-file")]
    volume_key_file: Option<PathBuf>,
    /// add-key: the new key's slot (--key-slot then picks the slot to unlock).
    #[arg(long, value_name = "SLOT")]
    new_key_slot: Option<u32>,
    #[command(flatten)]
    keyslot: super::kdf::KeyslotCipherArgs,
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
    #[command(flatten)]
    dev: Base,
    /// Keyslot to wipe.
    slot: u32,
    /// A remaining passphrase's key file.
    #[command(flatten)]
    key: KeyFileArgs,
}

/// `ucrypt header-backup` / `header-restore`.
#[derive(Args)]
pub struct BackupArgs {
    #[command(flatten)]
    dev: Base,
    /// The backup file.
    #[arg(long)]
    header_backup_file: PathBuf,
}

/// `ucrypt is-luks`.
#[derive(Args)]
pub struct IsLuksArgs {
    /// Device or image file.
    device: PathBuf,
    /// Require this type (luks1 or luks2).
    #[arg(long = "type")]
    luks_type: Option<String>,
}

/// `ucrypt uuid`.
#[derive(Args)]
pub struct UuidArgs {
    #[command(flatten)]
    dev: Base,
    /// Set this UUID instead of printing it.
    #[arg(long)]
    uuid: Option<String>,
}

impl Commands {
    /// Runs the command.
    pub fn run(self, g: &Globals) -> CmdResult {
        let ui = &mut Terminal;
        match self {
            Self::Format(a) => {
                let mut c = a.common;
                c.key.key_file = a.key_file_arg.or(c.key.key_file);
                let req = ops::FormatRequest {
                    key: c.key.source(g.prompting()),
                    device: c.dev.device,
                    header: c.dev.header,
                    key_slot: c.key_slot,
                    batch: g.batch_mode,
                    force: a.force,
                    luks_type: a.luks_type,
                    kdf: a.kdf.choice(g.verbose()),
                    cipher: a.cipher,
                    key_bits: a.key_size,
                    sector_size: a.sector_size,
                    label: a.label,
                    subsystem: a.subsystem,
                    uuid: a.uuid,
                    offset_sectors: a.offset,
                    volume_key_file: a.volume_key_file,
                    align_payload: a.align_payload,
                    metadata_size: a.luks2_metadata_size,
                    keyslots_size: a.luks2_keyslots_size,
                    keyslot_cipher: a.keyslot.cipher(),
                    access: g.access(),
                };
                let vol = ops::format(&req, ui)?;
                for w in vol.header().warnings() {
                    // cryptsetup prints its format warnings on stdout.
                    println!("WARNING: {w}");
                }
                Ok(())
            }
            Self::Dump(a) => dump(a, g),
            Self::AddKey(a) => add_key(a, false, g),
            Self::ChangeKey(a) => add_key(a, true, g),
            Self::RemoveKey(a) => {
                let c = a.common;
                let key = ops::KeySource {
                    file: a.remove_key_file.or(c.key.key_file.clone()),
                    range: c.key.range(),
                    prompting: g.prompting(),
                };
                let req = ops::RemoveRequest {
                    device: c.dev.device,
                    header: c.dev.header,
                    key,
                    key_slot: c.key_slot,
                    batch: g.batch_mode,
                    access: g.access(),
                };
                eprintln!("Key slot {} removed.", ops::remove_key(&req, ui)?);
                Ok(())
            }
            Self::KillSlot(a) => {
                let req = ops::KillRequest {
                    device: a.dev.device,
                    header: a.dev.header,
                    slot: a.slot,
                    key: a.key.source(g.prompting()),
                    batch: g.batch_mode,
                    access: g.access(),
                };
                Ok(ops::kill_slot(&req, ui)?)
            }
            Self::HeaderBackup(a) => {
                let vol = ops::load(&a.dev.device, a.dev.header.as_deref(), &g.access(), ui)?;
                Ok(vol.header_backup(&a.header_backup_file)?)
            }
            Self::HeaderRestore(a) => {
                let h = Volume::header_restore(
                    &a.dev.device,
                    a.dev.header.as_deref(),
                    &a.header_backup_file,
                    g.batch_mode,
                    &g.access(),
                )?;
                eprintln!(
                    "Restored LUKS{} header with UUID {}.",
                    h.version(),
                    h.uuid()
                );
                Ok(())
            }
            Self::IsLuks(a) => is_luks(a, g),
            Self::Uuid(a) => {
                let mut vol = ops::load(&a.dev.device, a.dev.header.as_deref(), &g.access(), ui)?;
                match a.uuid {
                    Some(u) => Ok(vol.set_uuid(Some(&u)).map(|_| ())?),
                    None => {
                        println!("{}", vol.header().uuid());
                        Ok(())
                    }
                }
            }
        }
    }
}

/// Warnings on stderr; confirmations typed on the terminal (never when
/// stdin is not one).
pub(crate) struct Terminal;

impl ops::Ui for Terminal {
    fn warn(&mut self, warning: &str) {
        eprintln!("WARNING: {warning}");
    }

    fn confirm(&mut self, question: &str) -> bool {
        if !std::io::stdin().is_terminal() {
            return false;
        }
        eprint!("{question} (Type 'yes' in capital letters): ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).is_ok() && line.trim_end() == "YES"
    }
}

fn add_key(a: AddKeyArgs, change: bool, g: &Globals) -> CmdResult {
    let req = ops::KeyRequest {
        key: a.common.key.source(g.prompting()),
        device: a.common.dev.device,
        header: a.common.dev.header,
        key_slot: a.common.key_slot,
        new_key_slot: a.new_key_slot,
        kdf: a.kdf.choice(g.verbose()),
        new_key: ops::KeySource {
            file: a.new_key_file.or(a.new_keyfile),
            range: luks::passphrase::KeyfileRange {
                offset: a.new_keyfile_offset.unwrap_or(0),
                size: a.new_keyfile_size,
            },
            prompting: g.prompting(),
        },
        volume_key_file: a.volume_key_file,
        keyslot_cipher: a.keyslot.cipher(),
        access: g.access(),
    };
    eprintln!("{}", ops::add_key(&req, change, &mut Terminal)?);
    Ok(())
}

fn is_luks(a: IsLuksArgs, g: &Globals) -> CmdResult {
    let why = |e: &luks::Error| {
        if g.verbose() {
            eprintln!("{}", daemon::chain(e));
        }
    };
    Ok(ops::is_luks(
        &a.device,
        &g.access(),
        a.luks_type.as_deref(),
        why,
    )?)
}

fn dump(a: DumpArgs, g: &Globals) -> CmdResult {
    if let Some(kind) = foreign_type(&a) {
        return dump_foreign(kind, a, g);
    }
    let t = &a.tcrypt;
    if a.volume_key_file.is_some()
        || t.tcrypt_hidden
        || t.tcrypt_system
        || t.tcrypt_backup
        || t.disable_veracrypt
        || t.veracrypt_pim.is_some()
    {
        return Err(crate::Failure::usage(
            "--volume-key-file is for BITLK and FVAULT2 devices, the TCRYPT options for --type tcrypt",
        ));
    }
    let c = a.common;
    let kind = match (a.json, a.dump_json_metadata, a.dump_volume_key) {
        (true, _, _) => ops::DumpKind::Summary,
        (_, true, _) => ops::DumpKind::JsonMetadata,
        (_, _, true) => ops::DumpKind::VolumeKey,
        _ => ops::DumpKind::Header,
    };
    let req = ops::DumpRequest {
        key: c.key.source(g.prompting()),
        device: c.dev.device,
        header: c.dev.header,
        kind,
        key_slot: c.key_slot,
        batch: g.batch_mode,
        access: g.access(),
    };
    let text = ops::dump(&req, &mut Terminal)?;
    write_unbuffered(&text)
        .map_err(|e| crate::Failure::new(1, format!("Cannot write to standard output: {e}")))
}

/// Writes `bytes` to standard output through a duplicate of fd 1, past
/// `Stdout`'s heap buffer (the volume key's text must not be copied there).
pub(crate) fn write_unbuffered(bytes: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let _ = std::io::stdout().flush();
    let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
    std::fs::File::from(fd).write_all(bytes)
}
