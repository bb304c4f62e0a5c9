//! The LUKS verbs as cryptsetup runs them (luksFormat, luksAddKey,
//! luksChangeKey, luksRemoveKey, luksKillSlot, isLuks), with typed
//! requests: load the header, unlock, change it, write it back.
//!
//! Passphrases are read through [`crate::passphrase`] (key file, piped
//! line or terminal prompt) in the order cryptsetup asks for them. What
//! stays with the caller goes through [`Ui`]: yes/no confirmations and
//! header warnings. Every refusal is a typed [`Error`] whose kind the
//! caller maps to an exit code (a wrong or misplaced passphrase is
//! [`ErrorKind::WrongPassphrase`], a missing device [`ErrorKind::Io`]).
//!
//! ```text
//!   FormatRequest ─► format ─► Volume          (warnings: caller prints)
//!   KeyRequest    ─► add_key ─► KeyChange::Added | Changed
//!   RemoveRequest ─► remove_key ─► slot
//!   KillRequest   ─► kill_slot
//! ```
//!
//! The header administration verbs (token, config, luksErase, repair,
//! convert, luksConvertKey) are in [`admin`]; the messages cryptsetup
//! prints for a missing device, a device without a header and a refused
//! confirmation are made here, once, for every verb.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use crypto::Secret;
use zeroize::Zeroizing;

use crate::error::invalid;
use crate::passphrase::{self, KeyfileRange};
use crate::{
    DeviceAccess, Error, ErrorKind, FormatOptions, Hash, Header, KdfRequest, Result, Volume,
};

pub mod admin;
mod inspect;
pub use admin::{ConfigRequest, ConvertKeyRequest, Done, Target, TokenAction, TokenRequest};
pub use inspect::{dump, is_luks, DumpKind, DumpRequest};

/// What the caller answers or shows while a verb runs.
pub trait Ui {
    /// A warning about the header (printed before any prompt).
    fn warn(&mut self, warning: &str);
    /// A yes/no question; `false` when it cannot be asked.
    fn confirm(&mut self, question: &str) -> bool;
}

/// Where a passphrase comes from: a key file (`-` = stdin) and its range,
/// or a prompt when `file` is `None`, asked as `prompting` says.
#[derive(Debug, Clone, Default)]
pub struct KeySource {
    /// `--key-file`.
    pub file: Option<PathBuf>,
    /// `--keyfile-offset` / `--keyfile-size`.
    pub range: KeyfileRange,
    /// `--tries`, `--timeout`, `-y`/`-q`.
    pub prompting: passphrase::Prompting,
}

impl KeySource {
    /// Reads the passphrase (asking twice on a terminal when `verify`).
    pub fn read(&self, prompt: &str, verify: bool) -> Result<Secret> {
        self.prompting
            .read_range(self.file.as_deref(), self.range, prompt, verify)
    }

    /// Reads a passphrase and hands it to `open`, asking again for a
    /// wrong one typed at the terminal ([`passphrase::Prompting::unlock`]).
    pub fn unlock<T>(&self, prompt: &str, open: impl FnMut(&Secret) -> Result<T>) -> Result<T> {
        self.prompting
            .unlock(self.file.as_deref(), self.range, prompt, open)
    }
}

/// Key-derivation choices as cryptsetup names them (`--pbkdf`, `--hash`,
/// `--iter-time`, `--pbkdf-force-iterations`, `--pbkdf-memory`,
/// `--pbkdf-parallel`); the kind defaults by LUKS version (argon2id for
/// LUKS2, pbkdf2 for LUKS1).
#[derive(Debug, Clone)]
pub struct KdfChoice {
    /// pbkdf2, argon2i or argon2id (default: argon2id for LUKS2, pbkdf2 for LUKS1).
    pub pbkdf: Option<String>,
    /// Hash for PBKDF2, AF and the digest.
    pub hash: String,
    /// Unlock time to aim for, milliseconds.
    pub iter_time_ms: u32,
    /// Fixed iterations (PBKDF2) or time cost (Argon2), no benchmark.
    pub force_iterations: Option<u32>,
    /// Argon2 memory cost in KiB.
    pub memory_kib: Option<u32>,
    /// Argon2 threads.
    pub parallel: Option<u32>,
    /// `-v`: print what calibration measured and chose
    /// ([`KdfRequest::verbose`]).
    pub verbose: bool,
}

