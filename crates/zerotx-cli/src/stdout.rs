//! Standard output for people and scripts. A reader that goes away (`zerotx probe | head -2`)
//! ends the command quietly with the status a shell gives a program killed by SIGPIPE, instead
//! of the panic `println!` makes of the broken pipe. The process keeps ignoring SIGPIPE (Rust's
//! default): a peer that closes a socket is an error the transfer reports, not a signal.

use std::io::{self, Write};

/// The exit status of a command whose reader closed standard output: a shell's 128 + SIGPIPE.
pub const CLOSED: i32 = 141;

/// Writes `args` to standard output and flushes it. A closed reader ends the process quietly
/// ([`CLOSED`]); any other failure (a full disk) ends it with a message and status 1.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    let r = out.write_fmt(args).and_then(|()| out.flush());
    if let Err(e) = r {
        fail(&e);
    }
}

/// Writes `bytes` to standard output, as [`write`].
pub fn write_bytes(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        fail(&e);
    }
}

fn fail(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(CLOSED);
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
