//! `ucrypt map` and `ucrypt benchmark`: a dm-crypt table applied to a file
//! or block device without any frontend, and `cryptsetup benchmark`'s
//! in-memory cipher table.
//!
//! ```text
//!  map --read :  device[offset .. offset+len] ──decrypt──▶ stdout   (like dd if=/dev/mapper/x)
//!  map --write:  stdin ──(size checked first)──encrypt──▶ device     (like dd of=/dev/mapper/x)
//! ```
//!
//! The map core lives in [`daemon::map`]; this module reads the arguments,
//! unlocks `--luks` volumes and wires stdin/stdout to it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use crypto::speed::{self, Argon2Kind, PbkdfHash};
use crypto::table::Table;
use crypto::{CryptConfig, SectorCrypt};
use daemon::map::Direction;
use zeroize::Zeroizing;

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Decrypt a dm-crypt table's range to stdout (--read) or encrypt stdin
    /// onto it (--write), with no frontend.
    Map(MapArgs),
    /// Measure cipher throughput in memory (like cryptsetup benchmark).
    Benchmark(BenchmarkArgs),
}

/// Arguments of `ucrypt map`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("direction").required(true).args(["read", "write"])))]
#[command(group(clap::ArgGroup::new("source").required(true).args(["table", "luks"])))]
pub struct MapArgs {
    /// dm-crypt table line: `<start> <len> crypt <cipher> <key> <iv_offset>
    /// <device> <offset> [<#opt> <opt>...]`; <device> is a file or block device.
    #[arg(long)]
    pub table: Option<String>,
    /// Map the LUKS volume on this device instead of a table line (the table
    /// cryptsetup would load; unlocked by passphrase or --key-file).
    #[arg(long, value_name = "DEVICE")]
    pub luks: Option<PathBuf>,
    /// Detached LUKS header file (with --luks).
    #[arg(long, requires = "luks")]
    pub header: Option<PathBuf>,
    /// Read the passphrase from this file (`-` = stdin) instead of prompting (with --luks).
    #[arg(long, short = 'd', requires = "luks")]
    pub key_file: Option<PathBuf>,
    /// Try only this keyslot (with --luks).
    #[arg(long, short = 'S', requires = "luks")]
    pub key_slot: Option<u32>,
    /// Decrypt the whole mapped range to stdout.
    #[arg(long)]
    pub read: bool,
    /// Encrypt stdin onto the device (length: whole sectors, at most the mapping).
    #[arg(long)]
    pub write: bool,
}

/// Arguments of `ucrypt benchmark`.
#[derive(Args)]
pub struct BenchmarkArgs {
    /// Benchmark only this cipher, e.g. `aes-xts-plain64` or `aes-cbc`
    /// (the IV mode defaults to plain64; it does not change the speed).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Key size in bits (default: 512 for XTS, else 256).
    #[arg(long, short = 's')]
    pub key_size: Option<usize>,
    /// Encryption sector size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub sector_size: u32,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Skip the comparison with the system `openssl speed`.
    #[arg(long)]
    pub no_openssl: bool,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        match self {
            Self::Map(a) => {
                let dir = if a.read {
                    Direction::Read
                } else {
                    Direction::Write
                };
                let table = match (a.table, a.luks) {
                    (Some(line), _) => {
                        // The line holds the key in hex: wipe it once parsed.
                        let line = Zeroizing::new(line);
                        daemon::resolve::plain_table(&line)?
                    }
                    (None, Some(device)) => {
                        // --write reads plaintext from stdin, so the passphrase
                        // must not come from there too (neither `-` nor the
                        // prompt's non-tty fallback, which reads a stdin line).
                        let stdin_is_tty = std::io::IsTerminal::is_terminal(&io::stdin());
                        if dir == Direction::Write
                            && (a.key_file.as_deref() == Some(Path::new("-"))
                                || (a.key_file.is_none() && !stdin_is_tty))
                        {
                            return Err(Failure::usage(
                                "--write reads plaintext from stdin: give the passphrase with --key-file FILE",
                            ));
                        }
                        crate::cmd::luks::luks_table(
                            &device,
                            a.header.as_deref(),
                            a.key_file.as_deref(),
                            a.key_slot,
                        )?
                    }
                    // clap's "source" group requires one of them.
                    (None, None) => return Err(Failure::usage("Give --table or --luks")),
                };
                map_device(&table, dir)
            }
            Self::Benchmark(a) => benchmark(&a),
        }
    }
}

