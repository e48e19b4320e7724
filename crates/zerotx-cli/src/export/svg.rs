//! `--plot FILE.svg`: per topology, throughput and sender CPU per GB against send size, one line
//! per engine with its range over repetitions, under a title that says where and when it ran.
//!
//! Both axes of both panels are logarithmic where the figures span a decade or more (send sizes
//! from 1472 B to 64 KiB, throughput from a few hundred MB/s to several GB/s): on a linear axis
//! the small sizes collapse into one blob. Engines that measure alike would hide each other, so
//! each engine's points sit a little apart along the size axis, and `auto` is drawn last, dashed.

use anyhow::Context;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{num, size_label, Exporter};
use crate::bench::result::{Cell, Report, Spread, TopologyResult};

/// The plot as an SVG document.
pub struct Svg;

impl Exporter for Svg {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        let mut out = String::new();
        draw(report, &mut out)?;
        Ok(out.into_bytes())
    }
}

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Height of one topology's row of panels, and of the title above them.
const ROW: u32 = 440;
const TITLE: u32 = 80;

/// One engine's figures in a panel: its column (for its colour), its name, and (size, spread)
/// per size it has.
type Line<'a> = (usize, &'a String, Vec<(usize, Spread)>);

/// Draws the plot into `out`.
fn draw(report: &Report, out: &mut String) -> anyhow::Result<()> {
    let rows: Vec<_> = report
        .topologies
        .iter()
        .filter(|t| t.skipped.is_none() && !t.cells.is_empty())
        .collect();
    anyhow::ensure!(
        !rows.is_empty(),
        "nothing to plot: every topology was skipped"
    );
    let height = TITLE + ROW * rows.len() as u32;
    let root = SVGBackend::with_string(out, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(TITLE);
    let (heading, what_ran) = title_lines(report);
    title.draw_text(
        &heading,
        &("sans-serif", 20).into_text_style(&title),
        (15, 10),
    )?;
    let grey_color = BLACK.mix(0.7);
    let grey = ("sans-serif", 14)
        .into_text_style(&title)
        .color(&grey_color);
    title.draw_text(&what_ran, &grey, (15, 38))?;
    title.draw_text(&report.conditions(), &grey, (15, 58))?;
    for (row, t) in body.split_evenly((rows.len(), 1)).iter().zip(rows) {
        let (left, right) = row.split_horizontally(600);
        let cells = |e: &str| -> Vec<&Cell> {
            t.sizes
                .iter()
                .filter_map(|&s| t.cell(e, s))
                .filter(|c| c.error.is_none() && !c.runs.is_empty())
                .collect()
        };
        panel(
            &left,
            t,
            &format!("{}: throughput", t.name),
            "MB/s (higher is better)",
            // Throughput grows with the size: the lower right is where the lines are not.
            SeriesLabelPosition::LowerRight,
            &|e| cells(e).into_iter().map(|c| (c.size, c.mb_s)).collect(),
        )?;
        panel(
            &right,
            t,
            &format!("{}: sender CPU per GB", t.name),
            "CPU seconds per GB (lower is better)",
            SeriesLabelPosition::UpperRight,
            &|e| {
                cells(e)
                    .into_iter()
                    .map(|c| (c.size, cpu_per_gb(c)))
                    .collect()
            },
        )?;
    }
    root.present().context("drawing the SVG")?;
    Ok(())
}

/// The title's lines: "zerotx bench on HOST, kernel K, DATE", and what ran.
fn title_lines(r: &Report) -> (String, String) {
    let ran: Vec<&str> = r
        .topologies
        .iter()
        .filter(|t| t.skipped.is_none())
        .map(|t| t.name.as_str())
        .collect();
    let engines: Vec<&str> = r
        .topologies
        .iter()
        .find(|t| t.skipped.is_none())
        .map(|t| t.engines.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let date = std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.started);
    (
        format!(
            "zerotx bench {} on {}, kernel {}, {}",
            r.version,
            r.host,
            r.kernel,
            httpdate::fmt_http_date(date)
        ),
        format!(
            "ran {} with the engines {}; bars: smallest to largest repetition, dots: median",
            ran.join(", "),
            engines.join(", ")
        ),
    )
}

/// A log axis's label: only at 1, 2 and 5 times a power of ten, so the labels do not crowd.
fn log_label(v: f64) -> String {
    let lead = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|l| (lead - l).abs() < 1e-6)
    {
        num(v)
    } else {
        String::new()
    }
}

/// Sender CPU seconds per 10^9 bytes, over the cell's runs.
fn cpu_per_gb(c: &Cell) -> Spread {
    Spread::of(
        c.runs
            .iter()
            .filter(|r| r.bytes > 0)
            .map(|r| r.cpu_seconds / (r.bytes as f64 / 1e9))
            .collect(),
    )
}

