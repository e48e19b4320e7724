//! Every flag, in one place: the clap structs, and their checking into typed [`BenchOptions`].
//! Nothing here does work; every bad value gets an error that names it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use crate::bench::settings::{Settings, DEFAULT_BATCH, DEFAULT_TRAIN, MAX_BATCH, MAX_TRAIN};
use crate::bench::topology::Choice;
use crate::bench::Engine;
use crate::export::Format;
use crate::units::{self, MAX_SEND};
use zerotx_testbed::Segmentation;

/// zerotx: zero-copy socket transmit for Linux, measured on this machine.
#[derive(Debug, Parser)]
#[command(name = "zerotx", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Copy vs zero-copy on this machine: a table per topology, like the kernel's own tables.
    Bench(Box<BenchArgs>),
    /// What this host supports for zero-copy transmit, and what to tune.
    Probe {
        /// Print JSON for scripts instead of a table (with --explain, an `explain` array).
        #[arg(long)]
        json: bool,
        /// Also say, in plain words, why zero-copy is or is not engaged: the auto engine's
        /// decisions on real sockets here (TCP loopback; as root, UDP through a device in a
        /// private network namespace).
        #[arg(long)]
        explain: bool,
        /// With --explain, also the way to ADDR (HOST, HOST:PORT, `[IPV6]:PORT`): the route's
        /// device, its offloads, captures on it, local delivery. Nothing is sent to ADDR (a UDP
        /// socket is connected to it, which only looks up the route).
        #[arg(long, value_name = "ADDR", requires = "explain")]
        to: Option<String>,
    },
    /// Send generated data or a file to ADDR, iperf3-style, through the zero-copy engines.
    Send(Box<SendArgs>),
    /// Receive what `zerotx send` (or anything else) sends: throughput per interval, `--verify`,
    /// `--output`.
    Recv(Box<RecvArgs>),
}

/// How `--file` goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FileVia {
    /// The file mapped and sent by the engine (measured faster than sendfile on TCP loopback:
    /// 23.7 against 22.0 Gbit/s, 0.30 against 0.35 CPU s/GB).
    Auto,
    /// `sendfile(2)`: the kernel moves page-cache pages to the socket, no engine involved (TCP and
    /// vsock; where the socket refuses it, the mapped file through the engine, and the output
    /// says so).
    Sendfile,
    /// The file mapped into memory (`mmap`), its pages sent by `--engine` (zero-copy where it
    /// pays).
    Mmap,
}

