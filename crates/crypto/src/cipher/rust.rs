//! The pure-Rust provider: hand-written XTS, CBC and ECB over block
//! primitives fed in batches (`encrypt_blocks`): RustCrypto's `aes`, and
//! this crate's own many-blocks-per-call Serpent (`serpent.rs`), Twofish
//! (`twofish.rs`) and Camellia (`camellia.rs`) for the other ciphers
//! dm-crypt offers; also the fallback of the OpenSSL provider for keys
//! OpenSSL refuses.

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256, Block};

use super::camellia::Camellia;
use super::serpent::Serpent;
use super::twofish::Twofish;
use super::{
    Dir, SectorCipher, CAMELLIA_XTS_NAME, KUZNYECHIK_XTS_NAME, RUST_XTS_NAME,
    SERPENT_AVX2_XTS_NAME, SERPENT_XTS_NAME, TWOFISH_XTS_NAME,
};
use crate::spec::BlockCipher;

/// A 16-byte block cipher with its key, chosen at runtime.
pub(crate) enum Prim {
    A128(Aes128),
    A192(Aes192),
    A256(Aes256),
    Serpent(Box<Serpent>),
    Twofish(Box<Twofish>),
    Camellia(Box<Camellia>),
    /// RustCrypto's `kuznyechik` (table-driven, one block per call inside
    /// its batch loop): VeraCrypt's cipher, fast enough for its volumes.
    Kuznyechik(Box<kuznyechik::Kuznyechik>),
}

/// One call on whichever AES `$p` holds, else `$other` with the others.
macro_rules! each {
    ($p:expr, $c:ident => $e:expr, $o:ident => $other:expr) => {
        match $p {
            Prim::A128($c) => $e,
            Prim::A192($c) => $e,
            Prim::A256($c) => $e,
            Prim::Kuznyechik($c) => $e,
            Prim::Serpent($o) => $other,
            Prim::Twofish($o) => $other,
            Prim::Camellia($o) => $other,
        }
    };
}

impl Prim {
    /// AES; `None` unless the key is 16, 24 or 32 bytes.
    pub(crate) fn aes(key: &[u8]) -> Option<Self> {
        Self::new(BlockCipher::Aes, key)
    }

    /// `cipher` keyed with `key`; `None` for cipher_null or unless the key
    /// is 16, 24 or 32 bytes.
    pub(crate) fn new(cipher: BlockCipher, key: &[u8]) -> Option<Self> {
        Self::with(cipher, key, false)
    }

