//! The records an io_uring engine's state is made of, each with its invariant in its doc
//! comment, and the [`Order`] of its socket. The shared core (`core.rs`) keeps one of each and
//! decides the order of the steps; a record only keeps its own invariant.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use socket2::SockAddr;

use super::cqe::{Req, Then};
use crate::buf::SendBuf;
use crate::engine::policy::train::{self as trains, SplitPaths, TrainFailure};
use crate::engine::record::Record;
use crate::engine::sendmsg_train::{check_train, kernel_train_segments, split_train, BatchRuns};
use crate::report::Stats;
use crate::sys::uring::SendOp;

/// A request of this engine: a record and the engine's account of it.
pub(super) type Op<B> = SendOp<Record<B>, Req>;

/// A request for a new record of `buf` (see [`Record::new`]), in `spare` (a finished request's
/// box, whose record was released) if there is one: the record is refilled in place, not built
/// and moved in.
pub(super) fn op_for<B: SendBuf>(
    spare: Option<Box<Op<B>>>,
    buf: B,
    dest: Option<Box<SockAddr>>,
    started: Option<Instant>,
) -> Box<Op<B>> {
    match spare {
        Some(mut op) => {
            op.payload_mut().refill(buf, dest, started);
            op
        }
        None => SendOp::new(Record::new(buf, dest, started)),
    }
}

/// A record due for its next request, in the box that request will use.
pub(super) struct Next<B> {
    pub(super) op: Box<Op<B>>,
    /// Goes zero-copy if it can (else by copy: the `uring` engine, or a fallback).
    pub(super) zc: bool,
    pub(super) resubmits: u32,
}

/// The sender's place on its ring. `owner` names it there until `left`; after that nothing of
/// this sender is touched on the ring again. `fd` is the socket as the engine's own descriptor,
/// which every SQE names: it is closed only once no SQE in the SQ can name it, and leaked
/// (`leak_fd`) when that could not be made sure, so a number an SQE names is never reused
/// under it. The caller may close or hand back their own descriptor at any time.
pub(super) struct Seat {
    pub(super) owner: u16,
    pub(super) left: bool,
    pub(super) fd: Option<OwnedFd>,
    pub(super) leak_fd: bool,
}

impl Seat {
    pub(super) fn new(owner: u16, fd: OwnedFd) -> Self {
        Self {
            owner,
            left: false,
            fd: Some(fd),
            leak_fd: false,
        }
    }

    /// The descriptor SQEs name (`-1` only after the engine let go of it).
    pub(super) fn raw_fd(&self) -> i32 {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }
}

/// How a socket's requests are ordered, the one rule the io_uring engine's two types differ in
/// below their batches: [`Head`] for a connection (`UringStream`), [`Unordered`] for a datagram
/// socket (`UringDatagram`). The type is fixed when the factory builds the engine, so the shared
/// core asks it without a flag per call.
pub(super) trait Order {
    /// One request in flight at a time: two in flight can reorder a connection.
    const ORDERED: bool;
    /// Several buffers per request, `MSG_WAITALL`, short results continued (byte streams).
    fn merge(&self) -> bool;
    /// A request of the stream is out or due: no other may form.
    fn busy(&self) -> bool;
    /// A request formed: it has the stream until it went whole.
    fn take(&mut self);
    /// The request went whole: the next may form.
    fn went(&mut self);
    /// A send failed with `errno`: the stream ends here.
    fn break_with(&mut self, errno: i32);
    /// The errno that ended the stream, if one did.
    fn broken(&self) -> Option<i32>;
}

/// The head of a connection's stream (TCP, AF_UNIX and vsock streams, SEQPACKET, SCTP). `busy`:
/// its one request is out, or waiting in [`Due`] to be pushed; no other request may form until
/// its first CQE says it went whole. `broken`: a send failed with this errno, and nothing more
/// may go out (it would leave a gap): every buffer after it comes back with the error. `merge`,
/// fixed when the engine is built: a byte stream's request carries several buffers with
/// `MSG_WAITALL` and a short result is continued; a message socket's (SEQPACKET, SCTP) carries
/// one message, never merged.
#[derive(Debug)]
pub(super) struct Head {
    busy: bool,
    broken: Option<i32>,
    merge: bool,
}

