//! CSV: one row per (topology, engine, size) cell, and a row with the reason in `error` for
//! every cell that did not run (a skipped topology's, a size the topology left out), so no
//! asked-for cell vanishes. The header comes first even when there is no row.

use serde::Serialize;

use super::Exporter;
use crate::bench::result::{Cell, Report, TopologyResult};

#[derive(Serialize, Default)]
struct Row<'a> {
    topology: &'a str,
    engine: &'a str,
    size: usize,
    mb_s_median: f64,
    mb_s_min: f64,
    mb_s_max: f64,
    sends_s: f64,
    cpu_s_per_gb: f64,
    zerocopy: u64,
    kernel_copied: u64,
    engine_copied: u64,
    fallbacks: u64,
    enobufs: u64,
    policy_copied: u64,
    auto_chose: Option<String>,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    runs: usize,
    error: String,
}

/// CSV with a header row.
pub struct Csv;

impl Exporter for Csv {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        render(report)
    }
}

fn ran<'a>(t: &'a TopologyResult, c: &'a Cell) -> Row<'a> {
    Row {
        topology: &t.name,
        engine: &c.engine,
        size: c.size,
        mb_s_median: c.mb_s.median,
        mb_s_min: c.mb_s.min,
        mb_s_max: c.mb_s.max,
        sends_s: c.sends_s,
        cpu_s_per_gb: c.cpu_s_per_gb,
        zerocopy: c.zerocopy,
        kernel_copied: c.kernel_copied,
        engine_copied: c.engine_copied,
        fallbacks: c.fallbacks,
        enobufs: c.enobufs,
        policy_copied: c.policy_copied,
        auto_chose: c.chosen.clone(),
        p50_us: c.p50_us,
        p99_us: c.p99_us,
        runs: c.runs.len(),
        error: c.error.clone().unwrap_or_default(),
    }
}

/// Rows for cells that did not run: every engine at every size, or one row for the topology
/// when it has neither.
fn not_run<'a>(t: &'a TopologyResult, sizes: &[usize], error: &str) -> Vec<Row<'a>> {
    let mut rows = Vec::new();
    for &size in sizes {
        for engine in &t.engines {
            rows.push(Row {
                topology: &t.name,
                engine,
                size,
                error: error.to_string(),
                ..Row::default()
            });
        }
    }
    if rows.is_empty() {
        rows.push(Row {
            topology: &t.name,
            error: error.to_string(),
            ..Row::default()
        });
    }
    rows
}

fn render(report: &Report) -> anyhow::Result<Vec<u8>> {
    let mut rows = Vec::new();
    for t in &report.topologies {
        match &t.skipped {
            Some(why) => rows.extend(not_run(t, &t.sizes, &format!("topology skipped: {why}"))),
            None => rows.extend(t.cells.iter().map(|c| ran(t, c))),
        }
        if let Some(l) = &t.left_out {
            rows.extend(not_run(t, &l.sizes, &format!("not run: {}", l.reason())));
        }
    }
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in &rows {
        w.serialize(r)?;
    }
    let mut bytes = w.into_inner()?;
    if rows.is_empty() {
        // The header alone: `serialize` writes it with the first row.
        let mut h = csv::Writer::from_writer(Vec::new());
        h.serialize(Row::default())?;
        let all = h.into_inner()?;
        let end = all
            .iter()
            .position(|&b| b == b'\n')
            .map_or(all.len(), |i| i + 1);
        bytes = all[..end].to_vec();
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn a_header_then_a_row_per_cell_with_its_error() {
        let csv = String::from_utf8(Csv.render(&sample::report()).unwrap()).unwrap();
        let lines: Vec<_> = csv.lines().collect();
        assert!(lines[0].starts_with("topology,engine,size,mb_s_median"));
        assert_eq!(lines.len(), 1 + 4 + 1);
        assert!(
            lines[1].starts_with("udp-blackhole,copy,1472,500"),
            "{}",
            lines[1]
        );
        assert!(lines[4].ends_with("engine unavailable"));
        // The skipped topology has its row too.
        assert!(
            lines[5].starts_with("vsock,")
                && lines[5].ends_with("topology skipped: no vsock transport"),
            "{}",
            lines[5]
        );
    }

    #[test]
    fn sizes_left_out_get_rows_and_no_rows_still_get_the_header() {
        let mut r = sample::report();
        r.topologies[0].left_out = Some(crate::bench::result::LeftOut {
            sizes: vec![65536],
            max_size: 65507,
        });
        let csv = String::from_utf8(Csv.render(&r).unwrap()).unwrap();
        let left: Vec<_> = csv.lines().filter(|l| l.contains(",65536,")).collect();
        assert_eq!(left.len(), 2, "{csv}");
        assert!(left[0].starts_with("udp-blackhole,copy,65536,"), "{csv}");
        assert!(
            left[0].contains("not run: larger than 65507 bytes"),
            "{csv}"
        );
        r.topologies.clear();
        let csv = String::from_utf8(Csv.render(&r).unwrap()).unwrap();
        assert!(csv.starts_with("topology,engine,size,"), "{csv:?}");
        assert_eq!(csv.lines().count(), 1);
    }

    #[test]
    fn missing_latency_is_an_empty_field() {
        let csv = String::from_utf8(Csv.render(&sample::with_baselines()).unwrap()).unwrap();
        let lib = csv
            .lines()
            .find(|l| l.contains("liburing-zc-fixed"))
            .unwrap();
        assert!(lib.contains(",,,1,"), "{lib}");
    }
}
