//! Password-based key derivation for keyslots: PBKDF2 (any header hash),
//! Argon2i and Argon2id, with cryptsetup's cost limits and `--iter-time`
//! style calibration.
//!
//! This is the only place KDF cost is measured: `format` and `add-key`
//! choose their costs through [`KdfRequest::resolve`], and `ucrypt
//! benchmark` prints [`pbkdf2_iterations_per_sec`] and the Argon2 costs
//! [`benchmark_argon2`] gets from that same path, so the two never disagree.
//!
//! Costs read from a header are checked by [`Kdf::check_limits`] before anything
//! is allocated, so a header claiming 1 TiB of Argon2 memory is refused
//! instead of aborting the process.

use std::time::Instant;

use crypto::speed::CpuClock;
use zeroize::Zeroizing;

use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::hash::Hash;

/// Minimum PBKDF2 iterations cryptsetup accepts for a keyslot.
pub const MIN_PBKDF2_ITERATIONS: u32 = 1000;
/// Minimum Argon2 time cost cryptsetup uses.
pub const MIN_ARGON2_TIME: u32 = 4;
/// Smallest Argon2 memory cost in KiB (cryptsetup's minimum).
pub const MIN_ARGON2_MEMORY_KIB: u32 = 32;
/// Largest Argon2 memory cost in KiB cryptsetup allows (4 GiB).
pub const MAX_ARGON2_MEMORY_KIB: u32 = 4 * 1024 * 1024;
/// Default Argon2 memory cost ceiling in KiB (1 GiB), as cryptsetup.
pub const DEFAULT_ARGON2_MEMORY_KIB: u32 = 1024 * 1024;
/// Largest Argon2 lane count accepted from a header.
pub const MAX_ARGON2_PARALLEL: u32 = 16;
/// Largest Argon2 time cost accepted from a header.
pub const MAX_ARGON2_TIME: u32 = 1 << 24;
/// Default `--iter-time` in milliseconds.
pub const DEFAULT_ITER_TIME_MS: u32 = 2000;

/// A keyslot KDF with its costs (the salt is stored next to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kdf {
    /// PBKDF2-HMAC.
    Pbkdf2 {
        /// The PRF hash.
        hash: Hash,
        /// Iteration count.
        iterations: u32,
    },
    /// Argon2 (i or id), version 0x13.
    Argon2 {
        /// `argon2i` or `argon2id`.
        variant: Argon2Variant,
        /// Time cost (passes).
        time: u32,
        /// Memory cost in KiB.
        memory_kib: u32,
        /// Lanes / threads.
        parallel: u32,
    },
}

/// The Argon2 flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argon2Variant {
    /// Data-independent addressing.
    I,
    /// Hybrid (cryptsetup's LUKS2 default).
    Id,
}

impl Argon2Variant {
    /// The LUKS2 JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Argon2Variant::I => "argon2i",
            Argon2Variant::Id => "argon2id",
        }
    }
}

