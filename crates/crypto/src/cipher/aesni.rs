//! AES-XTS over many sectors in one call with AES-NI: the fast path for
//! small sectors. OpenSSL's XTS is keyed once but pays, for every sector,
//! an EVP re-initialisation with the IV, a dispatch through the provider and
//! a serial AES of that IV before the first data block; at 512-byte sectors
//! that overhead is more than half the time of the 32 data blocks. Here:
//!
//! ```text
//!   ivs of up to 64 sectors ──E(key2), 8 blocks at a time──▶ first tweak per sector
//!   per sector, 8 blocks at a time (every dm-crypt sector is a multiple of 8 blocks):
//!     T[i+1] = T[i]·alpha                         (SSE2: shift, carry, 0x87)
//!     C[i]   = aesenclast(aesenc…(P[i] ^ T[i] ^ rk0), rk_last ^ T[i])
//! ```
//!
//! The tweak XOR is folded into the first and last round keys, as OpenSSL's
//! `aesni_xts_encrypt` does, so a 512-byte sector costs what its blocks
//! cost inside a 4096-byte one. Round keys come from a plain software key
//! expansion (FIPS-197 §5.2) and `aesimc` for the decryption schedule.
//! `XtsAesni::new` proves the result equal to the Rust XTS before it is
//! chosen; `cipher::new_mode` picks it only when the CPU has AES-NI. Where
//! the CPU also has VAES, [`XtsAesni::new_wide`] runs the same scheme two
//! blocks per instruction (`vaes.rs`) for sectors of whole 256-byte groups.
//!
//! The crate's second unsafe module (fenced with `#[allow(unsafe_code)]`
//! under the crate's `deny`): the kernels are `#[target_feature]` functions
//! reading and writing through raw pointers derived from bounds-checked
//! slices.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use zeroize::Zeroize;

use super::{vaes, Dir, SectorCipher, AESNI_XTS_NAME, VAES_XTS_NAME};

/// Sectors whose first tweaks are computed in one batch.
const SECTOR_BATCH: usize = 16;

/// Blocks converted per inner step (interleaved to fill the AES pipeline).
const WIDTH: usize = 8;

/// Round keys as bytes in memory order (what `aesenc` expects), at most 15.
#[derive(Clone)]
pub(super) struct Schedule {
    pub(super) keys: [[u8; 16]; 15],
    pub(super) rounds: usize,
}

impl Drop for Schedule {
    fn drop(&mut self) {
        self.keys.zeroize();
    }
}

/// XTS with AES-NI: data key schedules (encrypt, decrypt) and tweak key,
/// with the Rust XTS for sector sizes it does not take.
pub(crate) struct XtsAesni {
    enc: Schedule,
    dec: Schedule,
    tweak: Schedule,
    /// The VAES kernels run whole 256-byte groups (checked present).
    wide: bool,
    fallback: Box<dyn SectorCipher>,
}

impl XtsAesni {
    /// `key` = data key || tweak key (32, 48 or 64 bytes); `None` without
    /// AES-NI, for another key length, or if it disagrees with `fallback`
    /// (the Rust XTS of the same key) on a test run.
    pub(crate) fn new(key: &[u8], fallback: Box<dyn SectorCipher>) -> Option<Self> {
        Self::build(key, fallback, false)
    }

    /// Like [`XtsAesni::new`] with the VAES kernels for sectors of whole
    /// 256-byte groups; `None` also where the CPU has no VAES/VPCLMULQDQ/AVX2.
    pub(crate) fn new_wide(key: &[u8], fallback: Box<dyn SectorCipher>) -> Option<Self> {
        if !vaes::available() {
            return None;
        }
        Self::build(key, fallback, true)
    }

