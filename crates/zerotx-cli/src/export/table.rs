//! The table for people, in the style of the kernel's own benchmark tables: per topology, one row
//! per size and one column per engine (each figure the median of the repetitions and their range),
//! then each engine's throughput over copy's, and zerotx/baseline ratios when baselines ran; then
//! the verdict in plain words, and where the other outputs are.

use std::fmt::Write as _;

use super::{num, size_label, Exporter};
use crate::bench::result::{Cell, Paired, Report, Spread, TopologyResult};
use crate::bench::verdict::{self, TrainAt, Verdict, ZeroCopy, AUTO_TARGET};

/// zerotx's engines that get a ratio against `copy`.
const ZC_ENGINES: [&str; 5] = ["auto", "msg-zc", "uring-zc", "uring-zc-fixed", "uring"];

/// The train columns, zerotx's and the raw loops, which get a ratio against `copy` too: what a
/// train pays over one call per datagram.
const TRAIN_ENGINES: [&str; 8] = [
    "train-auto",
    "train-copy",
    "train-msg-zc",
    "train-uring",
    "train-uring-zc",
    "train-uring-zc-fixed",
    "raw-train-copy",
    "raw-train-msg-zc",
];

/// How a figure over several runs reads: `median [min-max]`; one run: the figure alone.
fn spread(s: Spread, runs: usize) -> String {
    if runs > 1 {
        format!("{} [{}-{}]", num(s.median), num(s.min), num(s.max))
    } else {
        num(s.median)
    }
}

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

/// One figure per engine, and with `ratios` each zero-copy engine's and train loop's throughput
/// over copy's.
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
            .chain(&TRAIN_ENGINES)
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

/// `auto` and the columns it is judged against: per datagram, or in trains.
struct AutoColumn {
    name: &'static str,
    best: fn(&TopologyResult, usize) -> Option<(&str, f64)>,
    ratio: fn(&TopologyResult, usize) -> Option<f64>,
    against: &'static str,
}

const AUTO: AutoColumn = AutoColumn {
    name: "auto",
    best: TopologyResult::best_single,
    ratio: TopologyResult::auto_ratio,
    against: "the fastest single engine's",
};

const TRAIN_AUTO: AutoColumn = AutoColumn {
    name: "train-auto",
    best: TopologyResult::best_train,
    ratio: TopologyResult::train_auto_ratio,
    against: "the fastest other train column's",
};

