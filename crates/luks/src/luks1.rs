//! LUKS1: the 592-byte big-endian header and its 8 keyslots (hand-written
//! from the LUKS1 on-disk format specification 1.2.3).
//!
//! `RawHeader` mirrors the bytes; [`Header`] is the parsed, validated
//! value. Parsing checks every offset against the payload and the other
//! keyslots so later code can index without re-checking.
//!
//! ```text
//! 0   magic "LUKS\xba\xbe"  6   version=1  8 cipherName[32]  40 cipherMode[32]
//! 72  hashSpec[32]  104 payloadOffset  108 keyBytes  112 mkDigest[20]
//! 132 mkDigestSalt[32]  164 mkDigestIterations  168 uuid[40]
//! 208 8 x keyslot { active, iterations, salt[32], keyMaterialOffset, stripes }
//! ```

use crate::codec::{put_cstr, Reader};
use crate::error::{corrupt, unsupported, Result};
use crate::hash::Hash;

/// The LUKS magic shared by LUKS1 and the LUKS2 primary header.
pub const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
/// Size of the LUKS1 header structure.
pub const HEADER_LEN: usize = 592;
/// Number of LUKS1 keyslots.
pub const SLOTS: usize = 8;
/// `active` value of an enabled keyslot.
pub const KEY_ENABLED: u32 = 0x00AC_71F3;
/// `active` value of a disabled keyslot.
pub const KEY_DISABLED: u32 = 0x0000_DEAD;
/// Length of the master-key digest.
pub const DIGEST_LEN: usize = 20;
/// Salt length of keyslots and the digest.
pub const SALT_LEN: usize = 32;
/// Largest accepted volume key (bytes).
pub const MAX_KEY_BYTES: u32 = 128;

/// The header exactly as stored (fields still raw).
#[derive(Clone)]
struct RawHeader {
    version: u16,
    cipher_name: String,
    cipher_mode: String,
    hash_spec: String,
    payload_offset: u32,
    key_bytes: u32,
    mk_digest: [u8; DIGEST_LEN],
    mk_digest_salt: [u8; SALT_LEN],
    mk_digest_iterations: u32,
    uuid: String,
    slots: [RawSlot; SLOTS],
}

#[derive(Clone, Copy, Default)]
struct RawSlot {
    active: u32,
    iterations: u32,
    salt: [u8; SALT_LEN],
    key_material_offset: u32,
    stripes: u32,
}

/// One keyslot of a parsed LUKS1 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Enabled (holds a key) or disabled.
    pub active: bool,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: [u8; SALT_LEN],
    /// Start of the key material in 512-byte sectors.
    pub key_material_offset: u32,
    /// AF stripes (4000).
    pub stripes: u32,
}

/// A parsed, validated LUKS1 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Cipher name, e.g. `aes`.
    pub cipher_name: String,
    /// Cipher mode, e.g. `xts-plain64`.
    pub cipher_mode: String,
    /// Hash for PBKDF2, the digest and AF.
    pub hash: Hash,
    /// Payload start in 512-byte sectors.
    pub payload_offset: u32,
    /// Volume key length in bytes.
    pub key_bytes: u32,
    /// PBKDF2 digest of the volume key.
    pub mk_digest: [u8; DIGEST_LEN],
    /// Salt of that digest.
    pub mk_digest_salt: [u8; SALT_LEN],
    /// Iterations of that digest.
    pub mk_digest_iterations: u32,
    /// Volume UUID.
    pub uuid: String,
    /// The 8 keyslots.
    pub slots: [Slot; SLOTS],
}

impl Header {
    /// dm-crypt cipher spec (`cipher_name-cipher_mode`).
    pub fn cipher(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }

    /// Sectors of one keyslot's AF material (not aligned).
    pub fn af_sectors(&self) -> u64 {
        (u64::from(self.key_bytes) * 4000).div_ceil(512)
    }

