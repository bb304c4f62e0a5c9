//! The in-process runner: one `datapath::Engine` per target over one
//! shared `backend::MemBackend` ramdisk, driven by [`crate::driver`]
//! (jobs × QD through `Engine::submit`, no frontend, no syscalls per IO).

use std::sync::Arc;

use backend::{Backend, MemBackend};
use datapath::Engine;

use super::{Rep, RunTarget, Runner};
use crate::driver::{self, Workload};
use crate::report::Skipped;
use crate::stats::Percentiles;
use crate::target::Target;
use crate::{Error, Options};

/// Engines over a ramdisk.
pub struct EngineRunner {
    size: u64,
    targets: Vec<RunTarget>,
    engines: Vec<Arc<Engine>>,
    skipped: Vec<Skipped>,
    warmup: std::time::Duration,
    engine_stats: bool,
}

impl EngineRunner {
    /// Allocates and fills the ramdisk and starts an engine per target of
    /// `opts` (headline and sweep); a target that cannot start is skipped.
    pub fn new(opts: &Options) -> Result<Self, Error> {
        opts.validate()?;
        let mem = MemBackend::new(opts.size).map_err(|source| Error::Ramdisk {
            size: opts.size,
            source,
        })?;
        let backend: Arc<dyn Backend> = Arc::new(mem);
        prefill(&*backend)?;
        let max = |v: &[usize]| v.iter().max().copied().unwrap_or(1);
        let head_qd = opts.headline.iter().map(|s| s.qd).max().unwrap_or(1);
        let queue_depth = (max(&opts.qd) * max(&opts.jobs)).max(head_qd).max(1);
        let mut all: Vec<Target> = opts.targets.clone();
        all.extend(
            opts.sweep_targets
                .iter()
                .filter(|t| !opts.targets.contains(t)),
        );
        let mut runner = Self {
            size: opts.size,
            targets: Vec::new(),
            engines: Vec::new(),
            skipped: Vec::new(),
            warmup: opts.warmup,
            engine_stats: opts.engine_stats,
        };
        for t in all {
            match t.engine(Arc::clone(&backend), queue_depth, opts.sector_size) {
                Ok(e) => {
                    e.fuse(opts.fuse);
                    e.force_split(opts.force_split);
                    runner.engines.push(Arc::new(e));
                    runner.targets.push(RunTarget {
                        name: t.to_string(),
                        cipher: t.cipher,
                        mode: t.cipher.map(|_| t.mode),
                        headline: opts.targets.contains(&t),
                        swept: opts.sweep_targets.contains(&t),
                    });
                }
                Err(e) => runner.skipped.push(Skipped {
                    target: t.to_string(),
                    reason: crate::error_chain(&e),
                }),
            }
        }
        Ok(runner)
    }
}

impl Runner for EngineRunner {
    fn via(&self) -> String {
        "in-process".into()
    }

    fn targets(&self) -> &[RunTarget] {
        &self.targets
    }

    fn skipped(&self) -> Vec<Skipped> {
        self.skipped.clone()
    }

    fn warm_up(&mut self, target: usize, w: &Workload) {
        if self.warmup.is_zero() {
            return;
        }
        // A shallow warm-up: it wakes the engine's threads and caches
        // without draining a deep queue of large blocks twice.
        let warm = Workload {
            runtime: self.warmup,
            qd: w.qd.min(4),
            ..*w
        };
        driver::run(&self.engines[target], &warm, self.size);
    }

    fn run(&mut self, target: usize, w: &Workload) -> Rep {
        rep_of(driver::run(&self.engines[target], w, self.size))
    }

    fn after_cell(&mut self, w: &Workload) {
        if !self.engine_stats {
            return;
        }
        for (t, e) in self.targets.iter().zip(&self.engines) {
            let s = e.stats();
            let dir = if w.rw.is_write() { s.write } else { s.read };
            eprintln!(
                "{} (cumulative): {dir:?}",
                super::engine_stats_head(&t.name, w)
            );
        }
    }
}

impl Drop for EngineRunner {
    fn drop(&mut self) {
        for e in &self.engines {
            let _ = e.shutdown();
        }
    }
}

/// The repetition the driver measured.
pub(super) fn rep_of(mut r: driver::RepResult) -> Rep {
    Rep {
        ops: r.ops,
        bytes_per_s: r.bytes_per_s(),
        iops: r.iops(),
        lat: Percentiles::of_ns(&mut r.lat_ns),
        cpu_s_per_gib: r.cpu_s_per_gib(),
        errors: r.errors,
        error: r.first_error,
        disk: None,
    }
}

/// Writes a pattern over the whole ramdisk so reads touch real pages.
fn prefill(b: &dyn Backend) -> Result<(), Error> {
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i as u8) ^ 0x3c).collect();
    let size = b.size();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(chunk.len() as u64) as usize;
        b.write_at(&chunk[..n], off, false)
            .map_err(|source| Error::Ramdisk { size, source })?;
        off += n as u64;
    }
    Ok(())
}
