//! Keyslot management on a loaded volume: add a passphrase, kill a slot,
//! change the UUID, and first-fit allocation in the LUKS2 keyslots area.
//!
//! New keyslot material is written and synced before the header that points
//! at it; a removed keyslot leaves the header first and is wiped afterwards.

use super::io::Device;
use super::io::{sync, write_at, write_luks2, zero_range};
use super::Volume;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::{Kdf, KdfRequest};
use crate::keyslot::{self, material_len};
use crate::luks2::json;

use crate::luks2;
use crate::{af, luks1, Header};

impl Volume {
    /// Adds `new_pass` for the (already verified) volume key `vk` into
    /// `slot` or the first free one. Returns the slot used.
    pub fn add_key(
        &mut self,
        vk: &[u8],
        new_pass: &[u8],
        slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        self.check_volume_key(vk)?;
        let area = self.area_cipher(vk.len());
        let mut f = self.open_update()?;
        match &mut self.header {
            Header::V1(h) => add_key_v1(&mut f, h, vk, new_pass, slot, kdf),
            Header::V2(h) => add_key_v2(&mut f, h, vk, new_pass, slot, kdf, area),
        }
    }

    /// Seals the LUKS2 keyslots this volume writes from now on with
    /// `cipher` and a `key_bits` key (cryptsetup's `--keyslot-cipher` and
    /// `--keyslot-key-size`, `crypt_keyslot_set_encryption`). Refused on
    /// LUKS1 and for a cipher or key size keyslots cannot use.
    pub fn set_keyslot_encryption(&mut self, cipher: &str, key_bits: u32) -> Result<()> {
        if self.header.version() != 2 {
            return Err(invalid(
                "Keyslot encryption parameters can be set only for LUKS2 device.",
            ));
        }
        self.keyslot_encryption = Some(checked_keyslot_cipher(cipher, key_bits)?);
        Ok(())
    }

    /// The keyslot area cipher and key length for a new LUKS2 keyslot of
    /// a `key_len`-byte volume key (cryptsetup's
    /// `crypt_keyslot_get_encryption(CRYPT_ANY_SLOT)`).
    pub(super) fn area_cipher(&self, key_len: usize) -> (String, usize) {
        match (&self.keyslot_encryption, &self.header) {
            (Some(c), _) => c.clone(),
            (None, Header::V2(h)) => keyslot_cipher(&h.meta.segment().1.encryption, key_len),
            (None, Header::V1(_)) => (String::new(), key_len),
        }
    }

