//! The table for people, in the style of the kernel's own benchmark tables: one row per size, one
//! column per engine, then zero-copy/copy ratios.

use std::fmt::Write as _;

use super::size_label;
use crate::bench::result::{Cell, Report, Topology};

const ZC_ENGINES: [&str; 4] = ["msg-zc", "uring-zc", "uring-zc-fixed", "uring"];

fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn block(
    s: &mut String,
    t: &Topology,
    title: &str,
    value: impl Fn(&Cell) -> Option<String>,
    ratios: bool,
) {
    let _ = writeln!(s, "  {title}");
    let ratio_cols: Vec<&str> = if ratios && t.engines.iter().any(|e| e == "copy") {
        ZC_ENGINES
            .iter()
            .copied()
            .filter(|e| t.engines.iter().any(|x| x == e))
            .collect()
    } else {
        Vec::new()
    };
    // Each column is as wide as its widest entry, at least 9.
    let cells: Vec<Vec<String>> = t
        .sizes
        .iter()
        .map(|&size| {
            t.engines
                .iter()
                .map(|e| {
                    t.cell(e, size)
                        .and_then(&value)
                        .unwrap_or_else(|| "n/a".into())
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = t
        .engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            cells
                .iter()
                .map(|r| r[i].len())
                .chain([e.len(), 9])
                .max()
                .unwrap_or(9)
        })
        .collect();
    let mut header = format!("  {:>7}", "size");
    for (e, w) in t.engines.iter().zip(&widths) {
        let _ = write!(header, " {e:>w$}");
    }
    let ratio_labels: Vec<String> = ratio_cols.iter().map(|e| format!("{e}/copy")).collect();
    for label in &ratio_labels {
        let _ = write!(header, " {label:>w$}", w = label.len().max(9));
    }
    let _ = writeln!(s, "{}", header.trim_end());
    for (row_cells, &size) in cells.iter().zip(&t.sizes) {
        let mut row = format!("  {:>7}", size_label(size));
        for (v, w) in row_cells.iter().zip(&widths) {
            let _ = write!(row, " {v:>w$}");
        }
        for (e, label) in ratio_cols.iter().zip(&ratio_labels) {
            let mb = |name: &str| {
                t.cell(name, size)
                    .filter(|c| c.error.is_none() && !c.runs.is_empty())
                    .map(|c| c.mb_s.median)
            };
            let r = match (mb(e), mb("copy")) {
                (Some(z), Some(c)) if c > 0.0 => format!("{:.2}x", z / c),
                _ => "n/a".into(),
            };
            let _ = write!(row, " {r:>w$}", w = label.len().max(9));
        }
        let _ = writeln!(s, "{row}");
    }
}

fn ok(c: &Cell) -> Option<&Cell> {
    (c.error.is_none() && !c.runs.is_empty()).then_some(c)
}

/// Renders every topology.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "zerotx bench: kernel {}, {} CPUs, {} run(s) of {:.2} s per cell, buffer ring {} MiB",
        r.kernel,
        r.cpus,
        r.repeat,
        r.run_seconds,
        r.ring_bytes >> 20
    );
    for t in &r.topologies {
        let _ = writeln!(s, "\n{}: {}", t.name, t.description);
        if let Some(why) = &t.skipped {
            let _ = writeln!(s, "  skipped: {why}");
            continue;
        }
        block(
            &mut s,
            t,
            "throughput, MB/s (median)",
            |c| ok(c).map(|c| num(c.mb_s.median)),
            true,
        );
        block(
            &mut s,
            t,
            "sends per second, thousands (median)",
            |c| ok(c).map(|c| num(c.sends_s / 1000.0)),
            false,
        );
        block(
            &mut s,
            t,
            "sender CPU, seconds per GB (median)",
            |c| ok(c).map(|c| num(c.cpu_s_per_gb)),
            false,
        );
        block(
            &mut s,
            t,
            "sent zero-copy, share of releases (copy engines: -)",
            |c| {
                ok(c).map(|c| match c.zerocopy_share() {
                    Some(share) => format!("{:.0}%", share * 100.0),
                    None => "-".into(),
                })
            },
            false,
        );
        block(
            &mut s,
            t,
            "release latency p50/p99, us (median)",
            |c| ok(c).map(|c| format!("{}/{}", num(c.p50_us), num(c.p99_us))),
            false,
        );
        for c in &t.cells {
            if c.enobufs > 0 || c.fallbacks > 0 {
                let _ = writeln!(
                    s,
                    "  note: {} {}: ENOBUFS {} times, {} buffers sent by copy fallback",
                    c.engine,
                    size_label(c.size),
                    c.enobufs,
                    c.fallbacks
                );
            }
            if let Some(e) = &c.error {
                let _ = writeln!(s, "  error: {} {}: {e}", c.engine, size_label(c.size));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::{Cell, Run, Topology};

    /// A report with made-up, fixed figures: the layout is what is under test.
    pub fn sample() -> Report {
        let run = |mb: f64, zc: u64, kc: u64, ec: u64| Run {
            bytes: (mb * 1e6) as u64,
            sends: 1000,
            seconds: 1.0,
            cpu_seconds: mb / 2000.0,
            zerocopy: zc,
            kernel_copied: kc,
            engine_copied: ec,
            fallbacks: 0,
            enobufs: 0,
            p50_us: 10.0,
            p99_us: 99.5,
        };
        let cell = |e: &str, size, r: Run| Cell::summarise(e, size, vec![r], None);
        Report {
            version: "0.1.0".into(),
            kernel: "6.18.0".into(),
            cpus: 2,
            run_seconds: 0.6,
            repeat: 1,
            ring_bytes: 32 << 20,
            topologies: vec![
                Topology {
                    name: "udp-blackhole".into(),
                    description: "UDP into a black hole".into(),
                    skipped: None,
                    sizes: vec![1472, 65000],
                    engines: vec!["copy".into(), "msg-zc".into()],
                    cells: vec![
                        cell("copy", 1472, run(500.0, 0, 0, 1000)),
                        cell("msg-zc", 1472, run(450.0, 1000, 0, 0)),
                        cell("copy", 65000, run(6000.0, 0, 0, 1000)),
                        Cell::summarise("msg-zc", 65000, vec![], Some("engine unavailable".into())),
                    ],
                },
                Topology {
                    name: "vsock".into(),
                    description: "AF_VSOCK".into(),
                    skipped: Some("no vsock transport".into()),
                    ..Topology::default()
                },
            ],
        }
    }

    #[test]
    fn table_layout() {
        insta::assert_snapshot!(render(&sample()));
    }

    #[test]
    fn csv_has_a_row_per_cell_and_json_round_trips() {
        let r = sample();
        let csv = crate::export::csv::render(&r).unwrap();
        let lines: Vec<_> = csv.lines().collect();
        assert!(lines[0].starts_with("topology,engine,size,mb_s_median"));
        assert_eq!(lines.len(), 1 + 4);
        assert!(lines[4].ends_with("engine unavailable"));
        let v: serde_json::Value =
            serde_json::from_str(&crate::export::json::render(&r).unwrap()).unwrap();
        assert_eq!(v["topologies"][0]["cells"][1]["zerocopy"], 1000);
        assert_eq!(v["topologies"][1]["skipped"], "no vsock transport");
    }

    #[test]
    fn svg_plot_draws_every_engine() {
        let path = std::env::temp_dir().join(format!("zerotx-plot-{}.svg", std::process::id()));
        crate::export::svg::write(&sample(), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("udp-blackhole") && svg.contains("msg-zc"));
    }
}
