//! What a sender tells about each buffer it gives back, and about itself.

use std::fmt;
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
    /// Set when the send stopped part way (a stream socket reset after a short write), or the
    /// kernel refused it after the call (an io_uring request's `-errno`, a train the path
    /// refused): the kernel's error as it gave it, so `raw_os_error()` is its errno. What to do
    /// where the errno says little: [`advice`](Self::advice), also in this report's `Display`.
    pub error: Option<io::Error>,
}

impl Report {
    /// What to do about [`error`](Self::error), where its errno says little (the table of
    /// [`SendError::advice`](crate::SendError::advice)).
    pub fn advice(&self) -> Option<&'static str> {
        self.error
            .as_ref()
            .and_then(io::Error::raw_os_error)
            .and_then(crate::error::advice)
    }
}

/// `"{bytes} bytes, zero-copy"`, `"... copied (Kernel)"`, and the error with its advice.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, ", self.bytes)?;
        match self.path {
            SendPath::ZeroCopy => f.write_str("zero-copy")?,
            SendPath::Copied(reason) => write!(f, "copied ({reason:?})")?,
        }
        match &self.error {
            Some(e) => write!(f, ", failed: {e}{}", crate::error::Advice(e)),
            None => Ok(()),
        }
    }
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

/// Counters for one sender, and its zero-copy budget gauges (what it holds now against its
/// caps). [`merge`](Self::merge) sums senders' stats, for a process or a server's view.
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
    /// Buffers of [`Sender::send_batch`](crate::Sender::send_batch) (and `try_send_batch`) that
    /// went in trains: runs of equal-size datagrams sent as one UDP GSO call each (each run also
    /// counts one in [`trains`](Self::trains));
    /// [`SenderConfig::with_batch_trains`](crate::SenderConfig::with_batch_trains).
    pub batch_train_buffers: u64,
    /// `MSG_ZEROCOPY` ids the kernel took for this sender's calls (as the sender learned them;
    /// a short vsock call counts one).
    pub zerocopy_ids: u64,
    /// `MSG_ZEROCOPY` ids whose completion arrived. Equal to `zerocopy_ids` once everything was
    /// released: every id completed exactly once.
    pub zerocopy_ids_completed: u64,
    /// Gauge: zero-copy sends the kernel still holds (`MSG_ZEROCOPY` ids or io_uring zero-copy
    /// requests awaiting their completion). Each holds option memory (`optmem_max`) until then.
    pub zerocopy_in_flight: u64,
    /// Gauge: bytes of those sends (pages the kernel keeps pinned, charged to `RLIMIT_MEMLOCK`),
    /// where the engine counts them: io_uring, and `auto` on `sendmsg(2)`; 0 for `msg-zc`.
    pub pinned_bytes: u64,
    /// `auto`'s cap on [`zerocopy_in_flight`](Self::zerocopy_in_flight), if any (half of
    /// `optmem_max` in completions).
    pub cap_sends: Option<u64>,
    /// `auto`'s cap on [`pinned_bytes`](Self::pinned_bytes), if any (half of `RLIMIT_MEMLOCK`).
    pub cap_bytes: Option<u64>,
}