impl Kdf {
    /// The name used by cryptsetup (`pbkdf2`, `argon2i`, `argon2id`).
    pub fn name(&self) -> &'static str {
        match self {
            Kdf::Pbkdf2 { .. } => "pbkdf2",
            Kdf::Argon2 { variant, .. } => variant.name(),
        }
    }

    /// Refuses costs no sane header has (before any allocation).
    pub fn check_limits(&self) -> Result<()> {
        match *self {
            Kdf::Pbkdf2 { iterations, .. } => {
                if iterations == 0 {
                    return Err(corrupt("PBKDF2 iteration count is zero"));
                }
            }
            Kdf::Argon2 {
                time,
                memory_kib,
                parallel,
                ..
            } => {
                if !(1..=MAX_ARGON2_TIME).contains(&time) {
                    return Err(corrupt(format!("Argon2 time cost {time} is out of range")));
                }
                if !(1..=MAX_ARGON2_PARALLEL).contains(&parallel) {
                    return Err(corrupt(format!(
                        "Argon2 parallel cost {parallel} is out of range"
                    )));
                }
                if !(MIN_ARGON2_MEMORY_KIB..=MAX_ARGON2_MEMORY_KIB).contains(&memory_kib) {
                    return Err(corrupt(format!(
                        "Argon2 memory cost {memory_kib} KiB is out of range ({MIN_ARGON2_MEMORY_KIB}..={MAX_ARGON2_MEMORY_KIB})"
                    )));
                }
                if u64::from(memory_kib) < 8 * u64::from(parallel) {
                    return Err(corrupt("Argon2 memory cost is below 8 KiB per lane"));
                }
                let phys = physical_memory_kib();
                if phys != 0 && u64::from(memory_kib) > phys {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("Argon2 memory cost {memory_kib} KiB exceeds this machine's memory ({phys} KiB)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Derives `out.len()` bytes from `password` and `salt`.
    pub fn derive(&self, password: &[u8], salt: &[u8], out: &mut [u8]) -> Result<()> {
        self.check_limits()?;
        match *self {
            Kdf::Pbkdf2 { hash, iterations } => {
                hash.pbkdf2(password, salt, iterations, out);
                Ok(())
            }
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                let alg = match variant {
                    Argon2Variant::I => argon2::Algorithm::Argon2i,
                    Argon2Variant::Id => argon2::Algorithm::Argon2id,
                };
                let params = argon2::Params::new(memory_kib, time, parallel, Some(out.len()))
                    .map_err(|e| corrupt(format!("Argon2 parameters rejected: {e}")))?;
                argon2::Argon2::new(alg, argon2::Version::V0x13, params)
                    .hash_password_into(password, salt, out)
                    .map_err(|e| corrupt(format!("Argon2 failed: {e}")))
            }
        }
    }
}

/// What the user asked for at format/add-key time (cryptsetup's
/// `--pbkdf`, `--hash`, `--iter-time`, `--pbkdf-force-iterations`,
/// `--pbkdf-memory`, `--pbkdf-parallel`).
#[derive(Debug, Clone)]
pub struct KdfRequest {
    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub kind: String,
    /// PBKDF2 hash.
    pub hash: Hash,
    /// Target unlock time in ms (ignored when `force_iterations` is set).
    pub iter_time_ms: u32,
    /// Fixed iteration count (PBKDF2) or time cost (Argon2): no benchmark.
    pub force_iterations: Option<u32>,
    /// Argon2 memory cost ceiling (or exact value with forced iterations), KiB.
    pub memory_kib: Option<u32>,
    /// Argon2 lanes.
    pub parallel: Option<u32>,
}

impl Default for KdfRequest {
    fn default() -> Self {
        Self {
            kind: "argon2id".into(),
            hash: Hash::Sha256,
            iter_time_ms: DEFAULT_ITER_TIME_MS,
            force_iterations: None,
            memory_kib: None,
            parallel: None,
        }
    }
}

impl KdfRequest {
    /// A request that resolves to exactly `kdf` without a benchmark
    /// (`hash` is kept for the AF and digest when `kdf` is Argon2).
    pub fn fixed(kdf: &Kdf, hash: Hash) -> Self {
        match *kdf {
            Kdf::Pbkdf2 { hash, iterations } => Self {
                kind: "pbkdf2".into(),
                hash,
                force_iterations: Some(iterations),
                ..Self::default()
            },
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => Self {
                kind: variant.name().into(),
                hash,
                force_iterations: Some(time),
                memory_kib: Some(memory_kib),
                parallel: Some(parallel),
                ..Self::default()
            },
        }
    }

    /// Resolves the request to concrete costs, benchmarking like cryptsetup
    /// when no forced cost is given. `key_len` is the derived key length.
    pub fn resolve(&self, key_len: usize) -> Result<Kdf> {
        match self.kind.as_str() {
            "pbkdf2" => {
                let iterations = match self.force_iterations {
                    Some(n) if n < MIN_PBKDF2_ITERATIONS => {
                        return Err(invalid(format!(
                            "Forced iteration count is too low for pbkdf2 (minimum is {MIN_PBKDF2_ITERATIONS})"
                        )))
                    }
                    Some(n) => n,
                    None => calibrate_pbkdf2(self.hash, key_len, self.iter_time_ms),
                };
                Ok(Kdf::Pbkdf2 {
                    hash: self.hash,
                    iterations,
                })
            }
            "argon2i" | "argon2id" => {
                let variant = if self.kind == "argon2i" {
                    Argon2Variant::I
                } else {
                    Argon2Variant::Id
                };
                let parallel = self.parallel.unwrap_or_else(default_parallel);
                if !(1..=MAX_ARGON2_PARALLEL).contains(&parallel) {
                    return Err(invalid(format!(
                        "Parallel cost must be 1..={MAX_ARGON2_PARALLEL}"
                    )));
                }
                let max_mem = self.memory_kib.unwrap_or_else(default_max_memory_kib);
                if !(MIN_ARGON2_MEMORY_KIB..=MAX_ARGON2_MEMORY_KIB).contains(&max_mem) {
                    return Err(invalid(format!(
                        "Memory cost must be {MIN_ARGON2_MEMORY_KIB}..={MAX_ARGON2_MEMORY_KIB} KiB"
                    )));
                }
                let (time, memory_kib) = match self.force_iterations {
                    Some(t) => (t.max(1), max_mem),
                    None => {
                        calibrate_argon2(variant, key_len, self.iter_time_ms, max_mem, parallel)?
                    }
                };
                let kdf = Kdf::Argon2 {
                    variant,
                    time,
                    memory_kib,
                    parallel,
                };
                kdf.check_limits()
                    .map_err(|e| invalid(e.message().to_string()))?;
                Ok(kdf)
            }
            other => Err(invalid(format!(
                "Unknown PBKDF {other:?} (use pbkdf2, argon2i or argon2id)"
            ))),
        }
    }
}

/// Lanes cryptsetup picks: min(4, online CPUs).
pub fn default_parallel() -> u32 {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    cpus.min(4) as u32
}

/// cryptsetup's memory ceiling: 1 GiB, at most half the physical memory.
pub fn default_max_memory_kib() -> u32 {
    let phys = physical_memory_kib();
    let half = if phys == 0 {
        u64::from(DEFAULT_ARGON2_MEMORY_KIB)
    } else {
        phys / 2
    };
    half.min(u64::from(DEFAULT_ARGON2_MEMORY_KIB))
        .max(u64::from(MIN_ARGON2_MEMORY_KIB)) as u32
}

/// Physical memory in KiB from /proc/meminfo (0 when unknown).
pub fn physical_memory_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|n| n.parse::<u64>().ok())
                })
        })
        .unwrap_or(0)
}

