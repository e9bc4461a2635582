//! Dependency-free SVG charts: SLO attainment against offered rate, one line per router
//! (the benchmark: all requests and the critical classes side by side, with the seeds'
//! spread as a band), any series over time (the soak's memory), and grouped bars (the demo's
//! attainment per SLO class, one bar per router).

use std::fmt::Write;

/// One line of the chart.
#[derive(Default)]
pub struct Series<'a> {
    pub name: &'a str,
    /// `(x, y)` points in increasing x; y is a share (0-1).
    pub points: Vec<(f64, f64)>,
    /// `(x, low, high)`: the spread around the line where it was measured more than once
    /// (the seeds' range), drawn as a shaded band; empty for none.
    pub band: Vec<(f64, f64, f64)>,
}

/// One plot of a chart whose plots stand side by side on shared axes.
pub struct Panel<'a> {
    /// The plot's own heading (empty: none).
    pub title: &'a str,
    pub series: Vec<Series<'a>>,
}

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 240.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
/// Between two panels: room for the right one's y ticks.
const GAP: f64 = 50.0;
/// Ten colours that stay apart (a chart can hold every router of the benchmark).
const COLORS: [&str; 10] =
    ["#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"];
/// Dash patterns, cycled apart from the colours, so lines stay apart in grey too.
const DASHES: [&str; 3] = ["", "7 4", "2 3"];

/// Series `i`'s colour, dash pattern and marker shape (0 circle, 1 square, 2 triangle, 3 diamond).
fn style(i: usize) -> (&'static str, &'static str, usize) {
    (COLORS[i % COLORS.len()], DASHES[i % DASHES.len()], i % 4)
}

