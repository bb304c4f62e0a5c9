//! Serpent, bitsliced across blocks: each of the four 32-bit state words
//! of [`LANES`] blocks sits in one lane of a wide word, so every boolean
//! operation of the S-box circuits and the linear transform advances all
//! of those blocks at once (Serpent's S-boxes were designed for this).
//!
//! One generic kernel over a word type ([`Word`]), instantiated three
//! times: with AVX2 (`Avx2`: two 256-bit registers a word, 16 blocks a
//! pass) when the CPU has it, with SSE2 (`Sse2`: two 128-bit registers,
//! 8 blocks a pass; part of every x86-64) otherwise, and on plain `u32`s
//! (one block) for single blocks (CBC encryption, tails) and on other
//! architectures. Blocks enter and leave the lanes by a 4x4 transpose of
//! 32-bit words per 128-bit lane. (Plain arrays of lanes were not turned
//! into vector code by the compiler: they ran at half the scalar speed.)
//!
//! Hand-written: RustCrypto's `serpent` converts one block per call
//! (about 80 MiB/s in XTS here); no maintained crate converts several
//! blocks at once. The S-box circuits are Osvik's ("Speeding up Serpent",
//! 2000) as transcribed in RustCrypto's `serpent` 0.6 (MIT/Apache-2.0),
//! made generic over the word type; the key schedule follows the Serpent
//! specification (Anderson, Biham, Knudsen). `serpent` 0.6 stays the
//! reference in the tests.
//!
//! Unsafe code (fenced with `#[allow(unsafe_code)]` under the crate's
//! `deny`): the call of the AVX2-compiled kernel in `Serpent::run`, made
//! only where the CPU has AVX2; the AVX2 intrinsics behind `Avx2`'s
//! operators, whose values exist only inside that kernel; the SSE2
//! intrinsics behind `Sse2`'s (SSE2 is part of every x86-64); the
//! unaligned vector loads and stores of whole blocks.
#![allow(unsafe_code)]

use std::ops::{BitAndAssign, BitOrAssign, BitXor, BitXorAssign, Not};

use zeroize::Zeroize;

/// Blocks per pass of the AVX2 kernel.
pub(crate) const LANES: usize = 16;
/// Blocks per pass of the SSE2 kernel.
#[cfg(target_arch = "x86_64")]
const SSE2_LANES: usize = 8;

const ROUNDS: usize = 32;
const PHI: u32 = 0x9e37_79b9;

/// Serpent with its expanded key (33 round keys of four words).
pub(crate) struct Serpent {
    rk: [[u32; 4]; ROUNDS + 1],
    avx2: bool,
}

impl Drop for Serpent {
    fn drop(&mut self) {
        self.rk.zeroize();
    }
}

