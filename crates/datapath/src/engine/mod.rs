//! The engine: admission (gate.rs), the choke point (check.rs), the mode,
//! and the generations a live reconfiguration swaps (see the crate
//! documentation for the picture).
//!
//! Split along its seams: `generation` (one volume + configuration with
//! its mode's threads, and how a request completes), `submit`
//! (admission, the choke point and the hand-over to the mode, with the
//! trampoline that keeps resubmitting callbacks off the stack),
//! `blocking` (the synchronous helpers) and `lifecycle` (reconfigure,
//! resize, suspend/resume, reload, shutdown). This module holds the
//! [`Engine`] handle and the state every generation shares ([`Core`]).

mod blocking;
mod generation;
mod lifecycle;
mod submit;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::gate::Gate;
use crate::layout::Layout;
use crate::stats::StatsCore;
use crate::{cpu, mode};
use crate::{CryptMode, EngineConfig, Error, Mapping, Stats, Volume};

pub(crate) use generation::{Ctx, Done, Gen};

/// Resolution of [`Core::contended_at`] in ns: a sighting is recorded
/// only when the last one is at least this old, so "contended" may end
/// this much early (against holds of milliseconds).
const CONTENDED_TICK: u64 = 100_000;

/// The engine. `Send + Sync`; share it with `Arc`.
pub struct Engine {
    core: Arc<Core>,
}

/// Engine-wide state shared by every generation.
pub(crate) struct Core {
    gate: Gate,
    stats: StatsCore,
    /// CPUs available to the process.
    pub(crate) ncpu: usize,
    epoch: Instant,
    /// When a submitter last saw every core busy (ns since `epoch`; 0 = never).
    pub(crate) contended_at: AtomicU64,
    /// Test hook: adaptive hands off or splits (see [`Engine::force_split`]).
    pub(crate) force_split: std::sync::atomic::AtomicBool,
    /// Adaptive runs crypto in two passes like inline (see [`Engine::fuse`]).
    pub(crate) no_fuse: std::sync::atomic::AtomicBool,
    /// Machine load, for the adaptive mode's idle-core estimate.
    pub(crate) idle: cpu::Load,
    /// Threads of replaced generations, joined at shutdown.
    retired: Mutex<Vec<JoinHandle<()>>>,
    reconfig: Mutex<()>,
    /// Completion callbacks of asynchronous requests not yet returned.
    pub(crate) tails: Arc<mode::gather::Inflight>,
}

impl Core {
    /// Nanoseconds from the engine's start to `t` (at least 1).
    pub(crate) fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    /// True if every core was seen busy less than `hold` before `now`.
    pub(crate) fn contended(&self, now: u64, hold: Duration) -> bool {
        let at = self.contended_at.load(Relaxed);
        at != 0 && now.saturating_sub(at) < hold.as_nanos() as u64
    }

    /// True if `busy` threads already take every core; then the engine
    /// counts as contended from `now` (see [`Core::contended`]).
    ///
    /// The sighting is written at most once per [`CONTENDED_TICK`]: every
    /// submitter of a saturated engine calls this per request, and a store
    /// per request to a line all of them read would cost each a cross-core
    /// miss.
    pub(crate) fn saturated(&self, now: u64, busy: usize) -> bool {
        let all = busy >= self.ncpu;
        if all && now.saturating_sub(self.contended_at.load(Relaxed)) >= CONTENDED_TICK {
            self.contended_at.store(now, Relaxed);
        }
        all
    }

    fn retire(&self, mut handles: Vec<JoinHandle<()>>) {
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        // Reap what has already exited so repeated swaps do not pile up.
        let mut keep = Vec::with_capacity(r.len() + handles.len());
        for h in r.drain(..).chain(handles.drain(..)) {
            if h.is_finished() {
                let _ = h.join();
            } else {
                keep.push(h);
            }
        }
        *r = keep;
    }

