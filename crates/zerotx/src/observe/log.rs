//! The log events of one sender (feature `tracing`): the table in the module above.

use super::{delta, event};
use crate::kind::EngineKind;
use crate::report::{Note, Released, Stats};
use crate::socket::Socket;

/// What every event of one sender names: its peer and engine.
#[derive(Debug)]
pub(super) struct Log {
    peer: String,
    engine: EngineKind,
    /// A stream or seqpacket socket, where a failed buffer cuts the stream short.
    ordered: bool,
}

/// Whether a subscriber wants zerotx's events: only then does a reap read the counters for them.
pub(super) fn listening() -> bool {
    tracing::enabled!(target: "zerotx", tracing::Level::INFO)
}

/// The socket's peer in words: an IP or vsock address, or why there is none.
fn peer(sock: &Socket) -> String {
    match socket2::SockRef::from(&sock.fd()).peer_addr() {
        Ok(a) => match (a.as_socket(), a.as_vsock_address()) {
            (Some(ip), _) => ip.to_string(),
            (None, Some((cid, port))) => format!("vsock {cid}:{port}"),
            (None, None) => format!("{} peer", sock.kind),
        },
        Err(_) => format!("unconnected {}", sock.kind),
    }
}

impl Log {
    /// Says which engine a new sender runs and why, and whether `auto` fell back from io_uring.
    pub(super) fn new(
        sock: &Socket,
        kind: EngineKind,
        path: &'static str,
        notes: &[Note],
        explain: impl FnOnce() -> crate::report::Explanation,
    ) -> Self {
        let log = Self {
            peer: peer(sock),
            engine: kind,
            ordered: sock.kind.is_ordered(),
        };
        if !listening() {
            return log;
        }
        let x = explain();
        event!(
            INFO,
            peer = %log.peer,
            engine = %kind,
            path,
            zerocopy = x.zerocopy,
            reasons = %x.lines.join("; "),
            "engine chosen"
        );
        for n in notes {
            if let Note::UringRefused(e) | Note::UringUnavailable(e) = n {
                event!(
                    WARN,
                    peer = %log.peer,
                    engine = %kind,
                    reason = %e,
                    "io_uring refused, using sendmsg(2)"
                );
            }
        }
        log
    }

    /// A decision made after construction.
    pub(super) fn noted(&self, note: &Note) {
        if let Note::HugePoolNotRegistered | Note::PoolWithoutRegisteredSends = note {
            event!(
                INFO,
                peer = %self.peer,
                engine = %self.engine,
                reason = %note,
                "pool offered and not registered"
            );
        }
    }

    /// One event per kind of decision whose counter moved between `last` and `now`.
    pub(super) fn changed<B>(
        &self,
        last: &Stats,
        now: &Stats,
        released: &[Released<B>],
        failed: Option<&std::io::Error>,
    ) {
        let (peer, engine) = (&self.peer, self.engine);
        let moved = |f: fn(&Stats) -> u64| delta(f(last), f(now));
        let n = moved(|s| s.switches_to_copy);
        if n > 0 {
            event!(INFO, %peer, %engine, count = n, "auto switched to copying");
        }
        let n = moved(|s| s.probes);
        if n > 0 {
            event!(DEBUG, %peer, %engine, count = n, "auto probes sent");
        }
        let n = moved(|s| s.probes_paid);
        if n > 0 {
            event!(INFO, %peer, %engine, count = n, "auto probe paid: back to zero-copy");
        }
        let n = moved(|s| s.enobufs);
        if n > 0 {
            let then = if engine == EngineKind::Auto {
                "auto copies the next sends for a while (a hold), then tries zero-copy again"
            } else {
                "completions are read and the send retried, or finished by copy"
            };
            event!(WARN, %peer, %engine, count = n, then, "zero-copy budget refused");
        }
        let n = moved(|s| s.copied_budget);
        if n > 0 {
            event!(INFO, %peer, %engine, count = n, "auto copied for the budget (hold or cap)");
        }
        let n = moved(|s| s.cap_waits);
        if n > 0 {
            event!(DEBUG, %peer, %engine, count = n, "auto waited at its in-flight cap");
        }
        let n = moved(|s| s.fallbacks);
        if n > 0 {
            event!(
                INFO,
                %peer,
                %engine,
                count = n,
                "sent by copy after the budget refused (fallback)"
            );
        }
        let n = moved(|s| s.bad_completions);
        if n > 0 {
            event!(WARN, %peer, %engine, count = n, "completion refused");
        }
        let n = moved(|s| s.errors);
        if n > 0 {
            let error = failed
                .or_else(|| released.iter().find_map(|r| r.report.error.as_ref()))
                .map_or_else(
                    || "(taken by an earlier flush)".to_string(),
                    ToString::to_string,
                );
            if self.ordered {
                event!(WARN, %peer, %engine, count = n, %error, "stream cut short");
            } else {
                event!(WARN, %peer, %engine, count = n, %error, "datagrams failed");
            }
        }
    }

    /// The sender gave up with `kept` buffers still held by the kernel.
    pub(super) fn closed(&self, kept: usize) {
        if kept > 0 {
            event!(
                WARN,
                peer = %self.peer,
                engine = %self.engine,
                kept,
                "closed with buffers kept"
            );
        }
    }
}
