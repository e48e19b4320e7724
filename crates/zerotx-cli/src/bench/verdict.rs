//! The verdict a `zerotx bench` table ends with, per topology and in plain words: what to use on
//! this host, from which size zero-copy pays and by how much, and what the kernel copied and why.
//! Pure logic over a [`TopologyResult`], so it is tested on made-up figures.

use super::result::TopologyResult;

/// `auto` should reach this share of the fastest single engine's throughput at every size.
pub const AUTO_TARGET: f64 = 0.95;

/// Whether `auto`'s ratio to the fastest single engine misses [`AUTO_TARGET`], judged on the two
/// decimals the table prints (a `0.95x` is never marked a miss).
pub fn auto_misses(ratio: f64) -> bool {
    (ratio * 100.0).round() / 100.0 < AUTO_TARGET
}

/// Zero-copy pays where the fastest zero-copy engine moves at least this much more than `copy`
/// (5%: less is within the run-to-run spread of a short benchmark).
pub const PAYS: f64 = 1.05;

/// The engines that ask the kernel to send from the caller's memory.
pub const ZERO_COPY: [&str; 3] = ["msg-zc", "uring-zc", "uring-zc-fixed"];

/// zerotx's train columns that ask for zero-copy (`train-auto` may).
pub const ZERO_COPY_TRAINS: [&str; 4] = [
    "train-auto",
    "train-msg-zc",
    "train-uring-zc",
    "train-uring-zc-fixed",
];

/// Where zero-copy pays: from `size` on, at every larger size measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Pays {
    /// The smallest such size.
    pub size: usize,
    /// The fastest zero-copy engine there, and its throughput over copy's.
    pub engine: String,
    /// Its throughput over copy's at `size`.
    pub ratio: f64,
    /// The largest size measured, and the fastest zero-copy engine's ratio there.
    pub largest: (usize, f64),
}

/// What zero-copy did against copy.
#[derive(Debug, Clone, PartialEq)]
pub enum ZeroCopy {
    /// It pays from a size on.
    Pays(Pays),
    /// It paid at no size (or not at every size above one): its best ratio, where, and by which
    /// engine.
    Never {
        /// Size of the best ratio.
        size: usize,
        /// The engine.
        engine: String,
        /// Throughput over copy's.
        ratio: f64,
    },
    /// No copy column, or no zero-copy column, ran: nothing to compare.
    NotCompared,
}

/// What zerotx's fastest train column did at one size against one `copy` send per datagram.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainAt {
    /// Datagram size.
    pub size: usize,
    /// The fastest of zerotx's train columns there (not `train-auto`).
    pub engine: String,
    /// Its throughput over per-datagram `copy`'s.
    pub ratio: f64,
    /// Its sender CPU, seconds per GB.
    pub cpu_s_per_gb: f64,
    /// Per-datagram `copy`'s sender CPU, seconds per GB.
    pub copy_cpu_s_per_gb: f64,
}

impl TrainAt {
    /// Whether trains pay here: at least [`PAYS`] times copy's throughput.
    pub fn pays(&self) -> bool {
        self.ratio >= PAYS
    }
}

/// One topology's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The topology's name.
    pub topology: String,
    /// The engine to use, if any ran.
    pub use_engine: Option<String>,
    /// Sizes where `auto` stayed under [`AUTO_TARGET`]: size, its ratio, the faster engine.
    pub auto_misses: Vec<(usize, f64, String)>,
    /// Sizes where `train-auto` stayed under [`AUTO_TARGET`] of the fastest of zerotx's other
    /// train columns: size, its ratio, that column.
    pub train_auto_misses: Vec<(usize, f64, String)>,
    /// zerotx's trains against one `copy` send per datagram, at each size where both ran.
    pub trains: Vec<TrainAt>,
    /// Zero-copy against copy.
    pub zero_copy: ZeroCopy,
    /// Share of the zero-copy engines' sends that the kernel copied, if they sent any.
    pub kernel_copied: Option<f64>,
}

/// Throughput of `engine` over copy's at `size`.
fn over_copy(t: &TopologyResult, engine: &str, size: usize) -> Option<f64> {
    t.ratio(engine, "copy", size)
}

