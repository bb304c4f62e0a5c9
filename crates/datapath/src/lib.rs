//! The data path: requests in, encrypted IO out. dm-crypt's job, in
//! userspace, three ways.
//!
//! Hand-written pipeline code. Frontends (nbd, fuse), the bench and the CLI
//! call [`Engine::submit`] (or the blocking [`Engine::read`] /
//! [`Engine::write`] / [`Engine::flush`]); a frontend that gathers its
//! requests into backend batches submits through a [`Plug`] it owns
//! ([`Engine::submit_plugged`]). Every request passes one gate and
//! one check, then the configured [`CryptMode`] carries it out:
//!
//! ```text
//!  Engine::submit(Request, done)
//!   │ gate.rs   admit: in_flight < queue_depth, not suspended (else wait);
//!   │           one CAS on an atomic word, no lock unless it must wait
//!   │ check.rs  the single choke point: range, alignment, size, flags,
//!   │           read-only, allow_discards  ──► error completion, nothing done
//!   ▼  (dm-crypt: crypt_map)
//!  ┌─────────────── Classic (mode/classic.rs) ─────────────────────────────┐
//!  │ READ  kcryptd_queue_read ► [kcryptd_io] kcryptd_io_read + crypt_endio   │
//!  │       ► kcryptd_queue_crypt ► [kcryptd] kcryptd_crypt_read_convert    │
//!  │ WRITE kcryptd_queue_crypt ► [kcryptd] kcryptd_crypt_write_convert     │
//!  │       (bounce buffer from the bounded page_pool analog)                │
//!  │       ► kcryptd_crypt_write_io_submit ► write_tree ► [dmcrypt_write]  │
//!  │         (or the backend write right there: submit_from_crypt_cpus)   │
//!  │ no_read_workqueue / no_write_workqueue: that direction runs inline    │
//!  ├─────────────── Inline (mode/inline.rs) = force_inline ─────────────────┤
//!  │ READ  backend read, decrypt in place, complete — all in the submitter  │
//!  │ WRITE encrypt in place, backend write (FUA passed down), complete      │
//!  │ (inline and adaptive) reads and writes the frontend says more follow  │
//!  │ (Hint::ready): gathered in its Plug, one backend batch (gather.rs)     │
//!  ├─────────────── Adaptive (mode/adaptive.rs, ours) ──────────────────────┤
//!  │ small / all cores busy: the inline path                                │
//!  │ caller keeps several in flight + a warm helper idle: hand the whole    │
//!  │ request to it, the submitter goes on with the next (learned per engine)│
//!  │ large + idle core: split one request's IO + crypto into chunks claimed │
//!  │ by the submitter and warm helpers (dm-crypt never splits a bio)        │
//!  └────────────────────────────────────────────────────────────────────────┘
//!   flush, discard, write-zeroes: passed straight down in every mode
//!   (crypt_map's DM_MAPIO_REMAPPED; zeroes are encrypted zero writes)
//!   ▼
//!  crypto::SectorCrypt (encrypt/decrypt by 512-byte sector)   backend::Backend
//!   │
//!   └► complete: stats.rs (counters + latency histogram), gate release,
//!      then the caller's `done`
//! ```
//!
//! Frontends ask an [`Export`] (built once per export from the engine and
//! the serving options) what they may advertise, and refuse a request
//! before submitting it only through it: its refusals are the choke
//! point's own (`check.rs`), so no frontend builds an [`Error`] itself.
//!
//! A volume without a cipher (`crypt: None`, the raw baseline) is a plain
//! linear mapping: every mode passes it straight to the backend inline.
//!
//! A [`Mapping`] of several targets (crypt and linear, as a multi-line dm
//! table) runs through the same modes: each cipher call is cut at target
//! boundaries and each piece runs under its target's cipher (see
//! `segments.rs`).
//!
//! # Live reconfiguration
//!
//! [`Engine::reconfigure`] and [`Engine::reload`] follow dm's suspend /
//! resume: stop admitting, drain what is in flight, swap the generation
//! (volume + configuration + the mode's threads), resume. Submitters that
//! arrive meanwhile just wait in the gate.
//!
//! # Callbacks
//!
//! `done` runs exactly once, on the submitting thread (inline paths) or on
//! an engine thread (queued paths), after the request's queue slot has been
//! released. It should not block for long; it may submit more requests:
//! from an inline callback those run after it returns (no recursion), and
//! an engine thread never blocks in admission (see gate.rs). Blocking
//! helpers ([`Engine::read`] ...) called from a callback on an engine
//! thread can wait on themselves; use `submit` there.
#![forbid(unsafe_code)]

pub mod bufpool;
mod check;
mod config;
mod cpu;
mod engine;
mod error;
mod export;
mod gate;
mod layout;
mod mode;
mod queue;
mod request;
mod segments;
mod stats;

pub use config::{
    CryptMode, EngineConfig, Mapping, PerfFlags, Target, Volume, DEFAULT_MAX_IO_SIZE,
};
pub use engine::Engine;
pub use error::{nbd_error_of, Error};
pub use export::Export;
pub use mode::adaptive::{SPLIT_MIN, WAKE_MIN};
pub use mode::gather::Plug;
pub use request::{Completion, Hint, Op, OpKind, Request};
pub use stats::{DirStats, Latency, ModeCounts, Stats};

pub(crate) use engine::{Ctx, Done, Gen};

/// Largest read or write accepted in one request (larger ones fail with
/// [`Error::TooLarge`]); discard and write-zeroes have no limit.
pub const MAX_REQUEST_BYTES: u64 = 32 << 20;

/// A 64 MiB ramdisk volume for unit tests, encrypted with AES-XTS (512-byte
/// sectors) when `aes` is set.
#[cfg(test)]
pub(crate) fn test_volume(aes: bool) -> Volume {
    use std::sync::Arc;
    let size = 64 << 20;
    let crypt = aes.then(|| {
        Arc::new(
            crypto::SectorCrypt::new(&crypto::CryptConfig {
                cipher: "aes-xts-plain64".into(),
                key: zeroize::Zeroizing::new((0..64u8).collect()),
                iv_offset: 0,
                sector_size: 512,
                iv_large_sectors: false,
            })
            .expect("cipher builds"),
        )
    });
    Volume {
        backend: Arc::new(backend::MemBackend::new(size).expect("ramdisk")),
        crypt,
        data_offset: 0,
        size,
        sector_size: 512,
    }
}