/// Runs `ucrypt map` on stdin/stdout: the core is [`daemon::map::map`],
/// which sends every byte through the engine.
pub fn map_device(table: &Table, dir: Direction) -> CmdResult {
    match dir {
        Direction::Read => {
            let out = io::stdout();
            let mut out = out.lock();
            daemon::map::map(table, dir, &mut io::empty(), None, &mut out)?;
        }
        Direction::Write => {
            let len = stdin_regular_file_len();
            let stdin = io::stdin();
            let mut input = stdin.lock();
            daemon::map::map(table, dir, &mut input, len, &mut io::sink())?;
        }
    }
    Ok(())
}

/// What is left to read on stdin when it is a regular file (`< plain.img`):
/// its size minus stdin's current offset.
fn stdin_regular_file_len() -> Option<u64> {
    let m = File::open("/proc/self/fd/0").ok()?.metadata().ok()?;
    if !m.is_file() {
        return None;
    }
    m.len().checked_sub(read_stdin_pos()?)
}

/// Current offset of fd 0 from /proc/self/fdinfo/0 (`pos:` line).
fn read_stdin_pos() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/fdinfo/0").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("pos:"))
        .and_then(|v| v.trim().parse().ok())
}

/// One cipher row of the benchmark.
struct Row {
    name: String,
    key_bits: usize,
    enc: f64,
    dec: f64,
    implementation: &'static str,
}

/// MiB per second, cryptsetup's unit.
fn mib(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1_048_576.0
}

/// Time given to each direction of each cipher row.
const CELL: Duration = Duration::from_millis(100);
/// Bytes per encrypt/decrypt call (cryptsetup benchmarks 1 MiB buffers).
const BENCH_BUF: usize = 1 << 20;

