//! Exporters: each renders the one [`Report`] type in one format, behind one [`Exporter`] trait,
//! one file per format (hyperfine's layout): `table` for people, `markdown`, `csv`, `json`, and
//! `svg` (the plot).

pub mod csv;
pub mod json;
pub mod markdown;
pub mod svg;
pub mod table;

use std::path::Path;

use anyhow::Context;

use crate::bench::result::Report;

/// Renders a report.
pub trait Exporter {
    /// The report as the bytes of a file (or of standard output).
    fn render(&self, report: &Report) -> anyhow::Result<Vec<u8>>;
}

/// The formats, as the flags name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The table for people (the default on standard output).
    Table,
    /// The whole report, every run included.
    Json,
    /// One row per cell.
    Csv,
    /// Markdown tables, for issues and READMEs.
    Markdown,
    /// Throughput against size, one panel per topology.
    Svg,
}

impl Format {
    /// The flag that writes this format to a file.
    pub fn flag(self) -> &'static str {
        match self {
            Format::Table => "the table",
            Format::Json => "--export-json",
            Format::Csv => "--export-csv",
            Format::Markdown => "--export-markdown",
            Format::Svg => "--plot",
        }
    }

    /// The exporter for this format.
    pub fn exporter(self) -> Box<dyn Exporter> {
        match self {
            Format::Table => Box::new(table::Table),
            Format::Json => Box::new(json::Json),
            Format::Csv => Box::new(csv::Csv),
            Format::Markdown => Box::new(markdown::Markdown),
            Format::Svg => Box::new(svg::Svg),
        }
    }
}

/// Writes `report` in `format` to standard output.
pub fn print(report: &Report, format: Format) -> anyhow::Result<()> {
    let bytes = format.exporter().render(report)?;
    crate::stdout::write_bytes(&bytes);
    Ok(())
}

/// Writes `report` in `format` to `path`.
pub fn write(report: &Report, format: Format, path: &Path) -> anyhow::Result<()> {
    let bytes = format
        .exporter()
        .render(report)
        .with_context(|| format!("rendering {format:?} for {}", path.display()))?;
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Whether `path` can be written, checked by opening it for writing (the way the export will),
/// before a run: creates the file if missing and removes it again, changes nothing else.
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    if !existed {
        std::fs::remove_file(path)
            .with_context(|| format!("removing the trial file {}", path.display()))?;
    }
    Ok(())
}

/// `65536` -> `64K`, `1048576` -> `1M`, `1400` -> `1400`.
pub fn size_label(size: usize) -> String {
    if size >= 1 << 20 && size % (1 << 20) == 0 {
        format!("{}M", size >> 20)
    } else if size >= 1024 && size % 1024 == 0 {
        format!("{}K", size >> 10)
    } else {
        size.to_string()
    }
}

/// A figure with about three significant digits.
pub fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Made-up reports with fixed figures, for the exporters' tests: the layout is what is under
/// test.
#[cfg(test)]
pub mod sample {
    use crate::bench::result::{Cell, Report, Run, TopologyResult};

    fn run(mb: f64, zc: u64, kc: u64, ec: u64) -> Run {
        Run {
            bytes: (mb * 1e6) as u64,
            sends: 1000,
            seconds: 1.0,
            cpu_seconds: mb / 2000.0,
            zerocopy: zc,
            kernel_copied: kc,
            engine_copied: ec,
            fallbacks: 0,
            enobufs: 0,
            policy_copied: 0,
            chosen: None,
            p50_us: Some(10.0),
            p99_us: Some(99.5),
        }
    }

    fn cell(e: &str, size: usize, r: Run) -> Cell {
        Cell::summarise(e, size, vec![r], None)
    }

    fn header(topologies: Vec<TopologyResult>) -> Report {
        Report {
            version: "0.1.0".into(),
            kernel: "6.18.0".into(),
            host: "testhost".into(),
            started: 1_795_757_400,
            cpus: 2,
            run_seconds: 0.6,
            repeat: 1,
            ring_bytes: 32 << 20,
            huge_pages: false,
            seed: 0,
            batch: 32,
            topologies,
        }
    }

    /// Two engines, one failed cell, one skipped topology.
    pub fn report() -> Report {
        header(vec![
            TopologyResult {
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
                left_out: None,
            },
            TopologyResult {
                name: "vsock".into(),
                description: "AF_VSOCK".into(),
                skipped: Some("no vsock transport".into()),
                ..TopologyResult::default()
            },
        ])
    }

