//! Layout and drawing of a [`Heatmap`] with `plotters`: one drawing
//! routine, run on plotters' SVG backend (text as `<text>` elements naming
//! DejaVu Sans) and on its bitmap backend (text rasterised by `ab_glyph`
//! from the DejaVu Sans bytes the `dejavu` crate embeds), so both files
//! show the same picture without system fonts.
//!
//! ```text
//!   title, subtitle, axis note
//!   ┌ panel: title ──────────────┐ ┌ panel ─────┐   two panels per row
//!   │        jobs=1   │  jobs=2  │ │            │   (one if too wide)
//!   │ bs\QD  QD1 QD16 │ QD1 QD16 │ │            │
//!   │   4k   [%] [%]  │ [%] [%]  │ │            │   cell colour = scale
//!   └────────────────────────────┘ └────────────┘
//!   colour scale legend with tick labels
//! ```

use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontDesc, FontFamily, FontStyle};

use super::{Heatmap, Panel, Rgb, Scale, BLACK, DARK, GREY, WHITE};
use crate::stats::fmt_bs;
use crate::Error;

/// The font family registered with plotters and named in the SVG.
const FAMILY: &str = "DejaVu Sans";

const CELL_W: i32 = 72;
const CELL_H: i32 = 30;
const LEFT: i32 = 70;
const PANEL_GAP: i32 = 40;
const PANEL_HEAD: i32 = 78;
const PANEL_SEP: i32 = 28;
const MARGIN: i32 = 20;
const TOP: i32 = 96;
const LEGEND_W: i32 = 500;

const TITLE: f64 = 22.0;
const PANEL_TITLE: f64 = 17.0;
const SMALL: f64 = 13.0;
const LABEL: f64 = 16.0;

const AXIS_NOTE: &str =
    "rows: block size; columns: jobs (threads) x queue depth (QD) per job; cells: % throughput";
const LEGEND_NOTE: &str =
    "colour scale: % throughput vs baseline (log scale; 100 = equal, blue = faster, red = slower)";

/// Registers DejaVu Sans (regular and bold) with plotters, once.
fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A failure shows up as a drawing error on the first text.
        let _ = register_font(FAMILY, FontStyle::Normal, dejavu::sans::regular());
        let _ = register_font(FAMILY, FontStyle::Bold, dejavu::sans::bold());
    });
}

fn font(size: f64, bold: bool) -> FontDesc<'static> {
    let style = if bold {
        FontStyle::Bold
    } else {
        FontStyle::Normal
    };
    FontDesc::new(FontFamily::Name(FAMILY), size, style)
}

/// Width of `t` in pixels at `size`.
fn text_w(t: &str, size: f64, bold: bool) -> i32 {
    register_fonts();
    font(size, bold)
        .box_size(t)
        .map_or((t.chars().count() as f64 * size * 0.6) as i32, |(w, _)| {
            w as i32
        })
}

/// Where everything goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    /// Picture width in pixels.
    pub width: u32,
    /// Picture height in pixels.
    pub height: u32,
    panel_w: i32,
    panel_h: i32,
    per_row: i32,
    x_start: i32,
    legend_y: i32,
}

/// Lays `map` out; every width accounts for its text.
pub fn layout(map: &Heatmap) -> Layout {
    let most = |f: fn(&Panel) -> usize| map.panels.iter().map(f).max().unwrap_or(1).max(1) as i32;
    let (ncols, nrows) = (most(|p| p.cols.len()), most(|p| p.rows.len()));
    let title_w = map
        .panels
        .iter()
        .map(|p| text_w(&p.title, PANEL_TITLE, true))
        .max()
        .unwrap_or(0);
    let panel_w = (LEFT + ncols * CELL_W).max(title_w);
    let panel_h = PANEL_HEAD + nrows * CELL_H;
    let per_row = if map.panels.len() > 1 && 2 * panel_w + PANEL_GAP + 2 * MARGIN <= 2000 {
        2
    } else {
        1
    };
    let grid_rows = (map.panels.len() as i32 + per_row - 1) / per_row;
    let row_w = per_row * panel_w + (per_row - 1) * PANEL_GAP;
    let width = [
        2 * MARGIN + row_w,
        2 * MARGIN + text_w(&map.title, TITLE, true),
        2 * MARGIN + text_w(&map.subtitle, SMALL, false),
        2 * MARGIN + text_w(AXIS_NOTE, SMALL, false),
        2 * MARGIN + text_w(LEGEND_NOTE, SMALL, false),
        2 * MARGIN + LEGEND_W + 80,
    ]
    .into_iter()
    .max()
    .unwrap_or(800);
    let legend_y = TOP + grid_rows * (panel_h + PANEL_SEP) + 4;
    Layout {
        width: width as u32,
        height: (legend_y + 80) as u32,
        panel_w,
        panel_h,
        per_row,
        x_start: (width - row_w) / 2,
        legend_y,
    }
}

