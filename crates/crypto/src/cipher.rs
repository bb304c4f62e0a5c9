//! Chain modes over whole sectors: hand-written XTS, CBC and ECB over the
//! RustCrypto `aes` block primitive (batched `encrypt_blocks`), plus the
//! OpenSSL XTS fast path. Everything behind the small [`SectorCipher`] trait.
//!
//! ```text
//!   SectorCrypt ──(one per key part)──▶ dyn SectorCipher
//!                                         ├─ Evp (vendored OpenSSL 3: xts/cbc/ecb; VAES/AVX-512
//!                                         │      or AES-NI picked by OpenSSL at runtime)
//!                                         │     └─ falls back to the Rust mode below for keys
//!                                         │        OpenSSL refuses (XTS halves equal, AES-192-XTS)
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

/// Encrypts or decrypts whole sectors in place with caller-supplied IVs.
pub(crate) trait SectorCipher: Send + Sync {
    /// Converts `buf` as consecutive `unit`-byte sectors (`unit` a multiple
    /// of 16); sector `i` uses `ivs[i]`, and `ivs.len() == buf.len() / unit`.
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]);

    /// Like [`SectorCipher::crypt_run`], reading `src` and writing `dst`
    /// (same length): one pass over the data instead of a copy and a pass.
    /// Provided: copy, then convert in place.
    fn crypt_run_to(&self, dir: Dir, src: &[u8], dst: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        dst.copy_from_slice(src);
        self.crypt_run(dir, dst, unit, ivs);
    }

    /// Like [`SectorCipher::crypt_run_to`], appending the output to `out`:
    /// written straight into its spare capacity where the implementation
    /// can (OpenSSL XTS), so no buffer has to be zeroed first. Provided:
    /// append a copy, then convert it in place.
    fn crypt_run_append(
        &self,
        dir: Dir,
        src: &[u8],
        out: &mut Vec<u8>,
        unit: usize,
        ivs: &[[u8; 16]],
    ) {
        let base = out.len();
        out.extend_from_slice(src);
        self.crypt_run(dir, &mut out[base..], unit, ivs);
    }

    /// Converts one sector (`buf`, a multiple of 16 bytes) with `iv`.
    fn crypt(&self, dir: Dir, buf: &mut [u8], iv: &[u8; 16]) {
        let unit = buf.len();
        if unit > 0 {
            self.crypt_run(dir, buf, unit, std::slice::from_ref(iv));
        }
    }

    /// Implementation name for `benchmark`/`status`.
    fn name(&self) -> &'static str;
}

/// Which implementation family builds the chain modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Provider {
    /// Vendored OpenSSL when it accepts the key, else pure Rust. The
    /// environment variable `UCRYPT_CRYPTO=rust|openssl` overrides it.
    #[default]
    Auto,
    /// Vendored OpenSSL EVP (falls back to Rust for keys OpenSSL refuses,
    /// such as XTS keys with equal halves, or AES-192-XTS which it lacks).
    OpenSsl,
    /// Hand-made modes over the `aes` crate's batched block functions.
    Rust,
}

