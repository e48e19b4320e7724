//! Standard output for people and scripts. A reader that goes away (`zerotx probe | head -2`)
//! is not an error and not the panic `println!` makes of the broken pipe: output stops, the
//! command winds down as an interruption would (a transfer ends its streams in order, a UDP
//! receiver flushes `--output`) and exits quietly with the status a shell gives a program killed
//! by SIGPIPE ([`CLOSED`], from `main`). The process keeps ignoring SIGPIPE (Rust's default): a
//! peer that closes a socket is an error the transfer reports, not a signal.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// The exit status of a command whose reader closed standard output: a shell's 128 + SIGPIPE.
pub const CLOSED: i32 = 141;

/// Set when a write found standard output's reader gone.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Whether standard output's reader went away: the command should wind down and exit
/// [`CLOSED`].
pub fn closed() -> bool {
    READER_GONE.load(Ordering::Relaxed)
}

/// Writes `args` to standard output and flushes it. Once the reader is gone, writes nothing;
/// any other failure (a full disk) ends the process with a message and status 1.
pub fn write(args: std::fmt::Arguments<'_>) {
    if closed() {
        return;
    }
    let mut out = io::stdout().lock();
    let r = out.write_fmt(args).and_then(|()| out.flush());
    if let Err(e) = r {
        fail(&e);
    }
}

/// Writes `bytes` to standard output, as [`write`].
pub fn write_bytes(bytes: &[u8]) {
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

/// `println!` through [`write`].
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// `print!` through [`write`].
macro_rules! out {
    ($($t:tt)*) => {
        $crate::stdout::write(format_args!($($t)*))
    };
}

pub(crate) use {out, outln};