/// Shortest single PBKDF2 run, in ms of CPU time, that calibration trusts.
const PBKDF2_SAMPLE_MS: f64 = 250.0;

/// PBKDF2 iterations per second of CPU time for a `key_len`-byte output,
/// measured like cryptsetup's benchmark: double the iterations until one
/// run takes at least 250 ms, then scale. CPU time (not wall time) so a
/// busy machine does not make the estimate too small.
pub fn pbkdf2_iterations_per_sec(hash: Hash, key_len: usize) -> f64 {
    let mut out = Zeroizing::new(vec![0u8; key_len.max(1)]);
    let salt = [0x5au8; 32];
    let mut iterations: u32 = 1 << 12;
    loop {
        let clock = CpuClock::start();
        hash.pbkdf2(b"ucrypt-benchmark", &salt, iterations, &mut out);
        let ms = clock.elapsed().as_secs_f64() * 1000.0;
        if ms >= PBKDF2_SAMPLE_MS || iterations >= 1 << 30 {
            return f64::from(iterations) * 1000.0 / ms.max(0.001);
        }
        iterations = iterations.saturating_mul(2);
    }
}

/// PBKDF2 iterations that take `iter_time_ms` for a `key_len`-byte output
/// (from [`pbkdf2_iterations_per_sec`]), at least the minimum cryptsetup
/// accepts.
pub fn calibrate_pbkdf2(hash: Hash, key_len: usize, iter_time_ms: u32) -> u32 {
    let n = pbkdf2_iterations_per_sec(hash, key_len) * f64::from(iter_time_ms) / 1000.0;
    (n.min(f64::from(u32::MAX)) as u32).max(MIN_PBKDF2_ITERATIONS)
}

/// The Argon2 costs a 256-bit keyslot would get for `iter_time_ms` with the
/// default lanes and memory ceiling: what `ucrypt benchmark` reports, from
/// the same [`KdfRequest::resolve`] that `format` and `add-key` use.
pub fn benchmark_argon2(variant: Argon2Variant, iter_time_ms: u32) -> Result<Kdf> {
    KdfRequest {
        kind: variant.name().into(),
        iter_time_ms,
        ..KdfRequest::default()
    }
    .resolve(32)
}