    /// Like [`Prim::new`]; `portable` keeps Serpent on its baseline kernel
    /// even where the CPU has AVX2.
    pub(crate) fn with(cipher: BlockCipher, key: &[u8], portable: bool) -> Option<Self> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return None;
        }
        Some(match (cipher, key.len()) {
            (BlockCipher::Aes, 16) => Self::A128(Aes128::new_from_slice(key).ok()?),
            (BlockCipher::Aes, 24) => Self::A192(Aes192::new_from_slice(key).ok()?),
            (BlockCipher::Aes, _) => Self::A256(Aes256::new_from_slice(key).ok()?),
            (BlockCipher::Serpent, _) => Self::Serpent(Box::new(Serpent::new(key, portable)?)),
            (BlockCipher::Twofish, _) => Self::Twofish(Box::new(Twofish::new(key)?)),
            (BlockCipher::Camellia, _) => Self::Camellia(Box::new(Camellia::new(key)?)),
            (BlockCipher::Kuznyechik, 32) => {
                Self::Kuznyechik(Box::new(kuznyechik::Kuznyechik::new_from_slice(key).ok()?))
            }
            (BlockCipher::Kuznyechik, _) => return None,
            (BlockCipher::Null | BlockCipher::Cast5 | BlockCipher::Des3Ede, _) => return None,
        })
    }

    /// Which cipher this is.
    pub(crate) fn kind(&self) -> BlockCipher {
        match self {
            Self::A128(_) | Self::A192(_) | Self::A256(_) => BlockCipher::Aes,
            Self::Serpent(_) => BlockCipher::Serpent,
            Self::Twofish(_) => BlockCipher::Twofish,
            Self::Camellia(_) => BlockCipher::Camellia,
            Self::Kuznyechik(_) => BlockCipher::Kuznyechik,
        }
    }

    /// Whether Serpent runs its AVX2 kernel.
    fn wide(&self) -> bool {
        matches!(self, Self::Serpent(s) if s.wide())
    }

    pub(crate) fn encrypt_blocks(&self, b: &mut [Block]) {
        each!(self, c => c.encrypt_blocks(b),
            o => o.encrypt_blocks(Block::cast_slice_to_core_mut(b)))
    }

    pub(crate) fn decrypt_blocks(&self, b: &mut [Block]) {
        each!(self, c => c.decrypt_blocks(b),
            o => o.decrypt_blocks(Block::cast_slice_to_core_mut(b)))
    }

    /// Encrypts 16-byte blocks in one batch (a single-block call into the
    /// `aes` crate costs about as much as dozens of batched blocks).
    pub(crate) fn encrypt_ivs(&self, ivs: &mut [[u8; 16]]) {
        let mut tmp = [Block::default(); 4 * BATCH];
        for chunk in ivs.chunks_mut(4 * BATCH) {
            let t = &mut tmp[..chunk.len()];
            for (b, iv) in t.iter_mut().zip(chunk.iter()) {
                b.copy_from_slice(iv);
            }
            self.encrypt_blocks(t);
            for (b, iv) in t.iter().zip(chunk.iter_mut()) {
                iv.copy_from_slice(b);
            }
        }
    }
}

fn blocks(buf: &mut [u8]) -> &mut [Block] {
    let (b, rest) = Block::slice_as_chunks_mut(buf);
    debug_assert!(rest.is_empty(), "sector not a multiple of 16 bytes");
    b
}

#[inline(always)]
fn load(b: &Block) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(b);
    u128::from_le_bytes(a)
}

#[inline(always)]
fn store(b: &mut Block, v: u128) {
    b.copy_from_slice(&v.to_le_bytes());
}

/// Multiplies an XTS tweak by alpha (IEEE 1619 little-endian convention).
#[inline(always)]
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

/// Blocks per batch handed to `encrypt_blocks` (the VAES-512 backend's
/// parallel width).
const BATCH: usize = 64;

/// Hand-made XTS over a 16-byte block cipher.
pub(crate) struct XtsRust {
    data: Prim,
    tweak: Prim,
}

impl XtsRust {
    /// AES-XTS; `key` = data key || tweak key (32, 48 or 64 bytes).
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        Self::with(BlockCipher::Aes, key, false)
    }

    /// XTS over `cipher`; `key` = data key || tweak key (32, 48 or 64
    /// bytes); `portable` as for [`Prim::with`].
    pub(crate) fn with(cipher: BlockCipher, key: &[u8], portable: bool) -> Option<Self> {
        if key.len() % 2 != 0 {
            return None;
        }
        let (k1, k2) = key.split_at(key.len() / 2);
        Some(Self {
            data: Prim::with(cipher, k1, portable)?,
            tweak: Prim::with(cipher, k2, portable)?,
        })
    }
}

/// Fills `out` with the tweaks of consecutive blocks starting at `t0`.
/// Eight independent chains (T[i+8] = T[i] * alpha^8) keep the tweak
/// computation off the block cipher's critical path.
#[inline(always)]
fn fill_tweaks(t0: u128, out: &mut [u128]) {
    if out.len() % 8 != 0 {
        let mut t = t0;
        for tw in out.iter_mut() {
            *tw = t;
            t = mul_alpha(t);
        }
        return;
    }
    let mut next = [0u128; 8];
    next[0] = t0;
    for i in 1..8 {
        next[i] = mul_alpha(next[i - 1]);
    }
    for group in out.chunks_exact_mut(8) {
        for (tw, t) in group.iter_mut().zip(next.iter_mut()) {
            *tw = *t;
            *t = mul_alpha8(*t);
        }
    }
}

