//! The dm-crypt flag advisor's decision: one `cryptsetup refresh` line per
//! volume, for the workload the user describes.
//!
//! ```text
//!   Workload (preset db | vm | backup | seeds, or an fio job file)
//!     │ cells: fio jobs
//!     ▼
//!   rounds[r][mapping][cell] = bytes/s     (dmcrypt::run measures them,
//!     │   mapping 0 = current flags,        interleaved, order rotated
//!     │   mapping 1 = control (same again), per round)
//!     │   mapping 2.. = candidate flag sets
//!     ▼
//!   decide: per round, the geometric mean over cells of candidate/current;
//!     gain = the median of those; band = the control's worst round
//!     ▼
//!   gain > band ? "cryptsetup refresh --perf-… NAME" : "keep current flags"
//! ```
//!
//! Everything here is pure (no IO, no clock), so the decision is tested with
//! synthetic measurements.

use std::fmt::Write as _;

use crypto::perf::Flag;

use crate::error::OptionsError;
use crate::Error;

mod workload;

pub use workload::{job_file_for, AdvisorWorkload, CellSpec, Preset, DEFAULT_PRESET, PRESETS};

/// The two dm-crypt flags the seeds measure; the candidates are their four
/// combinations.
pub const WORKQUEUE_FLAGS: [&str; 2] = [
    Flag::NoReadWorkqueue.table_word(),
    Flag::NoWriteWorkqueue.table_word(),
];

/// A mapping's activation flags, split into the ones the advisor decides
/// and the rest, which every candidate keeps; and, for a candidate that
/// changes them, dm-crypt's `max_read_size`/`max_write_size` module
/// parameters (Linux 6.11: one value per host, not a table flag).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `no_read_workqueue`.
    pub no_read_wq: bool,
    /// `no_write_workqueue`.
    pub no_write_wq: bool,
    /// `high_priority` (dm-crypt 1.26, Linux 6.10).
    pub high_priority: bool,
    /// Other table options (allow_discards, sector_size:4096, …), in order.
    pub kept: Vec<String>,
    /// `max_read_size`, `max_write_size` in bytes, when this candidate sets
    /// the module parameters (None: as they are).
    pub module: Option<(u32, u32)>,
}

/// The dm-crypt version with `high_priority` (Linux 6.10).
pub const HIGH_PRIORITY_SINCE: (u32, u32, u32) = (1, 26, 0);

/// The cryptsetup whose `refresh` takes `--perf-high_priority` (2.7).
pub const HIGH_PRIORITY_CRYPTSETUP: (u32, u32, u32) = (2, 7, 0);

/// Where dm-crypt's module parameters live (Linux 6.11 has
/// `max_read_size` and `max_write_size` there).
pub const MODULE_PARAMETERS: &str = "/sys/module/dm_crypt/parameters";

impl Flags {
    /// The flags the advisor decides, in the order a line gets them.
    fn decided(&self) -> [(bool, Flag); 3] {
        [
            (self.no_read_wq, Flag::NoReadWorkqueue),
            (self.no_write_wq, Flag::NoWriteWorkqueue),
            (self.high_priority, Flag::HighPriority),
        ]
    }

    /// Parses the optional parameters of a dm-crypt table line.
    pub fn parse(words: &[&str]) -> Self {
        let mut f = Flags::default();
        for w in words {
            match Flag::from_table_word(w) {
                Some(Flag::NoReadWorkqueue) => f.no_read_wq = true,
                Some(Flag::NoWriteWorkqueue) => f.no_write_wq = true,
                Some(Flag::HighPriority) => f.high_priority = true,
                _ => f.kept.push(w.to_string()),
            }
        }
        f
    }

    /// The name of the decided part: none, no_read_workqueue,
    /// no_write_workqueue or both, `+high_priority`, and the module
    /// parameters a candidate sets.
    pub fn name(&self) -> String {
        let mut s = match (self.no_read_wq, self.no_write_wq) {
            (false, false) => "none",
            (true, false) => Flag::NoReadWorkqueue.table_word(),
            (false, true) => Flag::NoWriteWorkqueue.table_word(),
            (true, true) => "both",
        }
        .to_string();
        if self.high_priority {
            s.push_str("+high_priority");
        }
        if let Some((r, w)) = self.module {
            let _ = write!(s, ", max_read_size={r} max_write_size={w}");
        }
        s
    }