impl Stats {
    /// Adds `other` to these: every counter and gauge summed, and a cap summed where either side
    /// has one (the merged gauges stay comparable with the merged caps of the senders that have
    /// caps). For one view of many senders (a server's connections):
    ///
    /// ```
    /// # let senders: Vec<zerotx::Sender<Vec<u8>>> = Vec::new();
    /// let total = senders.iter().fold(zerotx::Stats::default(), |mut t, s| {
    ///     t.merge(&s.stats());
    ///     t
    /// });
    /// assert_eq!(total.sends, 0);
    /// ```
    pub fn merge(&mut self, other: &Stats) {
        let Stats {
            sends,
            syscalls,
            bytes,
            zerocopy,
            kernel_copied,
            engine_copied,
            fallbacks,
            copied_small,
            copied_route,
            copied_budget,
            probes,
            probes_paid,
            switches_to_copy,
            cap_waits,
            enobufs,
            would_block,
            completions,
            bad_completions,
            skipped_messages,
            errqueue_reads,
            errors,
            zerocopy_ids,
            zerocopy_ids_completed,
            zerocopy_in_flight,
            pinned_bytes,
            cap_sends,
            cap_bytes,
            trains,
            train_splits,
            batch_train_buffers,
        } = *other;
        self.sends += sends;
        self.syscalls += syscalls;
        self.bytes += bytes;
        self.zerocopy += zerocopy;
        self.kernel_copied += kernel_copied;
        self.engine_copied += engine_copied;
        self.fallbacks += fallbacks;
        self.copied_small += copied_small;
        self.copied_route += copied_route;
        self.copied_budget += copied_budget;
        self.probes += probes;
        self.trains += trains;
        self.train_splits += train_splits;
        self.batch_train_buffers += batch_train_buffers;
        self.probes_paid += probes_paid;
        self.switches_to_copy += switches_to_copy;
        self.cap_waits += cap_waits;
        self.enobufs += enobufs;
        self.would_block += would_block;
        self.completions += completions;
        self.bad_completions += bad_completions;
        self.skipped_messages += skipped_messages;
        self.errqueue_reads += errqueue_reads;
        self.errors += errors;
        self.zerocopy_ids += zerocopy_ids;
        self.zerocopy_ids_completed += zerocopy_ids_completed;
        self.zerocopy_in_flight += zerocopy_in_flight;
        self.pinned_bytes += pinned_bytes;
        self.cap_sends = add_caps(self.cap_sends, cap_sends);
        self.cap_bytes = add_caps(self.cap_bytes, cap_bytes);
    }

    /// Buffers released, by every path.
    pub fn released(&self) -> u64 {
        self.zerocopy
            + self.kernel_copied
            + self.engine_copied
            + self.fallbacks
            + self.copied_small
            + self.copied_route
            + self.copied_budget
    }
}

/// Two caps summed; a side without a cap adds nothing.
fn add_caps(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

impl std::iter::Sum for Stats {
    fn sum<I: Iterator<Item = Stats>>(iter: I) -> Stats {
        iter.fold(Stats::default(), |mut t, s| {
            t.merge(&s);
            t
        })
    }
}

impl<'a> std::iter::Sum<&'a Stats> for Stats {
    fn sum<I: Iterator<Item = &'a Stats>>(iter: I) -> Stats {
        iter.fold(Stats::default(), |mut t, s| {
            t.merge(s);
            t
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_shows_its_path_and_its_error_with_what_to_do() {
        let mut r = Report {
            bytes: 2000,
            path: SendPath::ZeroCopy,
            latency: None,
            error: None,
        };
        assert_eq!(r.to_string(), "2000 bytes, zero-copy");
        assert_eq!(r.advice(), None);
        r.bytes = 0;
        r.path = SendPath::Copied(CopyReason::Engine);
        r.error = Some(io::Error::from_raw_os_error(libc::EMSGSIZE));
        assert_eq!(r.advice(), Some(crate::error::TOO_LARGE));
        let shown = r.to_string();
        assert!(
            shown.starts_with("0 bytes, copied (Engine), failed: "),
            "{shown}"
        );
        assert!(shown.ends_with(crate::error::TOO_LARGE), "{shown}");
    }

    #[test]
    fn merge_sums_every_counter_and_gauge_and_the_caps_that_exist() {
        let a = Stats {
            sends: 3,
            bytes: 300,
            zerocopy: 2,
            copied_small: 1,
            zerocopy_in_flight: 4,
            pinned_bytes: 4096,
            cap_sends: Some(10),
            ..Stats::default()
        };
        let b = Stats {
            sends: 1,
            bytes: 50,
            kernel_copied: 1,
            errors: 1,
            zerocopy_in_flight: 1,
            cap_bytes: Some(1 << 20),
            ..Stats::default()
        };
        let mut m = a;
        m.merge(&b);
        assert_eq!((m.sends, m.bytes, m.errors), (4, 350, 1));
        assert_eq!((m.zerocopy, m.kernel_copied, m.copied_small), (2, 1, 1));
        assert_eq!((m.zerocopy_in_flight, m.pinned_bytes), (5, 4096));
        assert_eq!((m.cap_sends, m.cap_bytes), (Some(10), Some(1 << 20)));
        assert_eq!(m.released(), 4);
        assert_eq!([a, a].iter().sum::<Stats>().cap_sends, Some(20));
        assert_eq!([a, b].into_iter().sum::<Stats>(), m);
        // Merging nothing changes nothing.
        m.merge(&Stats::default());
        assert_eq!([a, b].into_iter().sum::<Stats>(), m);
    }
}