/// `x * 0x87` carry-less, for the 8 bits shifted out by [`mul_alpha8`].
const REDUCE8: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut x = 0;
    while x < 256 {
        let mut r = 0u16;
        let mut bit = 0;
        while bit < 8 {
            if x & (1 << bit) != 0 {
                r ^= 0x87 << bit;
            }
            bit += 1;
        }
        t[x] = r;
        x += 1;
    }
    t
};

/// Multiplies an XTS tweak by alpha^8: shift by a byte and fold the byte
/// shifted out back in with x^128 = x^7 + x^2 + x + 1.
#[inline(always)]
fn mul_alpha8(t: u128) -> u128 {
    (t << 8) ^ u128::from(REDUCE8[(t >> 120) as usize])
}

/// Blocks handed to one `encrypt_blocks` call by the Rust XTS (4 KiB):
/// each call into `aes` has a fixed cost, so whole sectors, several at a
/// time, go through in one call.
const XTS_GROUP: usize = 256;

impl SectorCipher for XtsRust {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        let bps = unit / 16;
        if bps == 0 {
            return;
        }
        if bps > XTS_GROUP {
            // Never for dm-crypt sectors (at most 256 blocks); keeps the
            // arrays below bounded for any caller.
            for (s, iv) in buf.chunks_exact_mut(unit).zip(ivs.iter()) {
                for (k, part) in s.chunks_mut(XTS_GROUP * 16).enumerate() {
                    let mut t = [*iv];
                    self.tweak.encrypt_ivs(&mut t);
                    let mut t0 = u128::from_le_bytes(t[0]);
                    for _ in 0..k * XTS_GROUP {
                        t0 = mul_alpha(t0);
                    }
                    self.blocks_with_tweaks(dir, part, &[t0.to_le_bytes()], part.len() / 16);
                }
            }
            return;
        }
        let per_group = XTS_GROUP / bps;
        for (sectors, ivs) in buf.chunks_mut(unit * per_group).zip(ivs.chunks(per_group)) {
            self.blocks_with_tweaks(dir, sectors, ivs, bps);
        }
    }

    fn name(&self) -> &'static str {
        match self.data.kind() {
            BlockCipher::Serpent if self.data.wide() => SERPENT_AVX2_XTS_NAME,
            BlockCipher::Serpent => SERPENT_XTS_NAME,
            BlockCipher::Twofish => TWOFISH_XTS_NAME,
            BlockCipher::Camellia => CAMELLIA_XTS_NAME,
            BlockCipher::Kuznyechik => KUZNYECHIK_XTS_NAME,
            _ => RUST_XTS_NAME,
        }
    }
}

impl XtsRust {
    /// Converts `buf` (`ivs.len()` sectors of `bps` blocks, at most
    /// XTS_GROUP blocks in all) with one tweak-key call and one data-key call.
    fn blocks_with_tweaks(&self, dir: Dir, buf: &mut [u8], ivs: &[[u8; 16]], bps: usize) {
        // One array: the sector IVs go first and are encrypted in one call,
        // then each sector's tweaks are expanded in place from the last
        // sector backwards (sector s writes [s*bps, (s+1)*bps), which never
        // covers a first tweak of a sector before s that is still unread).
        let mut tw = [Block::default(); XTS_GROUP];
        let k = ivs.len();
        for (t, iv) in tw.iter_mut().zip(ivs.iter()) {
            t.copy_from_slice(iv);
        }
        self.tweak.encrypt_blocks(&mut tw[..k]);
        let mut run = [0u128; 256];
        for s in (0..k).rev() {
            let out = &mut run[..bps.min(256)];
            fill_tweaks(load(&tw[s]), out);
            for (t, v) in tw[s * bps..(s + 1) * bps].iter_mut().zip(out.iter()) {
                store(t, *v);
            }
        }
        let bl = blocks(buf);
        let n = bl.len();
        for (b, t) in bl.iter_mut().zip(tw[..n].iter()) {
            store(b, load(b) ^ load(t));
        }
        match dir {
            Dir::Encrypt => self.data.encrypt_blocks(bl),
            Dir::Decrypt => self.data.decrypt_blocks(bl),
        }
        for (b, t) in bl.iter_mut().zip(tw[..n].iter()) {
            store(b, load(b) ^ load(t));
        }
    }
}