    fn build(key: &[u8], fallback: Box<dyn SectorCipher>, wide: bool) -> Option<Self> {
        if !std::arch::is_x86_feature_detected!("aes") || key.len() % 2 != 0 {
            return None;
        }
        let (k1, k2) = key.split_at(key.len() / 2);
        let enc = expand(k1)?;
        // SAFETY: AES-NI is present (checked above).
        let dec = unsafe { inverse_schedule(&enc) };
        let me = Self {
            enc,
            dec,
            tweak: expand(k2)?,
            wide,
            fallback,
        };
        // Prove it against the Rust XTS before choosing it: 17 sectors
        // (more than one tweak batch of 16), every output path, with
        // 128-byte units (the 128-bit kernel) and 512-byte ones (the wide
        // kernel where chosen).
        let ivs: Vec<[u8; 16]> = (0..17u8).map(|i| [i.wrapping_mul(37) ^ 0x5a; 16]).collect();
        for unit in [128, 512] {
            let plain: Vec<u8> = (0..17 * unit).map(|i| (i * 7 + 1) as u8).collect();
            for dir in [Dir::Encrypt, Dir::Decrypt] {
                let mut want = plain.clone();
                me.fallback.crypt_run(dir, &mut want, unit, &ivs);
                let mut a = plain.clone();
                me.crypt_run(dir, &mut a, unit, &ivs);
                let mut b = vec![0u8; plain.len()];
                me.crypt_run_to(dir, &plain, &mut b, unit, &ivs);
                let mut c = vec![3u8];
                me.crypt_run_append(dir, &plain, &mut c, unit, &ivs);
                if a != want || b != want || c[0] != 3 || c[1..] != want[..] {
                    return None;
                }
            }
        }
        Some(me)
    }

    /// Converts `n` sectors of `unit` bytes from `src` to `dst` (the same
    /// pointer for in place), sector `i` with `ivs[i]`.
    ///
    /// # Safety
    /// `src` must be valid for reading and `dst` for writing `n * unit`
    /// bytes; they are either equal or do not overlap; `unit` is a multiple
    /// of 128 bytes; `ivs.len() >= n`.
    unsafe fn run_raw(
        &self,
        dir: Dir,
        src: *const u8,
        dst: *mut u8,
        n: usize,
        unit: usize,
        ivs: &[[u8; 16]],
    ) {
        if self.wide && unit % (16 * vaes::WIDE) == 0 {
            // SAFETY: `new_wide` checked VAES/VPCLMULQDQ/AVX2/AES-NI; the unit is
            // whole 256-byte groups (just checked); the caller's contract
            // covers the pointers for `n` sectors. The kernel encrypts
            // the IVs itself, 16 at a time with VAES.
            let ivs = &ivs[..n];
            return match dir {
                Dir::Encrypt => vaes::xts_encrypt(&self.enc, &self.tweak, src, dst, ivs, unit),
                Dir::Decrypt => vaes::xts_decrypt(&self.dec, &self.tweak, src, dst, ivs, unit),
            };
        }
        let mut first = [[0u8; 16]; SECTOR_BATCH];
        let mut done = 0;
        while done < n {
            let k = (n - done).min(SECTOR_BATCH);
            first[..k].copy_from_slice(&ivs[done..done + k]);
            ecb_encrypt(&self.tweak, &mut first[..k]);
            let off = done * unit;
            let (s, d, f) = (src.add(off), dst.add(off), &first[..k]);
            match dir {
                Dir::Encrypt => xts_encrypt(&self.enc, s, d, f, unit),
                Dir::Decrypt => xts_decrypt(&self.dec, s, d, f, unit),
            }
            done += k;
        }
    }

    /// Whether this implementation handles `unit`-byte sectors (whole
    /// groups of [`WIDTH`] blocks; every dm-crypt sector size is).
    fn handles(unit: usize) -> bool {
        unit > 0 && unit % (16 * WIDTH) == 0
    }
}

