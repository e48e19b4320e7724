//! `zerotx bench`: copy vs zero-copy on this machine, with nothing to set up.
//!
//! The pieces, in the order a run goes through them:
//! - [`settings`]: what a run measures (checked from the flags by `options.rs`);
//! - [`topology`]: where to send (one file per topology: TCP loopback, the UDP black hole, vsock);
//! - [`scheduler`]: the order of runs (interleaved repetitions), apart from how a run is made;
//! - [`cell`]: one run of one cell, picking the driver for the engine column;
//! - [`runner`]: the timed loop every driver goes through, the same for all;
//! - [`zerotx_engine`], [`raw`], [`liburing`]: zerotx's engines, the minimal senders written for
//!   the comparison, and liburing's example run as a child;
//! - [`result`]: the one report type every exporter reads.

pub mod cell;
pub mod engine;
pub mod liburing;
pub mod progress;
pub mod raw;
pub mod result;
pub mod runner;
pub mod scheduler;
pub mod settings;
pub mod topology;
pub mod verdict;
pub mod zerotx_engine;

pub use engine::Engine;

use cell::Cells;
use progress::Progress;
use result::{Cell, LeftOut, Report, TopologyResult};
use scheduler::{Grid, Plan};
use topology::{Cpus, Topology};

use settings::Settings;

/// The sizes a topology runs, and those it leaves out.
type Sizes = (Vec<usize>, Option<LeftOut>);

/// The sizes `t` runs, and those it leaves out (larger than it sends at once), which the report
/// names. The options refuse a topology that would run none.
fn sizes_for(opts: &Settings, t: &dyn Topology) -> Sizes {
    let sizes = opts.sizes.clone().unwrap_or_else(|| t.default_sizes());
    let (run, over): (Vec<usize>, Vec<usize>) = sizes.into_iter().partition(|&s| s <= t.max_size());
    let left_out = (!over.is_empty()).then(|| LeftOut {
        sizes: over,
        max_size: t.max_size(),
    });
    (run, left_out)
}

fn summarise(
    opts: &Settings,
    t: &dyn Topology,
    (sizes, left_out): Sizes,
    grid: Option<Grid<result::Run>>,
    skipped: Option<String>,
) -> TopologyResult {
    let mut cells = Vec::new();
    if let Some(mut grid) = grid {
        for (si, &size) in sizes.iter().enumerate() {
            for (ei, engine) in opts.engines.iter().enumerate() {
                let o = grid.take(si, ei);
                cells.push(Cell::summarise(engine.name(), size, o.runs, o.error));
            }
        }
    }
    TopologyResult {
        name: t.name().into(),
        description: t.description(),
        skipped,
        sizes,
        engines: opts.engines.iter().map(|e| e.name().to_string()).collect(),
        cells,
        left_out,
    }
}

/// The columns that run back to back ([`Plan::together`]): each zerotx engine with the baselines
/// it is judged against ([`result::BASELINE_PAIRS`]), among `engines`. Pairs that share a column
/// join one set (`uring-zc-fixed` with both of its baselines).
fn together(engines: &[Engine]) -> Vec<Vec<usize>> {
    let at = |name: &str| engines.iter().position(|e| e.name() == name);
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for (a, b) in result::BASELINE_PAIRS {
        let (Some(a), Some(b)) = (at(a), at(b)) else {
            continue;
        };
        let joined: Vec<usize> = sets
            .iter()
            .enumerate()
            .filter(|(_, s)| s.contains(&a) || s.contains(&b))
            .map(|(i, _)| i)
            .collect();
        let mut set = vec![a, b];
        for i in joined.into_iter().rev() {
            set.extend(sets.remove(i));
        }
        set.sort_unstable();
        set.dedup();
        sets.push(set);
    }
    sets
}

/// Runs the whole benchmark: every topology, and in each every cell, in the scheduler's order.
pub fn run(opts: &Settings) -> anyhow::Result<Report> {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let n_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpus = Cpus::for_host(n_cpus);
    let topologies: Vec<Box<dyn Topology>> = opts.topologies.iter().map(|c| c.build()).collect();
    let plans: Vec<(Sizes, Plan)> = topologies
        .iter()
        .map(|t| {
            let sizes = sizes_for(opts, t.as_ref());
            let plan = Plan {
                sizes: sizes.0.len(),
                engines: opts.engines.len(),
                repeat: opts.repeat,
                seed: opts.seed,
                together: together(&opts.engines),
            };
            (sizes, plan)
        })
        .collect();
    let progress = Progress::new(
        plans.iter().map(|(_, p)| p.total() as u64).sum(),
        opts.progress,
    );
    let mut results = Vec::new();
    for (t, (sizes, plan)) in topologies.iter().zip(plans) {
        let mut grid = None;
        let name = t.name();
        let run_sizes = &sizes.0;
        let entered = t.enter(cpus, &mut |site| {
            let mut cells = Cells::new(opts, site, run_sizes, cpus);
            grid = Some(scheduler::run(&plan, &mut cells, |slot, event| {
                let what = format!(
                    "{} {} {}B",
                    name,
                    opts.engines[slot.engine].name(),
                    run_sizes[slot.size]
                );
                progress.step(&what, &event);
            }));
        });
        let skipped = match entered {
            Ok(()) => None,
            Err(e) => Some(format!("{e:#}")),
        };
        results.push(summarise(opts, t.as_ref(), sizes, grid, skipped));
    }
    progress.finish();
    Ok(Report {
        version: env!("CARGO_PKG_VERSION").into(),
        kernel: zerotx::internals::probe::kernel_release(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default(),
        started,
        cpus: n_cpus,
        run_seconds: opts.run.as_secs_f64(),
        repeat: opts.repeat,
        ring_bytes: opts.ring_bytes,
        huge_pages: opts.huge_pages,
        seed: opts.seed,
        batch: opts.batch,
        topologies: results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_runs_back_to_back_with_its_baselines() {
        let parse =
            |names: &[&str]| -> Vec<Engine> { names.iter().map(|n| n.parse().unwrap()).collect() };
        let udp = parse(&crate::export::sample::COMPARE_RAW_UDP);
        assert_eq!(together(&udp), vec![vec![0, 3], vec![1, 4], vec![2, 5, 6]]);
        // Its TCP columns, in another order; a baseline without its engine runs on its own.
        let tcp = parse(&[
            "raw-copy",
            "msg-zc",
            "copy",
            "raw-msg-zc",
            "raw-uring-zc-fixed",
        ]);
        assert_eq!(together(&tcp), vec![vec![0, 2], vec![1, 3]]);
        // The default table has no baselines: every column on its own.
        let plain = parse(&["copy", "msg-zc", "uring", "uring-zc", "auto"]);
        assert!(together(&plain).is_empty());
    }
}
