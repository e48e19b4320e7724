//! Standard output for people and scripts. A reader that goes away (`zerotx probe | head -2`)
//! is not an error and not the panic `println!` makes of the broken pipe: output stops, the
//! command winds down as an interruption would (a transfer ends its streams in order, a UDP
//! receiver flushes `--output`) and exits quietly with the status a shell gives a program killed
//! by SIGPIPE ([`CLOSED`], from `main`). The process keeps ignoring SIGPIPE (Rust's default): a
//! peer that closes a socket is an error the transfer reports, not a signal.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use anyhow::Context;

/// The exit status of a command whose reader closed standard output: a shell's 128 + SIGPIPE.
pub const CLOSED: i32 = 141;

/// Set when a write found standard output's reader gone.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Whether standard output's reader went away: the command should wind down and exit
/// [`CLOSED`].
pub fn closed() -> bool {
    READER_GONE.load(Ordering::Relaxed)
}

/// `--logfile`: where the output goes instead of standard output, once set.
static LOG: OnceLock<Mutex<File>> = OnceLock::new();

/// Sends everything written from now on to `path` (created if missing, appended to, as iperf3's
/// `--logfile`) instead of standard output.
pub fn log_to(path: &Path) -> anyhow::Result<()> {
    let f = File::options()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| {
            format!(
                "cannot open --logfile {}: give a file in a directory you can write",
                path.display()
            )
        })?;
    let _ = LOG.set(Mutex::new(f));
    Ok(())
}

/// Writes `args` to standard output (or `--logfile`) and flushes it. Once the reader is gone,
/// writes nothing; any other failure (a full disk) ends the process with a message and status 1.
pub fn write(args: std::fmt::Arguments<'_>) {
    write_bytes(args.to_string().as_bytes());
}

/// Writes `bytes` to standard output (or `--logfile`), as [`write()`].
pub fn write_bytes(bytes: &[u8]) {
    if let Some(log) = LOG.get() {
        let mut f = log.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(bytes) {
            eprintln!("Error: cannot write to --logfile: {e}");
            std::process::exit(1);
        }
        return;
    }
    if closed() {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        fail(&e);
    }
}

fn fail(e: &io::Error) {
    if e.kind() == io::ErrorKind::BrokenPipe {
        READER_GONE.store(true, Ordering::Relaxed);
        return;
    }
    eprintln!("Error: cannot write to standard output: {e}");
    std::process::exit(1);
}

/// `println!` through [`write()`].
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `print!` through [`write()`].
macro_rules! out {
    ($($t:tt)*) => {
        $crate::stdout::write(format_args!($($t)*))
    };
}

pub(crate) use {out, outln};