/// What `auto` (`a`) chose at each size, and how it fared against the best engine it is judged
/// against.
fn auto_block(s: &mut String, t: &TopologyResult, a: &AutoColumn) {
    let best = t.sizes.first().and_then(|&size| (a.best)(t, size));
    if !t.engines.iter().any(|e| e == a.name) || best.is_none() {
        return;
    }
    let _ = writeln!(
        s,
        "  {}: what it chose, and its throughput over {} (target: {AUTO_TARGET:.2}x or more; ! \
         marks a miss)",
        a.name, a.against
    );
    let headers: Vec<String> = if a.name == "auto" {
        ["auto chose", "best single", "auto/best"]
            .iter()
            .map(|h| h.to_string())
            .collect()
    } else {
        [
            format!("{} chose", a.name),
            "best train".into(),
            format!("{}/best", a.name),
        ]
        .to_vec()
    };
    let values: Vec<Vec<String>> = t
        .sizes
        .iter()
        .map(|&size| {
            vec![
                t.cell(a.name, size)
                    .and_then(|c| c.chosen.clone())
                    .unwrap_or_else(|| "n/a".into()),
                (a.best)(t, size).map_or_else(|| "n/a".into(), |(e, _)| e.to_string()),
                (a.ratio)(t, size).map_or_else(
                    || "n/a".into(),
                    |r| {
                        let miss = if verdict::auto_misses(r) { " !" } else { "" };
                        format!("{r:.2}x{miss}")
                    },
                ),
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
            "throughput, MB/s (median [min-max] of the runs)",
            |c| ok(c).map(|c| spread(c.mb_s, c.runs.len())),
            true,
        );
        auto_block(&mut s, t, &AUTO);
        auto_block(&mut s, t, &TRAIN_AUTO);
        baseline_block(&mut s, t);
        block(
            &mut s,
            t,
            "sends per second, thousands (median [min-max])",
            |c| {
                ok(c).map(|c| {
                    let v = c.sends_s_spread();
                    let k = Spread {
                        median: v.median / 1000.0,
                        min: v.min / 1000.0,
                        max: v.max / 1000.0,
                    };
                    spread(k, c.runs.len())
                })
            },
            false,
        );
        block(
            &mut s,
            t,
            "sender CPU, seconds per GB (median [min-max])",
            |c| ok(c).map(|c| spread(c.cpu_s_per_gb_spread(), c.runs.len())),
            false,
        );
        block(
            &mut s,
            t,
            "sent zero-copy, share of the buffers the kernel sent from your memory (copy engines: -)",
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
            "time until the kernel hands a buffer back, p50/p99, us (median of the runs; one \
             buffer in 61 sampled)",
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
    let verdicts: Vec<Verdict> = r.topologies.iter().filter_map(verdict::of).collect();
    if !verdicts.is_empty() {
        let _ = writeln!(s, "\nverdict, for this host at the sizes measured:");
        for v in &verdicts {
            verdict_lines(&mut s, v);
        }
    }
    let _ = writeln!(
        s,
        "\nThe same as a picture: --plot FILE.svg; as files: --export-json, --export-csv or \
         --export-markdown FILE."
    );
    s
}

/// Where zerotx's trains pay over one `copy` send per datagram, and how `train-auto` kept up.
fn train_lines(s: &mut String, v: &Verdict) {
    let at = |t: &TrainAt| {
        format!(
            "{} {:.2}x at {} ({} s of CPU per GB, copy {})",
            t.engine,
            t.ratio,
            size_label(t.size),
            num(t.cpu_s_per_gb),
            num(t.copy_cpu_s_per_gb)
        )
    };
    let (pay, not): (Vec<&TrainAt>, Vec<&TrainAt>) = v.trains.iter().partition(|t| t.pays());
    if !pay.is_empty() {
        let list: Vec<String> = pay.iter().map(|t| at(t)).collect();
        let _ = writeln!(
            s,
            "    trains pay over one copy send per datagram: {}",
            list.join(", ")
        );
    }
    if !not.is_empty() {
        let list: Vec<String> = not.iter().map(|t| at(t)).collect();
        let _ = writeln!(
            s,
            "    trains do not pay over one copy send per datagram at {}",
            list.join(", ")
        );
    }
    if !v.train_auto_misses.is_empty() {
        let at: Vec<String> = v
            .train_auto_misses
            .iter()
            .map(|(size, r, best)| format!("{} ({r:.2}x of {best})", size_label(*size)))
            .collect();
        let _ = writeln!(
            s,
            "    train-auto fell short of the fastest train column at {}",
            at.join(", ")
        );
    }
}

fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// One topology's verdict, in sentences.
pub fn verdict_lines(s: &mut String, v: &Verdict) {
    let t = &v.topology;
    match (&v.use_engine, v.auto_misses.as_slice()) {
        (None, _) => {
            let _ = writeln!(
                s,
                "  {t}: no engine ran without error; see the errors above"
            );
        }
        (Some(e), []) if e == "auto" => {
            let _ = writeln!(
                s,
                "  {t}: use auto (the default): it kept within {:.0}% of the fastest single \
                 engine at every size",
                (1.0 - AUTO_TARGET) * 100.0
            );
        }
        (Some(e), misses) if e == "auto" => {
            let at: Vec<String> = misses
                .iter()
                .map(|(size, r, best)| format!("{} ({r:.2}x of {best})", size_label(*size)))
                .collect();
            let _ = writeln!(
                s,
                "  {t}: use auto (the default), though it fell short of the fastest single \
                 engine at {}: for sends of that size alone, that engine is faster here",
                at.join(", ")
            );
        }
        (Some(e), _) => {
            let _ = writeln!(
                s,
                "  {t}: use {e}, the fastest at most sizes (auto, the default, was not measured)"
            );
        }
    }
    train_lines(s, v);
    match &v.zero_copy {
        ZeroCopy::Pays(p) => {
            let largest = if p.largest.0 == p.size {
                String::new()
            } else {
                format!(", {:.2}x at {}", p.largest.1, size_label(p.largest.0))
            };
            let _ = writeln!(
                s,
                "    zero-copy pays from {} on: {} moves {:.2}x copy's throughput there{largest}",
                size_label(p.size),
                p.engine,
                p.ratio
            );
        }
        ZeroCopy::Never {
            size,
            engine,
            ratio,
        } => {
            let _ = writeln!(
                s,
                "    zero-copy does not pay at the sizes measured: at best {engine} moved \
                 {ratio:.2}x copy's throughput (at {})",
                size_label(*size)
            );
        }
        ZeroCopy::NotCompared => {
            let _ = writeln!(
                s,
                "    zero-copy was not compared with copy (give --engines with copy and a \
                 zero-copy engine)"
            );
        }
    }
    match v.kernel_copied {
        Some(share) if share > 0.0 => {
            let _ = writeln!(
                s,
                "    the kernel copied {} of the zero-copy sends: {}",
                pct(share),
                verdict::why_copied(t)
            );
        }
        Some(_) => {
            let _ = writeln!(
                s,
                "    the kernel copied none of the zero-copy sends: each went out from your memory"
            );
        }
        None => {}
    }
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
    fn every_figure_shows_its_range_and_an_auto_miss_is_marked() {
        let mut r = sample::with_auto();
        r.repeat = 3;
        // Three runs per cell at 0.9, 1.0 and 1.1 times the sample's figure; auto's at 0.8 of
        // its figure, under its target.
        for c in &mut r.topologies[0].cells {
            let base = c.runs[0].clone();
            let own = if c.engine == "auto" { 0.8 } else { 1.0 };
            let runs = [0.9, 1.0, 1.1]
                .iter()
                .map(|f| Run {
                    bytes: (base.bytes as f64 * f * own) as u64,
                    cpu_seconds: base.cpu_seconds * f,
                    ..base.clone()
                })
                .collect();
            *c = Cell::summarise(&c.engine, c.size, runs, None);
        }
        let out = render(&r);
        assert!(out.contains("600 [540-660]"), "{out}");
        assert!(out.contains("0.79x !"), "{out}");
        assert!(
            out.contains("fell short of the fastest single engine at 1400 (0.79x of uring)"),
            "{out}"
        );
        insta::assert_snapshot!(out);
    }

    #[test]
    fn trains_get_ratios_to_copy_and_their_raw_loops_and_a_refusal_is_na() {
        let out = render(&sample::with_trains());
        // Each train column over per-datagram copy, and over the raw loop of its kind.
        for header in [
            "train-msg-zc/copy",
            "train-copy/raw-train-copy",
            "train-msg-zc/raw-train-msg-zc",
            "train-auto/raw-train-msg-zc",
            "train-uring/raw-train-copy",
        ] {
            assert!(out.contains(header), "no {header}: {out}");
        }
        assert!(
            out.contains("27.14x"),
            "train-msg-zc over copy at 1472: {out}"
        );
        // The refusing column: n/a, and why, never a zero.
        assert!(
            out.contains("error: train-uring 1200: the engine refuses trains"),
            "{out}"
        );
        assert!(
            out.contains("train-auto: what it chose, and its throughput over the fastest other"),
            "{out}"
        );
        assert!(
            out.contains(
                "trains pay over one copy send per datagram: train-msg-zc 23.08x at 1200 (0.05 s \
                 of CPU per GB, copy 0.50)"
            ),
            "{out}"
        );
        insta::assert_snapshot!(out);
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
