//! The grid profile's table (formerly printed by `datapath/examples/grid.rs`):
//! per cipher, direction, block size, QD and jobs, each mode's best round in
//! MiB/s and adaptive's ratio to max(classic, inline), then the count of
//! cells where adaptive is at least as fast as the better of the two.
//!
//! ```text
//! cell (MiB/s)                       raw   classic    inline  adaptive  adaptive/best
//! xts read     4k qd1  j1           5733      1045      5725      6822  1.19  inline/raw 1.00, …
//! ```
//! A `<` marks cells where adaptive lost.

use std::fmt::Write as _;

use super::{fmt_bs, num, CellResult, Report};
use crate::target::{Cipher, Mode};

/// Best round of `target`'s cell (None when absent or nothing completed).
fn best(sweep: &[&CellResult], at: &CellResult, cipher: Option<Cipher>, mode: Mode) -> Option<f64> {
    sweep
        .iter()
        .find(|c| {
            c.rw == at.rw
                && c.bs == at.bs
                && c.qd == at.qd
                && c.jobs == at.jobs
                && c.cipher == cipher
                && (cipher.is_none() || c.mode == Some(mode))
                && (cipher.is_some() || c.target == "raw")
        })
        .and_then(|c| c.mib_s.map(|s| s.max))
}

/// The grid table of `report`'s sweep (empty when no cipher has classic,
/// inline and adaptive cells).
pub fn table(report: &Report) -> String {
    let sweep = super::sweep_cells(report);
    let mut s = String::new();
    let (mut cells, mut wins) = (0, 0);
    for cipher in [Cipher::Null, Cipher::AesXts] {
        // The cells of this cipher's adaptive target give the grid's order.
        let mut keys: Vec<&CellResult> = sweep
            .iter()
            .copied()
            .filter(|c| c.cipher == Some(cipher) && c.mode == Some(Mode::Adaptive))
            .collect();
        if keys.is_empty() {
            continue;
        }
        let rw_order = |c: &CellResult| report.options.rw.iter().position(|r| *r == c.rw);
        keys.sort_by_key(|c| (rw_order(c), c.bs, c.qd, c.jobs));
        if s.is_empty() {
            let _ = writeln!(
                s,
                "grid: each mode's best of {} rounds x {} ms (target order rotated per round); \
                 adaptive/best = adaptive / max(classic, inline), < where adaptive lost",
                report.options.sweep_reps, report.options.sweep_runtime_ms
            );
            let _ = writeln!(
                s,
                "{:<28} {:>9} {:>9} {:>9} {:>9}  adaptive/best",
                "cell (MiB/s)", "raw", "classic", "inline", "adaptive"
            );
        }
        let cname = match cipher {
            Cipher::Null => "null",
            Cipher::AesXts => "xts",
        };
        for k in keys {
            let name = format!(
                "{cname} {:<5} {:>4} qd{:<2} j{}",
                k.rw.name(),
                fmt_bs(k.bs),
                k.qd,
                k.jobs
            );
            let raw = best(&sweep, k, None, Mode::Classic);
            let classic = best(&sweep, k, Some(cipher), Mode::Classic);
            let inline = best(&sweep, k, Some(cipher), Mode::Inline);
            let adaptive = best(&sweep, k, Some(cipher), Mode::Adaptive);
            let ratio = match (classic, inline, adaptive) {
                (Some(c), Some(i), Some(a)) if c.max(i) > 0.0 => Some(a / c.max(i)),
                _ => None,
            };
            let mut tail = String::new();
            if let Some(r) = ratio {
                cells += 1;
                if r >= 1.0 {
                    wins += 1;
                }
                let _ = write!(tail, "  {r:.2}{}", if r >= 1.0 { "" } else { "  <" });
            } else {
                tail.push_str("  -");
            }
            if let (4096, 1, 1, Some(raw), Some(c), Some(i)) =
                (k.bs, k.qd, k.jobs, raw, classic, inline)
            {
                if raw > 0.0 {
                    let _ = write!(
                        tail,
                        "  inline/raw {:.2}, classic/raw {:.2}",
                        i / raw,
                        c / raw
                    );
                }
            }
            let _ = writeln!(
                s,
                "{name:<28} {:>9} {:>9} {:>9} {:>9}{tail}",
                num(raw),
                num(classic),
                num(inline),
                num(adaptive)
            );
        }
    }
    if !s.is_empty() {
        let _ = writeln!(
            s,
            "adaptive >= max(classic, inline) in {wins}/{cells} cells"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Rw;

    fn cell(name: &str, cipher: Option<Cipher>, mode: Mode, bs: u32, rounds: &[f64]) -> CellResult {
        crate::report::tests::sweep_cell(name, cipher, Some(mode), Rw::Read, bs, 1, rounds)
    }

    #[test]
    fn best_rounds_and_adaptive_ratio() {
        let x = Some(Cipher::AesXts);
        let mut r = crate::report::tests::empty_report("grid");
        r.cells = vec![
            cell("raw", None, Mode::Classic, 4096, &[900.0, 1000.0]),
            cell("aes-classic", x, Mode::Classic, 4096, &[100.0, 200.0]),
            cell("aes-inline", x, Mode::Inline, 4096, &[500.0, 400.0]),
            cell("aes-adaptive", x, Mode::Adaptive, 4096, &[600.0, 550.0]),
            cell("raw", None, Mode::Classic, 65536, &[1000.0]),
            cell("aes-classic", x, Mode::Classic, 65536, &[300.0]),
            cell("aes-inline", x, Mode::Inline, 65536, &[800.0]),
            cell("aes-adaptive", x, Mode::Adaptive, 65536, &[400.0]),
        ];
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("grid: each mode's best of 3 rounds x "));
        let lines = &lines[1..];
        assert!(lines[0].starts_with("cell (MiB/s)") && lines[0].ends_with("adaptive/best"));
        assert!(lines[1].starts_with("xts read    4k qd1  j1"), "{t}");
        // Best rounds: raw 1000, classic 200, inline 500, adaptive 600.
        let f: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(f[5..10], ["1000", "200", "500", "600", "1.20"], "{t}");
        assert!(
            lines[1].ends_with("inline/raw 0.50, classic/raw 0.20"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("xts read   64k qd1  j1") && lines[2].ends_with("0.50  <"),
            "{t}"
        );
        assert_eq!(lines[3], "adaptive >= max(classic, inline) in 1/2 cells");
        r.cells.retain(|c| c.mode != Some(Mode::Adaptive));
        assert_eq!(table(&r), "");
    }
}
