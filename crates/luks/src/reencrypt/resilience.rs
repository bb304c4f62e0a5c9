//! A resumed reencryption's new resilience (`--resilience`,
//! `--resilience-hash` with `--resume-only`), as cryptsetup 2.6.1 lets a
//! resume change it (`LUKS2_keyslot_reencrypt_update`): the reencrypt
//! keyslot's area gets the new type (and hash and block for `checksum`)
//! and the verification digest is made again over it with both keys. A
//! data shift's resilience cannot be switched to or from.

use std::path::Path;

use serde_json::json;
use zeroize::Zeroizing;

use super::{header::RawHeader, new_digest, read_header_of, unlock_both, MIN_ALIGNMENT};
use crate::error::{corrupt, invalid, Result};
use crate::hash::Hash;
use crate::reencrypt::{Resilience, State};
use crate::volume::io::{self, open_rw};
use crate::DeviceAccess;

/// Sets the resilience of the reencryption in progress on `device` (its
/// header on `meta`) to `resilience` (`checksum`, `journal` or `none`;
/// `checksum` hashes with `hash`, else the one it has, else sha256),
/// unlocking the keys with `pass`. Nothing is written when nothing
/// changes; a torn hotzone (its recovery needs the resilience it was
/// written with) is refused.
pub fn set_resilience(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
    resilience: &str,
    hash: Option<&str>,
) -> Result<()> {
    let _claim = io::claim(&[device, meta])?;
    set_resilience_held(device, meta, access, pass, key_slot, resilience, hash)
}

/// [`set_resilience`] on a device its caller holds (the daemon serving
/// it, between two runs of its reencryption: no hotzone is moving).
pub fn set_resilience_held(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
    resilience: &str,
    hash: Option<&str>,
) -> Result<()> {
    let (mut h, _) = read_header_of(meta, device, access)?;
    let st = State::load(&h)?.ok_or_else(|| invalid("Device reencryption not in progress."))?;
    let shifting = matches!(st.resilience, Resilience::Datashift { .. });
    if shifting || resilience.starts_with("datashift") {
        if shifting && resilience == "datashift" {
            return Ok(());
        }
        return Err(invalid(
            "Invalid reencryption resilience mode change requested.",
        ));
    }
    let hash = match (resilience, hash, &st.resilience) {
        ("checksum", Some(h), _) => Some(Hash::parse(h)?),
        ("checksum", None, Resilience::Checksum { hash, .. }) => Some(*hash),
        ("checksum", None, _) => Some(Hash::Sha256),
        ("journal" | "none", _, _) => None,
        (r, _, _) => return Err(invalid(format!("Unsupported resilience mode {r}"))),
    };
    let align = MIN_ALIGNMENT
        .max(u64::from(st.old.sector_size))
        .max(u64::from(st.new.sector_size));
    let (off, size) = st.area;
    let mut area = json!({"offset": off.to_string(), "size": size.to_string(), "type": resilience});
    if let Some(hash) = hash {
        area["hash"] = json!(hash.name());
        area["sector_size"] = json!(align);
    }
    let unchanged = h
        .obj("keyslots")
        .get(&st.keyslot)
        .and_then(|k| k.get("area"))
        == Some(&area);
    if unchanged {
        return Ok(());
    }
    if st.hotzone().is_some() {
        return Err(invalid(format!(
            "Device {} requires reencryption recovery: resume it with its resilience first.",
            device.display()
        )));
    }
    let (old_vk, new_vk) = unlock_both(&h, meta, access, pass, key_slot, &st)?;
    st.verify(&h, &old_vk, &new_vk)?;
    h.obj_mut("keyslots")
        .get_mut(&st.keyslot)
        .ok_or_else(|| corrupt("The reencrypt keyslot vanished"))?["area"] = area;
    resign(&mut h, &st, &old_vk, &new_vk)?;
    h.write(&mut *open_rw(meta, access)?)?;
    // The header read back must load as a reencryption with the new
    // resilience and its digest must hold.
    let st2 = State::load(&h)?.ok_or_else(|| corrupt("Reencryption state vanished"))?;
    st2.verify(&h, &old_vk, &new_vk)
}

/// A new verification digest over `h`'s reencryption metadata.
fn resign(h: &mut RawHeader, st: &State, old_vk: &[u8], new_vk: &[u8]) -> Result<()> {
    let vdata = Zeroizing::new(State::verification_data(
        h,
        &st.keyslot,
        st.version,
        old_vk,
        new_vk,
    )?);
    let d = new_digest(&vdata, std::slice::from_ref(&st.keyslot), &[])?;
    h.obj_mut("digests").insert(st.verify_digest.clone(), d);
    Ok(())
}
