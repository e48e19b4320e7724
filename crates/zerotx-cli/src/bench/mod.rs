//! `zerotx bench`: copy vs zero-copy on this machine, with nothing to set up.
//!
//! Topologies it builds itself: TCP over loopback (the kernel copies zero-copy sends delivered
//! locally: a real outcome users must see) and, when it may create a network namespace, the UDP
//! black hole (true zero-copy completions, the role the `dummy` device plays in the kernel's
//! io_uring results). With `--vsock CID:PORT`, AF_VSOCK to a peer the user runs.

pub mod options;
pub mod result;
pub mod runner;

use std::io::IsTerminal;
use std::net::UdpSocket;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use socket2::{Domain, SockAddr, Socket, Type};
use zerotx_testbed as testbed;

use result::{Cell, Report, Run, Topology};
use runner::{buffer_ring, run_once, BenchEngine, TcpSink};

/// Where a topology sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyKind {
    /// TCP over loopback to a sink thread.
    TcpLoopback,
    /// UDP into the black hole of a fresh network namespace.
    UdpBlackhole,
    /// AF_VSOCK stream to `cid:port`.
    Vsock {
        /// Peer CID.
        cid: u32,
        /// Peer port.
        port: u32,
    },
}

impl TopologyKind {
    pub fn name(&self) -> &'static str {
        match self {
            TopologyKind::TcpLoopback => "tcp-loopback",
            TopologyKind::UdpBlackhole => "udp-blackhole",
            TopologyKind::Vsock { .. } => "vsock",
        }
    }

    fn description(&self) -> String {
        match self {
            TopologyKind::TcpLoopback => {
                "TCP over loopback to a sink thread; the kernel copies on local delivery".into()
            }
            TopologyKind::UdpBlackhole => "UDP in a private network namespace into a veth whose \
                 peer is down (a true zero-copy sink, like the dummy device)"
                .into(),
            TopologyKind::Vsock { cid, port } => format!("AF_VSOCK stream to {cid}:{port}"),
        }
    }

    /// The sizes the kernel's own tables use for this kind of socket.
    pub fn default_sizes(&self) -> Vec<usize> {
        match self {
            TopologyKind::UdpBlackhole => vec![1472, 4096, 16384, 65000],
            _ => vec![1400, 4096, 16384, 65536, 262_144, 1_048_576],
        }
    }

    fn max_size(&self) -> usize {
        match self {
            TopologyKind::UdpBlackhole => 65507,
            _ => 64 << 20,
        }
    }
}

/// Checked options.
#[derive(Debug, Clone)]
pub struct Options {
    pub run: Duration,
    pub repeat: usize,
    pub sizes: Option<Vec<usize>>,
    pub engines: Vec<BenchEngine>,
    pub topologies: Vec<TopologyKind>,
    pub ring_bytes: usize,
    pub format: Format,
    pub plot: Option<PathBuf>,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// Reports progress on a terminal (a bar) or as plain lines (logs, CI).
#[derive(Clone)]
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
}

impl Progress {
    fn new(total: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}<{eta}]")
                    .expect("static template"),
            );
            b
        });
        Self { bar, total }
    }

    fn step(&self, done: u64, what: &str, outcome: &anyhow::Result<Run>) {
        let line = match outcome {
            Ok(r) => format!("{what}: {:.0} MB/s", r.mb_s()),
            Err(e) => format!("{what}: {e:#}"),
        };
        match &self.bar {
            Some(b) => {
                b.set_message(line);
                b.inc(1);
            }
            None => eprintln!("[{done}/{}] {line}", self.total),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn sizes_for(opts: &Options, t: &TopologyKind) -> Vec<usize> {
    let sizes = opts.sizes.clone().unwrap_or_else(|| t.default_sizes());
    sizes.into_iter().filter(|&s| s <= t.max_size()).collect()
}

/// Runs every repetition of every cell of one topology, interleaving engines (each repetition
/// starts with a different engine) so drift on a shared machine spreads over all of them.
fn run_topology(
    opts: &Options,
    t: TopologyKind,
    progress: &Progress,
    done: &mut u64,
    mut open: impl FnMut() -> anyhow::Result<OwnedFd>,
    sink_cpu: impl Fn() -> anyhow::Result<Duration>,
) -> Topology {
    let sizes = sizes_for(opts, &t);
    let engines = &opts.engines;
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); sizes.len() * engines.len()];
    let mut errors: Vec<Option<String>> = vec![None; sizes.len() * engines.len()];
    for rep in 0..opts.repeat {
        for (si, &size) in sizes.iter().enumerate() {
            let pool = match buffer_ring(size, opts.ring_bytes) {
                Ok(p) => p,
                Err(e) => {
                    for ei in 0..engines.len() {
                        errors[si * engines.len() + ei] = Some(format!("{e:#}"));
                    }
                    continue;
                }
            };
            for k in 0..engines.len() {
                let ei = (k + rep) % engines.len();
                let idx = si * engines.len() + ei;
                let engine = engines[ei];
                *done += 1;
                let what = format!("{} {} {}B", t.name(), engine.name(), size);
                if errors[idx].is_some() {
                    progress.step(
                        *done,
                        &what,
                        &Err(anyhow::anyhow!("skipped after an error")),
                    );
                    continue;
                }
                let outcome = open().and_then(|fd| {
                    let run = run_once(fd, engine, size, &pool, opts.run);
                    // The run closed the connection either way: take the sink's report now, or
                    // the next run would read this one's.
                    let sink = sink_cpu()?;
                    let mut run = run?;
                    run.cpu_seconds = (run.cpu_seconds - sink.as_secs_f64()).max(0.0);
                    Ok(run)
                });
                progress.step(*done, &what, &outcome);
                match outcome {
                    Ok(run) => runs[idx].push(run),
                    Err(e) => errors[idx] = Some(format!("{e:#}")),
                }
            }
        }
    }
    let mut cells = Vec::new();
    for (si, &size) in sizes.iter().enumerate() {
        for (ei, engine) in engines.iter().enumerate() {
            let idx = si * engines.len() + ei;
            cells.push(Cell::summarise(
                engine.name(),
                size,
                std::mem::take(&mut runs[idx]),
                errors[idx].take(),
            ));
        }
    }
    Topology {
        name: t.name().into(),
        description: t.description(),
        skipped: None,
        sizes,
        engines: engines.iter().map(|e| e.name().to_string()).collect(),
        cells,
    }
}