/// The SVG document of `map`.
pub fn svg(map: &Heatmap) -> Result<String, Error> {
    register_fonts();
    let l = layout(map);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (l.width, l.height)).into_drawing_area();
        draw(&root, map, &l)
            .and_then(|()| root.present())
            .map_err(|e| draw_error(map, e))?;
    }
    Ok(out)
}

/// The RGB pixels of `map` (row-major, 3 bytes a pixel) and its layout.
pub fn pixels(map: &Heatmap) -> Result<(Vec<u8>, Layout), Error> {
    register_fonts();
    let l = layout(map);
    let mut px = vec![255u8; l.width as usize * l.height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut px, (l.width, l.height)).into_drawing_area();
        draw(&root, map, &l)
            .and_then(|()| root.present())
            .map_err(|e| draw_error(map, e))?;
    }
    Ok((px, l))
}

/// The PNG file of `map`.
pub fn png(map: &Heatmap) -> Result<Vec<u8>, Error> {
    let (px, l) = pixels(map)?;
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, l.width, l.height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(Error::Png)?;
    wr.write_image_data(&px).map_err(Error::Png)?;
    wr.finish().map_err(Error::Png)?;
    Ok(out)
}

fn draw_error<E>(map: &Heatmap, e: DrawingAreaErrorKind<E>) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    Error::Draw {
        file: map.file_stem.clone(),
        source: Box::new(e),
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn rgb(c: Rgb) -> RGBColor {
    RGBColor(c[0], c[1], c[2])
}

fn luminance(c: Rgb) -> f64 {
    0.299 * f64::from(c[0]) + 0.587 * f64::from(c[1]) + 0.114 * f64::from(c[2])
}

fn rect<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    (x, y, w, h): (i32, i32, i32, i32),
    fill: Rgb,
) -> DrawResult<DB> {
    a.draw(&Rectangle::new(
        [(x, y), (x + w - 1, y + h - 1)],
        rgb(fill).filled(),
    ))
}

fn outline<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    (x, y, w, h): (i32, i32, i32, i32),
    stroke: Rgb,
) -> DrawResult<DB> {
    a.draw(&Rectangle::new(
        [(x, y), (x + w - 1, y + h - 1)],
        rgb(stroke).stroke_width(1),
    ))
}

/// Text with its anchor at (`x`, `y`).
#[allow(clippy::too_many_arguments)]
fn text<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    t: &str,
    (x, y): (i32, i32),
    size: f64,
    bold: bool,
    colour: Rgb,
    h: HPos,
    v: VPos,
) -> DrawResult<DB> {
    let ink = rgb(colour);
    let style = TextStyle::from(font(size, bold))
        .color(&ink)
        .pos(Pos::new(h, v));
    a.draw(&Text::new(t.to_string(), (x, y), style))
}

fn draw<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    map: &Heatmap,
    l: &Layout,
) -> DrawResult<DB> {
    a.fill(&rgb(WHITE))?;
    let cx = l.width as i32 / 2;
    let top = (HPos::Center, VPos::Top);
    text(a, &map.title, (cx, 12), TITLE, true, BLACK, top.0, top.1)?;
    text(a, &map.subtitle, (cx, 42), SMALL, false, DARK, top.0, top.1)?;
    text(a, AXIS_NOTE, (cx, 60), SMALL, false, DARK, top.0, top.1)?;
    for (i, p) in map.panels.iter().enumerate() {
        let px = l.x_start + (i as i32 % l.per_row) * (l.panel_w + PANEL_GAP);
        let py = TOP + (i as i32 / l.per_row) * (l.panel_h + PANEL_SEP);
        panel(a, p, px, py, &map.scale)?;
    }
    legend(a, cx, l.legend_y, &map.scale)
}

