//! The OpenSSL provider: chain modes through vendored OpenSSL 3's EVP
//! interface (VAES/AVX-512 or AES-NI picked by OpenSSL at runtime), keyed
//! once per context and re-initialised with each sector's IV. Each `Evp`
//! holds the Rust implementation of the same mode as its fallback and
//! proves at construction that both agree.
//!
//! [`Evp::xts_append`] is the crate's one unsafe function (fenced with
//! `#[allow(unsafe_code)]` under the crate's `deny`).

use std::sync::Mutex;

use openssl::cipher::{Cipher, CipherRef};
use openssl::cipher_ctx::CipherCtx;
use zeroize::Zeroizing;

use super::{Dir, SectorCipher, OPENSSL_XTS_NAME};

/// Chain modes the OpenSSL path implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EvpMode {
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
    /// The raw key, kept to key new per-thread contexts (locked pages).
    key: crate::Secret,
    /// Idle keyed contexts; a call takes one (or makes one) and returns it.
    pool: Mutex<Vec<CtxPair>>,
    fallback: Box<dyn SectorCipher>,
    name: &'static str,
}

impl Evp {
    /// `None` when OpenSSL lacks the mode/key size or refuses the key
    /// (XTS with equal halves) or disagrees with the Rust implementation.
    pub(super) fn new(mode: EvpMode, key: &[u8], fallback: Box<dyn SectorCipher>) -> Option<Self> {
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
            key: crate::Secret::from_slice(key),
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
