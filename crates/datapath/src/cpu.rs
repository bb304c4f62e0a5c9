//! CPU topology helpers: how many CPUs, which one we run on, pinning.
//!
//! Thin safe wrappers over `sched_getcpu(3)` / `sched_setaffinity(2)` (via
//! `nix`) for `same_cpu_crypt`'s per-CPU workers, and [`Load`], the
//! adaptive mode's view of how many cores other threads keep busy.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use nix::sched::{sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Number of CPUs this process may run on (at least 1).
pub(crate) fn count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The CPU the calling thread runs on now (0 if unknown).
pub(crate) fn current() -> usize {
    sched_getcpu().unwrap_or(0)
}

/// Pins the calling thread to `cpu`; best effort (a restricted cpuset just
/// leaves the thread unpinned).
pub(crate) fn pin_to(cpu: usize) {
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

/// How often [`Load::others`] re-reads `/proc/loadavg`.
const SAMPLE_NS: u64 = 2_000_000;

/// Runnable threads on the machine besides the engine's own, sampled from
/// the 4th field of `/proc/loadavg` (runnable/total, right now) at most
/// every [`SAMPLE_NS`].
pub(crate) struct Load {
    sampled_at: AtomicU64,
    last: AtomicUsize,
    smoothed: AtomicUsize,
    steady: AtomicUsize,
}

impl Load {
    pub(crate) fn new() -> Self {
        Self {
            sampled_at: AtomicU64::new(0),
            last: AtomicUsize::new(0),
            smoothed: AtomicUsize::new(0),
            steady: AtomicUsize::new(0),
        }
    }

    /// Runnable threads other than the caller and `ours` engine threads
    /// (the larger of the last two samples, to smooth single readings).
    /// `now` is in ns from any fixed epoch.
    pub(crate) fn others(&self, now: u64, ours: usize) -> usize {
        self.sample(now, ours);
        self.smoothed.load(Relaxed)
    }

    /// Like [`Load::others`], but the smaller of the last two samples: load
    /// that persists, not a kernel thread that happened to be runnable at
    /// one sample.
    pub(crate) fn persistent(&self, now: u64, ours: usize) -> usize {
        self.sample(now, ours);
        self.steady.load(Relaxed)
    }

    fn sample(&self, now: u64, ours: usize) {
        let at = self.sampled_at.load(Relaxed);
        if now.saturating_sub(at) >= SAMPLE_NS
            && self
                .sampled_at
                .compare_exchange(at, now, Relaxed, Relaxed)
                .is_ok()
        {
            if let Some(running) = runnable() {
                let fresh = running.saturating_sub(1 + ours);
                let prev = self.last.swap(fresh, Relaxed);
                self.smoothed.store(fresh.max(prev), Relaxed);
                self.steady.store(fresh.min(prev), Relaxed);
            }
        }
    }
}

/// Runnable scheduling entities right now, from `/proc/loadavg`.
fn runnable() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}