    /// Disables `slot` and wipes its material. Refuses the last active slot
    /// unless `allow_last`.
    pub fn kill_slot(&mut self, slot: u32, allow_last: bool) -> Result<()> {
        let active = self.header.active_slots();
        if !active.contains(&slot) {
            return Err(Error::new(
                ErrorKind::SlotInactive,
                format!("Keyslot {slot} is not active"),
            ));
        }
        if active.len() == 1 && !allow_last {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("Keyslot {slot} is the last one; the volume would become unusable"),
            ));
        }
        let mut f = self.open_update()?;
        match &mut self.header {
            Header::V1(h) => {
                let s = &mut h.slots[slot as usize];
                s.active = false;
                s.iterations = 0;
                s.salt = [0; luks1::SALT_LEN];
                let (off, len) = (
                    u64::from(s.key_material_offset) * 512,
                    material_len(h.key_bytes as usize, s.stripes),
                );
                write_at(&mut f, 0, &h.to_bytes())?;
                sync(&f)?;
                zero_range(&mut f, off, len as u64)?;
                sync(&f)?;
            }
            Header::V2(h) => {
                let id = slot.to_string();
                let ks = h
                    .meta
                    .keyslots
                    .remove(&id)
                    .ok_or_else(|| invalid("Keyslot vanished"))?;
                for d in h.meta.digests.values_mut() {
                    d.keyslots.retain(|k| k != &id);
                }
                // Tokens follow their keyslots (cryptsetup's
                // LUKS2_token_assign(..., 0)): the reference goes, the
                // token stays, possibly with no keyslot.
                for t in h.meta.tokens.values_mut() {
                    if let Some(ks) = t.get_mut("keyslots").and_then(|k| k.as_array_mut()) {
                        ks.retain(|k| k.as_str() != Some(id.as_str()));
                    }
                }
                write_luks2(&mut f, h)?;
                zero_range(&mut f, ks.area.offset, ks.area.size)?;
                sync(&f)?;
            }
        }
        Ok(())
    }

    /// Replaces the passphrase of the active `slot` with `new_pass`, given
    /// the (verified) volume key `vk` (cryptsetup luksChangeKey). LUKS1
    /// moves the key to the first free slot (the same slot when none is
    /// free) and LUKS2 keeps the slot number, as cryptsetup does. Either
    /// way a crash leaves the old or the new passphrase working. Returns
    /// the slot that now holds `new_pass`.
    pub fn change_key(
        &mut self,
        slot: u32,
        vk: &[u8],
        new_pass: &[u8],
        kdf: &KdfRequest,
    ) -> Result<u32> {
        self.change_key_at(slot, vk, new_pass, kdf, false)
    }

    /// [`Volume::change_key`]; with `in_place` (cryptsetup's luksChangeKey
    /// with `--key-slot`: old and new slot are the same) the keyslot is
    /// re-sealed in its own area, LUKS1 and LUKS2 alike.
    pub fn change_key_at(
        &mut self,
        slot: u32,
        vk: &[u8],
        new_pass: &[u8],
        kdf: &KdfRequest,
        in_place: bool,
    ) -> Result<u32> {
        self.check_volume_key(vk)?;
        if !self.header.active_slots().contains(&slot) {
            return Err(Error::new(
                ErrorKind::SlotInactive,
                format!("Keyslot {slot} is not active"),
            ));
        }
        let area = self.area_cipher(vk.len());
        if self.header.version() == 2 {
            let mut f = self.open_update()?;
            let Header::V2(h) = &mut self.header else {
                unreachable!("checked above")
            };
            return change_key_v2(&mut f, h, slot, vk, new_pass, kdf, area, in_place);
        }
        if in_place {
            self.kill_slot(slot, true)?;
            return self.add_key(vk, new_pass, Some(slot), kdf);
        }
        // LUKS1: new key in a free slot first, then the old one goes.
        match self.add_key(vk, new_pass, None, kdf) {
            Ok(s) => {
                self.kill_slot(slot, true)?;
                Ok(s)
            }
            Err(e) if e.kind() == ErrorKind::SlotBusy => {
                // No free slot: overwrite in place, as cryptsetup does.
                self.kill_slot(slot, true)?;
                self.add_key(vk, new_pass, Some(slot), kdf)
            }
            Err(e) => Err(e),
        }
    }

    /// Replaces the volume UUID (cryptsetup luksUUID --uuid).
    pub fn set_uuid(&mut self, uuid: Option<&str>) -> Result<String> {
        let uuid = match uuid {
            Some(u) => checked_uuid(u)?,
            None => keyslot::random_uuid()?,
        };
        let mut f = self.open_update()?;
        match &mut self.header {
            Header::V1(h) => {
                h.uuid = uuid.clone();
                write_at(&mut f, 0, &h.to_bytes())?;
                sync(&f)?;
            }
            Header::V2(h) => {
                h.bin.uuid = uuid.clone();
                write_luks2(&mut f, h)?;
            }
        }
        Ok(uuid)
    }
}