impl Serpent {
    /// Expands `key` (16, 24 or 32 bytes; Serpent pads shorter keys with a
    /// single 1 bit). `portable` keeps the baseline kernel even where AVX2
    /// is present (`UCRYPT_CRYPTO=rust`).
    pub(crate) fn new(key: &[u8], portable: bool) -> Option<Self> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return None;
        }
        let mut padded = [0u8; 32];
        padded[..key.len()].copy_from_slice(key);
        if key.len() < 32 {
            padded[key.len()] = 1;
        }
        let mut w = [0u32; 140];
        for (d, s) in w[..8].iter_mut().zip(padded.chunks_exact(4)) {
            *d = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
        padded.zeroize();
        for i in 0..132 {
            let j = i + 8;
            w[j] = (w[j - 8] ^ w[j - 5] ^ w[j - 3] ^ w[j - 1] ^ PHI ^ i as u32).rotate_left(11);
        }
        let mut rk = [[0u32; 4]; ROUNDS + 1];
        for (i, k) in rk.iter_mut().enumerate() {
            let p = [w[8 + 4 * i], w[9 + 4 * i], w[10 + 4 * i], w[11 + 4 * i]];
            // Round key i goes through S-box (3 - i) mod 8.
            *k = match (3 + 8 * ROUNDS - i) % 8 {
                0 => sbox_e0(p),
                1 => sbox_e1(p),
                2 => sbox_e2(p),
                3 => sbox_e3(p),
                4 => sbox_e4(p),
                5 => sbox_e5(p),
                6 => sbox_e6(p),
                _ => sbox_e7(p),
            };
        }
        w.zeroize();
        Some(Self {
            rk,
            avx2: !portable && avx2_available(),
        })
    }

    /// Whether the AVX2 kernel runs.
    pub(crate) fn wide(&self) -> bool {
        self.avx2
    }

    /// Encrypts `blocks` in place.
    pub(crate) fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.run(blocks, true);
    }

    /// Decrypts `blocks` in place.
    pub(crate) fn decrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        self.run(blocks, false);
    }

    fn run(&self, blocks: &mut [[u8; 16]], enc: bool) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 && blocks.len() >= LANES {
            // SAFETY: `avx2` is set only where `avx2_available()` found the
            // CPU to have AVX2, the one feature `run_avx2` is compiled for.
            let rest = unsafe { self.run_avx2(blocks, enc) };
            let done = blocks.len() - rest;
            return self.run_portable(&mut blocks[done..], enc);
        }
        self.run_portable(blocks, enc);
    }

    /// Runs whole passes of [`LANES`] blocks; returns how many blocks at
    /// the end were left.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn run_avx2(&self, blocks: &mut [[u8; 16]], enc: bool) -> usize {
        let mut chunks = blocks.chunks_exact_mut(LANES);
        for c in &mut chunks {
            if enc {
                encrypt::<x86::Avx2>(&self.rk, c);
            } else {
                decrypt::<x86::Avx2>(&self.rk, c);
            }
        }
        chunks.into_remainder().len()
    }

    fn run_portable(&self, blocks: &mut [[u8; 16]], enc: bool) {
        #[cfg(target_arch = "x86_64")]
        let blocks = {
            let mut chunks = blocks.chunks_exact_mut(SSE2_LANES);
            for c in &mut chunks {
                if enc {
                    encrypt::<x86::Sse2>(&self.rk, c);
                } else {
                    decrypt::<x86::Sse2>(&self.rk, c);
                }
            }
            chunks.into_remainder()
        };
        for b in blocks.chunks_exact_mut(1) {
            if enc {
                encrypt::<u32>(&self.rk, b);
            } else {
                decrypt::<u32>(&self.rk, b);
            }
        }
    }
}

