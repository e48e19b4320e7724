//! The table for people, in the style of the kernel's own benchmark tables: per topology, one row
//! per size and one column per engine, then zero-copy/copy ratios, and zerotx/baseline ratios
//! when baselines ran.

use std::fmt::Write as _;

use super::{num, size_label, Exporter};
use crate::bench::result::{Cell, Paired, Report, TopologyResult};

/// zerotx's engines that get a ratio against `copy`.
const ZC_ENGINES: [&str; 4] = ["msg-zc", "uring-zc", "uring-zc-fixed", "uring"];

/// The plain-text table.
pub struct Table;

impl Exporter for Table {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        Ok(render(report).into_bytes())
    }
}

/// Rows of `values` (one per size) under `headers`, each column as wide as its widest entry and
/// at least 9.
fn columns(s: &mut String, sizes: &[usize], headers: &[String], values: &[Vec<String>]) {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            values
                .iter()
                .map(|r| r[i].len())
                .chain([h.len(), 9])
                .max()
                .unwrap_or(9)
        })
        .collect();
    let mut header = format!("  {:>7}", "size");
    for (h, w) in headers.iter().zip(&widths) {
        let _ = write!(header, " {h:>w$}");
    }
    let _ = writeln!(s, "{}", header.trim_end());
    for (row, &size) in values.iter().zip(sizes) {
        let mut line = format!("  {:>7}", size_label(size));
        for (v, w) in row.iter().zip(&widths) {
            let _ = write!(line, " {v:>w$}");
        }
        let _ = writeln!(s, "{line}");
    }
}

fn ratio(t: &TopologyResult, a: &str, b: &str, size: usize) -> String {
    t.ratio(a, b, size)
        .map_or_else(|| "n/a".into(), |r| format!("{r:.2}x"))
}

/// A paired ratio with its interval, if it has one.
pub(super) fn paired(p: Option<Paired>) -> String {
    match p {
        None => "n/a".into(),
        Some(Paired {
            median,
            interval: None,
            ..
        }) => format!("{median:.3}x"),
        Some(Paired {
            median,
            interval: Some((lo, hi)),
            ..
        }) => format!("{median:.3}x [{lo:.3}, {hi:.3}]"),
    }
}

/// One figure per engine, and with `ratios` each zero-copy engine's throughput over copy's.
fn block(
    s: &mut String,
    t: &TopologyResult,
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
    let mut headers: Vec<String> = t.engines.clone();
    headers.extend(ratio_cols.iter().map(|e| format!("{e}/copy")));
    let values: Vec<Vec<String>> = t
        .sizes
        .iter()
        .map(|&size| {
            let mut row: Vec<String> = t
                .engines
                .iter()
                .map(|e| {
                    t.cell(e, size)
                        .and_then(&value)
                        .unwrap_or_else(|| "n/a".into())
                })
                .collect();
            row.extend(ratio_cols.iter().map(|e| ratio(t, e, "copy", size)));
            row
        })
        .collect();
    columns(s, &t.sizes, &headers, &values);
}

/// What `auto` chose at each size, and how it fared against the best single engine.
fn auto_block(s: &mut String, t: &TopologyResult) {
    let best = t.sizes.first().and_then(|&size| t.best_single(size));
    if !t.engines.iter().any(|e| e == "auto") || best.is_none() {
        return;
    }
    let _ = writeln!(
        s,
        "  auto: what it chose, and its throughput over the best single engine's (issue 9 asks >= 0.95x)"
    );
    let headers: Vec<String> = ["auto chose", "best single", "auto/best"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    let values: Vec<Vec<String>> = t
        .sizes
        .iter()
        .map(|&size| {
            vec![
                t.cell("auto", size)
                    .and_then(|c| c.chosen.clone())
                    .unwrap_or_else(|| "n/a".into()),
                t.best_single(size)
                    .map_or_else(|| "n/a".into(), |(e, _)| e.to_string()),
                t.auto_ratio(size)
                    .map_or_else(|| "n/a".into(), |r| format!("{r:.2}x")),
            ]
        })
        .collect();
    columns(s, &t.sizes, &headers, &values);
}

/// zerotx's throughput over each baseline's that ran beside it.
fn baseline_block(s: &mut String, t: &TopologyResult) {
    let pairs = t.baseline_pairs();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "  zerotx / baseline, throughput: median of the repetitions' side-by-side ratios \
         [95% interval]"
    );
    let headers: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}/{b}")).collect();
    let values: Vec<Vec<String>> = t
        .sizes
        .iter()
        .map(|&size| {
            pairs
                .iter()
                .map(|(a, b)| paired(t.paired(a, b, size)))
                .collect()
        })
        .collect();
    columns(s, &t.sizes, &headers, &values);
}

