//! The OpenSSL provider: chain modes through vendored OpenSSL 3's EVP
//! interface (VAES/AVX-512 or AES-NI picked by OpenSSL at runtime), keyed
//! once per context and re-initialised with each sector's IV. Each `Evp`
//! holds the Rust implementation of the same mode as its fallback and
//! proves at construction that both agree.
//!
//! XTS goes through [`Evp::xts_sectors`], the crate's one unsafe function
//! (fenced with `#[allow(unsafe_code)]` under the crate's `deny`): raw
//! `EVP_CipherInit_ex`/`EVP_CipherUpdate` per sector, because the safe
//! wrappers' per-call checks (IV length and output size, each a provider
//! query) cost a measurable share of a 512-byte sector.

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
                || (mode == EvpMode::Xts
                    && me.xts_sectors(dir, XtsIo::Append(&a, &mut d), 64, &ivs) != 2)
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
        let mut dec = CipherCtx::new().ok()?;
        dec.decrypt_init(Some(self.cipher), Some(&self.key), None)
            .ok()?;
        // XTS has no padding to turn off (EVP block size 1). Turning it off
        // anyway is not free: OpenSSL 3 then repeats it on every IV
        // re-initialisation (`evp_cipher_init_internal` calls
        // `EVP_CIPHER_CTX_set_padding`, an OSSL_PARAM round trip to the
        // provider), about a tenth of a 512-byte sector's time.
        if self.mode != EvpMode::Xts {
            enc.set_padding(false);
            dec.set_padding(false);
        }
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
    /// writing), or `None` when all are done. XTS goes to
    /// [`Evp::xts_sectors`].
    fn try_run(
        &self,
        dir: Dir,
        src: Option<&[u8]>,
        buf: &mut [u8],
        unit: usize,
        ivs: &[[u8; 16]],
    ) -> Option<usize> {
        if self.mode == EvpMode::Xts {
            let n = buf.len() / unit;
            let io = match src {
                Some(src) => XtsIo::To(src, buf),
                None => XtsIo::InPlace(buf),
            };
            let done = self.xts_sectors(dir, io, unit, ivs);
            return (done < n).then_some(done);
        }
        let Some(mut pair) = self.pool_take() else {
            return Some(0);
        };
        let CtxPair { enc, dec, scratch } = &mut pair;
        let ctx = match dir {
            Dir::Encrypt => enc,
            Dir::Decrypt => dec,
        };
        if scratch.len() < unit + 16 {
            scratch.resize(unit + 16, 0);
        }
        for (i, (s, iv)) in buf.chunks_exact_mut(unit).zip(ivs.iter()).enumerate() {
            let init_ok = set_iv(ctx, self.mode, dir, iv);
            if let Some(src) = src {
                s.copy_from_slice(&src[i * unit..(i + 1) * unit]);
            }
            // EVP wants `len + block size` bytes of output room for block
            // modes, so CBC/ECB go through the scratch buffer.
            let ok = init_ok
                && ctx
                    .cipher_update(s, Some(&mut scratch[..unit + 16]))
                    .is_ok_and(|n| n == unit);
            if ok {
                s.copy_from_slice(&scratch[..unit]);
            }
            if !ok {
                // Drop this pair: its state is unknown.
                return Some(i);
            }
        }
        self.pool_put(pair);
        None
    }
}

/// Where [`Evp::xts_sectors`] reads and writes.
enum XtsIo<'a> {
    /// Converted where it is.
    InPlace(&'a mut [u8]),
    /// From a source into a destination of the same length.
    To(&'a [u8], &'a mut [u8]),
    /// From a source into the Vec's spare capacity, growing its length.
    Append(&'a [u8], &'a mut Vec<u8>),
}