/// The vector word types (x86-64 only).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::{BitAndAssign, BitOrAssign, BitXor, BitXorAssign, Not};

    use super::Word;

    /// One word of 16 blocks in two AVX2 registers (blocks 0..8, 8..16).
    /// Values exist only inside `Serpent::run_avx2`, which runs only where
    /// the CPU has AVX2: that is the safety argument of every intrinsic
    /// call below.
    #[derive(Clone, Copy)]
    pub(super) struct Avx2([__m256i; 2]);

    /// One word of 8 blocks in two SSE2 registers (blocks 0..4, 4..8).
    #[derive(Clone, Copy)]
    pub(super) struct Sse2([__m128i; 2]);

    /// Element-wise binary operators of a two-register word.
    macro_rules! binary {
        ($t:ident, $tr:ident, $f:ident, $op:ident) => {
            impl $tr for $t {
                #[inline(always)]
                fn $f(&mut self, o: Self) {
                    for (a, b) in self.0.iter_mut().zip(o.0) {
                        // SAFETY: the CPU has the instructions of `$t`: AVX2
                        // for `Avx2`, whose values exist only inside the
                        // AVX2 kernel (see its doc comment); SSE2 for `Sse2`,
                        // part of every x86-64.
                        *a = unsafe { $op(*a, b) };
                    }
                }
            }
        };
    }

    binary!(Avx2, BitXorAssign, bitxor_assign, _mm256_xor_si256);
    binary!(Avx2, BitAndAssign, bitand_assign, _mm256_and_si256);
    binary!(Avx2, BitOrAssign, bitor_assign, _mm256_or_si256);
    binary!(Sse2, BitXorAssign, bitxor_assign, _mm_xor_si128);
    binary!(Sse2, BitAndAssign, bitand_assign, _mm_and_si128);
    binary!(Sse2, BitOrAssign, bitor_assign, _mm_or_si128);

    impl BitXor for Avx2 {
        type Output = Self;
        #[inline(always)]
        fn bitxor(mut self, o: Self) -> Self {
            self ^= o;
            self
        }
    }

    impl BitXor for Sse2 {
        type Output = Self;
        #[inline(always)]
        fn bitxor(mut self, o: Self) -> Self {
            self ^= o;
            self
        }
    }

    impl Not for Avx2 {
        type Output = Self;
        #[inline(always)]
        fn not(self) -> Self {
            self ^ Self::splat(u32::MAX)
        }
    }

    impl Not for Sse2 {
        type Output = Self;
        #[inline(always)]
        fn not(self) -> Self {
            self ^ Self::splat(u32::MAX)
        }
    }

    impl Word for Avx2 {
        const N: usize = 16;
        #[inline(always)]
        fn splat(v: u32) -> Self {
            // SAFETY: see the type's doc comment.
            Self([unsafe { _mm256_set1_epi32(v as i32) }; 2])
        }
        #[inline(always)]
        fn rotl(self, n: u32) -> Self {
            self.shl(n) | self.shr(32 - n)
        }
        #[inline(always)]
        fn shl(self, n: u32) -> Self {
            // SAFETY: see the type's doc comment.
            Self(
                self.0
                    .map(|a| unsafe { _mm256_sll_epi32(a, _mm_cvtsi32_si128(n as i32)) }),
            )
        }
        #[inline(always)]
        fn load_words(blocks: &[[u8; 16]]) -> [Self; 4] {
            assert_eq!(blocks.len(), 16);
            let mut w = [[zero256(); 2]; 4];
            for (half, group) in blocks.chunks_exact(8).enumerate() {
                // Four registers of two blocks each (a 128-bit lane per
                // block), then a 4x4 transpose of 32-bit words per lane.
                let x = [0, 1, 2, 3].map(|i| {
                    let pair = &group[2 * i..2 * i + 2];
                    // SAFETY: `pair` is two contiguous 16-byte blocks, the
                    // 32 bytes an unaligned 256-bit load reads; AVX2 as in
                    // the type's doc comment.
                    unsafe { _mm256_loadu_si256(pair.as_ptr().cast()) }
                });
                // SAFETY: see the type's doc comment.
                let t = unsafe { transpose256(x) };
                for (w, t) in w.iter_mut().zip(t) {
                    w[half] = t;
                }
            }
            w.map(Self)
        }
        #[inline(always)]
        fn store_words(x: [Self; 4], blocks: &mut [[u8; 16]]) {
            assert_eq!(blocks.len(), 16);
            for (half, group) in blocks.chunks_exact_mut(8).enumerate() {
                // SAFETY: see the type's doc comment.
                let t = unsafe { transpose256(x.map(|w| w.0[half])) };
                for (i, v) in t.into_iter().enumerate() {
                    let pair = &mut group[2 * i..2 * i + 2];
                    // SAFETY: `pair` is two contiguous 16-byte blocks, the
                    // 32 bytes an unaligned 256-bit store writes; AVX2 as
                    // in the type's doc comment.
                    unsafe { _mm256_storeu_si256(pair.as_mut_ptr().cast(), v) };
                }
            }
        }
    }

    impl Avx2 {
        #[inline(always)]
        fn shr(self, n: u32) -> Self {
            // SAFETY: see the type's doc comment.
            Self(
                self.0
                    .map(|a| unsafe { _mm256_srl_epi32(a, _mm_cvtsi32_si128(n as i32)) }),
            )
        }
    }

    impl std::ops::BitOr for Avx2 {
        type Output = Self;
        #[inline(always)]
        fn bitor(mut self, o: Self) -> Self {
            self |= o;
            self
        }
    }

    impl std::ops::BitOr for Sse2 {
        type Output = Self;
        #[inline(always)]
        fn bitor(mut self, o: Self) -> Self {
            self |= o;
            self
        }
    }

    /// A zero register for array initialisers (never read).
    #[inline(always)]
    fn zero256() -> __m256i {
        // SAFETY: AVX2 as in `Avx2`'s doc comment (only its methods call this).
        unsafe { _mm256_setzero_si256() }
    }

    /// Transposes the 4x4 matrix of 32-bit words in each 128-bit lane of
    /// `x` (its own inverse).
    #[inline(always)]
    unsafe fn transpose256(x: [__m256i; 4]) -> [__m256i; 4] {
        // SAFETY: the caller runs on a CPU with AVX2 (this function's contract).
        unsafe {
            let t0 = _mm256_unpacklo_epi32(x[0], x[1]);
            let t1 = _mm256_unpackhi_epi32(x[0], x[1]);
            let t2 = _mm256_unpacklo_epi32(x[2], x[3]);
            let t3 = _mm256_unpackhi_epi32(x[2], x[3]);
            [
                _mm256_unpacklo_epi64(t0, t2),
                _mm256_unpackhi_epi64(t0, t2),
                _mm256_unpacklo_epi64(t1, t3),
                _mm256_unpackhi_epi64(t1, t3),
            ]
        }
    }

    /// [`transpose256`] on 128-bit registers.
    #[inline(always)]
    fn transpose128(x: [__m128i; 4]) -> [__m128i; 4] {
        // SAFETY: SSE2 is part of every x86-64 CPU.
        unsafe {
            let t0 = _mm_unpacklo_epi32(x[0], x[1]);
            let t1 = _mm_unpackhi_epi32(x[0], x[1]);
            let t2 = _mm_unpacklo_epi32(x[2], x[3]);
            let t3 = _mm_unpackhi_epi32(x[2], x[3]);
            [
                _mm_unpacklo_epi64(t0, t2),
                _mm_unpackhi_epi64(t0, t2),
                _mm_unpacklo_epi64(t1, t3),
                _mm_unpackhi_epi64(t1, t3),
            ]
        }
    }

    impl Word for Sse2 {
        const N: usize = 8;
        #[inline(always)]
        fn splat(v: u32) -> Self {
            // SAFETY: SSE2 is part of every x86-64 CPU.
            Self([unsafe { _mm_set1_epi32(v as i32) }; 2])
        }
        #[inline(always)]
        fn rotl(self, n: u32) -> Self {
            // SAFETY: SSE2 is part of every x86-64 CPU.
            unsafe {
                let l = _mm_cvtsi32_si128(n as i32);
                let r = _mm_cvtsi32_si128(32 - n as i32);
                Self(
                    self.0
                        .map(|a| _mm_or_si128(_mm_sll_epi32(a, l), _mm_srl_epi32(a, r))),
                )
            }
        }
        #[inline(always)]
        fn shl(self, n: u32) -> Self {
            // SAFETY: SSE2 is part of every x86-64 CPU.
            unsafe {
                let l = _mm_cvtsi32_si128(n as i32);
                Self(self.0.map(|a| _mm_sll_epi32(a, l)))
            }
        }
        #[inline(always)]
        fn load_words(blocks: &[[u8; 16]]) -> [Self; 4] {
            assert_eq!(blocks.len(), 8);
            // SAFETY: SSE2 is part of every x86-64 CPU.
            let mut w = [[unsafe { _mm_setzero_si128() }; 2]; 4];
            for (half, group) in blocks.chunks_exact(4).enumerate() {
                let x = [0, 1, 2, 3].map(|i| {
                    // SAFETY: one 16-byte block, the bytes an unaligned
                    // 128-bit load reads (SSE2 is part of x86-64).
                    unsafe { _mm_loadu_si128(group[i].as_ptr().cast()) }
                });
                for (w, t) in w.iter_mut().zip(transpose128(x)) {
                    w[half] = t;
                }
            }
            w.map(Self)
        }
        #[inline(always)]
        fn store_words(x: [Self; 4], blocks: &mut [[u8; 16]]) {
            assert_eq!(blocks.len(), 8);
            for (half, group) in blocks.chunks_exact_mut(4).enumerate() {
                let t = transpose128(x.map(|w| w.0[half]));
                for (b, v) in group.iter_mut().zip(t) {
                    // SAFETY: one 16-byte block, the bytes an unaligned
                    // 128-bit store writes (SSE2 is part of x86-64).
                    unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) };
                }
            }
        }
    }
}

