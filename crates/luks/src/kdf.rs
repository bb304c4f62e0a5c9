//! Password-based key derivation for keyslots: PBKDF2 (any header hash),
//! Argon2i and Argon2id, with cryptsetup's cost limits and `--iter-time`
//! calibration.
//!
//! This is the only place KDF cost is measured: `format`, `add-key`,
//! `change-key` and `convert-key` choose their costs through
//! [`KdfRequest::resolve`], and `ucrypt benchmark` prints
//! [`pbkdf2_iterations_per_sec`] and the Argon2 costs [`benchmark_argon2`]
//! gets from that same path, so the two never disagree.
//!
//! ```text
//!   KdfRequest::resolve ─► limits (cryptsetup's verify_pbkdf_params)
//!        │                 ─► pbkdf2: iterations/s, CPU time, one run ≥ 500 ms
//!        │                 ─► argon2: search(measure): grow m, then t, until a
//!        ▼                    run lands in 95–110 % of --iter-time
//!   Calibration { kdf, what was measured }   (-v prints it: KdfRequest::verbose)
//!
//!   Kdf from a header ─► check_limits (at load: cryptsetup's maxima)
//!                     ─► estimate (at unlock: a notice above NOTICE_SECS)
//!                     ─► derive
//! ```
//!
//! **Limits.** [`Kdf::check_limits`] refuses a header's costs beyond
//! cryptsetup's own maxima (`crypt_pbkdf_get_limits`: Argon2 memory up to
//! 4 GiB, 1 to 4 lanes) and costs the KDF cannot run (zero iterations or
//! time, under 8 KiB a lane): nothing beyond what cryptsetup can write is
//! worked on. Its minimums (PBKDF2 1000 iterations; Argon2 time 4, memory
//! 32 KiB) bind only what ucrypt writes ([`KdfRequest`]): cryptsetup loads
//! and unlocks cheaper keyslots (the valid header of its own LUKS2
//! validation suite has a 16 KiB Argon2 keyslot), and so does ucrypt.
//! Within the limits, a cost can still take hours (PBKDF2
//! at 2^32-1 iterations): [`Kdf::estimate`] measures this machine's speed
//! and unlocking prints a notice naming the time and memory before it
//! starts. The process keeps SIGINT's default action while it derives, so
//! Ctrl-C ends it at once (nothing is written before the derivation ends).
//!
//! **Calibration** follows cryptsetup's `crypt_pbkdf_perf`
//! (`lib/crypto_backend/pbkdf_check.c`): Argon2 starts at the smallest
//! costs, grows the memory cost first and then the time cost until one run
//! takes 250 ms, then estimates the target and measures every candidate
//! until one lands in 95–110 % of `--iter-time`. Timing noise on a busy
//! machine only ever adds time, so a measurement that would lower the cost
//! is repeated and the shortest kept: one slow run cannot make a keyslot
//! weaker than asked. The search is written against a measure function
//! ([`argon2_search`]) so tests drive it with a fake clock.

use std::sync::Mutex;
use std::time::Instant;

use crypto::speed::CpuClock;
use zeroize::Zeroizing;

use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::hash::Hash;

