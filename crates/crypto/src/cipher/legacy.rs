//! The chain modes of TrueCrypt's legacy volumes, as the kernel runs them
//! for dm-crypt: LRW (`crypto/lrw.c`) over the 16-byte ciphers, and CBC
//! and ECB over the 8-byte ones (CAST5 and Triple DES, RustCrypto's
//! `cast5` and `des`).
//!
//! Hand-written: RustCrypto has no LRW crate, and its `cbc` crate works
//! on whole messages with one IV, not on runs of sectors with one IV
//! each. LRW (IEEE 1619 draft, Liskov-Rivest-Wagner) is, per 16-byte
//! block with index `I` (the IV of the sector's first block, then +1 per
//! block): `C = E_K1(P ⊕ T) ⊕ T` with `T = K2 ⊗ I` in GF(2^128), bytes
//! big-endian and x^0 the lowest bit of the last byte (the kernel's
//! `gf128mul_bbe`), reduced by x^128 + x^7 + x^2 + x + 1. As in the
//! kernel, `T` is computed once per sector and then stepped:
//! `K2 ⊗ (I+1) = K2 ⊗ I ⊕ K2 ⊗ (2^(k+1) − 1)` where `k` counts the
//! trailing ones of `I`, from a table of 128 products made at keying.
//!
//! ```text
//!   sector IV (benbi: big-endian block index from 1)
//!      │  T0 = K2 ⊗ I            (xor of K2·x^i for the bits of I)
//!      ▼  T(i+1) = T(i) ⊕ inc[trailing_ones(I+i)]
//!   block ⊕ T ─► E_K1 / D_K1 (batched through Prim) ─► ⊕ T
//! ```

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::Block;

use super::rust::Prim;
use super::{Dir, SectorCipher};
use crate::spec::BlockCipher;

/// Blocks converted per call into the block cipher.
const BATCH: usize = 64;

/// Multiplies by x in the kernel's `bbe` representation of GF(2^128).
fn mul_x(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

/// LRW over a 16-byte block cipher; key = data key || 16-byte tweak key.
pub(crate) struct Lrw {
    data: Prim,
    /// `K2 ⊗ x^i`.
    pow: Box<[u128; 128]>,
    /// `K2 ⊗ (2^(i+1) − 1)`: the step from index `I` to `I+1` when `I`
    /// ends in `i` one bits.
    inc: Box<[u128; 128]>,
}

impl Lrw {
    /// `cipher` in LRW; `None` unless the key is a valid key of `cipher`
    /// followed by 16 bytes.
    pub(crate) fn new(cipher: BlockCipher, key: &[u8], portable: bool) -> Option<Self> {
        let split = key.len().checked_sub(16)?;
        let (k1, k2) = key.split_at(split);
        let data = Prim::with(cipher, k1, portable)?;
        let mut t = [0u8; 16];
        t.copy_from_slice(k2);
        let k2 = u128::from_be_bytes(t);
        let mut pow = Box::new([0u128; 128]);
        let mut inc = Box::new([0u128; 128]);
        let (mut p, mut acc) = (k2, 0u128);
        for i in 0..128 {
            pow[i] = p;
            acc ^= p;
            inc[i] = acc;
            p = mul_x(p);
        }
        Some(Self { data, pow, inc })
    }

    /// `K2 ⊗ i`.
    fn times(&self, i: u128) -> u128 {
        let mut r = 0;
        let mut bits = i;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            r ^= self.pow[b];
            bits &= bits - 1;
        }
        r
    }
}

impl SectorCipher for Lrw {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        for (sector, iv) in buf.chunks_exact_mut(unit).zip(ivs.iter()) {
            let mut index = u128::from_be_bytes(*iv);
            let mut t = self.times(index);
            let (blocks, _) = Block::slice_as_chunks_mut(sector);
            let mut tw = [0u128; BATCH];
            for chunk in blocks.chunks_mut(BATCH) {
                for (b, slot) in chunk.iter_mut().zip(tw.iter_mut()) {
                    *slot = t;
                    xor_block(b, t);
                    // All ones wraps to zero: the kernel steps by
                    // inc[127] there too, giving K2 ⊗ 0.
                    let k = (index.trailing_ones() as usize).min(127);
                    t ^= self.inc[k];
                    index = index.wrapping_add(1);
                }
                match dir {
                    Dir::Encrypt => self.data.encrypt_blocks(chunk),
                    Dir::Decrypt => self.data.decrypt_blocks(chunk),
                }
                for (b, slot) in chunk.iter_mut().zip(tw.iter()) {
                    xor_block(b, *slot);
                }
            }
        }
    }

    fn name(&self) -> &'static str {
        "lrw (hand-written, kernel lrw.c's tweak stepping)"
    }
}

