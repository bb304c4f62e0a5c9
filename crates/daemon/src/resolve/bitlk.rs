//! `open --type bitlk` (and `--test-passphrase`, `map`): a BitLocker
//! volume's metadata read, cryptsetup's activation checks, the passphrase,
//! recovery password or `.BEK` startup key (`--key-file`) tried on every
//! VMK, and the table cryptsetup would load (see the `bitlk` crate).

use std::io::{Seek, SeekFrom};
use std::path::Path;

use bitlk::{ErrorKind as K, Metadata};
use crypto::table::Targets;
use luks::passphrase::KeyfileRange;

use crate::error::{Error, ErrorKind, Result};

/// A `bitlk` error as the daemon's (cryptsetup's exit codes: a wrong
/// key 2, unreadable device 4, anything else 1).
fn from_bitlk(e: bitlk::Error) -> Error {
    let kind = match e.kind() {
        K::WrongKey => ErrorKind::WrongPassphrase,
        K::Io => ErrorKind::Io,
        _ => ErrorKind::InvalidInput,
    };
    let msg = if e.message().is_empty() {
        // cryptsetup prints nothing here; say what failed.
        "Cannot unwrap the BITLK volume key (wrong key or damaged metadata)".to_owned()
    } else {
        e.message().to_owned()
    };
    Error::new(kind, msg)
}

/// A `bitlk` error as a `luks` one, for `luks::passphrase::Prompting::unlock`'s
/// retry loop (a wrong key asks again at a terminal).
pub fn bitlk_as_luks(e: bitlk::Error) -> luks::Error {
    let kind = match e.kind() {
        K::WrongKey => luks::ErrorKind::WrongPassphrase,
        _ => luks::ErrorKind::InvalidArgument,
    };
    luks::Error::new(kind, from_bitlk(e).to_string())
}

/// The first `len` bytes of `path`: a volume key file, read as
/// cryptsetup's `tools_read_vk` reads it (and with its messages).
pub fn read_volume_key(path: &Path, len: usize) -> Result<crypto::Secret> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("Cannot read keyfile {}.", path.display()),
        )
        .with_source(e)
    })?;
    let mut key = crypto::Secret::zeroed(len);
    f.read_exact(&mut key[..]).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("Cannot read {len} bytes from keyfile {}.", path.display()),
        )
        .with_source(e)
    })?;
    Ok(key)
}

/// Reads the BitLocker metadata of `device` and checks what cryptsetup
/// checks before it activates.
pub fn load_bitlk_metadata(device: &Path) -> Result<(std::fs::File, Metadata)> {
    let path = device.display().to_string();
    let f = std::fs::File::open(device).map_err(|e| {
        Error::new(
            ErrorKind::NoDevice,
            format!("Device {path} does not exist or access denied."),
        )
        .with_source(e)
    })?;
    let m = Metadata::read(&f, &path).map_err(from_bitlk)?;
    m.activate_check().map_err(from_bitlk)?;
    Ok((f, m))
}

/// The table of the BitLocker volume on `device`, unlocked with the key
/// file's bytes (a `.BEK` file or a passphrase) or a prompted passphrase,
/// or with the volume key read from `volume_key_file` (`--volume-key-file`:
/// the key's length of bytes, as cryptsetup reads it; BitLocker keeps no
/// digest, so a wrong key maps garbage, as there). A passphrase is asked
/// as `prompting` says; `say` gets cryptsetup's size warning.
pub fn unlock_bitlk(
    device: &Path,
    key_file: Option<&Path>,
    range: KeyfileRange,
    volume_key_file: Option<&Path>,
    prompting: &luks::passphrase::Prompting,
    mut say: impl FnMut(&str),
) -> Result<Targets> {
    let (mut f, m) = load_bitlk_metadata(device)?;
    let prompt = format!("Enter passphrase for {}: ", device.display());
    let key = match volume_key_file {
        Some(vk) => read_volume_key(vk, m.key_len())?,
        None => prompting.unlock(key_file, range, &prompt, |pass| {
            m.volume_key(pass).map_err(bitlk_as_luks)
        })?,
    };
    let size = f
        .seek(SeekFrom::End(0))
        .map_err(|e| Error::new(ErrorKind::Io, "Cannot get the device size").with_source(e))?;
    if size != m.volume_size {
        say(&format!(
            "WARNING: BitLocker volume size {} does not match the underlying device size {size}",
            m.volume_size
        ));
    }
    m.targets(&device.display().to_string(), size, &key)
        .map_err(from_bitlk)
}