/// Minimum PBKDF2 iterations (cryptsetup's `crypt_pbkdf_get_limits`,
/// after NIST SP 800-132).
pub const MIN_PBKDF2_ITERATIONS: u32 = 1000;
/// Minimum Argon2 time cost (cryptsetup's limit).
pub const MIN_ARGON2_TIME: u32 = 4;
/// Smallest Argon2 memory cost in KiB (cryptsetup's minimum).
pub const MIN_ARGON2_MEMORY_KIB: u32 = 32;
/// Largest Argon2 memory cost in KiB cryptsetup allows (4 GiB).
pub const MAX_ARGON2_MEMORY_KIB: u32 = 4 * 1024 * 1024;
/// Default Argon2 memory cost ceiling in KiB (1 GiB), as cryptsetup.
pub const DEFAULT_ARGON2_MEMORY_KIB: u32 = 1024 * 1024;
/// Largest Argon2 lane count (cryptsetup's limit; a larger request is
/// lowered to it, a header with more is refused).
pub const MAX_ARGON2_PARALLEL: u32 = 4;
/// An unlock estimated to take longer than this (seconds) prints a notice
/// first.
pub const NOTICE_SECS: f64 = 5.0;

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

    /// Refuses costs beyond cryptsetup's hard limits (before any work):
    /// what no cryptsetup can write is a crafted header.
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
                if time == 0 {
                    return Err(corrupt("Argon2 time cost is zero"));
                }
                if !(1..=MAX_ARGON2_PARALLEL).contains(&parallel) {
                    return Err(corrupt(format!(
                        "Argon2 parallel cost {parallel} is outside cryptsetup's limits (1..{MAX_ARGON2_PARALLEL})"
                    )));
                }
                if memory_kib > MAX_ARGON2_MEMORY_KIB {
                    return Err(corrupt(format!(
                        "Argon2 memory cost {memory_kib} KiB is beyond cryptsetup's limit ({MAX_ARGON2_MEMORY_KIB} KiB)"
                    )));
                }
                if u64::from(memory_kib) < 8 * u64::from(parallel) {
                    return Err(corrupt("Argon2 memory cost is below 8 KiB per lane"));
                }
            }
        }
        Ok(())
    }

    /// Refuses an Argon2 memory cost above this machine's memory (it
    /// would end in the allocator aborting the process).
    fn check_memory(&self) -> Result<()> {
        if let Kdf::Argon2 { memory_kib, .. } = *self {
            let phys = physical_memory_kib();
            if phys != 0 && u64::from(memory_kib) > phys {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("Argon2 memory cost {memory_kib} KiB exceeds this machine's memory ({phys} KiB)"),
                ));
            }
        }
        Ok(())
    }

    /// Derives `out.len()` bytes from `password` and `salt`.
    pub fn derive(&self, password: &[u8], salt: &[u8], out: &mut [u8]) -> Result<()> {
        self.check_limits()?;
        self.check_memory()?;
        self.derive_unchecked(password, salt, out)
    }

    /// [`Self::derive`] without cryptsetup's limits (the estimate's short
    /// sample runs below them); the argon2 crate still refuses what it
    /// cannot do.
    fn derive_unchecked(&self, password: &[u8], salt: &[u8], out: &mut [u8]) -> Result<()> {
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

    /// About how long deriving a `key_len`-byte key takes here, and the
    /// memory it needs. Cheap costs are not measured (`secs` is then 0);
    /// others are timed on a small sample of the same KDF (once per
    /// process and kind) and scaled.
    pub fn estimate(&self, key_len: usize) -> Estimate {
        match *self {
            Kdf::Pbkdf2 { hash, iterations } => Estimate {
                secs: pbkdf2_secs(hash, key_len, iterations),
                memory_kib: 0,
            },
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                // Below 1 GiB x 8 passes an unlock is seconds at most.
                let work = u64::from(time) * u64::from(memory_kib);
                let secs = if work < 8 << 20 {
                    0.0
                } else {
                    argon2_kib_pass_secs(variant, parallel) * work as f64
                };
                Estimate {
                    secs,
                    memory_kib: u64::from(memory_kib),
                }
            }
        }
    }
}

/// What unlocking with a KDF costs (see [`Kdf::estimate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Seconds of derivation (0: too cheap to measure).
    pub secs: f64,
    /// Memory in KiB.
    pub memory_kib: u64,
}

impl Estimate {
    /// The notice printed before an unlock of keyslot `slot` that takes
    /// more than [`NOTICE_SECS`], if this one does.
    pub fn notice(&self, slot: u32) -> Option<String> {
        (self.secs > NOTICE_SECS).then(|| {
            let memory = match self.memory_kib {
                0 => String::new(),
                kib => format!(" and {} MiB", kib.div_ceil(1024)),
            };
            format!(
                "Keyslot {slot} needs about {} s{memory} to unlock on this machine \
                 (its KDF costs are within cryptsetup's limits, but unusually high); \
                 press Ctrl-C to stop.",
                fmt_secs(self.secs),
            )
        })
    }
}

/// `12`, `3.4`, `1.2e6`.
fn fmt_secs(s: f64) -> String {
    if s >= 1e6 {
        format!("{s:.1e}")
    } else if s >= 10.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

/// Seconds for `iterations` of PBKDF2 (0 for fewer than 2^20: at most a
/// second or so anywhere).
fn pbkdf2_secs(hash: Hash, key_len: usize, iterations: u32) -> f64 {
    if iterations < 1 << 20 {
        return 0.0;
    }
    f64::from(iterations) / quick_pbkdf2_rate(hash, key_len)
}

/// PBKDF2 iterations per second of CPU time measured on a short run
/// (20 ms; enough for a notice), cached per hash and key length.
fn quick_pbkdf2_rate(hash: Hash, key_len: usize) -> f64 {
    static CACHE: Mutex<Vec<((Hash, usize), f64)>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, r)) = cache.iter().find(|(k, _)| *k == (hash, key_len)) {
        return r;
    }
    let r = pbkdf2_rate_with(|n| Ok(cpu_ms_pbkdf2(hash, key_len, n)), 20.0).unwrap_or(1e9);
    cache.push(((hash, key_len), r));
    r
}

