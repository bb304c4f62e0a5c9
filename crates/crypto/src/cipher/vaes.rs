//! The 256-bit XTS kernels of [`super::aesni::XtsAesni`]: VAES rounds on two
//! blocks per instruction (AVX2 registers), 16 blocks in flight per step.
//! Where the CPU has VAES (Zen 3 and later, Ice Lake and later) this doubles
//! the AES throughput of the 128-bit AES-NI kernel, whose tweak batching it
//! keeps, so 512-byte sectors stay as fast as 4096-byte ones.
//!
//! ```text
//!   per 16 sectors: T0 = E(key2, iv), two IVs per vaesenc (the 128-bit
//!                   kernel encrypts them one block per instruction)
//!   per sector: base = [T0, T0·α]               (one 128-bit mul_alpha)
//!   per 16 blocks (8 registers of two):
//!     tw[j] = base·α^(2j)   j = 0..8            (independent: depth one)
//!     base  = base·α^16                          (the only serial step)
//!     C     = vaesenclast(vaesenc…(P ^ tw ^ rk0), rk_last ^ tw)
//! ```
//!
//! Multiplying both lanes by α^k (k ≤ 16) is a 64-bit shift of each half,
//! the carry from the low half into the high one, and the bits shifted out
//! of the top folded back as `top·0x87 = top ^ top<<1 ^ top<<2 ^ top<<7`.
//! Units that are not whole groups of 16 blocks go to the 128-bit kernel.
//!
//! Unsafe like `aesni.rs` (the crate's `deny(unsafe_code)` is lifted here):
//! `#[target_feature]` functions over raw pointers from checked slices.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::aesni::{mul_alpha, Schedule};

/// Blocks per step: eight 256-bit registers of two blocks.
pub(super) const WIDE: usize = 16;

/// Whether this CPU runs the kernels here (VAES with AVX2, and AES-NI for
/// the tweak batch and key schedule around them).
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("vaes")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("aes")
}

/// Both 128-bit lanes of `t` multiplied by α^k in GF(2^128), 1 ≤ k ≤ 16.
#[inline(always)]
unsafe fn mul_alpha_k(t: __m256i, k: i32) -> __m256i {
    let shifted = _mm256_sll_epi64(t, _mm_cvtsi32_si128(k));
    let out = _mm256_srl_epi64(t, _mm_cvtsi32_si128(64 - k));
    // Per lane: qword 0 now holds the bits leaving the top (to reduce),
    // qword 1 those leaving the low half (carried into the high one).
    let out = _mm256_shuffle_epi32::<0x4E>(out);
    let reduced = _mm256_xor_si256(
        _mm256_xor_si256(out, _mm256_slli_epi64::<1>(out)),
        _mm256_xor_si256(_mm256_slli_epi64::<2>(out), _mm256_slli_epi64::<7>(out)),
    );
    let carry = _mm256_blend_epi32::<0b1100_1100>(reduced, out);
    _mm256_xor_si256(shifted, carry)
}

/// Round keys broadcast to both 128-bit lanes, written in place: built in
/// a returned array they went through two `memcpy` calls per kernel call,
/// ~3% of the time at 4 KiB per call.
#[inline(always)]
unsafe fn wide_keys(s: &Schedule, wk: &mut [__m256i; 15]) {
    for (w, k) in wk.iter_mut().zip(s.keys.iter()).take(s.rounds + 1) {
        *w = _mm256_broadcastsi128_si256(_mm_loadu_si128(k.as_ptr().cast()));
    }
}

/// The first tweaks of up to [`WIDE`] sectors: their IVs encrypted with
/// the tweak key, two per instruction, in `R` registers (`2 * R >=
/// ivs.len()`; the lanes past the IVs encrypt zeros and are ignored).
#[inline(always)]
unsafe fn encrypt_ivs<const R: usize>(
    tk: &[__m256i; 15],
    nr: usize,
    ivs: &[[u8; 16]],
    out: &mut [[u8; 16]; WIDE],
) {
    let mut x = [_mm256_setzero_si256(); R];
    for (j, x) in x.iter_mut().enumerate() {
        let v = match ivs.len().saturating_sub(2 * j) {
            0 => _mm256_setzero_si256(),
            1 => _mm256_set_m128i(
                _mm_setzero_si128(),
                _mm_loadu_si128(ivs[2 * j].as_ptr().cast()),
            ),
            _ => _mm256_loadu_si256(ivs[2 * j..].as_ptr().cast()),
        };
        *x = _mm256_xor_si256(v, tk[0]);
    }
    for k in &tk[1..nr] {
        for x in x.iter_mut() {
            *x = _mm256_aesenc_epi128(*x, *k);
        }
    }
    for (j, x) in x.iter().enumerate() {
        let c = _mm256_aesenclast_epi128(*x, tk[nr]);
        _mm256_storeu_si256(out[2 * j..].as_mut_ptr().cast(), c);
    }
}