/// Name of the pure-Rust XTS implementation.
pub const RUST_XTS_NAME: &str = "rust-aes-xts (hand-made XTS over aes 0.9 encrypt_blocks)";
/// Name of the OpenSSL XTS implementation.
pub const OPENSSL_XTS_NAME: &str = "openssl-xts (vendored OpenSSL 3 EVP, per-sector IV re-init)";

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
        Some(Self {
            data: Aes::new(k1)?,
            tweak: Aes::new(k2)?,
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
        RUST_XTS_NAME
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

/// Chain modes the OpenSSL path implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EvpMode {
    Xts,
    Cbc,
    Ecb,
}

/// A pair of OpenSSL contexts keyed once, re-initialised with the IV only.
struct CtxPair {
    enc: CipherCtx,
    dec: CipherCtx,
    /// Output space for block modes: EVP wants `len + block size` bytes of
    /// room there, so CBC/ECB cannot convert in place (XTS can).
    scratch: Zeroizing<Vec<u8>>,
}

/// A chain mode through vendored OpenSSL's EVP interface, with the Rust
/// implementation of the same mode as fallback.
pub(crate) struct Evp {
    mode: EvpMode,
    cipher: &'static CipherRef,
    key: Zeroizing<Vec<u8>>,
    /// Idle keyed contexts; a call takes one (or makes one) and returns it.
    pool: Mutex<Vec<CtxPair>>,
    fallback: Box<dyn SectorCipher>,
    name: &'static str,
}

impl Evp {
    /// `None` when OpenSSL lacks the mode/key size or refuses the key
    /// (XTS with equal halves) or disagrees with the Rust implementation.
    fn new(mode: EvpMode, key: &[u8], fallback: Box<dyn SectorCipher>) -> Option<Self> {
        let (cipher, name) = match (mode, key.len()) {
            (EvpMode::Xts, 32) => (Cipher::aes_128_xts(), OPENSSL_XTS_NAME),
            (EvpMode::Xts, 64) => (Cipher::aes_256_xts(), OPENSSL_XTS_NAME),
            (EvpMode::Cbc, 16) => (
                Cipher::aes_128_cbc(),
                "openssl-cbc (vendored OpenSSL 3 EVP)",
            ),
            (EvpMode::Cbc, 24) => (
                Cipher::aes_192_cbc(),
                "openssl-cbc (vendored OpenSSL 3 EVP)",
            ),
            (EvpMode::Cbc, 32) => (
                Cipher::aes_256_cbc(),
                "openssl-cbc (vendored OpenSSL 3 EVP)",
            ),
            (EvpMode::Ecb, 16) => (
                Cipher::aes_128_ecb(),
                "openssl-ecb (vendored OpenSSL 3 EVP)",
            ),
            (EvpMode::Ecb, 24) => (
                Cipher::aes_192_ecb(),
                "openssl-ecb (vendored OpenSSL 3 EVP)",
            ),
            (EvpMode::Ecb, 32) => (
                Cipher::aes_256_ecb(),
                "openssl-ecb (vendored OpenSSL 3 EVP)",
            ),
            _ => return None,
        };
        if mode == EvpMode::Xts {
            let (k1, k2) = key.split_at(key.len() / 2);
            if k1 == k2 {
                return None;
            }
        }
        let me = Self {
            mode,
            cipher,
            key: Zeroizing::new(key.to_vec()),
            pool: Mutex::new(Vec::new()),
            fallback,
            name,
        };
        // Prove OpenSSL works with this key and agrees with the Rust
        // implementation before choosing it.
        let pair = me.new_pair()?;
        me.pool_put(pair);
        let ivs = [[7u8; 16], [9u8; 16]];
        for dir in [Dir::Encrypt, Dir::Decrypt] {
            let mut a: Vec<u8> = (0..128u8).collect();
            let mut b = a.clone();
            let mut c = vec![0u8; a.len()];
            let mut d = vec![1u8];
            if me.try_run(dir, Some(&a), &mut c, 64, &ivs).is_some()
                || (mode == EvpMode::Xts && me.xts_append(dir, &a, &mut d, 64, &ivs) != 2)
                || me.try_run(dir, None, &mut a, 64, &ivs).is_some()
            {
                return None;
            }
            me.fallback.crypt_run(dir, &mut b, 64, &ivs);
            if a != b || c != b || (mode == EvpMode::Xts && (d[0] != 1 || d[1..] != b[..])) {
                return None;
            }
        }
        Some(me)
    }

    fn new_pair(&self) -> Option<CtxPair> {
        let mut enc = CipherCtx::new().ok()?;
        enc.encrypt_init(Some(self.cipher), Some(&self.key), None)
            .ok()?;
        enc.set_padding(false);
        let mut dec = CipherCtx::new().ok()?;
        dec.decrypt_init(Some(self.cipher), Some(&self.key), None)
            .ok()?;
        dec.set_padding(false);
        Some(CtxPair {
            enc,
            dec,
            scratch: Zeroizing::new(Vec::new()),
        })
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

    /// Converts sector by sector, from `src` when given (else in place);
    /// returns the index of the first sector OpenSSL failed on (its output
    /// left untouched: for these modes EVP checks everything before
    /// writing), or `None` when all are done.
    fn try_run(
        &self,
        dir: Dir,
        src: Option<&[u8]>,
        buf: &mut [u8],
        unit: usize,
        ivs: &[[u8; 16]],
    ) -> Option<usize> {
        let Some(mut pair) = self.pool_take() else {
            return Some(0);
        };
        let CtxPair { enc, dec, scratch } = &mut pair;
        let ctx = match dir {
            Dir::Encrypt => enc,
            Dir::Decrypt => dec,
        };
        if self.mode != EvpMode::Xts && scratch.len() < unit + 16 {
            scratch.resize(unit + 16, 0);
        }
        for (i, (s, iv)) in buf.chunks_exact_mut(unit).zip(ivs.iter()).enumerate() {
            let init_ok = set_iv(ctx, self.mode, dir, iv);
            let from = src.map(|src| &src[i * unit..(i + 1) * unit]);
            let ok = init_ok
                && if self.mode == EvpMode::Xts {
                    // XTS has EVP block size 1: the output needs no room
                    // beyond the input, and in place is allowed.
                    match from {
                        Some(from) => ctx.cipher_update(from, Some(s)),
                        None => ctx.cipher_update_inplace(s, unit),
                    }
                    .is_ok_and(|n| n == unit)
                } else {
                    if let Some(from) = from {
                        s.copy_from_slice(from);
                    }
                    let done = ctx
                        .cipher_update(s, Some(&mut scratch[..unit + 16]))
                        .is_ok_and(|n| n == unit);
                    if done {
                        s.copy_from_slice(&scratch[..unit]);
                    }
                    done
                };
            if !ok {
                // Drop this pair: its state is unknown.
                return Some(i);
            }
        }
        self.pool_put(pair);
        None
    }
}

impl Evp {
    /// XTS from `src` straight into `out`'s spare capacity, sector by
    /// sector; returns how many sectors were appended (all of them but
    /// after an OpenSSL failure, never seen after the self-test).
    ///
    /// The one unsafe function of this crate: the safe OpenSSL API only
    /// writes into initialised slices, and zeroing a buffer just to
    /// overwrite it costs as much as the copy the fused data path saves.
    #[allow(unsafe_code)]
    fn xts_append(
        &self,
        dir: Dir,
        src: &[u8],
        out: &mut Vec<u8>,
        unit: usize,
        ivs: &[[u8; 16]],
    ) -> usize {
        use foreign_types::ForeignType;
        let (Ok(inl), Some(mut pair)) = (std::ffi::c_int::try_from(unit), self.pool_take()) else {
            return 0;
        };
        let ctx = match dir {
            Dir::Encrypt => &mut pair.enc,
            Dir::Decrypt => &mut pair.dec,
        };
        out.reserve(src.len());
        for (i, (s, iv)) in src.chunks_exact(unit).zip(ivs.iter()).enumerate() {
            let init_ok = set_iv(ctx, EvpMode::Xts, dir, iv);
            let mut outl: std::ffi::c_int = 0;
            // SAFETY: `out` has at least `unit` bytes of spare capacity
            // (reserved for all of `src` above, and each sector appends
            // exactly `unit`) starting at `as_mut_ptr() + len`; XTS has EVP
            // block size 1 and no padding, so it writes exactly `inl` bytes
            // for `inl` bytes of input and nothing beyond. `s` is valid for
            // `unit` readable bytes and cannot overlap `out`'s spare
            // capacity (`src` is borrowed shared while `out` is borrowed
            // exclusively). `ctx` is an initialised context owned by `pair`.
            let ok = init_ok
                && unsafe {
                    openssl_sys::EVP_CipherUpdate(
                        ctx.as_ptr(),
                        out.as_mut_ptr().add(out.len()),
                        &mut outl,
                        s.as_ptr(),
                        inl,
                    )
                } == 1
                && outl == inl;
            if !ok {
                // Clear this thread's OpenSSL error queue; drop the pair
                // (its state is unknown).
                drop(openssl::error::ErrorStack::get());
                return i;
            }
            // SAFETY: OpenSSL initialised exactly the `unit` bytes after
            // the current length (outl == inl == unit), inside capacity.
            unsafe { out.set_len(out.len() + unit) };
        }
        self.pool_put(pair);
        src.len() / unit
    }
}

/// Re-initialises a keyed context with a sector's IV (ECB takes none);
/// false if OpenSSL refuses.
fn set_iv(ctx: &mut CipherCtx, mode: EvpMode, dir: Dir, iv: &[u8; 16]) -> bool {
    match (mode, dir) {
        (EvpMode::Ecb, _) => true,
        (_, Dir::Encrypt) => ctx.encrypt_init(None, None, Some(iv)).is_ok(),
        (_, Dir::Decrypt) => ctx.decrypt_init(None, None, Some(iv)).is_ok(),
    }
}

impl SectorCipher for Evp {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        if let Some(i) = self.try_run(dir, None, buf, unit, ivs) {
            // Never seen after the self-test in `new`; finish in Rust.
            self.fallback
                .crypt_run(dir, &mut buf[i * unit..], unit, &ivs[i..]);
        }
    }

    fn crypt_run_to(&self, dir: Dir, src: &[u8], dst: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        if let Some(i) = self.try_run(dir, Some(src), dst, unit, ivs) {
            self.fallback.crypt_run_to(
                dir,
                &src[i * unit..],
                &mut dst[i * unit..],
                unit,
                &ivs[i..],
            );
        }
    }

    fn crypt_run_append(
        &self,
        dir: Dir,
        src: &[u8],
        out: &mut Vec<u8>,
        unit: usize,
        ivs: &[[u8; 16]],
    ) {
        let done = if self.mode == EvpMode::Xts {
            self.xts_append(dir, src, out, unit, ivs)
        } else {
            0
        };
        if done * unit < src.len() {
            let base = out.len();
            out.extend_from_slice(&src[done * unit..]);
            self.crypt_run(dir, &mut out[base..], unit, &ivs[done..]);
        }
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

/// Builds a chain mode for `key` (for XTS: data key || tweak key); `None`
/// when the key length does not fit the mode.
pub(crate) fn new_mode(
    chain: crate::spec::ChainMode,
    key: &[u8],
    choice: Provider,
) -> Option<Box<dyn SectorCipher>> {
    use crate::spec::ChainMode;
    let choice = match choice {
        Provider::Auto => match std::env::var("UCRYPT_CRYPTO").as_deref() {
            Ok("rust") => Provider::Rust,
            _ => Provider::OpenSsl,
        },
        c => c,
    };
    let (rust, mode): (Box<dyn SectorCipher>, EvpMode) = match chain {
        ChainMode::Xts => (Box::new(XtsRust::new(key)?), EvpMode::Xts),
        ChainMode::Cbc => (Box::new(Cbc(Aes::new(key)?)), EvpMode::Cbc),
        ChainMode::Ecb => (Box::new(Ecb(Aes::new(key)?)), EvpMode::Ecb),
    };
    if choice == Provider::OpenSsl {
        // `Evp::new` takes the fallback; rebuild it if OpenSSL declines.
        if let Some(e) = Evp::new(mode, key, rust) {
            return Some(Box::new(e));
        }
        return new_mode(chain, key, Provider::Rust);
    }
    Some(rust)
}

/// CBC over `aes`.
pub(crate) struct Cbc(pub(crate) Aes);

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
        "rust-aes-cbc"
    }
}

/// ECB over `aes` (IVs are ignored).
pub(crate) struct Ecb(pub(crate) Aes);

impl SectorCipher for Ecb {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], _unit: usize, _ivs: &[[u8; 16]]) {
        match dir {
            Dir::Encrypt => self.0.encrypt_blocks(blocks(buf)),
            Dir::Decrypt => self.0.decrypt_blocks(blocks(buf)),
        }
    }

    fn name(&self) -> &'static str {
        "rust-aes-ecb"
    }
}

