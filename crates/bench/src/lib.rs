//! `ucrypt bench`: the seeds' experiment as one command.
//!
//! The seeds measure dm-crypt on a ramdisk (no hardware bias) with the null
//! cipher (no crypto cost), compare plain vs default vs inline dm-crypt,
//! relate the result to the bound `io·c/(io+c)`, then sweep block size ×
//! queue depth × jobs (Le Moal's heatmaps). This crate does the same
//! in-process over [`datapath::Engine`] and a [`backend::MemBackend`], or
//! with fio over NBD against ucrypt and its peers:
//!
//! ```text
//!   Options (profile quick | default | full | grid, CLI overrides: BenchArgs)
//!     │ Plan::new: headline shapes, then rw × bs × jobs × QD
//!     ▼
//!   runner::run ── per cell: warm-up, rounds in rotated target order
//!     │        └──► Runner: EngineRunner (driver ► Engine ► MemBackend)
//!     │                     FioRunner (fio ► NBD ► ucrypt open | peers)
//!     │                     VhostRunner (libblkio ► vhost-user-blk ► ucrypt open | qsd)
//!     │                     RbdRunner (the same on Ceph RBD images)
//!     │                     FileRunner (driver ► Engine ► FileBackend | fio io_uring)
//!     ▼
//!   CellResult (MiB/s, IOPS, p50/p99/p99.9, CPU s/GiB) ─► Report
//!     │
//!     ▼
//!   report (table, grid table, JSON, CSV) + heatmap (PNG, SVG)
//! ```
//!
//! `--dm-crypt` ([`dmcrypt`]) runs the flag advisor on the kernel's dm-crypt
//! with fio; [`advisor`] holds its workloads and its decision.

// Unsafe only in the fenced libblkio client (runner::vhost::client).
#![deny(unsafe_code)]

use std::time::Duration;

pub mod advisor;
pub mod args;
pub mod dmcrypt;
pub mod driver;
mod error;
pub mod heatmap;
pub mod options;
pub mod plan;
pub mod record;
pub mod report;
pub mod runner;
pub mod stats;
pub mod target;

pub use args::BenchArgs;
pub use driver::{Rw, Workload};
pub use error::{Error, OptionsError};
pub use options::{default_out_dir, sweep_set, timestamp_compact, Options, Overrides};
pub use report::{CellResult, Phase, Report};
pub use runner::fio as external;
pub use target::{Cipher, Mode, Target};

/// Crypto throughput of one cipher at one buffer size, single thread.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CryptoSpeed {
    /// Cipher spec.
    pub cipher: String,
    /// Buffer size in bytes.
    pub bs: u32,
    /// Encryption MiB/s (infinite is reported as null: a no-op cipher).
    pub encrypt_mib_s: f64,
    /// Decryption MiB/s.
    pub decrypt_mib_s: f64,
}

/// Measures `SectorCrypt` encrypt/decrypt throughput with
/// `sector_size`-byte sectors on a `bs` buffer for about `budget` each,
/// with the same measurement as `ucrypt benchmark`
/// (`crypto::speed::throughput`).
pub fn measure_crypto(
    cipher: Cipher,
    bs: u32,
    sector_size: u32,
    budget: Duration,
) -> Result<CryptoSpeed, Error> {
    let c = cipher.build(sector_size)?;
    let t = crypto::speed::throughput(&c, bs as usize, budget);
    Ok(CryptoSpeed {
        cipher: cipher.spec().into(),
        bs,
        encrypt_mib_s: stats::mib_per_s(t.encrypt_bytes_per_sec),
        decrypt_mib_s: stats::mib_per_s(t.decrypt_bytes_per_sec),
    })
}

/// Runs the in-process bench (every target's engine over one ramdisk) and
/// returns the report (not yet written).
pub fn run(opts: &Options) -> Result<Report, Error> {
    let mut runner = runner::engine::EngineRunner::new(opts)?;
    runner::run(&mut runner, opts)
}

