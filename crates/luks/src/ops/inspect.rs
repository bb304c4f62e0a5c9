//! The read-only LUKS verbs: luksDump in its three forms (the header
//! text, the volume key after a passphrase, the LUKS2 JSON metadata) plus
//! ucrypt's JSON summary, and isLuks. They return text or a verdict; the
//! caller prints.

use std::path::{Path, PathBuf};

use crypto::Secret;

use super::{load, probe, KeySource, Ui};
use crate::error::invalid;
use crate::{Error, ErrorKind, Result};

/// What luksDump shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DumpKind {
    /// cryptsetup's header text.
    Header,
    /// The volume key (`--dump-volume-key`: confirmed, then unlocked).
    VolumeKey,
    /// The LUKS2 JSON area as cryptsetup prints it (`--dump-json-metadata`).
    JsonMetadata,
    /// ucrypt's JSON summary of the header (docs/JSON.md).
    Summary,
}

/// luksDump's options.
#[derive(Debug, Clone)]
pub struct DumpRequest {
    /// Device or image file.
    pub device: PathBuf,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// What to show.
    pub kind: DumpKind,
    /// The passphrase for [`DumpKind::VolumeKey`].
    pub key: KeySource,
    /// Only this keyslot for [`DumpKind::VolumeKey`].
    pub key_slot: Option<u32>,
    /// Do not ask before showing the volume key.
    pub batch: bool,
    /// How the devices are opened (locking, Ceph).
    pub access: crate::DeviceAccess,
}

/// luksDump: the text to print on standard output, in locked pages wiped
/// on drop (it may hold the volume key). Strings from the header are
/// escaped ([`crate::dump::escape`]).
pub fn dump(req: &DumpRequest, ui: &mut dyn Ui) -> Result<Secret> {
    let vol = load(&req.device, req.header.as_deref(), &req.access, ui)?;
    let target = req.header.as_deref().unwrap_or(&req.device);
    match req.kind {
        DumpKind::Summary => Ok(text(crate::summary::Summary::of(vol.header()).to_json())),
        DumpKind::JsonMetadata => crate::dump::json_text(vol.header())
            .map(text)
            .ok_or_else(|| invalid("Dump operation is not supported for this device type")),
        DumpKind::VolumeKey => {
            let q = "Header dump with volume key is sensitive information. Proceed?";
            if !req.batch && !ui.confirm(q) {
                return Err(invalid(
                    "Volume key dump needs confirmation or --batch-mode",
                ));
            }
            let prompt = format!("Enter passphrase for {}: ", req.device.display());
            let opened = req
                .key
                .unlock(&prompt, |pass| vol.unlock(pass, req.key_slot))?;
            Ok(crate::dump::volume_key_text(vol.header(), &opened, target))
        }
        DumpKind::Header => Ok(text(crate::dump::header_text(vol.header(), target))),
    }
}

/// Text without key material, in the type the volume key's text has.
fn text(s: String) -> Secret {
    Secret::from_slice(s.as_bytes())
}

/// isLuks: succeeds if `device` starts with a LUKS header of `luks_type`
/// (`luks`, `luks1`, `luks2`; any if `None`). When no header can be read,
/// `why` gets the reason first (cryptsetup prints it with `-v`); the
/// error is then "Device … is not a valid LUKS device". `device` is
/// opened as `access` says.
pub fn is_luks(
    device: &Path,
    access: &crate::DeviceAccess,
    luks_type: Option<&str>,
    why: impl FnOnce(&Error),
) -> Result<()> {
    let h = probe(device, access).map_err(|e| {
        why(&e);
        Error::new(
            ErrorKind::NotLuks,
            format!("Device {} is not a valid LUKS device", device.display()),
        )
    })?;
    match luks_type {
        Some(t) if t != format!("luks{}", h.version()) && t != "luks" => Err(invalid(format!(
            "Device {} is LUKS{}, not {t}",
            device.display(),
            h.version()
        ))),
        _ => Ok(()),
    }
}