/// `cipher_null`: copies data unchanged.
pub(crate) struct NullCipher;

impl SectorCipher for NullCipher {
    fn crypt_run(&self, _dir: Dir, _buf: &mut [u8], _unit: usize, _ivs: &[[u8; 16]]) {}

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

    #[test]
    fn openssl_and_rust_agree_and_roundtrip() {
        use crate::spec::ChainMode;
        for (chain, klen) in [
            (ChainMode::Xts, 64),
            (ChainMode::Xts, 32),
            (ChainMode::Cbc, 24),
            (ChainMode::Ecb, 16),
        ] {
            let key: Vec<u8> = (0..klen as u8).collect();
            let ossl = new_mode(chain, &key, Provider::OpenSsl).unwrap();
            assert!(
                ossl.name().starts_with("openssl"),
                "{chain:?}: {}",
                ossl.name()
            );
            let rust = new_mode(chain, &key, Provider::Rust).unwrap();
            assert!(rust.name().starts_with("rust"));
            let mut a: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
            let orig = a.clone();
            let mut b = a.clone();
            let ivs: Vec<[u8; 16]> = (0..2u64)
                .map(|i| {
                    let mut iv = [0u8; 16];
                    iv[..8].copy_from_slice(&(i + 9).to_le_bytes());
                    iv
                })
                .collect();
            ossl.crypt_run(Dir::Encrypt, &mut a, 4096, &ivs);
            rust.crypt_run(Dir::Encrypt, &mut b, 4096, &ivs);
            assert_eq!(a, b, "{chain:?}");
            assert_ne!(a, orig);
            rust.crypt_run(Dir::Decrypt, &mut b, 4096, &ivs);
            ossl.crypt_run(Dir::Decrypt, &mut a, 4096, &ivs);
            assert_eq!(a, orig);
            assert_eq!(b, orig);
        }
    }

    #[test]
    fn openssl_refuses_equal_halves_so_rust_is_used() {
        let key = [0x11u8; 64];
        let c = new_mode(crate::spec::ChainMode::Xts, &key, Provider::OpenSsl).unwrap();
        assert_eq!(c.name(), RUST_XTS_NAME);
        let c = new_mode(crate::spec::ChainMode::Xts, &[3u8; 48], Provider::OpenSsl).unwrap();
        assert_eq!(c.name(), RUST_XTS_NAME, "OpenSSL has no AES-192-XTS");
    }
}
