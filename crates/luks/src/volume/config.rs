//! Header verbs that change no data: cryptsetup's `config` (label,
//! subsystem, keyslot priority), `luksErase` (every keyslot destroyed),
//! `repair` (both LUKS2 copies rewritten from the good one) and
//! `luksConvertKey` (a keyslot re-sealed with another PBKDF, same id).

use super::io::{open_rw, sync, write_at, write_luks2, zero_range};
use super::keyslots::{area_size_v2, SealV2};
use super::token::not_luks2;
use super::Volume;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::kdf::KdfRequest;
use crate::Header;

/// Longest LUKS2 label or subsystem (the 48-byte field keeps a NUL).
pub const MAX_LABEL_LEN: usize = 47;

/// A LUKS2 keyslot's priority (cryptsetup `config --priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// `ignore`: tried only when named with `--key-slot`.
    Ignore,
    /// `normal`: the default (no `priority` field).
    Normal,
    /// `prefer`: tried before the normal ones.
    Prefer,
}

impl Priority {
    /// Parses cryptsetup's spelling (`ignore`, `normal`, `prefer`).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "ignore" => Ok(Self::Ignore),
            "normal" => Ok(Self::Normal),
            "prefer" => Ok(Self::Prefer),
            _ => Err(invalid(
                "Option --priority can be only ignore/normal/prefer.",
            )),
        }
    }
}

/// What repair found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Both copies agree: nothing written.
    Clean,
    /// The listed problems were fixed by rewriting the header.
    Fixed(Vec<String>),
}

impl Volume {
    /// cryptsetup `config --label/--subsystem`: `None` leaves a field as
    /// it is, an empty string clears it. LUKS2 only.
    pub fn set_label(&mut self, label: Option<&str>, subsystem: Option<&str>) -> Result<()> {
        for s in [label, subsystem].into_iter().flatten() {
            if s.len() > MAX_LABEL_LEN || s.as_bytes().contains(&0) {
                return Err(invalid(format!(
                    "Label or subsystem {s:?} is longer than {MAX_LABEL_LEN} bytes"
                )));
            }
        }
        self.update_v2(|h| {
            if let Some(l) = label {
                h.bin.label = l.to_string();
            }
            if let Some(s) = subsystem {
                h.bin.subsystem = s.to_string();
            }
            Ok(())
        })
    }

    /// cryptsetup `config --priority P --key-slot S`. LUKS2 only.
    pub fn set_priority(&mut self, slot: u32, p: Priority) -> Result<()> {
        if let Header::V2(h) = &self.header {
            if !h.meta.keyslots.contains_key(&slot.to_string()) {
                return Err(Error::new(
                    ErrorKind::SlotInactive,
                    format!("Keyslot {slot} is not active."),
                ));
            }
        }
        self.update_v2(|h| {
            let ks = h
                .meta
                .keyslots
                .get_mut(&slot.to_string())
                .ok_or_else(|| invalid("Keyslot vanished"))?;
            match p {
                Priority::Normal => {
                    ks.extra.remove("priority");
                }
                Priority::Ignore => {
                    ks.extra.insert("priority".into(), 0.into());
                }
                Priority::Prefer => {
                    ks.extra.insert("priority".into(), 2.into());
                }
            }
            Ok(())
        })
    }

    /// cryptsetup `luksErase`: every keyslot is destroyed (header entry
    /// first, then its material wiped); the volume key is gone for good.
    /// LUKS2 tokens stay, with no keyslot, as cryptsetup leaves them.
    pub fn erase(&mut self) -> Result<Vec<u32>> {
        let slots = self.header.active_slots();
        for &s in &slots {
            self.kill_slot(s, true)?;
        }
        Ok(slots)
    }

    /// cryptsetup `repair`: a LUKS2 header with a damaged, older or
    /// different copy gets both copies rewritten from the one that
    /// loaded. A LUKS1 header that parses has nothing to repair.
    pub fn repair(&mut self) -> Result<Repair> {
        let found = self.header.warnings().to_vec();
        if found.is_empty() {
            return Ok(Repair::Clean);
        }
        match &mut self.header {
            Header::V1(h) => {
                let mut f = open_rw(&self.meta_path, &self.access)?;
                write_at(&mut f, 0, &h.to_bytes())?;
                sync(&f)?;
            }
            Header::V2(h) => {
                let mut f = open_rw(&self.meta_path, &self.access)?;
                write_luks2(&mut f, h)?;
                h.warnings.clear();
            }
        }
        Ok(Repair::Fixed(found))
    }

    /// cryptsetup `luksConvertKey`: re-seals keyslot `slot` (opened with
    /// `pass`, which must be its passphrase) with the KDF in `kdf`,
    /// keeping its id, area, digest and token bindings and its priority.
    /// LUKS2 only, as in cryptsetup.
    pub fn convert_key(&mut self, pass: &[u8], slot: Option<u32>, kdf: &KdfRequest) -> Result<u32> {
        if let Header::V1(_) = self.header {
            return Err(not_luks2(self));
        }
        if let Some(s) = slot {
            if !self.header.active_slots().contains(&s) {
                return Err(Error::new(
                    ErrorKind::SlotInactive,
                    format!("Keyslot {s} is not active."),
                ));
            }
        }
        let (s, vk) = self.unlock_key(pass, slot)?;
        self.check_volume_key(&vk)?;
        let (cipher, area_key_size) = self.area_cipher(vk.len());
        let mut f = self.open_update()?;
        let Header::V2(h) = &mut self.header else {
            unreachable!("checked above")
        };
        // As cryptsetup: the area is wiped and the keyslot re-sealed in
        // place (same offset, same id, its priority kept).
        let id = s.to_string();
        let old = h
            .meta
            .keyslots
            .get(&id)
            .cloned()
            .ok_or_else(|| invalid("Keyslot vanished"))?;
        if area_size_v2(vk.len()) > old.area.size {
            return Err(invalid(format!("Keyslot {s} area is too small to re-seal")));
        }
        // Resolve the KDF before the old material is wiped.
        let fixed = KdfRequest::fixed(&kdf.resolve(area_key_size)?, kdf.hash);
        let sealed = SealV2 {
            vk: &vk,
            af_hash: kdf.hash.name().to_string(),
            cipher,
            area_key_size,
            offset: old.area.offset,
            area_size: old.area.size,
        };
        zero_range(&mut f, old.area.offset, old.area.size)?;
        let ks = sealed.write(&mut f, pass, &fixed, old.extra.clone())?;
        h.meta.keyslots.insert(id, ks);
        write_luks2(&mut f, h)?;
        Ok(s)
    }
}