impl KdfChoice {
    /// The request for a LUKS`version` keyslot.
    /// `--pbkdf-memory` or `--pbkdf-parallel` with pbkdf2 is refused, as
    /// cryptsetup's `verify_pbkdf_params` does; the other limits are
    /// [`KdfRequest::calibrate`]'s.
    pub fn request(&self, version: u32) -> Result<KdfRequest> {
        let default_kind = if version == 1 { "pbkdf2" } else { "argon2id" };
        let kind = self.pbkdf.clone().unwrap_or_else(|| default_kind.into());
        if kind == "pbkdf2" && (self.memory_kib.is_some() || self.parallel.is_some()) {
            return Err(invalid(
                "PBKDF max memory or parallel threads must not be set with pbkdf2.",
            ));
        }
        Ok(KdfRequest {
            kind,
            hash: Hash::parse(&self.hash)?,
            iter_time_ms: self.iter_time_ms,
            force_iterations: self.force_iterations,
            memory_kib: self.memory_kib,
            parallel: self.parallel,
            verbose: self.verbose,
        })
    }
}

/// A size argument in cryptsetup's syntax (`tools_string_to_size`):
/// decimal bytes, optionally with a unit: `s` (512-byte sectors), `k`,
/// `m`, `g`, `t` (powers of 1024; `KiB`.. too), or `KB`.. (powers of 1000).
pub fn parse_size(s: &str) -> Option<u64> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = s[..digits].parse().ok()?;
    let unit = &s[digits..];
    let base: u64 = match unit.len() {
        0 => return Some(n),
        1 | 3 if unit.len() == 1 || &unit[1..] == "iB" => 1024,
        2 if &unit[1..] == "B" => 1000,
        _ => return None,
    };
    let power = match unit.as_bytes()[0].to_ascii_lowercase() {
        b's' => return n.checked_mul(512),
        b'k' => 1,
        b'm' => 2,
        b'g' => 3,
        b't' => 4,
        _ => return None,
    };
    n.checked_mul(base.pow(power))
}

/// `--keyslot-cipher` and `--keyslot-key-size` (bits): both or neither,
/// as cryptsetup requires.
#[derive(Debug, Clone, Default)]
pub struct KeyslotCipher {
    /// LUKS2 keyslot: the cipher used for keyslot encryption.
    pub cipher: Option<String>,
    /// LUKS2 keyslot: the size of the encryption key, bits.
    pub key_bits: Option<u32>,
}

impl KeyslotCipher {
    /// The pair, if given; one without the other is refused.
    pub fn pair(&self) -> Result<Option<(String, u32)>> {
        match (&self.cipher, self.key_bits) {
            (None, None) => Ok(None),
            (Some(c), Some(b)) => Ok(Some((c.clone(), b))),
            _ => Err(invalid(
                "Options --keyslot-cipher and --keyslot-key-size must be used together.",
            )),
        }
    }

    /// Applies the pair to `vol` (its next keyslots), if given.
    fn apply(&self, vol: &mut Volume) -> Result<()> {
        match self.pair()? {
            Some((c, bits)) => vol.set_keyslot_encryption(&c, bits),
            None => Ok(()),
        }
    }
}

/// The "does not exist" error for `device`.
fn no_device(device: &Path) -> Error {
    Error::new(
        ErrorKind::Io,
        format!(
            "Device {} does not exist or access denied",
            device.display()
        ),
    )
}

/// Loads the volume on `device` (header in `header` if detached, both
/// reached as `access` says) and shows its warnings. No LUKS header is
/// [`ErrorKind::NotLuks`] naming the file that should hold it.
pub fn load(
    device: &Path,
    header: Option<&Path>,
    access: &DeviceAccess,
    ui: &mut dyn Ui,
) -> Result<Volume> {
    load_worded(device, header, access, ui, "")
}