impl Head {
    /// The head of an idle stream; `merge` on a byte stream.
    pub(super) fn new(merge: bool) -> Self {
        Self {
            busy: false,
            broken: None,
            merge,
        }
    }
}

impl Order for Head {
    const ORDERED: bool = true;

    fn merge(&self) -> bool {
        self.merge
    }

    fn busy(&self) -> bool {
        self.busy
    }

    fn take(&mut self) {
        self.busy = true;
    }

    fn went(&mut self) {
        self.busy = false;
    }

    fn break_with(&mut self, errno: i32) {
        self.busy = false;
        self.broken = Some(errno);
    }

    fn broken(&self) -> Option<i32> {
        self.broken
    }
}

/// A datagram socket's order: none. Many requests in flight, one per buffer; a failed datagram
/// is that datagram's error alone, and nothing breaks.
#[derive(Debug, Default)]
pub(super) struct Unordered;

impl Order for Unordered {
    const ORDERED: bool = false;

    fn merge(&self) -> bool {
        false
    }

    fn busy(&self) -> bool {
        false
    }

    fn take(&mut self) {}

    fn went(&mut self) {}

    fn break_with(&mut self, _errno: i32) {}

    fn broken(&self) -> Option<i32> {
        None
    }
}

/// What this sender owes the kernel. `to_push`: records whose next request is due, in stream
/// order, pushed before any new record forms. `owed`: a push or an `io_uring_enter` failed, or a
/// due request waits for the SQ, so the next progress must enter and no waiter may sleep; it is
/// set only through [`owe`](Due::owe) and the push's answers, and cleared only by the progress
/// that enters ([`take_owed`](Due::take_owed)). `no_place`: the front of `to_push` waits for room
/// in the CQ (`Ring::has_room`), which a CQE read by anyone makes, not for the SQ: that wait
/// owes nothing.
pub(super) struct Due<B> {
    pub(super) to_push: VecDeque<Next<B>>,
    owed: bool,
    no_place: bool,
}

impl<B> Default for Due<B> {
    fn default() -> Self {
        Self {
            to_push: VecDeque::new(),
            owed: false,
            no_place: false,
        }
    }
}

impl<B> Due<B> {
    /// A submit or a push failed, or its failure is left for the next progress to report.
    pub(super) fn owe(&mut self) {
        self.owed = true;
    }

    /// Whether the next progress must enter and a waiter must not sleep.
    pub(super) fn is_owed(&self) -> bool {
        self.owed
    }

    /// The progress that enters takes the debt.
    pub(super) fn take_owed(&mut self) -> bool {
        std::mem::take(&mut self.owed)
    }

    /// A request went into the SQ.
    pub(super) fn pushed(&mut self) {
        self.no_place = false;
    }

    /// The ring refused a request: for lack of CQ room (`no_place`, which owes nothing), or
    /// because the SQ stayed full or the enter failed.
    pub(super) fn refused(&mut self, no_place: bool) {
        self.no_place = no_place;
        self.owed |= !no_place;
    }

    /// After a progress entered: whether it leaves a debt (its submit failed, or requests wait
    /// for the SQ rather than for CQ room).
    pub(super) fn settle(&mut self, submit_failed: bool) {
        if submit_failed || (!self.to_push.is_empty() && !self.no_place) {
            self.owed = true;
        }
    }
}

/// The zero-copy budget as this sender sees it. `pinned` is the sum of `Req::pinned` over this
/// sender's requests in the ring and `pinning` how many of them have pinned pages; both fall when
/// those requests' last CQEs come. `deferred` holds records the budget refused, waiting for
/// those pages: they go back to [`Due`] when a request with pinned pages finishes (never on a
/// refused request's own completion, which pinned nothing). `pin_limit` is what zero-copy
/// requests may pin at most (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`).
pub(super) struct Budget<B> {
    pin_limit: Option<usize>,
    pinned: usize,
    pinning: usize,
    deferred: Vec<Next<B>>,
}