fn ok(c: &Cell) -> Option<&Cell> {
    (c.error.is_none() && !c.runs.is_empty()).then_some(c)
}

/// Renders every topology.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "zerotx bench: {}", r.conditions());
    for t in &r.topologies {
        let _ = writeln!(s, "\n{}: {}", t.name, t.description);
        if let Some(why) = &t.skipped {
            let _ = writeln!(s, "  skipped: {why}");
            continue;
        }
        if let Some(l) = &t.left_out {
            let sizes: Vec<String> = l.sizes.iter().map(|&z| size_label(z)).collect();
            let _ = writeln!(s, "  left out: {} ({})", sizes.join(", "), l.reason());
        }
        block(
            &mut s,
            t,
            "throughput, MB/s (median)",
            |c| ok(c).map(|c| num(c.mb_s.median)),
            true,
        );
        auto_block(&mut s, t);
        baseline_block(&mut s, t);
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
            "release latency p50/p99, us (median; one release in 61 sampled)",
            |c| {
                ok(c).map(|c| match (c.p50_us, c.p99_us) {
                    (Some(p50), Some(p99)) => format!("{}/{}", num(p50), num(p99)),
                    _ => "-".into(),
                })
            },
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
    use crate::bench::result::Run;
    use crate::export::sample;

    #[test]
    fn table_layout() {
        insta::assert_snapshot!(render(&sample::report()));
    }

    #[test]
    fn auto_gets_what_it_chose_and_its_ratio_to_the_best() {
        let out = render(&sample::with_auto());
        assert!(out.contains("uring (route copies)"), "{out}");
        assert!(out.contains("0.99x"), "{out}");
        insta::assert_snapshot!(out);
    }

    /// The table's first line: the run's conditions.
    fn header_of(r: &Report) -> String {
        render(r).lines().next().unwrap().to_owned()
    }

    #[test]
    fn a_ring_on_huge_pages_says_so_in_the_header() {
        let mut r = sample::report();
        assert!(!render(&r).contains("huge pages"));
        r.huge_pages = true;
        let header = header_of(&r);
        assert!(
            header.ends_with("buffer ring 32 MiB on huge pages (small pages where registered)"),
            "{header}"
        );
    }

    #[test]
    fn another_order_seed_or_batch_says_so_in_the_header() {
        let mut r = sample::report();
        assert!(!render(&r).contains("seed"));
        r.seed = 7;
        let header = header_of(&r);
        assert!(
            header.ends_with("buffer ring 32 MiB, order seed 7"),
            "{header}"
        );
        assert!(!header.contains("batches"), "{header}");
        r.batch = 64;
        let header = header_of(&r);
        assert!(
            header.ends_with("buffer ring 32 MiB, batches of 64, order seed 7"),
            "{header}"
        );
    }

    #[test]
    fn baselines_get_a_ratio_block() {
        insta::assert_snapshot!(render(&sample::with_baselines()));
    }

    #[test]
    fn repetitions_give_the_baseline_ratio_an_interval() {
        let mut r = sample::with_baselines();
        r.repeat = 6;
        // Repetition i: raw-msg-zc at 16000 MB/s drifting up 8% a repetition, msg-zc at
        // 0.90 + 0.02 i of it. The drift cancels pair by pair; a ratio of medians would not see it.
        for c in &mut r.topologies[0].cells {
            let base = c.runs[0].clone();
            c.runs = (0..6)
                .map(|i| {
                    let own = match c.engine.as_str() {
                        "msg-zc" => 0.90 + 0.02 * i as f64,
                        _ => 1.0,
                    };
                    let mb = 16000.0 * (1.0 + 0.08 * i as f64) * own;
                    Run {
                        bytes: (mb * 1e6) as u64,
                        ..base.clone()
                    }
                })
                .collect();
        }
        let out = render(&r);
        // The median of 0.90..1.00 is 0.95; for 6 pairs the interval is the smallest and largest.
        assert!(out.contains("0.950x [0.900, 1.000]"), "{out}");
    }
}
