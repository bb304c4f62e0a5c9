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
use crypto::speed;
use crypto::table::Table;
use daemon::map::Direction;
use luks::kdf::{self, Argon2Variant, DEFAULT_ITER_TIME_MS};
use luks::{Hash, Kdf};
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
    /// `-` reads the line from stdin (--read only); a <key> of `-` takes the raw
    /// key from --key-file. A hex key here is visible in `ps` (warned).
    #[arg(long)]
    pub table: Option<String>,
    /// Map the LUKS volume on this device instead of a table line (the table
    /// cryptsetup would load; unlocked by passphrase or --key-file).
    #[arg(long, value_name = "DEVICE")]
    pub luks: Option<PathBuf>,
    /// Detached LUKS header file (with --luks).
    #[arg(long, requires = "luks")]
    pub header: Option<PathBuf>,
    /// With --luks: read the passphrase from this file (`-` = stdin) instead
    /// of prompting. With --table: the raw key bytes for the table's `-` key field.
    #[arg(long, short = 'd')]
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
                        // The line may hold the key in hex: wipe it once parsed.
                        let line = Zeroizing::new(line);
                        let stdin_free = dir == Direction::Read;
                        daemon::resolve::plain_table_arg(&line, a.key_file.as_deref(), stdin_free)?
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

/// MiB per second, cryptsetup's unit.
fn mib(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1_048_576.0
}

/// Time given to each direction of each cipher row.
const CELL: Duration = Duration::from_millis(100);
/// Bytes per encrypt/decrypt call (cryptsetup benchmarks 1 MiB buffers).
const BENCH_BUF: usize = 1 << 20;

/// `ucrypt benchmark`: checks the arguments, has `crypto::speed` measure
/// the ciphers and `luks::kdf` the KDF costs, and prints them.
fn benchmark(a: &BenchmarkArgs) -> CmdResult {
    let ss = a.sector_size;
    if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
        return Err(Failure::usage(format!(
            "Invalid --sector-size {ss}: a power of two in 512..4096"
        )));
    }
    let list: Vec<(String, usize)> = match &a.cipher {
        Some(c) => vec![speed::cipher_choice(c, a.key_size)],
        None => speed::DEFAULT_CIPHERS
            .iter()
            .map(|&(spec, bits)| (spec.to_owned(), bits))
            .collect(),
    };
    let mut rows = Vec::new();
    for (spec, bits) in &list {
        if bits % 8 != 0 {
            return Err(Failure::usage(format!(
                "Invalid key size {bits}: not a whole number of bytes"
            )));
        }
        rows.push(
            speed::cipher_row(spec, *bits, ss, BENCH_BUF, CELL).map_err(|e| {
                Failure::usage(format!(
                    "Cannot benchmark {spec} with a {bits}-bit key: {e}"
                ))
            })?,
        );
    }
    // cryptsetup prints the KDF lines only without --cipher. Their costs
    // come from luks::kdf, the estimator `format` uses.
    let kdf = a.cipher.is_none();
    let pbkdf: Vec<(Hash, f64)> = if kdf {
        [Hash::Sha1, Hash::Sha256, Hash::Sha512]
            .into_iter()
            .map(|h| (h, kdf::pbkdf2_iterations_per_sec(h, 32)))
            .collect()
    } else {
        Vec::new()
    };
    let argon: Vec<ArgonRow> = if kdf {
        let mut v = Vec::new();
        for variant in [Argon2Variant::I, Argon2Variant::Id] {
            let k = kdf::benchmark_argon2(variant, DEFAULT_ITER_TIME_MS)
                .map_err(|e| Failure::usage(e.to_string()))?;
            let Kdf::Argon2 {
                time,
                memory_kib,
                parallel,
                ..
            } = k
            else {
                return Err(Failure::usage(format!(
                    "Argon2 benchmark returned a {} cost",
                    k.name()
                )));
            };
            v.push(ArgonRow {
                name: variant.name(),
                iterations: time,
                memory_kib,
                parallel,
            });
        }
        v
    } else {
        Vec::new()
    };
    // Our XTS per 4 KiB sector next to the system OpenSSL, measured here.
    let compare = if a.no_openssl || !rows.iter().any(|r| r.name == "aes-xts") {
        None
    } else {
        Some(speed::compare_xts_with_system_openssl())
    };
    if a.json {
        print_json(&rows, &pbkdf, &argon, compare.as_ref(), ss);
    } else {
        print_table(&rows, &pbkdf, &argon, compare.as_ref(), ss);
    }
    Ok(())
}

/// One Argon2 line: the costs `format` would choose for the default
/// `--iter-time` (see `luks::kdf::benchmark_argon2`).
struct ArgonRow {
    name: &'static str,
    iterations: u32,
    memory_kib: u32,
    parallel: u32,
}

fn print_table(
    rows: &[speed::CipherRow],
    pbkdf: &[(Hash, f64)],
    argon: &[ArgonRow],
    cmp: Option<&speed::XtsComparison>,
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
    for e in argon {
        println!(
            "{:<10} {:>4} iterations, {:>7} memory, {} parallel threads (CPUs) for 256-bit key (requested {DEFAULT_ITER_TIME_MS} ms time)",
            e.name, e.iterations, e.memory_kib, e.parallel
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
            mib(r.speed.encrypt_bytes_per_sec),
            mib(r.speed.decrypt_bytes_per_sec)
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
        match &c.system_openssl {
            Ok(o) => {
                println!(
                    "# system `openssl speed -evp aes-256-xts -bytes 4096`: {:.1} MiB/s",
                    mib(*o)
                );
                for (bits, t) in &c.ours {
                    let (e, d) = (t.encrypt_bytes_per_sec, t.decrypt_bytes_per_sec);
                    println!(
                        "# aes-xts {bits}b per 4 KiB sector: {:.1} / {:.1} MiB/s = {:.2}x / {:.2}x system openssl (encryption / decryption)",
                        mib(e),
                        mib(d),
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
    rows: &[speed::CipherRow],
    pbkdf: &[(Hash, f64)],
    argon: &[ArgonRow],
    cmp: Option<&speed::XtsComparison>,
    ss: u32,
) {
    use serde_json::json;
    let ciphers: Vec<_> = rows
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
    let pbkdf: Vec<_> = pbkdf
        .iter()
        .map(|(h, rate)| json!({"algorithm": format!("pbkdf2-{}", h.name()), "iterations_per_sec": *rate as u64}))
        .collect();
    let argon: Vec<_> = argon
        .iter()
        .map(|e| json!({"algorithm": e.name, "iterations": e.iterations, "memory_kib": e.memory_kib, "parallel": e.parallel, "requested_ms": DEFAULT_ITER_TIME_MS}))
        .collect();
    let compare = cmp.map(|c| {
        let base = c.system_openssl.as_ref().ok().copied();
        json!({
            "xts_implementation": c.implementation,
            "system_openssl_aes_256_xts_4096_mib_per_sec": base.map(mib),
            "system_openssl_error": c.system_openssl.as_ref().err().map(ToString::to_string),
            "aes_xts_4096": c.ours.iter().map(|(bits, t)| json!({
                "key_bits": bits,
                "encryption_mib_per_sec": mib(t.encrypt_bytes_per_sec),
                "decryption_mib_per_sec": mib(t.decrypt_bytes_per_sec),
                "encryption_ratio": base.map(|o| t.encrypt_bytes_per_sec / o),
                "decryption_ratio": base.map(|o| t.decrypt_bytes_per_sec / o),
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