/// The fastest zero-copy engine at `size`, with its ratio to copy.
fn best_zero_copy(t: &TopologyResult, size: usize) -> Option<(String, f64)> {
    ZERO_COPY
        .iter()
        .filter_map(|e| Some((e.to_string(), over_copy(t, e, size)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

fn zero_copy(t: &TopologyResult) -> ZeroCopy {
    let per_size: Vec<(usize, String, f64)> = t
        .sizes
        .iter()
        .filter_map(|&s| best_zero_copy(t, s).map(|(e, r)| (s, e, r)))
        .collect();
    let Some(last) = per_size.last() else {
        return ZeroCopy::NotCompared;
    };
    // The smallest size from which every size up pays.
    let from = per_size
        .iter()
        .rposition(|(_, _, r)| *r < PAYS)
        .map_or(0, |i| i + 1);
    if let Some((size, engine, ratio)) = per_size.get(from) {
        return ZeroCopy::Pays(Pays {
            size: *size,
            engine: engine.clone(),
            ratio: *ratio,
            largest: (last.0, last.2),
        });
    }
    let (size, engine, ratio) = per_size
        .iter()
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .cloned()
        .expect("per_size is not empty");
    ZeroCopy::Never {
        size,
        engine,
        ratio,
    }
}

/// The engine fastest at the most sizes (`auto` counts only through [`Verdict::use_engine`]).
fn fastest_most_often(t: &TopologyResult) -> Option<String> {
    let mut wins: Vec<(&str, usize)> = Vec::new();
    for &size in &t.sizes {
        let Some((e, _)) = t.best_single(size) else {
            continue;
        };
        match wins.iter_mut().find(|w| w.0 == e) {
            Some(w) => w.1 += 1,
            None => wins.push((e, 1)),
        }
    }
    // The first of equals: engines in column order.
    let most = wins.iter().map(|w| w.1).max()?;
    wins.iter().find(|w| w.1 == most).map(|w| w.0.to_string())
}

/// zerotx's fastest train column at each size, against per-datagram `copy`.
fn trains(t: &TopologyResult) -> Vec<TrainAt> {
    let cpu = |e: &str, size| {
        t.cell(e, size)
            .filter(|c| c.error.is_none() && !c.runs.is_empty())
            .map(|c| c.cpu_s_per_gb)
    };
    t.sizes
        .iter()
        .filter_map(|&size| {
            let (engine, _) = t.best_train(size)?;
            Some(TrainAt {
                size,
                engine: engine.to_string(),
                ratio: over_copy(t, engine, size)?,
                cpu_s_per_gb: cpu(engine, size)?,
                copy_cpu_s_per_gb: cpu("copy", size)?,
            })
        })
        .collect()
}

/// Sizes where `ratio` (an `auto` column over the fastest of `best`) misses [`AUTO_TARGET`].
fn misses(
    t: &TopologyResult,
    ratio: impl Fn(usize) -> Option<f64>,
    best: impl Fn(usize) -> Option<String>,
) -> Vec<(usize, f64, String)> {
    t.sizes
        .iter()
        .filter_map(|&s| {
            let r = ratio(s)?;
            auto_misses(r).then(|| Some((s, r, best(s)?)))?
        })
        .collect()
}

/// The verdict on `t`; `None` for a topology that did not run.
pub fn of(t: &TopologyResult) -> Option<Verdict> {
    if t.skipped.is_some() || t.cells.iter().all(|c| c.runs.is_empty()) {
        return None;
    }
    let auto_ran = t.sizes.iter().any(|&s| t.mb_s("auto", s).is_some());
    let auto_misses = misses(
        t,
        |s| t.auto_ratio(s),
        |s| t.best_single(s).map(|b| b.0.to_string()),
    );
    let train_auto_misses = misses(
        t,
        |s| t.train_auto_ratio(s),
        |s| t.best_train(s).map(|b| b.0.to_string()),
    );
    let use_engine = if auto_ran {
        Some("auto".to_string())
    } else {
        fastest_most_often(t)
    };
    let (mut zc, mut copied) = (0u64, 0u64);
    for c in t.cells.iter().filter(|c| {
        let e = c.engine.as_str();
        ZERO_COPY.contains(&e) || ZERO_COPY_TRAINS.contains(&e) || e == "auto"
    }) {
        zc += c.zerocopy;
        copied += c.kernel_copied;
    }
    Some(Verdict {
        topology: t.name.clone(),
        use_engine,
        auto_misses,
        train_auto_misses,
        trains: trains(t),
        zero_copy: zero_copy(t),
        kernel_copied: (zc + copied > 0).then(|| copied as f64 / (zc + copied) as f64),
    })
}

/// Why the kernel copies zero-copy sends on the topology `name`, in a few words.
pub fn why_copied(name: &str) -> &'static str {
    match name {
        "tcp-loopback" => {
            "loopback delivers to a socket on this host, and the kernel copies every zero-copy \
             send it delivers locally (through a network card with scatter-gather it would not)"
        }
        "vsock" => "this vsock transport copies what it sends",
        _ => {
            "the route cannot send from your memory here (local delivery, or a device without \
             scatter-gather), or the kernel ran short of pinned memory"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::{Cell, Run};

    /// A cell of one run moving `mb` MB in a second, `zc` buffers sent zero-copy and `copied`
    /// copied by the kernel.
    fn cell(engine: &str, size: usize, mb: f64, zc: u64, copied: u64) -> Cell {
        let run = Run {
            bytes: (mb * 1e6) as u64,
            sends: 100,
            seconds: 1.0,
            zerocopy: zc,
            kernel_copied: copied,
            ..Run::default()
        };
        Cell::summarise(engine, size, vec![run], None)
    }

    /// copy, msg-zc and auto at 4K, 64K and 1M: msg-zc at `zc[i]` times copy's 1000 MB/s, auto
    /// at `auto[i]` times the faster of the two.
    fn topology(zc: [f64; 3], auto: [f64; 3], copied: u64) -> TopologyResult {
        let sizes = vec![4096, 65536, 1 << 20];
        let mut cells = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            cells.push(cell("copy", s, 1000.0, 0, 0));
            cells.push(cell("msg-zc", s, 1000.0 * zc[i], 100 - copied, copied));
            cells.push(cell("auto", s, 1000.0 * zc[i].max(1.0) * auto[i], 0, 0));
        }
        TopologyResult {
            name: "udp-blackhole".into(),
            sizes,
            engines: ["auto", "copy", "msg-zc"].map(String::from).to_vec(),
            cells,
            ..TopologyResult::default()
        }
    }

    #[test]
    fn zero_copy_pays_from_the_smallest_size_after_which_it_always_pays() {
        let v = of(&topology([1.2, 0.9, 1.5], [1.0; 3], 0)).unwrap();
        // 4K paid but 64K did not: it pays from 1M on.
        match v.zero_copy {
            ZeroCopy::Pays(p) => {
                assert_eq!((p.size, p.engine.as_str()), (1 << 20, "msg-zc"));
                assert!((p.ratio - 1.5).abs() < 1e-9, "{p:?}");
            }
            other => panic!("{other:?}"),
        }
        let v = of(&topology([1.06, 1.3, 2.0], [1.0; 3], 0)).unwrap();
        match v.zero_copy {
            ZeroCopy::Pays(p) => {
                assert_eq!(p.size, 4096);
                assert_eq!(p.largest.0, 1 << 20);
                assert!((p.largest.1 - 2.0).abs() < 1e-9, "{p:?}");
            }
            other => panic!("{other:?}"),
        }
        // Within the noise (under 5% more) is not paying.
        let v = of(&topology([0.5, 0.8, 1.04], [1.0; 3], 0)).unwrap();
        match v.zero_copy {
            ZeroCopy::Never { size, ratio, .. } => {
                assert_eq!(size, 1 << 20);
                assert!((ratio - 1.04).abs() < 1e-9);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn auto_is_recommended_and_its_misses_named() {
        // 0.9491 prints as 0.95x, which meets the target.
        let v = of(&topology([1.2, 1.2, 1.2], [0.9491, 0.9, 0.99], 0)).unwrap();
        assert_eq!(v.use_engine.as_deref(), Some("auto"));
        assert_eq!(v.auto_misses.len(), 1, "{:?}", v.auto_misses);
        let (size, r, best) = &v.auto_misses[0];
        assert_eq!((*size, best.as_str()), (65536, "msg-zc"));
        assert!((r - 0.9).abs() < 1e-9);
        // Without auto: the engine fastest at most sizes.
        let mut t = topology([1.2, 0.5, 1.2], [1.0; 3], 0);
        t.cells.retain(|c| c.engine != "auto");
        t.engines.retain(|e| e != "auto");
        let v = of(&t).unwrap();
        assert_eq!(v.use_engine.as_deref(), Some("msg-zc"));
        assert!(v.auto_misses.is_empty());
    }

    #[test]
    fn what_the_kernel_copied_is_a_share_of_the_zero_copy_sends() {
        assert_eq!(
            of(&topology([1.0; 3], [1.0; 3], 100))
                .unwrap()
                .kernel_copied,
            Some(1.0)
        );
        assert_eq!(
            of(&topology([1.0; 3], [1.0; 3], 25)).unwrap().kernel_copied,
            Some(0.25)
        );
        assert_eq!(
            of(&topology([1.0; 3], [1.0; 3], 0)).unwrap().kernel_copied,
            Some(0.0)
        );
    }

    #[test]
    fn trains_are_named_where_they_pay_and_train_auto_is_held_to_the_best_train() {
        // copy at 1000 MB/s; train-copy at 2x and 0.9x, train-msg-zc at 20x and 1.02x;
        // train-auto at 0.9 and 1.0 of the best train; a refusing column and the raw loop do
        // not count as zerotx's best.
        let sizes = vec![1200, 1472];
        let mut cells = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            let (tc, tz, ta) = [(2.0, 20.0, 0.9), (0.9, 1.02, 1.0)][i];
            cells.push(cell("copy", s, 1000.0, 0, 0));
            cells.push(cell("train-copy", s, 1000.0 * tc, 0, 0));
            cells.push(cell("train-msg-zc", s, 1000.0 * tz, 100, 0));
            cells.push(cell("train-auto", s, 1000.0 * tz * ta, 100, 0));
            cells.push(Cell::summarise(
                "train-uring",
                s,
                vec![],
                Some("refuses".into()),
            ));
            cells.push(cell("raw-train-msg-zc", s, 1000.0 * 50.0, 100, 0));
        }
        let t = TopologyResult {
            name: "udp-carrier".into(),
            sizes,
            engines: [
                "copy",
                "train-copy",
                "train-msg-zc",
                "train-auto",
                "train-uring",
                "raw-train-msg-zc",
            ]
            .map(String::from)
            .to_vec(),
            cells,
            ..TopologyResult::default()
        };
        let v = of(&t).unwrap();
        let got: Vec<(usize, &str, bool)> = v
            .trains
            .iter()
            .map(|a| (a.size, a.engine.as_str(), a.pays()))
            .collect();
        assert_eq!(
            got,
            [(1200, "train-msg-zc", true), (1472, "train-msg-zc", false)]
        );
        assert!((v.trains[0].ratio - 20.0).abs() < 1e-9);
        assert_eq!(v.train_auto_misses.len(), 1, "{:?}", v.train_auto_misses);
        let (size, r, best) = &v.train_auto_misses[0];
        assert_eq!((*size, best.as_str()), (1200, "train-msg-zc"));
        assert!((r - 0.9).abs() < 1e-9);
        // No auto column: no per-datagram misses; train-msg-zc's sends count as zero-copy.
        assert!(v.auto_misses.is_empty());
        assert_eq!(v.kernel_copied, Some(0.0));
    }

    #[test]
    fn a_topology_that_did_not_run_has_no_verdict() {
        let skipped = TopologyResult {
            skipped: Some("no vsock".into()),
            ..TopologyResult::default()
        };
        assert!(of(&skipped).is_none());
        let mut failed = topology([1.0; 3], [1.0; 3], 0);
        for c in &mut failed.cells {
            *c = Cell::summarise(&c.engine, c.size, vec![], Some("unavailable".into()));
        }
        assert!(of(&failed).is_none());
    }
}
