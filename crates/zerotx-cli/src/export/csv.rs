//! CSV: one row per (topology, engine, size) cell.

use serde::Serialize;

use super::Exporter;
use crate::bench::result::Report;

#[derive(Serialize)]
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
    error: &'a str,
}

/// CSV with a header row.
pub struct Csv;

impl Exporter for Csv {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        render(report)
    }
}

fn render(report: &Report) -> anyhow::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for t in &report.topologies {
        for c in &t.cells {
            w.serialize(Row {
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
                error: c.error.as_deref().unwrap_or(""),
            })?;
        }
    }
    Ok(w.into_inner()?)
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
        assert_eq!(lines.len(), 1 + 4);
        assert!(
            lines[1].starts_with("udp-blackhole,copy,1472,500"),
            "{}",
            lines[1]
        );
        assert!(lines[4].ends_with("engine unavailable"));
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
