//! In-memory cipher throughput (no storage IO): `ucrypt benchmark`'s
//! cipher rows ([`cipher_row`], [`DEFAULT_CIPHERS`]), its comparison with
//! the system OpenSSL, and the bench helper's crypto bound ([`throughput`]).
//! Key-derivation cost (the PBKDF2 and Argon2 lines) is measured in one
//! place only, `luks::kdf`, with the same rules `format` uses.
//!
//! Throughput divides by the measuring thread's CPU time (from
//! `/proc/thread-self/schedstat`, nanoseconds), as `openssl speed` divides
//! by user CPU time and `cryptsetup benchmark` by rusage: on a shared
//! machine wall time would measure the neighbours, not the cipher. Where
//! that file is missing, wall time is used. [`CpuClock`] is that clock.

use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use crate::{CipherSpec, CryptConfig, SectorCrypt};

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
    system_openssl_xts_bytes(4096, dur)
}

/// Like [`system_openssl_xts`] with `-bytes bytes` (one EVP call per
/// `bytes`, as a dm-crypt sector of that size costs).
pub fn system_openssl_xts_bytes(bytes: usize, dur: Duration) -> Result<f64, crate::Error> {
    let secs = dur.as_secs().max(1).to_string();
    let out = std::process::Command::new("openssl")
        .args([
            "speed",
            "-evp",
            "aes-256-xts",
            "-bytes",
            &bytes.to_string(),
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

/// `cryptsetup benchmark`'s cipher rows when no cipher is named, in its
/// order (cryptsetup 2.6's `bciphers`: AES, Serpent and Twofish in CBC with
/// 128- and 256-bit keys, then in XTS with 256- and 512-bit keys), and
/// `cipher_null` (ucrypt's own last row: the cost of the data path without
/// a cipher): (dm-crypt spec, key bits).
pub const DEFAULT_CIPHERS: [(&str, usize); 13] = [
    ("aes-cbc-plain64", 128),
    ("serpent-cbc-plain64", 128),
    ("twofish-cbc-plain64", 128),
    ("aes-cbc-plain64", 256),
    ("serpent-cbc-plain64", 256),
    ("twofish-cbc-plain64", 256),
    ("aes-xts-plain64", 256),
    ("serpent-xts-plain64", 256),
    ("twofish-xts-plain64", 256),
    ("aes-xts-plain64", 512),
    ("serpent-xts-plain64", 512),
    ("twofish-xts-plain64", 512),
    ("cipher_null-ecb", 0),
];

/// The spec and key size a benchmark of `cipher` measures: the IV mode
/// defaults to plain64 (it does not change the speed), the key to 512 bits
/// for XTS, none for cipher_null and 256 bits otherwise.
pub fn cipher_choice(cipher: &str, key_bits: Option<usize>) -> (String, usize) {
    let spec = if cipher == "cipher_null" {
        "cipher_null-ecb".to_owned()
    } else if cipher.starts_with("capi:")
        || cipher.matches('-').count() >= 2
        || cipher.ends_with("-ecb")
    {
        cipher.to_owned()
    } else {
        format!("{cipher}-plain64")
    };
    let default_bits = if spec.contains("cipher_null") {
        0
    } else if spec.contains("xts") {
        512
    } else {
        256
    };
    (spec, key_bits.unwrap_or(default_bits))
}

/// cryptsetup's row name for a spec: cipher and chain mode without the IV
/// (`aes-xts-plain64` -> `aes-xts`); kernel-API specs stay whole.
pub fn row_name(spec: &str) -> String {
    match CipherSpec::parse(spec) {
        Ok(s) if !s.capi => {
            let mut parts = spec.split('-');
            let c = parts.next().unwrap_or(spec);
            let c = c.split(':').next().unwrap_or(c);
            match parts.next() {
                Some(m) => format!("{c}-{m}"),
                None => c.to_owned(),
            }
        }
        _ => spec.to_owned(),
    }
}

/// One measured cipher row of the benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct CipherRow {
    /// cryptsetup's row name ([`row_name`]).
    pub name: String,
    /// Key size in bits.
    pub key_bits: usize,
    /// Measured speed.
    pub speed: Throughput,
    /// Which implementation ran ([`SectorCrypt::implementation`]).
    pub implementation: &'static str,
}

/// Measures `spec` with a fixed `key_bits`-bit key and `sector_size`-byte
/// sectors for about `dur` per direction (see [`throughput`]). Refuses a key
/// size that is not whole bytes, and whatever [`SectorCrypt::new`] refuses.
pub fn cipher_row(
    spec: &str,
    key_bits: usize,
    sector_size: u32,
    bytes_per_call: usize,
    dur: Duration,
) -> Result<CipherRow, crate::Error> {
    if key_bits % 8 != 0 {
        return Err(crate::error::key(format!(
            "Invalid key size {key_bits}: not a whole number of bytes"
        )));
    }
    let cfg = CryptConfig {
        cipher: spec.to_owned(),
        key: Zeroizing::new(
            (0..key_bits / 8)
                .map(|i| (i as u8).wrapping_mul(151).wrapping_add(7))
                .collect(),
        ),
        iv_offset: 0,
        sector_size,
        iv_large_sectors: false,
    };
    let c = SectorCrypt::new(&cfg)?;
    Ok(CipherRow {
        name: row_name(spec),
        key_bits,
        speed: throughput(&c, bytes_per_call, dur),
        implementation: c.implementation(),
    })
}

/// Our AES-XTS at one sector size next to the system `openssl speed`.
#[derive(Debug)]
pub struct XtsAtSectorSize {
    /// Sector size in bytes (512 or 4096).
    pub sector_size: u32,
    /// Which XTS implementation ran (`none` if neither key size could be set up).
    pub implementation: &'static str,
    /// The system OpenSSL's AES-256-XTS bytes per second with one EVP call
    /// per `sector_size` bytes (`openssl speed -bytes`), or why not.
    pub system_openssl: Result<f64, crate::Error>,
    /// (key bits, our speed) for 256- and 512-bit keys, 4 KiB per call.
    pub ours: Vec<(usize, Throughput)>,
}

/// Our AES-XTS at 512- and 4096-byte sectors next to the system `openssl
/// speed` at the same sizes.
#[derive(Debug)]
pub struct XtsComparison {
    /// 512-byte sectors (dm-crypt's default, LUKS1's only size), then 4096.
    pub sizes: Vec<XtsAtSectorSize>,
}

impl XtsComparison {
    /// The measurement at `sector_size`, if taken.
    pub fn at(&self, sector_size: u32) -> Option<&XtsAtSectorSize> {
        self.sizes.iter().find(|s| s.sector_size == sector_size)
    }

    /// Our 512-byte-sector speed over our 4096-byte-sector speed for
    /// `key_bits`, (encryption, decryption).
    pub fn small_to_large(&self, key_bits: usize) -> Option<(f64, f64)> {
        let get = |ss| {
            self.at(ss)?
                .ours
                .iter()
                .find(|(b, _)| *b == key_bits)
                .map(|(_, t)| *t)
        };
        let (s, l) = (get(512)?, get(4096)?);
        Some((
            s.encrypt_bytes_per_sec / l.encrypt_bytes_per_sec,
            s.decrypt_bytes_per_sec / l.decrypt_bytes_per_sec,
        ))
    }
}

/// Rounds of [`compare_xts_with_system_openssl`]: each measures every
/// (sector size, key size) cell for [`COMPARE_ROUND`] per direction, the
/// cells interleaved so that a busy spell on a shared machine hits both
/// sector sizes alike; each cell keeps its best round.
const COMPARE_ROUNDS: usize = 5;
/// CPU time per direction of one cell in one round.
const COMPARE_ROUND: Duration = Duration::from_millis(60);

/// Measures our `aes-xts-plain64` on 512- and 4096-byte sectors, 4 KiB per
/// call, with 256- and 512-bit keys: the best of [`COMPARE_ROUNDS`]
/// interleaved rounds per direction (neighbours on a shared machine only
/// slow a round down), and one second of the system `openssl speed` at
/// each size ([`system_openssl_xts_bytes`]; skipped at 512 when it failed
/// at 4096).
pub fn compare_xts_with_system_openssl() -> XtsComparison {
    let large = system_openssl_xts_bytes(4096, Duration::from_secs(1));
    let small = match &large {
        Ok(_) => system_openssl_xts_bytes(512, Duration::from_secs(1)),
        Err(e) => Err(crate::Error::unsupported(e.message().to_owned())),
    };
    // (sector size, key bits, cipher, best so far) for every cell set up.
    let mut cells: Vec<(u32, usize, SectorCrypt, Throughput)> = Vec::new();
    for sector_size in [512u32, 4096] {
        for bits in [256usize, 512] {
            let cfg = CryptConfig {
                cipher: "aes-xts-plain64".into(),
                key: Zeroizing::new((0..bits / 8).map(|i| i as u8).collect()),
                iv_offset: 0,
                sector_size,
                iv_large_sectors: false,
            };
            if let Ok(c) = SectorCrypt::new(&cfg) {
                let zero = Throughput {
                    encrypt_bytes_per_sec: 0.0,
                    decrypt_bytes_per_sec: 0.0,
                };
                cells.push((sector_size, bits, c, zero));
            }
        }
    }
    for _ in 0..COMPARE_ROUNDS {
        for (_, _, c, best) in cells.iter_mut() {
            let t = throughput(c, 4096, COMPARE_ROUND);
            best.encrypt_bytes_per_sec = best.encrypt_bytes_per_sec.max(t.encrypt_bytes_per_sec);
            best.decrypt_bytes_per_sec = best.decrypt_bytes_per_sec.max(t.decrypt_bytes_per_sec);
        }
    }
    let sizes = [(512u32, small), (4096, large)]
        .into_iter()
        .map(|(sector_size, system_openssl)| {
            let mine = || cells.iter().filter(move |c| c.0 == sector_size);
            XtsAtSectorSize {
                sector_size,
                implementation: mine().next_back().map_or("none", |c| c.2.implementation()),
                system_openssl,
                ours: mine().map(|c| (c.1, c.3)).collect(),
            }
        })
        .collect();
    XtsComparison { sizes }
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
    fn benchmark_choices_and_row_names() {
        assert_eq!(
            cipher_choice("aes-xts", None),
            ("aes-xts-plain64".to_owned(), 512)
        );
        assert_eq!(
            cipher_choice("aes-cbc-essiv:sha256", Some(128)),
            ("aes-cbc-essiv:sha256".to_owned(), 128)
        );
        assert_eq!(
            cipher_choice("cipher_null", None),
            ("cipher_null-ecb".to_owned(), 0)
        );
        assert_eq!(row_name("aes-xts-plain64"), "aes-xts");
        assert_eq!(row_name("cipher_null-ecb"), "cipher_null-ecb");
        assert_eq!(row_name("capi:xts(aes)-plain64"), "capi:xts(aes)-plain64");
        let r = cipher_row("aes-cbc-plain64", 128, 512, 4096, Duration::from_millis(5)).unwrap();
        assert_eq!((r.name.as_str(), r.key_bits), ("aes-cbc", 128));
        assert!(r.speed.encrypt_bytes_per_sec > 0.0);
        assert!(cipher_row("aes-xts-plain64", 100, 512, 4096, Duration::ZERO).is_err());
    }

    #[test]
    fn reads_openssl_speed_output() {
        let out = "The 'numbers' are in 1000s of bytes per second processed.\ntype           4096 bytes\nAES-256-XTS    6894161.92k\n";
        assert_eq!(parse_openssl_speed(out), Some(6_894_161_920.0));
        assert_eq!(parse_openssl_speed("garbage"), None);
    }
}