    /// End (bytes) of the last keyslot area rounded up to 4 KiB, as
    /// cryptsetup's `LUKS_device_sectors`: the header backup size.
    pub fn metadata_end(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| {
                (u64::from(s.key_material_offset) + af_sectors(self.key_bytes, s.stripes)) * 512
            })
            .max()
            .unwrap_or(HEADER_LEN as u64)
            .div_ceil(4096)
            * 4096
    }

    /// Parses and validates the first [`HEADER_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let raw = RawHeader::parse(buf)?;
        Self::from_raw(raw)
    }

    /// Serializes to exactly [`HEADER_LEN`] bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&1u16.to_be_bytes());
        put_cstr(&mut out, &self.cipher_name, 32);
        put_cstr(&mut out, &self.cipher_mode, 32);
        put_cstr(&mut out, self.hash.name(), 32);
        out.extend_from_slice(&self.payload_offset.to_be_bytes());
        out.extend_from_slice(&self.key_bytes.to_be_bytes());
        out.extend_from_slice(&self.mk_digest);
        out.extend_from_slice(&self.mk_digest_salt);
        out.extend_from_slice(&self.mk_digest_iterations.to_be_bytes());
        put_cstr(&mut out, &self.uuid, 40);
        for s in &self.slots {
            let active = if s.active { KEY_ENABLED } else { KEY_DISABLED };
            out.extend_from_slice(&active.to_be_bytes());
            out.extend_from_slice(&s.iterations.to_be_bytes());
            out.extend_from_slice(&s.salt);
            out.extend_from_slice(&s.key_material_offset.to_be_bytes());
            out.extend_from_slice(&s.stripes.to_be_bytes());
        }
        debug_assert_eq!(out.len(), HEADER_LEN);
        out
    }

    fn from_raw(raw: RawHeader) -> Result<Self> {
        if raw.version != 1 {
            return Err(unsupported(format!(
                "LUKS version {} is not LUKS1",
                raw.version
            )));
        }
        if raw.cipher_name.is_empty() || raw.cipher_mode.is_empty() {
            return Err(corrupt("LUKS1 header has an empty cipher name or mode"));
        }
        let hash = Hash::parse(&raw.hash_spec)?;
        if raw.key_bytes == 0 || raw.key_bytes > MAX_KEY_BYTES {
            return Err(corrupt(format!(
                "LUKS1 key size {} bytes is invalid",
                raw.key_bytes
            )));
        }
        if raw.mk_digest_iterations == 0 {
            return Err(corrupt("LUKS1 digest iteration count is zero"));
        }
        let mut slots = [Slot {
            active: false,
            iterations: 0,
            salt: [0; SALT_LEN],
            key_material_offset: 0,
            stripes: 0,
        }; SLOTS];
        // Header occupies sectors 0..2 (592 bytes); keyslot areas follow.
        let header_sectors = (HEADER_LEN as u64).div_ceil(512);
        let mut areas: Vec<(u64, u64, usize)> = Vec::new();
        for (i, rs) in raw.slots.iter().enumerate() {
            let active = match rs.active {
                KEY_ENABLED => true,
                KEY_DISABLED => false,
                v => {
                    return Err(corrupt(format!(
                        "LUKS1 keyslot {i} has invalid state 0x{v:08x}"
                    )))
                }
            };
            if rs.stripes != 4000 {
                return Err(corrupt(format!(
                    "LUKS1 keyslot {i} has {} AF stripes (expected 4000)",
                    rs.stripes
                )));
            }
            if active && rs.iterations == 0 {
                return Err(corrupt(format!("LUKS1 keyslot {i} has zero iterations")));
            }
            let start = u64::from(rs.key_material_offset);
            let end = start + af_sectors(raw.key_bytes, rs.stripes);
            if start < header_sectors {
                return Err(corrupt(format!("LUKS1 keyslot {i} overlaps the header")));
            }
            if raw.payload_offset != 0 && end > u64::from(raw.payload_offset) {
                return Err(corrupt(format!("LUKS1 keyslot {i} overlaps the payload")));
            }
            for &(s, e, j) in &areas {
                if start < e && s < end {
                    return Err(corrupt(format!("LUKS1 keyslots {j} and {i} overlap")));
                }
            }
            areas.push((start, end, i));
            slots[i] = Slot {
                active,
                iterations: rs.iterations,
                salt: rs.salt,
                key_material_offset: rs.key_material_offset,
                stripes: rs.stripes,
            };
        }
        Ok(Header {
            cipher_name: raw.cipher_name,
            cipher_mode: raw.cipher_mode,
            hash,
            payload_offset: raw.payload_offset,
            key_bytes: raw.key_bytes,
            mk_digest: raw.mk_digest,
            mk_digest_salt: raw.mk_digest_salt,
            mk_digest_iterations: raw.mk_digest_iterations,
            uuid: raw.uuid,
            slots,
        })
    }
}