impl<B> Budget<B> {
    pub(super) fn new(pin_limit: Option<usize>) -> Self {
        Self {
            pin_limit,
            pinned: 0,
            pinning: 0,
            deferred: Vec::new(),
        }
    }

    /// What zero-copy requests may pin at most.
    pub(super) fn pin_limit(&self) -> Option<usize> {
        self.pin_limit
    }

    /// What this sender's requests pin now, and how many of them.
    pub(super) fn pinned(&self) -> (usize, usize) {
        (self.pinned, self.pinning)
    }

    /// A request's first CQE said it pinned `bytes`.
    pub(super) fn pin(&mut self, bytes: usize) {
        self.pinned += bytes;
        self.pinning += 1;
    }

    /// A request that pinned `bytes` finished: true if pages came back (then the records that
    /// waited for them may go again: [`drain`](Self::drain)).
    pub(super) fn unpin(&mut self, bytes: usize) -> bool {
        if bytes == 0 {
            return false;
        }
        self.pinned -= bytes;
        self.pinning -= 1;
        true
    }

    /// A refused record waits for pinned pages.
    pub(super) fn defer(&mut self, next: Next<B>) {
        self.deferred.push(next);
    }

    /// Every record waiting for pinned pages, to give back at shutdown.
    pub(super) fn drain(&mut self) -> std::vec::Drain<'_, Next<B>> {
        self.deferred.drain(..)
    }

    /// The records waiting for pinned pages that go again now that pages came back, in the
    /// order the budget refused them: those whose charges (`charge`, what io_uring would pin for
    /// one) fit what the limit leaves beside the pages still pinned; every one once nothing of
    /// this sender stays pinned (no later completion would wake the rest), or where no limit is
    /// known. Pushing every waiting record at each completion would have the kernel refuse most
    /// of them again (`ENOMEM`), a request and a CQE each.
    pub(super) fn wake(
        &mut self,
        charge: impl Fn(&Next<B>) -> usize,
    ) -> std::vec::Drain<'_, Next<B>> {
        let charges = self.deferred.iter().map(charge);
        let n = woken(self.pin_limit, self.pinned, self.pinning, charges);
        self.deferred.drain(..n)
    }
}

/// How many records waiting for pinned pages go again ([`Budget::wake`]): of their `charges`, in
/// order, those that fit `limit` beside the `pinned` bytes of `pinning` requests; all of them once
/// none pins, or with no limit.
fn woken(
    limit: Option<usize>,
    pinned: usize,
    pinning: usize,
    charges: impl Iterator<Item = usize>,
) -> usize {
    let Some(limit) = limit.filter(|_| pinning > 0) else {
        return charges.count();
    };
    let mut room = limit.saturating_sub(pinned);
    charges
        .take_while(|&c| {
            let fits = c <= room;
            room = room.saturating_sub(c);
            fits
        })
        .count()
}

/// What the engine keeps for trains (UDP GSO, `train.rs`): the kernel's limits on this socket,
/// the paths that refused GSO (`EIO`), whose trains go one datagram per request, and whether a
/// batch's runs go as trains (`runs.rs`). Invariant: a path enters `splits` once, and is counted
/// once in `Stats::train_splits`; a train's record of several buffers is a batch's run (a
/// caller's train is one buffer).
pub(super) struct Trains {
    pub(super) splits: SplitPaths,
    /// A batch's runs as trains: off unless the factory turned them on for a connected UDP
    /// socket (`UringDatagram::new`).
    pub(super) runs: BatchRuns,
    v6: bool,
    segments: u16,
}

impl Trains {
    /// Trains on a socket of IPv6 (`v6`) or IPv4, under this kernel's segment limit; a batch's
    /// runs go one datagram per request.
    pub(super) fn new(v6: bool) -> Self {
        Self {
            splits: SplitPaths::default(),
            runs: BatchRuns::off(),
            v6,
            segments: kernel_train_segments(),
        }
    }

