//! What a sender tells about each buffer it gives back, and about itself.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

mod copiers;
mod explain;

pub(crate) use copiers::{Delivery, PathFacts};
pub use explain::Explanation;
pub(crate) use explain::{explain, AutoFacts, Note, COPY_ONLY, SENDMSG, URING};

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
    /// `auto`: smaller than the size from which zero-copy pays on this socket.
    Small,
    /// `auto`: most recent zero-copy sends on this socket came back copied by the kernel (a local
    /// peer, a device without scatter-gather), so it copies, and probes now and then.
    RouteCopies,
    /// `auto`: the zero-copy budget (option memory, locked memory) was refused recently or this
    /// sender is at its in-flight cap, and [`AtCap::Copy`](crate::AtCap::Copy) applies.
    Budget,
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
// `repr(C)`, the buffer first: the engines write it into the caller's vector word for word as it
// was read from the send queue, with no padding in front of it to carry along (docs/fast-path.md).
#[derive(Debug)]
#[repr(C)]
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
    /// `auto`: buffers copied because they were below the zero-copy size ([`CopyReason::Small`]).
    pub copied_small: u64,
    /// `auto`: buffers copied because the route copies ([`CopyReason::RouteCopies`]).
    pub copied_route: u64,
    /// `auto`: buffers copied for the zero-copy budget ([`CopyReason::Budget`]).
    pub copied_budget: u64,
    /// `auto`: zero-copy probes sent while the route copied, and how many came back not copied
    /// (each of those switched the sender back to zero-copy).
    pub probes: u64,
    /// See [`probes`](Self::probes).
    pub probes_paid: u64,
    /// `auto`: times a window of zero-copy sends came back mostly copied and the sender switched
    /// to copying.
    pub switches_to_copy: u64,
    /// `auto`: sends that waited at the in-flight cap ([`AtCap::Wait`](crate::AtCap::Wait)).
    pub cap_waits: u64,
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
    /// Reads of the socket's error queue (`recvmsg(MSG_ERRQUEUE)`), the ones that found it empty
    /// included: with `completions`, what reaping costs in system calls.
    pub errqueue_reads: u64,
    /// Buffers released with an error after part of them was sent.
    pub errors: u64,
    /// Trains accepted ([`Sender::send_train`](crate::Sender::send_train)): buffers sent as UDP
    /// GSO trains of datagrams.
    pub trains: u64,
    /// Trains whose path refused them as one GSO packet (`EIO`: a device or route that cannot
    /// checksum one), sent one datagram per call by copy instead; later trains to that path go so
    /// at once, and are not counted again.
    pub train_splits: u64,
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
            SendPath::Copied(CopyReason::Small) => self.copied_small += 1,
            SendPath::Copied(CopyReason::RouteCopies) => self.copied_route += 1,
            SendPath::Copied(CopyReason::Budget) => self.copied_budget += 1,
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
