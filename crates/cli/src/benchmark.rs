//! `ucrypt benchmark`: cryptsetup benchmark's in-memory table. Cipher
//! rows come from `crypto::speed`, the PBKDF2 and Argon2 lines from
//! `luks::kdf` (the estimator `format` uses, so the two agree), and the
//! AES-XTS row is set beside the system `openssl speed`.
//!
//! ```text
//!  Request ─► measure ─┬─ crypto::speed::cipher_row (per cipher)  ─┐
//!                      ├─ luks::kdf (PBKDF2 rates, Argon2 costs)   ├─► Table
//!                      └─ crypto::speed::compare_xts_with_system…  ┘   │
//!                                     Display (cryptsetup's layout) ◄──┤
//!                                     Table::json (`--json`)        ◄──┘
//! ```

use std::fmt;
use std::time::Duration;

use crypto::speed::{self, CipherRow, XtsComparison};
use luks::kdf::{self, Argon2Variant, DEFAULT_ITER_TIME_MS};
use luks::{Hash, Kdf};
use serde_json::json;

/// Bytes per second to MiB/s.
fn mib(bytes_per_s: f64) -> f64 {
    bytes_per_s / (1024.0 * 1024.0)
}

/// Why `ucrypt benchmark` measured nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `--sector-size` not a power of two in 512..=4096 (a usage error).
    SectorSize(u32),
    /// A key size that is not whole bytes (a usage error).
    KeyBits(usize),
    /// A cipher could not be measured.
    Benchmark {
        /// The cipher spec.
        spec: String,
        /// Key size in bits.
        bits: usize,
        /// Cause.
        source: crypto::Error,
    },
    /// A KDF's cost could not be estimated.
    Kdf(luks::Error),
}

impl Error {
    /// Bad options (rather than a failed measurement).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::SectorSize(_) | Error::KeyBits(_))
    }

    /// The message with every cause, as printed after `ucrypt: `.
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(c) = cur {
            let m = c.to_string();
            if !s.ends_with(&m) {
                s.push_str(": ");
                s.push_str(&m);
            }
            cur = c.source();
        }
        s
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::SectorSize(ss) => {
                write!(f, "Invalid --sector-size {ss}: a power of two in 512..4096")
            }
            Error::KeyBits(bits) => {
                write!(f, "Invalid key size {bits}: not a whole number of bytes")
            }
            Error::Benchmark { spec, bits, .. } => {
                write!(f, "Cannot benchmark {spec} with a {bits}-bit key")
            }
            Error::Kdf(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Benchmark { source, .. } => Some(source),
            // Transparent: the KDF error is the message itself.
            Error::Kdf(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

/// Time given to each direction of each cipher row.
const CELL: Duration = Duration::from_millis(100);
/// Bytes per encrypt/decrypt call (cryptsetup benchmarks 1 MiB buffers).
const BENCH_BUF: usize = 1 << 20;

/// What to measure.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Only this cipher (`aes-xts-plain64`, `aes-cbc`, …); every default
    /// cipher and the KDF lines when `None`, as cryptsetup does.
    pub cipher: Option<String>,
    /// Key size in bits (default: 512 for XTS, else 256).
    pub key_size: Option<usize>,
    /// Encryption sector size in bytes (a power of two in 512..=4096).
    pub sector_size: u32,
    /// Set our AES-XTS beside the system `openssl speed`.
    pub compare_openssl: bool,
}

/// One Argon2 line: the costs `format` would choose for the default
/// `--iter-time` (see `luks::kdf::benchmark_argon2`).
#[derive(Debug, Clone)]
pub struct ArgonRow {
    /// `argon2i` or `argon2id`.
    pub name: &'static str,
    /// Iterations (time cost).
    pub iterations: u32,
    /// Memory cost in KiB.
    pub memory_kib: u32,
    /// Lanes.
    pub parallel: u32,
}

/// The measured table; its `Display` is cryptsetup's layout.
#[derive(Debug)]
pub struct Table {
    /// Cipher rows, in order.
    pub rows: Vec<CipherRow>,
    /// PBKDF2 iterations per second per hash (empty with a cipher given).
    pub pbkdf: Vec<(Hash, f64)>,
    /// Argon2 costs (empty with a cipher given).
    pub argon: Vec<ArgonRow>,
    /// Our AES-XTS against the system OpenSSL, when asked and measured.
    pub compare: Option<XtsComparison>,
    /// The sector size measured.
    pub sector_size: u32,
}

/// Measures what `req` asks for. Bad options are usage errors
/// ([`Error::is_usage`]).
pub fn measure(req: &Request) -> Result<Table, Error> {
    let ss = req.sector_size;
    if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
        return Err(Error::SectorSize(ss));
    }
    let list: Vec<(String, usize)> = match &req.cipher {
        Some(c) => vec![speed::cipher_choice(c, req.key_size)],
        None => speed::DEFAULT_CIPHERS
            .iter()
            .map(|&(spec, bits)| (spec.to_owned(), bits))
            .collect(),
    };
    let mut rows = Vec::new();
    for (spec, bits) in list {
        if bits % 8 != 0 {
            return Err(Error::KeyBits(bits));
        }
        let row = speed::cipher_row(&spec, bits, ss, BENCH_BUF, CELL)
            .map_err(|source| Error::Benchmark { spec, bits, source })?;
        rows.push(row);
    }
    // cryptsetup prints the KDF lines only without --cipher.
    let kdf = req.cipher.is_none();
    let mut pbkdf = Vec::new();
    let mut argon = Vec::new();
    if kdf {
        for h in [Hash::Sha1, Hash::Sha256, Hash::Sha512] {
            pbkdf.push((h, kdf::pbkdf2_iterations_per_sec(h, 32)));
        }
        for variant in [Argon2Variant::I, Argon2Variant::Id] {
            argon.push(argon_row(variant)?);
        }
    }
    // Our XTS per 4 KiB sector next to the system OpenSSL, measured here.
    let compare = (req.compare_openssl && rows.iter().any(|r| r.name == "aes-xts"))
        .then(speed::compare_xts_with_system_openssl);
    Ok(Table {
        rows,
        pbkdf,
        argon,
        compare,
        sector_size: ss,
    })
}