impl SectorCipher for XtsAesni {
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        if !Self::handles(unit) {
            return self.fallback.crypt_run(dir, buf, unit, ivs);
        }
        let n = (buf.len() / unit).min(ivs.len());
        let p = buf[..n * unit].as_mut_ptr();
        // SAFETY: AES-NI was detected in `new`; `p` is valid for `n * unit`
        // bytes (a sub-slice of `buf`, borrowed exclusively), read and
        // written in place; `unit` is a multiple of 128 (checked above);
        // `ivs` holds at least `n` entries.
        unsafe { self.run_raw(dir, p.cast_const(), p, n, unit, ivs) }
    }

    fn crypt_run_to(&self, dir: Dir, src: &[u8], dst: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        assert_eq!(
            src.len(),
            dst.len(),
            "source and destination differ in length"
        );
        if !Self::handles(unit) {
            dst.copy_from_slice(src);
            return self.crypt_run(dir, dst, unit, ivs);
        }
        let n = (src.len() / unit).min(ivs.len());
        let s = src[..n * unit].as_ptr();
        let d = dst[..n * unit].as_mut_ptr();
        // SAFETY: AES-NI was detected in `new`; `s` is valid for reading
        // and `d` for writing `n * unit` bytes (sub-slices of `src` and
        // `dst`), which cannot overlap (`src` is borrowed shared, `dst`
        // exclusively); `unit` is a multiple of 128; `ivs.len() >= n`.
        unsafe { self.run_raw(dir, s, d, n, unit, ivs) }
    }

    fn crypt_run_append(
        &self,
        dir: Dir,
        src: &[u8],
        out: &mut Vec<u8>,
        unit: usize,
        ivs: &[[u8; 16]],
    ) {
        if !Self::handles(unit) {
            let base = out.len();
            out.extend_from_slice(src);
            return self.crypt_run(dir, &mut out[base..], unit, ivs);
        }
        let n = (src.len() / unit).min(ivs.len());
        let len = n * unit;
        out.reserve(len);
        let s = src[..len].as_ptr();
        let d = out.spare_capacity_mut()[..len].as_mut_ptr().cast::<u8>();
        // SAFETY: AES-NI was detected in `new`; `s` is valid for reading
        // `len` bytes; `d` for writing `len` bytes (spare capacity reserved
        // above), and they do not overlap (`src` is borrowed shared, `out`
        // exclusively); `unit` is a multiple of 128; `ivs.len() >= n`.
        unsafe { self.run_raw(dir, s, d, n, unit, ivs) };
        // SAFETY: `run_raw` wrote all `len` bytes after the current length,
        // inside the capacity reserved above.
        unsafe { out.set_len(out.len() + len) };
    }

    fn name(&self) -> &'static str {
        if self.wide {
            VAES_XTS_NAME
        } else {
            AESNI_XTS_NAME
        }
    }
}

/// The XTS multiplication by alpha on 8 tweaks at once is serial; this is
/// one step: shift each 64-bit half left by one and fold the two carries
/// (bit 63 into bit 64, bit 127 back as 0x87).
#[inline(always)]
pub(super) unsafe fn mul_alpha(t: __m128i) -> __m128i {
    let carry = _mm_shuffle_epi32::<0x13>(_mm_srai_epi32::<31>(t));
    let carry = _mm_and_si128(carry, _mm_set_epi32(0, 1, 0, 0x87));
    _mm_xor_si128(_mm_add_epi64(t, t), carry)
}

#[inline(always)]
pub(super) unsafe fn round_keys(s: &Schedule) -> [__m128i; 15] {
    let mut rk = [_mm_setzero_si128(); 15];
    for (r, k) in rk.iter_mut().zip(s.keys.iter()).take(s.rounds + 1) {
        *r = _mm_loadu_si128(k.as_ptr().cast());
    }
    rk
}

/// Encrypts 16-byte blocks in place, [`WIDTH`] at a time.
#[target_feature(enable = "aes")]
unsafe fn ecb_encrypt(s: &Schedule, blocks: &mut [[u8; 16]]) {
    let rk = round_keys(s);
    let nr = s.rounds;
    for group in blocks.chunks_mut(WIDTH) {
        let mut x = [_mm_setzero_si128(); WIDTH];
        for (x, b) in x.iter_mut().zip(group.iter()) {
            *x = _mm_xor_si128(_mm_loadu_si128(b.as_ptr().cast()), rk[0]);
        }
        for k in &rk[1..nr] {
            for x in x.iter_mut() {
                *x = _mm_aesenc_si128(*x, *k);
            }
        }
        for (x, b) in x.iter_mut().zip(group.iter_mut()) {
            _mm_storeu_si128(b.as_mut_ptr().cast(), _mm_aesenclast_si128(*x, rk[nr]));
        }
    }
}

