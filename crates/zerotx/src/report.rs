//! What a sender tells about each buffer it gives back, and about itself.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// How a buffer's bytes left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendPath {
    /// The kernel sent straight from the buffer's pages.
    ZeroCopy,
    /// The bytes were copied; the reason says by whom.
    Copied(CopyReason),
}

/// Why a buffer was copied. A statistic and an input to policy, never an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CopyReason {
    /// The engine copies by design (`copy`, `uring`) or the socket kind has no zero-copy.
    Engine,
    /// A zero-copy send whose completion said the kernel copied it (loopback, a device without
    /// scatter-gather, fragmentation). Coalesced ranges make this a sample: see the ledger docs.
    Kernel,
    /// zerotx sent it by copy after `ENOBUFS` with nothing in flight to wait for.
    Fallback,
}

impl SendPath {
    /// Whether the kernel really skipped the copy.
    pub fn is_zerocopy(&self) -> bool {
        matches!(self, SendPath::ZeroCopy)
    }
}

/// The report that comes back with a released buffer.
#[derive(Debug)]
#[non_exhaustive]
pub struct Report {
    /// Bytes of the buffer the kernel accepted (the full length unless `error` is set).
    pub bytes: usize,
    /// How they left.
    pub path: SendPath,
    /// From the send call that accepted the buffer to its release, for one send in 61 (a clock
    /// read per send would cost a few percent of a small send); `None` for the others.
    pub latency: Option<Duration>,
    /// Set when the send stopped part way (a stream socket reset after a short write).
    pub error: Option<io::Error>,
}

/// A buffer the kernel is done with, and how it went.
#[derive(Debug)]
pub struct Released<B> {
    /// The buffer, now the caller's to change or drop.
    pub buf: B,
    /// What happened to it.
    pub report: Report,
}

/// Counters for one sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Buffers accepted.
    pub sends: u64,
    /// Send system calls (or io_uring requests) issued.
    pub syscalls: u64,
    /// Bytes the kernel accepted.
    pub bytes: u64,
    /// Buffers released as sent zero-copy.
    pub zerocopy: u64,
    /// Buffers released as copied by the kernel.
    pub kernel_copied: u64,
    /// Buffers released as copied by a copy engine.
    pub engine_copied: u64,
    /// Buffers sent (wholly or partly) by copy after `ENOBUFS`.
    pub fallbacks: u64,
    /// Zero-copy budget refusals seen: `ENOBUFS` (option memory, locked memory) from
    /// `MSG_ZEROCOPY`, `ENOBUFS`/`ENOMEM` from io_uring.
    pub enobufs: u64,
    /// Sends handed back with `WouldBlock`.
    pub would_block: u64,
    /// Completion notifications read (error-queue messages or notification CQEs).
    pub completions: u64,
    /// Completion messages the ledger refused (never sent, duplicate): counted and skipped.
    pub bad_completions: u64,
    /// Other error-queue messages skipped (timestamps, ICMP errors).
    pub skipped_messages: u64,
    /// Buffers released with an error after part of them was sent.
    pub errors: u64,
    /// `MSG_ZEROCOPY` ids the kernel took for this sender's calls (as the sender learned them;
    /// a short vsock call counts one).
    pub zerocopy_ids: u64,
    /// `MSG_ZEROCOPY` ids whose completion arrived. Equal to `zerocopy_ids` once everything was
    /// released: every id completed exactly once.
    pub zerocopy_ids_completed: u64,
}

impl Stats {
    /// Counts one released buffer.
    pub(crate) fn count_release(&mut self, path: SendPath, failed: bool) {
        match path {
            SendPath::ZeroCopy => self.zerocopy += 1,
            SendPath::Copied(CopyReason::Kernel) => self.kernel_copied += 1,
            SendPath::Copied(CopyReason::Engine) => self.engine_copied += 1,
            SendPath::Copied(CopyReason::Fallback) => self.fallbacks += 1,
        }
        if failed {
            self.errors += 1;
        }
    }
}

/// What to wait for before the sender can make progress: poll `fd` for `events`.
///
/// `POLLERR` is always reported by the kernel without being asked; with `MSG_ZEROCOPY` it means
/// completions are waiting on the error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// The descriptor to poll: the socket, or the engine's io_uring.
    pub fd: RawFd,
    /// `POLLOUT` (blocked on room in the socket), `POLLIN` (a ring's completions) or 0 (only
    /// completions can help; `POLLERR` is implied).
    pub events: i16,
}
