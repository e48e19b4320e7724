//! What every `sendmsg(2)` engine ([`copy`](crate::engine::copy),
//! [`msg_zc`](crate::engine::msg_zc)) keeps and does alike: the ledger of records, the stream's
//! head, the broken stream, the error-queue reader, how a settled record is released, and the
//! send by copy (a `copy` engine's every send; a zero-copy engine's fallback and `auto`'s copies).
//!
//! # A stream's head, and a broken stream
//! A stream socket may take part of a buffer; the rest becomes the *head*, pushed first by later
//! calls, so the byte stream keeps the caller's order. A stream that failed after part of a
//! buffer went out is *broken*: sending anything more would leave a gap in the byte stream, so
//! every later send fails with the same error (the io_uring engines follow the same rule).

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::errqueue::ErrQueue;
use crate::engine::policy;
use crate::engine::policy::auto::AutoPolicy;
use crate::engine::policy::train::{SplitPaths, Train};
use crate::engine::record::{LatencySampler, Record};
use crate::engine::sendmsg_train::{self as gso, BatchRuns};
use crate::engine::unfragmented::Unfragmented;
use crate::engine::{EngineKind, EMPTY_BUFFER};
use crate::error::{Error, Feature, SendError};
use crate::ledger::{Done, Ledger, SlotId};
use crate::report::{CopyReason, Readiness, Released, Stats};
use crate::socket::{Family, Socket};
use crate::sys;

/// What a send that did not finish waits for ([`Engine::readiness`](crate::engine::Engine::readiness)
/// turns it into poll events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Nothing: the last send went whole.
    Nothing,
    /// Room in the socket (`POLLOUT`).
    Writable,
    /// Completions of this sender's zero-copy sends, which free budget (`POLLERR`).
    Completions,
}

/// How a settled record goes back to its caller, apart from the ledger that settles it. Invariant:
/// `zc_bytes` is the sum of the `charge` of the records `auto` sent zero-copy that are not
/// released yet (0 without `auto`).
pub(crate) struct Settle {
    /// The engine asks the kernel for zero-copy (what a released buffer reports).
    pub(crate) zerocopy: bool,
    /// `auto`: the per-send choice between `MSG_ZEROCOPY` and a plain send.
    pub(crate) auto: Option<AutoPolicy>,
    /// Bytes of zero-copy sends not yet released (`auto`'s locked-memory cap).
    pub(crate) zc_bytes: usize,
}

impl Settle {
    /// Gives the record's buffers back; tells `auto` how a record it sent zero-copy went, and
    /// takes it off the load.
    #[inline(always)]
    pub(crate) fn settle<B: SendBuf>(
        &mut self,
        rec: &mut Record<B>,
        done: Done,
        stats: &mut Stats,
        out: &mut Vec<Released<B>>,
    ) {
        rec.kernel_copied |= done.kernel_copied;
        if let Some(auto) = &mut self.auto {
            self.zc_bytes -= rec.charge;
            if let Some((copied, probe)) = rec.outcome() {
                auto.observe(copied, probe, 1);
            }
        }
        rec.release_in_place(self.zerocopy, stats, out);
    }
}

/// The state a `sendmsg(2)` engine keeps besides its own. Invariants: a record is in `ledger`
/// from its first call until it is settled (no byte left to send, every id it owns completed);
/// `head` is the one record a stream took part of and must finish before any other byte goes;
/// once `broken` is set nothing more is sent.
pub(crate) struct SendmsgCore<B> {
    /// The kernel may take part of a buffer (a stream); a datagram goes whole or not at all.
    pub(crate) stream: bool,
    /// Keeps the kernel from fragmenting zero-copy datagrams (see [`Unfragmented`]).
    pub(crate) frag: Unfragmented,
    pub(crate) ledger: Ledger<Record<B>>,
    pub(crate) head: Option<SlotId>,
    /// Set once a stream failed after part of a buffer went out: nothing more may be sent.
    pub(crate) broken: Option<i32>,
    pub(crate) waiting: Wait,
    pub(crate) stats: Stats,
    pub(crate) latency: LatencySampler,
    pub(crate) errq: ErrQueue,
    pub(crate) settle: Settle,
    /// The paths that refused a train as one GSO packet: their trains go one datagram per call.
    pub(crate) splits: SplitPaths,
    /// Whether a batch's runs of equal-size datagrams go as trains ([`BatchRuns::off`] unless
    /// the engine sets it).
    pub(crate) runs: BatchRuns,
    /// The segments one train call may carry on this kernel by the version rule (a train above
    /// it may still go: [`gso::check_train`]), and the bytes.
    train_segments: u16,
    train_v6: bool,
}

