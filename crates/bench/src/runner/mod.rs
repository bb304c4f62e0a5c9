//! Runners and the one loop that drives them.
//!
//! A [`Runner`] knows its targets and measures one repetition of a
//! workload on one of them: [`engine::EngineRunner`] in-process over
//! `datapath::Engine`s on a ramdisk, [`fio::FioRunner`] with fio against
//! NBD exports (ucrypt's and its peers'), [`rbd::RbdRunner`] the same on
//! Ceph RBD images, [`vhost::VhostRunner`] with libblkio against
//! vhost-user-blk exports, [`file::FileRunner`] engines over a
//! `backend::FileBackend` beside fio's io_uring engine on one file. [`run`] takes any runner through
//! the options' [`Plan`]: per cell a warm-up per target, then the
//! repetitions in rounds whose target order rotates ([`round_order`]), then
//! the crypto speeds and the derived ratios.
//!
//! ```text
//!   Plan ──► for cell: warm_up(t) ∀t; for round: run(t) in rotated order
//!              │                                   │
//!              ▼                                   ▼
//!        EngineRunner (in-process)         FioRunner (fio over NBD)
//!              └────────────── Rep ───────────────┘
//!                               ▼
//!                   CellResult ─► Report (derive ratios)
//! ```

mod disk;
pub mod engine;
pub mod file;
pub mod fio;
pub mod rbd;
mod servers;
pub mod storage;
pub mod vhost;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::plan::{round_order, Plan};
pub use crate::record::{DiskReqs, Rep, RunTarget};
use crate::report::{self, CellResult, Phase, Report, Skipped};
use crate::target::{Cipher, Mode};
use crate::{Error, Options, Workload};

/// Measures repetitions on its targets.
pub trait Runner {
    /// `in-process`, `fio`, `fio+peers`, `vhost`, `vhost+peers`.
    fn via(&self) -> String;
    /// The targets, in table order.
    fn targets(&self) -> &[RunTarget];
    /// Targets that could not start, and why.
    fn skipped(&self) -> Vec<Skipped>;
    /// Where the bytes live when the runner's `via` does not say it
    /// (e.g. the file and whether it was opened with O_DIRECT).
    fn storage(&self) -> Option<String> {
        None
    }
    /// A warm-up run before a cell's repetitions (default: none).
    fn warm_up(&mut self, _target: usize, _w: &Workload) {}
    /// One repetition of `w` on target `target`.
    fn run(&mut self, target: usize, w: &Workload) -> Rep;
    /// Called after each cell (e.g. to print engine counters).
    fn after_cell(&mut self, _w: &Workload) {}
}

/// The head of an `--engine-stats` line: `engine NAME after RW bs=BS
/// QDn jobs=n`.
fn engine_stats_head(name: &str, w: &Workload) -> String {
    format!(
        "engine {name} after {} bs={} QD{} jobs={}",
        w.rw.name(),
        crate::report::fmt_bs(w.bs),
        w.qd,
        w.jobs
    )
}