    /// `auto` beside the single engines, copying on a route that copies.
    pub fn with_auto() -> Report {
        let mut auto = run(790.0, 3, 2, 0);
        auto.policy_copied = 995;
        auto.chosen = Some("uring (route copies)".into());
        header(vec![TopologyResult {
            name: "tcp-loopback".into(),
            description: "TCP over loopback".into(),
            skipped: None,
            sizes: vec![1400],
            engines: ["auto", "copy", "uring", "uring-zc"]
                .map(String::from)
                .to_vec(),
            cells: vec![
                cell("auto", 1400, auto),
                cell("copy", 1400, run(600.0, 0, 0, 1000)),
                cell("uring", 1400, run(800.0, 0, 0, 1000)),
                cell("uring-zc", 1400, run(350.0, 0, 1000, 0)),
            ],
            left_out: None,
        }])
    }

    /// A carrier topology with `--trains`: per-datagram copy and msg-zc, zerotx's train columns
    /// (io_uring's refusing trains, `train-auto` close behind the best) and the raw train loops.
    pub fn with_trains() -> Report {
        let refused = "the engine refuses trains: the io_uring engines do not send trains yet";
        let mut cells = Vec::new();
        // A train's CPU: 0.05 s per GB, a tenth of per-datagram copy's.
        let train_run = |mb: f64, zc, ec| Run {
            cpu_seconds: mb / 20000.0,
            ..run(mb, zc, 0, ec)
        };
        for (size, copy, train) in [(1200, 650.0, 15000.0), (1472, 700.0, 19000.0)] {
            let mut auto = train_run(train * 0.97, 1000, 0);
            auto.chosen = Some("msg-zc".into());
            cells.extend([
                cell("copy", size, run(copy, 0, 0, 1000)),
                cell("msg-zc", size, run(copy * 0.8, 1000, 0, 0)),
                cell("train-auto", size, auto),
                cell("train-copy", size, train_run(train * 0.85, 0, 1000)),
                cell("train-msg-zc", size, train_run(train, 1000, 0)),
                Cell::summarise("train-uring", size, vec![], Some(refused.into())),
                cell("raw-train-copy", size, train_run(train * 0.86, 0, 1000)),
                cell("raw-train-msg-zc", size, train_run(train * 1.02, 1000, 0)),
            ]);
        }
        header(vec![TopologyResult {
            name: "udp-carrier".into(),
            description: "UDP into a black hole with carrier".into(),
            skipped: None,
            sizes: vec![1200, 1472],
            engines: [
                "copy",
                "msg-zc",
                "train-auto",
                "train-copy",
                "train-msg-zc",
                "train-uring",
                "raw-train-copy",
                "raw-train-msg-zc",
            ]
            .map(String::from)
            .to_vec(),
            cells,
            left_out: None,
        }])
    }

    /// compare-raw's UDP columns: the zerotx engines, then what `--baselines --liburing` adds.
    pub const COMPARE_RAW_UDP: [&str; 7] = [
        "copy",
        "msg-zc",
        "uring-zc-fixed",
        "raw-copy",
        "raw-msg-zc",
        "raw-uring-zc-fixed",
        "liburing-zc-fixed",
    ];

    /// zerotx engines beside their baselines, liburing's without latency figures.
    pub fn with_baselines() -> Report {
        let mut lib = run(30000.0, 0, 0, 0);
        (lib.p50_us, lib.p99_us) = (None, None);
        header(vec![TopologyResult {
            name: "udp-blackhole".into(),
            description: "UDP into a black hole".into(),
            skipped: None,
            sizes: vec![65000],
            engines: COMPARE_RAW_UDP.map(String::from).to_vec(),
            cells: vec![
                cell("copy", 65000, run(6000.0, 0, 0, 1000)),
                cell("msg-zc", 65000, run(14000.0, 1000, 0, 0)),
                cell("uring-zc-fixed", 65000, run(32000.0, 1000, 0, 0)),
                cell("raw-copy", 65000, run(6200.0, 0, 0, 1000)),
                cell("raw-msg-zc", 65000, run(16000.0, 1000, 0, 0)),
                cell("raw-uring-zc-fixed", 65000, run(33000.0, 1000, 0, 0)),
                cell("liburing-zc-fixed", 65000, lib),
            ],
            left_out: None,
        }])
    }
}