/// Topologies whose sink is elsewhere (a device, a remote peer) use no local CPU for it.
fn no_sink() -> anyhow::Result<Duration> {
    Ok(Duration::ZERO)
}

fn skipped(opts: &Options, t: TopologyKind, why: String) -> Topology {
    Topology {
        name: t.name().into(),
        description: t.description(),
        skipped: Some(why),
        sizes: sizes_for(opts, &t),
        engines: opts.engines.iter().map(|e| e.name().to_string()).collect(),
        cells: Vec::new(),
    }
}

/// Runs the whole benchmark.
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (sender_cpu, sink_cpu) = if cpus >= 2 {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    let total: u64 = opts
        .topologies
        .iter()
        .map(|t| (sizes_for(opts, t).len() * opts.engines.len() * opts.repeat) as u64)
        .sum();
    let progress = Progress::new(total);
    let mut done = 0u64;
    let mut topologies = Vec::new();
    for &t in &opts.topologies {
        let report = match t {
            TopologyKind::TcpLoopback => {
                let sink = TcpSink::start(sink_cpu)?;
                let (progress, done) = (&progress, &mut done);
                std::thread::scope(|s| {
                    // The sink moves with the sender thread: its result channel is not Sync.
                    s.spawn(move || {
                        if let Some(cpu) = sender_cpu {
                            let _ = testbed::pin_thread(cpu);
                        }
                        run_topology(
                            opts,
                            t,
                            progress,
                            done,
                            || Ok(sink.connect()?.into()),
                            || Ok(sink.result()?.1),
                        )
                    })
                    .join()
                    .expect("benchmark thread panicked")
                })
            }
            TopologyKind::UdpBlackhole => {
                let outcome = testbed::in_new_netns(|| -> anyhow::Result<Topology> {
                    if let Some(cpu) = sender_cpu {
                        let _ = testbed::pin_thread(cpu);
                    }
                    let bh = testbed::black_hole(65535).context("building the black hole")?;
                    let open = || {
                        let sock = UdpSocket::bind("0.0.0.0:0")?;
                        sock.connect(bh.v4)?;
                        Ok(sock.into())
                    };
                    Ok(run_topology(opts, t, &progress, &mut done, open, no_sink))
                });
                match outcome {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => skipped(opts, t, format!("{e:#}")),
                    Err(e) => skipped(
                        opts,
                        t,
                        format!("{e} (run as root to measure true zero-copy)"),
                    ),
                }
            }
            TopologyKind::Vsock { cid, port } => {
                let open = || {
                    let s = Socket::new(Domain::VSOCK, Type::STREAM, None)
                        .context("creating an AF_VSOCK socket (is a vsock transport loaded?)")?;
                    s.connect(&SockAddr::vsock(cid, port))
                        .with_context(|| format!("connecting to vsock {cid}:{port}"))?;
                    Ok(s.into())
                };
                run_topology(opts, t, &progress, &mut done, open, no_sink)
            }
        };
        topologies.push(report);
    }
    progress.finish();
    Ok(Report {
        version: env!("CARGO_PKG_VERSION").into(),
        kernel: zerotx::probe::kernel_release(),
        cpus,
        run_seconds: opts.run.as_secs_f64(),
        repeat: opts.repeat,
        ring_bytes: opts.ring_bytes,
        topologies,
    })
}
