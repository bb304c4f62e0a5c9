//! Chain modes over whole sectors: hand-written XTS, CBC and ECB over the
//! RustCrypto `aes` block primitive (batched `encrypt_blocks`), plus the
//! OpenSSL XTS fast path. Everything behind the small [`SectorCipher`] trait.
//!
//! ```text
//!   SectorCrypt ──(one per key part)──▶ dyn SectorCipher
//!                                         ├─ XtsOpenssl  (vendored OpenSSL 3, VAES/AVX-512 or AES-NI)
//!                                         │     └─ falls back to XtsRust on any OpenSSL error
//!                                         ├─ XtsRust     (aes::encrypt_blocks in 64-block batches)
//!                                         ├─ Cbc, Ecb    (aes)
//!                                         └─ NullCipher
//! ```
//!
//! XTS is IEEE 1619-2007 restricted to whole 16-byte blocks (dm-crypt sectors
//! are 512..4096 bytes, so ciphertext stealing never happens). The tweak is
//! the sector IV encrypted with the second key half, multiplied by alpha in
//! GF(2^128) (little-endian, polynomial x^128 + x^7 + x^2 + x + 1) per block.

use std::sync::Mutex;

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256, Block};
use openssl::cipher::{Cipher, CipherRef};
use openssl::cipher_ctx::CipherCtx;
use zeroize::Zeroizing;

/// Direction of a conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Encrypt,
    Decrypt,
}

/// Encrypts or decrypts whole sectors in place with a caller-supplied IV.
pub(crate) trait SectorCipher: Send + Sync {
    /// Converts one sector (`buf`, a multiple of 16 bytes) with `iv`.
    fn crypt(&self, dir: Dir, buf: &mut [u8], iv: &[u8; 16]);

    /// Converts `buf` as consecutive `unit`-byte sectors; sector `i` uses
    /// `ivs(i)`. Implementations override this to amortise set-up costs.
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &mut dyn FnMut(usize) -> [u8; 16]) {
        for (i, s) in buf.chunks_exact_mut(unit).enumerate() {
            self.crypt(dir, s, &ivs(i));
        }
    }

    /// Implementation name for `benchmark`/`status`.
    fn name(&self) -> &'static str;
}

/// Which XTS implementation to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum XtsImpl {
    /// OpenSSL when it accepts the key, else the pure-Rust one. The
    /// environment variable `UCRYPT_XTS=rust|openssl` overrides the choice.
    #[default]
    Auto,
    /// Vendored OpenSSL (falls back to Rust for keys OpenSSL refuses, such
    /// as equal halves, or AES-192-XTS which OpenSSL lacks).
    OpenSsl,
    /// Hand-made XTS over `aes` batched block encryption.
    Rust,
}

/// Name of the pure-Rust XTS implementation.
pub const RUST_XTS_NAME: &str = "rust-aes-xts (aes 0.9 encrypt_blocks batches)";
/// Name of the OpenSSL XTS implementation.
pub const OPENSSL_XTS_NAME: &str = "openssl-xts (vendored OpenSSL 3, EVP, IV re-init per sector)";

/// AES with the key length chosen at runtime.
pub(crate) enum Aes {
    A128(Aes128),
    A192(Aes192),
    A256(Aes256),
}

