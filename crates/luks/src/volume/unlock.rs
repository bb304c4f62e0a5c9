//! Unlocking: trying passphrases on keyslots in cryptsetup's order,
//! checking a volume key against the digest, and building [`Opened`].

use crypto::Secret;

use super::io::{open_ro, read_exact_at, Device};
use super::{Opened, Volume};
use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::Kdf;
use crate::keyslot::{self, material_len};
use crate::luks2::json;
use crate::Header;

/// Prints, before an unlock of `slot`, that it will take long: its KDF
/// (deriving `key_len` bytes) and the volume key digest (`digest_hash` at
/// `digest_iterations`) together estimated above [`crate::kdf::NOTICE_SECS`].
/// Ctrl-C ends the process during the derivation (SIGINT keeps its
/// default action; nothing has been written).
fn cost_notice(slot: u32, kdf: &Kdf, key_len: usize, digest_hash: Hash, digest_iterations: u32) {
    let mut cost = kdf.estimate(key_len);
    cost.secs += Kdf::Pbkdf2 {
        hash: digest_hash,
        iterations: digest_iterations,
    }
    .estimate(digest_hash.digest_len())
    .secs;
    if let Some(n) = cost.notice(slot) {
        eprintln!("{n}");
    }
}

impl Volume {
    /// Tries the passphrase on one slot: `Ok(None)` when it does not fit.
    fn try_slot(&self, f: &mut dyn Device, slot: u32, pass: &[u8]) -> Result<Option<Secret>> {
        match &self.header {
            Header::V1(h) => {
                let s = h
                    .slots
                    .get(slot as usize)
                    .ok_or_else(|| invalid(format!("Keyslot {slot} is invalid")))?;
                if !s.active {
                    return Err(Error::new(
                        ErrorKind::SlotInactive,
                        format!("Keyslot {slot} is not active"),
                    ));
                }
                let mut mat = Secret::zeroed(material_len(h.key_bytes as usize, s.stripes));
                read_exact_at(f, u64::from(s.key_material_offset) * 512, &mut mat)?;
                let kdf = Kdf::Pbkdf2 {
                    hash: h.hash,
                    iterations: s.iterations,
                };
                let cipher = h.cipher();
                cost_notice(
                    slot,
                    &kdf,
                    h.key_bytes as usize,
                    h.hash,
                    h.mk_digest_iterations,
                );
                let params = keyslot::SlotParams {
                    kdf,
                    salt: &s.salt,
                    cipher: &cipher,
                    area_key_size: h.key_bytes as usize,
                    key_size: h.key_bytes as usize,
                    stripes: s.stripes,
                    af_hash: h.hash,
                };
                let vk = keyslot::open_material(pass, &params, &mut mat)?;
                let ok = keyslot::digest_matches(
                    h.hash,
                    &vk,
                    &h.mk_digest_salt,
                    h.mk_digest_iterations,
                    &h.mk_digest,
                );
                Ok(ok.then_some(vk))
            }
            Header::V2(h) => {
                let ks = h.meta.keyslots.get(&slot.to_string()).ok_or_else(|| {
                    Error::new(
                        ErrorKind::SlotInactive,
                        format!("Keyslot {slot} is not active"),
                    )
                })?;
                let (_, dg) = h
                    .meta
                    .digests
                    .iter()
                    .find(|(_, d)| d.keyslots.iter().any(|k| k == &slot.to_string()))
                    .ok_or_else(|| corrupt(format!("Keyslot {slot} has no digest")))?;
                let mut mat = Secret::zeroed(material_len(ks.key_size as usize, ks.af.stripes));
                read_exact_at(f, ks.area.offset, &mut mat)?;
                let salt = json::b64_decode(&ks.kdf.salt, "keyslot salt")?;
                // cryptsetup's luks2_keyslot_get_key: LUKS_SALTSIZE.
                if salt.len() != crate::luks1::SALT_LEN {
                    return Err(corrupt(format!(
                        "Keyslot {slot} salt is {} bytes long (must be {})",
                        salt.len(),
                        crate::luks1::SALT_LEN
                    )));
                }
                let kdf = ks.kdf.kdf()?;
                let dhash = Hash::parse(&dg.hash)?;
                cost_notice(slot, &kdf, ks.area.key_size as usize, dhash, dg.iterations);
                let params = keyslot::SlotParams {
                    kdf,
                    salt: &salt,
                    cipher: &ks.area.encryption,
                    area_key_size: ks.area.key_size as usize,
                    key_size: ks.key_size as usize,
                    stripes: ks.af.stripes,
                    af_hash: Hash::parse(&ks.af.hash)?,
                };
                let vk = keyslot::open_material(pass, &params, &mut mat)?;
                let dsalt = json::b64_decode(&dg.salt, "digest salt")?;
                let ddig = json::b64_decode(&dg.digest, "digest")?;
                let ok = keyslot::digest_matches(dhash, &vk, &dsalt, dg.iterations, &ddig);
                Ok(ok.then_some(vk))
            }
        }
    }