    /// Every combination of the workqueue flags (and `high_priority` when
    /// `high` says the kernel has it) with `self`'s other flags; the
    /// current one first.
    pub fn combinations(&self, high: bool) -> Vec<Flags> {
        let mut v = vec![self.clone()];
        let highs: &[bool] = if high { &[false, true] } else { &[false] };
        for &h in highs {
            for (r, w) in [(false, false), (true, false), (false, true), (true, true)] {
                if (r, w, h) != (self.no_read_wq, self.no_write_wq, self.high_priority) {
                    v.push(Flags {
                        no_read_wq: r,
                        no_write_wq: w,
                        high_priority: h,
                        kept: self.kept.clone(),
                        module: None,
                    });
                }
            }
        }
        v
    }

    /// The module-parameter candidates for a kernel whose parameters are
    /// `now` (`max_read_size`, `max_write_size`): `self` with 1 MiB pieces
    /// (a 1M request is not cut) and with the kernel's default 128 KiB,
    /// each unless that is what is set now.
    pub fn module_candidates(&self, now: (u32, u32)) -> Vec<Flags> {
        [(1 << 20, 1 << 20), (128 << 10, 128 << 10)]
            .into_iter()
            .filter(|&m| m != now && !(now == (0, 0) && m == (128 << 10, 128 << 10)))
            .map(|m| Flags {
                module: Some(m),
                ..self.clone()
            })
            .collect()
    }

    /// The table's optional parameters (`2 allow_discards no_read_workqueue`),
    /// empty when there are none.
    pub fn table_words(&self) -> String {
        let mut w: Vec<&str> = self.kept.iter().map(String::as_str).collect();
        for (on, f) in self.decided() {
            if on {
                w.push(f.table_word());
            }
        }
        if w.is_empty() {
            String::new()
        } else {
            format!("{} {}", w.len(), w.join(" "))
        }
    }

    /// The `cryptsetup refresh` line that activates exactly these flags on
    /// `name`. refresh replaces the activation flags, so the ones kept
    /// (discards, same_cpu_crypt, submit_from_crypt_cpus) are repeated.
    /// A candidate that sets the module parameters says so first: they are
    /// written to /sys/module/dm_crypt/parameters (or set with `options
    /// dm_crypt …` in /etc/modprobe.d to last), for every dm-crypt mapping
    /// of the host; no refresh sets them.
    pub fn refresh_line(&self, name: &str) -> String {
        let mut s = String::new();
        if let Some((r, w)) = self.module {
            let _ = write!(
                s,
                "a module parameter, not a refresh (applies to every dm-crypt mapping on this host): \
                 echo {r} > {MODULE_PARAMETERS}/max_read_size; echo {w} > {MODULE_PARAMETERS}/max_write_size \
                 (to keep it: `options dm_crypt max_read_size={r} max_write_size={w}` in /etc/modprobe.d); then "
            );
        }
        s.push_str("cryptsetup refresh");
        for k in &self.kept {
            if k == "allow_discards" {
                s.push_str(" --allow-discards");
            } else if let Some(f) = Flag::from_table_word(k) {
                let _ = write!(s, " {}", f.cli_option());
            }
        }
        for (on, f) in self.decided() {
            if on {
                let _ = write!(s, " {}", f.cli_option());
            }
        }
        let _ = write!(s, " {name}");
        s
    }
}

/// What the advisor takes from the volume's live dm-crypt table: the
/// cipher, the key length (the key itself stays in the kernel) and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// Cipher spec as in the table (`aes-xts-plain64`).
    pub cipher: String,
    /// Key length in bytes (0 for a `-` key).
    pub key_len: usize,
    /// Activation flags and the other optional parameters.
    pub flags: Flags,
}

