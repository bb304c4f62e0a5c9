//! Adaptive's verdict per sweep cell: is it at least as fast as the better
//! of classic and inline, within the noise the same run showed?
//!
//! The runner measures the adaptive target a second time in every round as
//! a control (`<cipher>-adaptive-control`, see [`crate::runner::run`]).
//! Both are the same mode on the same target, so whatever separates them is
//! noise alone: the cell's noise band is the largest relative deviation of
//! the control from adaptive, in their medians or in any one round (the two
//! ran in the same round). A cell is lost only when adaptive's median falls
//! below the better mode's by more than that band. The dm-crypt advisor
//! judges its gains the same way (`advisor::decide`).
//!
//! Why the rounds and not just the medians: one difference of two medians
//! is one sample of the noise, often near zero by chance. Judged by it, a
//! cell where adaptive is exactly as fast as inline was called lost one time
//! in four (the test below simulates it: inline minus adaptive and adaptive
//! minus control are uncorrelated, so each is the larger half the time in
//! either sign); with the per-round deviations it is about one in twenty
//! at three rounds, and a true 20% loss at 5% noise per round is still
//! found nine times in ten.
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

/// The noise band of a cell: the largest relative deviation of the
/// control from adaptive, in their medians or in any round both completed
/// (`rounds` pairs their MiB/s round by round; a failed round is 0 and
/// skipped).
pub fn band(adaptive: f64, control: f64, rounds: &[(f64, f64)]) -> f64 {
    let dev = |a: f64, c: f64| if a > 0.0 { (c - a).abs() / a } else { 0.0 };
    rounds
        .iter()
        .filter(|(a, c)| *a > 0.0 && *c > 0.0)
        .map(|&(a, c)| dev(a, c))
        .fold(dev(adaptive, control), f64::max)
}

/// A sweep cell's row label: `  aes randread  4k QD32 j1`.
pub(crate) fn cell_label(cipher: Cipher, c: &CellResult) -> String {
    format!(
        "  {} {:<9} {} QD{} j{}",
        cipher.short(),
        c.rw.name(),
        fmt_bs(c.bs),
        c.qd,
        c.jobs
    )
}

/// The verdict table of `report`'s sweep (empty when no cipher has an
/// adaptive target, its control, and classic or inline).
pub fn table(report: &Report) -> String {
    let sweep = super::sweep_cells(report);
    let mut s = String::new();
    let (mut cells, mut lost, mut ties) = (0, 0, 0);
    for cipher in [Cipher::Null, Cipher::AesXts] {
        let cell = |at: &CellResult, pred: &dyn Fn(&CellResult) -> bool| {
            sweep
                .iter()
                .copied()
                .find(|c| c.same_workload(at) && c.cipher == Some(cipher) && pred(c))
        };
        let find = |at: &CellResult, pred: &dyn Fn(&CellResult) -> bool| {
            cell(at, pred).and_then(|c| c.mib())
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
            let control_cell = cell(a, &|c| c.target == control_name);
            let control = control_cell.and_then(|c| c.mib());
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
                    "adaptive vs the better of classic and inline (MiB/s, medians); band = the largest |adaptive - control| / adaptive \
                     in the medians or any round (the same mode measured twice); LOST only below best - band:"
                );
                let _ = writeln!(
                    s,
                    "{:<28} {:>8} {:>8} {:>8} {:>8}  {:>13} {:>6}  verdict",
                    "  cell", "classic", "inline", "adaptive", "control", "adaptive/best", "band"
                );
            }
            let rounds: Vec<(f64, f64)> = control_cell
                .map(|c| {
                    a.rounds_mib_s
                        .iter()
                        .copied()
                        .zip(c.rounds_mib_s.iter().copied())
                        .collect()
                })
                .unwrap_or_default();
            let b = band(am, cm, &rounds);
            let v = judge(am, best, b);
            cells += 1;
            match v {
                Verdict::Lost => lost += 1,
                Verdict::Tie => ties += 1,
                Verdict::Win => {}
            }
            let label = cell_label(cipher, a);
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
        assert!((band(100.0, 103.0, &[]) - 0.03).abs() < 1e-12);
        assert!((band(100.0, 97.0, &[]) - 0.03).abs() < 1e-12);
        assert_eq!(band(0.0, 5.0, &[]), 0.0);
    }

    #[test]
    fn the_band_is_the_largest_deviation_in_any_round() {
        // Medians 1% apart, one round 8% apart: the band is 8%.
        let rounds = [(100.0, 101.0), (100.0, 108.0), (104.0, 102.0)];
        assert!((band(100.0, 101.0, &rounds) - 0.08).abs() < 1e-12);
        // Medians further apart than any round.
        assert!((band(100.0, 110.0, &rounds[..1]) - 0.10).abs() < 1e-12);
        // A failed round (0 MiB/s) is no measure of noise.
        assert!((band(100.0, 101.0, &[(0.0, 100.0), (100.0, 0.0)]) - 0.01).abs() < 1e-12);
    }

    /// Rate at which `trials` simulated cells are judged lost: inline and
    /// adaptive (and its control) measured `rounds` times each with
    /// independent normal noise of `sigma` per round, adaptive truly
    /// `loss` slower; `pairs` says whether the band sees the rounds.
    fn lost_rate(rng: &mut testutil::Rng, rounds: usize, loss: f64, pairs: bool) -> f64 {
        let sigma = 0.05;
        let mut normal = || {
            // Box-Muller from two uniforms in (0, 1].
            let u = |r: &mut testutil::Rng| (r.below(1 << 53) + 1) as f64 / (1u64 << 53) as f64;
            let (a, b) = (u(rng), u(rng));
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        };
        let median = |v: Vec<f64>| crate::stats::median(&v).expect("rounds");
        let trials = 20_000;
        let mut lost = 0;
        for _ in 0..trials {
            let mut draw = |mean: f64| -> Vec<f64> {
                (0..rounds)
                    .map(|_| mean * (1.0 + sigma * normal()))
                    .collect()
            };
            let (inline, adaptive, control) = (draw(1.0), draw(1.0 - loss), draw(1.0 - loss));
            let rs: Vec<(f64, f64)> = adaptive
                .iter()
                .copied()
                .zip(control.iter().copied())
                .collect();
            let (mi, ma, mc) = (median(inline), median(adaptive), median(control));
            let b = band(ma, mc, if pairs { &rs } else { &[] });
            if judge(ma, mi, b) == Verdict::Lost {
                lost += 1;
            }
        }
        lost as f64 / trials as f64
    }

    #[test]
    fn a_tie_is_rarely_called_lost_and_a_real_loss_usually_is() {
        let mut rng = testutil::Rng::new(0x5eed_ba2d);
        // Adaptive exactly as fast as inline, 3 rounds: the medians alone
        // call it lost about a quarter of the time, the rounds about 4%.
        let medians_only = lost_rate(&mut rng, 3, 0.0, false);
        assert!(
            (0.2..0.3).contains(&medians_only),
            "medians only: {medians_only}"
        );
        let tie = lost_rate(&mut rng, 3, 0.0, true);
        assert!(tie < 0.08, "a tie lost {tie} of the time");
        // A true 20% loss (4 sigma) is still found.
        let real = lost_rate(&mut rng, 3, 0.20, true);
        assert!(real > 0.8, "a 20% loss found only {real} of the time");
    }
}