fn panel<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    p: &Panel,
    px: i32,
    py: i32,
    scale: &Scale,
) -> DrawResult<DB> {
    text(
        a,
        &p.title,
        (px, py),
        PANEL_TITLE,
        true,
        BLACK,
        HPos::Left,
        VPos::Top,
    )?;
    let (gx, gy) = (px + LEFT, py + PANEL_HEAD);
    // Column headers: jobs groups, then QD.
    let mut i = 0;
    while i < p.cols.len() {
        let jobs = p.cols[i].0;
        let n = p.cols[i..].iter().take_while(|c| c.0 == jobs).count() as i32;
        let x0 = gx + i as i32 * CELL_W;
        rect(a, (x0 + 2, gy - 50, n * CELL_W - 4, 18), [235, 235, 235])?;
        let at = (x0 + n * CELL_W / 2, gy - 41);
        text(
            a,
            &format!("jobs={jobs}"),
            at,
            SMALL,
            false,
            BLACK,
            HPos::Center,
            VPos::Center,
        )?;
        i += n as usize;
    }
    for (c, &(_, qd)) in p.cols.iter().enumerate() {
        let at = (gx + c as i32 * CELL_W + CELL_W / 2, gy - 18);
        text(
            a,
            &format!("QD{qd}"),
            at,
            SMALL,
            false,
            BLACK,
            HPos::Center,
            VPos::Center,
        )?;
    }
    text(
        a,
        "bs \\ QD",
        (px, gy - 18),
        SMALL,
        false,
        DARK,
        HPos::Left,
        VPos::Center,
    )?;
    for (r, &bs) in p.rows.iter().enumerate() {
        let y = gy + r as i32 * CELL_H;
        let at = (gx - 8, y + CELL_H / 2);
        text(
            a,
            &fmt_bs(bs),
            at,
            LABEL,
            false,
            BLACK,
            HPos::Right,
            VPos::Center,
        )?;
        for (c, v) in p.values[r].iter().enumerate() {
            let x = gx + c as i32 * CELL_W;
            let (fill, label) = match v {
                Some(v) => (scale.colour(*v), format!("{v:.0}")),
                None => (GREY, "-".to_string()),
            };
            rect(a, (x, y, CELL_W, CELL_H), fill)?;
            outline(a, (x, y, CELL_W, CELL_H), WHITE)?;
            let ink = if luminance(fill) < 110.0 {
                WHITE
            } else {
                BLACK
            };
            let size = if text_w(&label, LABEL, false) <= CELL_W - 6 {
                LABEL
            } else {
                SMALL
            };
            let at = (x + CELL_W / 2, y + CELL_H / 2);
            text(a, &label, at, size, false, ink, HPos::Center, VPos::Center)?;
        }
    }
    // Separators between job groups.
    let mut x = gx;
    for w in p.cols.windows(2) {
        x += CELL_W;
        if w[0].0 != w[1].0 {
            rect(
                a,
                (x - 1, gy - 50, 3, p.rows.len() as i32 * CELL_H + 50),
                DARK,
            )?;
        }
    }
    Ok(())
}

fn legend<DB: DrawingBackend>(
    a: &DrawingArea<DB, Shift>,
    cx: i32,
    y: i32,
    scale: &Scale,
) -> DrawResult<DB> {
    let w = LEGEND_W;
    let x0 = cx - w / 2;
    text(
        a,
        LEGEND_NOTE,
        (cx, y),
        SMALL,
        false,
        BLACK,
        HPos::Center,
        VPos::Top,
    )?;
    let steps = 100;
    for i in 0..steps {
        let t = -1.0 + 2.0 * (f64::from(i) + 0.5) / f64::from(steps);
        let fill = scale.colour(scale.at(t));
        rect(a, (x0 + i * w / steps, y + 18, w / steps + 1, 22), fill)?;
    }
    outline(a, (x0, y + 18, w, 22), BLACK)?;
    for t in [-1.0, -0.5, 0.0, 0.5, 1.0] {
        let pct = scale.at(t);
        let label = if t <= -1.0 {
            format!("≤{pct:.0}")
        } else if t >= 1.0 {
            format!("≥{pct:.0}")
        } else {
            format!("{pct:.0}")
        };
        let x = x0 + ((t + 1.0) / 2.0 * f64::from(w)).round() as i32;
        rect(a, (x - 1, y + 40, 2, 8), BLACK)?;
        text(
            a,
            &label,
            (x, y + 50),
            LABEL,
            false,
            BLACK,
            HPos::Center,
            VPos::Top,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heatmap::{BETTER, WORSE};

    pub(crate) fn sample() -> Heatmap {
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
    fn text_is_measured_with_the_real_font() {
        // DejaVu Sans is proportional: "iiii" is narrower than "MMMM".
        let (i, m) = (text_w("iiii", 16.0, false), text_w("MMMM", 16.0, false));
        assert!(i > 0 && m > 2 * i, "{i} {m}");
        assert!(text_w("MMMM", 16.0, true) >= m);
    }

    #[test]
    fn svg_and_png_have_the_size_and_numbers() {
        let h = sample();
        let l = layout(&h);
        let svg = svg(&h).unwrap();
        assert!(svg.contains(&format!(r#"width="{}" height="{}""#, l.width, l.height)));
        // plotters puts each text element's content on a line of its own.
        let texts = svg.replace(">\n", ">").replace("\n</text>", "</text>");
        assert!(
            texts.contains(">250</text>")
                && texts.contains(">QD16</text>")
                && texts.contains("T &lt;&amp;&gt;")
                && texts.contains(r#"font-family="DejaVu Sans""#),
            "{svg}"
        );
        let png = png(&h).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), l.width);
        assert_eq!(
            u32::from_be_bytes(png[20..24].try_into().unwrap()),
            l.height
        );
        // The bitmap has the red, white and blue cells, the grey of the
        // missing value and black text.
        let (px, _) = pixels(&h).unwrap();
        let has = |rgb: Rgb| px.chunks(3).any(|p| p == rgb);
        assert!(has(WORSE) && has(BETTER) && has(BLACK) && has(GREY) && has(WHITE));
        // Anti-aliased glyph edges: grey levels between text and white.
        let title_band = &px[..(l.width as usize * 40 * 3)];
        assert!(title_band
            .chunks(3)
            .any(|p| p[0] == p[1] && p[1] == p[2] && p[0] > 40 && p[0] < 215));
    }
}