/// [`Volume::add_key`] on LUKS1: material into the slot's fixed area,
/// then the header.
fn add_key_v1(
    f: &mut dyn Device,
    h: &mut luks1::Header,
    vk: &[u8],
    new_pass: &[u8],
    slot: Option<u32>,
    kdf: &KdfRequest,
) -> Result<u32> {
    if kdf.kind != "pbkdf2" {
        return Err(invalid("LUKS1 keyslots support only the pbkdf2 KDF"));
    }
    let slot = match slot {
        Some(s) if s as usize >= luks1::SLOTS => {
            return Err(invalid(format!("Keyslot {s} is invalid")))
        }
        Some(s) if h.slots[s as usize].active => {
            return Err(Error::new(
                ErrorKind::SlotBusy,
                format!("Keyslot {s} is already in use"),
            ))
        }
        Some(s) => s,
        None => (0..8u32)
            .find(|&s| !h.slots[s as usize].active)
            .ok_or_else(|| Error::new(ErrorKind::SlotBusy, "All keyslots are full"))?,
    };
    let req = KdfRequest {
        hash: h.hash,
        ..kdf.clone()
    };
    let k = req.resolve(h.key_bytes as usize)?;
    let Kdf::Pbkdf2 { iterations, .. } = k else {
        unreachable!("pbkdf2 requested")
    };
    let salt = keyslot::random(luks1::SALT_LEN)?;
    let cipher = h.cipher();
    let s = &mut h.slots[slot as usize];
    let params = keyslot::SlotParams {
        kdf: k,
        salt: &salt,
        cipher: &cipher,
        area_key_size: vk.len(),
        key_size: vk.len(),
        stripes: s.stripes,
        af_hash: h.hash,
    };
    let mat = keyslot::seal_material(new_pass, &params, vk)?;
    write_at(f, u64::from(s.key_material_offset) * 512, &mat)?;
    sync(f)?;
    s.active = true;
    s.iterations = iterations;
    s.salt.copy_from_slice(&salt);
    write_at(f, 0, &h.to_bytes())?;
    sync(f)?;
    Ok(slot)
}

/// [`Volume::add_key`] on LUKS2: material into a first-fit area, then
/// the keyslot and its digest binding in both header copies.
fn add_key_v2(
    f: &mut dyn Device,
    h: &mut luks2::Header,
    vk: &[u8],
    new_pass: &[u8],
    slot: Option<u32>,
    kdf: &KdfRequest,
    (cipher, area_key_size): (String, usize),
) -> Result<u32> {
    let slot = match slot {
        Some(s) if s >= json::MAX_KEYSLOTS => {
            return Err(invalid(format!("Keyslot {s} is invalid")))
        }
        Some(s) if h.meta.keyslots.contains_key(&s.to_string()) => {
            return Err(Error::new(
                ErrorKind::SlotBusy,
                format!("Keyslot {s} is already in use"),
            ))
        }
        Some(s) => s,
        None => (0..json::MAX_KEYSLOTS)
            .find(|s| !h.meta.keyslots.contains_key(&s.to_string()))
            .ok_or_else(|| Error::new(ErrorKind::SlotBusy, "All keyslots are full"))?,
    };
    // cryptsetup's AF hash is the requested (--hash) one for every new
    // keyslot, whatever the other keyslots use.
    let af_hash = kdf.hash.name().to_string();
    let area_size = area_size_v2(vk.len());
    let offset = allocate_area(&h.meta, h.bin.hdr_size, area_size)?;
    let sealed = SealV2 {
        vk,
        af_hash,
        cipher,
        area_key_size,
        offset,
        area_size,
    };
    let ks = sealed.write(f, new_pass, kdf, Default::default())?;
    let id = slot.to_string();
    h.meta.keyslots.insert(id.clone(), ks);
    let sid = h.meta.segment().0.clone();
    if let Some(d) = h
        .meta
        .digests
        .values_mut()
        .find(|d| d.segments.contains(&sid))
    {
        d.keyslots.push(id);
    }
    write_luks2(f, h)?;
    Ok(slot)
}

