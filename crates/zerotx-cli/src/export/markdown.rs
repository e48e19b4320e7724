//! Markdown, like hyperfine's `--export-markdown`: per topology a heading, the throughput table
//! (median, with the range over repetitions), and the ratio tables, ready to paste into an issue.

use std::fmt::Write as _;

use super::{num, size_label, Exporter};
use crate::bench::result::{Report, TopologyResult};

/// GitHub-flavoured Markdown tables.
pub struct Markdown;

impl Exporter for Markdown {
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>> {
        Ok(render(report).into_bytes())
    }
}

fn table(s: &mut String, headers: &[String], rows: &[Vec<String>]) {
    let _ = writeln!(s, "| {} |", headers.join(" | "));
    let _ = writeln!(
        s,
        "|{}",
        ":---|".to_string() + &"---:|".repeat(headers.len() - 1)
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    let _ = writeln!(s);
}

/// A ratio table: of medians, or with `paired` the median of the repetitions' side-by-side
/// ratios and its 95% interval (zerotx over a baseline).
fn ratios(s: &mut String, t: &TopologyResult, pairs: &[(&str, &str)], paired: bool) {
    if pairs.is_empty() {
        return;
    }
    if paired {
        let _ = writeln!(
            s,
            "zerotx / baseline: median of the repetitions' side-by-side ratios [95% interval]\n"
        );
    }
    let mut headers = vec!["size".to_string()];
    headers.extend(pairs.iter().map(|(a, b)| format!("{a} / {b}")));
    let rows: Vec<Vec<String>> = t
        .sizes
        .iter()
        .map(|&size| {
            let mut row = vec![size_label(size)];
            row.extend(pairs.iter().map(|(a, b)| {
                if paired {
                    return super::table::paired(t.paired(a, b, size));
                }
                t.ratio(a, b, size)
                    .map_or_else(|| "n/a".into(), |r| format!("{r:.2}"))
            }));
            row
        })
        .collect();
    table(s, &headers, &rows);
}

fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "zerotx bench {}: {}\n", r.version, r.conditions());
    for t in &r.topologies {
        let _ = writeln!(s, "### {}\n\n{}\n", t.name, t.description);
        if let Some(why) = &t.skipped {
            let _ = writeln!(s, "_Skipped: {why}_\n");
            continue;
        }
        if let Some(l) = &t.left_out {
            let sizes: Vec<String> = l.sizes.iter().map(|&z| size_label(z)).collect();
            let _ = writeln!(s, "_Left out: {} ({})_\n", sizes.join(", "), l.reason());
        }
        let mut headers = vec!["size".to_string()];
        headers.extend(t.engines.iter().map(|e| format!("{e} [MB/s]")));
        let rows: Vec<Vec<String>> = t
            .sizes
            .iter()
            .map(|&size| {
                let mut row = vec![size_label(size)];
                row.extend(t.engines.iter().map(|e| match t.cell(e, size) {
                    Some(c) if c.error.is_none() && !c.runs.is_empty() => {
                        let m = &c.mb_s;
                        if c.runs.len() > 1 {
                            format!("{} ({}…{})", num(m.median), num(m.min), num(m.max))
                        } else {
                            num(m.median)
                        }
                    }
                    _ => "n/a".into(),
                }));
                row
            })
            .collect();
        table(&mut s, &headers, &rows);
        let has = |e: &str| t.engines.iter().any(|x| x == e);
        let vs_copy: Vec<(&str, &str)> = ["msg-zc", "uring", "uring-zc", "uring-zc-fixed"]
            .into_iter()
            .filter(|e| has("copy") && has(e))
            .map(|e| (e, "copy"))
            .collect();
        ratios(&mut s, t, &vs_copy, false);
        ratios(&mut s, t, &t.baseline_pairs(), true);
        let errors: Vec<_> = t.cells.iter().filter(|c| c.error.is_some()).collect();
        for c in &errors {
            let _ = writeln!(
                s,
                "- error: {} {}: {}",
                c.engine,
                size_label(c.size),
                c.error.as_deref().unwrap_or_default()
            );
        }
        if !errors.is_empty() {
            let _ = writeln!(s);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample;

    #[test]
    fn markdown_layout() {
        insta::assert_snapshot!(render(&sample::report()));
    }

    #[test]
    fn markdown_with_baselines() {
        insta::assert_snapshot!(render(&sample::with_baselines()));
    }
}
