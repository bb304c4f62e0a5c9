//! `open --test-passphrase` of a volume in reencryption: the passphrase
//! is checked against the keys the reencryption uses and nothing else,
//! as cryptsetup 2.6.1 checks it (no table is built, so a data area of
//! no bytes, such as a detached header given as its own device, is no
//! error).
//!
//! cryptsetup's answers, which these functions give:
//! - no `--key-slot`: the old key, then the new one, each from the
//!   keyslots bound to it (priority `prefer` first, `ignore` never);
//!   then the verification digest. A key no keyslot opens is "No key
//!   available with this passphrase." when the last keyslot tried was
//!   bound to it and "No usable keyslot is available." otherwise
//!   (cryptsetup keeps the last keyslot's answer, `-EPERM` or `-ENOENT`);
//! - `--key-slot N`: keyslot N opens its own key only, so a
//!   reencryption that uses two keys fails the verification (exit 1);
//!   the reencrypt keyslot or an absent one is "No usable keyslot is
//!   available.";
//! - a detached header's data device under one sector is "Header
//!   detected but device DEV is too small." before any passphrase;
//! - metadata that needs `repair` (`upgrade.rs`): the keys unlocked (a
//!   wrong passphrase answered as above), then
//!   "Reencryption metadata is invalid." and that line (exit 1).

use std::path::Path;

use crypto::Secret;

use super::{read_header_of, unlock_any, RawHeader, State};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::DeviceAccess;

/// Refuses, as cryptsetup does before asking for a passphrase, a data
/// device `device` (apart from its header `meta`) smaller than a sector;
/// both are opened as `access` says.
pub fn check_data_device(device: &Path, meta: &Path, access: &DeviceAccess) -> Result<()> {
    let (_, size) = read_header_of(meta, device, access)?;
    if meta != device && size < 512 {
        return Err(Error::new(
            ErrorKind::DeviceSize,
            format!(
                "Header detected but device {} is too small.",
                device.display()
            ),
        ));
    }
    Ok(())
}

/// Checks `pass` (only keyslot `key_slot`, when given) against the keys
/// of the reencryption whose header is on `meta` (the data on `device`),
/// as `cryptsetup open --test-passphrase` does; see the module comment.
/// Both are opened as `access` says.
pub fn test_passphrase(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
) -> Result<()> {
    let (h, _) = read_header_of(meta, device, access)?;
    let st = State::load(&h)?.ok_or_else(|| invalid("Device reencryption not in progress."))?;
    if st.needs_repair() {
        // cryptsetup unlocks, fails the verification, and ends with its
        // last keyslot's answer.
        match key_slot {
            None => {
                open_digest(&h, meta, access, pass, &st.old_digest)?;
                open_digest(&h, meta, access, pass, &st.new_digest)?;
            }
            Some(_) => {
                super::upgrade::unlock_keys(&h, meta, access, pass, key_slot, &st)?;
            }
        }
        return Err(invalid(
            "Reencryption metadata is invalid.\nNo usable keyslot is available.",
        ));
    }
    if st.hotzone().is_some() {
        return Err(invalid(format!(
            "Device {} requires reencryption recovery: run ucrypt reencrypt --resume-only \
             (or cryptsetup repair) first.",
            device.display()
        )));
    }
    let (old, new) = match key_slot {
        None => (
            open_digest(&h, meta, access, pass, &st.old_digest)?,
            open_digest(&h, meta, access, pass, &st.new_digest)?,
        ),
        Some(s) => {
            let slot = h.meta.keyslots.get(&s.to_string());
            if slot.is_none_or(|k| k.kind != "luks2") {
                return Err(no_usable());
            }
            let ids: Vec<&str> = h.meta.digests.keys().map(String::as_str).collect();
            let (_, (did, key)) = unlock_any(&h, meta, access, pass, &[s], &ids).map_err(|e| {
                if e.kind() == ErrorKind::WrongPassphrase {
                    wrong()
                } else {
                    e
                }
            })?;
            let pick = |want: &str| -> Result<Secret> {
                match (want.is_empty(), want == did) {
                    (true, _) => Ok(Secret::from_slice(&[])),
                    (false, true) => Ok(key.clone()),
                    (false, false) => Err(invalid(format!(
                        "Key (digest id {want}) required but not unlocked."
                    ))),
                }
            };
            (pick(&st.old_digest)?, pick(&st.new_digest)?)
        }
    };
    st.verify(&h, &old, &new)
}

/// The key of digest `did` (none for the empty id: the plaintext side),
/// from the keyslots cryptsetup tries for it, in its order.
pub(super) fn open_digest(
    h: &RawHeader,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    did: &str,
) -> Result<Secret> {
    if did.is_empty() {
        return Ok(Secret::from_slice(&[]));
    }
    let luks2 = h
        .meta
        .keyslots
        .iter()
        .filter(|(_, k)| k.kind == "luks2")
        .filter_map(|(id, _)| id.parse().ok());
    let order = h.meta.in_try_order(luks2);
    let prio = |s: u32| h.meta.keyslot_priority(s);
    match unlock_any(h, meta, access, pass, &order, &[did]) {
        Ok((_, (_, key))) => Ok(key),
        Err(e) if e.kind() == ErrorKind::WrongPassphrase => {
            let bound = |s: u32| {
                h.meta
                    .digests
                    .get(did)
                    .is_some_and(|d| d.keyslots.contains(&s.to_string()))
            };
            // cryptsetup answers with its last keyslot of normal priority
            // (a wrong passphrase in a preferred one outweighs "unusable").
            let last_normal = order.iter().rev().find(|&&s| prio(s) == 1);
            let preferred = order.iter().any(|&s| prio(s) == 2 && bound(s));
            if last_normal.is_some_and(|&s| bound(s)) || preferred {
                Err(wrong())
            } else {
                Err(no_usable())
            }
        }
        Err(e) => Err(e),
    }
}

fn wrong() -> Error {
    Error::new(
        ErrorKind::WrongPassphrase,
        "No key available with this passphrase.",
    )
}

fn no_usable() -> Error {
    Error::new(ErrorKind::SlotInactive, "No usable keyslot is available.")
}