impl Aes {
    /// `None` unless the key is 16, 24 or 32 bytes.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        Some(match key.len() {
            16 => Self::A128(Aes128::new_from_slice(key).ok()?),
            24 => Self::A192(Aes192::new_from_slice(key).ok()?),
            32 => Self::A256(Aes256::new_from_slice(key).ok()?),
            _ => return None,
        })
    }

    fn encrypt_blocks(&self, b: &mut [Block]) {
        match self {
            Self::A128(c) => c.encrypt_blocks(b),
            Self::A192(c) => c.encrypt_blocks(b),
            Self::A256(c) => c.encrypt_blocks(b),
        }
    }

    fn decrypt_blocks(&self, b: &mut [Block]) {
        match self {
            Self::A128(c) => c.decrypt_blocks(b),
            Self::A192(c) => c.decrypt_blocks(b),
            Self::A256(c) => c.decrypt_blocks(b),
        }
    }

    /// Encrypts one 16-byte block.
    pub(crate) fn encrypt16(&self, block: &mut [u8; 16]) {
        let mut b = Block::from(*block);
        self.encrypt_blocks(std::slice::from_mut(&mut b));
        block.copy_from_slice(&b);
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

/// Blocks per batch handed to `encrypt_blocks` (wide enough for VAES).
const BATCH: usize = 64;

/// Hand-made XTS over `aes`.
pub(crate) struct XtsRust {
    data: Aes,
    tweak: Aes,
}

impl XtsRust {
    /// `key` = data key || tweak key (32, 48 or 64 bytes).
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        if key.len() % 2 != 0 {
            return None;
        }
        let (k1, k2) = key.split_at(key.len() / 2);
        Some(Self { data: Aes::new(k1)?, tweak: Aes::new(k2)? })
    }
}

impl SectorCipher for XtsRust {
    fn crypt(&self, dir: Dir, buf: &mut [u8], iv: &[u8; 16]) {
        let mut t0 = *iv;
        self.tweak.encrypt16(&mut t0);
        let mut t = u128::from_le_bytes(t0);
        let mut tweaks = [0u128; BATCH];
        for chunk in blocks(buf).chunks_mut(BATCH) {
            for (b, tw) in chunk.iter_mut().zip(tweaks.iter_mut()) {
                *tw = t;
                store(b, load(b) ^ t);
                t = mul_alpha(t);
            }
            match dir {
                Dir::Encrypt => self.data.encrypt_blocks(chunk),
                Dir::Decrypt => self.data.decrypt_blocks(chunk),
            }
            for (b, tw) in chunk.iter_mut().zip(tweaks.iter()) {
                store(b, load(b) ^ tw);
            }
        }
    }

    fn name(&self) -> &'static str {
        RUST_XTS_NAME
    }
}

/// A pair of OpenSSL contexts keyed once, re-initialised with the IV only.
struct CtxPair {
    enc: CipherCtx,
    dec: CipherCtx,
}

/// XTS through vendored OpenSSL's EVP interface.
pub(crate) struct XtsOpenssl {
    cipher: &'static CipherRef,
    key: Zeroizing<Vec<u8>>,
    /// Idle keyed contexts; a call takes one (or makes one) and returns it.
    pool: Mutex<Vec<CtxPair>>,
    fallback: XtsRust,
}