    /// Finds the keyslot `pass` opens: `(slot, volume key)`.
    pub fn unlock_key(&self, pass: &[u8], key_slot: Option<u32>) -> Result<(u32, Secret)> {
        let mut f = open_ro(&self.meta_path, &self.access)?;
        let slots: Vec<u32> = match key_slot {
            Some(s) => vec![s],
            None => self.unlock_order(),
        };
        if slots.is_empty() {
            return Err(Error::new(ErrorKind::WrongPassphrase, "No usable keyslot"));
        }
        // A keyslot that cannot be used (unknown KDF, cost out of range,
        // unreadable area) fails alone: the others are still tried, and
        // its error is reported only if no keyslot could be tried at all.
        let mut broken: Option<Error> = None;
        let mut tried = false;
        for s in slots {
            match self.try_slot(&mut f, s, pass) {
                Ok(Some(vk)) => return Ok((s, vk)),
                Ok(None) => tried = true,
                Err(e) => {
                    broken.get_or_insert(e);
                }
            }
        }
        if let (false, Some(e)) = (tried, broken) {
            return Err(e);
        }
        Err(Error::new(
            ErrorKind::WrongPassphrase,
            match key_slot {
                Some(s) => format!("No key available with this passphrase in keyslot {s}"),
                None => "No key available with this passphrase".to_string(),
            },
        ))
    }

    /// Active slots in cryptsetup's try order (LUKS2: high priority first,
    /// priority 0 "ignore" skipped).
    fn unlock_order(&self) -> Vec<u32> {
        match &self.header {
            Header::V1(_) => self.header.active_slots(),
            Header::V2(h) => h.meta.in_try_order(h.meta.segment_keyslots()),
        }
    }

    /// Unlocks and returns everything the data path needs.
    pub fn unlock(&self, pass: &[u8], key_slot: Option<u32>) -> Result<Opened> {
        let (slot, vk) = self.unlock_key(pass, key_slot)?;
        self.opened(slot, vk)
    }

    /// Builds [`Opened`] from a verified volume key.
    pub fn opened(&self, keyslot: u32, volume_key: impl Into<Secret>) -> Result<Opened> {
        self.check_data_device(true)?;
        let volume_key = volume_key.into();
        let off = self.header.payload_offset();
        let ss = u64::from(self.header.sector_size());
        let (size, iv_offset) = match &self.header {
            Header::V1(_) => ((self.data_size - off) / 512 * 512, 0),
            Header::V2(h) => {
                let seg = h.meta.segment().1;
                let size = match seg.fixed_size()? {
                    Some(s) => s,
                    None => (self.data_size - off) / ss * ss,
                };
                (size, seg.iv_tweak)
            }
        };
        if size == 0 {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                "The LUKS data area is empty (device too small)",
            ));
        }
        Ok(Opened {
            volume_key,
            keyslot,
            cipher: self.header.cipher(),
            sector_size: ss as u32,
            iv_offset,
            iv_large_sectors: false,
            payload_offset: off,
            size,
            uuid: self.header.uuid().to_string(),
        })
    }

    /// Checks that `vk` is this volume's key (constant time).
    pub fn verify_volume_key(&self, vk: &[u8]) -> bool {
        match &self.header {
            Header::V1(h) => {
                vk.len() == h.key_bytes as usize
                    && keyslot::digest_matches(
                        h.hash,
                        vk,
                        &h.mk_digest_salt,
                        h.mk_digest_iterations,
                        &h.mk_digest,
                    )
            }
            Header::V2(h) => match h.meta.segment_digest() {
                Some((_, dg)) => {
                    let (Ok(hash), Ok(salt), Ok(d)) = (
                        Hash::parse(&dg.hash),
                        json::b64_decode(&dg.salt, "digest salt"),
                        json::b64_decode(&dg.digest, "digest"),
                    ) else {
                        return false;
                    };
                    (self.header.key_size() == 0 || vk.len() == self.header.key_size())
                        && keyslot::digest_matches(hash, vk, &salt, dg.iterations, &d)
                }
                None => false,
            },
        }
    }

    /// [`Self::verify_volume_key`] as an error: a key that is not this
    /// volume's is refused like a wrong passphrase.
    pub(crate) fn check_volume_key(&self, vk: &[u8]) -> Result<()> {
        if self.verify_volume_key(vk) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::WrongPassphrase,
                "Volume key does not match the volume",
            ))
        }
    }
}
