//! The 256-bit XTS kernels of [`super::aesni::XtsAesni`]: VAES rounds on two
//! blocks per instruction (AVX2 registers), 16 blocks in flight per step.
//! Where the CPU has VAES (Zen 3 and later, Ice Lake and later) this doubles
//! the AES throughput of the 128-bit AES-NI kernel, whose tweak batching it
//! keeps, so 512-byte sectors stay as fast as 4096-byte ones.
//!
//! ```text
//!   per 64 sectors: T0 = E(key2, iv), two IVs per vaesenc (the 128-bit
//!                   kernel encrypts them one block per instruction)
//!   per sector: tw[j] = [T0·α^2j, T0·α^(2j+1)]  j = 0..8
//!               (r0 = [T0, T0·α]; r1..r3 = r0·α^2,4,6; r4..r7 = r0..r3·α^8)
//!   per 16 blocks (8 registers of two):
//!     C      = vaesenclast(vaesenc…(P ^ tw ^ rk0), rk_last ^ tw)
//!     tw[j] ← tw[j]·α^16, or the next sector's tw, computed before the
//!             rounds above (off their critical path)
//! ```
//!
//! Multiplying both lanes by α^k shifts each lane up by k bits and folds
//! the k bits leaving the top back with one carry-less multiplication by
//! 0x87 (VPCLMULQDQ): for k = 8 and 16 a byte shift, four instructions;
//! for k < 8 a shift of each qword and the carry between them, six. (The
//! first version used shifts and XORs for the fold, eleven instructions
//! for every one of 8 registers per step, and ran 4096-byte sectors about
//! a quarter slower.)
//! Units that are not whole groups of 16 blocks go to the 128-bit kernel.
//!
//! Unsafe like `aesni.rs` (the crate's `deny(unsafe_code)` is lifted here):
//! `#[target_feature]` functions over raw pointers from checked slices.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::aesni::{mul_alpha, Schedule};

/// Blocks per step: eight 256-bit registers of two blocks.
pub(super) const WIDE: usize = 16;

/// Sectors whose first tweaks are computed before their data: groups of
/// [`WIDE`] IVs encrypted back to back, so the 14-round latency of each
/// group (which the first data step waits for) is paid once per 64
/// sectors, not once per 16.
const TWEAKS_AHEAD: usize = 4 * WIDE;

/// Whether this CPU runs the kernels here (VAES with AVX2, VPCLMULQDQ for
/// the tweak steps, and AES-NI for the key schedule around them). Every
/// CPU with VAES has VPCLMULQDQ (both came with Ice Lake and Zen 3).
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("vaes")
        && std::arch::is_x86_feature_detected!("vpclmulqdq")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("aes")
}

/// Both 128-bit lanes of `t` multiplied by α^(8·$bytes): a byte shift up,
/// and the `$bytes` bytes leaving the top folded back with one carry-less
/// multiplication by 0x87 (`poly` holds 0x87 in each lane's low qword).
/// Four instructions against `mul_alpha_k`'s eleven.
macro_rules! mul_alpha_bytes {
    ($name:ident, $bytes:literal, $down:literal) => {
        #[inline(always)]
        unsafe fn $name(t: __m256i, poly: __m256i) -> __m256i {
            let top = _mm256_bsrli_epi128::<$down>(t);
            let up = _mm256_bslli_epi128::<$bytes>(t);
            _mm256_xor_si256(up, _mm256_clmulepi64_epi128::<0x00>(top, poly))
        }
    };
}

mul_alpha_bytes!(mul_alpha_8, 1, 15);
mul_alpha_bytes!(mul_alpha_16, 2, 14);

/// Both 128-bit lanes of `t` multiplied by α^K, 1 ≤ K < 64: each qword
/// shifted up, the carry of the low one moved into the high one, the bits
/// leaving the top reduced with one carry-less multiplication by 0x87.
/// Six instructions against `mul_alpha_k`'s eleven.
#[inline(always)]
unsafe fn mul_alpha_bits<const K: i32, const DOWN: i32>(t: __m256i, poly: __m256i) -> __m256i {
    let up = _mm256_slli_epi64::<K>(t);
    // Per lane: qword 0 the bits leaving the top, qword 1 the carry.
    let out = _mm256_shuffle_epi32::<0x4E>(_mm256_srli_epi64::<DOWN>(t));
    let reduced = _mm256_clmulepi64_epi128::<0x00>(out, poly);
    _mm256_xor_si256(up, _mm256_blend_epi32::<0b1100_1100>(reduced, out))
}

/// The 16 tweaks of a sector's first step from its encrypted IV `t0`:
/// register `j` holds `[T·α^(2j), T·α^(2j+1)]`.
#[inline(always)]
unsafe fn sector_tweaks(t0: &[u8; 16], poly: __m256i) -> [__m256i; WIDE / 2] {
    let t0 = _mm_loadu_si128(t0.as_ptr().cast());
    let r0 = _mm256_set_m128i(mul_alpha(t0), t0);
    let r1 = mul_alpha_bits::<2, 62>(r0, poly);
    let r2 = mul_alpha_bits::<4, 60>(r0, poly);
    let r3 = mul_alpha_bits::<6, 58>(r0, poly);
    [
        r0,
        r1,
        r2,
        r3,
        mul_alpha_8(r0, poly),
        mul_alpha_8(r1, poly),
        mul_alpha_8(r2, poly),
        mul_alpha_8(r3, poly),
    ]
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
    out: &mut [[u8; 16]],
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
        _mm256_storeu_si256(out[2 * j..2 * j + 2].as_mut_ptr().cast(), c);
    }
}

