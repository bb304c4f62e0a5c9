//! Same-round ratios of the headline: each ucrypt target against each
//! encrypted peer and against the bound, round by round.
//!
//! On a shared machine a whole round can be slow; the runner runs every
//! target once per round, so the ratio of two targets within one round
//! cancels what that round did to both. The table gives the median of the
//! per-round ratios with the lowest and highest round:
//!
//! ```text
//!   cell                 ucrypt target        vs            median  (lowest-highest)
//!   4k randread QD1      ucrypt-aes-adaptive  qsd-luks2      1.30x  (1.29-1.37)
//!   4k randread QD1      ucrypt-aes-adaptive  bound          1.21   (1.19-1.26)
//! ```

use std::fmt::Write as _;

use super::{fmt_bs, CellResult, Phase, Report};
use crate::stats;

/// Per-round ratios `a[i] / b[i]` over the rounds where both moved data.
pub fn per_round(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0)
        .map(|(x, y)| x / y)
        .collect()
}

/// `median (lowest-highest)` of `v`, or None when empty.
fn summary(v: &[f64], suffix: &str) -> Option<String> {
    let med = stats::median(v)?;
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(format!("{med:.2}{suffix} ({lo:.2}-{hi:.2})"))
}

/// The table (empty when the headline has no ucrypt target beside an
/// encrypted peer or a bound).
pub fn table(report: &Report) -> String {
    let head: Vec<&CellResult> = report
        .cells
        .iter()
        .filter(|c| c.phase == Phase::Headline)
        .collect();
    let mut s = String::new();
    // --via file: every engine row against fio (`raw`) and each io_uring
    // row against its pread/pwrite twin, besides the bound.
    let file = report.via == "file";
    let width = head
        .iter()
        .map(|c| c.target.len())
        .max()
        .unwrap_or(0)
        .max(24);
    for u in head
        .iter()
        .filter(|c| c.target.starts_with("ucrypt-") && (c.cipher.is_some() || file))
    {
        let same: Vec<&&CellResult> = head.iter().filter(|o| o.same_workload(u)).collect();
        let mut rows: Vec<(String, String)> = Vec::new();
        if file {
            let fio = same.iter().find(|o| o.target == "raw");
            if let Some(r) =
                fio.and_then(|f| summary(&per_round(&u.rounds_mib_s, &f.rounds_mib_s), "x"))
            {
                rows.push(("fio (raw)".into(), r));
            }
            let twin = u
                .target
                .strip_suffix("-uring")
                .map(|stem| format!("{stem}-syscalls"));
            let twin = twin.and_then(|t| same.iter().find(|o| o.target == t));
            if let Some(r) =
                twin.and_then(|t| summary(&per_round(&u.rounds_mib_s, &t.rounds_mib_s), "x"))
            {
                rows.push(("syscalls".into(), r));
            }
        }
        // Peers: encrypted, not ucrypt's (they have no mode).
        for p in same
            .iter()
            .filter(|p| p.cipher.is_some() && p.mode.is_none())
        {
            if let Some(r) = summary(&per_round(&u.rounds_mib_s, &p.rounds_mib_s), "x") {
                rows.push((p.target.clone(), r));
            }
        }
        // The bound of each round: that round's io (disk under --dir,
        // else raw) with this run's c.
        let io_name = super::io_target(&report.cells);
        let raw = same.iter().find(|o| o.target == io_name);
        let c = u.cipher.and_then(|cipher| {
            report
                .crypto
                .iter()
                .find(|s| s.cipher == cipher.spec() && s.bs == u.bs)
                .map(|s| {
                    if u.rw.is_write() {
                        s.encrypt_mib_s
                    } else {
                        s.decrypt_mib_s
                    }
                })
        });
        if let (Some(raw), Some(c)) = (raw, c) {
            let bounds: Vec<f64> = raw
                .rounds_mib_s
                .iter()
                .map(|&io| if io > 0.0 { stats::bound(io, c) } else { 0.0 })
                .collect();
            if let Some(r) = summary(&per_round(&u.rounds_mib_s, &bounds), "") {
                rows.push(("bound".into(), r));
            }
        }
        for (vs, r) in rows {
            if s.is_empty() {
                let _ = writeln!(
                    s,
                    "same-round ratios (median of the per-round ratios, lowest-highest round):"
                );
            }
            let cell = format!("{} {} QD{}", fmt_bs(u.bs), u.rw.name(), u.qd);
            let _ = writeln!(s, "  {cell:<20} {:<width$} / {vs:<14} {r}", u.target);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Rw, Workload};
    use crate::record::{Rep, RunTarget};
    use crate::target::{Cipher, Mode};
    use crate::CryptoSpeed;

    fn cell(name: &str, cipher: Option<Cipher>, mode: Option<Mode>, mib: &[f64]) -> CellResult {
        let w = Workload {
            rw: Rw::RandRead,
            bs: 4096,
            qd: 1,
            jobs: 1,
            runtime: std::time::Duration::from_millis(100),
        };
        let t = RunTarget {
            name: name.into(),
            cipher,
            mode,
            headline: true,
            swept: false,
        };
        let reps = mib
            .iter()
            .map(|&m| Rep {
                ops: (m > 0.0) as u64,
                bytes_per_s: m * stats::MIB,
                iops: 1.0,
                ..Rep::default()
            })
            .collect();
        CellResult::from_reps(Phase::Headline, &t, &w, reps)
    }

    #[test]
    fn each_ucrypt_target_over_each_peer_and_the_bound_by_round() {
        let mut r = super::super::tests::empty_report("default");
        r.cells = vec![
            cell("raw", None, None, &[100.0, 50.0, 100.0]),
            cell(
                "ucrypt-aes-adaptive",
                Some(Cipher::AesXts),
                Some(Mode::Adaptive),
                &[60.0, 30.0, 0.0],
            ),
            cell("qsd-luks2", Some(Cipher::AesXts), None, &[40.0, 10.0, 50.0]),
        ];
        // c = 100 MiB/s: the bound is 50 MiB/s in round 1 (raw 100) and
        // 33.3 in round 2 (raw 50), so ucrypt is at 1.20 and 0.90 of it.
        r.crypto = vec![CryptoSpeed {
            cipher: Cipher::AesXts.spec().into(),
            bs: 4096,
            encrypt_mib_s: 1.0,
            decrypt_mib_s: 100.0,
        }];
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        // Round 3 failed for ucrypt: no ratio from it.
        assert!(
            lines[1].ends_with("/ qsd-luks2      2.25x (1.50-3.00)"),
            "{t}"
        );
        assert!(
            lines[2].ends_with("/ bound          1.05 (0.90-1.20)"),
            "{t}"
        );
        assert!(
            lines[1].starts_with("  4k randread QD1      ucrypt-aes-adaptive"),
            "{t}"
        );
        r.cells.truncate(1);
        assert_eq!(table(&r), "", "no ucrypt target: no table");
    }

    #[test]
    fn ratios_pair_rounds_and_skip_failed_ones() {
        assert_eq!(
            per_round(&[10.0, 20.0, 0.0, 9.0], &[5.0, 10.0, 4.0, 0.0]),
            [2.0, 2.0]
        );
        assert_eq!(
            summary(&[1.5, 1.0, 2.0], "x").as_deref(),
            Some("1.50x (1.00-2.00)")
        );
        assert_eq!(summary(&[], ""), None);
    }
}