/// Seconds per KiB and pass of Argon2 with `parallel` lanes, measured
/// once per process on 16 MiB, one pass.
fn argon2_kib_pass_secs(variant: Argon2Variant, parallel: u32) -> f64 {
    static CACHE: Mutex<Vec<((Argon2Variant, u32), f64)>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, r)) = cache.iter().find(|(k, _)| *k == (variant, parallel)) {
        return r;
    }
    let m = 16 * 1024;
    let sample = Kdf::Argon2 {
        variant,
        time: 1,
        memory_kib: m,
        parallel,
    };
    let mut out = Zeroizing::new([0u8; 32]);
    let start = Instant::now();
    let r = match sample.derive_unchecked(b"ucrypt-estimate", &[0x5a; 32], &mut out[..]) {
        Ok(()) => start.elapsed().as_secs_f64() / f64::from(m),
        Err(_) => 0.0,
    };
    cache.push(((variant, parallel), r));
    r
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
    /// Print what calibration measured and chose on standard output
    /// (cryptsetup's `-v`).
    pub verbose: bool,
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
            verbose: false,
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
    /// With [`KdfRequest::verbose`], prints what was measured and chosen.
    pub fn resolve(&self, key_len: usize) -> Result<Kdf> {
        let cal = self.calibrate(key_len)?;
        if let (true, Some(line)) = (self.verbose, cal.line()) {
            println!("{line}");
        }
        Ok(cal.kdf)
    }

    /// [`Self::resolve`] with what was measured: the options checked as
    /// cryptsetup's `verify_pbkdf_params` does (with its messages), then
    /// the costs measured for `--iter-time` unless forced.
    pub fn calibrate(&self, key_len: usize) -> Result<Calibration> {
        match self.kind.as_str() {
            "pbkdf2" => {
                let (iterations, measured) = match self.force_iterations {
                    Some(n) if n < MIN_PBKDF2_ITERATIONS => {
                        return Err(invalid(format!(
                            "Forced iteration count is too low for pbkdf2 (minimum is {MIN_PBKDF2_ITERATIONS})."
                        )))
                    }
                    Some(n) => (n, None),
                    None => {
                        let rate = pbkdf2_iterations_per_sec(self.hash, key_len);
                        let n = iterations_for(rate, self.iter_time_ms);
                        (n, Some(Measured::Rate(rate)))
                    }
                };
                Ok(Calibration {
                    kdf: Kdf::Pbkdf2 {
                        hash: self.hash,
                        iterations,
                    },
                    measured,
                })
            }
            "argon2i" | "argon2id" => {
                let variant = if self.kind == "argon2i" {
                    Argon2Variant::I
                } else {
                    Argon2Variant::Id
                };
                let name = variant.name();
                let parallel = match self.parallel.unwrap_or_else(default_parallel) {
                    0 => return Err(invalid("Requested PBKDF parallel threads cannot be zero.")),
                    // cryptsetup lowers it to its maximum.
                    p => p.min(MAX_ARGON2_PARALLEL),
                };
                let max_mem = self.memory_kib.unwrap_or_else(default_max_memory_kib);
                if max_mem == 0 {
                    return Err(invalid("Requested maximum PBKDF memory cannot be zero."));
                }
                if max_mem > MAX_ARGON2_MEMORY_KIB {
                    return Err(invalid(format!(
                        "Requested maximum PBKDF memory cost is too high (maximum is {MAX_ARGON2_MEMORY_KIB} kilobytes)."
                    )));
                }
                let min_mem = MIN_ARGON2_MEMORY_KIB.max(8 * parallel);
                if max_mem < min_mem {
                    return Err(invalid(format!(
                        "Forced memory cost is too low for {name} (minimum is {min_mem} kilobytes)."
                    )));
                }
                let (time, memory_kib, measured) = match self.force_iterations {
                    Some(t) if t < MIN_ARGON2_TIME => {
                        return Err(invalid(format!(
                            "Forced iteration count is too low for {name} (minimum is {MIN_ARGON2_TIME})."
                        )))
                    }
                    Some(t) => (t, max_mem, None),
                    None => {
                        let mut out = Zeroizing::new(vec![0u8; key_len.max(4)]);
                        let measure = |time: u32, memory_kib: u32| {
                            let kdf = Kdf::Argon2 {
                                variant,
                                time,
                                memory_kib,
                                parallel,
                            };
                            kdf.check_memory()?;
                            let start = Instant::now();
                            kdf.derive(b"ucrypt-benchmark", &[0xa5; 32], &mut out)?;
                            Ok(start.elapsed().as_secs_f64() * 1000.0)
                        };
                        let f = argon2_search(measure, self.iter_time_ms, min_mem, max_mem)?;
                        (f.time, f.memory_kib, Some(Measured::Run(f)))
                    }
                };
                let kdf = Kdf::Argon2 {
                    variant,
                    time,
                    memory_kib,
                    parallel,
                };
                kdf.check_limits()
                    .and_then(|()| kdf.check_memory())
                    .map_err(|e| invalid(e.message().to_string()))?;
                Ok(Calibration { kdf, measured })
            }
            other => Err(invalid(format!(
                "Unknown PBKDF {other:?} (use pbkdf2, argon2i or argon2id)"
            ))),
        }
    }
}

