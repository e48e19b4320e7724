//! The `zerotx` command. Parsing lives in `cli`, each command in its own module.

mod bench;
mod cli;
mod export;
mod probe;

use anyhow::Context;
use clap::Parser;

fn run() -> anyhow::Result<()> {
    match cli::Cli::parse().command {
        cli::Command::Probe { json } => probe::run(json),
        cli::Command::Bench(args) => run_bench(args),
    }
}

fn run_bench(args: cli::BenchArgs) -> anyhow::Result<()> {
    let opts = args.check()?;
    let report = bench::run(&opts)?;
    match opts.format {
        bench::Format::Table => print!("{}", export::table::render(&report)),
        bench::Format::Json => println!("{}", export::json::render(&report)?),
        bench::Format::Csv => print!("{}", export::csv::render(&report)?),
    }
    if let Some(path) = &opts.plot {
        export::svg::write(&report, path)
            .with_context(|| format!("drawing the plot into {}", path.display()))?;
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}
