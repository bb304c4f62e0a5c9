//! Adaptive's verdict per sweep cell: is it at least as fast as the better
//! of classic and inline, within the noise the same run showed?
//!
//! The runner measures the adaptive target a second time in every round as
//! a control (`<cipher>-adaptive-control`, see [`crate::runner::run`]).
//! Both are the same mode on the same target, so the difference of their
//! medians is what noise alone does to a median in that cell: the cell's
//! noise band. A cell is lost only when adaptive's median falls below the
//! better mode's by more than that band.
//!
//! ```text
//!   cell                  classic   inline adaptive  control  adaptive/best   band  verdict
//!   aes read  1M QD8 j1        1538     1276     1700     1650           1.11   2.9%  win
//! ```

use std::fmt::Write as _;

use super::{fmt_bs, num, CellResult, Report};
use crate::target::{Cipher, Mode};

/// Suffix of the control target's name (after the adaptive target's).
pub const CONTROL_SUFFIX: &str = "-control";

/// How adaptive fared in one cell. Closed on purpose: a cell is won, tied
/// within its noise band, or lost; there is no fourth outcome to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// At least as fast as the better mode.
    Win,
    /// Slower, but within the noise band.
    Tie,
    /// Slower by more than the noise band.
    Lost,
}

impl Verdict {
    /// `win`, `tie`, `LOST`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Win => "win",
            Verdict::Tie => "tie (in band)",
            Verdict::Lost => "LOST",
        }
    }
}

/// The verdict for medians `adaptive`, `best` (of classic and inline) and
/// the relative noise `band` (0.05 = 5%).
pub fn judge(adaptive: f64, best: f64, band: f64) -> Verdict {
    if adaptive >= best {
        Verdict::Win
    } else if adaptive >= best * (1.0 - band) {
        Verdict::Tie
    } else {
        Verdict::Lost
    }
}

/// The noise band of a cell: the relative difference between the medians
/// of the adaptive target and its control.
pub fn band(adaptive: f64, control: f64) -> f64 {
    if adaptive > 0.0 {
        (control - adaptive).abs() / adaptive
    } else {
        0.0
    }
}

/// The verdict table of `report`'s sweep (empty when no cipher has an
/// adaptive target, its control, and classic or inline).
pub fn table(report: &Report) -> String {
    let sweep = super::sweep_cells(report);
    let mut s = String::new();
    let (mut cells, mut lost, mut ties) = (0, 0, 0);
    for cipher in [Cipher::Null, Cipher::AesXts] {
        let find = |at: &CellResult, pred: &dyn Fn(&CellResult) -> bool| {
            sweep
                .iter()
                .find(|c| c.same_workload(at) && c.cipher == Some(cipher) && pred(c))
                .and_then(|c| c.mib())
        };
        let mut keys: Vec<&CellResult> = sweep
            .iter()
            .copied()
            .filter(|c| c.cipher == Some(cipher) && c.mode == Some(Mode::Adaptive))
            .collect();
        let rw_order = |c: &CellResult| report.options.rw.iter().position(|r| *r == c.rw);
        keys.sort_by_key(|c| (rw_order(c), c.bs, c.qd, c.jobs));
        for a in keys {
            let control_name = format!("{}{CONTROL_SUFFIX}", a.target);
            let control = find(a, &|c| c.target == control_name);
            let classic = find(a, &|c| c.mode == Some(Mode::Classic));
            let inline = find(a, &|c| c.mode == Some(Mode::Inline));
            let best = match (classic, inline) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            };
            let (Some(am), Some(cm), Some(best)) = (a.mib(), control, best) else {
                continue;
            };
            if s.is_empty() {
                let _ = writeln!(
                    s,
                    "adaptive vs the better of classic and inline (MiB/s, medians); band = |adaptive - control| / adaptive, \
                     the same mode measured twice; LOST only below best - band:"
                );
                let _ = writeln!(
                    s,
                    "{:<28} {:>8} {:>8} {:>8} {:>8}  {:>13} {:>6}  verdict",
                    "  cell", "classic", "inline", "adaptive", "control", "adaptive/best", "band"
                );
            }
            let b = band(am, cm);
            let v = judge(am, best, b);
            cells += 1;
            match v {
                Verdict::Lost => lost += 1,
                Verdict::Tie => ties += 1,
                Verdict::Win => {}
            }
            let label = format!(
                "  {} {:<9} {} QD{} j{}",
                cipher.short(),
                a.rw.name(),
                fmt_bs(a.bs),
                a.qd,
                a.jobs
            );
            let _ = writeln!(
                s,
                "{:<28} {:>8} {:>8} {:>8} {:>8}  {:>13.2} {:>5.1}%  {}",
                label,
                num(classic),
                num(inline),
                num(Some(am)),
                num(Some(cm)),
                am / best,
                b * 100.0,
                v.name()
            );
        }
    }
    if cells > 0 {
        let _ = writeln!(
            s,
            "adaptive lost {lost} of {cells} cells ({ties} within the noise band, {} won)",
            cells - lost - ties
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_lost_only_beyond_the_band() {
        assert_eq!(judge(100.0, 100.0, 0.0), Verdict::Win);
        assert_eq!(judge(96.0, 100.0, 0.05), Verdict::Tie);
        assert_eq!(judge(94.0, 100.0, 0.05), Verdict::Lost);
        assert_eq!(judge(99.0, 100.0, 0.0), Verdict::Lost);
        assert!((band(100.0, 103.0) - 0.03).abs() < 1e-12);
        assert!((band(100.0, 97.0) - 0.03).abs() < 1e-12);
        assert_eq!(band(0.0, 5.0), 0.0);
    }
}