/// [`load`] for the header administration verbs ([`admin`]), which say
/// "not a valid LUKS device." with cryptsetup's full stop.
pub fn load_header(
    device: &Path,
    header: Option<&Path>,
    access: &DeviceAccess,
    ui: &mut dyn Ui,
) -> Result<Volume> {
    load_worded(device, header, access, ui, ".")
}

fn load_worded(
    device: &Path,
    header: Option<&Path>,
    access: &DeviceAccess,
    ui: &mut dyn Ui,
    stop: &str,
) -> Result<Volume> {
    let vol = open_header(device, header, access).map_err(|e| match e.kind() {
        ErrorKind::NotLuks => Error::new(ErrorKind::NotLuks, format!("{}{stop}", e.message())),
        _ => e,
    })?;
    for w in vol.header().warnings() {
        ui.warn(w);
    }
    Ok(vol)
}

/// Reads the header of the volume on `device` (or the detached `header`)
/// without showing anything: a missing device is [`ErrorKind::Io`] "Device
/// … does not exist or access denied", no header [`ErrorKind::NotLuks`]
/// "Device … is not a valid LUKS device", as cryptsetup words them.
pub fn open_header(device: &Path, header: Option<&Path>, access: &DeviceAccess) -> Result<Volume> {
    if !backend::device_exists(device) {
        return Err(no_device(device));
    }
    Volume::load(device, header, access).map_err(|e| match e.kind() {
        ErrorKind::NotLuks => Error::new(
            ErrorKind::NotLuks,
            format!(
                "Device {} is not a valid LUKS device",
                header.unwrap_or(device).display()
            ),
        ),
        _ => e,
    })
}

/// cryptsetup's confirmation of a destructive header verb ("WARNING!" …
/// "Are you sure?"): passes with `batch`, else asks through `ui`; a
/// refusal (or no terminal to ask on) is [`ErrorKind::InvalidArgument`].
pub fn confirm_destructive(ui: &mut dyn Ui, batch: bool, warning: &str) -> Result<()> {
    if batch || ui.confirm(&format!("\nWARNING!\n========\n{warning}\n\nAre you sure?")) {
        return Ok(());
    }
    Err(invalid(format!(
        "{warning} Not confirmed (use --batch-mode)."
    )))
}

/// Reads the LUKS header at the start of `path`, if any (isLuks).
pub fn probe(path: &Path, access: &DeviceAccess) -> Result<Header> {
    let mut f = crate::volume::open_ro(path, access)?;
    let size = std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).unwrap_or(0);
    Header::read(&mut f, size)
}

/// A volume key file's bytes (`--volume-key-file`).
pub fn read_volume_key(path: &Path) -> Result<Zeroizing<Vec<u8>>> {
    std::fs::read(path).map(Zeroizing::new).map_err(|e| {
        Error::io_as(
            ErrorKind::InvalidArgument,
            format!("Cannot read {}", path.display()),
            e,
        )
    })
}