/// A marker of `shape` (see [`style`]) centred at `(x, y)`.
fn marker(shape: usize, x: f64, y: f64, color: &str) -> String {
    match shape {
        1 => format!(r##"<rect x="{:.1}" y="{:.1}" width="6" height="6" fill="{color}"/>"##, x - 3.0, y - 3.0),
        2 => format!(
            r##"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{color}"/>"##,
            x,
            y - 4.0,
            x - 4.0,
            y + 3.0,
            x + 4.0,
            y + 3.0
        ),
        3 => format!(
            r##"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{color}"/>"##,
            x,
            y - 4.0,
            x + 4.0,
            y,
            x,
            y + 4.0,
            x - 4.0,
            y
        ),
        _ => format!(r##"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"##),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A "nice" step for about `ticks` intervals over `span`.
fn tick_step(span: f64, ticks: f64) -> f64 {
    let raw = (span / ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

/// How a chart's axes read.
pub struct Axes<'a> {
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// The y range shown.
    pub y_min: f64,
    pub y_max: f64,
    /// Distance between y grid lines.
    pub y_step: f64,
    /// A y tick's text.
    pub y_text: &'a dyn Fn(f64) -> String,
    /// A dashed horizontal line and its label (a target).
    pub threshold: Option<(f64, String)>,
    /// Draw a marker on every point (off for long time series).
    pub dots: bool,
}

/// Attainment (y, 0-100%) against rate (x, req/s) in one or more panels on the same axes,
/// with the `threshold` as a dashed line.
pub fn attainment_svg(title: &str, panels: &[Panel], threshold: f64) -> String {
    let series = panels.iter().flat_map(|p| p.series.iter());
    let ys = series.flat_map(|s| s.points.iter().map(|p| p.1).chain(s.band.iter().map(|b| b.1)));
    let y0 = (ys.fold(1.0f64, f64::min).min(threshold) * 10.0).floor() / 10.0;
    let percent = |y: f64| format!("{:.0}%", 100.0 * y);
    let axes = Axes {
        x_label: "offered load (requests/s)",
        y_label: "SLO attainment",
        y_min: y0.clamp(0.0, 0.8),
        y_max: 1.0,
        y_step: 0.1,
        y_text: &percent,
        threshold: Some((threshold, format!("{:.0}% target", 100.0 * threshold))),
        dots: true,
    };
    panels_svg(title, &axes, panels)
}

/// Any line chart: one polyline per series over x from the data and y from `axes`.
pub fn line_svg(title: &str, axes: &Axes, series: Vec<Series>) -> String {
    panels_svg(title, axes, &[Panel { title: "", series }])
}

/// Line charts side by side, x from all panels' data and y from `axes`, one legend (the
/// panel with the most series names it; series `i` looks the same in every panel).
pub fn panels_svg(title: &str, axes: &Axes, panels: &[Panel]) -> String {
    let all = || panels.iter().flat_map(|p| p.series.iter());
    let xs = all().flat_map(|s| s.points.iter().map(|p| p.0));
    let (mut x0, mut x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    if !x0.is_finite() || !x1.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let step = tick_step((x1 - x0).max(1.0), 6.0);
    x0 = (x0 / step).floor() * step;
    x1 = ((x1 / step).ceil() * step).max(x0 + step);
    let (y0, y1) = (axes.y_min, if axes.y_max > axes.y_min { axes.y_max } else { axes.y_min + 1.0 });
    let n = panels.len().max(1) as f64;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let width = LEFT + n * pw + (n - 1.0) * GAP + RIGHT;
    let plots_w = n * pw + (n - 1.0) * GAP;
    let py = |y: f64| TOP + (1.0 - (y.clamp(y0, y1) - y0) / (y1 - y0)) * ph;

    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" viewBox="0 0 {width} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="18" text-anchor="middle" font-size="15">{}</text>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>
"##,
        LEFT + plots_w / 2.0,
        escape(title),
        LEFT + plots_w / 2.0,
        H - 10.0,
        escape(axes.x_label),
        TOP + ph / 2.0,
        escape(axes.y_label)
    );
    for (k, panel) in panels.iter().enumerate() {
        let left = LEFT + k as f64 * (pw + GAP);
        let px = |x: f64| left + (x - x0) / (x1 - x0) * pw;
        if !panel.title.is_empty() {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                left + pw / 2.0,
                TOP - 6.0,
                escape(panel.title)
            );
        }
        let mut x = x0;
        while x <= x1 + 1e-9 {
            let _ = writeln!(
                s,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#eee"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
                px(x),
                TOP,
                TOP + ph,
                TOP + ph + 16.0,
                x
            );
            x += step;
        }
        let y_step = if axes.y_step > 0.0 { axes.y_step } else { (y1 - y0) / 5.0 };
        let mut y = y0;
        while y <= y1 + 1e-9 {
            let _ = writeln!(
                s,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="#eee"/><text x="{3:.1}" y="{4:.1}" text-anchor="end">{5}</text>"##,
                left,
                py(y),
                left + pw,
                left - 6.0,
                py(y) + 4.0,
                (axes.y_text)(y)
            );
            y += y_step;
        }
        if let Some((threshold, label)) = &axes.threshold {
            let _ = writeln!(
                s,
                r##"<line x1="{left:.1}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#000" stroke-dasharray="6 4"/><text x="{1:.1}" y="{2:.1}" text-anchor="end">{3}</text>"##,
                py(*threshold),
                left + pw,
                py(*threshold) - 4.0,
                escape(label)
            );
        }
        let _ =
            writeln!(s, r##"<rect x="{left:.1}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#000"/>"##);
        for (i, line) in panel.series.iter().enumerate() {
            let (color, _, _) = style(i);
            if line.band.iter().any(|b| b.2 > b.1) {
                let upper = line.band.iter().map(|b| (b.0, b.2));
                let lower = line.band.iter().rev().map(|b| (b.0, b.1));
                let pts: Vec<String> = upper.chain(lower).map(|(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
                let _ = writeln!(
                    s,
                    r##"<polygon class="band" fill="{color}" fill-opacity="0.15" stroke="none" points="{}"/>"##,
                    pts.join(" ")
                );
            }
        }
        for (i, line) in panel.series.iter().enumerate() {
            let (color, dash, shape) = style(i);
            let pts: Vec<String> = line.points.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
            let _ = writeln!(
                s,
                r##"<polyline class="series" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" points="{}"/>"##,
                pts.join(" ")
            );
            if axes.dots {
                for (x, y) in &line.points {
                    s.push_str(&marker(shape, px(*x), py(*y), color));
                    s.push('\n');
                }
            }
        }
    }
    let legend = panels.iter().max_by_key(|p| p.series.len()).map_or(&[][..], |p| &p.series[..]);
    let lx = LEFT + plots_w + 12.0;
    for (i, line) in legend.iter().enumerate() {
        let (color, dash, shape) = style(i);
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>{3}<text x="{4:.1}" y="{5:.1}">{6}</text>"##,
            lx,
            ly,
            lx + 20.0,
            if axes.dots { marker(shape, lx + 10.0, ly, color) } else { String::new() },
            lx + 26.0,
            ly + 4.0,
            escape(line.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: for each group (x) one bar per series, heights shares (0-1), the
/// `threshold` as a dashed line. `series[i].points[g].1` is series i's value in group g.
pub fn bars_svg(title: &str, groups: &[&str], series: &[Series], threshold: f64) -> String {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let py = |y: f64| TOP + (1.0 - y.clamp(0.0, 1.0)) * ph;
    let group_w = pw / groups.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="22" text-anchor="middle" font-size="15">{}</text>"##,
        LEFT + pw / 2.0,
        escape(title)
    );
    for tick in 0..=10 {
        let y = f64::from(tick) / 10.0;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#eee"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{4}%</text>"##,
            py(y),
            LEFT + pw,
            LEFT - 6.0,
            py(y) + 4.0,
            tick * 10
        );
    }
    for (g, name) in groups.iter().enumerate() {
        let gx = LEFT + group_w * g as f64;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            gx + group_w / 2.0,
            TOP + ph + 16.0,
            escape(name)
        );
        for (i, line) in series.iter().enumerate() {
            let Some(&(_, y)) = line.points.get(g) else { continue };
            let x = gx + group_w * 0.1 + bar_w * i as f64;
            let _ = writeln!(
                s,
                r##"<rect class="bar" x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.1}%</text>"##,
                py(y),
                bar_w * 0.92,
                TOP + ph - py(y),
                COLORS[i % COLORS.len()],
                x + bar_w * 0.46,
                py(y) - 3.0,
                100.0 * y
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#000" stroke-dasharray="6 4"/><text x="{1:.1}" y="{2:.1}" text-anchor="end">{3:.0}% target</text>
<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#000"/>
<text transform="translate(16 {4:.1}) rotate(-90)" text-anchor="middle">SLO attainment</text>"##,
        py(threshold),
        LEFT + pw,
        py(threshold) - 4.0,
        100.0 * threshold,
        TOP + ph / 2.0
    );
    for (i, line) in series.iter().enumerate() {
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="14" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"##,
            LEFT + pw + 12.0,
            ly - 5.0,
            COLORS[i % COLORS.len()],
            LEFT + pw + 32.0,
            ly + 4.0,
            escape(line.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bar_per_series_and_group() {
        let series = [
            Series { name: "least request", points: vec![(0.0, 0.8), (1.0, 0.95)], ..Default::default() },
            Series { name: "headroom", points: vec![(0.0, 0.97), (1.0, 0.99)], ..Default::default() },
        ];
        let svg = bars_svg("t", &["interactive", "batch"], &series, 0.9);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches(r#"class="bar""#).count(), 4);
        assert!(svg.contains("97.0%") && svg.contains("interactive") && svg.contains("90% target"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn one_polyline_per_series_with_every_point() {
        let series = vec![
            Series { name: "a <b>", points: vec![(10.0, 1.0), (20.0, 0.95), (30.0, 0.5)], ..Default::default() },
            Series { name: "c", points: vec![(10.0, 0.99), (20.0, 0.7)], ..Default::default() },
        ];
        let svg = attainment_svg("t", &[Panel { title: "", series }], 0.9);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches(r#"class="series""#).count(), 2);
        // Five points and two legend entries, in two shapes.
        assert_eq!(svg.matches("<circle").count(), 3 + 1);
        assert_eq!(svg.matches("<rect x=").count() - 1, 2 + 1, "the frame, then the squares");
        assert!(svg.contains("a &lt;b&gt;"));
        assert!(svg.contains("90% target"));
        assert!(!svg.contains("class=\"band\""), "no band without a spread");
    }

    #[test]
    fn panels_share_the_axes_and_every_series_keeps_its_look_and_band() {
        let curve = |name, y: f64| Series {
            name,
            points: vec![(1.0, y), (2.0, y - 0.2)],
            band: vec![(1.0, y, y), (2.0, y - 0.3, y - 0.1)],
        };
        let panels = [
            Panel { title: "all requests", series: vec![curve("a", 1.0), curve("b", 0.9)] },
            Panel { title: "critical", series: vec![curve("a", 0.95), curve("b", 0.97)] },
        ];
        let svg = attainment_svg("t", &panels, 0.9);
        assert_eq!(svg.matches(r#"class="series""#).count(), 4);
        assert_eq!(svg.matches(r#"class="band""#).count(), 4);
        assert!(svg.contains("all requests") && svg.contains("critical"));
        // One legend: each name once, beside the right panel.
        assert_eq!(svg.matches(">a</text>").count(), 1);
        assert_eq!(svg.matches(r#"stroke-dasharray="7 4""#).count(), 3, "b's two lines and its legend");
        // The lowest band edge sets the y range: 60% is shown, not cut.
        assert!(svg.contains(">60%<"));
        assert!(svg.contains(r#"width="1270""#));
    }

    #[test]
    fn ten_series_look_ten_ways() {
        let looks: std::collections::HashSet<_> = (0..10).map(style).collect();
        assert_eq!(looks.len(), 10);
        let colours: std::collections::HashSet<_> = (0..10).map(|i| style(i).0).collect();
        assert_eq!(colours.len(), 10);
    }

    #[test]
    fn empty_chart_is_still_valid_svg() {
        let svg = attainment_svg("none", &[], 0.9);
        assert!(svg.contains("</svg>") && !svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(100.0, 5.0), 20.0);
        assert_eq!(tick_step(7.0, 6.0), 2.0);
    }
}