/// `zerotx send` flags.
#[derive(Debug, Args)]
#[command(
    after_help = "A file that changes while it is being sent is the caller's problem: \
    with --file-via mmap or sendfile the kernel reads the file's pages when it transmits them, \
    so a writer racing the transfer changes what the receiver gets. A file whose size changes \
    (between opening and mapping, or while it is sent) ends the transfer with an error."
)]
pub struct SendArgs {
    /// Where to send: HOST:PORT, `[IPV6]:PORT`, HOST (port 5201) or vsock:CID:PORT.
    pub addr: String,
    /// UDP datagrams of --size bytes instead of a TCP stream.
    #[arg(long, short = 'u')]
    pub udp: bool,
    /// Send this many bytes of generated data (1024-based K, M, G, T suffixes: 10G, 1.5M), then
    /// stop.
    #[arg(
        long,
        short = 'n',
        value_name = "N",
        conflicts_with = "time",
        allow_hyphen_values = true
    )]
    pub bytes: Option<String>,
    /// Send for this many seconds [default: 10, unless --bytes or --file]; with --file, the file
    /// again and again until the time is up (a benchmark: the receiver gets the file repeated).
    #[arg(long, short = 't', value_name = "SECS", allow_negative_numbers = true)]
    pub time: Option<f64>,
    /// Send this file (once, unless --time).
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// How the file goes out.
    #[arg(long, value_enum, default_value_t = FileVia::Auto, requires = "file")]
    pub file_via: FileVia,
    /// Engine: auto, copy, msg-zc, uring, uring-zc.
    #[arg(long, default_value = "auto")]
    pub engine: String,
    /// Bytes per send, at most 64M (K, M, G suffixes as --bytes) [default: 1M for TCP, 1472 for
    /// UDP].
    #[arg(
        long,
        short = 'l',
        visible_alias = "length",
        value_name = "BYTES",
        allow_hyphen_values = true
    )]
    pub size: Option<String>,
    /// Parallel streams (connections or UDP sockets), each from its own thread.
    #[arg(long, short = 'P', value_name = "N", default_value_t = 1)]
    pub parallel: usize,
    /// UDP: datagrams per train. N datagrams of --size are cut from one buffer and sent by one
    /// call (UDP generic segmentation offload, `Sender::send_train`), at most as many as fit
    /// 64 KiB and 128; --train 1 sends one datagram per call. Where the engine or the path
    /// refuses trains (EIO, a segment above the MTU), a line says why and the rest goes one
    /// datagram per call.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TRAIN)]
    pub train: usize,
    /// Cap the rate in bits per second across all streams (K, M, G suffixes, 1000-based)
    /// [default: unlimited; with --udp a warning says so, where iperf3 paces UDP to 1 Mbit/s].
    #[arg(long, short = 'b', value_name = "RATE", allow_hyphen_values = true)]
    pub bitrate: Option<String>,
    /// Seconds between interval lines; 0 for none.
    #[arg(
        long,
        short = 'i',
        value_name = "SECS",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub interval: f64,
    /// Print one JSON document at the end (iperf3's start/intervals/end, with zero-copy fields).
    #[arg(long, short = 'J')]
    pub json: bool,
    /// Print one JSON line per event as it happens (`start`, each `interval`, `end`, and any
    /// `error`), as iperf3's --json-stream.
    #[arg(long)]
    pub json_stream: bool,
    /// Only IPv4 addresses of ADDR.
    #[arg(long = "version4", short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// Only IPv6 addresses of ADDR.
    #[arg(long = "version6", short = '6')]
    pub ipv6: bool,
    /// Send from this local address (HOST or HOST:PORT).
    #[arg(long, short = 'B', value_name = "HOST")]
    pub bind: Option<String>,
    /// Socket send buffer (SO_SNDBUF), bytes with K/M suffixes; the kernel doubles it and caps
    /// it at net.core.wmem_max.
    #[arg(long, short = 'w', value_name = "BYTES", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Write the output to FILE (appended) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub logfile: Option<PathBuf>,
    /// Also print the host, the kernel and the settings before the transfer.
    #[arg(long, short = 'V')]
    pub verbose: bool,
    /// Give up connecting after this many seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 5.0,
        allow_negative_numbers = true
    )]
    pub connect_timeout: f64,
    /// After the last byte, wait this long for the kernel to release every buffer and for the
    /// receiver to read everything, then fail.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 10.0,
        allow_negative_numbers = true
    )]
    pub linger: f64,
}

/// `zerotx recv` flags.
#[derive(Debug, Args)]
#[command(
    after_help = "Bounds, so the network does not decide what the receiver spends: a TCP \
    transfer takes at most 128 connections (one reading thread each; more are closed at once \
    until it ends); a UDP transfer meters at most 128 source addresses (datagrams from others \
    are counted apart, neither verified nor written to --output); --json keeps at most 100000 \
    interval samples per transfer (the oldest intervals go first, counted as intervals_dropped; \
    text output keeps none)."
)]
pub struct RecvArgs {
    /// Where to listen: PORT, HOST:PORT, `[IPV6]:PORT`, HOST (port 5201), vsock:PORT or
    /// vsock:CID:PORT (`-B HOST` as iperf3's bind).
    #[arg(
        long,
        short = 'l',
        short_alias = 'B',
        value_name = "ADDR",
        default_value = "5201"
    )]
    pub listen: String,
    /// Receive UDP datagrams instead of TCP connections.
    #[arg(long, short = 'u')]
    pub udp: bool,
    /// Check that what arrives is `zerotx send`'s generated stream: the first wrong byte is
    /// reported at once (stream and offset) and the exit status is non-zero when the transfer
    /// ends. UDP: each datagram is located in the stream, which counts datagrams lost and out of
    /// order; one that is not the stream is corrupt (non-zero exit; loss alone is not).
    #[arg(long)]
    pub verify: bool,
    /// Write what arrives to FILE, opened once when zerotx recv starts (created if missing;
    /// never through a symbolic link, and only a regular file) and emptied when a transfer
    /// starts. One stream at a time: a connection arriving while one is written is closed at
    /// once. UDP: datagrams in arrival order.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Exit after one transfer (TCP: the connections that overlap in time; UDP: until --idle
    /// seconds without a datagram).
    #[arg(long, short = '1')]
    pub once: bool,
    /// Seconds between interval lines; 0 for none.
    #[arg(
        long,
        short = 'i',
        value_name = "SECS",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub interval: f64,
    /// UDP: a transfer ends after this many seconds without a datagram.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 2.0,
        allow_negative_numbers = true
    )]
    pub idle: f64,
    /// Print one JSON document per transfer (iperf3's start/intervals/end).
    #[arg(long, short = 'J')]
    pub json: bool,
    /// Print one JSON line per event as it happens (`start`, each `interval`, `end`), as
    /// iperf3's --json-stream: a long-running receiver's output stays one event per line.
    #[arg(long)]
    pub json_stream: bool,
    /// Socket receive buffer (SO_RCVBUF), bytes with K/M suffixes; the kernel doubles it and caps
    /// it at net.core.rmem_max.
    #[arg(long, short = 'w', value_name = "BYTES", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Write the output to FILE (appended) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub logfile: Option<PathBuf>,
    /// Also print the host and the kernel when listening.
    #[arg(long, short = 'V')]
    pub verbose: bool,
}