/// Whether the AVX2 kernel can run here.
fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One 32-bit word of as many blocks as the type has lanes.
trait Word:
    Copy + BitXor<Output = Self> + BitXorAssign + BitAndAssign + BitOrAssign + Not<Output = Self>
{
    /// Blocks per word.
    const N: usize;
    fn splat(v: u32) -> Self;
    fn rotl(self, n: u32) -> Self;
    fn shl(self, n: u32) -> Self;
    /// The four words of `Self::N` blocks.
    fn load_words(blocks: &[[u8; 16]]) -> [Self; 4];
    fn store_words(x: [Self; 4], blocks: &mut [[u8; 16]]);
}

impl Word for u32 {
    const N: usize = 1;
    #[inline(always)]
    fn splat(v: u32) -> Self {
        v
    }
    #[inline(always)]
    fn rotl(self, n: u32) -> Self {
        self.rotate_left(n)
    }
    #[inline(always)]
    fn shl(self, n: u32) -> Self {
        self << n
    }
    #[inline(always)]
    fn load_words(blocks: &[[u8; 16]]) -> [Self; 4] {
        let b = &blocks[0];
        [0, 1, 2, 3]
            .map(|w| u32::from_le_bytes([b[4 * w], b[4 * w + 1], b[4 * w + 2], b[4 * w + 3]]))
    }
    #[inline(always)]
    fn store_words(x: [Self; 4], blocks: &mut [[u8; 16]]) {
        for (d, w) in blocks[0].chunks_exact_mut(4).zip(x) {
            d.copy_from_slice(&w.to_le_bytes());
        }
    }
}

