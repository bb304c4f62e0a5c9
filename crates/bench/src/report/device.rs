//! ucrypt against the storage itself in every sweep cell: with `--dir`,
//! the `disk` target (fio's io_uring engine on a plain file of the same
//! filesystem, O_DIRECT) runs in every cell beside the servers, so each
//! ucrypt mode's rate is a same-round ratio to what the device gives
//! without a server or a cipher. Where the device is the limit (small
//! blocks at depth) this is the figure that says how much of it ucrypt
//! keeps; at large blocks a VM's host cache can put a server above it.
//!
//! ```text
//!   cell                         disk  classic   inline adaptive  adaptive/disk (lowest-highest)
//!   aes randread  4k QD32 j1      212      138      151      156  0.74 (0.70-0.78)
//! ```

use std::fmt::Write as _;

use super::ratios::per_round;
use super::{num, CellResult, Report, DISK_TARGET};
use crate::stats;
use crate::target::{Cipher, Mode};

/// The table (empty when the sweep has no `disk` cells or no adaptive
/// target beside them).
pub fn table(report: &Report) -> String {
    let sweep = super::sweep_cells(report);
    let mut s = String::new();
    let mut keys: Vec<&CellResult> = sweep
        .iter()
        .copied()
        .filter(|c| c.cipher == Some(Cipher::AesXts) && c.mode == Some(Mode::Adaptive))
        .filter(|c| !c.target.ends_with(super::verdict::CONTROL_SUFFIX))
        .collect();
    let rw_order = |c: &CellResult| report.options.rw.iter().position(|r| *r == c.rw);
    keys.sort_by_key(|c| (rw_order(c), c.bs, c.qd, c.jobs));
    for a in keys {
        let at = |pred: &dyn Fn(&CellResult) -> bool| {
            sweep
                .iter()
                .copied()
                .find(|c| c.same_workload(a) && pred(c))
        };
        let Some(disk) = at(&|c| c.target == DISK_TARGET) else {
            continue;
        };
        let mode = |m: Mode| {
            at(&|c| c.cipher == Some(Cipher::AesXts) && c.mode == Some(m)).and_then(|c| c.mib())
        };
        let ratios = per_round(&a.rounds_mib_s, &disk.rounds_mib_s);
        let Some(med) = stats::median(&ratios) else {
            continue;
        };
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if s.is_empty() {
            let _ = writeln!(
                s,
                "ucrypt against the storage (disk: fio's io_uring engine on a plain file there, O_DIRECT; MiB/s, medians; \
                 adaptive/disk: median of the same-round ratios):"
            );
            let _ = writeln!(
                s,
                "{:<28} {:>8} {:>8} {:>8} {:>8}  adaptive/disk (lowest-highest)",
                "  cell", "disk", "classic", "inline", "adaptive"
            );
        }
        let label = super::verdict::cell_label(Cipher::AesXts, a);
        let _ = writeln!(
            s,
            "{:<28} {:>8} {:>8} {:>8} {:>8}  {med:.2} ({lo:.2}-{hi:.2})",
            label,
            num(disk.mib()),
            num(mode(Mode::Classic)),
            num(mode(Mode::Inline)),
            num(a.mib()),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Rw;

    fn cell(
        name: &str,
        cipher: Option<Cipher>,
        mode: Option<Mode>,
        qd: usize,
        rounds: &[f64],
    ) -> CellResult {
        crate::report::tests::sweep_cell(name, cipher, mode, Rw::RandRead, 4096, qd, rounds)
    }

    #[test]
    fn adaptive_over_disk_by_round_in_each_cell_with_a_disk() {
        let x = Some(Cipher::AesXts);
        let mut r = crate::report::tests::empty_report("default");
        r.options.rw = vec![Rw::RandRead];
        r.cells = vec![
            cell(DISK_TARGET, None, None, 32, &[200.0, 100.0, 300.0]),
            cell(
                "aes-classic",
                x,
                Some(Mode::Classic),
                32,
                &[100.0, 80.0, 120.0],
            ),
            cell(
                "aes-inline",
                x,
                Some(Mode::Inline),
                32,
                &[150.0, 60.0, 240.0],
            ),
            cell(
                "aes-adaptive",
                x,
                Some(Mode::Adaptive),
                32,
                &[150.0, 90.0, 150.0],
            ),
            cell(
                "aes-adaptive-control",
                x,
                Some(Mode::Adaptive),
                32,
                &[1.0, 1.0, 1.0],
            ),
            // No disk cell at QD1: no row.
            cell("aes-adaptive", x, Some(Mode::Adaptive), 1, &[50.0]),
        ];
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[1].ends_with("adaptive/disk (lowest-highest)"), "{t}");
        // Rounds 0.75, 0.90, 0.50: median 0.75. Medians: disk 200,
        // classic 100, inline 150, adaptive 150 (the control is not a mode).
        let f: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(f[..5], ["aes", "randread", "4k", "QD32", "j1"], "{t}");
        assert_eq!(
            f[5..],
            ["200", "100", "150", "150", "0.75", "(0.50-0.90)"],
            "{t}"
        );
        r.cells.retain(|c| c.target != DISK_TARGET);
        assert_eq!(table(&r), "");
    }
}