/// `zerotx bench` flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// About 30 s: shorter runs, two repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per run of one cell [default: 0.6, or 0.15 with --quick].
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Repetitions per cell, interleaved across engines [default: 3, or 2 with --quick].
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// Bytes per send, comma-separated, at most 64M, K/M/G suffixes as `send --bytes`
    /// (1400,4K,64K,1M) [default: per
    /// topology, as the kernel's tables].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SIZES",
        allow_hyphen_values = true
    )]
    pub sizes: Option<Vec<String>>,
    /// Engines, comma-separated: auto, copy, msg-zc, uring, uring-zc, uring-zc-fixed; in trains
    /// train-auto, train-copy, train-msg-zc, train-uring, train-uring-zc, train-uring-zc-fixed;
    /// baselines raw-copy, raw-msg-zc, raw-uring-zc-fixed, liburing-zc-fixed, raw-train-copy,
    /// raw-train-msg-zc [default: the zerotx engines, auto first].
    #[arg(long, value_delimiter = ',', value_name = "ENGINES")]
    pub engines: Option<Vec<String>>,
    /// Also measure minimal senders written for the comparison (raw-copy, raw-msg-zc,
    /// raw-uring-zc-fixed: libc and io_uring calls, no abstraction) in the same run.
    #[arg(long)]
    pub baselines: bool,
    /// Also measure UDP GSO trains of --train datagrams of each size: zerotx's engines through
    /// `Sender::send_train` (train-auto, train-copy, train-msg-zc, train-uring, train-uring-zc,
    /// train-uring-zc-fixed; an engine that refuses trains is n/a, with the reason) and the raw
    /// train loops (raw-train-copy, raw-train-msg-zc: one `UDP_SEGMENT` call per train).
    #[arg(long)]
    pub trains: bool,
    /// Datagrams per train in the train columns, 1 to 128, at most as many as fit 64 KiB
    /// [default: 44, as many 1472 B datagrams as fit].
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TRAIN)]
    pub train: usize,
    /// Also run liburing's examples/send-zerocopy (built binary at PATH) with fixed buffers in
    /// the UDP black hole, as the column liburing-zc-fixed (see scripts/compare-raw.sh).
    #[arg(long, value_name = "PATH")]
    pub liburing: Option<PathBuf>,
    /// Topologies, comma-separated: tcp-loopback, udp-blackhole, udp-carrier, udp-carrier-sw
    /// (UDP into a black hole with carrier, segmentation offload on or off: needs nft and, for
    /// -sw, ethtool), vsock (with --vsock) [default: tcp-loopback and udp-blackhole, and vsock
    /// when --vsock is given].
    #[arg(long, value_delimiter = ',', value_name = "TOPOLOGIES")]
    pub topology: Option<Vec<String>>,
    /// Also measure AF_VSOCK to CID:PORT, a peer that reads and discards (for example
    /// `socat VSOCK-LISTEN:PORT,fork /dev/null` in the VM or host).
    #[arg(long, value_name = "CID:PORT")]
    pub vsock: Option<String>,
    /// Size of the buffer ring each run cycles through, MiB (larger than the L2 cache).
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub ring_mib: usize,
    /// Put the buffer ring on transparent huge pages (`BufPool::huge`): zero-copy then pins one
    /// page reference per 2 MiB instead of one per 4 KiB. The engines that register the ring
    /// with io_uring (uring-zc-fixed, raw-uring-zc-fixed) keep it on small pages, which
    /// registration needs; auto takes the huge ring unregistered.
    #[arg(long)]
    pub huge_pages: bool,
    /// Buffers per batch, 1 to 128: zerotx's engines get this many per `send_batch` call (and
    /// io_uring enters the kernel once per batch, a stream request carrying up to this many
    /// buffers), and the timed loop of every engine but liburing's own example reaps after this
    /// many sends (the raw io_uring loop also enters once per batch).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    /// Seed of the run order: each repetition runs a size's engines in an order drawn from it.
    /// The same seed gives the same orders; alternate seeds between runs that are compared, so
    /// no engine keeps its neighbours across them. Recorded in the JSON.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Print JSON instead of the table.
    #[arg(long, conflicts_with_all = ["csv", "markdown"])]
    pub json: bool,
    /// Print CSV (one row per cell) instead of the table.
    #[arg(long, conflicts_with = "markdown")]
    pub csv: bool,
    /// Print Markdown tables instead of the table.
    #[arg(long)]
    pub markdown: bool,
    /// Also write the whole report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub export_json: Option<PathBuf>,
    /// Also write CSV to FILE.
    #[arg(long, value_name = "FILE")]
    pub export_csv: Option<PathBuf>,
    /// Also write Markdown tables to FILE (like hyperfine's --export-markdown).
    #[arg(long, value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
    /// Also draw throughput vs size per engine and topology into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Print a line per run on standard error even when it is not a terminal (on a terminal a
    /// progress bar shows anyway).
    #[arg(long)]
    pub progress: bool,
}

