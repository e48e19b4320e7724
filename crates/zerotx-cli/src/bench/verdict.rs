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

/// One topology's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The topology's name.
    pub topology: String,
    /// The engine to use, if any ran.
    pub use_engine: Option<String>,
    /// Sizes where `auto` stayed under [`AUTO_TARGET`]: size, its ratio, the faster engine.
    pub auto_misses: Vec<(usize, f64, String)>,
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

/// The verdict on `t`; `None` for a topology that did not run.
pub fn of(t: &TopologyResult) -> Option<Verdict> {
    if t.skipped.is_some() || t.cells.iter().all(|c| c.runs.is_empty()) {
        return None;
    }
    let auto_ran = t.sizes.iter().any(|&s| t.mb_s("auto", s).is_some());
    let auto_misses = t
        .sizes
        .iter()
        .filter_map(|&s| {
            let r = t.auto_ratio(s)?;
            let (best, _) = t.best_single(s)?;
            auto_misses(r).then(|| (s, r, best.to_string()))
        })
        .collect();
    let use_engine = if auto_ran {
        Some("auto".to_string())
    } else {
        fastest_most_often(t)
    };
    let (mut zc, mut copied) = (0u64, 0u64);
    for c in t
        .cells
        .iter()
        .filter(|c| ZERO_COPY.contains(&c.engine.as_str()) || c.engine == "auto")
    {
        zc += c.zerocopy;
        copied += c.kernel_copied;
    }
    Some(Verdict {
        topology: t.name.clone(),
        use_engine,
        auto_misses,
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