macro_rules! vaes_kernel {
    ($name:ident, $round:ident, $last:ident) => {
        /// The XTS body for `ivs.len()` sectors of `unit` bytes, sector
        /// `i` with the IV `ivs[i]`: the IVs of each [`WIDE`] sectors
        /// encrypted with `tweak` in one batch, then their blocks with
        /// `s` (the data key's schedule for this direction).
        ///
        /// # Safety
        /// VAES, AVX2 and AES-NI present ([`available`]); `src` readable and
        /// `dst` writable for `ivs.len() * unit` bytes, equal or not
        /// overlapping; `unit` a multiple of `16 * WIDE`.
        #[target_feature(enable = "aes,avx2,vaes")]
        pub(super) unsafe fn $name(
            s: &Schedule,
            tweak: &Schedule,
            mut src: *const u8,
            mut dst: *mut u8,
            ivs: &[[u8; 16]],
            unit: usize,
        ) {
            let nr = s.rounds;
            let mut wk = [_mm256_setzero_si256(); 15];
            wide_keys(s, &mut wk);
            let mut tk = [_mm256_setzero_si256(); 15];
            wide_keys(tweak, &mut tk);
            let mut first = [[0u8; 16]; WIDE];
            for batch in ivs.chunks(WIDE) {
                if batch.len() <= WIDE / 2 {
                    encrypt_ivs::<{ WIDE / 4 }>(&tk, tweak.rounds, batch, &mut first);
                } else {
                    encrypt_ivs::<{ WIDE / 2 }>(&tk, tweak.rounds, batch, &mut first);
                }
                for f in &first[..batch.len()] {
                    let t0 = _mm_loadu_si128(f.as_ptr().cast());
                    let mut base = _mm256_set_m128i(mul_alpha(t0), t0);
                    for _ in 0..unit / (16 * WIDE) {
                        let mut tw = [base; WIDE / 2];
                        for (j, t) in tw.iter_mut().enumerate().skip(1) {
                            *t = mul_alpha_k(base, 2 * j as i32);
                        }
                        base = mul_alpha_k(base, WIDE as i32);
                        let mut x = [_mm256_setzero_si256(); WIDE / 2];
                        for j in 0..WIDE / 2 {
                            let p = _mm256_loadu_si256(src.add(32 * j).cast());
                            x[j] = _mm256_xor_si256(_mm256_xor_si256(p, tw[j]), wk[0]);
                        }
                        for k in &wk[1..nr] {
                            for x in x.iter_mut() {
                                *x = $round(*x, *k);
                            }
                        }
                        for j in 0..WIDE / 2 {
                            let c = $last(x[j], _mm256_xor_si256(wk[nr], tw[j]));
                            _mm256_storeu_si256(dst.add(32 * j).cast(), c);
                        }
                        src = src.add(16 * WIDE);
                        dst = dst.add(16 * WIDE);
                    }
                }
            }
        }
    };
}

vaes_kernel!(xts_encrypt, _mm256_aesenc_epi128, _mm256_aesenclast_epi128);
vaes_kernel!(xts_decrypt, _mm256_aesdec_epi128, _mm256_aesdeclast_epi128);

#[cfg(test)]
mod tests {
    use super::*;

    /// α^k one step at a time with the 128-bit helper, as a reference.
    fn serial(t: u128, k: u32) -> u128 {
        (0..k).fold(t, |t, _| (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 })
    }

    #[test]
    fn lane_multiplication_matches_repeated_doubling() {
        if !available() {
            testutil::skip_kernel("vaes::lane_multiplication", "this CPU has no VAES/AVX2");
            return;
        }
        let samples = [
            u128::MAX,
            1u128 << 127,
            0x8000_0000_0000_0000_8000_0000_0000_0000,
            0xfedc_ba98_7654_3210_0123_4567_89ab_cdef,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ];
        for (a, b) in samples.iter().zip(samples.iter().rev()) {
            for k in 1..=16 {
                #[target_feature(enable = "avx2")]
                unsafe fn run(a: u128, b: u128, k: i32) -> [u128; 2] {
                    let v = _mm256_loadu_si256([a, b].as_ptr().cast());
                    let mut out = [0u128; 2];
                    _mm256_storeu_si256(out.as_mut_ptr().cast(), mul_alpha_k(v, k));
                    out
                }
                // SAFETY: AVX2 present (checked by `available`).
                let got = unsafe { run(*a, *b, k as i32) };
                assert_eq!(got, [serial(*a, k), serial(*b, k)], "k = {k}");
            }
        }
    }
}