fn argon_row(variant: Argon2Variant) -> Result<ArgonRow, Error> {
    let k = kdf::benchmark_argon2(variant, DEFAULT_ITER_TIME_MS).map_err(Error::Kdf)?;
    let Kdf::Argon2 {
        time,
        memory_kib,
        parallel,
        ..
    } = k
    else {
        let msg = format!("Argon2 benchmark returned a {} cost", k.name());
        return Err(Error::Kdf(luks::Error::new(
            luks::ErrorKind::InvalidArgument,
            msg,
        )));
    };
    Ok(ArgonRow {
        name: variant.name(),
        iterations: time,
        memory_kib,
        parallel,
    })
}

/// cryptsetup benchmark's layout, then ucrypt's notes (`#` lines): the
/// sector size, each row's implementation, the OpenSSL comparison. Every
/// line ends with a newline.
impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# Tests are approximate using memory only (no storage IO)."
        )?;
        for (h, rate) in &self.pbkdf {
            writeln!(
                f,
                "{:<16} {:>7} iterations per second for 256-bit key",
                format!("PBKDF2-{}", h.name()),
                *rate as u64
            )?;
        }
        for e in &self.argon {
            writeln!(
                f,
                "{:<10} {:>4} iterations, {:>7} memory, {} parallel threads (CPUs) for 256-bit key (requested {DEFAULT_ITER_TIME_MS} ms time)",
                e.name, e.iterations, e.memory_kib, e.parallel
            )?;
        }
        writeln!(
            f,
            "#{:>14} |{:>10} |{:>16} |{:>16}",
            "Algorithm", "Key", "Encryption", "Decryption"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>15}{:>12}{:>12.1} MiB/s{:>12.1} MiB/s",
                r.name,
                format!("{}b", r.key_bits),
                mib(r.speed.encrypt_bytes_per_sec),
                mib(r.speed.decrypt_bytes_per_sec)
            )?;
        }
        let ss = self.sector_size;
        writeln!(f, "# Sector size {ss} bytes, 1 MiB per call, one thread.")?;
        for r in &self.rows {
            writeln!(
                f,
                "# {} {}b implementation: {}",
                r.name, r.key_bits, r.implementation
            )?;
        }
        let Some(c) = &self.compare else {
            return Ok(());
        };
        for at in &c.sizes {
            let ss = at.sector_size;
            writeln!(
                f,
                "# XTS implementation at {ss}-byte sectors: {}",
                at.implementation
            )?;
            match &at.system_openssl {
                Ok(o) => writeln!(
                    f,
                    "# system `openssl speed -evp aes-256-xts -bytes {ss}`: {:.1} MiB/s",
                    mib(*o)
                )?,
                Err(e) => writeln!(f, "# system openssl comparison unavailable: {e}")?,
            }
            for (bits, t) in &at.ours {
                let (e, d) = (t.encrypt_bytes_per_sec, t.decrypt_bytes_per_sec);
                match &at.system_openssl {
                    Ok(o) => writeln!(
                        f,
                        "# aes-xts {bits}b, {ss}-byte sectors, 4 KiB per call: {:.1} / {:.1} MiB/s = {:.2}x / {:.2}x system openssl (encryption / decryption)",
                        mib(e),
                        mib(d),
                        e / o,
                        d / o
                    )?,
                    Err(_) => writeln!(
                        f,
                        "# aes-xts {bits}b, {ss}-byte sectors, 4 KiB per call: {:.1} / {:.1} MiB/s (encryption / decryption)",
                        mib(e),
                        mib(d)
                    )?,
                }
            }
        }
        for bits in [256, 512] {
            if let Some((e, d)) = c.small_to_large(bits) {
                writeln!(
                    f,
                    "# aes-xts {bits}b: 512-byte sectors at {e:.2}x / {d:.2}x the 4096-byte speed (encryption / decryption)"
                )?;
            }
        }
        Ok(())
    }
}

