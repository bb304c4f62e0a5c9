//! In-memory throughput measurements (no storage IO): the numbers behind
//! `ucrypt benchmark` and the bench helper's crypto bound, plus PBKDF2 and
//! Argon2 iterations per second (cryptsetup's benchmark header lines).
//!
//! Throughput divides by the measuring thread's CPU time (from
//! `/proc/thread-self/schedstat`, nanoseconds), as `openssl speed` divides
//! by user CPU time and `cryptsetup benchmark` by rusage: on a shared
//! machine wall time would measure the neighbours, not the cipher. Where
//! that file is missing, wall time is used.

use std::time::{Duration, Instant};

use crate::SectorCrypt;

/// Bytes per second in each direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throughput {
    /// Encryption speed in bytes per second.
    pub encrypt_bytes_per_sec: f64,
    /// Decryption speed in bytes per second.
    pub decrypt_bytes_per_sec: f64,
}

/// Measures `c` on one thread, calling `encrypt`/`decrypt` on buffers of
/// `bytes_per_call` (rounded down to whole sectors, at least one) for about
/// `dur` per direction.
pub fn throughput(c: &SectorCrypt, bytes_per_call: usize, dur: Duration) -> Throughput {
    let ss = c.sector_size();
    let len = (bytes_per_call / ss).max(1) * ss;
    let mut buf: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31)).collect();
    let step = (ss / 512) as u64;
    let per_call_sectors = (len / ss) as u64 * step;
    let enc = measure(dur, len, |n| {
        c.encrypt(n * per_call_sectors % (1 << 40), &mut buf)
    });
    let dec = measure(dur, len, |n| {
        c.decrypt(n * per_call_sectors % (1 << 40), &mut buf)
    });
    Throughput {
        encrypt_bytes_per_sec: enc,
        decrypt_bytes_per_sec: dec,
    }
}

/// Runs `f(call_index)` until `dur` of CPU time has passed (checking the
/// clock every few calls) and returns bytes per CPU-second.
fn measure(dur: Duration, len: usize, mut f: impl FnMut(u64)) -> f64 {
    // Warm up caches and the OpenSSL context pool.
    f(0);
    let clock = Clock::start();
    let mut calls = 0u64;
    let mut batch = 1u64;
    loop {
        for _ in 0..batch {
            f(calls);
            calls += 1;
        }
        let el = clock.elapsed();
        if el >= dur {
            return (calls as f64 * len as f64) / el.as_secs_f64().max(1e-9);
        }
        // Aim for ~20 clock checks per measurement.
        if el < dur / 20 {
            batch *= 2;
        }
    }
}

/// The calling thread's CPU time, or wall time where unavailable.
enum Clock {
    Cpu(Duration),
    Wall(Instant),
}

impl Clock {
    fn start() -> Self {
        match thread_cpu_time() {
            Some(t) => Self::Cpu(t),
            None => Self::Wall(Instant::now()),
        }
    }

    fn elapsed(&self) -> Duration {
        match self {
            Self::Cpu(t0) => thread_cpu_time().map_or(Duration::ZERO, |t| t.saturating_sub(*t0)),
            Self::Wall(t0) => t0.elapsed(),
        }
    }
}

/// Nanoseconds this thread has run on a CPU (first schedstat field).
fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Runs the system `openssl speed -evp aes-256-xts -bytes 4096` for
/// `dur` (rounded up to whole seconds) and returns its bytes per second:
/// the reference the XTS target is measured against.
pub fn system_openssl_xts(dur: Duration) -> Result<f64, crate::Error> {
    let secs = dur.as_secs().max(1).to_string();
    let out = std::process::Command::new("openssl")
        .args([
            "speed",
            "-evp",
            "aes-256-xts",
            "-bytes",
            "4096",
            "-seconds",
            &secs,
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| crate::Error::unsupported(format!("Cannot run the system openssl: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_openssl_speed(&text).ok_or_else(|| {
        crate::Error::unsupported("Cannot read the `openssl speed` output (no AES-256-XTS line)")
    })
}

/// Parses the `AES-256-XTS  6894161.92k` result line (thousands of bytes/s).
fn parse_openssl_speed(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("aes-256-xts"))?;
    let v = line.split_whitespace().last()?.strip_suffix('k')?;
    let k: f64 = v.parse().ok()?;
    (k.is_finite() && k > 0.0).then_some(k * 1000.0)
}

/// Key-derivation hash for [`pbkdf2_iterations_per_sec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PbkdfHash {
    /// HMAC-SHA1.
    Sha1,
    /// HMAC-SHA256.
    Sha256,
    /// HMAC-SHA512.
    Sha512,
}

