//! Command-line parsing (clap). Checked options go to the runners; nothing here does work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// zerotx: zero-copy socket transmit for Linux, measured on this machine.
#[derive(Debug, Parser)]
#[command(name = "zerotx", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Copy vs zero-copy on this machine: a table per topology, like the kernel's own tables.
    Bench(BenchArgs),
    /// What this host supports for zero-copy transmit, and what to tune.
    Probe {
        /// Print JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `zerotx bench` flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// About 30 s: shorter runs, two repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per run of one cell [default: 0.6, or 0.15 with --quick].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Repetitions per cell, interleaved across engines [default: 3, or 2 with --quick].
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// Bytes per send, comma-separated, K/M suffixes allowed (1400,4K,64K,1M) [default: per
    /// topology, as the kernel's tables].
    #[arg(long, value_delimiter = ',', value_name = "SIZES")]
    pub sizes: Option<Vec<String>>,
    /// Engines, comma-separated: copy, msg-zc, uring, uring-zc, uring-zc-fixed [default: all].
    #[arg(long, value_delimiter = ',', value_name = "ENGINES")]
    pub engines: Option<Vec<String>>,
    /// Topologies, comma-separated: tcp-loopback, udp-blackhole [default: both; vsock is added by
    /// --vsock].
    #[arg(long, value_delimiter = ',', value_name = "TOPOLOGIES")]
    pub topology: Option<Vec<String>>,
    /// Also measure AF_VSOCK to CID:PORT, a peer that reads and discards (for example
    /// `socat VSOCK-LISTEN:PORT,fork /dev/null` in the VM or host).
    #[arg(long, value_name = "CID:PORT")]
    pub vsock: Option<String>,
    /// Size of the buffer ring each run cycles through, MiB (larger than the L2 cache).
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub ring_mib: usize,
    /// Print JSON instead of the table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (one row per cell) instead of the table.
    #[arg(long)]
    pub csv: bool,
    /// Also draw throughput vs size per engine and topology into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}
