//! Heatmaps like Damien Le Moal's pictures in the seeds: % throughput of
//! one mode relative to a baseline (classic dm-crypt, or the raw ramdisk)
//! over block size (rows) × jobs and queue depth (columns), one panel per
//! mode and direction, a number printed in every cell.
//!
//! Hand-written renderer: the layout is a small display list (rectangles
//! and text) drawn twice, as SVG text and as a PNG bitmap with the 8×8
//! `font8x8` glyphs scaled up, so no system fonts are needed and the two
//! files show the same picture.
//!
//! ```text
//!   Report ─ build() ─► Heatmap { panels } ─ layout() ─► Canvas { shapes }
//!                                                           ├─ svg()
//!                                                           └─ png()
//! ```

use std::fmt::Write as _;

use font8x8::UnicodeFonts;

use crate::driver::Rw;
use crate::report::{fmt_bs, CellResult, Phase, Report};
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

/// RGB colour.
type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GREY: Rgb = [200, 200, 200];
const DARK: Rgb = [60, 60, 60];
const WORSE: Rgb = [202, 0, 32];
const BETTER: Rgb = [5, 113, 176];

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

fn luminance(c: Rgb) -> f64 {
    0.299 * f64::from(c[0]) + 0.587 * f64::from(c[1]) + 0.114 * f64::from(c[2])
}

/// Text alignment around the x coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Anchor {
    Start,
    Middle,
}

#[derive(Debug, Clone)]
enum Shape {
    Rect {
        x: i32,
        y: i32,
        w: i32,
        h: i32,
        fill: Rgb,
        stroke: Option<Rgb>,
    },
    /// `y` is the top of the 8×`scale` glyph box.
    Text {
        x: i32,
        y: i32,
        text: String,
        scale: i32,
        anchor: Anchor,
        colour: Rgb,
    },
}

/// A laid-out picture.
#[derive(Debug, Clone)]
pub struct Canvas {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    shapes: Vec<Shape>,
}

const CELL_W: i32 = 72;
const CELL_H: i32 = 30;
const LEFT: i32 = 70;
const PANEL_GAP: i32 = 40;
const PANEL_HEAD: i32 = 78;
const MARGIN: i32 = 20;
const LEGEND_W: i32 = 500;

/// Pixel width of `t` at `scale` (8×8 glyphs).
fn text_w(t: &str, scale: i32) -> i32 {
    t.chars().count() as i32 * 8 * scale
}

impl Heatmap {
    /// Lays the figure out; every width accounts for its text.
    pub fn layout(&self) -> Canvas {
        let ncols = self
            .panels
            .iter()
            .map(|p| p.cols.len())
            .max()
            .unwrap_or(1)
            .max(1) as i32;
        let nrows = self
            .panels
            .iter()
            .map(|p| p.rows.len())
            .max()
            .unwrap_or(1)
            .max(1) as i32;
        let title_w = self
            .panels
            .iter()
            .map(|p| text_w(&p.title, 2))
            .max()
            .unwrap_or(0);
        let panel_w = (LEFT + ncols * CELL_W).max(title_w);
        let panel_h = PANEL_HEAD + nrows * CELL_H;
        let per_row: i32 = if self.panels.len() > 1 && 2 * panel_w + PANEL_GAP + 2 * MARGIN <= 2000
        {
            2
        } else {
            1
        };
        let grid_rows = (self.panels.len() as i32 + per_row - 1) / per_row;
        let axis_note = "rows: block size; columns: jobs (threads) x queue depth (QD) per job; cells: % throughput";
        let top = 96;
        let width = [
            2 * MARGIN + per_row * panel_w + (per_row - 1) * PANEL_GAP,
            2 * MARGIN + text_w(&self.title, 2),
            2 * MARGIN + text_w(&self.subtitle, 1),
            2 * MARGIN + text_w(axis_note, 1),
            2 * MARGIN + LEGEND_W + 80,
        ]
        .into_iter()
        .max()
        .unwrap_or(800);
        let legend_y = top + grid_rows * (panel_h + 28) + 4;
        let height = legend_y + 80;
        let mut s = vec![
            Shape::Rect {
                x: 0,
                y: 0,
                w: width,
                h: height,
                fill: WHITE,
                stroke: None,
            },
            text(width / 2, 14, &self.title, 2, Anchor::Middle, BLACK),
            text(width / 2, 42, &self.subtitle, 1, Anchor::Middle, DARK),
            text(width / 2, 60, axis_note, 1, Anchor::Middle, DARK),
        ];
        let row_w = per_row * panel_w + (per_row - 1) * PANEL_GAP;
        let x_start = (width - row_w) / 2;
        for (i, p) in self.panels.iter().enumerate() {
            let px = x_start + (i as i32 % per_row) * (panel_w + PANEL_GAP);
            let py = top + (i as i32 / per_row) * (panel_h + 28);
            panel_shapes(&mut s, p, px, py, &self.scale);
        }
        legend(&mut s, width / 2, legend_y, &self.scale);
        Canvas {
            width: width as u32,
            height: height as u32,
            shapes: s,
        }
    }