/// luksFormat's options.
#[derive(Debug, Clone)]
pub struct FormatRequest {
    /// Device or image file.
    pub device: PathBuf,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// The first passphrase.
    pub key: KeySource,
    /// Keyslot for it.
    pub key_slot: Option<u32>,
    /// Never ask (an existing header is then refused unless `force`).
    pub batch: bool,
    /// Overwrite an existing LUKS header without asking.
    pub force: bool,
    /// `luks2` (or `luks`) or `luks1`.
    pub luks_type: String,
    /// Key derivation.
    pub kdf: KdfChoice,
    /// Cipher in dm-crypt form.
    pub cipher: String,
    /// Volume key size in bits.
    pub key_bits: Option<u32>,
    /// Encryption sector size.
    pub sector_size: Option<u32>,
    /// LUKS2 label.
    pub label: Option<String>,
    /// LUKS2 subsystem.
    pub subsystem: Option<String>,
    /// Volume UUID.
    pub uuid: Option<String>,
    /// Data offset in 512-byte sectors.
    pub offset_sectors: Option<u64>,
    /// Volume key file instead of a random key.
    pub volume_key_file: Option<PathBuf>,
    /// `--align-payload`, 512-byte sectors.
    pub align_payload: Option<u32>,
    /// `--luks2-metadata-size`, bytes.
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size`, bytes.
    pub keyslots_size: Option<u64>,
    /// `--keyslot-cipher` / `--keyslot-key-size`.
    pub keyslot_cipher: KeyslotCipher,
    /// How the devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// Formats a volume: checks the type and the device (refused while in
/// use: mounted, mapped, or served by a daemon), asks before
/// overwriting an existing header, reads the passphrase (verified) and
/// writes the new header. The caller prints the new header's warnings.
pub fn format(req: &FormatRequest, ui: &mut dyn Ui) -> Result<Volume> {
    let version = match req.luks_type.as_str() {
        "luks2" | "luks" => 2,
        "luks1" => 1,
        t => return Err(invalid(format!("Unknown LUKS type {t:?} (luks1 or luks2)"))),
    };
    if !backend::device_exists(&req.device) {
        return Err(no_device(&req.device));
    }
    let meta = req.header.as_deref().unwrap_or(&req.device);
    // Held until the new header is written: a device in use (mounted,
    // mapped, served) is refused before any question, as cryptsetup's
    // DEV_EXCL check refuses it.
    let _claim = crate::volume::claim(&[meta, req.device.as_path()])?;
    let mut force = req.force;
    if !force && backend::device_exists(meta) && probe(meta, &req.access).is_ok() {
        let q = format!(
            "WARNING: {} already contains a LUKS header. Overwrite it?",
            meta.display()
        );
        if req.batch || !ui.confirm(&q) {
            return Err(Error::new(
                ErrorKind::AlreadyLuks,
                format!(
                    "{} already contains a LUKS header; use --force to overwrite it",
                    meta.display()
                ),
            ));
        }
        force = true;
    } else if !req.batch && std::io::stdin().is_terminal() {
        // cryptsetup asks on a terminal before any luksFormat (and, as
        // its yesDialog, not without one).
        let dev = req.header.as_deref().unwrap_or(&req.device);
        confirm_destructive(
            ui,
            false,
            &format!("This will overwrite data on {} irrevocably.", dev.display()),
        )?;
    }
    let kdf = req.kdf.request(version)?;
    let keyslot_cipher = req.keyslot_cipher.pair()?;
    let volume_key = req
        .volume_key_file
        .as_deref()
        .map(read_volume_key)
        .transpose()?;
    let opts = FormatOptions {
        version,
        cipher: req.cipher.clone(),
        key_bits: req.key_bits,
        sector_size: req.sector_size,
        hash: kdf.hash,
        kdf,
        label: req.label.clone(),
        subsystem: req.subsystem.clone(),
        uuid: req.uuid.clone(),
        key_slot: req.key_slot,
        volume_key,
        data_offset: req.offset_sectors.map(|o| o * 512),
        force,
        align_payload: req.align_payload,
        metadata_size: req.metadata_size,
        keyslots_size: req.keyslots_size,
        keyslot_cipher,
        access: req.access.clone(),
    };
    // Refused options are refused before the prompt, as in cryptsetup.
    opts.check(req.header.is_some())?;
    let prompt = format!("Enter passphrase for {}: ", req.device.display());
    let pass = req.key.read(&prompt, true)?;
    crate::format(&req.device, req.header.as_deref(), &opts, &pass)
}

/// luksAddKey / luksChangeKey's options.
#[derive(Debug, Clone)]
pub struct KeyRequest {
    /// Device or image file.
    pub device: PathBuf,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// An existing passphrase.
    pub key: KeySource,
    /// add: the new key's slot (with `new_key_slot`: the only slot to
    /// unlock with, as cryptsetup's `--key-slot`); change: the slot to
    /// change.
    pub key_slot: Option<u32>,
    /// add: the new key's slot (cryptsetup's `--new-key-slot`).
    pub new_key_slot: Option<u32>,
    /// Key derivation of the new keyslot.
    pub kdf: KdfChoice,
    /// The new passphrase.
    pub new_key: KeySource,
    /// Unlock with this volume key file instead of a passphrase (add only).
    pub volume_key_file: Option<PathBuf>,
    /// `--keyslot-cipher` / `--keyslot-key-size` for the new keyslot.
    pub keyslot_cipher: KeyslotCipher,
    /// How the devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// What [`add_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyChange {
    /// A new passphrase in this slot.
    Added(u32),
    /// The passphrase of slot `old` was replaced; it now lives in `new`.
    Changed {
        /// The slot that was changed.
        old: u32,
        /// Where the new passphrase is (the same slot when it fit).
        new: u32,
    },
}

impl std::fmt::Display for KeyChange {
    /// What cryptsetup says about it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Added(slot) => write!(f, "Key slot {slot} created."),
            Self::Changed { old, new } if new == old => write!(f, "Key slot {old} changed."),
            Self::Changed { old, new } => write!(
                f,
                "Key slot {old} changed (new passphrase in key slot {new})."
            ),
        }
    }
}