/// Runs `opts`' plan through `runner` and returns the report (not yet
/// written). `opts` should be the runner's own view (e.g. fio's smaller
/// images), as it is recorded in the report.
pub fn run(runner: &mut dyn Runner, opts: &Options) -> Result<Report, Error> {
    opts.validate()?;
    watch_interrupts();
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let t0 = Instant::now();
    let plan = Plan::new(opts);
    let targets = runner.targets().to_vec();
    let in_phase = |phase: Phase| -> Vec<usize> {
        (0..targets.len())
            .filter(|&i| match phase {
                Phase::Headline => targets[i].headline,
                Phase::Sweep => targets[i].swept,
            })
            .collect()
    };
    let head = in_phase(Phase::Headline);
    // The sweep's slots: each target, plus a control per adaptive target
    // that has classic or inline to be judged against (the same target
    // measured twice per round: the noise band of report::verdict).
    let mut sweep: Vec<(usize, RunTarget)> = in_phase(Phase::Sweep)
        .into_iter()
        .map(|i| (i, targets[i].clone()))
        .collect();
    let controls: Vec<(usize, RunTarget)> = sweep
        .iter()
        .filter(|(_, t)| t.mode == Some(Mode::Adaptive) && t.cipher.is_some())
        .filter(|(_, a)| {
            sweep.iter().any(|(_, o)| {
                o.cipher == a.cipher && matches!(o.mode, Some(Mode::Classic | Mode::Inline))
            })
        })
        .map(|(i, a)| {
            let mut c = a.clone();
            c.name = format!("{}{}", a.name, report::verdict::CONTROL_SUFFIX);
            // No mode: the control is no fourth mode in ratios and maps.
            c.mode = None;
            (*i, c)
        })
        .collect();
    sweep.extend(controls);
    let head: Vec<(usize, RunTarget)> = head.into_iter().map(|i| (i, targets[i].clone())).collect();
    let total = plan.cost(head.len(), sweep.len(), opts.warmup);
    let bar = progress_bar(opts.progress, total.as_millis() as u64);

    let mut cells = Vec::new();
    for cell in &plan.cells {
        let ids = match cell.phase {
            Phase::Headline => &head,
            Phase::Sweep => &sweep,
        };
        if ids.is_empty() {
            continue;
        }
        let w = &cell.workload;
        bar.set_message(format!(
            "{} {} bs={} QD{} jobs={}",
            match cell.phase {
                Phase::Headline => "headline",
                Phase::Sweep => "sweep",
            },
            w.rw.name(),
            report::fmt_bs(w.bs),
            w.qd,
            w.jobs
        ));
        let mut warmed = Vec::new();
        for &(t, _) in ids {
            if !warmed.contains(&t) {
                runner.warm_up(t, w);
                warmed.push(t);
            }
            bar.inc(opts.warmup.as_millis() as u64);
        }
        let mut reps: Vec<Vec<Rep>> = vec![Vec::new(); ids.len()];
        for round in 0..cell.reps {
            for k in round_order(ids.len(), round) {
                if interrupted() {
                    return Err(Error::Interrupted);
                }
                reps[k].push(runner.run(ids[k].0, w));
                bar.inc(cell.rep_cost().as_millis() as u64);
            }
        }
        runner.after_cell(w);
        for (k, r) in reps.into_iter().enumerate() {
            cells.push(CellResult::from_reps(cell.phase, &ids[k].1, w, r));
        }
    }
    bar.finish_and_clear();

    // Crypto throughput of every cipher in use at every block size.
    let mut ciphers: Vec<Cipher> = targets.iter().filter_map(|t| t.cipher).collect();
    ciphers.sort_by_key(|c| c.short());
    ciphers.dedup();
    let mut sizes = plan.block_sizes();
    if !sizes.contains(&4096) {
        sizes.insert(0, 4096);
        sizes.sort_unstable();
    }
    let budget = (opts.sweep_runtime / 2).max(Duration::from_millis(10));
    let mut crypto = Vec::new();
    for &c in &ciphers {
        for &bs in &sizes {
            // The targets' sector size: 512-byte XTS is slower than 4096.
            crypto.push(crate::measure_crypto(c, bs, opts.sector_size, budget)?);
        }
    }
    let machine = report::Machine::detect();
    report::derive(&mut cells, &crypto, machine.cpus);
    Ok(Report {
        schema_version: report::SCHEMA_VERSION,
        tool: format!("ucrypt bench {}", env!("CARGO_PKG_VERSION")),
        started,
        duration_s: t0.elapsed().as_secs_f64(),
        machine,
        via: runner.via(),
        storage: runner.storage(),
        options: report::OptionsRecord::from(opts),
        crypto,
        cells,
        skipped: runner.skipped(),
    })
}