/// Checked `zerotx bench` options: what to measure, and where the results go.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// What the bench measures.
    pub bench: Settings,
    /// What goes to standard output.
    pub stdout: Format,
    /// Files to write, each in its format.
    pub exports: Vec<(Format, PathBuf)>,
}

fn parse_vsock(s: &str) -> anyhow::Result<Choice> {
    let (cid, port) = s
        .split_once(':')
        .with_context(|| format!("invalid --vsock {s:?}: expected CID:PORT, e.g. 3:5201"))?;
    let num = |v: &str, what: &str| {
        v.parse::<u32>()
            .with_context(|| format!("invalid --vsock {s:?}: {what} {v:?} is not a number"))
    };
    Ok(Choice::Vsock {
        cid: num(cid, "CID")?,
        port: num(port, "port")?,
    })
}

/// A `--topology` name; `vsock` is the `--vsock` peer, when one is given.
fn parse_topology(s: &str, vsock: Option<Choice>) -> anyhow::Result<Choice> {
    match s.trim() {
        "tcp-loopback" => Ok(Choice::TcpLoopback),
        "udp-blackhole" => Ok(Choice::UdpBlackhole),
        "udp-carrier" => Ok(Choice::UdpCarrier(Segmentation::Offload)),
        "udp-carrier-sw" => Ok(Choice::UdpCarrier(Segmentation::Software)),
        "vsock" => vsock.context(
            "the vsock topology needs a peer: give --vsock CID:PORT (a peer that reads and \
             discards)",
        ),
        other => bail!(
            "unknown topology {other:?}; expected tcp-loopback, udp-blackhole, udp-carrier or \
             udp-carrier-sw (and --vsock CID:PORT for vsock)"
        ),
    }
}

fn push_new(v: &mut Vec<Engine>, e: Engine) {
    if !v.contains(&e) {
        v.push(e);
    }
}

