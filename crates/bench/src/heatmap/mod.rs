//! Heatmaps like Damien Le Moal's pictures in the seeds: % throughput of
//! one mode relative to a baseline (classic dm-crypt, or the raw ramdisk)
//! over block size (rows) × jobs and queue depth (columns), one panel per
//! mode and direction, a number printed in every cell.
//!
//! This module is the model: which figures a report supports, their
//! panels and values (`None` where nothing was measured) and the colour
//! scale. [`render`] lays a figure out and draws it with `plotters` as SVG
//! and PNG, text in DejaVu Sans (embedded, no system fonts needed).
//!
//! ```text
//!   Report ─ build() ─► Heatmap { panels, scale } ─ render::svg() / render::png()
//! ```

pub mod render;

use crate::driver::Rw;
use crate::record::{CellResult, Phase, Report};
use crate::target::{Cipher, Mode};
use crate::Error;

/// One panel: a grid of percentages.
#[derive(Debug, Clone)]
pub struct Panel {
    /// e.g. `aes inline vs classic: read`.
    pub title: String,
    /// Row labels (block sizes), top to bottom.
    pub rows: Vec<u32>,
    /// Column keys (jobs, QD), left to right, grouped by jobs.
    pub cols: Vec<(usize, usize)>,
    /// `values[row][col]` in percent.
    pub values: Vec<Vec<Option<f64>>>,
}

/// A figure: several panels and one colour scale.
#[derive(Debug, Clone)]
pub struct Heatmap {
    /// File name without extension.
    pub file_stem: String,
    /// Figure title.
    pub title: String,
    /// Subtitle (machine, run).
    pub subtitle: String,
    /// Panels, laid out two per row.
    pub panels: Vec<Panel>,
    /// Colour scale.
    pub scale: Scale,
}

/// Builds every heatmap the report's sweep supports: for each cipher with
/// a classic target, `heatmap-<cipher>-vs-classic` (inline, adaptive …
/// relative to classic) and `heatmap-<cipher>-vs-raw` (classic, inline,
/// adaptive … relative to the raw ramdisk).
pub fn build(report: &Report) -> Vec<Heatmap> {
    let sweep: Vec<&CellResult> = report
        .cells
        .iter()
        .filter(|c| c.phase == Phase::Sweep)
        .collect();
    let mut out = Vec::new();
    let subtitle = format!(
        "{} | {} | median of {} x {} ms | {}",
        report.via,
        report.machine.describe(),
        report.options.sweep_reps,
        report.options.sweep_runtime_ms,
        report.started
    );
    for cipher in [Cipher::Null, Cipher::AesXts] {
        let modes: Vec<Mode> = Mode::ALL
            .into_iter()
            .filter(|m| {
                sweep
                    .iter()
                    .any(|c| c.cipher == Some(cipher) && c.mode == Some(*m) && c.mib().is_some())
            })
            .collect();
        if modes.is_empty() {
            continue;
        }
        let rws: Vec<Rw> = report.options.rw.clone();
        let others: Vec<Mode> = modes
            .iter()
            .copied()
            .filter(|m| *m != Mode::Classic)
            .collect();
        let name = match cipher {
            Cipher::Null => "cipher_null",
            Cipher::AesXts => "aes-xts-plain64",
        };
        if modes.contains(&Mode::Classic) && !others.is_empty() {
            let panels = panels(&sweep, cipher, &others, &rws, "classic", |c| c.pct_classic);
            out.push(Heatmap {
                file_stem: format!("heatmap-{}-vs-classic", cipher.short()),
                title: format!("{name}: % of classic dm-crypt throughput"),
                subtitle: subtitle.clone(),
                panels,
                scale: Scale::VS_CLASSIC,
            });
        }
        if sweep.iter().any(|c| c.target == "raw") {
            let panels = panels(&sweep, cipher, &modes, &rws, "raw", |c| c.pct_raw);
            out.push(Heatmap {
                file_stem: format!("heatmap-{}-vs-raw", cipher.short()),
                title: format!("{name}: % of raw ramdisk throughput"),
                subtitle: subtitle.clone(),
                panels,
                scale: Scale::VS_RAW,
            });
        }
    }
    out
}

