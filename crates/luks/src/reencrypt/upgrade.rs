//! Reencryption metadata older than cryptsetup 2.4 — the requirement
//! `online-reencrypt` (version 1), or no verification digest on the
//! reencrypt keyslot — and its upgrade by `repair`, as cryptsetup 2.6.1
//! does it (`reencrypt_repair_by_passphrase`).
//!
//! Such metadata is refused by every verb, as cryptsetup refuses it: the
//! keys are unlocked first (a wrong passphrase is "No usable keyslot is
//! available.", exit 1), then "Reencryption metadata is invalid." An
//! attacker who can write the header could otherwise point a resumed
//! run at data of his choosing; the passphrase holder's `repair`
//! acknowledges the operation and binds it to the keys:
//!
//! ```text
//!   old key + new key ──► verification data (version 2; 3 for a
//!                         decryption with a data shift and its moved
//!                         segment) ──► new pbkdf2 digest, bound to the
//!                         reencrypt keyslot only
//!   requirements.mandatory: known requirements but the reencryption's
//!                         (unknown ones dropped, as cryptsetup's
//!                         filtered copy drops them) + online-reencrypt-vN
//! ```
//!
//! The rest of the header, a torn hotzone included, is left as it is: a
//! resumed run (either tool's) repairs the hotzone. The upgrade reads
//! only what it signs, so a layout ucrypt does not run itself (cryptsetup
//! 2.2's reencryption with a data shift) is upgraded for cryptsetup too.

use std::path::Path;

use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::lock::ReencryptLock;
use super::{free_digest, new_digest, read_header_of, unlock_both, RawHeader, State};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::volume::io::{self, open_rw};
use crate::DeviceAccess;

/// cryptsetup's refusal of metadata that needs the upgrade.
pub(crate) fn invalid_metadata() -> Error {
    invalid("Reencryption metadata is invalid.")
}

fn no_usable() -> Error {
    Error::new(ErrorKind::SlotInactive, "No usable keyslot is available.")
}

/// A run's refusal, before any passphrase, of old metadata with a torn
/// hotzone: cryptsetup names the recovery first (its `repair` upgrades,
/// a second one recovers), as for any crashed run it resumes.
pub(crate) fn check_resumable(st: &State) -> Result<()> {
    if st.needs_repair() && st.hotzone().is_some() {
        return Err(invalid(
            "Device requires reencryption recovery. Run repair first.",
        ));
    }
    Ok(())
}

/// The old and the new key of `st` opened with `pass`; a passphrase that
/// opens neither is "No usable keyslot is available." when the metadata
/// needs the upgrade (cryptsetup's answer there, exit 1).
pub(crate) fn unlock_keys(
    h: &RawHeader,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
    st: &State,
) -> Result<(crypto::Secret, crypto::Secret)> {
    unlock_both(h, meta, access, pass, key_slot, st).map_err(|e| {
        if st.needs_repair() && e.kind() == ErrorKind::WrongPassphrase {
            no_usable()
        } else {
            e
        }
    })
}

/// What an upgrade needs of old metadata, read from the raw header
/// alone (a layout ucrypt does not run, such as cryptsetup 2.2's
/// reencryption with a data shift, is upgraded all the same).
struct Old {
    /// The reencrypt keyslot.
    keyslot: String,
    /// The requirement version it gets.
    version: u8,
    /// The digests of the old and the new key (empty: plaintext).
    old_digest: String,
    new_digest: String,
}

/// The old metadata of `h`, `None` when it is not in reencryption or
/// needs no upgrade.
fn old_metadata(h: &RawHeader) -> Result<Option<Old>> {
    let Some(req) = super::state::requirement(h)? else {
        return Ok(None);
    };
    let kid = h
        .obj("keyslots")
        .iter()
        .find(|(_, k)| k.get("type").and_then(Value::as_str) == Some("reencrypt"))
        .map(|(id, _)| id.clone())
        .ok_or_else(|| crate::error::corrupt("LUKS2 reencryption without its keyslot"))?;
    let bound_to = |pick: &dyn Fn(&Value) -> bool| -> Vec<String> {
        h.obj("digests")
            .iter()
            .filter(|(_, d)| pick(d))
            .map(|(id, _)| id.clone())
            .collect()
    };
    let names = |d: &Value, field: &str, id: &str| {
        d.get(field)
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(id)))
    };
    if req >= 2 && !bound_to(&|d| names(d, "keyslots", &kid)).is_empty() {
        return Ok(None);
    }
    let flagged = |flag: &str| {
        h.obj("segments").iter().find(|(_, s)| {
            s.get("flags")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(flag)))
        })
    };
    let digest_of = |flag: &str| -> Result<String> {
        let (sid, seg) = flagged(flag).ok_or_else(|| {
            crate::error::corrupt(format!("LUKS2 reencryption needs one {flag} segment"))
        })?;
        if seg.get("type").and_then(Value::as_str) == Some("linear") {
            return Ok(String::new());
        }
        match &bound_to(&|d| names(d, "segments", sid))[..] {
            [d] => Ok(d.clone()),
            _ => Err(crate::error::corrupt(format!(
                "LUKS2 segment {sid} needs one digest"
            ))),
        }
    };
    let ks = &h.obj("keyslots")[&kid];
    let shift_decrypt = ks.get("mode").and_then(Value::as_str) == Some("decrypt")
        && ks
            .get("area")
            .and_then(|a| a.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with("datashift-"))
        && flagged("backup-moved-segment").is_some();
    Ok(Some(Old {
        version: if shift_decrypt { 3 } else { 2 },
        old_digest: digest_of("backup-previous")?,
        new_digest: digest_of("backup-final")?,
        keyslot: kid,
    }))
}

