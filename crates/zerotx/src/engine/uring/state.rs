//! The records an io_uring engine's state is made of, each with its invariant in its doc
//! comment. The engine (`engine.rs`) keeps one of each and decides the order of the steps; a
//! record only keeps its own invariant.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};

use super::cqe::Req;
use crate::engine::record::Record;
use crate::socket::SockKind;
use crate::sys::uring::SendOp;

/// A request of this engine: a record and the engine's account of it.
pub(super) type Op<B> = SendOp<Record<B>, Req>;

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

/// How the socket's sends must be ordered, fixed when the engine is built. A datagram socket
/// has many requests in flight, one per buffer; every other socket one request at a time (two
/// in flight can reorder a connection); a byte stream's request carries several buffers with
/// `MSG_WAITALL` and a short result is continued, a message socket's one message, never merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// UDP and other datagram sockets.
    Datagram,
    /// SEQPACKET and SCTP: ordered, one message per request.
    Message,
    /// TCP, AF_UNIX and vsock streams: ordered, buffers merged into one request.
    ByteStream,
}

impl Shape {
    pub(super) fn of(kind: SockKind) -> Self {
        if kind.is_byte_stream() {
            Self::ByteStream
        } else if kind.is_ordered() {
            Self::Message
        } else {
            Self::Datagram
        }
    }

    /// One request in flight at a time.
    pub(super) fn ordered(self) -> bool {
        self != Self::Datagram
    }

    /// Several buffers per request, `MSG_WAITALL`, short results continued.
    pub(super) fn merge(self) -> bool {
        self == Self::ByteStream
    }
}

/// The head of an ordered socket's stream. `busy`: its one request is out, or waiting in
/// [`Due`] to be pushed; no other request may form until its first CQE says it went whole.
/// `broken`: a send failed with this errno, and nothing more may go out (it would leave a gap):
/// every buffer after it comes back with the error. A datagram socket's head stays idle.
#[derive(Debug, Default)]
pub(super) struct Head {
    pub(super) busy: bool,
    pub(super) broken: Option<i32>,
}

/// What this sender owes the kernel. `to_push`: records whose next request is due, in stream
/// order, pushed before any new record forms. `owed`: a push or an `io_uring_enter` failed, so
/// the next progress must enter and no waiter may sleep. `no_place`: the front of `to_push`
/// waits for room in the CQ (`Ring::has_room`), which a CQE read by anyone makes, not for the SQ.
pub(super) struct Due<B> {
    pub(super) to_push: VecDeque<Next<B>>,
    pub(super) owed: bool,
    pub(super) no_place: bool,
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

/// The zero-copy budget as this sender sees it. `pinned` is the sum of `Req::pinned` over this
/// sender's requests in the ring and `pinning` how many of them have pinned pages; both fall when
/// those requests' last CQEs come. `deferred` holds records the budget refused, waiting for
/// those pages: they go back to [`Due`] when a request with pinned pages finishes (never on a
/// refused request's own completion, which pinned nothing). `pin_limit` is what zero-copy
/// requests may pin at most (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`).
pub(super) struct Budget<B> {
    pub(super) pin_limit: Option<usize>,
    pub(super) pinned: usize,
    pub(super) pinning: usize,
    pub(super) deferred: Vec<Next<B>>,
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

    /// A request's first CQE said it pinned `bytes`.
    pub(super) fn pin(&mut self, bytes: usize) {
        self.pinned += bytes;
        self.pinning += 1;
    }

    /// A request that pinned `bytes` finished: true if pages came back.
    pub(super) fn unpin(&mut self, bytes: usize) -> bool {
        if bytes == 0 {
            return false;
        }
        self.pinned -= bytes;
        self.pinning -= 1;
        true
    }
}