impl Table {
    /// The table as `--json` prints it: [`Table::json`], pretty-printed.
    pub fn json_text(&self) -> String {
        let doc = self.json();
        serde_json::to_string_pretty(&doc).unwrap_or_else(|_| doc.to_string())
    }

    /// The table as a JSON document.
    pub fn json(&self) -> serde_json::Value {
        let ciphers: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "algorithm": r.name,
                    "key_bits": r.key_bits,
                    "encryption_mib_per_sec": mib(r.speed.encrypt_bytes_per_sec),
                    "decryption_mib_per_sec": mib(r.speed.decrypt_bytes_per_sec),
                    "implementation": r.implementation,
                })
            })
            .collect();
        let pbkdf: Vec<_> = self
            .pbkdf
            .iter()
            .map(|(h, rate)| json!({"algorithm": format!("pbkdf2-{}", h.name()), "iterations_per_sec": *rate as u64}))
            .collect();
        let argon: Vec<_> = self
            .argon
            .iter()
            .map(|e| json!({"algorithm": e.name, "iterations": e.iterations, "memory_kib": e.memory_kib, "parallel": e.parallel, "requested_ms": DEFAULT_ITER_TIME_MS}))
            .collect();
        let compare = self.compare.as_ref().map(|c| {
            let mut doc = serde_json::Map::new();
            for at in &c.sizes {
                let ss = at.sector_size;
                let base = at.system_openssl.as_ref().ok().copied();
                // The 4096-byte keys keep their original names.
                let suffix = if ss == 4096 {
                    String::new()
                } else {
                    format!("_{ss}")
                };
                doc.insert(
                    format!("xts_implementation{suffix}"),
                    json!(at.implementation),
                );
                doc.insert(
                    format!("system_openssl_aes_256_xts_{ss}_mib_per_sec"),
                    json!(base.map(mib)),
                );
                doc.insert(
                    format!("system_openssl_error{suffix}"),
                    json!(at.system_openssl.as_ref().err().map(ToString::to_string)),
                );
                let ours: Vec<_> = at
                    .ours
                    .iter()
                    .map(|(bits, t)| {
                        json!({
                            "key_bits": bits,
                            "encryption_mib_per_sec": mib(t.encrypt_bytes_per_sec),
                            "decryption_mib_per_sec": mib(t.decrypt_bytes_per_sec),
                            "encryption_ratio": base.map(|o| t.encrypt_bytes_per_sec / o),
                            "decryption_ratio": base.map(|o| t.decrypt_bytes_per_sec / o),
                        })
                    })
                    .collect();
                doc.insert(format!("aes_xts_{ss}"), json!(ours));
            }
            let ratios: Vec<_> = [256, 512]
                .iter()
                .filter_map(|&bits| {
                    c.small_to_large(bits)
                        .map(|(e, d)| json!({"key_bits": bits, "encryption": e, "decryption": d}))
                })
                .collect();
            doc.insert("ratio_512_to_4096".into(), json!(ratios));
            serde_json::Value::Object(doc)
        });
        json!({
            "sector_size": self.sector_size,
            "bytes_per_call": BENCH_BUF,
            "pbkdf": pbkdf,
            "argon2": argon,
            "ciphers": ciphers,
            "xts_vs_openssl": compare,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_are_usage_errors() {
        for (ss, key, want) in [
            (
                1000,
                None,
                "Invalid --sector-size 1000: a power of two in 512..4096",
            ),
            (
                8192,
                None,
                "Invalid --sector-size 8192: a power of two in 512..4096",
            ),
            (
                4096,
                Some(250),
                "Invalid key size 250: not a whole number of bytes",
            ),
        ] {
            let req = Request {
                cipher: Some("aes-xts-plain64".into()),
                key_size: key,
                sector_size: ss,
                compare_openssl: false,
            };
            let e = measure(&req).unwrap_err();
            assert!(e.is_usage(), "{e}");
            assert_eq!(e.chain(), want);
        }
    }

    #[test]
    fn an_unknown_cipher_names_itself() {
        let req = Request {
            cipher: Some("nosuch-cbc-plain".into()),
            key_size: Some(256),
            sector_size: 512,
            compare_openssl: false,
        };
        let e = measure(&req).unwrap_err();
        assert!(!e.is_usage());
        let msg = e.chain();
        assert!(
            msg.starts_with("Cannot benchmark nosuch-cbc-plain with a 256-bit key: "),
            "{msg}"
        );
    }
}