impl Current {
    /// Parses the first line of `dmsetup table NAME` (`<start> <len> crypt
    /// <cipher> <key> <iv_offset> <dev> <offset> [<#opt> <opt>…]`); the key
    /// may be hex, `-`, or a keyring reference `:<size>:<type>:<desc>`.
    pub fn parse(name: &str, table: &str) -> Result<Self, Error> {
        let bad = |reason: String| -> Error {
            OptionsError::Mapping {
                name: name.into(),
                reason,
            }
            .into()
        };
        let line = table.lines().next().unwrap_or("").trim();
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 8 || w[2] != "crypt" {
            return Err(bad(format!("not a dm-crypt table: `{line}`")));
        }
        let key_len = match w[4] {
            "-" => 0,
            k if k.starts_with(':') => k
                .split(':')
                .nth(1)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad(format!("unreadable key field `{k}`")))?,
            k => k.len() / 2,
        };
        let opts: &[&str] = match w.get(8) {
            None => &[],
            Some(n) => {
                let n: usize = n
                    .parse()
                    .map_err(|_| bad(format!("unreadable option count `{n}`")))?;
                w.get(9..9 + n)
                    .ok_or_else(|| bad(format!("{n} options announced, fewer given")))?
            }
        };
        if let Some(i) = opts.iter().find(|o| o.starts_with("integrity:")) {
            return Err(bad(format!(
                "`{i}`: authenticated mappings need dm-integrity under them; the advisor measures plain dm-crypt only"
            )));
        }
        Ok(Self {
            cipher: w[3].into(),
            key_len,
            flags: Flags::parse(opts),
        })
    }

    /// The sector size its table sets (512 when it sets none).
    pub fn sector_size(&self) -> u64 {
        self.flags
            .kept
            .iter()
            .find_map(|o| o.strip_prefix("sector_size:")?.parse().ok())
            .unwrap_or(512)
    }
}

/// Measurements: `rounds[r][m][c]` is the throughput (bytes/s) of mapping
/// `m` on cell `c` in round `r`; mapping 0 has the current flags, mapping 1
/// the same flags again (the control), mappings 2.. the candidates.
pub type Rounds = Vec<Vec<Vec<f64>>>;

/// What the measurements say.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Per candidate (mapping 2..): the median over rounds of its per-round
    /// gain over the current flags (0.12 = 12 % faster).
    pub gains: Vec<f64>,
    /// The control's gain over the current flags (same flags twice: what
    /// "no change" looks like), median over rounds.
    pub control: f64,
    /// The noise band: the largest deviation of the control from the
    /// current flags in any one round (0.03 = ±3 %).
    pub band: f64,
    /// The fastest candidate (index into `gains`), if any.
    pub best: Option<usize>,
    /// True when the fastest candidate's gain beats the band.
    pub change: bool,
}

/// Geometric mean over cells of `a[c] / b[c]` (cells where either side
/// measured nothing are left out; none left → 1).
fn ratio(a: &[f64], b: &[f64]) -> f64 {
    let logs: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0 && x.is_finite() && y.is_finite())
        .map(|(x, y)| (x / y).ln())
        .collect();
    if logs.is_empty() {
        1.0
    } else {
        (logs.iter().sum::<f64>() / logs.len() as f64).exp()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Decides from interleaved rounds (see [`Rounds`]): a candidate is
/// recommended only when its median gain over the current flags is
/// positive and larger than the noise band the control showed.
pub fn decide(rounds: &Rounds) -> Decision {
    decide_among(rounds, &|_| true)
}

/// [`decide`] choosing only among the candidates `usable` accepts (by
/// index into [`Decision::gains`]); the others keep their gains.
pub fn decide_among(rounds: &Rounds, usable: &dyn Fn(usize) -> bool) -> Decision {
    let mappings = rounds.first().map_or(0, Vec::len);
    let gain_of = |m: usize| median(rounds.iter().map(|r| ratio(&r[m], &r[0]) - 1.0).collect());
    let control = if mappings > 1 { gain_of(1) } else { 0.0 };
    let band = if mappings > 1 {
        rounds
            .iter()
            .map(|r| (ratio(&r[1], &r[0]) - 1.0).abs())
            .fold(0.0, f64::max)
    } else {
        0.0
    };
    let gains: Vec<f64> = (2..mappings).map(gain_of).collect();
    let best = gains
        .iter()
        .enumerate()
        .filter(|(i, _)| usable(*i))
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i);
    let change = best.is_some_and(|i| gains[i] > 0.0 && gains[i] > band);
    Decision {
        gains,
        control,
        band,
        best,
        change,
    }
}

