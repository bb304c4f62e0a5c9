//! `convert --type luks1|luks2` in place, as cryptsetup 2.6's
//! `luks2_luks1_convert.c` does it: the keyslot areas move between the
//! LUKS1 layout (first area at 4 KiB) and the LUKS2 one (after both 16 KiB
//! header copies), and the header is rebuilt field for field. Nothing is
//! re-encrypted: the volume key, keyslot material and data stay.
//!
//! LUKS2 → LUKS1 is refused when the header holds anything LUKS1 cannot
//! express (tokens, a non-512 sector size, a digest longer than 20 bytes,
//! keyslots that are not PBKDF2 with the digest's hash, areas off the
//! LUKS1 layout), with cryptsetup's reasons. Every check is done before
//! the first byte is written. Like cryptsetup, the move itself is not
//! crash-safe: take a header backup first.

use std::collections::BTreeMap;

use super::io::{read_exact_at, sync, write_at, write_luks2, zero_range};
use super::Volume;
use crate::error::{invalid, Error, Result};
use crate::keyslot::material_len;
use crate::luks1;
use crate::luks2::{self, binary::BinHeader, json};
use crate::Header;

/// Size of each LUKS2 header copy a conversion writes.
const HDR_SIZE: u64 = 16384;
/// Where LUKS1 keyslot areas start.
const LUKS1_AREAS: u64 = 4096;

fn refuse(why: impl std::fmt::Display) -> Error {
    invalid(format!("Cannot convert to LUKS1 format - {why}."))
}

impl Volume {
    /// Converts the header to LUKS `version` (1 or 2) in place.
    pub fn convert(&mut self, version: u32) -> Result<()> {
        match (version, &self.header) {
            (1, Header::V1(_)) => Err(invalid("Device is already LUKS1 type.")),
            (2, Header::V2(_)) => Err(invalid("Device is already LUKS2 type.")),
            (2, Header::V1(h)) => {
                let (new, shift_len) = to_luks2(h, self.detached)?;
                let mut f = self.open_update()?;
                let mut areas = vec![0u8; shift_len as usize];
                read_exact_at(&mut f, LUKS1_AREAS, &mut areas)?;
                write_at(&mut f, 2 * HDR_SIZE, &areas)?;
                sync(&f)?;
                let mut new = new;
                write_luks2(&mut f, &mut new)?;
                self.header = Header::V2(new);
                Ok(())
            }
            (1, Header::V2(h)) => {
                let new = to_luks1(h)?;
                let len = new.metadata_end() - LUKS1_AREAS;
                let mut f = self.open_update()?;
                let mut areas = vec![0u8; len as usize];
                read_exact_at(&mut f, 2 * h.hdr_size(), &mut areas)?;
                write_at(&mut f, LUKS1_AREAS, &areas)?;
                // What is left of the old areas past the moved range, and
                // nothing of the LUKS2 copies survives the move.
                zero_range(&mut f, LUKS1_AREAS + len, 2 * h.hdr_size() - LUKS1_AREAS)?;
                write_at(&mut f, 0, &{
                    let mut b = new.to_bytes();
                    b.resize(LUKS1_AREAS as usize, 0);
                    b
                })?;
                sync(&f)?;
                self.header = Header::V1(new);
                Ok(())
            }
            (v, _) => Err(invalid(format!("Cannot convert to LUKS{v}."))),
        }
    }
}

/// The LUKS2 header for a LUKS1 one, and how many bytes of keyslot areas
/// move from 4 KiB to `2 * HDR_SIZE`.
fn to_luks2(h: &luks1::Header, detached: bool) -> Result<(luks2::Header, u64)> {
    let cipher = h.cipher();
    let moved = h.metadata_end().div_ceil(4096) * 4096 - LUKS1_AREAS;
    let needed = 2 * HDR_SIZE + moved;
    let payload = u64::from(h.payload_offset) * 512;
    let end = if payload != 0 {
        payload / 4096 * 4096
    } else if detached {
        needed
    } else {
        return Err(invalid("Unable to move keyslot area. Not enough space."));
    };
    if end < needed {
        return Err(invalid("Unable to move keyslot area. Not enough space."));
    }
    let shift = 2 * HDR_SIZE - LUKS1_AREAS;
    let area_size = (material_len(h.key_bytes as usize, 4000) as u64).div_ceil(4096) * 4096;
    let mut keyslots = BTreeMap::new();
    let mut ids = Vec::new();
    for (i, s) in h.slots.iter().enumerate().filter(|(_, s)| s.active) {
        if s.stripes != 4000 {
            return Err(invalid(format!(
                "Unable to convert keyslot {i}: {} AF stripes (LUKS2 needs 4000).",
                s.stripes
            )));
        }
        let ks = json::Keyslot {
            kind: "luks2".into(),
            key_size: h.key_bytes,
            af: json::Af {
                kind: "luks1".into(),
                stripes: 4000,
                hash: h.hash.name().into(),
            },
            area: json::Area {
                kind: "raw".into(),
                offset: u64::from(s.key_material_offset) * 512 + shift,
                size: area_size,
                encryption: cipher.clone(),
                key_size: h.key_bytes,
            },
            kdf: json::KdfJson {
                kind: "pbkdf2".into(),
                hash: Some(h.hash.name().into()),
                iterations: Some(s.iterations),
                time: None,
                memory: None,
                cpus: None,
                salt: json::b64_encode(&s.salt),
            },
            extra: Default::default(),
        };
        keyslots.insert(i.to_string(), ks);
        ids.push(i.to_string());
    }
    let mut digests = BTreeMap::new();
    digests.insert(
        "0".to_string(),
        json::DigestJson {
            kind: "pbkdf2".into(),
            keyslots: ids,
            segments: vec!["0".into()],
            hash: h.hash.name().into(),
            iterations: h.mk_digest_iterations,
            salt: json::b64_encode(&h.mk_digest_salt),
            digest: json::b64_encode(&h.mk_digest),
        },
    );
    let mut segments = BTreeMap::new();
    segments.insert(
        "0".to_string(),
        json::Segment {
            kind: "crypt".into(),
            offset: payload,
            size: "dynamic".into(),
            iv_tweak: 0,
            encryption: cipher,
            sector_size: 512,
            extra: Default::default(),
        },
    );
    let new = luks2::Header {
        bin: BinHeader {
            primary: true,
            hdr_size: HDR_SIZE,
            seqid: 0,
            label: String::new(),
            checksum_alg: "sha256".into(),
            salt: [0; 64],
            uuid: h.uuid.clone(),
            subsystem: String::new(),
            hdr_offset: 0,
        },
        meta: json::Metadata {
            keyslots,
            tokens: BTreeMap::new(),
            segments,
            digests,
            config: json::Config {
                json_size: HDR_SIZE - 4096,
                keyslots_size: end - 2 * HDR_SIZE,
                flags: None,
                requirements: None,
                extra: Default::default(),
            },
        },
        warnings: Vec::new(),
    };
    new.meta.validate(HDR_SIZE)?;
    Ok((new, moved))
}

