//! Command-line parsing (clap). Checked options go to the runners; nothing here does work.

use clap::{Parser, Subcommand};

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
    /// What this host supports for zero-copy transmit, and what to tune.
    Probe {
        /// Print JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
}