impl XtsOpenssl {
    /// `None` when OpenSSL has no such XTS or refuses the key (equal halves).
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        let cipher = match key.len() {
            32 => Cipher::aes_128_xts(),
            64 => Cipher::aes_256_xts(),
            _ => return None,
        };
        let (k1, k2) = key.split_at(key.len() / 2);
        if k1 == k2 {
            return None;
        }
        let fallback = XtsRust::new(key)?;
        let me = Self { cipher, key: Zeroizing::new(key.to_vec()), pool: Mutex::new(Vec::new()), fallback };
        // Prove OpenSSL works with this key before choosing it, and that it
        // agrees with the Rust implementation on a known sector.
        let pair = me.new_pair()?;
        me.pool_put(pair);
        let mut a = [0x5au8; 64];
        let mut b = a;
        let iv = [7u8; 16];
        if !me.try_crypt_run(Dir::Encrypt, &mut a, 64, &mut |_| iv) {
            return None;
        }
        me.fallback.crypt(Dir::Encrypt, &mut b, &iv);
        (a == b).then_some(me)
    }

    fn new_pair(&self) -> Option<CtxPair> {
        let mut enc = CipherCtx::new().ok()?;
        enc.encrypt_init(Some(self.cipher), Some(&self.key), None).ok()?;
        enc.set_padding(false);
        let mut dec = CipherCtx::new().ok()?;
        dec.decrypt_init(Some(self.cipher), Some(&self.key), None).ok()?;
        dec.set_padding(false);
        Some(CtxPair { enc, dec })
    }

    fn pool_take(&self) -> Option<CtxPair> {
        let popped = match self.pool.lock() {
            Ok(mut p) => p.pop(),
            Err(poisoned) => poisoned.into_inner().pop(),
        };
        popped.or_else(|| self.new_pair())
    }

    fn pool_put(&self, pair: CtxPair) {
        match self.pool.lock() {
            Ok(mut p) => p.push(pair),
            Err(poisoned) => poisoned.into_inner().push(pair),
        }
    }

    /// False if OpenSSL failed anywhere; `buf` may then be partly converted
    /// and the caller must not use it (only used before a context is trusted
    /// or to switch to the fallback from a saved copy).
    fn try_crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &mut dyn FnMut(usize) -> [u8; 16]) -> bool {
        let Some(mut pair) = self.pool_take() else { return false };
        let ctx = match dir {
            Dir::Encrypt => &mut pair.enc,
            Dir::Decrypt => &mut pair.dec,
        };
        for (i, s) in buf.chunks_exact_mut(unit).enumerate() {
            let iv = ivs(i);
            let ok = match dir {
                Dir::Encrypt => ctx.encrypt_init(None, None, Some(&iv)),
                Dir::Decrypt => ctx.decrypt_init(None, None, Some(&iv)),
            }
            .is_ok()
                && ctx.cipher_update_inplace(s, unit).map(|n| n == unit).unwrap_or(false);
            if !ok {
                // Drop this pair: its state is unknown.
                return false;
            }
        }
        self.pool_put(pair);
        true
    }
}

impl SectorCipher for XtsOpenssl {
    fn crypt(&self, dir: Dir, buf: &mut [u8], iv: &[u8; 16]) {
        let unit = buf.len();
        self.crypt_run(dir, buf, unit, &mut |_| *iv);
    }

    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &mut dyn FnMut(usize) -> [u8; 16]) {
        // OpenSSL converts sector by sector; a failure part-way (never seen
        // after the self-test in `new`) is redone by the fallback from the
        // failing sector on, since each sector is converted independently
        // and sectors before it are finished.
        let Some(mut pair) = self.pool_take() else {
            return self.fallback.crypt_run(dir, buf, unit, ivs);
        };
        let mut failed_at = None;
        {
            let ctx = match dir {
                Dir::Encrypt => &mut pair.enc,
                Dir::Decrypt => &mut pair.dec,
            };
            for (i, s) in buf.chunks_exact_mut(unit).enumerate() {
                let iv = ivs(i);
                let init = match dir {
                    Dir::Encrypt => ctx.encrypt_init(None, None, Some(&iv)),
                    Dir::Decrypt => ctx.decrypt_init(None, None, Some(&iv)),
                };
                if init.is_err() {
                    // Nothing was written to `s` yet.
                    failed_at = Some((i, iv));
                    break;
                }
                if !ctx.cipher_update_inplace(s, unit).map(|n| n == unit).unwrap_or(false) {
                    // EVP_CipherUpdate fails before touching the data for
                    // XTS (length checks); treat the sector as untouched.
                    failed_at = Some((i, iv));
                    break;
                }
            }
        }
        match failed_at {
            None => self.pool_put(pair),
            Some((i, iv)) => {
                let rest = &mut buf[i * unit..];
                let (first, tail) = rest.split_at_mut(unit);
                self.fallback.crypt(dir, first, &iv);
                self.fallback.crypt_run(dir, tail, unit, &mut |j| ivs(i + 1 + j));
            }
        }
    }

    fn name(&self) -> &'static str {
        OPENSSL_XTS_NAME
    }
}

/// Builds the XTS implementation for `key` (data key || tweak key).
pub(crate) fn new_xts(key: &[u8], choice: XtsImpl) -> Option<Box<dyn SectorCipher>> {
    let choice = match choice {
        XtsImpl::Auto => match std::env::var("UCRYPT_XTS").as_deref() {
            Ok("rust") => XtsImpl::Rust,
            _ => XtsImpl::OpenSsl,
        },
        c => c,
    };
    if choice == XtsImpl::OpenSsl {
        if let Some(x) = XtsOpenssl::new(key) {
            return Some(Box::new(x));
        }
    }
    Some(Box::new(XtsRust::new(key)?))
}