impl<B: SendBuf> SendmsgCore<B> {
    /// `zerocopy` must only be set once `SO_ZEROCOPY` was accepted on `sock`, whose next
    /// zero-copy id is `first_id`; `zc_datagrams`: datagrams go zero-copy and must not fragment.
    pub(crate) fn new(
        sock: &Socket,
        zerocopy: bool,
        first_id: u32,
        auto: Option<AutoPolicy>,
        zc_datagrams: bool,
    ) -> Self {
        Self {
            stream: sock.kind.is_stream(),
            frag: Unfragmented::new(sock, zc_datagrams),
            ledger: Ledger::new(first_id),
            head: None,
            broken: None,
            waiting: Wait::Nothing,
            stats: Stats::default(),
            latency: LatencySampler::default(),
            errq: ErrQueue::new(sock, zerocopy),
            settle: Settle {
                zerocopy,
                auto,
                zc_bytes: 0,
            },
            splits: SplitPaths::default(),
            runs: BatchRuns::off(),
            train_segments: gso::kernel_train_segments(),
            train_v6: sock.kind.family == Family::Inet6,
        }
    }

    /// Whether a train of `len` bytes in `segment`-byte datagrams may go on this socket (see
    /// [`gso::check_train`]); the reason if not.
    pub(crate) fn check_train(&self, len: usize, segment: u16) -> Result<(), &'static str> {
        gso::check_train(len, segment, self.train_v6, self.train_segments)
    }

    /// The record of a train of `buf` to `dest`: one GSO call, or one datagram per call where the
    /// path refused GSO before.
    pub(crate) fn train_record(
        &mut self,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
    ) -> Record<B> {
        let started = self.latency.next();
        let mut train = Train::new(segment);
        train.split = self.splits.splits(dest.as_ref());
        let mut rec = Record::new(buf, dest.map(Box::new), started);
        rec.train = Some(train);
        rec
    }

    /// A lone train by copy (`copy`'s every train; a zero-copy engine's train that `auto` copies,
    /// for `reason`): one GSO call, released as it returns. A train sent one datagram per call
    /// that found the socket full part way is the head, finished first by later calls.
    pub(crate) fn try_send_train_copy(
        &mut self,
        sock: &Socket,
        mut rec: Record<B>,
        reason: Option<CopyReason>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        rec.copy = reason;
        let sent = send_copied(
            &mut self.stats,
            &mut self.frag,
            &mut self.splits,
            false,
            sock,
            &mut rec,
        );
        match sent {
            Ok(true) => {
                self.stats.sends += 1;
                self.stats.trains += 1;
                self.waiting = Wait::Nothing;
                rec.release(self.settle.zerocopy, &mut self.stats, out);
                Ok(())
            }
            Ok(false) if rec.sent == 0 => {
                self.waiting = Wait::Writable;
                self.stats.would_block += 1;
                Err(SendError::WouldBlock(rec.take_buf()))
            }
            Ok(false) => {
                // Split, part way: the rest goes first at the next send or progress.
                self.stats.sends += 1;
                self.stats.trains += 1;
                self.waiting = Wait::Writable;
                self.head = Some(self.ledger.insert(rec));
                Ok(())
            }
            Err(error) if rec.sent == 0 => Err(SendError::Io {
                buf: rec.take_buf(),
                error,
            }),
            Err(error) => {
                // Datagrams went and the rest never will: released with the error.
                self.stats.sends += 1;
                self.stats.trains += 1;
                rec.error = Some(error);
                rec.release(self.settle.zerocopy, &mut self.stats, out);
                Ok(())
            }
        }
    }

    /// Puts `rec` in the ledger, charged to `auto`'s load ([`charge`](Self::charge)).
    pub(crate) fn insert_charged(&mut self, rec: Record<B>, probe: bool) -> SlotId {
        let slot = self.ledger.insert(rec);
        self.charge(slot, probe);
        slot
    }

    /// Charges `slot` to `auto`'s load, when `auto` chose zero-copy for it (`probe`: to probe a
    /// route that copied).
    #[inline]
    pub(crate) fn charge(&mut self, slot: SlotId, probe: bool) {
        if self.settle.auto.is_some() {
            let rec = self.ledger.item_mut(slot);
            rec.auto_zc = true;
            rec.probe = probe;
            rec.charge = rec.total;
            self.settle.zc_bytes += rec.total;
        }
    }

    /// After a zero-copy datagram send failed: did it take an id? The stack frees the skb of a
    /// failed send before the call returns, so its completion, if any, is already queued. Returns
    /// the answer and how many owned ids the error-queue read completed.
    pub(crate) fn learn_failed_id(
        &mut self,
        sock: &Socket,
        out: &mut Vec<Released<B>>,
    ) -> (bool, u64) {
        let id = self.ledger.record_unowned_id();
        let reaped = self.reap(sock, out);
        let taken = !self.ledger.retract_unowned(id);
        if taken {
            self.stats.zerocopy_ids += 1;
        }
        (taken, reaped)
    }

    /// Pushes the head (a stream's rest, or a split train's remaining datagrams) by copy.
    pub(crate) fn push_head(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) {
        let Some(slot) = self.head else { return };
        let rec = self.ledger.item_mut(slot);
        // Out of line (called from the send paths and progress): its return comes before theirs.
        let written = sys::fenced!(send_copied(
            &mut self.stats,
            &mut self.frag,
            &mut self.splits,
            self.stream,
            sock,
            rec
        ));
        let written = written.map(|all| if all { Wait::Nothing } else { Wait::Writable });
        self.head_written(slot, written, out);
    }

    /// Reads the error queue ([`ErrQueue::reap`]), releasing every record it settles; returns
    /// how many owned ids completed.
    pub(crate) fn reap(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> u64 {
        let settle = &mut self.settle;
        let ids = self.errq.reap(
            sock.fd(),
            &mut self.ledger,
            &mut self.stats,
            |rec, done, stats| settle.settle(rec, done, stats, out),
        );
        if ids > 0 && self.waiting == Wait::Completions {
            // What the blocked send waited for came: it may go as soon as there is room.
            self.waiting = Wait::Writable;
        }
        ids
    }

    /// [`Engine::progress`](crate::engine::Engine::progress)'s read of a zero-copy engine's
    /// completions: a send that waits for completions when none can come any more waits for
    /// room instead.
    pub(crate) fn reap_completions(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) {
        self.reap(sock, out);
        if self.waiting == Wait::Completions && self.ledger.ids_in_flight() == 0 {
            self.waiting = Wait::Writable;
        }
    }

    /// No more sends for `slot`: release it now if no id is pending.
    pub(crate) fn seal(&mut self, slot: SlotId, out: &mut Vec<Released<B>>) {
        let (settle, stats) = (&mut self.settle, &mut self.stats);
        self.ledger
            .seal_with(slot, |rec, done| settle.settle(rec, done, stats, out));
    }

    /// Gives back a buffer that took no id and no byte; `None` if the kernel holds part of it.
    pub(crate) fn abandon(&mut self, slot: SlotId) -> Option<B> {
        let mut buf = None;
        let settle = &mut self.settle;
        self.ledger.seal_with(slot, |rec, _| {
            if let Some(auto) = &mut settle.auto {
                settle.zc_bytes -= rec.charge;
                if rec.probe {
                    auto.probe_lost();
                }
            }
            rec.dest = None;
            buf = rec.bufs.pop();
        });
        buf
    }

    /// Ends `slot` with `error` after part of it went out. On a stream that part is on the wire
    /// and the rest never will be: the stream is broken for good.
    pub(crate) fn fail_partly_sent(
        &mut self,
        slot: SlotId,
        error: io::Error,
        out: &mut Vec<Released<B>>,
    ) {
        if self.stream {
            self.broken = Some(error.raw_os_error().unwrap_or(libc::EIO));
        }
        self.ledger.item_mut(slot).error = Some(error);
        self.seal(slot, out);
    }

    /// The head (`slot`) was pushed and `written` says how that went: done, still waiting, or
    /// failed (the stream is broken).
    pub(crate) fn head_written(
        &mut self,
        slot: SlotId,
        written: io::Result<Wait>,
        out: &mut Vec<Released<B>>,
    ) {
        match written {
            Ok(Wait::Nothing) => {
                self.head = None;
                self.waiting = Wait::Nothing;
                self.seal(slot, out);
            }
            Ok(wait) => self.waiting = wait,
            Err(e) => {
                self.head = None;
                self.waiting = Wait::Nothing;
                self.fail_partly_sent(slot, e, out);
            }
        }
    }

    pub(crate) fn broken_error(&self) -> Option<io::Error> {
        self.broken.map(io::Error::from_raw_os_error)
    }

    /// The prologue of a lone send on a stream, before its buffer is touched: an unfinished head
    /// goes first (`push_head`, the engine's own writer of it); a head the socket still has no
    /// room for, or a stream that broke, refuses the buffer ([`Behind::refuse`]).
    #[inline]
    pub(crate) fn behind(
        &mut self,
        out: &mut Vec<Released<B>>,
        push_head: impl FnOnce(&mut Self, &mut Vec<Released<B>>),
    ) -> Option<Behind> {
        if self.head.is_some() {
            push_head(self, out);
            if self.head.is_some() {
                self.stats.would_block += 1;
                return Some(Behind::Head);
            }
        }
        self.broken_error().map(Behind::Broken)
    }

    /// A lone send by copy: nothing to wait for once the kernel took the bytes. A buffer the
    /// first call took whole (every datagram) is released at once without a record; a record
    /// enters the ledger only if a stream took part of it (it becomes the head). `reason`: why
    /// a zero-copy engine copies it (`None` in `copy`).
    #[inline(always)]
    pub(crate) fn try_send_copy(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        reason: Option<CopyReason>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let started = self.latency.next();
        let len = buf.as_bytes().len();
        let sent = match copy_call(
            &mut self.stats,
            &mut self.frag,
            sock,
            buf.as_bytes(),
            dest.as_ref(),
        ) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.waiting = Wait::Writable;
                self.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
            Err(error) => return Err(SendError::Io { buf, error }),
            Ok(n) => {
                self.stats.sends += 1;
                if n == len || !self.stream {
                    // Whole (a datagram goes whole or not at all).
                    self.waiting = Wait::Nothing;
                    let path = policy::release_path(self.settle.zerocopy, reason, false);
                    Record::release_whole(buf, path, started, &mut self.stats, out);
                    return Ok(());
                }
                n
            }
        };
        self.finish_partial(sock, buf, sent, dest, started, reason, out);
        Ok(())
    }

    /// A stream took the first `sent` bytes of `buf`: the rest goes by a record, now or (as the
    /// head) at the next progress.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish_partial(
        &mut self,
        sock: &Socket,
        buf: B,
        sent: usize,
        dest: Option<SockAddr>,
        started: Option<Instant>,
        reason: Option<CopyReason>,
        out: &mut Vec<Released<B>>,
    ) {
        let mut rec = Record::new(buf, dest, started);
        rec.copy = reason;
        rec.sent = sent;
        // Out of line: its return comes before its caller's fill.
        let sent = crate::sys::fenced!(send_copied(
            &mut self.stats,
            &mut self.frag,
            &mut self.splits,
            self.stream,
            sock,
            &mut rec
        ));
        match sent {
            Ok(true) => {
                self.waiting = Wait::Nothing;
                rec.release(self.settle.zerocopy, &mut self.stats, out);
            }
            Ok(false) => {
                // The rest goes first at the next progress.
                self.waiting = Wait::Writable;
                self.head = Some(self.ledger.insert(rec));
            }
            Err(e) => {
                // Part of it is on the wire and the rest never will be.
                self.broken = Some(e.raw_os_error().unwrap_or(libc::EIO));
                rec.error = Some(e);
                rec.release(self.settle.zerocopy, &mut self.stats, out);
            }
        }
    }

    /// A datagram loop stopped at `buf`, after `taken` buffers went: an empty buffer (`error` is
    /// `None`) is refused; a full socket puts it back at the front of `bufs`; any other error
    /// hands it back with the error.
    #[cold]
    #[inline(never)]
    pub(crate) fn datagram_refused(
        &mut self,
        buf: B,
        error: Option<io::Error>,
        taken: usize,
        bufs: &mut VecDeque<B>,
    ) -> Result<usize, SendError<B>> {
        let Some(error) = error else {
            return Err(SendError::Invalid {
                buf,
                reason: EMPTY_BUFFER,
            });
        };
        if error.kind() == io::ErrorKind::WouldBlock {
            bufs.push_front(buf);
            self.waiting = Wait::Writable;
            self.stats.would_block += 1;
            return Ok(taken);
        }
        Err(SendError::Io { buf, error })
    }

    /// [`Engine::readiness`](crate::engine::Engine::readiness): POLLOUT while a send waits for
    /// room, or for completions that have come since (or can no longer come), or when what a
    /// handed-back send waited for was resolved meanwhile (a head finished during the caller's
    /// reap): the retry may go as soon as there is room. Otherwise only completions (POLLERR,
    /// always reported) can help.
    pub(crate) fn readiness(&self, sock: &Socket, retry: bool) -> Readiness {
        let events = match self.waiting {
            Wait::Writable => libc::POLLOUT,
            Wait::Completions if self.ledger.ids_in_flight() == 0 => libc::POLLOUT,
            Wait::Nothing if retry => libc::POLLOUT,
            Wait::Completions | Wait::Nothing => 0,
        };
        Readiness {
            fd: sock.fd().as_raw_fd(),
            events,
        }
    }

    /// [`Engine::stats`](crate::engine::Engine::stats): the counters, with `auto`'s.
    pub(crate) fn stats(&self) -> Stats {
        let mut s = self.stats;
        s.zerocopy_in_flight = self.ledger.ids_in_flight() as u64;
        s.pinned_bytes = self.settle.zc_bytes as u64;
        if let Some(auto) = &self.settle.auto {
            auto.counts().add_to(&mut s);
        }
        s
    }

    /// [`Engine::register_pool`](crate::engine::Engine::register_pool): only io_uring sends from
    /// registered memory.
    pub(crate) fn pool_refused(&self) -> Result<(), Error> {
        let engine = if self.settle.zerocopy {
            EngineKind::MsgZerocopy
        } else {
            EngineKind::Copy
        };
        Err(Error::Unsupported {
            feature: Feature::RegisteredBuffers(engine),
            reason: "only io_uring sends from registered memory: use the uring-zc engine".into(),
        })
    }

    /// [`Engine::shutdown`](crate::engine::Engine::shutdown): the head ends with an error, and
    /// what the kernel may still read is leaked, never freed; returns how many buffers that is.
    pub(crate) fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> usize {
        if let Some(slot) = self.head.take() {
            self.fail_partly_sent(
                slot,
                io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "sender closed before the rest of the buffer was sent",
                ),
                out,
            );
        }
        let mut kept = 0;
        self.ledger.take_all_with(|rec| {
            for buf in rec.bufs.drain(..) {
                std::mem::forget(buf);
                kept += 1;
            }
        });
        kept
    }
}