/// The key of digest `did` (none for the plaintext side) from any
/// keyslot, `key_slot` tried first.
fn open_key(
    h: &RawHeader,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
    did: &str,
) -> Result<crypto::Secret> {
    if did.is_empty() {
        return Ok(crypto::Secret::from_slice(&[]));
    }
    if key_slot.is_none() {
        // cryptsetup's order and its answer to a wrong passphrase, as
        // for `open --test-passphrase`.
        return super::test_key::open_digest(h, meta, access, pass, did);
    }
    let mut slots = super::keyslot_ids(h);
    if let Some(s) = key_slot {
        slots.retain(|&x| x != s);
        slots.insert(0, s);
    }
    super::unlock_any(h, meta, access, pass, &slots, &[did])
        .map(|(_, (_, k))| k)
        .map_err(|e| match e.kind() {
            ErrorKind::WrongPassphrase => no_usable(),
            _ => e,
        })
}

/// Whether the header on `meta` holds reencryption metadata that
/// [`upgrade`] would rewrite.
pub fn needs_upgrade(meta: &Path, access: &DeviceAccess) -> Result<bool> {
    let (h, _) = super::read_header(meta, access)?;
    Ok(old_metadata(&h)?.is_some())
}

/// Upgrades the reencryption metadata of the volume whose header is on
/// `meta` (its data on `device`) with the passphrase `pass` (of keyslot
/// `key_slot` when given): the verification digest created over both
/// keys, the requirement set to its current version; see the module
/// comment. `Ok(false)` when the metadata needs nothing.
pub fn upgrade(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
) -> Result<bool> {
    let _claim = io::claim(&[device, meta])?;
    let (first, _) = read_header_of(meta, device, access)?;
    let _lock = ReencryptLock::take(&first.bin.uuid, access.locking)?;
    // Under the lock, the header again.
    let (mut h, _) = read_header_of(meta, device, access)?;
    let Some(old) = old_metadata(&h)? else {
        return Ok(false);
    };
    let old_vk = open_key(&h, meta, access, pass, key_slot, &old.old_digest)?;
    let new_vk = open_key(&h, meta, access, pass, key_slot, &old.new_digest)?;
    let vdata = Zeroizing::new(State::verification_data(
        &h,
        &old.keyslot,
        old.version,
        &old_vk,
        &new_vk,
    )?);
    // The reencrypt keyslot leaves any digest it was bound to, then gets
    // its own (`LUKS2_digest_assign` of CRYPT_ANY_DIGEST, then the new).
    for d in h.obj_mut("digests").values_mut() {
        if let Some(k) = d.get_mut("keyslots").and_then(Value::as_array_mut) {
            k.retain(|x| x.as_str() != Some(old.keyslot.as_str()));
        }
    }
    let vid = free_digest(&h);
    h.obj_mut("digests").insert(
        vid,
        new_digest(&vdata, std::slice::from_ref(&old.keyslot), &[])?,
    );
    set_requirement(&mut h, old.version);
    h.write(&mut *open_rw(meta, access)?)?;
    Ok(true)
}

/// `config.requirements.mandatory` as cryptsetup's
/// `LUKS2_config_set_requirement_version` writes it: the known
/// requirements other than the reencryption's kept, then
/// `online-reencrypt-v{version}`.
fn set_requirement(h: &mut RawHeader, version: u8) {
    let cfg = h.obj_mut("config");
    let old: Vec<Value> = cfg
        .get("requirements")
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // The only known requirement outside reencryption: the legacy
    // offline one (refused on load, so never met here).
    let mut kept: Vec<Value> = old
        .into_iter()
        .filter(|r| r.as_str() == Some("offline-reencrypt"))
        .collect();
    kept.push(json!(format!("online-reencrypt-v{version}")));
    let req = cfg.entry("requirements").or_insert_with(|| json!({}));
    if !req.is_object() {
        *req = json!({});
    }
    req["mandatory"] = Value::Array(kept);
}