/// AF material size in 512-byte sectors.
pub(crate) fn af_sectors(key_bytes: u32, stripes: u32) -> u64 {
    (u64::from(key_bytes) * u64::from(stripes)).div_ceil(512)
}

impl RawHeader {
    fn parse(buf: &[u8]) -> Result<Self> {
        let mut r = Reader::new(buf, "LUKS1 header");
        let magic: [u8; 6] = r.array()?;
        if magic != MAGIC {
            return Err(crate::error::Error::new(
                crate::ErrorKind::NotLuks,
                "No LUKS signature",
            ));
        }
        let version = r.u16()?;
        let cipher_name = r.cstr(32, "cipherName")?;
        let cipher_mode = r.cstr(32, "cipherMode")?;
        let hash_spec = r.cstr(32, "hashSpec")?;
        let payload_offset = r.u32()?;
        let key_bytes = r.u32()?;
        let mk_digest = r.array()?;
        let mk_digest_salt = r.array()?;
        let mk_digest_iterations = r.u32()?;
        let uuid = r.cstr(40, "uuid")?;
        let mut slots = [RawSlot::default(); SLOTS];
        for s in &mut slots {
            s.active = r.u32()?;
            s.iterations = r.u32()?;
            s.salt = r.array()?;
            s.key_material_offset = r.u32()?;
            s.stripes = r.u32()?;
        }
        Ok(RawHeader {
            version,
            cipher_name,
            cipher_mode,
            hash_spec,
            payload_offset,
            key_bytes,
            mk_digest,
            mk_digest_salt,
            mk_digest_iterations,
            uuid,
            slots,
        })
    }
}

/// cryptsetup's LUKS1 layout for `key_bytes`: keyslot area offsets (sectors,
/// 4 KiB aligned from sector 8) and the default payload offset (1 MiB
/// aligned after the last area; with a detached header the caller uses 0).
pub fn default_layout(key_bytes: u32) -> ([u32; SLOTS], u32) {
    let (offs, end) = keyslot_layout(key_bytes);
    (offs, end.div_ceil(2048) as u32 * 2048)
}

/// The keyslot material offsets cryptsetup gives a `key_bytes` volume key
/// (first area at 4096 bytes, each area 4096-aligned) and the sector
/// where the last area ends.
pub fn keyslot_layout(key_bytes: u32) -> ([u32; SLOTS], u64) {
    let align = 8u64; // 4096 bytes
    let area = af_sectors(key_bytes, 4000).div_ceil(align) * align;
    let mut offs = [0u32; SLOTS];
    let mut pos = align; // first area at 4096 bytes
    for o in &mut offs {
        *o = pos as u32;
        pos += area;
    }
    (offs, pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        let (offs, payload) = default_layout(64);
        let mut slots = [Slot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            key_material_offset: 0,
            stripes: 4000,
        }; 8];
        for (s, o) in slots.iter_mut().zip(offs) {
            s.key_material_offset = o;
        }
        slots[0].active = true;
        slots[0].iterations = 1000;
        Header {
            cipher_name: "aes".into(),
            cipher_mode: "xts-plain64".into(),
            hash: Hash::Sha256,
            payload_offset: payload,
            key_bytes: 64,
            mk_digest: [1; 20],
            mk_digest_salt: [2; 32],
            mk_digest_iterations: 1000,
            uuid: "af2f45c8-78f9-4f15-89e2-08a92a8b6db4".into(),
            slots,
        }
    }

    #[test]
    fn layout_matches_cryptsetup() {
        // cryptsetup 2.6: 512-bit key -> slot 0 at sector 8, payload 4096.
        let (offs, payload) = default_layout(64);
        assert_eq!((offs[0], offs[1], payload), (8, 512, 4096));
        let (offs, payload) = default_layout(32);
        assert_eq!((offs[1], payload), (264, 4096));
    }

    #[test]
    fn round_trip() {
        let h = sample();
        let b = h.to_bytes();
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(Header::parse(&b).unwrap(), h);
    }

    #[test]
    fn overlapping_slots_refused() {
        let mut h = sample();
        h.slots[1].key_material_offset = h.slots[0].key_material_offset + 1;
        assert!(Header::parse(&h.to_bytes()).is_err());
        let mut h = sample();
        h.payload_offset = 100;
        assert!(Header::parse(&h.to_bytes()).is_err());
    }

    #[test]
    fn truncated_never_panics() {
        let b = sample().to_bytes();
        for n in 0..b.len() {
            assert!(Header::parse(&b[..n]).is_err());
        }
    }
}