/// [`Volume::change_key`] on LUKS2: the keyslot keeps its id (and so its
/// digest and token bindings), as cryptsetup's luksChangeKey does. The new
/// material goes to a free area first and the old area is wiped after the
/// header points away from it; with no room left it is overwritten in place.
// The inputs of one keyslot write, as its callers hold them.
#[allow(clippy::too_many_arguments)]
fn change_key_v2(
    f: &mut dyn Device,
    h: &mut luks2::Header,
    slot: u32,
    vk: &[u8],
    new_pass: &[u8],
    kdf: &KdfRequest,
    (cipher, area_key_size): (String, usize),
    in_place: bool,
) -> Result<u32> {
    let id = slot.to_string();
    let old = h.meta.keyslots.get(&id).cloned().ok_or_else(|| {
        Error::new(
            ErrorKind::SlotInactive,
            format!("Keyslot {slot} is not active"),
        )
    })?;
    let area_size = area_size_v2(vk.len());
    let fits = old.area.size >= area_size;
    let (offset, area_size, moved) = match allocate_area(&h.meta, h.bin.hdr_size, area_size) {
        _ if in_place && fits => (old.area.offset, old.area.size, false),
        Ok(o) => (o, area_size, true),
        Err(e) if e.kind() == ErrorKind::SlotBusy && fits => {
            (old.area.offset, old.area.size, false)
        }
        Err(e) => return Err(e),
    };
    let sealed = SealV2 {
        vk,
        af_hash: kdf.hash.name().to_string(),
        cipher,
        area_key_size,
        offset,
        area_size,
    };
    let ks = sealed.write(f, new_pass, kdf, old.extra.clone())?;
    h.meta.keyslots.insert(id, ks);
    write_luks2(f, h)?;
    if moved {
        zero_range(f, old.area.offset, old.area.size)?;
        sync(f)?;
    }
    Ok(slot)
}

/// Bytes of a LUKS2 keyslot area for a volume key of `key_len` bytes
/// (4 KiB aligned, as cryptsetup allocates).
pub(crate) fn area_size_v2(key_len: usize) -> u64 {
    (material_len(key_len, af::STRIPES) as u64).div_ceil(4096) * 4096
}

/// One LUKS2 keyslot to seal: where its material goes and how.
pub(crate) struct SealV2<'a> {
    pub(crate) vk: &'a [u8],
    pub(crate) af_hash: String,
    pub(crate) cipher: String,
    pub(crate) area_key_size: usize,
    pub(crate) offset: u64,
    pub(crate) area_size: u64,
}

impl SealV2<'_> {
    /// Derives, encrypts and writes (and syncs) the material; returns the
    /// keyslot object to put in the header.
    pub(crate) fn write(
        &self,
        f: &mut dyn Device,
        new_pass: &[u8],
        kdf: &KdfRequest,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> Result<json::Keyslot> {
        let k = kdf.resolve(self.area_key_size)?;
        let salt = keyslot::random(32)?;
        let params = keyslot::SlotParams {
            kdf: k,
            salt: &salt,
            cipher: &self.cipher,
            area_key_size: self.area_key_size,
            key_size: self.vk.len(),
            stripes: af::STRIPES,
            af_hash: Hash::parse(&self.af_hash)?,
        };
        let mat = keyslot::seal_material(new_pass, &params, self.vk)?;
        write_at(f, self.offset, &mat)?;
        sync(f)?;
        Ok(json::Keyslot {
            kind: "luks2".into(),
            key_size: self.vk.len() as u32,
            af: json::Af {
                kind: "luks1".into(),
                stripes: af::STRIPES,
                hash: self.af_hash.clone(),
            },
            area: json::Area {
                kind: "raw".into(),
                offset: self.offset,
                size: self.area_size,
                encryption: self.cipher.clone(),
                key_size: self.area_key_size as u32,
            },
            kdf: json::KdfJson::from_kdf(&k, &salt),
            extra,
        })
    }
}