/// Median throughput per mapping and cell, in MiB/s.
pub fn medians(rounds: &Rounds) -> Vec<Vec<f64>> {
    let mappings = rounds.first().map_or(0, Vec::len);
    (0..mappings)
        .map(|m| {
            let cells = rounds[0][m].len();
            (0..cells)
                .map(|c| crate::stats::mib_per_s(median(rounds.iter().map(|r| r[m][c]).collect())))
                .collect()
        })
        .collect()
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// The advisor's report: the median table, each candidate's gain, the
/// noise band, and the answer. `flags[0]` is the current set, `flags[1..]`
/// the candidates in the order of `rounds`' mappings 2.. The answer's
/// lines start with `recommendation:` and, when the answer is to keep the
/// current flags, `fastest candidate:` (both end in a `cryptsetup refresh`
/// command for `name`).
pub fn render(
    header: &str,
    labels: &[String],
    flags: &[Flags],
    rounds: &Rounds,
    name: &str,
) -> String {
    render_for(header, labels, flags, rounds, name, &|_| true)
}

/// [`render`] for a host whose tools can apply only the candidates
/// `applies` accepts (`high_priority` needs cryptsetup 2.7's
/// `--perf-high_priority`): the others are measured and shown, and a
/// faster one is named on a `not applicable here:` line, but the
/// recommendation is made among what the host can apply.
pub fn render_for(
    header: &str,
    labels: &[String],
    flags: &[Flags],
    rounds: &Rounds,
    name: &str,
    applies: &dyn Fn(&Flags) -> bool,
) -> String {
    let usable = |i: usize| flags.get(i + 1).is_some_and(applies);
    let d = decide_among(rounds, &usable);
    let all = decide(rounds);
    let med = medians(rounds);
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    let _ = writeln!(
        s,
        "throughput in MiB/s, median of {} interleaved round(s):",
        rounds.len()
    );
    let w = labels.iter().map(String::len).max().unwrap_or(0).max(9);
    let _ = write!(s, "{:<32}", "flags");
    for l in labels {
        let _ = write!(s, " {l:>w$}");
    }
    let _ = writeln!(s, " {:>8}", "gain");
    let row_name = |m: usize| match m {
        0 => format!("{} (current)", flags[0].name()),
        1 => format!("{} (control: current again)", flags[0].name()),
        m => flags.get(m - 1).map_or("?".to_string(), Flags::name),
    };
    for (m, row) in med.iter().enumerate() {
        let _ = write!(s, "{:<32}", row_name(m));
        for v in row {
            let _ = write!(s, " {v:>w$.1}");
        }
        let g = match m {
            0 => String::new(),
            1 => pct(d.control),
            m => d.gains.get(m - 2).map_or(String::new(), |g| pct(*g)),
        };
        let _ = writeln!(s, " {g:>8}");
    }
    let _ = writeln!(
        s,
        "noise band: ±{:.1}% (the control's largest deviation from the current flags in one round)",
        d.band * 100.0
    );
    if let Some(i) = all.best.filter(|&i| !usable(i) && all.gains[i] > 0.0) {
        if d.best.is_none_or(|b| all.gains[i] > d.gains[b]) {
            let _ = writeln!(
                s,
                "not applicable here: {} gains {}, but this host's cryptsetup cannot set high_priority (refresh --perf-high_priority needs cryptsetup 2.7)",
                flags[i + 1].name(),
                pct(all.gains[i])
            );
        }
    }
    let current = &flags[0];
    match d.best {
        Some(i) if d.change => {
            let f = &flags[i + 1];
            let _ = writeln!(
                s,
                "expected gain: {} over the current flags ({}), beyond the noise band ±{:.1}%",
                pct(d.gains[i]),
                current.name(),
                d.band * 100.0
            );
            let _ = writeln!(s, "recommendation: {}", f.refresh_line(name));
        }
        Some(i) => {
            let f = &flags[i + 1];
            let _ = writeln!(
                s,
                "expected gain: none beyond noise: the fastest candidate ({}) gains {}, inside the band ±{:.1}%",
                f.name(),
                pct(d.gains[i]),
                d.band * 100.0
            );
            let _ = writeln!(
                s,
                "recommendation: keep current flags ({}): {}",
                current.name(),
                current.refresh_line(name)
            );
            let _ = writeln!(s, "fastest candidate: {}", f.refresh_line(name));
        }
        None => {
            let _ = writeln!(
                s,
                "recommendation: keep current flags ({}): no candidate measured",
                current.name()
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds for a current set, its control and three candidates, with
    /// per-mapping factors on a base of 100 per cell, and a per-round wobble
    /// of the control.
    fn rounds(factors: [f64; 5], wobble: &[f64], cells: usize) -> Rounds {
        wobble
            .iter()
            .map(|w| {
                (0..5)
                    .map(|m| {
                        let f = if m == 1 { factors[1] * w } else { factors[m] };
                        vec![100.0 * f; cells]
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_gain_beyond_the_band_is_recommended() {
        // Candidate 2 (mapping 4) is 20 % faster; the control wobbles ±3 %.
        let r = rounds([1.0, 1.0, 1.05, 1.1, 1.2], &[1.03, 0.98, 1.01], 2);
        let d = decide(&r);
        assert!((d.band - 0.03).abs() < 1e-9, "{d:?}");
        assert_eq!(d.best, Some(2), "{d:?}");
        assert!((d.gains[2] - 0.2).abs() < 1e-9, "{d:?}");
        assert!(d.change);
        let flags = Flags::default().combinations(false);
        let text = render("h", &["a".into(), "b".into()], &flags, &r, "vol");
        assert!(
            text.contains(
                "recommendation: cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue vol"
            ),
            "{text}"
        );
        assert!(text.contains("expected gain: +20.0%"), "{text}");
        assert!(text.contains("noise band: ±3.0%"), "{text}");
    }

    #[test]
    fn high_priority_doubles_the_candidates_where_the_kernel_has_it() {
        let cur = Flags::parse(&["allow_discards", "high_priority"]);
        assert!(cur.high_priority);
        assert_eq!(cur.name(), "none+high_priority");
        assert_eq!(cur.table_words(), "2 allow_discards high_priority");
        assert_eq!(
            cur.refresh_line("v"),
            "cryptsetup refresh --allow-discards --perf-high_priority v"
        );
        let all = cur.combinations(true);
        assert_eq!(all.len(), 8);
        assert_eq!(all[0], cur);
        for (i, a) in all.iter().enumerate() {
            assert_eq!(a.kept, vec!["allow_discards".to_string()]);
            assert!(all[i + 1..].iter().all(|b| b != a), "{a:?} twice");
        }
        assert_eq!(Flags::default().combinations(false).len(), 4);
        assert!(Flags::default()
            .combinations(false)
            .iter()
            .all(|f| !f.high_priority));
    }

    #[test]
    fn a_candidate_the_hosts_cryptsetup_cannot_set_is_shown_not_recommended() {
        // Current no_write_workqueue, control, then none, none+high_priority,
        // both: high_priority is fastest, but cryptsetup 2.6 cannot set it.
        let flags = vec![
            Flags::parse(&["no_write_workqueue"]),
            Flags::parse(&[]),
            Flags::parse(&["high_priority"]),
            Flags::parse(&["no_read_workqueue", "no_write_workqueue"]),
        ];
        let r = rounds([1.0, 1.0, 0.9, 1.5, 1.2], &[1.0, 1.01], 2);
        let can = |f: &Flags| !f.high_priority;
        let text = render_for("h", &["a".into(), "b".into()], &flags, &r, "vol", &can);
        assert!(
            text.contains("not applicable here: none+high_priority gains +50.0%"),
            "{text}"
        );
        assert!(
            text.contains(
                "recommendation: cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue vol"
            ),
            "{text}"
        );
        // Where it can be set, it is the answer and no note is printed.
        let text = render("h", &["a".into(), "b".into()], &flags, &r, "vol");
        assert!(
            text.contains("recommendation: cryptsetup refresh --perf-high_priority vol"),
            "{text}"
        );
        assert!(!text.contains("not applicable here"), "{text}");
    }

    #[test]
    fn module_parameters_are_candidates_and_say_they_are_not_a_refresh() {
        let cur = Flags::default();
        let names = |now| -> Vec<Option<(u32, u32)>> {
            cur.module_candidates(now)
                .iter()
                .map(|f| f.module)
                .collect()
        };
        assert_eq!(names((0, 0)), vec![Some((1 << 20, 1 << 20))]);
        assert_eq!(names((131072, 131072)), vec![Some((1 << 20, 1 << 20))]);
        assert_eq!(names((1 << 20, 1 << 20)), vec![Some((131072, 131072))]);
        assert_eq!(names((65536, 65536)).len(), 2);
        // Mapping 4 (the module candidate after two flag candidates) wins.
        let r = rounds([1.0, 1.0, 1.01, 1.02, 1.3], &[1.01, 0.99], 1);
        let mut flags = vec![cur.clone(), cur.combinations(false)[1].clone()];
        flags.push(cur.combinations(false)[2].clone());
        flags.extend(cur.module_candidates((0, 0)));
        let text = render("h", &["a".into()], &flags, &r, "vol");
        assert!(
            text.contains("none, max_read_size=1048576 max_write_size=1048576"),
            "{text}"
        );
        assert!(
            text.contains(
                "recommendation: a module parameter, not a refresh (applies to every dm-crypt mapping on this host): \
                 echo 1048576 > /sys/module/dm_crypt/parameters/max_read_size; \
                 echo 1048576 > /sys/module/dm_crypt/parameters/max_write_size"
            ),
            "{text}"
        );
        assert!(text.contains("options dm_crypt max_read_size=1048576 max_write_size=1048576"));
        assert!(text.ends_with("then cryptsetup refresh vol\n"), "{text}");
    }

    #[test]
    fn a_gain_inside_the_band_keeps_the_current_flags() {
        // The best candidate gains 4 %, the control once strays 6 %.
        let r = rounds([1.0, 1.0, 1.04, 1.01, 0.9], &[1.0, 1.06, 0.99], 3);
        let d = decide(&r);
        assert_eq!(d.best, Some(0));
        assert!((d.gains[0] - 0.04).abs() < 1e-9);
        assert!((d.band - 0.06).abs() < 1e-9);
        assert!(!d.change);
        let current = Flags::parse(&["no_write_workqueue"]);
        let flags = current.combinations(false);
        let text = render("h", &["a".into()], &flags, &r, "vol");
        assert!(
            text.contains(
                "recommendation: keep current flags (no_write_workqueue): cryptsetup refresh --perf-no_write_workqueue vol"
            ),
            "{text}"
        );
        // The candidates in order: none, no_read_workqueue, both.
        assert!(
            text.contains("fastest candidate: cryptsetup refresh vol"),
            "{text}"
        );
    }

    #[test]
    fn every_candidate_slower_keeps_the_current_flags() {
        let r = rounds([1.0, 1.0, 0.5, 0.8, 0.9], &[1.0], 1);
        let d = decide(&r);
        assert_eq!(d.band, 0.0);
        assert_eq!(d.best, Some(2));
        assert!(!d.change, "a loss never beats a zero band");
    }

    #[test]
    fn the_gain_is_the_geometric_mean_over_cells_and_median_over_rounds() {
        // One cell twice as fast, one half as fast: no gain overall.
        let round = vec![
            vec![100.0, 100.0],
            vec![100.0, 100.0],
            vec![200.0, 50.0],
            vec![100.0, 100.0],
            vec![100.0, 100.0],
        ];
        let d = decide(&vec![round]);
        assert!(d.gains[0].abs() < 1e-12, "{d:?}");
        // Medians over rounds: an outlier round does not carry the gain.
        let mk = |g: f64| {
            vec![
                vec![100.0],
                vec![100.0],
                vec![100.0 * g],
                vec![100.0],
                vec![100.0],
            ]
        };
        let d = decide(&vec![mk(1.1), mk(3.0), mk(1.1)]);
        assert!((d.gains[0] - 0.1).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn flags_keep_what_refresh_would_drop() {
        let f = Flags::parse(&["allow_discards", "sector_size:4096", "no_read_workqueue"]);
        assert_eq!(f.name(), "no_read_workqueue");
        let all = f.combinations(false);
        assert_eq!(
            all.iter().map(Flags::name).collect::<Vec<_>>(),
            ["no_read_workqueue", "none", "no_write_workqueue", "both"]
        );
        assert_eq!(
            all[3].table_words(),
            "4 allow_discards sector_size:4096 no_read_workqueue no_write_workqueue"
        );
        assert_eq!(
            all[3].refresh_line("v"),
            "cryptsetup refresh --allow-discards --perf-no_read_workqueue --perf-no_write_workqueue v"
        );
        assert_eq!(Flags::default().table_words(), "");
        assert_eq!(Flags::default().refresh_line("v"), "cryptsetup refresh v");
    }

    #[test]
    fn current_flags_come_from_the_live_table() {
        let c = Current::parse(
            "v",
            "0 65536 crypt aes-xts-plain64 :64:logon:cryptsetup:abc-d0 0 7:0 4096 3 allow_discards sector_size:4096 no_write_workqueue\n",
        )
        .unwrap();
        assert_eq!(c.cipher, "aes-xts-plain64");
        assert_eq!(c.key_len, 64);
        assert_eq!(c.sector_size(), 4096);
        assert_eq!(c.flags.name(), "no_write_workqueue");
        assert_eq!(c.flags.kept, ["allow_discards", "sector_size:4096"]);
        let plain = Current::parse("v", "0 8 crypt capi:ecb(cipher_null) - 0 1:0 0").unwrap();
        assert_eq!((plain.key_len, plain.sector_size()), (0, 512));
        assert_eq!(plain.flags, Flags::default());
        let hex = Current::parse(
            "v",
            &format!("0 8 crypt aes-cbc-essiv:sha256 {} 0 1:0 0", "ab".repeat(32)),
        )
        .unwrap();
        assert_eq!(hex.key_len, 32);
        for bad in [
            "0 8 linear 1:0 0",
            "0 8 crypt aes-xts-plain64 - 0 1:0 0 2 allow_discards",
            "0 8 crypt aes-gcm-random - 0 1:0 0 1 integrity:28:aead",
            "",
        ] {
            let e = Current::parse("v", bad).unwrap_err();
            assert!(e.is_usage(), "{bad}: {e}");
            assert!(
                e.to_string().starts_with("Cannot advise on mapping v: "),
                "{e}"
            );
        }
    }

    #[test]
    fn presets_and_job_files() {
        let AdvisorWorkload::Preset(db) = AdvisorWorkload::preset("db").unwrap() else {
            panic!()
        };
        assert_eq!(
            db.cells.iter().map(CellSpec::label).collect::<Vec<_>>(),
            ["4k randrw70 QD1", "4k randrw70 QD8"]
        );
        assert!(db.cells[1]
            .fio_args()
            .contains(&"--rwmixread=70".to_string()));
        assert_eq!(
            AdvisorWorkload::new(None, None).unwrap().labels().len(),
            6,
            "seeds by default"
        );
        let e = AdvisorWorkload::new(None, Some(std::path::Path::new("/nonexistent/x.fio")))
            .unwrap_err();
        assert!(
            e.is_usage() && e.to_string().contains("/nonexistent/x.fio"),
            "{e}"
        );
        let e = AdvisorWorkload::preset("nosuch").unwrap_err();
        assert!(e.is_usage());
        assert!(e.to_string().contains("db, vm, backup, seeds"), "{e}");
        let text =
            "[global]\nfilename=/dev/sda\nRuntime = 60\nbs=8k\n[j]\nrw=randread\ntime_based\n";
        let j = job_file_for(text, "/dev/mapper/x", 1 << 20, 250, 10);
        assert!(j.starts_with("[global]\nfilename=/dev/mapper/x\n"), "{j}");
        assert!(!j.contains("/dev/sda") && !j.contains("= 60"), "{j}");
        assert_eq!(j.matches("time_based").count(), 1, "{j}");
        assert!(j.contains("bs=8k\n[j]\nrw=randread\n"), "{j}");
    }
}