/// Argon2 (time, memory KiB) reaching about `iter_time_ms`, cryptsetup's
/// rule: keep the memory ceiling and raise the time cost from its minimum
/// 4; when even 4 passes are too slow, lower the memory instead.
pub fn calibrate_argon2(
    variant: Argon2Variant,
    key_len: usize,
    iter_time_ms: u32,
    max_memory_kib: u32,
    parallel: u32,
) -> Result<(u32, u32)> {
    let target = f64::from(iter_time_ms.max(1));
    let mut out = Zeroizing::new(vec![0u8; key_len.max(4)]);
    let salt = [0xa5u8; 32];
    // Sample with one pass over a large-enough memory to see DRAM speed.
    let sample_mem = max_memory_kib
        .min(256 * 1024)
        .max(MIN_ARGON2_MEMORY_KIB.max(8 * parallel));
    let mut ms;
    let mut sample_time = 1u32;
    loop {
        let kdf = Kdf::Argon2 {
            variant,
            time: sample_time,
            memory_kib: sample_mem,
            parallel,
        };
        let start = Instant::now();
        kdf.derive(b"ucrypt-benchmark", &salt, &mut out)?;
        ms = start.elapsed().as_secs_f64() * 1000.0;
        if ms >= 100.0 || sample_time >= 64 {
            break;
        }
        sample_time *= 4;
    }
    // Cost is about linear in time * memory.
    let per_unit = ms.max(0.001) / (f64::from(sample_time) * f64::from(sample_mem));
    let at_min_time = per_unit * f64::from(MIN_ARGON2_TIME) * f64::from(max_memory_kib);
    if at_min_time > target {
        let mem = target / (per_unit * f64::from(MIN_ARGON2_TIME));
        let mem = (mem as u32).clamp(MIN_ARGON2_MEMORY_KIB.max(8 * parallel), max_memory_kib);
        Ok((MIN_ARGON2_TIME, mem))
    } else {
        let t = target / (per_unit * f64::from(max_memory_kib));
        Ok((
            (t as u32).clamp(MIN_ARGON2_TIME, MAX_ARGON2_TIME),
            max_memory_kib,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2id_rfc9106_shape() {
        // Same inputs twice give the same output; a different salt differs.
        let kdf = Kdf::Argon2 {
            variant: Argon2Variant::Id,
            time: 1,
            memory_kib: 64,
            parallel: 2,
        };
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        kdf.derive(b"pw", b"saltsaltsaltsalt", &mut a).unwrap();
        kdf.derive(b"pw", b"saltsaltsaltsalt", &mut b).unwrap();
        assert_eq!(a, b);
        kdf.derive(b"pw", b"saltsaltsaltsal!", &mut b).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn absurd_costs_refused() {
        let huge = Kdf::Argon2 {
            variant: Argon2Variant::Id,
            time: 4,
            memory_kib: u32::MAX,
            parallel: 4,
        };
        assert_eq!(huge.check_limits().unwrap_err().kind(), ErrorKind::Corrupt);
        let lanes = Kdf::Argon2 {
            variant: Argon2Variant::I,
            time: 4,
            memory_kib: 1024,
            parallel: 1000,
        };
        assert!(lanes.check_limits().is_err());
        assert!(Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: 0
        }
        .check_limits()
        .is_err());
    }

    #[test]
    fn forced_iterations_skip_benchmark() {
        let req = KdfRequest {
            kind: "pbkdf2".into(),
            force_iterations: Some(1234),
            ..KdfRequest::default()
        };
        assert_eq!(
            req.resolve(32).unwrap(),
            Kdf::Pbkdf2 {
                hash: Hash::Sha256,
                iterations: 1234
            }
        );
        let low = KdfRequest {
            force_iterations: Some(10),
            ..req
        };
        assert_eq!(
            low.resolve(32).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn benchmark_rates_come_from_the_format_path() {
        let rate = pbkdf2_iterations_per_sec(Hash::Sha1, 32);
        assert!(rate.is_finite() && rate > 0.0);
        match benchmark_argon2(Argon2Variant::I, 20).unwrap() {
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                assert_eq!(variant, Argon2Variant::I);
                assert_eq!(parallel, default_parallel());
                assert!(time >= MIN_ARGON2_TIME);
                assert!((MIN_ARGON2_MEMORY_KIB..=default_max_memory_kib()).contains(&memory_kib));
            }
            other => panic!("not Argon2: {other:?}"),
        }
    }

    #[test]
    fn calibration_scales_with_target() {
        let short = calibrate_pbkdf2(Hash::Sha256, 32, 50);
        assert!(short >= MIN_PBKDF2_ITERATIONS);
        let (t, m) = calibrate_argon2(Argon2Variant::Id, 32, 20, 64 * 1024, 1).unwrap();
        assert!(t >= MIN_ARGON2_TIME && (MIN_ARGON2_MEMORY_KIB..=64 * 1024).contains(&m));
    }
}