fn progress_bar(enabled: bool, total_ms: u64) -> indicatif::ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_ms);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// From the first call on, SIGINT and SIGTERM no longer kill the process
/// at once: they set a flag the run checks between measurements, so the
/// runners' `Drop` stops the servers and removes their images (RAM in
/// /dev/shm) instead of leaving them behind. A second signal exits at once.
pub(crate) fn watch_interrupts() {
    INTERRUPTED.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // The conditional exit first: it fires only once the flag is set.
            let _ = signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, flag.clone());
            let _ = signal_hook::flag::register(sig, flag.clone());
        }
        flag
    });
}

/// True once SIGINT or SIGTERM arrived (see [`watch_interrupts`]).
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Rw;
    use crate::target::Target;
    use crate::CryptoSpeed;

    fn crypto_speed_of(c: &[CryptoSpeed], cipher: Cipher, bs: u32) -> Option<&CryptoSpeed> {
        c.iter().find(|s| s.cipher == cipher.spec() && s.bs == bs)
    }

    /// A runner that records the order of its runs and reports the target
    /// index as its throughput.
    struct Script {
        targets: Vec<RunTarget>,
        log: Vec<(usize, u32)>,
        warm: usize,
    }

    impl Runner for Script {
        fn via(&self) -> String {
            "script".into()
        }
        fn targets(&self) -> &[RunTarget] {
            &self.targets
        }
        fn skipped(&self) -> Vec<Skipped> {
            Vec::new()
        }
        fn warm_up(&mut self, _t: usize, _w: &Workload) {
            self.warm += 1;
        }
        fn run(&mut self, t: usize, w: &Workload) -> Rep {
            self.log.push((t, w.bs));
            Rep {
                ops: 1,
                bytes_per_s: (t as f64 + 1.0) * crate::stats::MIB,
                iops: 1.0,
                ..Rep::default()
            }
        }
    }

    fn target(t: Target, headline: bool, swept: bool) -> RunTarget {
        RunTarget {
            name: t.to_string(),
            cipher: t.cipher,
            mode: t.cipher.map(|_| t.mode),
            headline,
            swept,
        }
    }

    #[test]
    fn one_loop_interleaves_rotating_rounds_over_each_phase() {
        let mut o = Options::quick();
        o.bs = vec![8192];
        o.qd = vec![1];
        o.jobs = vec![1];
        o.rw = vec![Rw::Read];
        o.reps = 2;
        o.sweep_reps = 3;
        o.progress = false;
        let mut s = Script {
            targets: vec![
                target(Target::RAW, true, true),
                target(Target::new(Cipher::Null, Mode::Inline), true, false),
                target(Target::new(Cipher::Null, Mode::Classic), false, true),
            ],
            log: Vec::new(),
            warm: 0,
        };
        let r = run(&mut s, &o).unwrap();
        // Headline read and write: targets 0 and 1, two rounds, rotated.
        let head: Vec<usize> = s.log.iter().filter(|l| l.1 == 4096).map(|l| l.0).collect();
        assert_eq!(head, [0, 1, 1, 0, 0, 1, 1, 0]);
        // Sweep: targets 0 and 2, three rounds, rotated.
        let sweep: Vec<usize> = s.log.iter().filter(|l| l.1 == 8192).map(|l| l.0).collect();
        assert_eq!(sweep, [0, 2, 2, 0, 0, 2]);
        assert_eq!(s.warm, 2 + 2 + 2);
        assert_eq!(r.cells.len(), 2 * 2 + 2);
        let c = r.cells.iter().find(|c| c.target == "null-classic").unwrap();
        assert_eq!((c.phase, c.reps, c.mib()), (Phase::Sweep, 3, Some(3.0)));
        assert_eq!(c.pct_raw, Some(300.0));
        assert_eq!(r.via, "script");
        assert!(crypto_speed_of(&r.crypto, Cipher::Null, 4096).is_some());
        assert!(crypto_speed_of(&r.crypto, Cipher::Null, 8192).is_some());
    }
}
