//! The `cipher_null` LUKS1 header cryptsetup 2.6.1's LUKS1 reencryption
//! writes for the plaintext side of an encryption (`LUKS-<uuid>.org`) or
//! a decryption (`LUKS-<uuid>.new`): cipher `cipher_null-ecb`, data
//! offset 0, UUID [`NO_UUID`] and one active keyslot. Its keyslot
//! material is the AF-split key stored as it is (the null cipher), so any
//! passphrase opens it, which is how cryptsetup's tool opens it (with an
//! empty one). ucrypt never opens it: the plaintext side needs no key; it
//! is written so that cryptsetup recognises the files. Hand-written, as
//! `volume::format` refuses `cipher_null` with a key (cryptsetup's fake
//! header has a 256-bit one by default).

use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::luks1::{keyslot_layout, Header, Slot, DIGEST_LEN, SLOTS};
use crate::{af, keyslot};

/// The UUID cryptsetup gives its fake headers and an encryption's files.
pub const NO_UUID: &str = "cafecafe-cafe-cafe-cafe-cafecafeeeee";

/// PBKDF2 iterations of the fake keyslot and digest (the cost protects
/// nothing: the material is not encrypted).
const ITERATIONS: u32 = 1000;

/// Writes the fake header of a `key_bits` volume key to `path` (a new
/// file), its keyslot `slot` active.
pub(super) fn write(path: &Path, key_bits: u32, hash: Hash, slot: u32) -> Result<()> {
    let key_bytes = key_bits / 8;
    let vk = keyslot::random(key_bytes as usize)?;
    let (offs, end) = keyslot_layout(key_bytes);
    let salt = keyslot::random(32)?;
    let mut mk_digest = [0u8; DIGEST_LEN];
    mk_digest.copy_from_slice(&keyslot::digest(hash, &vk, &salt, ITERATIONS, DIGEST_LEN));
    let mut h = Header {
        cipher_name: "cipher_null".into(),
        cipher_mode: "ecb".into(),
        hash,
        payload_offset: 0,
        key_bytes,
        mk_digest,
        mk_digest_salt: [0; 32],
        mk_digest_iterations: ITERATIONS,
        uuid: NO_UUID.into(),
        slots: [Slot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            key_material_offset: 0,
            stripes: 4000,
        }; SLOTS],
    };
    h.mk_digest_salt.copy_from_slice(&salt);
    for (s, o) in h.slots.iter_mut().zip(offs) {
        s.key_material_offset = o;
    }
    let s = &mut h.slots[slot as usize % SLOTS];
    s.active = true;
    s.iterations = ITERATIONS;
    s.salt.copy_from_slice(&keyslot::random(32)?);
    let at = u64::from(s.key_material_offset) as usize * 512;
    let split = af::split(&vk, 4000, hash)?;
    let mut out = vec![0u8; (end * 512) as usize];
    let hdr = h.to_bytes();
    out[..hdr.len()].copy_from_slice(&hdr);
    out[at..at + split.len()].copy_from_slice(&split);
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(&out).and_then(|_| f.sync_all()));
    out.iter_mut().for_each(|b| *b = 0);
    res.map_err(|e| Error::io(format!("Cannot write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_header_parses_as_cipher_null_at_offset_zero() {
        let dir = std::env::temp_dir().join(format!("ucrypt-fake-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        write(&dir, 256, Hash::Sha256, 3).unwrap();
        let bytes = std::fs::read(&dir).unwrap();
        let h = Header::parse(&bytes).unwrap();
        assert_eq!(h.cipher(), "cipher_null-ecb");
        assert_eq!((h.payload_offset, h.key_bytes), (0, 32));
        assert_eq!(h.uuid, NO_UUID);
        let active: Vec<usize> = (0..SLOTS).filter(|&i| h.slots[i].active).collect();
        assert_eq!(active, [3]);
        assert_eq!(bytes.len() as u64, h.metadata_end());
        // A second write never overwrites the file.
        assert!(write(&dir, 256, Hash::Sha256, 0).is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}