/// Adds a passphrase (or with `change`, replaces the one given): unlocks
/// with the existing passphrase or volume key, reads the new passphrase
/// (verified) and writes the keyslot.
pub fn add_key(req: &KeyRequest, change: bool, ui: &mut dyn Ui) -> Result<KeyChange> {
    if change && req.new_key_slot.is_some() {
        return Err(invalid(
            "Option --new-key-slot is not allowed with luksChangeKey action.",
        ));
    }
    req.keyslot_cipher.pair()?;
    let mut vol = load(&req.device, req.header.as_deref(), &req.access, ui)?;
    req.keyslot_cipher.apply(&mut vol)?;
    let (old_slot, vk) = match &req.volume_key_file {
        Some(p) => {
            let vk = read_volume_key(p)?;
            if !vol.verify_volume_key(&vk) {
                return Err(Error::new(
                    ErrorKind::WrongPassphrase,
                    "Volume key does not match the volume",
                ));
            }
            (None, Secret::from(vk))
        }
        None => {
            // For change-key, --key-slot picks the slot to change; for
            // add-key it is the target slot (unlock through any slot)
            // unless --new-key-slot names the target.
            let unlock_only = change || req.new_key_slot.is_some();
            let try_slot = req.key_slot.filter(|_| unlock_only);
            let (s, vk) = req.key.unlock("Enter any existing passphrase: ", |pass| {
                vol.unlock_key(pass, try_slot)
            })?;
            (Some(s), vk)
        }
    };
    if req.new_key.file.is_some()
        && req.new_key.file == req.key.file
        && req.new_key.file.as_deref() == Some(Path::new("-"))
    {
        return Err(invalid(
            "Only one of the old and the new passphrase can come from stdin",
        ));
    }
    let new = req
        .new_key
        .read("Enter new passphrase for key slot: ", true)?;
    let kdf = req.kdf.request(vol.header().version())?;
    if !change {
        let target = req.new_key_slot.or(req.key_slot);
        return Ok(KeyChange::Added(vol.add_key(&vk, &new, target, &kdf)?));
    }
    let old =
        old_slot.ok_or_else(|| invalid("change-key needs the old passphrase, not a volume key"))?;
    // With --key-slot, cryptsetup re-seals that keyslot where it is.
    let new = vol.change_key_at(old, &vk, &new, &kdf, req.key_slot.is_some())?;
    Ok(KeyChange::Changed { old, new })
}