fn xor_block(b: &mut Block, t: u128) {
    for (x, y) in b.iter_mut().zip(t.to_be_bytes()) {
        *x ^= y;
    }
}

/// An 8-byte block cipher with its key.
pub(crate) enum Prim64 {
    Cast5(Box<cast5::Cast5>),
    Des3(Box<des::TdesEde3>),
}

impl Prim64 {
    /// `cipher` keyed with `key`: CAST5 takes 5 to 16 bytes, Triple DES
    /// 24 (three independent keys); `None` otherwise.
    pub(crate) fn new(cipher: BlockCipher, key: &[u8]) -> Option<Self> {
        match cipher {
            BlockCipher::Cast5 if (5..=16).contains(&key.len()) => Some(Self::Cast5(Box::new(
                cast5::Cast5::new_from_slice(key).ok()?,
            ))),
            BlockCipher::Des3Ede if key.len() == 24 => Some(Self::Des3(Box::new(
                des::TdesEde3::new_from_slice(key).ok()?,
            ))),
            _ => None,
        }
    }

    fn crypt(&self, dir: Dir, b: &mut [u8]) {
        macro_rules! one {
            ($c:expr, $t:ty) => {{
                if let Ok(blk) = aes::cipher::Block::<$t>::try_from(&b[..]) {
                    let mut blk = blk;
                    match dir {
                        Dir::Encrypt => $c.encrypt_block(&mut blk),
                        Dir::Decrypt => $c.decrypt_block(&mut blk),
                    }
                    b.copy_from_slice(&blk);
                }
            }};
        }
        match self {
            Self::Cast5(c) => one!(c, cast5::Cast5),
            Self::Des3(c) => one!(c, des::TdesEde3),
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Cast5(_) => "cast5",
            Self::Des3(_) => "des3_ede",
        }
    }
}

/// CBC over an 8-byte block cipher; each sector's IV is the first 8
/// bytes of its 16-byte IV (the kernel's 8-byte `plain`/`plain64`/`tcw`
/// IVs are exactly those bytes).
pub(crate) struct Cbc64(pub(crate) Prim64);

impl SectorCipher for Cbc64 {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        for (s, iv) in buf.chunks_exact_mut(unit).zip(ivs.iter()) {
            let mut prev = [0u8; 8];
            prev.copy_from_slice(&iv[..8]);
            for b in s.chunks_exact_mut(8) {
                match dir {
                    Dir::Encrypt => {
                        for (x, p) in b.iter_mut().zip(prev) {
                            *x ^= p;
                        }
                        self.0.crypt(dir, b);
                        prev.copy_from_slice(b);
                    }
                    Dir::Decrypt => {
                        let mut c = [0u8; 8];
                        c.copy_from_slice(b);
                        self.0.crypt(dir, b);
                        for (x, p) in b.iter_mut().zip(prev) {
                            *x ^= p;
                        }
                        prev = c;
                    }
                }
            }
        }
    }

    fn name(&self) -> &'static str {
        match self.0.label() {
            "cast5" => "cast5-cbc (RustCrypto cast5)",
            _ => "des3_ede-cbc (RustCrypto des)",
        }
    }
}

/// ECB over an 8-byte block cipher (IVs are ignored).
pub(crate) struct Ecb64(pub(crate) Prim64);