#[inline(always)]
fn load<W: Word>(blocks: &[[u8; 16]]) -> [W; 4] {
    debug_assert_eq!(blocks.len(), W::N);
    W::load_words(blocks)
}

#[inline(always)]
fn store<W: Word>(x: [W; 4], blocks: &mut [[u8; 16]]) {
    W::store_words(x, blocks);
}

#[inline(always)]
fn key<W: Word>(mut x: [W; 4], k: &[u32; 4]) -> [W; 4] {
    for (v, k) in x.iter_mut().zip(k) {
        *v ^= W::splat(*k);
    }
    x
}

#[inline(always)]
fn lt<W: Word>([mut a, mut b, mut c, mut d]: [W; 4]) -> [W; 4] {
    a = a.rotl(13);
    c = c.rotl(3);
    b ^= a ^ c;
    d ^= c ^ a.shl(3);
    b = b.rotl(1);
    d = d.rotl(7);
    a ^= b ^ d;
    c ^= d ^ b.shl(7);
    a = a.rotl(5);
    c = c.rotl(22);
    [a, b, c, d]
}

#[inline(always)]
fn lt_inv<W: Word>([mut a, mut b, mut c, mut d]: [W; 4]) -> [W; 4] {
    c = c.rotl(32 - 22);
    a = a.rotl(32 - 5);
    c ^= d ^ b.shl(7);
    a ^= b ^ d;
    d = d.rotl(32 - 7);
    b = b.rotl(32 - 1);
    d ^= c ^ a.shl(3);
    b ^= a ^ c;
    c = c.rotl(32 - 3);
    a = a.rotl(32 - 13);
    [a, b, c, d]
}

