//! A seeded pseudo-random generator for tests, so every failure reproduces.
//!
//! [`Rng`] wraps rand's [`StdRng`] (ChaCha12), seeded from a `u64` with
//! [`SeedableRng::seed_from_u64`]: the same seed gives the same stream on
//! every machine and every run. Each test passes its own fixed seed, so a
//! plain rerun replays a failure.
//!
//! To explore other streams, set `UCRYPT_TEST_SEED=<u64>` (decimal or
//! `0x` hex): it is mixed into every seed. When a test panics while one of
//! its generators is alive, the generator prints its seeds on stderr, so
//! the failing stream can be replayed by setting the same variable.

use std::convert::Infallible;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng, TryRng};

/// Environment variable mixed into every [`Rng`] seed (unset = 0).
pub const SEED_ENV: &str = "UCRYPT_TEST_SEED";

/// The value of `UCRYPT_TEST_SEED`, or 0 when unset.
///
/// # Panics
/// When the variable is set but is not a `u64` (a typo must not silently
/// fall back to the default stream).
pub fn base_seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => parse_seed(&v).unwrap_or_else(|| panic!("{SEED_ENV}={v:?} is not a u64")),
        Err(_) => 0,
    }
}

fn parse_seed(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => v.replace('_', "").parse().ok(),
    }
}

/// A deterministic generator: `Rng::new(seed)` always yields the same
/// stream (for a given `UCRYPT_TEST_SEED`).
///
/// It implements [`rand::Rng`], so everything in [`rand::RngExt`] works on
/// it too; the inherent methods cover what the tests use most.
#[derive(Debug)]
pub struct Rng {
    inner: StdRng,
    seed: u64,
    base: u64,
}

impl Rng {
    /// A generator for `seed`, mixed with `UCRYPT_TEST_SEED` when set.
    pub fn new(seed: u64) -> Self {
        Self::with_base(seed, base_seed())
    }

    /// A generator for `seed` mixed with an explicit base (what
    /// `UCRYPT_TEST_SEED` would give).
    pub fn with_base(seed: u64, base: u64) -> Self {
        Self {
            inner: StdRng::seed_from_u64(seed ^ base),
            seed,
            base,
        }
    }

    /// The seed this generator was created with (before mixing).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        rand::Rng::next_u64(&mut self.inner)
    }

    /// A uniform value in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.inner.random_range(0..n)
        }
    }

    /// [`Rng::below`] for indices and lengths.
    pub fn below_usize(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        rand::Rng::fill_bytes(&mut self.inner, buf);
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill(&mut v);
        v
    }
}

impl TryRng for Rng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.inner.try_next_u32()
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.inner.try_next_u64()
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.inner.try_fill_bytes(dst)
    }
}

impl Drop for Rng {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "testutil::Rng: panicked with seed {:#x} and {SEED_ENV}={:#x}; \
                 rerun with {SEED_ENV}={:#x} to replay this stream",
                self.seed, self.base, self.base
            );
        }
    }
}

/// `len` deterministic pseudo-random bytes for `seed`.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::with_base(42, 0);
        let mut b = Rng::with_base(42, 0);
        let (x, y): (Vec<u64>, Vec<u64>) = (0..64).map(|_| (a.next_u64(), b.next_u64())).unzip();
        assert_eq!(x, y);
        assert_eq!(a.bytes(1000), b.bytes(1000));
        assert_eq!(a.seed(), 42);
    }

    #[test]
    fn stream_is_pinned_to_the_seed() {
        // StdRng::seed_from_u64 is documented as reproducible within a rand
        // major version; pin a value so a silent change shows up here.
        assert_eq!(Rng::with_base(0, 0).next_u64(), 0xbb2a_3fb2_cd2c_6f7f);
        assert_eq!(Rng::with_base(1, 0).next_u64(), 0xf968_1a64_d330_1861);
        // The base is mixed in as `seed ^ base`.
        assert_eq!(Rng::with_base(7, 7).next_u64(), 0xbb2a_3fb2_cd2c_6f7f);
        assert_eq!(Rng::with_base(0, 1).next_u64(), 0xf968_1a64_d330_1861);
    }

    #[test]
    fn different_seeds_or_bases_differ() {
        let s = |seed, base| Rng::with_base(seed, base).bytes(64);
        assert_ne!(s(1, 0), s(2, 0));
        assert_ne!(s(1, 0), s(1, 5));
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::with_base(3, 0);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let v = r.below(7);
            assert!(v < 7);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
        assert!(r.below_usize(3) < 3);
    }

    #[test]
    fn fill_covers_odd_lengths() {
        let mut r = Rng::with_base(9, 0);
        for len in [0usize, 1, 7, 8, 9, 4097] {
            let mut buf = vec![0u8; len];
            r.fill(&mut buf);
            if len >= 8 {
                assert!(buf.iter().any(|&b| b != 0), "len {len}");
            }
        }
    }

    #[test]
    fn seed_variable_parses_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2a "), Some(42));
        assert_eq!(parse_seed("0X_ff"), Some(255));
        assert_eq!(parse_seed("1_000"), Some(1000));
        assert_eq!(parse_seed("forty"), None);
        assert_eq!(parse_seed("-1"), None);
    }

    #[test]
    fn random_bytes_is_deterministic() {
        assert_eq!(random_bytes(100, 5), random_bytes(100, 5));
        assert_ne!(random_bytes(100, 5), random_bytes(100, 6));
        assert_eq!(random_bytes(100, 5).len(), 100);
    }
}