impl SectorCipher for Ecb64 {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], _unit: usize, _ivs: &[[u8; 16]]) {
        for b in buf.chunks_exact_mut(8) {
            self.0.crypt(dir, b);
        }
    }

    fn name(&self) -> &'static str {
        match self.0.label() {
            "cast5" => "cast5-ecb (RustCrypto cast5)",
            _ => "des3_ede-ecb (RustCrypto des)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `K2 ⊗ i` the slow way: shift-and-add over the bits of `i`.
    fn slow_times(k2: u128, i: u128) -> u128 {
        let (mut r, mut a) = (0u128, k2);
        for bit in 0..128 {
            if (i >> bit) & 1 != 0 {
                r ^= a;
            }
            a = mul_x(a);
        }
        r
    }

    #[test]
    fn stepped_tweaks_equal_direct_products() {
        let mut key = [0u8; 48];
        for (i, b) in key.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        let l = Lrw::new(BlockCipher::Aes, &key, false).expect("key");
        let k2 = u128::from_be_bytes(key[32..].try_into().expect("16 bytes"));
        for start in [
            0u128,
            1,
            31,
            32 * 7 + 1,
            u128::from(u64::MAX),
            u128::MAX - 3,
        ] {
            let mut t = l.times(start);
            let mut i = start;
            for _ in 0..40 {
                assert_eq!(t, slow_times(k2, i), "index {i:#x}");
                t ^= l.inc[(i.trailing_ones() as usize).min(127)];
                i = i.wrapping_add(1);
            }
        }
    }

    /// LRW-32-AES, vector 1 of IEEE P1619 draft 4 (the kernel's
    /// `aes_lrw_tv_template` in testmgr.h starts with it): tweak index 1.
    #[test]
    fn lrw_aes_known_answer() {
        let key: Vec<u8> = [
            0x45, 0x62, 0xac, 0x25, 0xf8, 0x28, 0x17, 0x6d, 0x4c, 0x26, 0x84, 0x14, 0xb5, 0x68,
            0x01, 0x85, 0x25, 0x8e, 0x2a, 0x05, 0xe7, 0x3e, 0x9d, 0x03, 0xee, 0x5a, 0x83, 0x0c,
            0xcc, 0x09, 0x4c, 0x87,
        ]
        .to_vec();
        let l = Lrw::new(BlockCipher::Aes, &key, false).expect("key");
        let mut iv = [0u8; 16];
        iv[15] = 1;
        let mut b = *b"0123456789ABCDEF";
        l.crypt(Dir::Encrypt, &mut b, &iv);
        assert_eq!(
            b,
            [
                0xf1, 0xb2, 0x73, 0xcd, 0x65, 0xa3, 0xdf, 0x5f, 0xe9, 0x5d, 0x48, 0x92, 0x54, 0x63,
                0x4e, 0xb8
            ]
        );
        l.crypt(Dir::Decrypt, &mut b, &iv);
        assert_eq!(&b, b"0123456789ABCDEF");
    }

    #[test]
    fn lrw_and_cbc64_round_trip() {
        let key: Vec<u8> = (0..48u8).collect();
        let l = Lrw::new(BlockCipher::Serpent, &key, false).expect("key");
        let orig: Vec<u8> = (0..2048u32).map(|i| (i * 13) as u8).collect();
        let ivs = [[0u8; 16], [1u8; 16], [2u8; 16], [3u8; 16]];
        let mut b = orig.clone();
        l.crypt_run(Dir::Encrypt, &mut b, 512, &ivs);
        assert_ne!(b, orig);
        l.crypt_run(Dir::Decrypt, &mut b, 512, &ivs);
        assert_eq!(b, orig);
        for (c, k) in [(BlockCipher::Cast5, 16usize), (BlockCipher::Des3Ede, 24)] {
            let m = Cbc64(Prim64::new(c, &key[..k]).expect("key"));
            let mut b = orig.clone();
            m.crypt_run(Dir::Encrypt, &mut b, 512, &ivs);
            assert_ne!(b[..512], b[512..1024], "{c:?}: IVs differ per sector");
            m.crypt_run(Dir::Decrypt, &mut b, 512, &ivs);
            assert_eq!(b, orig, "{c:?}");
        }
        assert!(Prim64::new(BlockCipher::Cast5, &key[..4]).is_none());
        assert!(Prim64::new(BlockCipher::Des3Ede, &key[..16]).is_none());
        assert!(Lrw::new(BlockCipher::Aes, &key[..20], false).is_none());
    }
}