/// The LUKS1 header for a LUKS2 one, or cryptsetup's reason why not.
fn to_luks1(h: &luks2::Header) -> Result<luks1::Header> {
    let m = &h.meta;
    if !m.tokens.is_empty() {
        return Err(refuse(format_args!(
            "LUKS2 header contains {} token(s)",
            m.tokens.len()
        )));
    }
    if m.unmappable().is_some() {
        return Err(refuse("device is not a single crypt segment"));
    }
    let seg = m.segment().1;
    if seg.sector_size != 512 {
        return Err(refuse(
            "default segment encryption sector size is not 512 bytes",
        ));
    }
    if seg.size != "dynamic" || seg.iv_tweak != 0 {
        return Err(refuse("the data segment is not LUKS1 compatible"));
    }
    let (cipher_name, cipher_mode) = seg
        .encryption
        .split_once('-')
        .filter(|(n, m)| !n.starts_with("capi:") && n.len() < 32 && m.len() < 32)
        .ok_or_else(|| refuse("device uses a cipher spec LUKS1 cannot store"))?;
    if m.digests.len() != 1 {
        return Err(refuse("key slot digests are not LUKS1 compatible"));
    }
    let Some((_, d)) = m.segment_digest() else {
        return Err(refuse("key slot digests are not LUKS1 compatible"));
    };
    let hash = crate::Hash::parse(&d.hash)?;
    let dig = json::b64_decode(&d.digest, "digest")?;
    let salt = json::b64_decode(&d.salt, "digest salt")?;
    if dig.len() != luks1::DIGEST_LEN || salt.len() != luks1::SALT_LEN {
        return Err(refuse("key slot digests are not LUKS1 compatible"));
    }
    let key_bytes = Header::V2(h.clone()).key_size() as u32;
    let (offs, _) = luks1::default_layout(key_bytes.max(1));
    let shift = 2 * h.hdr_size() - LUKS1_AREAS;
    let mut slots = [luks1::Slot {
        active: false,
        iterations: 0,
        salt: [0; luks1::SALT_LEN],
        key_material_offset: 0,
        stripes: 4000,
    }; luks1::SLOTS];
    for (s, o) in slots.iter_mut().zip(offs) {
        s.key_material_offset = o;
    }
    for (id, ks) in &m.keyslots {
        let n: usize = id.parse().unwrap_or(usize::MAX);
        let bad = || refuse(format_args!("keyslot {id} is not LUKS1 compatible"));
        if n >= luks1::SLOTS {
            return Err(bad());
        }
        let kdf_ok = ks.kdf.kind == "pbkdf2" && ks.kdf.hash.as_deref() == Some(d.hash.as_str());
        let ok = kdf_ok
            && ks.af.hash == d.hash
            && ks.key_size == key_bytes
            && ks.area.encryption == seg.encryption
            && ks.area.key_size == key_bytes
            && d.keyslots.contains(id)
            && ks.area.offset == u64::from(offs[n]) * 512 + shift;
        if !ok {
            return Err(bad());
        }
        let ksalt = json::b64_decode(&ks.kdf.salt, "keyslot salt")?;
        if ksalt.len() != luks1::SALT_LEN {
            return Err(bad());
        }
        let s = &mut slots[n];
        s.active = true;
        s.iterations = ks.kdf.iterations.unwrap_or(0);
        s.salt.copy_from_slice(&ksalt);
    }
    let mut new = luks1::Header {
        cipher_name: cipher_name.into(),
        cipher_mode: cipher_mode.into(),
        hash,
        payload_offset: u32::try_from(seg.offset / 512)
            .map_err(|_| refuse("the data offset is too large"))?,
        key_bytes,
        mk_digest: [0; luks1::DIGEST_LEN],
        mk_digest_salt: [0; luks1::SALT_LEN],
        mk_digest_iterations: d.iterations,
        uuid: h.bin.uuid.clone(),
        slots,
    };
    new.mk_digest.copy_from_slice(&dig);
    new.mk_digest_salt.copy_from_slice(&salt);
    let end = new.metadata_end();
    if seg.offset != 0 && seg.offset < end {
        return Err(refuse("the data offset is inside the LUKS1 keyslot areas"));
    }
    if 2 * h.hdr_size() + (end - LUKS1_AREAS) > h.metadata_end().max(seg.offset) {
        return Err(refuse("the keyslot areas do not fit the LUKS1 layout"));
    }
    Ok(new)
}