/// Costs chosen by [`KdfRequest::calibrate`] and what they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The chosen KDF and costs.
    pub kdf: Kdf,
    /// What was measured (`None`: the costs were forced).
    pub measured: Option<Measured>,
}

/// A calibration's measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measured {
    /// PBKDF2 iterations per second of CPU time.
    Rate(f64),
    /// The Argon2 search's outcome.
    Run(Argon2Found),
}

impl Calibration {
    /// The `-v` line ("PBKDF argon2id: measured 2012 ms for m=… t=… p=…;
    /// chosen m=… KiB, t=…, p=…"); `None` for forced costs.
    pub fn line(&self) -> Option<String> {
        let m = self.measured?;
        Some(match (self.kdf, m) {
            (Kdf::Pbkdf2 { hash, iterations }, Measured::Rate(rate)) => format!(
                "PBKDF pbkdf2-{}: measured {:.0} iterations per second; chosen {iterations} iterations",
                hash.name(),
                rate
            ),
            (
                Kdf::Argon2 {
                    variant,
                    time,
                    memory_kib,
                    parallel,
                },
                Measured::Run(f),
            ) => format!(
                "PBKDF {}: measured {:.0} ms for m={} t={} p={parallel}; chosen m={memory_kib} KiB, t={time}, p={parallel}",
                variant.name(),
                f.ms,
                f.measured_memory_kib,
                f.measured_time,
            ),
            _ => return None,
        })
    }
}

/// What [`argon2_search`] chose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Argon2Found {
    /// Chosen time cost.
    pub time: u32,
    /// Chosen memory cost, KiB.
    pub memory_kib: u32,
    /// The last run measured: its time cost, memory cost and duration.
    pub measured_time: u32,
    /// See `measured_time`.
    pub measured_memory_kib: u32,
    /// Milliseconds the last measured run took (its shortest sample).
    pub ms: f64,
    /// Runs measured in all.
    pub runs: u32,
}

/// Shortest run (ms) phase 1 of the search trusts (cryptsetup's
/// `BENCH_MIN_MS`).
const BENCH_MIN_MS: f64 = 250.0;
/// Below this (ms) a run says little: grow 16-fold (`BENCH_MIN_MS_FAST`).
const BENCH_MIN_MS_FAST: f64 = 10.0;
/// Samples of a run in phase 1 (`BENCH_SAMPLES_FAST`), and at most of an
/// out-of-line run in phase 2.
const SAMPLES: u32 = 3;
/// A phase-2 run is out of line when it takes this much longer than the
/// previous run predicts (costs scale linearly): it is measured again.
const OUT_OF_LINE: f64 = 1.15;
/// Runs a search measures at most (each bounded by the target time or
/// 250 ms), so a clock that never settles still ends.
const MAX_RUNS: u32 = 24;

