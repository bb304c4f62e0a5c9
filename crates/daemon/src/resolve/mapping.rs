//! What `open` was told about its mapping, and the checks cryptsetup
//! makes on it, in one place: the volume type (`--type`, or plain when a
//! table is given), a `--table` line, cryptsetup's plain-mode options
//! (built by [`crate::plain`]), the key-file range and
//! `--test-passphrase`.
//!
//! ```text
//!  Mapping ─ resolve ─┬─ plain: --table line, or PlainOptions::open
//!                     ├─ LUKS: load header ─ tokens ─ passphrase ─ unlock
//!                     ├─ BITLK: read metadata ─ passphrase/.BEK ─ unlock
//!                     └─ FVAULT2: read metadata ─ passphrase ─ unlock
//!          ─ test_passphrase: the LUKS branch, then stop (a volume in
//!            reencryption: its keys only, `test_reencrypting`)
//! ```

use std::path::Path;

use crypto::table::Targets;
use luks::passphrase::{KeyfileRange, Prompting};

use super::{
    device, plain_table_arg, test_reencrypting, unlock_bitlk, unlock_fvault2, unlock_reencrypting,
    Luks, VolumeType,
};
use crate::error::{invalid, Result};
use plain::PlainOptions;

/// cryptsetup's plain-mode and key-file options as given (`None`: not
/// given), before defaults are applied (the cli's `--cipher`, `--key-size`,
/// `--hash`, `--offset`, `--skip`, `--size`, `--sector-size`,
/// `--iv-large-sectors`, `--keyfile-offset`, `--keyfile-size`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlainGiven {
    /// Plain mode: cipher (default aes-cbc-essiv:sha256).
    pub cipher: Option<String>,
    /// Plain mode: key size in bits (default 256).
    pub key_bits: Option<u32>,
    /// Plain mode: passphrase hash, HASH[:LEN] or `plain` (default ripemd160;
    /// a --key-file other than `-` is never hashed, as in cryptsetup).
    pub hash: Option<String>,
    /// Plain mode: start of the data on the device, in 512-byte sectors.
    pub offset: Option<u64>,
    /// Plain mode: IV offset, in 512-byte sectors.
    pub skip: Option<u64>,
    /// Plain mode: size of the device, in 512-byte sectors (default: the rest).
    pub size: Option<u64>,
    /// Plain mode: encryption sector size in bytes (default 512).
    pub sector_size: Option<u32>,
    /// Plain mode: IVs count sectors of --sector-size, not 512 bytes.
    pub iv_large_sectors: bool,
    /// `--keyfile-offset`, bytes.
    pub keyfile_offset: Option<u64>,
    /// `--keyfile-size`, bytes.
    pub keyfile_size: Option<u64>,
}

impl PlainGiven {
    /// The part of the key file that is read.
    pub fn range(&self) -> KeyfileRange {
        KeyfileRange {
            offset: self.keyfile_offset.unwrap_or(0),
            size: self.keyfile_size,
        }
    }

    /// The plain-mode option given first, if any (for refusals).
    fn plain_only(&self) -> Option<&'static str> {
        [
            (self.cipher.is_some(), "--cipher"),
            (self.key_bits.is_some(), "--key-size"),
            (self.hash.is_some(), "--hash"),
            (self.offset.is_some(), "--offset"),
            (self.skip.is_some(), "--skip"),
            (self.size.is_some(), "--size"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }

    /// The options with cryptsetup's defaults, keyed by `key_file`, a
    /// passphrase asked as `prompting` says, an `rbd:` device's cluster
    /// reached as `ceph` says.
    pub fn options(
        &self,
        key_file: Option<&Path>,
        prompting: Prompting,
        ceph: backend::rbd::RbdConfig,
    ) -> PlainOptions {
        PlainOptions {
            cipher: self.cipher.clone(),
            key_bits: self.key_bits,
            hash: self.hash.clone(),
            offset: self.offset.unwrap_or(0),
            skip: self.skip.unwrap_or(0),
            size: self.size,
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
            key_file: key_file.map(Path::to_path_buf),
            keyfile: self.range(),
            prompting,
            ceph,
        }
    }
}

/// What `open` was told about its mapping.
#[derive(Debug, Clone, Default)]
pub struct Mapping<'a> {
    /// `--type`: [`VolumeType::Plain`], one LUKS version, or
    /// [`VolumeType::Luks`] for either; `None` if not given (then plain
    /// with a table, else LUKS).
    pub kind: Option<VolumeType>,
    /// `--table` (plain only).
    pub table: Option<&'a str>,
    /// The detached LUKS header.
    pub header: Option<&'a Path>,
    /// `--key-file`: the passphrase, or a plain table's raw key.
    pub key_file: Option<&'a Path>,
    /// Every `--key-file` given: a TrueCrypt volume's keyfiles (the other
    /// types take one, `key_file`).
    pub keyfiles: &'a [std::path::PathBuf],
    /// `--volume-key-file`: a BitLocker or FileVault 2 volume key, no
    /// passphrase.
    pub volume_key_file: Option<&'a Path>,
    /// `--key-slot`.
    pub key_slot: Option<u32>,
    /// Plain-mode options and the key-file range.
    pub plain: PlainGiven,
    /// `--test-passphrase`.
    pub test_passphrase: bool,
    /// The LUKS2 token options (`--token-id`, `--token-only`, ...).
    pub tokens: tokens::TokenOptions,
    /// How a passphrase (or a token's PIN) typed at the terminal is asked
    /// for (`--tries`, `--timeout`, `-y`/`-q`, crypttab's
    /// `try-empty-password`).
    pub prompting: Prompting,
    /// The TCRYPT switches (`--type tcrypt`).
    pub tcrypt: super::tcrypt::TcryptArgs,
    /// How headers and `rbd:` devices are reached (`--disable-locks`,
    /// the Ceph options).
    pub access: luks::DeviceAccess,
}