impl PbkdfHash {
    /// cryptsetup's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
            Self::Sha512 => "sha512",
        }
    }
}

/// PBKDF2 iterations per CPU-second for a 256-bit output key (cryptsetup's
/// benchmark measures the same: a 32-byte key from a short password).
pub fn pbkdf2_iterations_per_sec(hash: PbkdfHash, dur: Duration) -> f64 {
    let password = b"foobarfo";
    let salt = [0x5au8; 32];
    let mut out = [0u8; 32];
    let mut rounds = 1000u32;
    let start = Clock::start();
    let mut total = 0u64;
    while start.elapsed() < dur {
        match hash {
            PbkdfHash::Sha1 => pbkdf2::pbkdf2_hmac::<sha1::Sha1>(password, &salt, rounds, &mut out),
            PbkdfHash::Sha256 => {
                pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, &salt, rounds, &mut out)
            }
            PbkdfHash::Sha512 => {
                pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password, &salt, rounds, &mut out)
            }
        }
        total += u64::from(rounds);
        rounds = rounds.saturating_mul(2).min(1 << 22);
    }
    total as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

/// Argon2 variant for [`argon2_rate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Argon2Kind {
    /// Argon2i.
    I,
    /// Argon2id.
    Id,
}

/// One Argon2 measurement: cost parameters and how long one hash took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Argon2Rate {
    /// Time cost (iterations).
    pub iterations: u32,
    /// Memory cost in KiB.
    pub memory_kib: u32,
    /// Lanes (parallel threads).
    pub parallel: u32,
    /// CPU seconds one hash with these parameters took (lanes run one after
    /// another here).
    pub seconds: f64,
}

/// Times one Argon2 hash with cryptsetup's minimum benchmark cost
/// (4 iterations, `memory_kib`, `parallel` lanes) and returns the rate.
pub fn argon2_rate(
    kind: Argon2Kind,
    memory_kib: u32,
    parallel: u32,
) -> Result<Argon2Rate, crate::Error> {
    let iterations = 4;
    let params = argon2::Params::new(memory_kib, iterations, parallel, Some(32))
        .map_err(|e| crate::Error::invalid(format!("Invalid Argon2 parameters: {e}")))?;
    let alg = match kind {
        Argon2Kind::I => argon2::Algorithm::Argon2i,
        Argon2Kind::Id => argon2::Algorithm::Argon2id,
    };
    let a = argon2::Argon2::new(alg, argon2::Version::V0x13, params);
    let mut out = [0u8; 32];
    let start = Clock::start();
    a.hash_password_into(b"foobarfo", &[0x5au8; 32], &mut out)
        .map_err(|e| crate::Error::invalid(format!("Argon2 failed: {e}")))?;
    Ok(Argon2Rate {
        iterations,
        memory_kib,
        parallel,
        seconds: start.elapsed().as_secs_f64().max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CryptConfig;

    #[test]
    fn throughput_is_positive_and_finite() {
        let c = SectorCrypt::new(&CryptConfig {
            cipher: "aes-xts-plain64".into(),
            key: zeroize::Zeroizing::new((0..64).collect()),
            iv_offset: 0,
            sector_size: 512,
            iv_large_sectors: false,
        })
        .unwrap();
        let t = throughput(&c, 4096, Duration::from_millis(20));
        assert!(t.encrypt_bytes_per_sec.is_finite() && t.encrypt_bytes_per_sec > 0.0);
        assert!(t.decrypt_bytes_per_sec.is_finite() && t.decrypt_bytes_per_sec > 0.0);
        assert!(pbkdf2_iterations_per_sec(PbkdfHash::Sha256, Duration::from_millis(20)) > 0.0);
        let r = argon2_rate(Argon2Kind::Id, 1024, 1).unwrap();
        assert!(r.seconds > 0.0);
    }

    #[test]
    fn reads_openssl_speed_output() {
        let out = "The 'numbers' are in 1000s of bytes per second processed.\ntype           4096 bytes\nAES-256-XTS    6894161.92k\n";
        assert_eq!(parse_openssl_speed(out), Some(6_894_161_920.0));
        assert_eq!(parse_openssl_speed("garbage"), None);
    }
}