    /// Whether a train of `len` bytes in `segment`-byte datagrams may go ([`check_train`]: the
    /// version rule's limit, probed for a train above it).
    pub(super) fn check(&self, len: usize, segment: u16) -> Result<(), &'static str> {
        check_train(len, segment, self.v6, self.segments)
    }

    /// A train's last CQE (`res` of a request that carried `len` bytes, `then` what
    /// [`cqe::at_last`](super::cqe::at_last) made of it, while the sender is `closing` or not):
    /// what the train `rec` took, and what follows. UDP takes a train or a datagram whole or
    /// fails it (`udp_sendmsg` returns the length it was given), so a count below `len` cannot
    /// come; if it did, the train (or the split train's datagram) would count as sent whole, as
    /// any datagram's request does. A split train goes on to its next datagram; `EIO` splits a
    /// train ([`trains::on_failure`]; `ENOBUFS` is never the budget on io_uring, so every failed
    /// request counts as built); any other failure is the train's error, the kernel's errno as
    /// it gave it (what to do: `Report::advice`).
    pub(super) fn after<B: SendBuf>(
        &mut self,
        rec: &mut Record<B>,
        (len, res, then): (usize, i32, Then),
        closing: bool,
        stats: &mut Stats,
    ) -> Then {
        let mut train = rec.train.expect("a train's record");
        let run = rec.bufs.len() > 1;
        if res >= 0 && run && !train.split {
            // A batch's run went as one train (counted as the sendmsg family counts a run).
            stats.trains += 1;
            stats.batch_train_buffers += rec.bufs.len() as u64;
        }
        if res >= 0 {
            rec.sent = if train.split {
                (rec.sent + len).min(rec.total)
            } else {
                rec.total
            };
            if then != Then::Done || rec.left() == 0 {
                return then;
            }
            if closing {
                rec.error = Some(io::Error::from_raw_os_error(libc::EPIPE));
                return Then::Fail(libc::EPIPE);
            }
            return Then::Continue;
        }
        let Then::Fail(errno) = then else {
            return then;
        };
        match trains::on_failure(Some(errno), true) {
            TrainFailure::Split if !train.split && !closing => {
                if self.splits.splits(rec.dest.as_deref()) {
                    // A train that went out before its path's first `EIO` came back: the path
                    // is known, and counted once.
                    train.split = true;
                    rec.train = Some(train);
                } else {
                    split_train(stats, &mut self.splits, rec, &mut train);
                }
                rec.kernel_copied = true;
                rec.auto_zc = false;
                Then::Continue
            }
            TrainFailure::Fail(Some(_)) if run && !train.split && !closing => {
                // A run refused as too large (a path MTU that dropped, more page fragments than
                // one skb holds): its datagrams go one per request by copy, and the next run
                // reads the path MTU again; the path is not remembered.
                self.runs.forget_mtu();
                train.split = true;
                rec.train = Some(train);
                rec.kernel_copied = true;
                rec.auto_zc = false;
                Then::Continue
            }
            _ => {
                rec.error = Some(io::Error::from_raw_os_error(errno));
                Then::Fail(errno)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::woken;

    /// After pages came back, the records waiting for them go again only as far as they fit the
    /// limit beside what stays pinned, in order; all of them once nothing stays pinned (no later
    /// completion would wake them) or with no limit.
    #[test]
    fn records_wake_as_far_as_the_limit_has_room() {
        let charges = [20, 20, 20, 4];
        let table = [
            // (limit, pinned, pinning) -> woken
            ((Some(64), 20, 1), 2),
            ((Some(64), 0, 1), 4),
            ((Some(60), 0, 1), 3),
            ((Some(64), 60, 2), 0),
            ((Some(64), 44, 1), 1),
            ((Some(64), 60, 0), 4),
            ((None, 1000, 9), 4),
        ];
        for ((limit, pinned, pinning), want) in table {
            let got = woken(limit, pinned, pinning, charges.into_iter());
            assert_eq!(
                got, want,
                "limit {limit:?} pinned {pinned} pinning {pinning}"
            );
        }
    }
}