impl Mapping<'_> {
    /// Resolves the mapping in the calling process; `device` is absolute
    /// ([`device`]). A LUKS volume is unlocked here, prompting. `say` gets
    /// each warning line (plain options ignored, LUKS header warnings).
    pub fn resolve(&self, device: &Path, say: impl FnMut(&str)) -> Result<(Targets, VolumeType)> {
        let table = self.table.is_some();
        let kind = self.kind.unwrap_or(if table {
            VolumeType::Plain
        } else {
            VolumeType::Luks
        });
        self.check(kind)?;
        self.unlock(kind, device, say)
    }

    /// `open --test-passphrase DEVICE`: unlocks the LUKS header and stops
    /// there (a wrong passphrase is [`crate::ErrorKind::WrongPassphrase`]).
    pub fn test_passphrase(&self, device_arg: &Path, say: impl FnMut(&str)) -> Result<()> {
        let kind = self.kind.unwrap_or(VolumeType::Luks);
        self.check(kind)?;
        let device = device(device_arg)?;
        if matches!(kind, VolumeType::Luks | VolumeType::Luks2)
            && self.table.is_none()
            && test_reencrypting(
                &device,
                self.header,
                &self.access,
                self.key_file,
                self.plain.range(),
                self.key_slot,
                Some(kind).filter(|k| *k != VolumeType::Luks),
                &self.prompting,
            )?
        {
            return Ok(());
        }
        if self.test_keys_only(kind, &device)? {
            return Ok(());
        }
        self.unlock(kind, &device, say).map(|_| ())
    }

    /// `--test-passphrase` of a LUKS header whose data could not be
    /// mapped (a detached header with data offset 0 named as the device,
    /// a data offset past the data device's end): cryptsetup checks the
    /// keyslots only and so does this, the passphrase asked as for any
    /// unlock. `false`: not such a header (or not LUKS, or asked for
    /// tokens), for the ordinary unlock to answer.
    fn test_keys_only(&self, kind: VolumeType, device: &Path) -> Result<bool> {
        if !matches!(
            kind,
            VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2
        ) || self.table.is_some()
            || self.tokens.asked()
        {
            return Ok(false);
        }
        let Ok(vol) = luks::Volume::load_header_only(device, self.header, &self.access) else {
            return Ok(false);
        };
        let version = match vol.header() {
            luks::Header::V1(_) => VolumeType::Luks1,
            luks::Header::V2(_) => VolumeType::Luks2,
        };
        if vol.check_mapping().is_ok() || (kind != VolumeType::Luks && kind != version) {
            return Ok(false);
        }
        // A detached header's data device under one sector: refused
        // before the passphrase, in cryptsetup's words.
        if self.header.is_some_and(|h| h != device) && vol.data_size() < 512 {
            return Err(luks::Error::new(
                luks::ErrorKind::DeviceSize,
                format!(
                    "Header detected but device {} is too small.",
                    device.display()
                ),
            )
            .into());
        }
        let prompt = format!("Enter passphrase for {}: ", device.display());
        self.prompting
            .unlock(self.key_file, self.plain.range(), &prompt, |pass| {
                vol.unlock_key(pass, self.key_slot)
                    .map(drop)
                    .map_err(|e| match e.kind() {
                        // cryptsetup's words for it.
                        luks::ErrorKind::WrongPassphrase => luks::Error::new(
                            luks::ErrorKind::WrongPassphrase,
                            "No key available with this passphrase.",
                        ),
                        _ => e,
                    })
            })?;
        Ok(true)
    }

    /// The option combinations cryptsetup refuses for `open` of `kind`.
    fn check(&self, kind: VolumeType) -> Result<()> {
        let p = &self.plain;
        let plain = kind == VolumeType::Plain;
        if self.volume_key_file.is_some()
            && !matches!(kind, VolumeType::Bitlk | VolumeType::Fvault2)
        {
            return Err(invalid(
                "--volume-key-file is supported for BITLK and FVAULT2 devices only.",
            ));
        }
        if self.test_passphrase && plain {
            return Err(invalid(
                "Option --test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and FVAULT2 devices.",
            ));
        }
        if p.sector_size.is_some() && !plain {
            return Err(invalid(
                "Sector size option with open action is supported only for plain devices.",
            ));
        }
        if p.iv_large_sectors && (!plain || p.sector_size.unwrap_or(512) <= 512) {
            return Err(invalid(
                "Large IV sectors option is supported only for opening plain type device with sector size larger than 512 bytes.",
            ));
        }
        let table = self.table.is_some();
        if plain && self.tokens.asked() {
            return Err(invalid(
                "--token-id, --token-only and --token-type are for LUKS2 devices.",
            ));
        }
        let t = &self.tcrypt;
        let tcrypt_only = t.tcrypt_hidden || t.tcrypt_system || t.tcrypt_backup;
        if tcrypt_only && kind != VolumeType::Tcrypt {
            return Err(invalid(
                "Option --tcrypt-hidden, --tcrypt-system or --tcrypt-backup is supported only for TCRYPT device.",
            ));
        }
        if (t.veracrypt || t.disable_veracrypt) && kind != VolumeType::Tcrypt {
            return Err(invalid(
                "Option --veracrypt or --disable-veracrypt is supported only for TCRYPT device type.",
            ));
        }
        if t.veracrypt_pim.is_some() && kind != VolumeType::Tcrypt {
            return Err(invalid(
                "Option --veracrypt-pim is supported only for VeraCrypt compatible devices.",
            ));
        }
        // TCRYPT takes --cipher and --hash as filters of its header search.
        let tcrypt_filters = kind == VolumeType::Tcrypt
            && p.key_bits.is_none()
            && p.offset.is_none()
            && p.skip.is_none()
            && p.size.is_none();
        if let Some(opt) = p.plain_only().filter(|_| !tcrypt_filters) {
            if !plain || table {
                return Err(invalid(format!(
                    "{opt} is for --type plain without --table (a table line gives the mapping itself)"
                )));
            }
        }
        let range_given = p.keyfile_offset.is_some() || p.keyfile_size.is_some();
        if table && (range_given || p.sector_size.is_some()) {
            return Err(invalid(
                "--keyfile-offset, --keyfile-size and --sector-size do not apply to --table (its key file is the raw key)",
            ));
        }
        Ok(())
    }

    /// The table of an already checked mapping of `kind`.
    fn unlock(
        &self,
        kind: VolumeType,
        device: &Path,
        mut say: impl FnMut(&str),
    ) -> Result<(Targets, VolumeType)> {
        if kind == VolumeType::Plain {
            if let Some(line) = self.table {
                let table = plain_table_arg(line, self.key_file, true)?;
                return Ok((table, VolumeType::Plain));
            }
            let o = self
                .plain
                .options(self.key_file, self.prompting, self.access.ceph.clone());
            o.warnings().into_iter().for_each(&mut say);
            return Ok((o.open(device)?.into(), VolumeType::Plain));
        }
        if self.table.is_some() {
            return Err(invalid("--table is only for --type plain"));
        }
        if matches!(kind, VolumeType::Bitlk | VolumeType::Fvault2) {
            if self.header.is_some() || self.key_slot.is_some() {
                return Err(invalid(format!(
                    "--header and --key-slot are not supported for {} devices",
                    kind.name()
                )));
            }
            let range = self.plain.range();
            let vk = self.volume_key_file;
            let t = if kind == VolumeType::Bitlk {
                unlock_bitlk(device, self.key_file, range, vk, &self.prompting, &mut say)?
            } else {
                unlock_fvault2(device, self.key_file, range, vk, &self.prompting)?
            };
            return Ok((t, kind));
        }
        if kind == VolumeType::Tcrypt {
            let keyfiles: Vec<std::path::PathBuf> = self
                .keyfiles
                .iter()
                .chain(self.tcrypt.keyfiles.iter())
                .cloned()
                .collect();
            let given = super::tcrypt::Given {
                device,
                keyfiles: &keyfiles,
                hash: self.plain.hash.as_deref(),
                cipher: self.plain.cipher.as_deref(),
                args: &self.tcrypt,
                prompting: self.prompting,
            };
            return Ok((given.targets(device)?, VolumeType::Tcrypt));
        }
        let want = Some(kind).filter(|k| *k != VolumeType::Luks);
        let range = self.plain.range();
        if let Some(t) = unlock_reencrypting(
            device,
            self.header,
            &self.access,
            self.key_file,
            range,
            self.key_slot,
            want,
            !self.test_passphrase,
            &self.prompting,
        )? {
            return Ok((t, VolumeType::Luks2));
        }
        let vol = Luks::load_as(device, self.header, &self.access, want)?;
        vol.warnings()
            .iter()
            .for_each(|w| say(&format!("WARNING: {w}")));
        if let Some(t) =
            vol.unlock_tokens(&self.tokens, &self.prompting, self.key_file.is_some())?
        {
            return Ok((t.into(), vol.version()));
        }
        let table = vol.unlock_asking(
            self.key_file,
            self.plain.range(),
            self.key_slot,
            &self.prompting,
        )?;
        Ok((table.into(), vol.version()))
    }
}
