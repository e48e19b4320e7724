//! What a sender tells an operator: log events (feature `tracing`) and process-wide metrics
//! (feature `metrics`). Both are read from what the sender already keeps ([`Stats`], its
//! [`Note`]s, the reports of released buffers) at construction, at each reap and at a close,
//! never on a send: the per-send path is the same with or without them. Without either feature
//! [`Watch`] is empty and every hook compiles to nothing.
//!
//! Every event has target `zerotx`, the socket's `peer` and the `engine` asked for. An event read
//! from a counter carries `count`: the decisions of that kind since the last event (one reap can
//! see several), so the sum of `count` over a kind's events equals its counter in [`Stats`].
//!
//! | event (message) | level | from |
//! |---|---|---|
//! | `engine chosen` (`path`, `zerocopy`, `reasons`: the [`explain`](crate::Sender::explain) text) | INFO | construction |
//! | `io_uring refused, using sendmsg(2)` (`reason`) | WARN | construction (`auto`) |
//! | `pool offered and not registered` (`reason`) | INFO | `register_pool` |
//! | `auto switched to copying` | INFO | [`Stats::switches_to_copy`] |
//! | `auto probe paid: back to zero-copy` | INFO | [`Stats::probes_paid`] |
//! | `auto probes sent` | DEBUG | [`Stats::probes`] |
//! | `zero-copy budget refused` (`then`: what follows) | WARN | [`Stats::enobufs`] |
//! | `auto copied for the budget (hold or cap)` | INFO | [`Stats::copied_budget`] |
//! | `auto waited at its in-flight cap` | DEBUG | [`Stats::cap_waits`] |
//! | `sent by copy after the budget refused (fallback)` | INFO | [`Stats::fallbacks`] |
//! | `completion refused` | WARN | [`Stats::bad_completions`] |
//! | `stream cut short` (`error`: the first; `datagrams failed` on a datagram socket) | WARN | [`Stats::errors`] |
//! | `closed with buffers kept` (`kept`) | WARN | [`Sender::close`](crate::Sender::close) or drop |

use crate::kind::EngineKind;
use crate::report::{Note, Released, Stats};
use crate::socket::Socket;

#[cfg(feature = "tracing")]
mod log;
#[cfg(feature = "metrics")]
mod meters;

/// A log event at `level` (a `tracing::Level` name) with target `zerotx`: `tracing::event!` with
/// the feature, nothing at all without it (its arguments are not even evaluated).
#[cfg(feature = "tracing")]
macro_rules! event {
    ($level:ident, $($rest:tt)*) => {
        ::tracing::event!(target: "zerotx", ::tracing::Level::$level, $($rest)*)
    };
}

/// See the `tracing` version: without the feature an event is nothing.
#[cfg(not(feature = "tracing"))]
#[allow(unused_macros)]
macro_rules! event {
    ($($rest:tt)*) => {};
}

#[allow(unused_imports)]
pub(crate) use event;

/// One sender's watch: what it last published (to compute deltas) and its handles. Empty
/// without the features.
#[derive(Debug)]
pub(crate) struct Watch {
    #[cfg(feature = "tracing")]
    log: log::Log,
    #[cfg(feature = "metrics")]
    meters: meters::Meters,
    /// The counters as last published.
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    last: Stats,
}

impl Watch {
    /// A new sender's watch: says which engine was chosen and why.
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), inline(always))]
    #[allow(unused_variables)]
    pub(crate) fn new(
        sock: &Socket,
        kind: EngineKind,
        path: &'static str,
        notes: &[Note],
        explain: impl FnOnce() -> crate::report::Explanation,
    ) -> Self {
        Self {
            #[cfg(feature = "tracing")]
            log: log::Log::new(sock, kind, path, notes, explain),
            #[cfg(feature = "metrics")]
            meters: meters::Meters::new(kind),
            #[cfg(any(feature = "tracing", feature = "metrics"))]
            last: Stats::default(),
        }
    }

    /// After a reap that appended `released` (or a wait that kept its releases for a later
    /// reap: none): publishes what changed since the last call (`stats` is read only when
    /// someone listens). `failed`: the first error of a buffer released since the last flush.
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), inline(always))]
    #[allow(unused_variables)]
    pub(crate) fn reaped<B>(
        &mut self,
        stats: impl FnOnce() -> Stats,
        released: &[Released<B>],
        failed: Option<&std::io::Error>,
    ) {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        {
            #[cfg(feature = "metrics")]
            let listening = true;
            #[cfg(not(feature = "metrics"))]
            let listening = log::listening();
            if !listening {
                return;
            }
            let now = stats();
            #[cfg(feature = "tracing")]
            self.log.changed(&self.last, &now, released, failed);
            #[cfg(feature = "metrics")]
            self.meters.changed(&self.last, &now, released);
            self.last = now;
        }
    }

    /// A decision noted after construction (a pool offered and not registered).
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), inline(always))]
    #[allow(unused_variables)]
    pub(crate) fn noted(&self, note: &Note) {
        #[cfg(feature = "tracing")]
        self.log.noted(note);
    }

    /// The sender gave up: `kept` buffers the kernel still holds are kept, never handed back.
    /// Publishes the last changes (`stats`, `released`) and takes this sender's gauges off.
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), inline(always))]
    #[allow(unused_variables)]
    pub(crate) fn closed<B>(
        &mut self,
        stats: impl FnOnce() -> Stats,
        released: &[Released<B>],
        kept: usize,
    ) {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        {
            self.reaped(stats, released, None);
            #[cfg(feature = "tracing")]
            self.log.closed(kept);
            #[cfg(feature = "metrics")]
            self.meters.closed(&self.last, kept);
            (self.last.zerocopy_in_flight, self.last.pinned_bytes) = (0, 0);
            (self.last.cap_sends, self.last.cap_bytes) = (None, None);
        }
    }
}

// Without the features a sender carries nothing for them: the watch takes no room, and its
// hooks (empty `#[inline(always)]` functions, their closures never called) compile to nothing.
#[cfg(not(any(feature = "tracing", feature = "metrics")))]
const _: () = assert!(std::mem::size_of::<Watch>() == 0);

/// How many more of a counter than at the last look.
#[cfg(any(feature = "tracing", feature = "metrics"))]
fn delta(last: u64, now: u64) -> u64 {
    now.saturating_sub(last)
}
