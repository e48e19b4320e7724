//! `--plot FILE.svg`: throughput against size, one line per engine, one panel per topology.

use anyhow::Context;
use plotters::prelude::*;

use super::{size_label, Exporter};
use crate::bench::result::Report;

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

/// Draws the plot into `out`.
fn draw(report: &Report, out: &mut String) -> anyhow::Result<()> {
    let panels: Vec<_> = report
        .topologies
        .iter()
        .filter(|t| t.skipped.is_none() && !t.cells.is_empty())
        .collect();
    anyhow::ensure!(
        !panels.is_empty(),
        "nothing to plot: every topology was skipped"
    );
    let height = 420 * panels.len() as u32;
    let root = SVGBackend::with_string(out, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, t) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let max_mb = t.cells.iter().map(|c| c.mb_s.median).fold(1.0f64, f64::max);
        let (lo, hi) = (
            *t.sizes.first().context("no sizes")? as f64,
            *t.sizes.last().context("no sizes")? as f64,
        );
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{}: throughput vs send size", t.name),
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (lo * 0.8..hi * 1.25)
                    .log_scale()
                    .with_key_points(t.sizes.iter().map(|&s| s as f64).collect::<Vec<_>>()),
                0.0..max_mb * 1.1,
            )?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("bytes per send")
            .y_desc("MB/s")
            .x_label_formatter(&|v| size_label(v.round() as usize))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        for (i, engine) in t.engines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> = t
                .sizes
                .iter()
                .filter_map(|&s| t.cell(engine, s))
                .filter(|c| c.error.is_none() && !c.runs.is_empty())
                .map(|c| (c.size as f64, c.mb_s.median))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(engine.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present().context("drawing the SVG")?;
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
    fn nothing_to_plot_is_an_error() {
        let mut r = sample::report();
        r.topologies.remove(0);
        let e = Svg.render(&r).unwrap_err();
        assert!(e.to_string().contains("nothing to plot"), "{e}");
    }
}