    fn join_retired(&self) {
        let handles = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        let me = std::thread::current().id();
        for h in handles {
            // A callback running on an engine thread may shut the engine
            // down; that thread exits on its own right after.
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

/// A caught panic's payload.
type Panic = Box<dyn std::any::Any + Send>;

/// Runs `f`, returning its panic instead of unwinding, so the caller can
/// finish its bookkeeping before re-raising it.
fn catch(f: impl FnOnce()) -> Option<Panic> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()
}

impl Engine {
    /// Starts an engine over `vol`.
    pub fn new(vol: Volume, cfg: EngineConfig) -> Result<Self, Error> {
        Self::with_cpus(Layout::volume(vol)?, cfg, cpu::count())
    }

    /// Starts an engine over a multi-target mapping (a dm table of several
    /// lines); a one-target mapping is exactly [`Engine::new`]'s volume.
    pub fn with_mapping(m: Mapping, cfg: EngineConfig) -> Result<Self, Error> {
        Self::with_cpus(Layout::mapping(m)?, cfg, cpu::count())
    }

    /// The number of targets the current generation serves (1 for a
    /// volume).
    pub fn targets(&self) -> usize {
        self.with_gen(|c| c.segs.as_ref().map_or(1, |s| s.count()), 1)
    }

    /// Starts an engine that plans for `ncpu` CPUs (tests pin the count
    /// the adaptive mode's decisions depend on).
    pub(crate) fn with_cpus(vol: Layout, cfg: EngineConfig, ncpu: usize) -> Result<Self, Error> {
        let core = Arc::new(Core {
            gate: Gate::new(),
            stats: StatsCore::new(),
            ncpu,
            epoch: Instant::now(),
            contended_at: AtomicU64::new(0),
            idle: cpu::Load::new(),
            force_split: std::sync::atomic::AtomicBool::new(false),
            no_fuse: std::sync::atomic::AtomicBool::new(false),
            retired: Mutex::new(Vec::new()),
            reconfig: Mutex::new(()),
            tails: Arc::default(),
        });
        let gen = Gen::build(&core, vol, cfg)?;
        core.gate.install(gen);
        Ok(Self { core })
    }

    /// The generation serving requests now.
    #[cfg(test)]
    pub(crate) fn current_gen(&self) -> Option<Arc<Gen>> {
        self.core.gate.current()
    }

    fn with_gen<T>(&self, f: impl FnOnce(&Ctx) -> T, dflt: T) -> T {
        self.core.gate.current().map(|g| f(&g.ctx)).unwrap_or(dflt)
    }

    /// Current configuration.
    pub fn config(&self) -> EngineConfig {
        self.with_gen(|c| c.cfg.clone(), EngineConfig::default())
    }

    /// Decrypted device size in bytes.
    pub fn size(&self) -> u64 {
        self.with_gen(|c| c.size, 0)
    }

    /// Logical sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.with_gen(|c| c.sector_size, 512)
    }

    /// A snapshot of the engine's counters (for `status` and the bench).
    pub fn stats(&self) -> Stats {
        let (read, write, flushes, discards, other_errors) = self.core.stats.snapshot();
        Stats {
            read,
            write,
            flushes,
            discards,
            other_errors,
            in_flight: self.core.gate.in_flight() as u64,
            max_in_flight: self.core.gate.max_in_flight.load(Relaxed) as u64,
            reconfigurations: self.core.stats.reconfigurations.load(Relaxed),
            mode: self.with_gen(|c| c.cfg.mode, CryptMode::default()),
        }
    }

    /// Test hook: make the adaptive mode hand every other read or write
    /// off whole to a helper, and split the rest when larger than 4 KiB
    /// (into 4 KiB-aligned chunks), whatever the load, so tests exercise
    /// both cross-core paths on a busy machine. Not for production use.
    #[doc(hidden)]
    pub fn force_split(&self, on: bool) {
        self.core.force_split.store(on, Relaxed);
    }

    /// Whether the adaptive mode fuses crypto with the backend's copy when
    /// the backend lends its memory (the ramdisk does): on by default. Off,
    /// adaptive moves bytes as inline does (a copy plus a crypto pass), so a
    /// benchmark can tell what fusing is worth from what scheduling is.
    pub fn fuse(&self, on: bool) {
        self.core.no_fuse.store(!on, Relaxed);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saturated_engine_rewrites_its_sighting_once_per_tick() {
        let e = Engine::new(crate::test_volume(false), EngineConfig::default()).unwrap();
        let c = &e.core;
        let t = 10 * CONTENDED_TICK;
        assert!(c.saturated(t, c.ncpu));
        assert_eq!(c.contended_at.load(Relaxed), t);
        // Within the tick: still saturated, the line left alone.
        assert!(c.saturated(t + CONTENDED_TICK / 2, c.ncpu));
        assert_eq!(c.contended_at.load(Relaxed), t);
        assert!(c.contended(t + CONTENDED_TICK / 2, Duration::from_millis(1)));
        // A tick on: recorded again.
        assert!(c.saturated(t + CONTENDED_TICK, c.ncpu));
        assert_eq!(c.contended_at.load(Relaxed), t + CONTENDED_TICK);
        // Not saturated: nothing recorded.
        assert!(!c.saturated(t + 5 * CONTENDED_TICK, c.ncpu - 1));
        assert_eq!(c.contended_at.load(Relaxed), t + CONTENDED_TICK);
    }
}