    /// The SVG document.
    pub fn svg(&self) -> String {
        self.layout().svg()
    }

    /// The PNG file bytes.
    pub fn png(&self) -> Result<Vec<u8>, Error> {
        self.layout().png()
    }
}

fn text(x: i32, y: i32, t: &str, scale: i32, anchor: Anchor, colour: Rgb) -> Shape {
    Shape::Text {
        x,
        y,
        text: t.to_string(),
        scale,
        anchor,
        colour,
    }
}

fn panel_shapes(s: &mut Vec<Shape>, p: &Panel, px: i32, py: i32, scale: &Scale) {
    s.push(text(px, py, &p.title, 2, Anchor::Start, BLACK));
    let gx = px + LEFT;
    let gy = py + PANEL_HEAD;
    // Column headers: jobs groups, then QD.
    let mut i = 0;
    while i < p.cols.len() {
        let jobs = p.cols[i].0;
        let n = p.cols[i..].iter().take_while(|c| c.0 == jobs).count();
        let x0 = gx + i as i32 * CELL_W;
        s.push(Shape::Rect {
            x: x0 + 2,
            y: gy - 50,
            w: n as i32 * CELL_W - 4,
            h: 18,
            fill: [235, 235, 235],
            stroke: None,
        });
        s.push(text(
            x0 + n as i32 * CELL_W / 2,
            gy - 45,
            &format!("jobs={jobs}"),
            1,
            Anchor::Middle,
            BLACK,
        ));
        i += n;
    }
    for (c, &(_, qd)) in p.cols.iter().enumerate() {
        s.push(text(
            gx + c as i32 * CELL_W + CELL_W / 2,
            gy - 24,
            &format!("QD{qd}"),
            1,
            Anchor::Middle,
            BLACK,
        ));
    }
    s.push(text(px, gy - 24, "bs \\ QD", 1, Anchor::Start, DARK));
    for (r, &bs) in p.rows.iter().enumerate() {
        let y = gy + r as i32 * CELL_H;
        let label = fmt_bs(bs);
        s.push(text(
            gx - 8 - text_w(&label, 2),
            y + CELL_H / 2 - 8,
            &label,
            2,
            Anchor::Start,
            BLACK,
        ));
        for (c, v) in p.values[r].iter().enumerate() {
            let x = gx + c as i32 * CELL_W;
            let (fill, label) = match v {
                Some(v) => (scale.colour(*v), format!("{v:.0}")),
                None => (GREY, "-".to_string()),
            };
            s.push(Shape::Rect {
                x,
                y,
                w: CELL_W,
                h: CELL_H,
                fill,
                stroke: Some(WHITE),
            });
            let ink = if luminance(fill) < 110.0 {
                WHITE
            } else {
                BLACK
            };
            // Up to 4 digits at double size; longer numbers at single size.
            let scale = if text_w(&label, 2) <= CELL_W - 6 {
                2
            } else {
                1
            };
            s.push(text(
                x + CELL_W / 2,
                y + CELL_H / 2 - 4 * scale,
                &label,
                scale,
                Anchor::Middle,
                ink,
            ));
        }
    }
    // Separators between job groups.
    let mut x = gx;
    for w in p.cols.windows(2) {
        x += CELL_W;
        if w[0].0 != w[1].0 {
            s.push(Shape::Rect {
                x: x - 1,
                y: gy - 50,
                w: 3,
                h: p.rows.len() as i32 * CELL_H + 50,
                fill: DARK,
                stroke: None,
            });
        }
    }
}

