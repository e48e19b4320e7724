//! Progress on standard error: a bar on a terminal; elsewhere (logs, CI) nothing, or with
//! `--progress` one plain line per run.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressStyle};

use super::result::Run;
use super::scheduler::Event;

/// Counts runs done out of a total, from any thread.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    lines: bool,
    done: AtomicU64,
}

impl Progress {
    /// `total` runs to go; `lines`: one line per run where standard error is no terminal.
    pub fn new(total: u64, lines: bool) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}<{eta}]")
                    .expect("static template"),
            );
            b
        });
        Self {
            bar,
            total,
            lines,
            done: AtomicU64::new(0),
        }
    }

    /// One run (`what`) ended with `event`.
    pub fn step(&self, what: &str, event: &Event<'_, Run>) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let line = match event {
            Event::Done(r) => format!("{what}: {:.0} MB/s", r.mb_s()),
            Event::Failed(e) => format!("{what}: {e:#}"),
            Event::Skipped => format!("{what}: skipped after an error"),
        };
        match &self.bar {
            Some(b) => {
                b.set_message(line);
                b.inc(1);
            }
            None if self.lines => eprintln!("[{done}/{}] {line}", self.total),
            None => {}
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