/// cryptsetup's Argon2 search (`crypt_argon2_check`) over a `measure(t,
/// m)` function returning milliseconds: phase 1 grows memory, then time,
/// from the minimum until a run takes 250 ms; phase 2 estimates the
/// target (`next_argon2_params`: up by memory first, down by time first)
/// and measures each candidate until one lands within 95–110 % of
/// `target_ms` or a limit is reached. A candidate run that is out of line
/// (over 15 % slower than the previous run predicts) and not too fast (it
/// would be kept, or lower the cost) is measured again, up to [`SAMPLES`]
/// times, and its shortest time kept: load on the machine only adds time,
/// so one slow run can neither lower the cost nor pass a candidate that
/// is too weak.
pub fn argon2_search(
    mut measure: impl FnMut(u32, u32) -> Result<f64>,
    target_ms: u32,
    min_memory_kib: u32,
    max_memory_kib: u32,
) -> Result<Argon2Found> {
    let target = f64::from(target_ms.max(1));
    let (atleast, atmost) = (target * 0.95, target * 1.10);
    let (min_t, min_m, max_m) = (MIN_ARGON2_TIME, min_memory_kib, max_memory_kib);
    if max_m < min_m {
        return Err(invalid("Argon2 memory ceiling is below its minimum"));
    }
    let mut runs = 0u32;
    // The shortest of up to SAMPLES runs, stopping at the first below
    // `enough` (a short run needs no confirming).
    let mut sample = |t: u32, m: u32, n: u32, enough: f64, runs: &mut u32| -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..n {
            *runs += 1;
            let ms = measure(t, m)?;
            best = best.min(ms);
            if ms < enough || *runs >= MAX_RUNS {
                break;
            }
        }
        Ok(best)
    };
    let (mut t, mut m) = (min_t, min_m);
    // Phase 1: some small costs that take at least BENCH_MIN_MS.
    let mut ms;
    loop {
        ms = sample(t, m, SAMPLES, BENCH_MIN_MS, &mut runs)?;
        if ms >= BENCH_MIN_MS || runs >= MAX_RUNS {
            break;
        }
        let grow = |c: u32| -> u32 {
            if ms < BENCH_MIN_MS_FAST {
                c.saturating_mul(16)
            } else {
                (f64::from(c) * BENCH_MIN_MS / ms).min(f64::from(u32::MAX)) as u32
            }
        };
        if m == max_m {
            let new = grow(t);
            if new == t {
                break;
            }
            t = new;
        } else {
            let new = grow(m).min(max_m);
            if new == m {
                break;
            }
            m = new;
        }
    }
    let (mut mt, mut mm) = (t, m);
    // Phase 2: estimate, measure, until a run lands in the band.
    loop {
        let last = (t, m);
        let done = next_argon2_params(&mut t, &mut m, min_t, min_m, max_m, ms, target);
        if done || (t, m) == last || runs >= MAX_RUNS {
            break;
        }
        let scale = (f64::from(t) * f64::from(m)) / (f64::from(mt) * f64::from(mm));
        let limit = ms * scale * OUT_OF_LINE;
        ms = sample(t, m, 1, 0.0, &mut runs)?;
        if ms > limit && ms >= atleast && runs < MAX_RUNS {
            // Out of line: measured again, stopping at a run in line.
            ms = ms.min(sample(t, m, SAMPLES - 1, limit, &mut runs)?);
        }
        (mt, mm) = (t, m);
        if (atleast..=atmost).contains(&ms) {
            break;
        }
    }
    Ok(Argon2Found {
        time: t,
        memory_kib: m,
        measured_time: mt,
        measured_memory_kib: mm,
        ms,
        runs,
    })
}