impl Evp {
    /// XTS sector by sector through raw EVP calls: re-initialise the keyed
    /// context with the sector's IV, convert the sector. Returns how many
    /// sectors were converted (all but after an OpenSSL failure, never seen
    /// after the self-test in `new`; the failed sector's output is left as
    /// it was, and an append stops before it).
    ///
    /// The one unsafe function of this crate: the safe OpenSSL API only
    /// writes into initialised slices (zeroing a read buffer just to
    /// overwrite it costs as much as the copy the fused data path saves),
    /// and its wrappers re-check the IV length and output size on every
    /// call, which at 512-byte sectors is a measurable share of the work.
    #[allow(unsafe_code)]
    fn xts_sectors(&self, dir: Dir, mut io: XtsIo<'_>, unit: usize, ivs: &[[u8; 16]]) -> usize {
        use foreign_types::ForeignType;
        let len = match &io {
            XtsIo::InPlace(b) => b.len(),
            XtsIo::To(s, d) => {
                assert_eq!(s.len(), d.len(), "source and destination differ in length");
                s.len()
            }
            XtsIo::Append(s, _) => s.len(),
        };
        let n = (len / unit).min(ivs.len());
        let (Ok(inl), Some(mut pair)) = (std::ffi::c_int::try_from(unit), self.pool_take()) else {
            return 0;
        };
        let (ctx, enc) = match dir {
            Dir::Encrypt => (&mut pair.enc, 1),
            Dir::Decrypt => (&mut pair.dec, 0),
        };
        if let XtsIo::Append(_, out) = &mut io {
            out.reserve(n * unit);
        }
        for (i, iv) in ivs[..n].iter().enumerate() {
            let at = i * unit..(i + 1) * unit;
            // Input and output of this sector: bounds-checked sub-slices,
            // each exactly `unit` bytes long.
            let (inp, outp): (*const u8, *mut u8) = match &mut io {
                XtsIo::InPlace(b) => {
                    let p = b[at].as_mut_ptr();
                    (p.cast_const(), p)
                }
                XtsIo::To(s, d) => (s[at.clone()].as_ptr(), d[at].as_mut_ptr()),
                XtsIo::Append(s, out) => (
                    s[at].as_ptr(),
                    out.spare_capacity_mut()[..unit].as_mut_ptr().cast::<u8>(),
                ),
            };
            let mut outl: std::ffi::c_int = 0;
            // SAFETY: `ctx` is an initialised, keyed XTS context owned by
            // `pair` (nobody else uses it until it goes back to the pool);
            // with a null cipher, engine and key OpenSSL keeps the cipher and
            // key and only reads the 16 bytes of `iv` (the XTS IV length).
            let init_ok = unsafe {
                openssl_sys::EVP_CipherInit_ex(
                    ctx.as_ptr(),
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    iv.as_ptr(),
                    enc,
                )
            } == 1;
            // SAFETY: `inp` points to `unit` readable bytes and `outp` to
            // `unit` writable bytes (the sub-slices above; for Append, spare
            // capacity reserved for all `n` sectors, of which each sector
            // takes exactly `unit`). XTS has EVP block size 1 and no
            // padding, so OpenSSL writes exactly `inl` bytes for `inl` bytes
            // of input and nothing beyond. They are either the same pointer
            // (in place, which OpenSSL allows) or do not overlap (`src` is
            // borrowed shared while the destination is borrowed exclusively).
            let ok = init_ok
                && unsafe {
                    openssl_sys::EVP_CipherUpdate(ctx.as_ptr(), outp, &mut outl, inp, inl)
                } == 1
                && outl == inl;
            if !ok {
                // Clear this thread's OpenSSL error queue; drop the pair
                // (its state is unknown).
                drop(openssl::error::ErrorStack::get());
                return i;
            }
            if let XtsIo::Append(_, out) = &mut io {
                // SAFETY: OpenSSL initialised exactly the `unit` bytes after
                // the current length (outl == inl == unit), inside capacity.
                unsafe { out.set_len(out.len() + unit) };
            }
        }
        self.pool_put(pair);
        n
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
            self.xts_sectors(dir, XtsIo::Append(src, out), unit, ivs)
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