fn legend(s: &mut Vec<Shape>, cx: i32, y: i32, scale: &Scale) {
    let w = LEGEND_W;
    let x0 = cx - w / 2;
    s.push(text(cx, y, "colour scale: % throughput vs baseline (log scale; 100 = equal, blue = faster, red = slower)", 1, Anchor::Middle, BLACK));
    let steps = 100;
    for i in 0..steps {
        let t = -1.0 + 2.0 * (f64::from(i) + 0.5) / f64::from(steps);
        s.push(Shape::Rect {
            x: x0 + i * w / steps,
            y: y + 16,
            w: w / steps + 1,
            h: 22,
            fill: scale.colour(scale.at(t)),
            stroke: None,
        });
    }
    s.push(
        Shape::Rect {
            x: x0,
            y: y + 16,
            w,
            h: 22,
            fill: [0, 0, 0],
            stroke: None,
        }
        .outline(),
    );
    for t in [-1.0, -0.5, 0.0, 0.5, 1.0] {
        let pct = scale.at(t);
        let label = if t <= -1.0 {
            format!("<={pct:.0}")
        } else if t >= 1.0 {
            format!(">={pct:.0}")
        } else {
            format!("{pct:.0}")
        };
        let x = x0 + ((t + 1.0) / 2.0 * f64::from(w)).round() as i32;
        s.push(Shape::Rect {
            x: x - 1,
            y: y + 38,
            w: 2,
            h: 8,
            fill: BLACK,
            stroke: None,
        });
        s.push(text(x, y + 50, &label, 2, Anchor::Middle, BLACK));
    }
}

impl Shape {
    /// A rectangle drawn as an outline only (fill ignored).
    fn outline(self) -> Shape {
        match self {
            Shape::Rect {
                x, y, w, h, fill, ..
            } => Shape::Rect {
                x,
                y,
                w,
                h,
                fill: [1, 2, 3],
                stroke: Some(fill),
            },
            t => t,
        }
    }
}

/// Sentinel fill meaning "no fill" (outline-only rectangles).
const NO_FILL: Rgb = [1, 2, 3];

fn glyph(c: char) -> [u8; 8] {
    font8x8::BASIC_FONTS
        .get(c)
        .or_else(|| font8x8::LATIN_FONTS.get(c))
        .or_else(|| font8x8::BASIC_FONTS.get('?'))
        .unwrap_or([0; 8])
}