/// cryptsetup's `next_argon2_params`: new costs for `target` from a run of
/// `ms` at (`t`, `m`); `true` when a limit ends the search.
fn next_argon2_params(
    t: &mut u32,
    m: &mut u32,
    min_t: u32,
    min_m: u32,
    max_m: u32,
    ms: f64,
    target: f64,
) -> bool {
    let ms = ms.max(0.001);
    let clamp = |x: f64| x.clamp(0.0, f64::from(u32::MAX)) as u32;
    let (old_t, old_m) = (*t, *m);
    let work = f64::from(*t) * f64::from(*m) * target / ms;
    if ms > target {
        // Down: time cost first, then memory.
        let new_t = clamp(f64::from(*t) * target / ms);
        if new_t < min_t {
            *t = min_t;
            *m = clamp(work / f64::from(min_t));
            if *m < min_m {
                *m = min_m;
                return true;
            }
        } else {
            *t = new_t;
        }
    } else {
        // Up: memory first, then time.
        let new_m = clamp(f64::from(*m) * target / ms);
        if new_m > max_m {
            *m = max_m;
            *t = clamp(work / f64::from(max_m));
            if *t <= min_t {
                *t = min_t;
                return true;
            }
        } else if new_m < min_m {
            *m = min_m;
            return true;
        } else {
            *m = new_m;
        }
    }
    old_t == *t && old_m == *m
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

/// Shortest single PBKDF2 run, in ms of CPU time, that calibration
/// trusts (cryptsetup's `crypt_pbkdf_check`: more than 500 ms).
const PBKDF2_SAMPLE_MS: f64 = 500.0;

/// PBKDF2 iterations per second of CPU time for a `key_len`-byte output,
/// measured like cryptsetup's benchmark: grow the iterations until one run
/// takes over 500 ms, then scale. CPU time (not wall time) so a busy
/// machine does not make the estimate too small. Measured once per
/// process, hash and key length (format asks for the digest and the
/// keyslot).
pub fn pbkdf2_iterations_per_sec(hash: Hash, key_len: usize) -> f64 {
    static CACHE: Mutex<Vec<((Hash, usize), f64)>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, r)) = cache.iter().find(|(k, _)| *k == (hash, key_len)) {
        return r;
    }
    let r = pbkdf2_rate_with(|n| Ok(cpu_ms_pbkdf2(hash, key_len, n)), PBKDF2_SAMPLE_MS)
        .unwrap_or(f64::from(MIN_PBKDF2_ITERATIONS));
    cache.push(((hash, key_len), r));
    r
}

/// CPU milliseconds of one PBKDF2 run of `iterations`.
fn cpu_ms_pbkdf2(hash: Hash, key_len: usize, iterations: u32) -> f64 {
    let mut out = Zeroizing::new(vec![0u8; key_len.max(1)]);
    let clock = CpuClock::start();
    hash.pbkdf2(b"ucrypt-benchmark", &[0x5a; 32], iterations, &mut out);
    clock.elapsed().as_secs_f64() * 1000.0
}

/// cryptsetup's `crypt_pbkdf_check` over a `measure(iterations)` function
/// returning milliseconds: from 2^15 iterations, grow 16-, 8-, 4- or
/// 2-fold by how far the run fell short, until one takes over `min_ms`;
/// iterations per second from that run.
pub fn pbkdf2_rate_with(mut measure: impl FnMut(u32) -> Result<f64>, min_ms: f64) -> Result<f64> {
    let mut iterations: u32 = 1 << 15;
    for _ in 0..12 {
        let ms = measure(iterations)?;
        if ms > min_ms || iterations == u32::MAX {
            return Ok(f64::from(iterations) * 1000.0 / ms.max(0.001));
        }
        let shift = if ms <= min_ms / 8.0 {
            4
        } else if ms <= min_ms / 4.0 {
            3
        } else if ms <= min_ms / 2.0 {
            2
        } else {
            1
        };
        iterations = (u64::from(iterations) << shift).min(u64::from(u32::MAX)) as u32;
    }
    Err(invalid("PBKDF2 benchmark did not settle"))
}

/// Iterations that take `iter_time_ms` at `rate` per second, within
/// cryptsetup's limits.
fn iterations_for(rate: f64, iter_time_ms: u32) -> u32 {
    let n = rate * f64::from(iter_time_ms) / 1000.0;
    (n.min(f64::from(u32::MAX)) as u32).max(MIN_PBKDF2_ITERATIONS)
}

