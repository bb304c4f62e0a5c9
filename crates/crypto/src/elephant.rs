//! BitLocker's Elephant diffuser as dm-crypt's `elephant` IV mode runs it
//! (`crypt_iv_elephant*` in Linux `drivers/md/dm-crypt.c`, and Niels
//! Ferguson's "AES-CBC + Elephant diffuser" paper that it follows).
//!
//! Hand-written: no crate implements it. Per sector, with `s` the sector's
//! byte offset (`iv_sector * sector_size`):
//!
//! - the sector key `Ks` is two AES-ECB blocks under the Elephant key (the
//!   second half of the volume key): `E(le128(s))` and the same block with
//!   its last byte set to 0x80;
//! - writing: the plaintext is XORed with `Ks` (repeated every 32 bytes),
//!   then diffuser A runs 5 rounds and diffuser B 3 rounds backwards over
//!   the sector's little-endian 32-bit words, then AES-CBC with the `eboiv`
//!   IV (keyed with the first half of the key) encrypts it;
//! - reading undoes it: CBC, diffuser B and A forwards, the XOR.
//!
//! The diffusers mix word `i` with two others at fixed distances (A: `i-2`
//! and `i-5`, B: `i+2` and `i+5`, modulo the word count), rotating the
//! second by an amount that depends on `i mod 4`.

use crate::cipher::Prim;

/// A's rotation of its second operand, by word index mod 4.
const ROT_A: [u32; 4] = [9, 0, 13, 0];
/// B's rotation of its second operand, by word index mod 4.
const ROT_B: [u32; 4] = [0, 10, 0, 25];

/// Loads the sector's little-endian words.
fn words(sector: &[u8]) -> Vec<u32> {
    sector
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

fn store(words: &[u32], sector: &mut [u8]) {
    for (w, b) in words.iter().zip(sector.chunks_exact_mut(4)) {
        b.copy_from_slice(&w.to_le_bytes());
    }
}

/// Diffuser A's decryption direction (5 forward passes).
fn a_decrypt(d: &mut [u32]) {
    let n = d.len();
    for _ in 0..5 {
        for i in 0..n {
            let mix = d[(i + n - 2) % n] ^ d[(i + n - 5) % n].rotate_left(ROT_A[i % 4]);
            d[i] = d[i].wrapping_add(mix);
        }
    }
}

/// Diffuser A's encryption direction: [`a_decrypt`] undone.
fn a_encrypt(d: &mut [u32]) {
    let n = d.len();
    for _ in 0..5 {
        for i in (0..n).rev() {
            let mix = d[(i + n - 2) % n] ^ d[(i + n - 5) % n].rotate_left(ROT_A[i % 4]);
            d[i] = d[i].wrapping_sub(mix);
        }
    }
}

/// Diffuser B's decryption direction (3 forward passes).
fn b_decrypt(d: &mut [u32]) {
    let n = d.len();
    for _ in 0..3 {
        for i in 0..n {
            let mix = d[(i + 2) % n] ^ d[(i + 5) % n].rotate_left(ROT_B[i % 4]);
            d[i] = d[i].wrapping_add(mix);
        }
    }
}

/// Diffuser B's encryption direction: [`b_decrypt`] undone.
fn b_encrypt(d: &mut [u32]) {
    let n = d.len();
    for _ in 0..3 {
        for i in (0..n).rev() {
            let mix = d[(i + 2) % n] ^ d[(i + 5) % n].rotate_left(ROT_B[i % 4]);
            d[i] = d[i].wrapping_sub(mix);
        }
    }
}

/// The 32-byte sector key for byte offset `offset`.
fn sector_key(key: &Prim, offset: u64) -> zeroize::Zeroizing<[[u8; 16]; 2]> {
    let mut ks = zeroize::Zeroizing::new([[0u8; 16]; 2]);
    ks[0][..8].copy_from_slice(&offset.to_le_bytes());
    ks[1] = ks[0];
    ks[1][15] = 0x80;
    key.encrypt_ivs(&mut ks[..]);
    ks
}

fn xor_key(sector: &mut [u8], ks: &[[u8; 16]; 2]) {
    for chunk in sector.chunks_exact_mut(32) {
        for (i, b) in chunk.iter_mut().enumerate() {
            *b ^= ks[i / 16][i % 16];
        }
    }
}

/// Runs before the chain mode encrypts one sector at byte offset
/// `offset` (`sector.len()` is the sector size, a multiple of 32).
pub(crate) fn before_encrypt(key: &Prim, offset: u64, sector: &mut [u8]) {
    let ks = sector_key(key, offset);
    xor_key(sector, &ks);
    let mut d = zeroize::Zeroizing::new(words(sector));
    a_encrypt(&mut d);
    b_encrypt(&mut d);
    store(&d, sector);
}

/// Runs after the chain mode decrypted one sector at byte offset `offset`.
pub(crate) fn after_decrypt(key: &Prim, offset: u64, sector: &mut [u8]) {
    let mut d = zeroize::Zeroizing::new(words(sector));
    b_decrypt(&mut d);
    a_decrypt(&mut d);
    store(&d, sector);
    let ks = sector_key(key, offset);
    xor_key(sector, &ks);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffusers_invert_each_other() {
        for n in [128usize, 1024] {
            let orig: Vec<u32> = (0..n as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9) ^ 0x5a5a)
                .collect();
            let mut d = orig.clone();
            a_encrypt(&mut d);
            assert_ne!(d, orig);
            b_encrypt(&mut d);
            b_decrypt(&mut d);
            a_decrypt(&mut d);
            assert_eq!(d, orig, "{n} words");
        }
    }

    #[test]
    fn one_changed_byte_spreads_over_the_sector() {
        let key = Prim::aes(&[7u8; 16]).expect("16-byte AES key");
        let mut a = vec![0u8; 512];
        let mut b = a.clone();
        b[100] = 1;
        before_encrypt(&key, 4096, &mut a);
        before_encrypt(&key, 4096, &mut b);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 64, "{same} of 512 bytes unchanged");
        after_decrypt(&key, 4096, &mut a);
        assert_eq!(a, vec![0u8; 512]);
    }
}