/// One panel: `figures(engine)` (size, spread) per engine, as a line through the medians with a
/// bar from the smallest to the largest repetition.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    t: &TopologyResult,
    caption: &str,
    y_desc: &str,
    legend: SeriesLabelPosition,
    figures: &dyn Fn(&str) -> Vec<(usize, Spread)>,
) -> anyhow::Result<()> {
    let lines: Vec<Line<'_>> = t
        .engines
        .iter()
        .enumerate()
        .map(|(i, e)| (i, e, figures(e)))
        .filter(|(_, _, f)| !f.is_empty())
        .collect();
    let (lo_y, hi_y) = lines
        .iter()
        .flat_map(|(_, _, f)| f.iter().map(|(_, s)| s))
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), s| {
            (lo.min(s.min), hi.max(s.max))
        });
    let (lo_x, hi_x) = (
        *t.sizes.first().context("no sizes")? as f64,
        *t.sizes.last().context("no sizes")? as f64,
    );
    let x = (lo_x * 0.8..hi_x * 1.25)
        .log_scale()
        .with_key_points(t.sizes.iter().map(|&s| s as f64).collect::<Vec<_>>());
    let lo_y = if lo_y.is_finite() && lo_y > 0.0 {
        lo_y
    } else {
        hi_y / 10.0
    };
    let hi_y = hi_y.max(lo_y * 1.01).max(f64::MIN_POSITIVE);
    // A decade or more: logarithmic, else the differences that matter flatten.
    if hi_y / lo_y >= 10.0 {
        let y = (lo_y / 1.3..hi_y * 1.3).log_scale();
        let look = Look {
            caption,
            y_desc,
            legend,
            y_label: &log_label,
        };
        draw_panel(area, t, &look, x, y, &lines)
    } else {
        let pad = (hi_y - lo_y).max(hi_y * 0.05) * 0.15;
        let look = Look {
            caption,
            y_desc,
            legend,
            y_label: &|v| num(v),
        };
        draw_panel(area, t, &look, x, (lo_y - pad).max(0.0)..hi_y + pad, &lines)
    }
}

/// Where engine `i` of `n` draws at `size`: a few percent either side of it on the log axis, so
/// engines with equal figures stay apart.
fn dodge(size: usize, i: usize, n: usize) -> f64 {
    let step = 0.025;
    size as f64 * (1.0 + step * (i as f64 - (n as f64 - 1.0) / 2.0))
}

/// How a panel is labelled.
struct Look<'a> {
    caption: &'a str,
    y_desc: &'a str,
    legend: SeriesLabelPosition,
    y_label: &'a dyn Fn(f64) -> String,
}

fn draw_panel<X, Y>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    t: &TopologyResult,
    look: &Look<'_>,
    x: X,
    y: Y,
    lines: &[Line<'_>],
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(look.caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("bytes per send")
        .y_desc(look.y_desc)
        .x_label_formatter(&|v| size_label(v.round() as usize))
        .y_label_formatter(&|v| (look.y_label)(*v))
        .draw()?;
    let n = t.engines.len();
    // `auto` last, so nothing covers it.
    let mut order: Vec<_> = lines.iter().collect();
    order.sort_by_key(|(_, e, _)| e.as_str() == "auto");
    for (i, engine, points) in order {
        let auto = engine.as_str() == "auto";
        let color = if auto {
            BLACK
        } else {
            COLORS[*i % COLORS.len()]
        };
        let at: Vec<(f64, Spread)> = points
            .iter()
            .map(|&(size, s)| (dodge(size, *i, n), s))
            .collect();
        let medians: Vec<(f64, f64)> = at.iter().map(|&(x, s)| (x, s.median)).collect();
        let series = if auto {
            chart.draw_series(DashedLineSeries::new(
                medians.clone(),
                8,
                5,
                color.stroke_width(2),
            ))?
        } else {
            chart.draw_series(LineSeries::new(medians.clone(), color.stroke_width(2)))?
        };
        series.label(engine.as_str()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        chart.draw_series(
            at.iter()
                .map(|&(x, s)| ErrorBar::new_vertical(x, s.min, s.median, s.max, color, 6)),
        )?;
        chart.draw_series(medians.into_iter().map(|p| {
            if auto {
                Circle::new(p, 5, color.stroke_width(2))
            } else {
                Circle::new(p, 3, color.filled())
            }
        }))?;
    }
    chart
        .configure_series_labels()
        .position(look.legend.clone())
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn draws_every_engine_of_every_topology_that_ran() {
        let svg = String::from_utf8(Svg.render(&sample::report()).unwrap()).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("udp-blackhole") && svg.contains("msg-zc"));
        assert!(!svg.contains("vsock"), "a skipped topology gets no panel");
    }

    #[test]
    fn log_axes_label_only_one_two_and_five() {
        assert_eq!(log_label(100.0), "100");
        assert_eq!(log_label(2000.0), "2000");
        assert_eq!(log_label(0.5), "0.50");
        assert_eq!(log_label(700.0), "");
        assert_eq!(log_label(3.0), "");
    }

    #[test]
    fn the_title_names_host_kernel_date_and_what_ran() {
        let r = sample::report();
        let svg = String::from_utf8(Svg.render(&r).unwrap()).unwrap();
        for want in [
            "on testhost",
            "kernel 6.18.0",
            "Fri, 27 Nov 2026",
            "sender CPU per GB",
        ] {
            assert!(svg.contains(want), "{want} missing from the plot");
        }
    }

    #[test]
    fn engines_with_equal_figures_are_drawn_apart() {
        let xs: Vec<f64> = (0..4).map(|i| dodge(4096, i, 4)).collect();
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{xs:?}");
        assert!(xs[0] < 4096.0 && xs[3] > 4096.0);
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let mut r = sample::report();
        r.topologies.remove(0);
        let e = Svg.render(&r).unwrap_err();
        assert!(e.to_string().contains("nothing to plot"), "{e}");
    }
}