impl Canvas {
    /// Renders SVG 1.1 by hand.
    pub fn svg(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace">"#,
            w = self.width,
            h = self.height
        );
        let hex = |c: Rgb| format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
        for sh in &self.shapes {
            match sh {
                Shape::Rect {
                    x,
                    y,
                    w,
                    h,
                    fill,
                    stroke,
                } => {
                    let fill = if *fill == NO_FILL {
                        "none".to_string()
                    } else {
                        hex(*fill)
                    };
                    let stroke = stroke.map_or(String::new(), |c| {
                        format!(r#" stroke="{}" stroke-width="1""#, hex(c))
                    });
                    let _ = writeln!(
                        o,
                        r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}"{stroke}/>"#
                    );
                }
                Shape::Text {
                    x,
                    y,
                    text,
                    scale,
                    anchor,
                    colour,
                } => {
                    let anchor = match anchor {
                        Anchor::Start => "start",
                        Anchor::Middle => "middle",
                    };
                    let size = 8 * scale + scale;
                    let _ = writeln!(
                        o,
                        r#"<text x="{x}" y="{}" font-size="{size}" text-anchor="{anchor}" fill="{}">{}</text>"#,
                        y + 7 * scale,
                        hex(*colour),
                        xml_escape(text)
                    );
                }
            }
        }
        o.push_str("</svg>\n");
        o
    }

    /// Renders to RGB pixels.
    pub fn pixels(&self) -> Vec<u8> {
        let (w, h) = (self.width as i32, self.height as i32);
        let mut px = vec![255u8; (w * h * 3) as usize];
        let mut put = |x: i32, y: i32, c: Rgb| {
            if x >= 0 && y >= 0 && x < w && y < h {
                let i = ((y * w + x) * 3) as usize;
                px[i..i + 3].copy_from_slice(&c);
            }
        };
        for sh in &self.shapes {
            match sh {
                Shape::Rect {
                    x,
                    y,
                    w: rw,
                    h: rh,
                    fill,
                    stroke,
                } => {
                    if *fill != NO_FILL {
                        for yy in *y..y + rh {
                            for xx in *x..x + rw {
                                put(xx, yy, *fill);
                            }
                        }
                    }
                    if let Some(c) = stroke {
                        for xx in *x..x + rw {
                            put(xx, *y, *c);
                            put(xx, y + rh - 1, *c);
                        }
                        for yy in *y..y + rh {
                            put(*x, yy, *c);
                            put(x + rw - 1, yy, *c);
                        }
                    }
                }
                Shape::Text {
                    x,
                    y,
                    text,
                    scale,
                    anchor,
                    colour,
                } => {
                    let n = text.chars().count() as i32;
                    let x0 = match anchor {
                        Anchor::Start => *x,
                        Anchor::Middle => x - n * 8 * scale / 2,
                    };
                    for (i, ch) in text.chars().enumerate() {
                        let g = glyph(ch);
                        for (row, bits) in g.iter().enumerate() {
                            for col in 0..8 {
                                if bits >> col & 1 == 1 {
                                    for dy in 0..*scale {
                                        for dx in 0..*scale {
                                            put(
                                                x0 + (i as i32 * 8 + col) * scale + dx,
                                                y + row as i32 * scale + dy,
                                                *colour,
                                            );
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        px
    }

    /// Encodes the PNG file.
    pub fn png(&self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, self.width, self.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc
            .write_header()
            .map_err(|e| Error::External(format!("PNG encoding failed: {e}")))?;
        wr.write_image_data(&self.pixels())
            .map_err(|e| Error::External(format!("PNG encoding failed: {e}")))?;
        wr.finish()
            .map_err(|e| Error::External(format!("PNG encoding failed: {e}")))?;
        Ok(out)
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Heatmap {
        Heatmap {
            file_stem: "t".into(),
            title: "T <&>".into(),
            subtitle: "s".into(),
            panels: vec![Panel {
                title: "inline vs classic: read".into(),
                rows: vec![4096, 1 << 20],
                cols: vec![(1, 1), (1, 16), (2, 1)],
                values: vec![
                    vec![Some(250.0), Some(100.0), None],
                    vec![Some(50.0), Some(75.0), Some(141.0)],
                ],
            }],
            scale: Scale {
                lo: 50.0,
                hi: 200.0,
            },
        }
    }

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

    #[test]
    fn svg_and_png_have_the_size_and_numbers() {
        let h = sample();
        let c = h.layout();
        let svg = h.svg();
        assert!(svg.contains(&format!(r#"width="{}" height="{}""#, c.width, c.height)));
        assert!(
            svg.contains(">250</text>")
                && svg.contains(">QD16</text>")
                && svg.contains("T &lt;&amp;&gt;")
        );
        let png = h.png().unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), c.width);
        assert_eq!(
            u32::from_be_bytes(png[20..24].try_into().unwrap()),
            c.height
        );
        // The bitmap has the red, white and blue cells and black text.
        let px = c.pixels();
        let has = |rgb: Rgb| px.chunks(3).any(|p| p == rgb);
        assert!(has(WORSE) && has(BETTER) && has(BLACK) && has(GREY));
    }
}