/// Sends the rest of `rec` by copy until the kernel took it all (`Ok(true)`) or the socket is full
/// (`Ok(false)`). A datagram goes whole or not at all; a train as [`send_train_copied`](gso::send_train_copied) says.
#[inline(always)]
pub(crate) fn send_copied<B: SendBuf>(
    stats: &mut Stats,
    frag: &mut Unfragmented,
    splits: &mut SplitPaths,
    stream: bool,
    sock: &Socket,
    rec: &mut Record<B>,
) -> io::Result<bool> {
    if let Some(train) = rec.train {
        return gso::send_train_copied(stats, frag, splits, sock, rec, train);
    }
    while rec.left() > 0 {
        let rest = &rec.bufs[0].as_bytes()[rec.sent..];
        match copy_call(stats, frag, sock, rest, rec.dest.as_deref()) {
            Ok(n) => rec.sent = if stream { rec.sent + n } else { rec.total },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// One `sendto` without `MSG_ZEROCOPY` ([`Unfragmented::send_copy`]: a datagram too large for
/// its path goes fragmented), counted in `stats` (the call, and the bytes it took).
#[inline(always)]
fn copy_call(
    stats: &mut Stats,
    frag: &mut Unfragmented,
    sock: &Socket,
    bytes: &[u8],
    dest: Option<&SockAddr>,
) -> io::Result<usize> {
    let n = frag.send_copy(sock.fd(), bytes, dest, &mut stats.syscalls)?;
    stats.bytes += n as u64;
    Ok(n)
}

/// Why a stream's lone send cannot go now ([`SendmsgCore::behind`]).
pub(crate) enum Behind {
    /// The head is still unfinished: the socket has no room.
    Head,
    /// The stream broke: nothing more may go out.
    Broken(io::Error),
}

impl Behind {
    /// The refusal of `buf`, handed back: [`SendError::WouldBlock`] behind the head,
    /// [`SendError::Io`] on a broken stream.
    pub(crate) fn refuse<B>(self, buf: B) -> SendError<B> {
        match self {
            Behind::Head => SendError::WouldBlock(buf),
            Behind::Broken(error) => SendError::Io { buf, error },
        }
    }
}

/// The [`Engine`](crate::engine::Engine) methods a `sendmsg(2)` engine answers from its
/// [`SendmsgCore`] (a field `core`) alone, written once for every engine type.
macro_rules! answered_by_core {
    () => {
        fn held(&self) -> usize {
            self.core.ledger.held()
        }

        fn stats(&self) -> $crate::report::Stats {
            self.core.stats()
        }

        fn auto_policy(&self) -> Option<&$crate::engine::policy::auto::AutoPolicy> {
            self.core.settle.auto.as_ref()
        }

        fn register_pool(
            &mut self,
            _pool: &$crate::buf::BufPool,
        ) -> Result<(), $crate::error::Error> {
            self.core.pool_refused()
        }

        fn shutdown(&mut self, out: &mut Vec<$crate::report::Released<B>>) -> usize {
            self.core.shutdown(out)
        }

        fn give_back(&mut self, sock: &$crate::socket::Socket) {
            self.core.frag.give_back(sock.fd());
            // The caller's socket sends plain datagrams again (if the kernel refuses, it keeps
            // cutting them: nothing else can be done here).
            let _ = sock.segment.plain(sock.fd());
        }
    };
}
pub(crate) use answered_by_core;
