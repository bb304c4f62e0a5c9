//! dm-crypt's `tcw` IV mode: TrueCrypt's legacy CBC volumes (before 4.1),
//! hand-written from `drivers/md/dm-crypt.c` (`crypt_iv_tcw_*`).
//!
//! The last `iv_size + 16` bytes of the key are not the cipher's: an IV
//! seed (one cipher block) and 16 whitening bytes. For sector `s`
//! (`iv_offset` included, as a little-endian u64 `S`):
//!
//! ```text
//!   IV        = seed[0..8] ⊕ S  ‖  seed[8..16] ⊕ S      (16-byte blocks)
//!   w         = whitening[0..8] ⊕ S  ‖  whitening[8..16] ⊕ S
//!   w[4i..4i+4] = le32(crc32_le(0xffffffff, w[4i..4i+4]))   i = 0..3
//!   white     = (w[0..4] ⊕ w[12..16]) ‖ (w[4..8] ⊕ w[8..12])
//!   ciphertext sector = CBC(plaintext) ⊕ white repeated over 512 bytes
//! ```
//!
//! `crc32_le` is the kernel's: the CRC-32 register without the final
//! inversion (so the complement of the usual CRC-32, from `crc32fast`).

use zeroize::Zeroizing;

use crate::spec::TCW_WHITENING_SIZE;

/// The IV seed and whitening of one `tcw` key.
pub(crate) struct Tcw {
    seed: Zeroizing<[u8; 16]>,
    whitening: Zeroizing<[u8; TCW_WHITENING_SIZE]>,
}

impl Tcw {
    /// From the key's last `iv_size + 16` bytes (`extra`).
    pub(crate) fn new(extra: &[u8], iv_size: usize) -> Self {
        let mut seed = Zeroizing::new([0u8; 16]);
        let mut whitening = Zeroizing::new([0u8; TCW_WHITENING_SIZE]);
        let n = iv_size.min(16).min(extra.len());
        seed[..n].copy_from_slice(&extra[..n]);
        let w = &extra[n..];
        let m = w.len().min(TCW_WHITENING_SIZE);
        whitening[..m].copy_from_slice(&w[..m]);
        Self { seed, whitening }
    }

    /// The IV of sector `s` (an 8-byte IV is the first half).
    pub(crate) fn iv(&self, s: u64) -> [u8; 16] {
        let le = s.to_le_bytes();
        let mut iv = *self.seed;
        for (i, b) in iv.iter_mut().enumerate() {
            *b ^= le[i % 8];
        }
        iv
    }

    /// XORs sector `s`'s whitening over `sector` (512 bytes): applies it
    /// after encryption, removes it before decryption.
    pub(crate) fn whiten(&self, s: u64, sector: &mut [u8]) {
        let le = s.to_le_bytes();
        let mut w = Zeroizing::new([0u8; TCW_WHITENING_SIZE]);
        for (i, b) in w.iter_mut().enumerate() {
            *b = self.whitening[i] ^ le[i % 8];
        }
        for part in w.chunks_exact_mut(4) {
            let crc = !crc32fast::hash(part);
            part.copy_from_slice(&crc.to_le_bytes());
        }
        let mut white = [0u8; 8];
        for i in 0..4 {
            white[i] = w[i] ^ w[12 + i];
            white[4 + i] = w[4 + i] ^ w[8 + i];
        }
        for chunk in sector.chunks_exact_mut(8) {
            for (x, y) in chunk.iter_mut().zip(white) {
                *x ^= y;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_crc_is_the_uninverted_register() {
        // crc32_le(~0, "123456789") without the final XOR: the standard
        // check value 0xCBF43926, complemented.
        assert_eq!(!crc32fast::hash(b"123456789"), 0x340b_c6d9);
    }

    #[test]
    fn iv_is_the_seed_xor_the_sector_in_each_half() {
        let extra: Vec<u8> = (1..=32u8).collect();
        let t = Tcw::new(&extra, 16);
        let iv = t.iv(0x0102);
        assert_eq!(iv[0], 1 ^ 2);
        assert_eq!(iv[1], 2 ^ 1);
        assert_eq!(iv[8], 9 ^ 2);
        assert_eq!(iv[9], 10 ^ 1);
        assert_eq!(iv[15], 16);
        let mut a = vec![0u8; 512];
        t.whiten(5, &mut a);
        assert_eq!(a[..8], a[8..16], "one 8-byte value repeated");
        let mut b = a.clone();
        t.whiten(5, &mut b);
        assert_eq!(b, vec![0u8; 512], "whitening is its own inverse");
        let mut c = vec![0u8; 512];
        t.whiten(6, &mut c);
        assert_ne!(a, c, "whitening depends on the sector");
    }
}