/// Encrypts `W::N` blocks.
#[inline(always)]
fn encrypt<W: Word>(rk: &[[u32; 4]; ROUNDS + 1], blocks: &mut [[u8; 16]]) {
    let mut x: [W; 4] = load(blocks);
    for r in (0..ROUNDS).step_by(8) {
        x = lt(sbox_e0(key(x, &rk[r])));
        x = lt(sbox_e1(key(x, &rk[r + 1])));
        x = lt(sbox_e2(key(x, &rk[r + 2])));
        x = lt(sbox_e3(key(x, &rk[r + 3])));
        x = lt(sbox_e4(key(x, &rk[r + 4])));
        x = lt(sbox_e5(key(x, &rk[r + 5])));
        x = lt(sbox_e6(key(x, &rk[r + 6])));
        x = sbox_e7(key(x, &rk[r + 7]));
        if r + 8 < ROUNDS {
            x = lt(x);
        }
    }
    x = key(x, &rk[ROUNDS]);
    store(x, blocks);
}

/// Decrypts `W::N` blocks.
#[inline(always)]
fn decrypt<W: Word>(rk: &[[u32; 4]; ROUNDS + 1], blocks: &mut [[u8; 16]]) {
    let mut x: [W; 4] = load(blocks);
    x = key(x, &rk[ROUNDS]);
    for r in (0..ROUNDS).step_by(8).rev() {
        if r + 8 < ROUNDS {
            x = lt_inv(x);
        }
        x = key(sbox_d7(x), &rk[r + 7]);
        x = key(sbox_d6(lt_inv(x)), &rk[r + 6]);
        x = key(sbox_d5(lt_inv(x)), &rk[r + 5]);
        x = key(sbox_d4(lt_inv(x)), &rk[r + 4]);
        x = key(sbox_d3(lt_inv(x)), &rk[r + 3]);
        x = key(sbox_d2(lt_inv(x)), &rk[r + 2]);
        x = key(sbox_d1(lt_inv(x)), &rk[r + 1]);
        x = key(sbox_d0(lt_inv(x)), &rk[r]);
    }
    store(x, blocks);
}

// Osvik's S-box circuits (encryption e0..e7, decryption d0..d7); each
// returns its outputs in Serpent's word order.

#[inline(always)]
fn sbox_e0<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w4 ^= w1;
    let mut t0 = w2;
    w2 &= w4;
    t0 ^= w3;
    w2 ^= w1;
    w1 |= w4;
    w1 ^= t0;
    t0 ^= w4;
    w4 ^= w3;
    w3 |= w2;
    w3 ^= t0;
    t0 = !t0;
    t0 |= w2;
    w2 ^= w4;
    w2 ^= t0;
    w4 |= w1;
    w2 ^= w4;
    t0 ^= w4;
    [w2, t0, w3, w1]
}

#[inline(always)]
fn sbox_e1<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w1 = !w1;
    w3 = !w3;
    let mut t0 = w1;
    w1 &= w2;
    w3 ^= w1;
    w1 |= w4;
    w4 ^= w3;
    w2 ^= w1;
    w1 ^= t0;
    t0 |= w2;
    w2 ^= w4;
    w3 |= w1;
    w3 &= t0;
    w1 ^= w2;
    w2 &= w3;
    w2 ^= w1;
    w1 &= w3;
    t0 ^= w1;
    [w3, t0, w4, w2]
}

#[inline(always)]
fn sbox_e2<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w1;
    w1 &= w3;
    w1 ^= w4;
    w3 ^= w2;
    w3 ^= w1;
    w4 |= t0;
    w4 ^= w2;
    t0 ^= w3;
    w2 = w4;
    w4 |= t0;
    w4 ^= w1;
    w1 &= w2;
    t0 ^= w1;
    w2 ^= w4;
    w2 ^= t0;
    t0 = !t0;
    [w3, w4, w2, t0]
}