fn benchmark(a: &BenchmarkArgs) -> CmdResult {
    let ss = a.sector_size;
    if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
        return Err(Failure::usage(format!(
            "Invalid --sector-size {ss}: a power of two in 512..4096"
        )));
    }
    let list: Vec<(String, usize)> = match &a.cipher {
        Some(c) => {
            let spec = if c == "cipher_null" {
                "cipher_null-ecb".to_owned()
            } else if c.starts_with("capi:") || c.matches('-').count() >= 2 || c.ends_with("-ecb") {
                c.clone()
            } else {
                format!("{c}-plain64")
            };
            let default_bits = if spec.contains("cipher_null") {
                0
            } else if spec.contains("xts") {
                512
            } else {
                256
            };
            let bits = a.key_size.unwrap_or(default_bits);
            vec![(spec, bits)]
        }
        None => vec![
            ("aes-cbc-plain64".into(), 128),
            ("aes-cbc-plain64".into(), 256),
            ("aes-xts-plain64".into(), 256),
            ("aes-xts-plain64".into(), 512),
            ("cipher_null-ecb".into(), 0),
        ],
    };
    let mut rows = Vec::new();
    for (spec, bits) in &list {
        if bits % 8 != 0 {
            return Err(Failure::usage(format!(
                "Invalid key size {bits}: not a whole number of bytes"
            )));
        }
        let cfg = CryptConfig {
            cipher: spec.clone(),
            key: Zeroizing::new(
                (0..bits / 8)
                    .map(|i| (i as u8).wrapping_mul(151).wrapping_add(7))
                    .collect(),
            ),
            iv_offset: 0,
            sector_size: ss,
            iv_large_sectors: false,
        };
        let c = SectorCrypt::new(&cfg).map_err(|e| {
            Failure::usage(format!(
                "Cannot benchmark {spec} with a {bits}-bit key: {e}"
            ))
        })?;
        let t = speed::throughput(&c, BENCH_BUF, CELL);
        rows.push(Row {
            name: row_name(spec),
            key_bits: *bits,
            enc: t.encrypt_bytes_per_sec,
            dec: t.decrypt_bytes_per_sec,
            implementation: c.implementation(),
        });
    }
    let kdf = a.cipher.is_none();
    let pbkdf: Vec<(PbkdfHash, f64)> = if kdf {
        [PbkdfHash::Sha1, PbkdfHash::Sha256, PbkdfHash::Sha512]
            .into_iter()
            .map(|h| {
                (
                    h,
                    speed::pbkdf2_iterations_per_sec(h, Duration::from_millis(150)),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    let argon: Vec<(&str, ArgonEstimate)> = if kdf {
        let mut v = Vec::new();
        for (name, kind) in [("argon2i", Argon2Kind::I), ("argon2id", Argon2Kind::Id)] {
            v.push((name, argon_estimate(kind)?));
        }
        v
    } else {
        Vec::new()
    };
    // Our XTS per 4 KiB sector next to the system OpenSSL, measured here.
    let compare = if a.no_openssl || !rows.iter().any(|r| r.name == "aes-xts") {
        None
    } else {
        Some(compare_openssl())
    };
    if a.json {
        print_json(&rows, &pbkdf, &argon, compare.as_ref(), ss);
    } else {
        print_table(&rows, &pbkdf, &argon, compare.as_ref(), ss);
    }
    Ok(())
}

/// cryptsetup's row name: cipher and chain mode without the IV.
fn row_name(spec: &str) -> String {
    match crypto::CipherSpec::parse(spec) {
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

/// Argon2 parameters cryptsetup would pick for 2000 ms, extrapolated from
/// one timed small hash (memory-hard cost grows linearly with memory and
/// iterations; lanes run in parallel on as many CPUs, up to 4).
struct ArgonEstimate {
    iterations: u32,
    memory_kib: u32,
    parallel: u32,
}

fn argon_estimate(kind: Argon2Kind) -> Result<ArgonEstimate, Failure> {
    let probe_kib = 16 * 1024;
    let r = speed::argon2_rate(kind, probe_kib, 1).map_err(|e| Failure::usage(e.to_string()))?;
    let per_kib_iter = r.seconds / (f64::from(probe_kib) * f64::from(r.iterations));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let parallel = cpus.clamp(1, 4);
    let target = 2.0;
    let max_kib = 1_048_576u32;
    let iter_time = per_kib_iter * f64::from(max_kib) / f64::from(parallel);
    let iterations = (target / iter_time).floor();
    if iterations >= 4.0 {
        return Ok(ArgonEstimate {
            iterations: iterations.min(1e6) as u32,
            memory_kib: max_kib,
            parallel,
        });
    }
    // Too slow for 1 GiB at 4 iterations: shrink memory like cryptsetup.
    let kib = (target * f64::from(parallel) / (4.0 * per_kib_iter)).clamp(32.0, f64::from(max_kib));
    Ok(ArgonEstimate {
        iterations: 4,
        memory_kib: kib as u32,
        parallel,
    })
}

/// Result of the XTS comparison with the system OpenSSL.
struct Compare {
    implementation: &'static str,
    openssl: Result<f64, String>,
    ours: Vec<(usize, f64, f64)>,
}

fn compare_openssl() -> Compare {
    let mut ours = Vec::new();
    let mut implementation = "none";
    for bits in [256usize, 512] {
        let cfg = CryptConfig {
            cipher: "aes-xts-plain64".into(),
            key: Zeroizing::new((0..bits / 8).map(|i| i as u8).collect()),
            iv_offset: 0,
            sector_size: 4096,
            iv_large_sectors: false,
        };
        if let Ok(c) = SectorCrypt::new(&cfg) {
            implementation = c.implementation();
            // Best of two short runs: the machine may be shared.
            let a = speed::throughput(&c, 4096, Duration::from_millis(150));
            let b = speed::throughput(&c, 4096, Duration::from_millis(150));
            ours.push((
                bits,
                a.encrypt_bytes_per_sec.max(b.encrypt_bytes_per_sec),
                a.decrypt_bytes_per_sec.max(b.decrypt_bytes_per_sec),
            ));
        }
    }
    let openssl = speed::system_openssl_xts(Duration::from_secs(1)).map_err(|e| e.to_string());
    Compare {
        implementation,
        openssl,
        ours,
    }
}

fn print_table(
    rows: &[Row],
    pbkdf: &[(PbkdfHash, f64)],
    argon: &[(&str, ArgonEstimate)],
    cmp: Option<&Compare>,
    ss: u32,
) {
    println!("# Tests are approximate using memory only (no storage IO).");
    for (h, rate) in pbkdf {
        println!(
            "{:<16} {:>7} iterations per second for 256-bit key",
            format!("PBKDF2-{}", h.name()),
            *rate as u64
        );
    }
    for (name, e) in argon {
        println!(
            "{:<10} {:>4} iterations, {:>7} memory, {} parallel threads (CPUs) for 256-bit key (requested 2000 ms time)",
            name, e.iterations, e.memory_kib, e.parallel
        );
    }
    println!(
        "#{:>14} |{:>10} |{:>16} |{:>16}",
        "Algorithm", "Key", "Encryption", "Decryption"
    );
    for r in rows {
        println!(
            "{:>15}{:>12}{:>12.1} MiB/s{:>12.1} MiB/s",
            r.name,
            format!("{}b", r.key_bits),
            mib(r.enc),
            mib(r.dec)
        );
    }
    println!("# Sector size {ss} bytes, 1 MiB per call, one thread.");
    for r in rows {
        println!(
            "# {} {}b implementation: {}",
            r.name, r.key_bits, r.implementation
        );
    }
    if let Some(c) = cmp {
        println!("# XTS implementation: {}", c.implementation);
        match &c.openssl {
            Ok(o) => {
                println!(
                    "# system `openssl speed -evp aes-256-xts -bytes 4096`: {:.1} MiB/s",
                    mib(*o)
                );
                for (bits, e, d) in &c.ours {
                    println!(
                        "# aes-xts {bits}b per 4 KiB sector: {:.1} / {:.1} MiB/s = {:.2}x / {:.2}x system openssl (encryption / decryption)",
                        mib(*e),
                        mib(*d),
                        e / o,
                        d / o
                    );
                }
            }
            Err(e) => println!("# system openssl comparison unavailable: {e}"),
        }
    }
}

fn print_json(
    rows: &[Row],
    pbkdf: &[(PbkdfHash, f64)],
    argon: &[(&str, ArgonEstimate)],
    cmp: Option<&Compare>,
    ss: u32,
) {
    use serde_json::json;
    let ciphers: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "algorithm": r.name,
                "key_bits": r.key_bits,
                "encryption_mib_per_sec": mib(r.enc),
                "decryption_mib_per_sec": mib(r.dec),
                "implementation": r.implementation,
            })
        })
        .collect();
    let pbkdf: Vec<_> = pbkdf
        .iter()
        .map(|(h, rate)| json!({"algorithm": format!("pbkdf2-{}", h.name()), "iterations_per_sec": *rate as u64}))
        .collect();
    let argon: Vec<_> = argon
        .iter()
        .map(|(n, e)| json!({"algorithm": n, "iterations": e.iterations, "memory_kib": e.memory_kib, "parallel": e.parallel, "requested_ms": 2000}))
        .collect();
    let compare = cmp.map(|c| {
        let base = c.openssl.as_ref().ok().copied();
        json!({
            "xts_implementation": c.implementation,
            "system_openssl_aes_256_xts_4096_mib_per_sec": base.map(mib),
            "system_openssl_error": c.openssl.as_ref().err(),
            "aes_xts_4096": c.ours.iter().map(|(bits, e, d)| json!({
                "key_bits": bits,
                "encryption_mib_per_sec": mib(*e),
                "decryption_mib_per_sec": mib(*d),
                "encryption_ratio": base.map(|o| e / o),
                "decryption_ratio": base.map(|o| d / o),
            })).collect::<Vec<_>>(),
        })
    });
    let doc = json!({
        "sector_size": ss,
        "bytes_per_call": BENCH_BUF,
        "pbkdf": pbkdf,
        "argon2": argon,
        "ciphers": ciphers,
        "xts_vs_openssl": compare,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&doc).unwrap_or_else(|_| doc.to_string())
    );
}