/// CBC over a 16-byte block cipher.
pub(crate) struct Cbc(pub(crate) Prim);

impl SectorCipher for Cbc {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        for (s, iv) in buf.chunks_exact_mut(unit).zip(ivs.iter()) {
            let mut prev = u128::from_le_bytes(*iv);
            let bl = blocks(s);
            match dir {
                Dir::Encrypt => {
                    // Serial by nature: one block at a time.
                    for b in bl.iter_mut() {
                        store(b, load(b) ^ prev);
                        self.0.encrypt_blocks(std::slice::from_mut(b));
                        prev = load(b);
                    }
                }
                Dir::Decrypt => {
                    // Parallel: decrypt a batch, then XOR each block with
                    // the ciphertext block before it.
                    let mut saved = [0u128; BATCH];
                    for chunk in bl.chunks_mut(BATCH) {
                        for (sv, b) in saved.iter_mut().zip(chunk.iter()) {
                            *sv = load(b);
                        }
                        self.0.decrypt_blocks(chunk);
                        for (k, b) in chunk.iter_mut().enumerate() {
                            let x = if k == 0 { prev } else { saved[k - 1] };
                            store(b, load(b) ^ x);
                        }
                        prev = saved[chunk.len() - 1];
                    }
                }
            }
        }
    }

    fn name(&self) -> &'static str {
        match self.0.kind() {
            BlockCipher::Serpent if self.0.wide() => "serpent-avx2-cbc",
            BlockCipher::Serpent => "serpent-cbc",
            BlockCipher::Twofish => "twofish-cbc",
            BlockCipher::Camellia => "camellia-cbc",
            BlockCipher::Kuznyechik => "kuznyechik-cbc",
            _ => "rust-aes-cbc",
        }
    }
}

/// ECB over a 16-byte block cipher (IVs are ignored).
pub(crate) struct Ecb(pub(crate) Prim);

impl SectorCipher for Ecb {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], _unit: usize, _ivs: &[[u8; 16]]) {
        match dir {
            Dir::Encrypt => self.0.encrypt_blocks(blocks(buf)),
            Dir::Decrypt => self.0.decrypt_blocks(blocks(buf)),
        }
    }

    fn name(&self) -> &'static str {
        match self.0.kind() {
            BlockCipher::Serpent if self.0.wide() => "serpent-avx2-ecb",
            BlockCipher::Serpent => "serpent-ecb",
            BlockCipher::Twofish => "twofish-ecb",
            BlockCipher::Camellia => "camellia-ecb",
            BlockCipher::Kuznyechik => "kuznyechik-ecb",
            _ => "rust-aes-ecb",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_multiplication_wraps_with_0x87() {
        assert_eq!(mul_alpha(1), 2);
        assert_eq!(mul_alpha(1u128 << 127), 0x87);
        let mut t = 0x8123_4567_89ab_cdef_0fed_cba9_8765_4321u128;
        for _ in 0..100 {
            let mut slow = t;
            for _ in 0..8 {
                slow = mul_alpha(slow);
            }
            assert_eq!(mul_alpha8(t), slow);
            t = slow ^ (t >> 3);
        }
    }
}
