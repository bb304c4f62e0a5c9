//! `open --type fvault2` (and `--test-passphrase`, `map`): a FileVault 2
//! volume's metadata read, the passphrase tried, and the one-target table
//! cryptsetup would load (see the `fvault2` crate). Served read-only.

use std::io::{Seek, SeekFrom};
use std::path::Path;

use crypto::table::Targets;
use fvault2::{ErrorKind as K, Metadata};
use luks::passphrase::KeyfileRange;

use crate::error::{Error, ErrorKind, Result};

fn from_fvault2(e: fvault2::Error) -> Error {
    let kind = match e.kind() {
        K::WrongKey => ErrorKind::WrongPassphrase,
        K::Io => ErrorKind::Io,
        _ => ErrorKind::InvalidInput,
    };
    let msg = e.to_string();
    let msg = if msg.is_empty() {
        "Cannot unwrap the FVAULT2 volume key (damaged metadata)".to_owned()
    } else {
        msg
    };
    Error::new(kind, msg)
}

/// An `fvault2` error as a `luks` one, for `luks::passphrase::Prompting::unlock`'s
/// retry loop.
pub fn fvault2_as_luks(e: fvault2::Error) -> luks::Error {
    let kind = match e.kind() {
        K::WrongKey => luks::ErrorKind::WrongPassphrase,
        _ => luks::ErrorKind::InvalidArgument,
    };
    luks::Error::new(kind, from_fvault2(e).to_string())
}

/// Reads the FileVault 2 metadata of `device`.
pub fn load_fvault2_metadata(device: &Path) -> Result<(std::fs::File, Metadata)> {
    let path = device.display().to_string();
    let f = std::fs::File::open(device).map_err(|e| {
        Error::new(
            ErrorKind::NoDevice,
            format!("Device {path} does not exist or access denied."),
        )
        .with_source(e)
    })?;
    let m = Metadata::read(&f, &path).map_err(from_fvault2)?;
    Ok((f, m))
}

/// The table of the FileVault 2 volume on `device`, unlocked with the key
/// file's bytes or a prompted passphrase, or with the 32-byte volume key
/// read from `volume_key_file` (`--volume-key-file`; no digest to check
/// it against, as in cryptsetup). A passphrase is asked as `prompting` says.
pub fn unlock_fvault2(
    device: &Path,
    key_file: Option<&Path>,
    range: KeyfileRange,
    volume_key_file: Option<&Path>,
    prompting: &luks::passphrase::Prompting,
) -> Result<Targets> {
    let (mut f, m) = load_fvault2_metadata(device)?;
    let prompt = format!("Enter passphrase for {}: ", device.display());
    let key = match volume_key_file {
        Some(vk) => super::bitlk::read_volume_key(vk, fvault2::VOLUME_KEY_LEN)?,
        None => prompting.unlock(key_file, range, &prompt, |pass| {
            m.volume_key(pass).map_err(fvault2_as_luks)
        })?,
    };
    let size = f
        .seek(SeekFrom::End(0))
        .map_err(|e| Error::new(ErrorKind::Io, "Cannot get the device size").with_source(e))?;
    m.targets(&device.display().to_string(), size, &key)
        .map_err(from_fvault2)
}
