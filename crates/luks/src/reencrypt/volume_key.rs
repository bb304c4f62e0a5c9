//! `reencrypt --volume-key-file FILE`: the new volume key read from a
//! file, as cryptsetup 2.6.1 reads it (`tools_read_vk`: exactly the new
//! key's size from the file's start, a longer file is fine). A key equal
//! to the volume's own changes nothing: with no other change cryptsetup
//! aborts ("No data segment parameters changed."); with one it keeps the
//! key, which ucrypt does not do.

use std::io::Read;
use std::path::Path;

use crypto::Secret;

use crate::error::{invalid, unsupported, Result};

/// The first `len` bytes of `file`, in cryptsetup's words when it cannot
/// give them.
pub(super) fn read(file: &Path, len: usize) -> Result<Secret> {
    let mut f = std::fs::File::open(file)
        .map_err(|_| invalid(format!("Cannot read keyfile {}.", file.display())))?;
    let mut key = Secret::zeroed(len);
    f.read_exact(&mut key).map_err(|_| {
        invalid(format!(
            "Cannot read {len} bytes from keyfile {}.",
            file.display()
        ))
    })?;
    Ok(key)
}

/// Refuses a new key equal to the `old` one: nothing to do when nothing
/// else changes (`changed`: a new cipher, key size or sector size).
pub(super) fn check_new(old: &[u8], new: &[u8], changed: bool) -> Result<()> {
    use subtle::ConstantTimeEq;
    if old.len() != new.len() || !bool::from(old.ct_eq(new)) {
        return Ok(());
    }
    if changed {
        return Err(unsupported(
            "Reencryption keeping the volume key (--volume-key-file with the current key) \
             is not supported by ucrypt.",
        ));
    }
    Err(invalid(
        "No data segment parameters changed. Reencryption aborted.",
    ))
}