#[inline(always)]
fn sbox_e3<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w1;
    w1 |= w4;
    w4 ^= w2;
    w2 &= t0;
    t0 ^= w3;
    w3 ^= w4;
    w4 &= w1;
    t0 |= w2;
    w4 ^= t0;
    w1 ^= w2;
    t0 &= w1;
    w2 ^= w4;
    t0 ^= w3;
    w2 |= w1;
    w2 ^= w3;
    w1 ^= w4;
    w3 = w2;
    w2 |= w4;
    w1 ^= w2;
    [w1, w3, w4, t0]
}

#[inline(always)]
fn sbox_e4<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w2 ^= w4;
    w4 = !w4;
    w3 ^= w4;
    w4 ^= w1;
    let mut t0 = w2;
    w2 &= w4;
    w2 ^= w3;
    t0 ^= w4;
    w1 ^= t0;
    w3 &= t0;
    w3 ^= w1;
    w1 &= w2;
    w4 ^= w1;
    t0 |= w2;
    t0 ^= w1;
    w1 |= w4;
    w1 ^= w3;
    w3 &= w4;
    w1 = !w1;
    t0 ^= w3;
    [w2, t0, w1, w4]
}

#[inline(always)]
fn sbox_e5<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w1 ^= w2;
    w2 ^= w4;
    w4 = !w4;
    let mut t0 = w2;
    w2 &= w1;
    w3 ^= w4;
    w2 ^= w3;
    w3 |= t0;
    t0 ^= w4;
    w4 &= w2;
    w4 ^= w1;
    t0 ^= w2;
    t0 ^= w3;
    w3 ^= w1;
    w1 &= w4;
    w3 = !w3;
    w1 ^= t0;
    t0 |= w4;
    t0 ^= w3;
    w3 = w1;
    w1 = w2;
    w2 = w4;
    w4 = t0;
    [w1, w2, w3, w4]
}

#[inline(always)]
fn sbox_e6<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w3 = !w3;
    let mut t0 = w4;
    w4 &= w1;
    w1 ^= t0;
    w4 ^= w3;
    w3 |= t0;
    w2 ^= w4;
    w3 ^= w1;
    w1 |= w2;
    w3 ^= w2;
    t0 ^= w1;
    w1 |= w4;
    w1 ^= w3;
    t0 ^= w4;
    t0 ^= w1;
    w4 = !w4;
    w3 &= t0;
    w4 ^= w3;
    w3 = t0;
    [w1, w2, w3, w4]
}

#[inline(always)]
fn sbox_e7<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w2;
    w2 |= w3;
    w2 ^= w4;
    t0 ^= w3;
    w3 ^= w2;
    w4 |= t0;
    w4 &= w1;
    t0 ^= w3;
    w4 ^= w2;
    w2 |= t0;
    w2 ^= w1;
    w1 |= t0;
    w1 ^= w3;
    w2 ^= t0;
    w3 ^= w2;
    w2 &= w1;
    w2 ^= t0;
    w3 = !w3;
    w3 |= w1;
    t0 ^= w3;
    [t0, w4, w2, w1]
}

#[inline(always)]
fn sbox_d0<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w3 = !w3;
    let mut t0 = w2;
    w2 |= w1;
    t0 = !t0;
    w2 ^= w3;
    w3 |= t0;
    w2 ^= w4;
    w1 ^= t0;
    w3 ^= w1;
    w1 &= w4;
    t0 ^= w1;
    w1 |= w2;
    w1 ^= w3;
    w4 ^= t0;
    w3 ^= w2;
    w4 ^= w1;
    w4 ^= w2;
    w3 &= w4;
    t0 ^= w3;
    [w1, t0, w2, w4]
}

