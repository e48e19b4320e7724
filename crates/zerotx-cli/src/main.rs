//! The `zerotx` command, laid out like hyperfine so each piece has its own file:
//! `options` (every flag, checked into typed options) -> `bench` (topologies, scheduler, runner,
//! engines) -> `export` (one exporter per format); `probe` prints what the host supports;
//! `transfer` is `send` and `recv` (iperf3-style bulk transfer); `stdout` is where they print;
//! `units` reads every size, rate and time the same way.
//!
//! Ours, and why: the benchmark method (interleaved repetitions, the same timed loop for every
//! engine); the transfer's generated stream (`transfer/pattern.rs`: self-locating words, so a
//! receiver verifies and counts UDP loss with no header, where iperf3 needs its own control
//! connection and framing); the iperf3-shaped output. Flags (clap), progress bars (indicatif),
//! JSON (serde_json), file mapping (memmap2), `sendfile` (rustix) and signals (signal-hook) come
//! from crates made for the job.
#![deny(unsafe_code)]

mod bench;
mod export;
mod options;
mod probe;
mod stdout;
mod transfer;
mod units;

use clap::Parser;

fn run() -> anyhow::Result<()> {
    match options::Cli::parse().command {
        options::Command::Probe { json, explain, to } => probe::run(json, explain, to.as_deref()),
        options::Command::Bench(args) => {
            let opts = args.check()?;
            let report = bench::run(&opts.bench)?;
            export::print(&report, opts.stdout)?;
            for (format, path) in &opts.exports {
                export::write(&report, *format, path)?;
            }
            Ok(())
        }
        options::Command::Send(args) => transfer::send::run(*args),
        options::Command::Recv(args) => transfer::recv::run(*args),
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
    if stdout::closed() {
        std::process::exit(stdout::CLOSED);
    }
}