macro_rules! xts_kernel {
    ($name:ident, $round:ident, $last:ident) => {
        /// The XTS body for `first.len()` sectors of `unit` bytes.
        ///
        /// # Safety
        /// AES-NI present; `src` readable and `dst` writable for
        /// `first.len() * unit` bytes, equal or not overlapping; `unit` a
        /// multiple of `16 * WIDTH`.
        #[target_feature(enable = "aes")]
        unsafe fn $name(
            s: &Schedule,
            mut src: *const u8,
            mut dst: *mut u8,
            first: &[[u8; 16]],
            unit: usize,
        ) {
            let rk = round_keys(s);
            let nr = s.rounds;
            for f in first {
                let mut t = _mm_loadu_si128(f.as_ptr().cast());
                for _ in 0..unit / (16 * WIDTH) {
                    let mut tw = [_mm_setzero_si128(); WIDTH];
                    let mut x = [_mm_setzero_si128(); WIDTH];
                    for i in 0..WIDTH {
                        tw[i] = t;
                        t = mul_alpha(t);
                        let p = _mm_loadu_si128(src.add(16 * i).cast());
                        x[i] = _mm_xor_si128(_mm_xor_si128(p, tw[i]), rk[0]);
                    }
                    for k in &rk[1..nr] {
                        for x in x.iter_mut() {
                            *x = $round(*x, *k);
                        }
                    }
                    for i in 0..WIDTH {
                        let c = $last(x[i], _mm_xor_si128(rk[nr], tw[i]));
                        _mm_storeu_si128(dst.add(16 * i).cast(), c);
                    }
                    src = src.add(16 * WIDTH);
                    dst = dst.add(16 * WIDTH);
                }
            }
        }
    };
}

xts_kernel!(xts_encrypt, _mm_aesenc_si128, _mm_aesenclast_si128);
xts_kernel!(xts_decrypt, _mm_aesdec_si128, _mm_aesdeclast_si128);

/// The decryption schedule of the equivalent inverse cipher: the round
/// keys in reverse order, the middle ones through InvMixColumns.
///
/// # Safety
/// AES-NI present.
#[target_feature(enable = "aes")]
unsafe fn inverse_schedule(e: &Schedule) -> Schedule {
    let nr = e.rounds;
    let mut d = Schedule {
        keys: [[0; 16]; 15],
        rounds: nr,
    };
    for r in 0..=nr {
        let k = _mm_loadu_si128(e.keys[nr - r].as_ptr().cast());
        let k = if r == 0 || r == nr {
            k
        } else {
            _mm_aesimc_si128(k)
        };
        _mm_storeu_si128(d.keys[r].as_mut_ptr().cast(), k);
    }
    d
}

/// FIPS-197 key expansion for a 16-, 24- or 32-byte key.
fn expand(key: &[u8]) -> Option<Schedule> {
    let nk = match key.len() {
        16 | 24 | 32 => key.len() / 4,
        _ => return None,
    };
    let rounds = nk + 6;
    let total = 4 * (rounds + 1);
    let mut w = [[0u8; 4]; 60];
    for (i, c) in key.chunks_exact(4).enumerate() {
        w[i].copy_from_slice(c);
    }
    let mut rcon = 1u8;
    for i in nk..total {
        let mut t = w[i - 1];
        if i % nk == 0 {
            t = [
                SBOX[t[1] as usize] ^ rcon,
                SBOX[t[2] as usize],
                SBOX[t[3] as usize],
                SBOX[t[0] as usize],
            ];
            rcon = xtime(rcon);
        } else if nk > 6 && i % nk == 4 {
            t = t.map(|b| SBOX[b as usize]);
        }
        for j in 0..4 {
            w[i][j] = w[i - nk][j] ^ t[j];
        }
    }
    let mut s = Schedule {
        keys: [[0; 16]; 15],
        rounds,
    };
    for (r, k) in s.keys.iter_mut().enumerate().take(rounds + 1) {
        for j in 0..4 {
            k[4 * j..4 * j + 4].copy_from_slice(&w[4 * r + j]);
        }
    }
    w.zeroize();
    Some(s)
}

/// Multiplication by x in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1.
const fn xtime(b: u8) -> u8 {
    (b << 1) ^ if b & 0x80 != 0 { 0x1b } else { 0 }
}

/// The AES S-box, computed: multiplicative inverse, then the affine map.
const SBOX: [u8; 256] = {
    let mut s = [0u8; 256];
    let mut x = 0usize;
    while x < 256 {
        // Inverse as x^254 by square-and-multiply in GF(2^8).
        let mut inv = 1u8;
        let mut base = x as u8;
        let mut e = 254u32;
        while e > 0 {
            if e & 1 == 1 {
                inv = gmul(inv, base);
            }
            base = gmul(base, base);
            e >>= 1;
        }
        let b = if x == 0 { 0 } else { inv };
        s[x] = b ^ b.rotate_left(1) ^ b.rotate_left(2) ^ b.rotate_left(3) ^ b.rotate_left(4) ^ 0x63;
        x += 1;
    }
    s
};

