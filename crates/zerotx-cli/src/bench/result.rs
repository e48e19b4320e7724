//! The benchmark's one result type, which every exporter reads.

use serde::Serialize;

use super::settings::DEFAULT_BATCH;
use super::Engine;

/// Each zerotx engine and the minimal sender it is judged against (issue 8's acceptance); each
/// of zerotx's train columns and the raw train loop that makes the same kind of send (a copy
/// train, or a zero-copy one).
pub const BASELINE_PAIRS: [(&str, &str); 10] = [
    ("copy", "raw-copy"),
    ("msg-zc", "raw-msg-zc"),
    ("uring-zc-fixed", "raw-uring-zc-fixed"),
    ("uring-zc-fixed", "liburing-zc-fixed"),
    ("train-copy", "raw-train-copy"),
    ("train-uring", "raw-train-copy"),
    ("train-msg-zc", "raw-train-msg-zc"),
    ("train-uring-zc", "raw-train-msg-zc"),
    ("train-uring-zc-fixed", "raw-train-msg-zc"),
    ("train-auto", "raw-train-msg-zc"),
];

/// One timed run of one cell.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Run {
    /// Bytes the kernel accepted.
    pub bytes: u64,
    /// Buffers sent.
    pub sends: u64,
    /// Wall time, send start to last release.
    pub seconds: f64,
    /// Sender CPU seconds (process CPU minus the sink's).
    pub cpu_seconds: f64,
    /// Buffers released as sent zero-copy.
    pub zerocopy: u64,
    /// Buffers released as copied by the kernel.
    pub kernel_copied: u64,
    /// Buffers released as copied by a copy engine.
    pub engine_copied: u64,
    /// Buffers sent by copy after ENOBUFS.
    pub fallbacks: u64,
    /// ENOBUFS answers.
    pub enobufs: u64,
    /// `auto`: buffers its policy sent by copy.
    #[serde(default)]
    pub policy_copied: u64,
    /// `auto`: how it sent, in a few words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chosen: Option<String>,
    /// Release latency (send to release), 50th percentile of the sampled releases,
    /// microseconds; `None` when the engine reports none (an outside program).
    pub p50_us: Option<f64>,
    /// 99th percentile, microseconds.
    pub p99_us: Option<f64>,
}

impl Run {
    /// Throughput, MB/s (10^6 bytes).
    pub fn mb_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e6
        } else {
            0.0
        }
    }
}

/// Median and range over repetitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `values` (median of an even count: mean of the middle two). Empty: zeros.
    pub fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Self {
            median,
            min: values[0],
            max: values[n - 1],
        }
    }
}

/// One engine over another from runs made side by side: repetition `r` of both cells ran back to
/// back (see the scheduler), so each repetition gives one ratio, and drift that lasts longer than
/// a pair of runs (another tenant, the host's clock) cancels in it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Paired {
    /// Median of the per-repetition ratios.
    pub median: f64,
    /// A 95% confidence interval for that median, from order statistics (the sign test's: no
    /// assumption about how the ratios spread); `None` below 6 pairs, where none exists.
    pub interval: Option<(f64, f64)>,
    /// Repetitions both cells have.
    pub pairs: usize,
}

impl Paired {
    /// Of the ratios `values` (any order). `None` if empty.
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let k = order_statistic_95(n);
        let interval = (k > 0).then(|| (values[k - 1], values[n - k]));
        Some(Self {
            median: Spread::of(values).median,
            interval,
            pairs: n,
        })
    }
}

/// The largest `k` whose order statistics `x(k)`, `x(n+1-k)` (1-based) bound the median with at
/// least 95% confidence: `P(Binomial(n, 1/2) < k) <= 2.5%`. 0 when no such `k` exists (n < 6).
fn order_statistic_95(n: usize) -> usize {
    // The binomial's probabilities, in logs so that 2^-n does not underflow for large n.
    let ln_half_n = n as f64 * 0.5f64.ln();
    let mut ln_choose = 0.0; // ln C(n, i)
    let mut below = 0.0; // P(B < i)
    for i in 0..n / 2 {
        below += (ln_choose + ln_half_n).exp();
        if below > 0.025 {
            return i;
        }
        ln_choose += ((n - i) as f64 / (i + 1) as f64).ln();
    }
    n / 2
}