fn panels(
    sweep: &[&CellResult],
    cipher: Cipher,
    modes: &[Mode],
    rws: &[Rw],
    base: &str,
    value: fn(&CellResult) -> Option<f64>,
) -> Vec<Panel> {
    let mut rows: Vec<u32> = sweep.iter().map(|c| c.bs).collect();
    rows.sort_unstable();
    rows.dedup();
    let mut cols: Vec<(usize, usize)> = sweep.iter().map(|c| (c.jobs, c.qd)).collect();
    cols.sort_unstable();
    cols.dedup();
    let mut out = Vec::new();
    for &m in modes {
        for &rw in rws {
            let values = rows
                .iter()
                .map(|&bs| {
                    cols.iter()
                        .map(|&(jobs, qd)| {
                            sweep
                                .iter()
                                .find(|c| {
                                    c.cipher == Some(cipher)
                                        && c.mode == Some(m)
                                        && c.rw == rw
                                        && c.bs == bs
                                        && c.jobs == jobs
                                        && c.qd == qd
                                })
                                .and_then(|c| value(c))
                        })
                        .collect()
                })
                .collect();
            out.push(Panel {
                title: format!("{} vs {base}: {}", m.name(), rw.name()),
                rows: rows.clone(),
                cols: cols.clone(),
                values,
            });
        }
    }
    out
}

impl Heatmap {
    /// The SVG document.
    pub fn svg(&self) -> Result<String, Error> {
        render::svg(self)
    }

    /// The PNG file bytes.
    pub fn png(&self) -> Result<Vec<u8>, Error> {
        render::png(self)
    }
}

/// RGB colour.
pub type Rgb = [u8; 3];

pub(crate) const WHITE: Rgb = [255, 255, 255];
pub(crate) const BLACK: Rgb = [0, 0, 0];
pub(crate) const GREY: Rgb = [200, 200, 200];
pub(crate) const DARK: Rgb = [60, 60, 60];
pub(crate) const WORSE: Rgb = [202, 0, 32];
pub(crate) const BETTER: Rgb = [5, 113, 176];

/// The colour scale of a figure: log scale, white at 100 %, full red at
/// `lo` % and below, full blue at `hi` % and above.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    /// Percentage drawn full red (and everything below it).
    pub lo: f64,
    /// Percentage drawn full blue (and everything above it).
    pub hi: f64,
}

impl Scale {
    /// Mode vs classic: a quarter to four times (Le Moal's range of gains
    /// and losses).
    pub const VS_CLASSIC: Scale = Scale {
        lo: 25.0,
        hi: 400.0,
    };
    /// Mode vs raw: encryption costs down to a tenth of raw; above raw is
    /// noise, so the blue side is short.
    pub const VS_RAW: Scale = Scale {
        lo: 10.0,
        hi: 200.0,
    };

    /// Position in -1..=1 (0 = 100 %): each side is linear in log(pct).
    pub fn position(&self, pct: f64) -> f64 {
        let l = (pct.max(1e-9) / 100.0).ln();
        if l < 0.0 {
            -(l / (self.lo / 100.0).ln()).min(1.0)
        } else {
            (l / (self.hi / 100.0).ln()).min(1.0)
        }
    }

    /// The percentage at position `t` in -1..=1.
    pub fn at(&self, t: f64) -> f64 {
        let end = if t < 0.0 { self.lo } else { self.hi };
        100.0 * (end / 100.0).powf(t.abs())
    }

    /// The colour of a percentage.
    pub fn colour(&self, pct: f64) -> Rgb {
        let t = self.position(pct);
        let (to, t) = if t < 0.0 { (WORSE, -t) } else { (BETTER, t) };
        let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * t).round() as u8;
        [
            mix(WHITE[0], to[0]),
            mix(WHITE[1], to[1]),
            mix(WHITE[2], to[2]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_scale_is_diverging_and_clamped() {
        let sc = Scale {
            lo: 50.0,
            hi: 200.0,
        };
        assert_eq!(sc.colour(100.0), WHITE);
        assert_eq!(sc.colour(50.0), WORSE);
        assert_eq!(sc.colour(10.0), WORSE);
        assert_eq!(sc.colour(200.0), BETTER);
        assert_eq!(sc.colour(1000.0), BETTER);
        let mid = sc.colour(141.42);
        assert!(mid[0] < 255 && mid[0] > BETTER[0]);
        let raw = Scale::VS_RAW;
        assert!((raw.position(10.0) + 1.0).abs() < 1e-12);
        assert!((raw.position(200.0) - 1.0).abs() < 1e-12);
        assert!(
            (raw.at(-0.5) - 31.62).abs() < 0.01,
            "geometric middle of 10 and 100"
        );
        assert!((raw.position(raw.at(0.3)) - 0.3).abs() < 1e-9);
        assert_ne!(
            raw.colour(20.0),
            raw.colour(40.0),
            "no saturation inside the range"
        );
    }
}