#[inline(always)]
fn sbox_d1<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w2;
    w2 ^= w4;
    w4 &= w2;
    t0 ^= w3;
    w4 ^= w1;
    w1 |= w2;
    w3 ^= w4;
    w1 ^= t0;
    w1 |= w3;
    w2 ^= w4;
    w1 ^= w2;
    w2 |= w4;
    w2 ^= w1;
    t0 = !t0;
    t0 ^= w2;
    w2 |= w1;
    w2 ^= w1;
    w2 |= t0;
    w4 ^= w2;
    [t0, w1, w4, w3]
}

#[inline(always)]
fn sbox_d2<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w3 ^= w4;
    w4 ^= w1;
    let mut t0 = w4;
    w4 &= w3;
    w4 ^= w2;
    w2 |= w3;
    w2 ^= t0;
    t0 &= w4;
    w3 ^= w4;
    t0 &= w1;
    t0 ^= w3;
    w3 &= w2;
    w3 |= w1;
    w4 = !w4;
    w3 ^= w4;
    w1 ^= w4;
    w1 &= w2;
    w4 ^= t0;
    w4 ^= w1;
    [w2, t0, w3, w4]
}

#[inline(always)]
fn sbox_d3<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w3;
    w3 ^= w2;
    w1 ^= w3;
    t0 &= w3;
    t0 ^= w1;
    w1 &= w2;
    w2 ^= w4;
    w4 |= t0;
    w3 ^= w4;
    w1 ^= w4;
    w2 ^= t0;
    w4 &= w3;
    w4 ^= w2;
    w2 ^= w1;
    w2 |= w3;
    w1 ^= w4;
    w2 ^= t0;
    w1 ^= w2;
    [w3, w2, w4, w1]
}

#[inline(always)]
fn sbox_d4<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w3;
    w3 &= w4;
    w3 ^= w2;
    w2 |= w4;
    w2 &= w1;
    t0 ^= w3;
    t0 ^= w2;
    w2 &= w3;
    w1 = !w1;
    w4 ^= t0;
    w2 ^= w4;
    w4 &= w1;
    w4 ^= w3;
    w1 ^= w2;
    w3 &= w1;
    w4 ^= w1;
    w3 ^= t0;
    w3 |= w4;
    w4 ^= w1;
    w3 ^= w2;
    [w1, w4, w3, t0]
}

#[inline(always)]
fn sbox_d5<W: Word>([w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w2 = !w2;
    let mut t0 = w4;
    w3 ^= w2;
    w4 |= w1;
    w4 ^= w3;
    w3 |= w2;
    w3 &= w1;
    t0 ^= w4;
    w3 ^= t0;
    t0 |= w1;
    t0 ^= w2;
    w2 &= w3;
    w2 ^= w4;
    t0 ^= w3;
    w4 &= t0;
    t0 ^= w2;
    w4 ^= t0;
    t0 = !t0;
    w4 ^= w1;
    [w2, t0, w4, w3]
}

#[inline(always)]
fn sbox_d6<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    w1 ^= w3;
    let mut t0 = w3;
    w3 &= w1;
    t0 ^= w4;
    w3 = !w3;
    w4 ^= w2;
    w3 ^= w4;
    t0 |= w1;
    w1 ^= w3;
    w4 ^= t0;
    t0 ^= w2;
    w2 &= w4;
    w2 ^= w1;
    w1 ^= w4;
    w1 |= w3;
    w4 ^= w2;
    t0 ^= w1;
    [w2, w3, t0, w4]
}

#[inline(always)]
fn sbox_d7<W: Word>([mut w1, mut w2, mut w3, mut w4]: [W; 4]) -> [W; 4] {
    let mut t0 = w3;
    w3 ^= w1;
    w1 &= w4;
    t0 |= w4;
    w3 = !w3;
    w4 ^= w2;
    w2 |= w1;
    w1 ^= w3;
    w3 &= t0;
    w4 &= t0;
    w2 ^= w3;
    w3 ^= w1;
    w1 |= w3;
    t0 ^= w2;
    w1 ^= w4;
    w4 ^= t0;
    t0 |= w1;
    w4 ^= w3;
    t0 ^= w3;
    [w4, w1, w2, t0]
}