/// CBC over `aes`.
pub(crate) struct Cbc(pub(crate) Aes);

impl SectorCipher for Cbc {
    fn crypt(&self, dir: Dir, buf: &mut [u8], iv: &[u8; 16]) {
        let mut prev = u128::from_le_bytes(*iv);
        let bl = blocks(buf);
        match dir {
            Dir::Encrypt => {
                for b in bl.iter_mut() {
                    store(b, load(b) ^ prev);
                    self.0.encrypt_blocks(std::slice::from_mut(b));
                    prev = load(b);
                }
            }
            Dir::Decrypt => {
                // Decryption is parallel: decrypt a batch, then XOR each
                // block with the ciphertext block before it.
                let mut saved = [0u128; BATCH];
                for chunk in bl.chunks_mut(BATCH) {
                    for (s, b) in saved.iter_mut().zip(chunk.iter()) {
                        *s = load(b);
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

    fn name(&self) -> &'static str {
        "rust-aes-cbc"
    }
}

/// ECB over `aes` (the IV is ignored).
pub(crate) struct Ecb(pub(crate) Aes);

impl SectorCipher for Ecb {
    fn crypt(&self, dir: Dir, buf: &mut [u8], _iv: &[u8; 16]) {
        match dir {
            Dir::Encrypt => self.0.encrypt_blocks(blocks(buf)),
            Dir::Decrypt => self.0.decrypt_blocks(blocks(buf)),
        }
    }

    fn crypt_run(&self, dir: Dir, buf: &mut [u8], _unit: usize, _ivs: &mut dyn FnMut(usize) -> [u8; 16]) {
        self.crypt(dir, buf, &[0; 16]);
    }

    fn name(&self) -> &'static str {
        "rust-aes-ecb"
    }
}

/// `cipher_null`: copies data unchanged.
pub(crate) struct NullCipher;

impl SectorCipher for NullCipher {
    fn crypt(&self, _dir: Dir, _buf: &mut [u8], _iv: &[u8; 16]) {}

    fn crypt_run(&self, _dir: Dir, _buf: &mut [u8], _unit: usize, _ivs: &mut dyn FnMut(usize) -> [u8; 16]) {}

    fn name(&self) -> &'static str {
        "cipher_null"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_multiplication_wraps_with_0x87() {
        assert_eq!(mul_alpha(1), 2);
        assert_eq!(mul_alpha(1u128 << 127), 0x87);
    }

    #[test]
    fn openssl_and_rust_xts_agree_and_roundtrip() {
        let key: Vec<u8> = (0..64u8).collect();
        let ossl = XtsOpenssl::new(&key).expect("vendored OpenSSL XTS");
        let rust = XtsRust::new(&key).unwrap();
        let mut a: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
        let orig = a.clone();
        let mut b = a.clone();
        let mut ivs = |i: usize| {
            let mut iv = [0u8; 16];
            iv[..8].copy_from_slice(&(i as u64 + 9).to_le_bytes());
            iv
        };
        ossl.crypt_run(Dir::Encrypt, &mut a, 4096, &mut ivs);
        rust.crypt_run(Dir::Encrypt, &mut b, 4096, &mut ivs);
        assert_eq!(a, b);
        assert_ne!(a, orig);
        ossl.crypt_run(Dir::Decrypt, &mut a, 4096, &mut ivs);
        assert_eq!(a, orig);
    }

    #[test]
    fn openssl_refuses_equal_halves_so_rust_is_used() {
        let key = [0x11u8; 64];
        assert!(XtsOpenssl::new(&key).is_none());
        assert_eq!(new_xts(&key, XtsImpl::OpenSsl).unwrap().name(), RUST_XTS_NAME);
    }
}