/// One engine at one size in one topology, over every repetition.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cell {
    /// Engine name (`copy`, `msg-zc`, ..., `raw-copy`, ..., `liburing-zc-fixed`).
    pub engine: String,
    /// Bytes per send.
    pub size: usize,
    /// Throughput, MB/s.
    pub mb_s: Spread,
    /// Sends per second (median).
    pub sends_s: f64,
    /// Sender CPU seconds per GB sent (median).
    pub cpu_s_per_gb: f64,
    /// Release latency p50, microseconds (median over runs that sampled any).
    pub p50_us: Option<f64>,
    /// Release latency p99, microseconds (median over runs that sampled any).
    pub p99_us: Option<f64>,
    /// Totals over runs.
    pub zerocopy: u64,
    /// Totals over runs.
    pub kernel_copied: u64,
    /// Totals over runs.
    pub engine_copied: u64,
    /// Totals over runs.
    pub fallbacks: u64,
    /// Totals over runs.
    pub enobufs: u64,
    /// Totals over runs.
    pub policy_copied: u64,
    /// `auto`: how it sent in most runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chosen: Option<String>,
    /// Every run.
    pub runs: Vec<Run>,
    /// Why the cell has no figures (engine unavailable, send failed...).
    pub error: Option<String>,
}

impl Cell {
    /// Summarises `runs` (and an error, if a run failed).
    pub fn summarise(engine: &str, size: usize, runs: Vec<Run>, error: Option<String>) -> Self {
        let med = |f: &dyn Fn(&Run) -> f64| Spread::of(runs.iter().map(f).collect()).median;
        let sum = |f: &dyn Fn(&Run) -> u64| runs.iter().map(f).sum();
        let med_opt = |f: &dyn Fn(&Run) -> Option<f64>| {
            let v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| Spread::of(v).median)
        };
        Self {
            engine: engine.to_string(),
            size,
            mb_s: Spread::of(runs.iter().map(Run::mb_s).collect()),
            sends_s: med(&|r| r.sends as f64 / r.seconds.max(1e-9)),
            cpu_s_per_gb: med(&|r| r.cpu_seconds / (r.bytes as f64 / 1e9).max(1e-12)),
            p50_us: med_opt(&|r| r.p50_us),
            p99_us: med_opt(&|r| r.p99_us),
            zerocopy: sum(&|r| r.zerocopy),
            kernel_copied: sum(&|r| r.kernel_copied),
            engine_copied: sum(&|r| r.engine_copied),
            fallbacks: sum(&|r| r.fallbacks),
            enobufs: sum(&|r| r.enobufs),
            policy_copied: sum(&|r| r.policy_copied),
            chosen: most_common(runs.iter().filter_map(|r| r.chosen.clone())),
            runs,
            error,
        }
    }

    /// Sends per second over the runs.
    pub fn sends_s_spread(&self) -> Spread {
        Spread::of(
            self.runs
                .iter()
                .map(|r| r.sends as f64 / r.seconds.max(1e-9))
                .collect(),
        )
    }

    /// Sender CPU seconds per GB over the runs.
    pub fn cpu_s_per_gb_spread(&self) -> Spread {
        Spread::of(
            self.runs
                .iter()
                .map(|r| r.cpu_seconds / (r.bytes as f64 / 1e9).max(1e-12))
                .collect(),
        )
    }

    /// Share of zero-copy-engine releases the kernel really sent zero-copy, if any were made.
    pub fn zerocopy_share(&self) -> Option<f64> {
        let total = self.zerocopy + self.kernel_copied + self.fallbacks + self.policy_copied;
        (total > 0).then(|| self.zerocopy as f64 / total as f64)
    }
}

/// The value seen most often (the first of equals).
fn most_common(values: impl Iterator<Item = String>) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for v in values {
        match counts.iter_mut().find(|(x, _)| *x == v) {
            Some(c) => c.1 += 1,
            None => counts.push((v, 1)),
        }
    }
    let best = counts.iter().map(|c| c.1).max()?;
    counts.into_iter().find(|c| c.1 == best).map(|c| c.0)
}

