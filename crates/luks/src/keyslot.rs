//! Keyslot material: derive the passphrase key, encrypt/decrypt the AF
//! material with the keyslot cipher in 512-byte sectors (IV sector 0 at the
//! start of the area, as cryptsetup's `LUKS_encrypt_to_storage`), split and
//! merge it, and check the volume key digest in constant time.

use crypto::Secret;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::af;
use crate::error::Result;
use crate::hash::Hash;
use crate::kdf::Kdf;

/// Sector cipher for a keyslot area.
fn area_cipher(cipher: &str, key: &[u8]) -> Result<crypto::SectorCrypt> {
    let cfg = crypto::CryptConfig {
        cipher: cipher.to_string(),
        key: Zeroizing::new(key.to_vec()),
        iv_offset: 0,
        sector_size: 512,
        iv_large_sectors: false,
    };
    Ok(crypto::SectorCrypt::new(&cfg)?)
}

/// Bytes of AF material on disk (rounded up to whole sectors).
pub fn material_len(key_size: usize, stripes: u32) -> usize {
    af::split_len(key_size, stripes).div_ceil(512) * 512
}

/// How one keyslot turns a passphrase into its area key and material.
pub struct SlotParams<'a> {
    /// Passphrase KDF.
    pub kdf: Kdf,
    /// KDF salt.
    pub salt: &'a [u8],
    /// Area cipher (dm-crypt form).
    pub cipher: &'a str,
    /// Area cipher key size (the KDF output length).
    pub area_key_size: usize,
    /// Volume key size.
    pub key_size: usize,
    /// AF stripes.
    pub stripes: u32,
    /// AF hash.
    pub af_hash: Hash,
}

/// Recovers the candidate volume key from encrypted `material`.
pub fn open_material(passphrase: &[u8], p: &SlotParams<'_>, material: &mut [u8]) -> Result<Secret> {
    let mut pk = Secret::zeroed(p.area_key_size);
    p.kdf.derive(passphrase, p.salt, &mut pk)?;
    area_cipher(p.cipher, &pk)?.decrypt(0, material);
    af::merge(material, p.key_size, p.stripes, p.af_hash)
}

/// Builds encrypted AF material for `volume_key` (whole sectors).
pub fn seal_material(passphrase: &[u8], p: &SlotParams<'_>, volume_key: &[u8]) -> Result<Secret> {
    let mut pk = Secret::zeroed(p.area_key_size);
    p.kdf.derive(passphrase, p.salt, &mut pk)?;
    let split = af::split(volume_key, p.stripes, p.af_hash)?;
    let mut material = Secret::zeroed(material_len(volume_key.len(), p.stripes));
    material[..split.len()].copy_from_slice(&split);
    area_cipher(p.cipher, &pk)?.encrypt(0, &mut material);
    Ok(material)
}

/// PBKDF2 digest of a volume key.
pub fn digest(hash: Hash, volume_key: &[u8], salt: &[u8], iterations: u32, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    hash.pbkdf2(volume_key, salt, iterations, &mut out);
    out
}

/// Constant-time digest check. A digest shorter than
/// [`MIN_DIGEST_LEN`](crate::luks2::json::MIN_DIGEST_LEN) never matches
/// (headers with one are refused at load; this keeps it so for any caller).
pub fn digest_matches(
    hash: Hash,
    volume_key: &[u8],
    salt: &[u8],
    iterations: u32,
    expected: &[u8],
) -> bool {
    if expected.len() < crate::luks2::json::MIN_DIGEST_LEN {
        return false;
    }
    let got = digest(hash, volume_key, salt, iterations, expected.len());
    bool::from(got.ct_eq(expected))
}

/// Random bytes (salts, volume keys).
pub fn random(len: usize) -> Result<Zeroizing<Vec<u8>>> {
    let mut v = Zeroizing::new(vec![0u8; len]);
    getrandom::fill(&mut v).map_err(|e| {
        crate::error::random_error(crate::ErrorKind::Io, "No randomness available", e)
    })?;
    Ok(v)
}

/// A random RFC 4122 version 4 UUID, lowercase.
pub fn random_uuid() -> Result<String> {
    let mut b = [0u8; 16];
    b.copy_from_slice(&random(16)?);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}
