//! The LUKS anti-forensic information splitter (hand-written from the LUKS1
//! specification, section "AF-Splitter"): a key of `n` bytes becomes
//! `n * stripes` bytes so that losing any stripe loses the key.
//!
//! ```text
//! d = 0
//! for i in 0..stripes-1:  s[i] = random;  d = H(d ^ s[i])
//! s[last] = d ^ key                         (merge reverses the last step)
//! H = per-digest-block hash: block j -> hash(be32(j) || block)
//! ```

use crypto::Secret;

use crate::error::{invalid, random_error, Result};
use crate::hash::Hash;
use crate::ErrorKind;

/// The stripe count cryptsetup uses for every keyslot.
pub const STRIPES: u32 = 4000;

/// Size of the split material in bytes.
pub fn split_len(key_len: usize, stripes: u32) -> usize {
    key_len * stripes as usize
}

/// Splits `key` into `key.len() * stripes` bytes of AF material.
pub fn split(key: &[u8], stripes: u32, hash: Hash) -> Result<Secret> {
    if stripes == 0 || key.is_empty() {
        return Err(invalid("AF split needs a key and at least one stripe"));
    }
    let n = key.len();
    let mut out = Secret::zeroed(split_len(n, stripes));
    getrandom::fill(&mut out[..n * (stripes as usize - 1)]).map_err(|e| {
        random_error(
            ErrorKind::InvalidArgument,
            "No randomness for the AF splitter",
            e,
        )
    })?;
    let mut d = Secret::zeroed(n);
    for i in 0..stripes as usize - 1 {
        xor_into(&mut d, &out[i * n..(i + 1) * n]);
        diffuse(&mut d, hash);
    }
    let last = &mut out[(stripes as usize - 1) * n..];
    for ((o, a), b) in last.iter_mut().zip(d.iter()).zip(key) {
        *o = a ^ b;
    }
    Ok(out)
}

/// Recovers the key of length `key_len` from AF material (at least
/// `key_len * stripes` bytes; extra padding is ignored).
pub fn merge(material: &[u8], key_len: usize, stripes: u32, hash: Hash) -> Result<Secret> {
    if stripes == 0 || key_len == 0 || material.len() < split_len(key_len, stripes) {
        return Err(invalid(
            "AF material is shorter than key size times stripes",
        ));
    }
    let n = key_len;
    let mut d = Secret::zeroed(n);
    for i in 0..stripes as usize - 1 {
        xor_into(&mut d, &material[i * n..(i + 1) * n]);
        diffuse(&mut d, hash);
    }
    xor_into(
        &mut d,
        &material[(stripes as usize - 1) * n..stripes as usize * n],
    );
    Ok(d)
}

fn xor_into(d: &mut [u8], s: &[u8]) {
    for (a, b) in d.iter_mut().zip(s) {
        *a ^= b;
    }
}

/// In-place diffusion: each digest-sized block j becomes
/// `hash(be32(j) || block)`, the last partial block truncated.
fn diffuse(buf: &mut [u8], hash: Hash) {
    let ds = hash.digest_len();
    let mut tmp = [0u8; 64];
    for (j, block) in buf.chunks_mut(ds).enumerate() {
        let iv = (j as u32).to_be_bytes();
        let len = block.len();
        hash.digest_into(&[&iv, block], &mut tmp[..len]);
        block.copy_from_slice(&tmp[..len]);
    }
    tmp.fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_merge_round_trip_all_hashes() {
        for hash in [Hash::Sha1, Hash::Sha256, Hash::Sha512, Hash::Ripemd160] {
            for len in [16usize, 32, 33, 64] {
                let key: Vec<u8> = (0..len as u8).collect();
                let m = split(&key, 50, hash).unwrap();
                assert_eq!(m.len(), len * 50);
                assert_eq!(&merge(&m, len, 50, hash).unwrap()[..], &key[..]);
                let mut bad = m.clone();
                bad[3] ^= 1;
                assert_ne!(&merge(&bad, len, 50, hash).unwrap()[..], &key[..]);
            }
        }
    }

    #[test]
    fn single_stripe_is_plain_xor() {
        let key = [7u8; 32];
        let m = split(&key, 1, Hash::Sha256).unwrap();
        assert_eq!(&m[..], &key[..]);
    }

    #[test]
    fn short_material_is_an_error() {
        assert!(merge(&[0u8; 10], 32, 4000, Hash::Sha256).is_err());
    }
}
