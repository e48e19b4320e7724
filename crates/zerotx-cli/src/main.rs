//! The `zerotx` command. Parsing lives in `cli`, each command in its own module.

mod cli;
mod probe;

use clap::Parser;

fn run() -> anyhow::Result<()> {
    match cli::Cli::parse().command {
        cli::Command::Probe { json } => probe::run(json),
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}