macro_rules! vaes_kernel {
    ($name:ident, $round:ident, $last:ident) => {
        /// The XTS body for `ivs.len()` sectors of `unit` bytes, sector
        /// `i` with the IV `ivs[i]`: the IVs of each [`TWEAKS_AHEAD`]
        /// sectors encrypted with `tweak` in one batch, then their blocks with
        /// `s` (the data key's schedule for this direction). Each step
        /// computes the next step's tweaks (the next sector's first ones
        /// at a sector's end) before its own rounds, off their path.
        ///
        /// # Safety
        /// VAES, VPCLMULQDQ, AVX2 and AES-NI present ([`available`]);
        /// `src` readable and `dst` writable for `ivs.len() * unit` bytes,
        /// equal or not overlapping; `unit` a multiple of `16 * WIDE`.
        #[target_feature(enable = "aes,avx2,vaes,vpclmulqdq")]
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
            let poly = _mm256_set_epi64x(0, 0x87, 0, 0x87);
            let steps = unit / (16 * WIDE);
            let mut first = [[0u8; 16]; TWEAKS_AHEAD];
            for batch in ivs.chunks(TWEAKS_AHEAD) {
                // Independent groups back to back: their latencies overlap.
                for (g, out) in batch.chunks(WIDE).zip(first.chunks_exact_mut(WIDE)) {
                    if g.len() <= WIDE / 2 {
                        encrypt_ivs::<{ WIDE / 4 }>(&tk, tweak.rounds, g, out);
                    } else {
                        encrypt_ivs::<{ WIDE / 2 }>(&tk, tweak.rounds, g, out);
                    }
                }
                let mut tw = sector_tweaks(&first[0], poly);
                for i in 0..batch.len() {
                    for step in 0..steps {
                        let mut x = [_mm256_setzero_si256(); WIDE / 2];
                        let mut last = [_mm256_setzero_si256(); WIDE / 2];
                        for j in 0..WIDE / 2 {
                            let p = _mm256_loadu_si256(src.add(32 * j).cast());
                            x[j] = _mm256_xor_si256(_mm256_xor_si256(p, tw[j]), wk[0]);
                            last[j] = _mm256_xor_si256(wk[nr], tw[j]);
                        }
                        if step + 1 < steps {
                            for t in tw.iter_mut() {
                                *t = mul_alpha_16(*t, poly);
                            }
                        } else if i + 1 < batch.len() {
                            tw = sector_tweaks(&first[i + 1], poly);
                        }
                        for k in &wk[1..nr] {
                            for x in x.iter_mut() {
                                *x = $round(*x, *k);
                            }
                        }
                        for j in 0..WIDE / 2 {
                            let c = $last(x[j], last[j]);
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
            testutil::skip_kernel(
                "vaes::lane_multiplication",
                "this CPU has no VAES/VPCLMULQDQ/AVX2",
            );
            return;
        }
        let samples = [
            u128::MAX,
            1u128 << 127,
            0x8000_0000_0000_0000_8000_0000_0000_0000,
            0xfedc_ba98_7654_3210_0123_4567_89ab_cdef,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ];
        #[target_feature(enable = "avx2,vpclmulqdq")]
        unsafe fn powers(a: u128, b: u128) -> [[u128; 2]; 5] {
            let v = _mm256_loadu_si256([a, b].as_ptr().cast());
            let poly = _mm256_set_epi64x(0, 0x87, 0, 0x87);
            let r = [
                mul_alpha_bits::<2, 62>(v, poly),
                mul_alpha_bits::<4, 60>(v, poly),
                mul_alpha_bits::<6, 58>(v, poly),
                mul_alpha_8(v, poly),
                mul_alpha_16(v, poly),
            ];
            let mut out = [[0u128; 2]; 5];
            for (o, r) in out.iter_mut().zip(r) {
                _mm256_storeu_si256(o.as_mut_ptr().cast(), r);
            }
            out
        }
        #[target_feature(enable = "avx2,vpclmulqdq")]
        unsafe fn first_step(t: u128) -> [u128; 16] {
            let poly = _mm256_set_epi64x(0, 0x87, 0, 0x87);
            let mut out = [0u128; 16];
            for (j, r) in sector_tweaks(&t.to_le_bytes(), poly).iter().enumerate() {
                _mm256_storeu_si256(out[2 * j..].as_mut_ptr().cast(), *r);
            }
            out
        }
        for (a, b) in samples.iter().zip(samples.iter().rev()) {
            // SAFETY: AVX2 and VPCLMULQDQ present (checked by `available`).
            let got = unsafe { powers(*a, *b) };
            for (k, got) in [2, 4, 6, 8, 16].into_iter().zip(got) {
                assert_eq!(got, [serial(*a, k), serial(*b, k)], "α^{k}");
            }
            // SAFETY: as above.
            let got = unsafe { first_step(*a) };
            let want: Vec<u128> = (0..16).map(|i| serial(*a, i)).collect();
            assert_eq!(got[..], want[..], "a sector's first 16 tweaks");
        }
    }
}