/// One topology's results.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TopologyResult {
    /// `tcp-loopback`, `udp-blackhole`, `vsock`.
    pub name: String,
    /// What the topology is, in a few words.
    pub description: String,
    /// Why it did not run, if it did not.
    pub skipped: Option<String>,
    /// Sizes, in table order.
    pub sizes: Vec<usize>,
    /// Engines, in column order.
    pub engines: Vec<String>,
    /// Every (engine, size) cell.
    pub cells: Vec<Cell>,
    /// Sizes asked for that this topology cannot send at once, so not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_out: Option<LeftOut>,
}

/// Sizes a topology left out: larger than its largest send (a UDP datagram's payload).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LeftOut {
    /// The sizes, in order.
    pub sizes: Vec<usize>,
    /// The largest send the topology takes.
    pub max_size: usize,
}

impl LeftOut {
    /// Why a size was not run, in a few words (tables, CSV's error column).
    pub fn reason(&self) -> String {
        format!(
            "larger than {} bytes, the most this topology sends at once",
            self.max_size
        )
    }
}

impl TopologyResult {
    /// The cell for `engine` at `size`.
    pub fn cell(&self, engine: &str, size: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.engine == engine && c.size == size)
    }

    /// Median throughput of a cell that ran without error.
    pub fn mb_s(&self, engine: &str, size: usize) -> Option<f64> {
        self.cell(engine, size)
            .filter(|c| c.error.is_none() && !c.runs.is_empty())
            .map(|c| c.mb_s.median)
    }

    /// `a`'s median throughput over `b`'s at `size`, when both ran.
    pub fn ratio(&self, a: &str, b: &str, size: usize) -> Option<f64> {
        match (self.mb_s(a, size), self.mb_s(b, size)) {
            (Some(x), Some(y)) if y > 0.0 => Some(x / y),
            _ => None,
        }
    }

    /// `a` over `b` at `size`, repetition by repetition ([`Paired`]); `None` unless both cells
    /// ran without error.
    pub fn paired(&self, a: &str, b: &str, size: usize) -> Option<Paired> {
        let runs = |e: &str| {
            self.cell(e, size)
                .filter(|c| c.error.is_none() && !c.runs.is_empty())
                .map(|c| &c.runs)
        };
        let (x, y) = (runs(a)?, runs(b)?);
        let ratios = x
            .iter()
            .zip(y)
            .filter(|(_, y)| y.mb_s() > 0.0)
            .map(|(x, y)| x.mb_s() / y.mb_s())
            .collect();
        Paired::of(ratios)
    }

    /// The fastest of zerotx's single engines (not `auto`) at `size`, and its throughput.
    pub fn best_single(&self, size: usize) -> Option<(&str, f64)> {
        self.fastest_of(&Engine::ZEROTX[1..], size)
    }

    /// The fastest of zerotx's train columns (not `train-auto`) at `size`, and its throughput.
    pub fn best_train(&self, size: usize) -> Option<(&str, f64)> {
        self.fastest_of(&Engine::ZEROTX_TRAINS[1..], size)
    }

    /// The fastest of `among` that ran here at `size`.
    fn fastest_of(&self, among: &[Engine], size: usize) -> Option<(&str, f64)> {
        self.engines
            .iter()
            .filter(|e| among.iter().any(|z| z.name() == e.as_str()))
            .filter_map(|e| Some((e.as_str(), self.mb_s(e, size)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// `auto`'s throughput over the best single engine's at `size`.
    pub fn auto_ratio(&self, size: usize) -> Option<f64> {
        let (_, best) = self.best_single(size)?;
        let auto = self.mb_s("auto", size)?;
        (best > 0.0).then(|| auto / best)
    }

    /// `train-auto`'s throughput over the best of zerotx's other train columns at `size`.
    pub fn train_auto_ratio(&self, size: usize) -> Option<f64> {
        let (_, best) = self.best_train(size)?;
        let auto = self.mb_s("train-auto", size)?;
        (best > 0.0).then(|| auto / best)
    }

    /// The (zerotx engine, baseline) pairs of [`BASELINE_PAIRS`] that both have a column here.
    pub fn baseline_pairs(&self) -> Vec<(&'static str, &'static str)> {
        let has = |e: &str| self.engines.iter().any(|x| x == e);
        BASELINE_PAIRS
            .iter()
            .copied()
            .filter(|(z, b)| has(z) && has(b))
            .collect()
    }
}

/// Everything `zerotx bench` measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// zerotx version.
    pub version: String,
    /// Kernel release.
    pub kernel: String,
    /// The host's name.
    pub host: String,
    /// When the run started, seconds since the Unix epoch.
    pub started: u64,
    /// Online CPUs.
    pub cpus: usize,
    /// Seconds per run.
    pub run_seconds: f64,
    /// Repetitions per cell.
    pub repeat: usize,
    /// Bytes of the buffer ring each run cycles through.
    pub ring_bytes: usize,
    /// The ring was on huge pages for the engines that do not register it (`--huge-pages`).
    pub huge_pages: bool,
    /// Seed of the run order (`--seed`).
    pub seed: u64,
    /// Buffers per batch (`--batch`): per zerotx `send_batch` call, and sends between reaps.
    pub batch: usize,
    /// Per topology.
    pub topologies: Vec<TopologyResult>,
}

impl Report {
    /// The conditions of the run, in one line, for the headers of the human-readable exports.
    pub fn conditions(&self) -> String {
        format!(
            "kernel {}, {} CPUs, {} run(s) of {:.2} s per cell, buffer ring {} MiB{}{}{}",
            self.kernel,
            self.cpus,
            self.repeat,
            self.run_seconds,
            self.ring_bytes >> 20,
            if self.huge_pages {
                " on huge pages (small pages where registered)"
            } else {
                ""
            },
            match self.batch {
                DEFAULT_BATCH => String::new(),
                b => format!(", batches of {b}"),
            },
            match self.seed {
                0 => String::new(),
                s => format!(", order seed {s}"),
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_interval_uses_the_sign_tests_order_statistics() {
        // Known values (the sign test's tables): n=6 -> 1, n=10 -> 2, n=20 -> 6, n=40 -> 14.
        assert_eq!(order_statistic_95(5), 0);
        assert_eq!(order_statistic_95(6), 1);
        assert_eq!(order_statistic_95(10), 2);
        assert_eq!(order_statistic_95(20), 6);
        assert_eq!(order_statistic_95(40), 14);
        // Large n: close to the normal approximation n/2 - 0.98 sqrt(n), and no underflow.
        let k = order_statistic_95(10_000);
        assert!((4900..=4902).contains(&k), "{k}");

        let p = Paired::of(vec![
            0.9, 1.1, 1.0, 0.95, 1.05, 0.97, 1.02, 0.99, 1.01, 0.98,
        ])
        .unwrap();
        assert_eq!(p.pairs, 10);
        assert!((p.median - 0.995).abs() < 1e-9, "{p:?}");
        assert_eq!(p.interval, Some((0.95, 1.05)));
        assert_eq!(Paired::of(vec![1.0, 2.0]).unwrap().interval, None);
        assert!(Paired::of(vec![]).is_none());
    }

    #[test]
    fn spread_takes_the_median_and_range() {
        assert_eq!(
            Spread::of(vec![3.0, 1.0, 2.0]),
            Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of(vec![4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert_eq!(Spread::of(vec![]), Spread::default());
    }

    #[test]
    fn summary_rates_are_per_gb_and_per_second() {
        let run = Run {
            bytes: 2_000_000_000,
            sends: 1000,
            seconds: 2.0,
            cpu_seconds: 1.0,
            zerocopy: 3,
            kernel_copied: 1,
            ..Run::default()
        };
        let c = Cell::summarise("msg-zc", 4096, vec![run], None);
        assert_eq!(c.mb_s.median, 1000.0);
        assert_eq!(c.sends_s, 500.0);
        assert_eq!(c.cpu_s_per_gb, 0.5);
        assert_eq!(c.zerocopy_share(), Some(0.75));
    }
}
