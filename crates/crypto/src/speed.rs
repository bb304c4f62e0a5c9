//! In-memory cipher throughput (no storage IO): the numbers behind
//! `ucrypt benchmark`'s cipher rows and the bench helper's crypto bound.
//! Key-derivation cost (the PBKDF2 and Argon2 lines) is measured in one
//! place only, `luks::kdf`, with the same rules `format` uses.
//!
//! Throughput divides by the measuring thread's CPU time (from
//! `/proc/thread-self/schedstat`, nanoseconds), as `openssl speed` divides
//! by user CPU time and `cryptsetup benchmark` by rusage: on a shared
//! machine wall time would measure the neighbours, not the cipher. Where
//! that file is missing, wall time is used. [`CpuClock`] is that clock.

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
    let clock = CpuClock::start();
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

/// Measures the calling thread's CPU time, or wall time where the kernel
/// does not report it; bound to the thread that started it.
#[derive(Clone, Copy, Debug)]
pub struct CpuClock(ClockStart);

#[derive(Clone, Copy, Debug)]
enum ClockStart {
    Cpu(Duration),
    Wall(Instant),
}

impl CpuClock {
    /// Starts measuring now.
    pub fn start() -> Self {
        Self(match thread_cpu_time() {
            Some(t) => ClockStart::Cpu(t),
            None => ClockStart::Wall(Instant::now()),
        })
    }

    /// CPU time this thread has used since [`CpuClock::start`] (wall time
    /// where CPU time is unavailable).
    pub fn elapsed(&self) -> Duration {
        match self.0 {
            ClockStart::Cpu(t0) => {
                thread_cpu_time().map_or(Duration::ZERO, |t| t.saturating_sub(t0))
            }
            ClockStart::Wall(t0) => t0.elapsed(),
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
    }

    #[test]
    fn reads_openssl_speed_output() {
        let out = "The 'numbers' are in 1000s of bytes per second processed.\ntype           4096 bytes\nAES-256-XTS    6894161.92k\n";
        assert_eq!(parse_openssl_speed(out), Some(6_894_161_920.0));
        assert_eq!(parse_openssl_speed("garbage"), None);
    }
}