/// Multiplication in GF(2^8).
const fn gmul(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        a = xtime(a);
        b >>= 1;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::rust::XtsRust;

    /// The wide (VAES) and 128-bit kernels against the Rust XTS for every
    /// batch length up to two tweak batches (1..=SECTOR_BATCH*2+1 sectors),
    /// some around the wide kernel's 64 tweaks ahead, and
    /// units from 128 bytes (always the 128-bit kernel) to 4096.
    #[test]
    fn wide_and_narrow_kernels_match_rust_on_odd_batches() {
        if !std::arch::is_x86_feature_detected!("aes") {
            testutil::skip_kernel("aesni::odd_batches", "this CPU has no AES-NI");
            return;
        }
        for key_len in [32usize, 48, 64] {
            let key: Vec<u8> = (0..key_len as u8)
                .map(|i| i.wrapping_mul(73) ^ 0x1f)
                .collect();
            let rust = XtsRust::new(&key).unwrap();
            let mut impls =
                vec![XtsAesni::new(&key, Box::new(XtsRust::new(&key).unwrap())).unwrap()];
            if vaes::available() {
                let w = XtsAesni::new_wide(&key, Box::new(XtsRust::new(&key).unwrap())).unwrap();
                assert_eq!(w.name(), VAES_XTS_NAME);
                impls.push(w);
            } else {
                assert!(XtsAesni::new_wide(&key, Box::new(XtsRust::new(&key).unwrap())).is_none());
            }
            for unit in [128usize, 256, 384, 512, 1024, 2048, 4096] {
                // Every count up to two IV batches and one more (the
                // wide kernel encrypts ≤ 8 IVs in four registers, more in
                // eight, and odd counts leave a lane empty), and counts
                // around its 64 tweaks computed ahead.
                for n in (1usize..=33).chain([47, 63, 64, 65, 129]) {
                    let plain: Vec<u8> = (0..n * unit)
                        .map(|i| (i as u8).wrapping_mul(29) ^ (i >> 8) as u8)
                        .collect();
                    let ivs: Vec<[u8; 16]> = (0..n)
                        .map(|i| {
                            let mut iv = [0xffu8; 16];
                            iv[..8].copy_from_slice(&(u64::MAX - i as u64).to_le_bytes());
                            iv
                        })
                        .collect();
                    let mut want = plain.clone();
                    rust.crypt_run(Dir::Encrypt, &mut want, unit, &ivs);
                    for x in &impls {
                        let mut a = plain.clone();
                        x.crypt_run(Dir::Encrypt, &mut a, unit, &ivs);
                        assert!(a == want, "{} key {key_len} unit {unit} n {n}", x.name());
                        let mut b = vec![0u8; a.len()];
                        x.crypt_run_to(Dir::Decrypt, &a, &mut b, unit, &ivs);
                        assert!(b == plain, "{} decrypt unit {unit} n {n}", x.name());
                    }
                }
            }
        }
    }

    #[test]
    fn sbox_and_key_expansion_match_fips_197() {
        assert_eq!(
            (SBOX[0x00], SBOX[0x01], SBOX[0x53], SBOX[0xff]),
            (0x63, 0x7c, 0xed, 0x16)
        );
        // FIPS-197 Appendix A.1 (AES-128): last round key.
        let k = hex::decode("2b7e151628aed2a6abf7158809cf4f3c").unwrap();
        let s = expand(&k).unwrap();
        assert_eq!(hex::encode(s.keys[10]), "d014f9a8c9ee2589e13f0cc8b6630ca6");
        // A.3 (AES-256): last round key.
        let k = hex::decode("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
            .unwrap();
        let s = expand(&k).unwrap();
        assert_eq!(hex::encode(s.keys[14]), "fe4890d1e6188d0b046df344706c631e");
        // A.2 (AES-192): last round key.
        let k = hex::decode("8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b").unwrap();
        let s = expand(&k).unwrap();
        assert_eq!(hex::encode(s.keys[12]), "e98ba06f448c773c8ecc720401002202");
    }
}