/// cryptsetup's keyslot area cipher for a volume whose segment uses
/// `segment_cipher` with a `key_len`-byte key: the segment cipher itself
/// when it can encrypt a keyslot, else `aes-xts-plain64` with a 512-bit
/// key (a kernel crypto API `capi:` spec, `cipher_null`, or anything the
/// sector cipher cannot build), as `crypt_keyslot_get_encryption` does.
pub(crate) fn keyslot_cipher(segment_cipher: &str, key_len: usize) -> (String, usize) {
    const FALLBACK: (&str, usize) = ("aes-xts-plain64", 64);
    let usable = !segment_cipher.starts_with("capi:")
        && !segment_cipher.starts_with("cipher_null")
        && segment_cipher != "null"
        && crypto::SectorCrypt::new(&crypto::CryptConfig {
            cipher: segment_cipher.to_string(),
            key: zeroize::Zeroizing::new(vec![0x5a; key_len]),
            iv_offset: 0,
            sector_size: 512,
            iv_large_sectors: false,
        })
        .is_ok();
    if usable {
        (segment_cipher.to_string(), key_len)
    } else {
        (FALLBACK.0.to_string(), FALLBACK.1)
    }
}

/// `--keyslot-cipher` with a `key_bits` key, checked as cryptsetup does
/// (`LUKS2_keyslot_cipher_incompatible`: no null, `capi:` or wrapped-key
/// cipher) and further: the keyslot code must build it with that key, so
/// nothing is written for a keyslot that could not be sealed.
pub(crate) fn checked_keyslot_cipher(cipher: &str, key_bits: u32) -> Result<(String, usize)> {
    if key_bits == 0 || key_bits % 8 != 0 {
        return Err(invalid("Key size must be a multiple of 8 bits"));
    }
    let len = (key_bits / 8) as usize;
    if keyslot_cipher(cipher, len) != (cipher.to_string(), len) {
        return Err(invalid(format!(
            "Cannot use {cipher} cipher for keyslot encryption."
        )));
    }
    Ok((cipher.to_string(), len))
}

pub(super) fn checked_uuid(u: &str) -> Result<String> {
    let ok = u.len() == 36
        && u.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    if !ok {
        return Err(invalid(format!("UUID {u:?} is invalid")));
    }
    Ok(u.to_ascii_lowercase())
}

/// First-fit 4 KiB aligned gap of `size` bytes in the keyslots area.
pub(crate) fn allocate_area(meta: &json::Metadata, hdr_size: u64, size: u64) -> Result<u64> {
    let lo = json::Metadata::keyslots_start(hdr_size);
    let hi = lo + meta.config.keyslots_size;
    let mut used: Vec<(u64, u64)> = meta
        .keyslots
        .values()
        .map(|k| (k.area.offset, k.area.offset + k.area.size))
        .collect();
    used.sort_unstable();
    let mut pos = lo;
    for (s, e) in used {
        if pos + size <= s {
            break;
        }
        pos = pos.max(e.div_ceil(4096) * 4096);
    }
    if pos + size > hi {
        return Err(Error::new(
            ErrorKind::SlotBusy,
            "No space left in the LUKS2 keyslots area",
        ));
    }
    Ok(pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_area_first_fit() {
        let json = r#"{"keyslots":{},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512}},"digests":{},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;
        let mut meta: json::Metadata = serde_json::from_str(json).unwrap();
        assert_eq!(allocate_area(&meta, 16384, 258048).unwrap(), 32768);
        let ks: json::Keyslot = serde_json::from_value(serde_json::json!({
            "type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},
            "area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},
            "kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"AAAA"}}))
        .unwrap();
        meta.keyslots.insert("0".into(), ks.clone());
        assert_eq!(allocate_area(&meta, 16384, 258048).unwrap(), 32768 + 258048);
        let mut far = ks;
        far.area.offset = 32768 + 2 * 258048;
        meta.keyslots.insert("2".into(), far);
        assert_eq!(
            allocate_area(&meta, 16384, 258048).unwrap(),
            32768 + 258048,
            "fills the gap"
        );
        assert!(allocate_area(&meta, 16384, 1 << 30).is_err());
    }
}
