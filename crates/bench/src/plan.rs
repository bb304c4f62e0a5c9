//! The workload plan every profile and every runner shares: a list of
//! cells (phase × direction × block size × jobs × queue depth), each
//! measured over the targets of its phase for a number of repetitions.
//!
//! ```text
//!   Options ─ Plan::new ─► [PlanCell] ─ runner::execute ─► [CellResult]
//!     headline: shape × {read, write}      (headline targets)
//!     sweep:    rw × bs × jobs × qd        (sweep targets)
//! ```

use std::time::Duration;

use crate::driver::Workload;
use crate::record::Phase;
use crate::Options;

/// A headline workload shape: block size and queue depth, one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Block size in bytes.
    pub bs: u32,
    /// Queue depth.
    pub qd: usize,
}

/// One cell of the plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanCell {
    /// Headline or sweep (which targets take part).
    pub phase: Phase,
    /// What each repetition runs.
    pub workload: Workload,
    /// Repetitions (rounds), interleaved over the targets.
    pub reps: usize,
}

/// Every cell, in run order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The cells.
    pub cells: Vec<PlanCell>,
}

impl Plan {
    /// The plan of `opts`: the headline shapes (in each direction of
    /// `headline_rw`, one job) if there are headline targets, then the
    /// sweep if there are sweep targets.
    pub fn new(opts: &Options) -> Self {
        let mut cells = Vec::new();
        if !opts.targets.is_empty() {
            for s in &opts.headline {
                for &rw in &opts.headline_rw {
                    cells.push(PlanCell {
                        phase: Phase::Headline,
                        workload: Workload {
                            rw,
                            bs: s.bs,
                            qd: s.qd,
                            jobs: 1,
                            runtime: opts.runtime,
                        },
                        reps: opts.reps,
                    });
                }
            }
        }
        if !opts.sweep_targets.is_empty() {
            for &rw in &opts.rw {
                for &bs in &opts.bs {
                    for &jobs in &opts.jobs {
                        for &qd in &opts.qd {
                            cells.push(PlanCell {
                                phase: Phase::Sweep,
                                workload: Workload {
                                    rw,
                                    bs,
                                    qd,
                                    jobs,
                                    runtime: opts.sweep_runtime,
                                },
                                reps: opts.sweep_reps,
                            });
                        }
                    }
                }
            }
        }
        Self { cells }
    }

    /// Block sizes used anywhere in the plan, ascending.
    pub fn block_sizes(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.cells.iter().map(|c| c.workload.bs).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Estimated wall time with `head` headline and `sweep` sweep targets
    /// and a warm-up per target per cell.
    pub fn cost(&self, head: usize, sweep: usize, warmup: Duration) -> Duration {
        self.cells
            .iter()
            .map(|c| {
                let n = match c.phase {
                    Phase::Headline => head,
                    Phase::Sweep => sweep,
                };
                c.cost(warmup) * n as u32
            })
            .sum()
    }
}

impl PlanCell {
    /// Estimated wall time of this cell for one target.
    pub fn cost(&self, warmup: Duration) -> Duration {
        warmup + self.rep_cost() * self.reps as u32
    }

    /// Estimated wall time of one repetition: the run time plus the time
    /// to drain what it keeps in flight.
    pub fn rep_cost(&self) -> Duration {
        self.workload.runtime + drain_estimate(&self.workload)
    }
}

/// Time to drain what a workload keeps in flight, at an assumed 1.5 GB/s
/// (for estimates and the progress bar only).
pub fn drain_estimate(w: &Workload) -> Duration {
    Duration::from_secs_f64((u64::from(w.bs) * (w.qd * w.jobs) as u64) as f64 / 1.5e9)
}

/// The order of the targets in round `round` of a cell: the list rotated
/// by the round, so no target always goes first or last (on a shared
/// machine a run can be slowed by the ones just before it).
pub fn round_order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Rw;

    #[test]
    fn plan_orders_headline_then_sweep() {
        let o = Options::quick();
        let p = Plan::new(&o);
        let head = p
            .cells
            .iter()
            .filter(|c| c.phase == Phase::Headline)
            .count();
        assert_eq!(head, 2);
        assert_eq!(p.cells.len(), 2 + 2 * 3 * 2 * 2);
        assert_eq!(p.cells[0].workload.rw, Rw::Read);
        assert_eq!(p.cells[1].workload.rw, Rw::Write);
        assert_eq!(p.cells[2].phase, Phase::Sweep);
        assert_eq!(p.block_sizes(), vec![4 << 10, 64 << 10, 1 << 20]);
        let g = Plan::new(&Options::grid());
        assert!(g.cells.iter().all(|c| c.phase == Phase::Sweep));
        assert_eq!(g.cells.len(), 32);
        let mut none = Options::quick();
        none.sweep_targets.clear();
        assert_eq!(Plan::new(&none).cells.len(), 2);
    }

    #[test]
    fn rounds_rotate_the_order() {
        let r: Vec<Vec<usize>> = (0..4).map(|r| round_order(4, r).collect()).collect();
        assert_eq!(r[0], [0, 1, 2, 3]);
        assert_eq!(r[1], [1, 2, 3, 0]);
        assert_eq!(r[3], [3, 0, 1, 2]);
        // Every target goes last exactly once over n rounds.
        let lasts: Vec<usize> = r.iter().map(|o| o[3]).collect();
        assert_eq!(lasts, [3, 0, 1, 2]);
        assert_eq!(round_order(0, 5).count(), 0);
    }

    #[test]
    fn drain_estimate_scales_with_bytes_in_flight() {
        let w = Workload {
            rw: Rw::Read,
            bs: 4 << 20,
            qd: 64,
            jobs: 4,
            runtime: Duration::ZERO,
        };
        let d = drain_estimate(&w).as_secs_f64();
        assert!((d - (1u64 << 30) as f64 / 1.5e9).abs() < 1e-6);
    }
}