impl BenchArgs {
    /// Checks every flag.
    pub fn check(self) -> anyhow::Result<BenchOptions> {
        let (def_run, def_repeat) = if self.quick { (0.15, 2) } else { (0.6, 3) };
        let secs = self.duration.unwrap_or(def_run);
        units::seconds("--duration", secs)?;
        if secs > 600.0 {
            bail!("invalid --duration {secs}: give seconds per run, above 0 and at most 600");
        }
        let repeat = self.repeat.unwrap_or(def_repeat);
        if !(1..=100).contains(&repeat) {
            bail!("invalid --repeat {repeat}: give 1 to 100 repetitions");
        }
        let sizes = self
            .sizes
            .map(|v| {
                v.iter()
                    .map(|s| units::send_size("--sizes", s, MAX_SEND, "64M"))
                    .collect()
            })
            .transpose()?
            .map(|mut v: Vec<usize>| {
                v.sort_unstable();
                v.dedup();
                v
            });
        let mut engines = match self.engines {
            None => Engine::ZEROTX.to_vec(),
            Some(v) => {
                let mut out = Vec::new();
                for e in &v {
                    push_new(&mut out, e.trim().parse().map_err(anyhow::Error::msg)?);
                }
                out
            }
        };
        if engines.is_empty() {
            bail!("--engines is empty: name at least one engine");
        }
        if self.baselines {
            for e in Engine::RAW {
                push_new(&mut engines, e);
            }
        }
        if self.trains {
            for e in Engine::TRAINS {
                push_new(&mut engines, e);
            }
        }
        if self.train == 0 || self.train > MAX_TRAIN {
            bail!(
                "invalid --train {}: give 1 to {MAX_TRAIN} datagrams per train (the kernel's \
                 segment limit per call)",
                self.train
            );
        }
        match &self.liburing {
            Some(path) => {
                if !path.is_file() {
                    bail!(
                        "invalid --liburing {}: no such file (build it with \
                         scripts/compare-raw.sh)",
                        path.display()
                    );
                }
                push_new(&mut engines, Engine::LiburingZcFixed);
            }
            None if engines.contains(&Engine::LiburingZcFixed) => bail!(
                "the liburing-zc-fixed engine needs --liburing PATH (liburing's send-zerocopy \
                 example, built by scripts/compare-raw.sh)"
            ),
            None => {}
        }
        let vsock = self.vsock.as_deref().map(parse_vsock).transpose()?;
        let mut topologies: Vec<Choice> = match self.topology {
            None => vec![Choice::TcpLoopback, Choice::UdpBlackhole],
            Some(v) => v
                .iter()
                .map(|t| parse_topology(t, vsock))
                .collect::<anyhow::Result<_>>()?,
        };
        if let Some(v) = vsock {
            if !topologies.contains(&v) {
                topologies.push(v);
            }
        }
        if let Some(sizes) = &sizes {
            for t in &topologies {
                let t = t.build();
                let max = t.max_size();
                if sizes.iter().all(|&s| s > max) {
                    bail!(
                        "invalid --sizes for {}: it sends at most {max} bytes at once, and every \
                         size given is larger; give a size up to {max} or leave {} out of \
                         --topology",
                        t.name(),
                        t.name()
                    );
                }
            }
        }
        if self.ring_mib == 0 || self.ring_mib > 4096 {
            bail!("invalid --ring-mib {}: give 1 to 4096", self.ring_mib);
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            bail!(
                "invalid --batch {}: give 1 to {MAX_BATCH} buffers (half an io_uring \
                 submission queue of 256, so a batch's completions fit the completion queue)",
                self.batch
            );
        }
        let stdout = if self.json {
            Format::Json
        } else if self.csv {
            Format::Csv
        } else if self.markdown {
            Format::Markdown
        } else {
            Format::Table
        };
        let exports: Vec<(Format, PathBuf)> = [
            (Format::Json, self.export_json),
            (Format::Csv, self.export_csv),
            (Format::Markdown, self.export_markdown),
            (Format::Svg, self.plot),
        ]
        .into_iter()
        .filter_map(|(f, p)| p.map(|p| (f, p)))
        .collect();
        // Before measuring, so a path that cannot be written does not cost the whole run.
        for (format, path) in &exports {
            crate::export::check_writable(path)
                .with_context(|| format!("{} {}: fix the path", format.flag(), path.display()))?;
        }
        let bench = Settings {
            run: Duration::from_secs_f64(secs),
            repeat,
            sizes,
            engines,
            topologies,
            ring_bytes: self.ring_mib << 20,
            huge_pages: self.huge_pages,
            seed: self.seed,
            batch: self.batch,
            liburing: self.liburing,
            progress: self.progress,
            train: self.train,
        };
        Ok(BenchOptions {
            bench,
            stdout,
            exports,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str]) -> anyhow::Result<BenchOptions> {
        let cli = Cli::try_parse_from(["zerotx", "bench"].iter().chain(args))?;
        match cli.command {
            Command::Bench(b) => b.check(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn sizes_take_suffixes_and_refuse_nonsense() {
        let o = check(&["--sizes", "1400,4K,64kib,1M,1400"]).unwrap();
        assert_eq!(o.bench.sizes, Some(vec![1400, 4096, 65536, 1 << 20]));
        for bad in ["", "0", "x", "4G", "-1"] {
            let e = check(&["--sizes", bad]).unwrap_err().to_string();
            assert!(
                e.contains(&format!("invalid --sizes {bad:?}")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_topology_that_could_run_no_size_is_refused() {
        let e = check(&["--sizes", "64K", "--topology", "udp-blackhole"]).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("udp-blackhole") && e.contains("65507"), "{e}");
        // Some fit: the others are left out, and the report says so.
        assert!(check(&["--sizes", "1400,64K"]).is_ok());
        assert!(check(&["--sizes", "64K", "--topology", "tcp-loopback"]).is_ok());
    }

    #[test]
    fn the_vsock_topology_is_the_vsock_peer() {
        let o = check(&["--topology", "vsock", "--vsock", "3:1234"]).unwrap();
        assert_eq!(o.bench.topologies, [Choice::Vsock { cid: 3, port: 1234 }]);
        let o = check(&["--topology", "tcp-loopback,vsock", "--vsock", "3:1234"]).unwrap();
        assert_eq!(o.bench.topologies.len(), 2);
        let e = check(&["--topology", "vsock"]).unwrap_err().to_string();
        assert!(e.contains("give --vsock CID:PORT"), "{e}");
    }

    #[test]
    fn vsock_needs_cid_and_port() {
        assert_eq!(
            parse_vsock("3:5201").unwrap(),
            Choice::Vsock { cid: 3, port: 5201 }
        );
        assert!(parse_vsock("3").is_err());
        assert!(parse_vsock("a:1").unwrap_err().to_string().contains("CID"));
    }

    #[test]
    fn defaults_are_the_zerotx_engines_on_both_local_topologies() {
        let o = check(&[]).unwrap();
        assert_eq!(o.bench.engines, Engine::ZEROTX.to_vec());
        assert_eq!(
            o.bench.topologies,
            [Choice::TcpLoopback, Choice::UdpBlackhole]
        );
        assert_eq!(
            (o.bench.repeat, o.bench.run),
            (3, Duration::from_millis(600))
        );
        assert_eq!(o.stdout, Format::Table);
        assert!(o.exports.is_empty());
        let q = check(&["--quick"]).unwrap();
        assert_eq!(
            (q.bench.repeat, q.bench.run),
            (2, Duration::from_millis(150))
        );
        assert_eq!(
            (o.bench.seed, check(&["--seed", "9"]).unwrap().bench.seed),
            (0, 9)
        );
        assert_eq!(
            (
                o.bench.batch,
                check(&["--batch", "64"]).unwrap().bench.batch
            ),
            (32, 64)
        );
        assert_eq!(check(&["--batch", "128"]).unwrap().bench.batch, 128);
        for bad in ["0", "129"] {
            let e = check(&["--batch", bad]).unwrap_err().to_string();
            assert!(
                e.contains(&format!("invalid --batch {bad}: give 1 to 128")),
                "{e}"
            );
        }
    }

    #[test]
    fn trains_add_the_train_loops_and_the_carrier_topologies_parse() {
        let o = check(&[
            "--engines",
            "copy,raw-train-copy",
            "--trains",
            "--topology",
            "udp-carrier,udp-carrier-sw",
        ])
        .unwrap();
        let names: Vec<_> = o.bench.engines.iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            [
                "copy",
                "raw-train-copy",
                "train-auto",
                "train-copy",
                "train-msg-zc",
                "train-uring",
                "train-uring-zc",
                "train-uring-zc-fixed",
                "raw-train-msg-zc"
            ]
        );
        // zerotx's train columns are trains too: each send as many datagrams as fit 64 KiB.
        assert_eq!(o.bench.datagrams(Engine::TrainMsgZc, 1472), 44);
        assert_eq!(o.bench.datagrams(Engine::TrainAuto, 1200), 44);
        assert_eq!(
            o.bench.topologies,
            [
                Choice::UdpCarrier(Segmentation::Offload),
                Choice::UdpCarrier(Segmentation::Software)
            ]
        );
        assert_eq!(o.bench.train, DEFAULT_TRAIN);
        // A train is as many datagrams as fit 64 KiB; the other columns send one.
        assert_eq!(o.bench.datagrams(Engine::RawTrainMsgZc, 1472), 44);
        assert_eq!(o.bench.datagrams(Engine::RawTrainMsgZc, 1200), 44);
        assert_eq!(o.bench.datagrams(Engine::RawTrainMsgZc, 16384), 3);
        assert_eq!(o.bench.datagrams(Engine::RawTrainMsgZc, 65000), 1);
        assert_eq!(o.bench.datagrams(Engine::Copy, 1472), 1);
        assert_eq!(check(&["--train", "128"]).unwrap().bench.train, 128);
        for bad in ["0", "129"] {
            let e = check(&["--train", bad]).unwrap_err().to_string();
            assert!(e.contains(&format!("invalid --train {bad}")), "{e}");
        }
        // The carrier topologies send what a 1500-byte MTU carries.
        let e = check(&["--sizes", "4K", "--topology", "udp-carrier"]).unwrap_err();
        assert!(e.to_string().contains("at most 1472 bytes"), "{e}");
    }

    #[test]
    fn baselines_add_the_raw_loops_once_after_the_chosen_engines() {
        let o = check(&["--engines", "msg-zc,raw-copy,msg-zc", "--baselines"]).unwrap();
        let names: Vec<_> = o.bench.engines.iter().map(|e| e.name()).collect();
        assert_eq!(
            names,
            ["msg-zc", "raw-copy", "raw-msg-zc", "raw-uring-zc-fixed"]
        );
    }

    #[test]
    fn liburing_column_needs_a_binary() {
        let e = check(&["--engines", "liburing-zc-fixed"]).unwrap_err();
        assert!(e.to_string().contains("needs --liburing PATH"), "{e}");
        let e = check(&["--liburing", "/nonexistent/send-zerocopy"]).unwrap_err();
        assert!(e.to_string().contains("no such file"), "{e}");
        let o = check(&["--engines", "copy", "--liburing", "/bin/sh"]).unwrap();
        assert_eq!(o.bench.engines, [Engine::Copy, Engine::LiburingZcFixed]);
    }

    #[test]
    fn exports_go_to_their_files_and_stdout_formats_exclude_each_other() {
        let o = check(&["--markdown", "--export-json", "r.json", "--plot", "p.svg"]).unwrap();
        assert_eq!(o.stdout, Format::Markdown);
        assert_eq!(
            o.exports,
            [
                (Format::Json, PathBuf::from("r.json")),
                (Format::Svg, PathBuf::from("p.svg"))
            ]
        );
        assert!(check(&["--json", "--csv"]).is_err());
        assert!(check(&["--csv"]).is_ok());
        assert!(check(&["--csv", "--markdown"]).is_err());
    }

    /// A plot or export path that cannot be written is refused by the check, before any
    /// measuring; a path that can be is left as it was.
    #[test]
    fn export_paths_are_checked_before_measuring() {
        let e = check(&["--plot", "/nonexistent-zerotx-dir/p.svg"]).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("--plot /nonexistent-zerotx-dir/p.svg"),
            "{msg}"
        );
        let e = check(&["--export-csv", "/"]).unwrap_err();
        assert!(format!("{e:#}").contains("--export-csv /"), "{e:#}");
        let fresh = std::env::temp_dir().join(format!("zerotx-check-{}.json", std::process::id()));
        check(&["--export-json", fresh.to_str().unwrap()]).unwrap();
        assert!(!fresh.exists(), "the check leaves no file behind");
    }
}