/// PBKDF2 iterations that take `iter_time_ms` for a `key_len`-byte output
/// (from [`pbkdf2_iterations_per_sec`]), at least the minimum cryptsetup
/// accepts.
pub fn calibrate_pbkdf2(hash: Hash, key_len: usize, iter_time_ms: u32) -> u32 {
    iterations_for(pbkdf2_iterations_per_sec(hash, key_len), iter_time_ms)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2id_rfc9106_shape() {
        // Same inputs twice give the same output; a different salt differs.
        let kdf = Kdf::Argon2 {
            variant: Argon2Variant::Id,
            time: 4,
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
    }

    /// A fake Argon2 clock: `k` ms per KiB-pass, with `noise(i)` the
    /// factor of the i-th run.
    fn fake(k: f64, noise: impl Fn(u32) -> f64) -> impl FnMut(u32, u32) -> Result<f64> {
        let mut i = 0;
        move |t, m| {
            i += 1;
            Ok(k * f64::from(t) * f64::from(m) * noise(i))
        }
    }

    /// What the chosen costs really take under the fake clock.
    fn real_ms(k: f64, f: &Argon2Found) -> f64 {
        k * f64::from(f.time) * f64::from(f.memory_kib)
    }

    #[test]
    fn argon2_search_lands_in_the_band_growing_memory_first() {
        // 2000 ms is 1 GiB at t=4 here: the memory ceiling, minimum time.
        let k = 2000.0 / (4.0 * 1048576.0);
        let f = argon2_search(fake(k, |_| 1.0), 2000, 32, 1048576).unwrap();
        assert_eq!(f.memory_kib, 1048576, "{f:?}");
        assert!((1900.0..=2200.0).contains(&real_ms(k, &f)), "{f:?}");
        // A smaller ceiling: the time cost goes up instead.
        let f = argon2_search(fake(k, |_| 1.0), 2000, 32, 262144).unwrap();
        assert_eq!(f.memory_kib, 262144, "{f:?}");
        assert!(f.time >= 15, "{f:?}");
        assert!((1900.0..=2200.0).contains(&real_ms(k, &f)), "{f:?}");
    }

    #[test]
    fn noisy_measurements_do_not_weaken_the_choice() {
        let k = 2000.0 / (4.0 * 1048576.0);
        type Noise = Box<dyn Fn(u32) -> f64>;
        let cases: [(&str, Noise); 6] = [
            (
                "first run 20x slow",
                Box::new(|i| if i == 1 { 20.0 } else { 1.0 }),
            ),
            (
                "first run 20x fast",
                Box::new(|i| if i == 1 { 0.05 } else { 1.0 }),
            ),
            (
                "every run of phase 1 slow",
                Box::new(|i| if i <= 6 { 8.0 } else { 1.0 }),
            ),
            // Every other run is twice as slow: the confirming run wins.
            (
                "alternate runs slow",
                Box::new(|i| if i % 2 == 0 { 2.0 } else { 1.0 }),
            ),
            (
                "one slow run in three",
                Box::new(|i| if i % 3 == 1 { 3.0 } else { 1.0 }),
            ),
            // A weak candidate made to look right by one slow run.
            (
                "slow run at the band",
                Box::new(|i| if i == 5 { 1.9 } else { 1.0 }),
            ),
        ];
        for (what, noise) in cases {
            let f = argon2_search(fake(k, noise), 2000, 32, 1048576).unwrap();
            let ms = real_ms(k, &f);
            assert!(ms >= 0.9 * 2000.0, "{what}: chose {ms} ms: {f:?}");
            assert!(f.runs <= MAX_RUNS, "{what}: {f:?}");
        }
    }

    #[test]
    fn argon2_search_stops_at_the_limits() {
        // Even 32 KiB at t=4 is slower than the target: the minimum.
        let f = argon2_search(fake(100.0, |_| 1.0), 10, 32, 1048576).unwrap();
        assert_eq!((f.time, f.memory_kib), (MIN_ARGON2_TIME, 32));
        // A clock that never settles ends after MAX_RUNS runs.
        let mut flip = false;
        let wild = |_t: u32, _m: u32| {
            flip = !flip;
            Ok(if flip { 1.0 } else { 1e6 })
        };
        let f = argon2_search(wild, 2000, 32, 1048576).unwrap();
        assert!(f.runs <= MAX_RUNS, "{f:?}");
        assert!(argon2_search(fake(1.0, |_| 1.0), 2000, 64, 32).is_err());
    }

    #[test]
    fn pbkdf2_rate_comes_from_a_long_run() {
        // 1000 iterations per ms; the first run is 10x slow.
        let mut i = 0;
        let measure = |n: u32| {
            i += 1;
            Ok(f64::from(n) / 1000.0 * if i == 1 { 10.0 } else { 1.0 })
        };
        let rate = pbkdf2_rate_with(measure, 500.0).unwrap();
        assert_eq!(rate, 1_000_000.0);
        assert_eq!(iterations_for(rate, 2000), 2_000_000);
        assert_eq!(iterations_for(1.0, 2000), MIN_PBKDF2_ITERATIONS);
        assert_eq!(iterations_for(1e12, 100_000), u32::MAX);
    }

    #[test]
    fn real_argon2_calibration_reaches_the_target() {
        // Measured by the search's own runs, not by a clock here: the
        // chosen costs, scaled from the last run, take at least half the
        // target.
        let req = KdfRequest {
            kind: "argon2id".into(),
            iter_time_ms: 300,
            memory_kib: Some(64 * 1024),
            parallel: Some(1),
            ..KdfRequest::default()
        };
        let cal = req.calibrate(32).unwrap();
        let Some(Measured::Run(f)) = cal.measured else {
            panic!("not measured: {cal:?}")
        };
        let scale = (f64::from(f.time) * f64::from(f.memory_kib))
            / (f64::from(f.measured_time) * f64::from(f.measured_memory_kib));
        assert!(f.ms * scale >= 150.0, "{f:?}");
        let line = cal.line().unwrap();
        assert!(line.starts_with("PBKDF argon2id: measured "), "{line}");
        assert!(line.contains("; chosen m="), "{line}");
    }

    #[test]
    fn options_beyond_cryptsetup_limits_are_refused_with_its_words() {
        let argon = |memory_kib, parallel, force| KdfRequest {
            kind: "argon2id".into(),
            force_iterations: force,
            memory_kib,
            parallel,
            ..KdfRequest::default()
        };
        for (req, msg) in [
            (
                argon(Some(MAX_ARGON2_MEMORY_KIB + 1), Some(1), Some(4)),
                "Requested maximum PBKDF memory cost is too high (maximum is 4194304 kilobytes).",
            ),
            (
                argon(Some(0), Some(1), Some(4)),
                "Requested maximum PBKDF memory cannot be zero.",
            ),
            (
                argon(Some(1024), Some(0), Some(4)),
                "Requested PBKDF parallel threads cannot be zero.",
            ),
            (
                argon(Some(16), Some(1), Some(4)),
                "Forced memory cost is too low for argon2id (minimum is 32 kilobytes).",
            ),
            (
                argon(Some(1024), Some(1), Some(3)),
                "Forced iteration count is too low for argon2id (minimum is 4).",
            ),
        ] {
            let e = req.resolve(32).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert_eq!(e.message(), msg);
        }
        // More lanes than 4 are lowered to 4, as cryptsetup does.
        match argon(Some(1024), Some(16), Some(4)).resolve(32).unwrap() {
            Kdf::Argon2 { parallel, .. } => assert_eq!(parallel, MAX_ARGON2_PARALLEL),
            k => panic!("{k:?}"),
        }
    }

    #[test]
    fn header_costs_beyond_cryptsetup_limits_are_refused() {
        let a = |time, memory_kib, parallel| Kdf::Argon2 {
            variant: Argon2Variant::Id,
            time,
            memory_kib,
            parallel,
        };
        assert!(a(4, 32, 1).check_limits().is_ok());
        assert!(a(u32::MAX, MAX_ARGON2_MEMORY_KIB, 4).check_limits().is_ok());
        // Below what ucrypt writes, but cryptsetup loads them (its own
        // validation suite's valid header: m=16 KiB).
        assert!(a(1, 16, 1).check_limits().is_ok());
        assert!(a(3, 1024, 1).check_limits().is_ok());
        for bad in [
            a(0, 1024, 1),
            a(4, 16, 4),
            a(4, 64 << 20, 4),
            a(4, 1024, 5),
            a(4, 1024, 0),
        ] {
            assert_eq!(
                bad.check_limits().unwrap_err().kind(),
                ErrorKind::Corrupt,
                "{bad:?}"
            );
        }
        let p = |iterations| Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations,
        };
        assert!(p(0).check_limits().is_err());
        assert!(p(999).check_limits().is_ok());
        assert!(p(u32::MAX).check_limits().is_ok());
    }

    #[test]
    fn a_huge_but_legal_cost_gets_a_notice() {
        // 2^32-1 PBKDF2 iterations: no machine does them in 5 s.
        let huge = Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: u32::MAX,
        }
        .estimate(32);
        let n = huge.notice(3).expect("a notice");
        assert!(n.starts_with("Keyslot 3 needs about "), "{n}");
        assert!(n.contains("press Ctrl-C"), "{n}");
        // Ordinary costs are not even measured.
        let cheap = Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: 1000,
        }
        .estimate(32);
        assert_eq!(cheap.secs, 0.0);
        assert!(cheap.notice(0).is_none());
        let argon = Kdf::Argon2 {
            variant: Argon2Variant::Id,
            time: 4,
            memory_kib: 1 << 20,
            parallel: 4,
        }
        .estimate(32);
        assert_eq!((argon.secs, argon.memory_kib), (0.0, 1 << 20));
    }
}