/// Where `ucrypt bench` runs its jobs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Via {
    /// In this process, over the engine ([`run`]).
    InProcess,
    /// fio over NBD against `ucrypt open` ([`external::run`]).
    Fio {
        /// Add nbdkit (luks filter) and qemu-storage-daemon (raw, luks).
        peers: bool,
        /// The ucrypt binary that serves the targets.
        ucrypt_exe: std::path::PathBuf,
        /// The images' directory (`--dir`; None: /dev/shm).
        dir: Option<std::path::PathBuf>,
    },
    /// libblkio over vhost-user-blk against `ucrypt open`, raw baseline
    /// qemu-storage-daemon ([`runner::vhost::run`]).
    Vhost(runner::vhost::VhostPlan),
    /// fio over NBD against `ucrypt open rbd:…` and qemu-storage-daemon's
    /// rbd driver, on images made in a Ceph pool ([`runner::rbd::run`]).
    Rbd(runner::rbd::RbdPlan),
    /// The engine over a file through io_uring and pread/pwrite, beside
    /// fio's io_uring engine on the same file ([`runner::file::run`]).
    File(runner::file::FilePlan),
}

/// Runs the bench `via` in-process, fio or vhost (the report is not yet written).
/// In-process, says first on stderr how long it will take.
pub fn run_via(opts: &Options, via: Via) -> Result<Report, Error> {
    match via {
        Via::InProcess => {
            let hint = match opts.profile.as_str() {
                "quick" | "grid" => "",
                _ => "; --quick for a short run",
            };
            eprintln!(
                "bench: {} profile, about {:.0} s (in-process, {} MiB ramdisk){hint}",
                opts.profile,
                opts.estimate_secs(),
                opts.size >> 20,
            );
            run(opts)
        }
        Via::Fio {
            peers,
            ucrypt_exe,
            dir,
        } => {
            let plan = external::FioPlan {
                ucrypt_targets: opts.served_targets(),
                peers,
                ucrypt_exe,
                dir,
            };
            external::run(opts, &plan)
        }
        Via::Vhost(plan) => runner::vhost::run(opts, &plan),
        Via::Rbd(plan) => runner::rbd::run(opts, &plan),
        Via::File(plan) => runner::file::run(opts, &plan),
    }
}

/// `e` and its sources, joined by `: ` (for messages and skip reasons).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_names_every_cause() {
        let e = Error::Output {
            path: "/x/y".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "gone"),
        };
        assert_eq!(error_chain(&e), "Cannot write /x/y: gone");
        let o: Error = OptionsError::ZeroReps.into();
        assert!(o.is_usage() && !o.is_missing());
        assert_eq!(error_chain(&o), "Repetitions must be at least 1");
    }

    #[test]
    fn in_process_run_measures_every_target_of_both_phases() {
        let o = Options {
            size: 8 << 20,
            targets: vec![Target::RAW, Target::new(Cipher::Null, Mode::Inline)],
            sweep_targets: sweep_set(Cipher::Null),
            bs: vec![4096],
            qd: vec![2],
            jobs: vec![1],
            rw: vec![Rw::Write],
            runtime: Duration::from_millis(5),
            sweep_runtime: Duration::from_millis(5),
            warmup: Duration::ZERO,
            reps: 2,
            sweep_reps: 2,
            progress: false,
            ..Options::quick()
        };
        let r = run(&o).unwrap();
        assert_eq!(r.via, "in-process");
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        // Headline: 2 targets × read/write; sweep: 4 targets and the
        // adaptive target's control × 1 cell.
        assert_eq!(r.cells.len(), 4 + 5);
        let control = r
            .cells
            .iter()
            .find(|c| c.target == "null-adaptive-control")
            .expect("the control cell");
        assert_eq!((control.mode, control.cipher), (None, Some(Cipher::Null)));
        // The verdict table judges the one adaptive cell.
        let t = r.table();
        assert!(t.contains("adaptive lost "), "{t}");
        assert!(t.contains(" of 1 cells"), "{t}");
        for c in &r.cells {
            assert_eq!(c.errors, 0, "{c:?}");
            assert!(c.mib().is_some_and(|m| m > 0.0), "{c:?}");
        }
    }
}