/// luksRemoveKey's options.
#[derive(Debug, Clone)]
pub struct RemoveRequest {
    /// Device or image file.
    pub device: PathBuf,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// The passphrase to remove.
    pub key: KeySource,
    /// Only try this slot.
    pub key_slot: Option<u32>,
    /// Remove the last keyslot without asking.
    pub batch: bool,
    /// How the devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// Wipes the keyslot the passphrase opens (asking first if it is the
/// last one); returns its number.
pub fn remove_key(req: &RemoveRequest, ui: &mut dyn Ui) -> Result<u32> {
    let mut vol = load(&req.device, req.header.as_deref(), &req.access, ui)?;
    let (slot, _vk) = req.key.unlock("Enter passphrase to be deleted: ", |pass| {
        vol.unlock_key(pass, req.key_slot)
    })?;
    let last = vol.header().active_slots().len() == 1;
    if last
        && !req.batch
        && !ui.confirm(
            "WARNING: This is the last keyslot. The device will become unusable. Remove it?",
        )
    {
        return Err(invalid(
            "Refusing to remove the last keyslot without --batch-mode",
        ));
    }
    vol.kill_slot(slot, true)?;
    Ok(slot)
}

/// luksKillSlot's options.
#[derive(Debug, Clone)]
pub struct KillRequest {
    /// Device or image file.
    pub device: PathBuf,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// The slot to wipe.
    pub slot: u32,
    /// A remaining passphrase (asked unless `batch`; with a key file it
    /// is checked in batch mode too, as cryptsetup does).
    pub key: KeySource,
    /// Ask nothing.
    pub batch: bool,
    /// How the devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// Wipes one keyslot, as cryptsetup's luksKillSlot: unless `batch` (and
/// with a key file always), a passphrase must open another keyslot, or
/// for the last keyslot that one (confirmed first when typed).
pub fn kill_slot(req: &KillRequest, ui: &mut dyn Ui) -> Result<()> {
    let mut vol = load(&req.device, req.header.as_deref(), &req.access, ui)?;
    let active = vol.header().active_slots();
    if !active.contains(&req.slot) {
        return Err(invalid(format!("Keyslot {} is not active", req.slot)));
    }
    let last = active.len() == 1;
    if last
        && !req.batch
        && req.key.file.is_none()
        && !ui
            .confirm("WARNING: This is the last keyslot. The device will become unusable. Kill it?")
    {
        return Err(invalid(
            "Refusing to kill the last keyslot without --batch-mode",
        ));
    }
    if !req.batch || req.key.file.is_some() {
        req.key.unlock("Enter any remaining passphrase: ", |pass| {
            if last {
                return vol.unlock_key(pass, Some(req.slot)).map(drop);
            }
            // Any keyslot but the one to kill (cryptsetup's verify_keyslot).
            let other = active
                .iter()
                .filter(|&&s| s != req.slot)
                .any(|&s| vol.unlock_key(pass, Some(s)).is_ok());
            if !other {
                let (s, _vk) = vol.unlock_key(pass, None)?;
                if s == req.slot {
                    return Err(Error::new(
                        ErrorKind::WrongPassphrase,
                        "Give a passphrase of a remaining keyslot, not of the one to kill",
                    ));
                }
            }
            Ok(())
        })?;
    }
    vol.kill_slot(req.slot, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_cryptsetup_syntax() {
        for (s, v) in [
            ("4096", Some(4096)),
            ("16k", Some(16384)),
            ("16KiB", Some(16384)),
            ("16KB", Some(16000)),
            ("2m", Some(2 << 20)),
            ("1G", Some(1 << 30)),
            ("8s", Some(4096)),
            ("", None),
            ("k", None),
            ("16q", None),
            ("16kb", None),
            ("16KiBB", None),
            ("99999999999999999999t", None),
        ] {
            assert_eq!(parse_size(s), v, "{s}");
        }
    }

    #[test]
    fn keyslot_cipher_needs_both_options() {
        let one = KeyslotCipher {
            cipher: Some("aes-cbc-essiv:sha256".into()),
            key_bits: None,
        };
        assert!(one.pair().is_err());
        assert_eq!(KeyslotCipher::default().pair().unwrap(), None);
    }
}
