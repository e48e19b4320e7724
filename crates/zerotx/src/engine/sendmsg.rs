//! The `sendmsg(2)` engines: `copy` and `msg-zc` (`MSG_ZEROCOPY`).
//!
//! One implementation serves both because the only differences are the flag, the ids it takes and
//! the error queue it must read. A buffer's life:
//! 1. `try_send` inserts it into the [`Ledger`] and calls `sendmsg` until it is fully queued or the
//!    socket is full. A stream socket may take part of the buffer; the rest becomes the *head*,
//!    pushed first by later calls, so the byte stream keeps the caller's order.
//! 2. The zero-copy budget (`ENOBUFS` from option memory or locked memory; `ENOMEM` on vsock)
//!    makes the engine read completions and retry; with nothing in flight to wait for, the rest
//!    of that buffer goes by copy (a *fallback*), so the engine never spins and never waits for
//!    something that cannot come.
//! 3. The error queue is read without blocking; completion ranges go to the ledger, which returns
//!    buffers whose every id completed. Copy sends release at once.
//!
//! A batch ([`Engine::try_send_batch`]) on `copy` over a byte stream goes up to
//! [`sys::GATHER_MAX`] buffers and [`sys::GATHER_BYTES`] bytes per system call, one `sendmsg` of
//! their bytes in order (what `writev` does, and what the io_uring engines' byte-stream batch
//! does). A stream that takes part of the write releases
//! the buffers it took whole, and the one it cut finishes as a lone send's would (the head).
//! Datagrams go one call each: `sendmmsg` returns how many went and drops the error of the one
//! that failed after them, and an error the socket held (an ICMP port unreachable's
//! `ECONNREFUSED`, taken by the first datagram that meets it) would be gone for good; the bench
//! measured no gain from it into the black hole either. `msg-zc` sends one call per buffer: one
//! id per buffer is what lets each come back as soon as its own pages are free.
//!
//! # Which calls take an id ([`IdRule`])
//! The kernel's per-socket counter moves differently per protocol (KERNEL.md), and the ledger
//! must follow it exactly: one id too few releases a buffer on its predecessor's completion.
//! - **TCP** (and every other stream but vsock): a call that returns bytes took exactly one id; a
//!   call that failed took none (`tcp_sendmsg_locked` hands it back on its error path).
//! - **UDP** (datagrams): `__ip_append_data` takes the id when it builds the skb and hands it
//!   back on its own errors (`EAGAIN`, `EFAULT`, ...); a later failure keeps it (`udp_send_skb`:
//!   a `UDP_SEGMENT` size check answers `EMSGSIZE`; `ip_send_skb`: a netfilter drop answers
//!   `EPERM`, a qdisc drop `ENOBUFS` when `IP_RECVERR` is set), and the skb, freed before the call
//!   returns, has already posted that id's completion. So after any failure but `EAGAIN` the
//!   engine records an unowned id, reads the error queue at once, and takes the id back if no
//!   completion covered it. The answer also tells the two `ENOBUFS` apart: no id taken is the
//!   budget (retry or fall back); an id taken is a dropped datagram (an error for the caller,
//!   never retried into a drop that repeats).
//!   That holds for a datagram that leaves as one packet, whose skb is freed before the call
//!   returns. A fragmented one does not: fragments already queued keep the id's pages
//!   referenced after a later fragment's drop failed the call, so its completion comes late, the
//!   id would be taken back on a wrong answer, and every later buffer would be released on its
//!   predecessor's completion. So the kernel is kept from fragmenting zero-copy datagrams at all
//!   ([`Unfragmented`]): under the path-MTU mode the engine sets, a datagram too large for its
//!   path is refused with `EMSGSIZE` before the id is taken, and then goes by copy, fragmented
//!   under the caller's mode. What the answer cannot see is a clone of the skb that outlives the
//!   failed call (an nftables `dup` or `TEE` before the drop): then the completion comes late and
//!   the id is taken back wrongly.
//! - **vsock** (6.7+): one zero-copy call of at most [`VSOCK_ZC_MAX`](policy::VSOCK_ZC_MAX) bytes is one packet and
//!   takes one id, or fails whole with `ENOMEM` (the budget) and takes none. Larger calls are
//!   split into packets and only the last one carries the id: when its completion cannot be
//!   allocated, 6.7-6.12 return the bytes already sent having taken no id, and the earlier packets
//!   still pin the caller's pages with nothing to say when they are free. So zero-copy calls are
//!   capped at 64 KiB. A call that returns fewer bytes than asked (the peer's credit was short)
//!   went by copy and took one id, or none if the completion could not be allocated: it gets an
//!   unowned id, the safe guess (a wrong guess releases later buffers late, never early).
//! - A stream that failed after part of a buffer went out is *broken*: sending anything more would
//!   leave a gap in the byte stream, so every later send fails with the same error (the io_uring
//!   engine follows the same rule).

use std::collections::VecDeque;
use std::io;

use socket2::SockAddr;

use crate::buf::{BufPool, SendBuf};
use crate::cmsg::{self, ErrQueueMsg};
use crate::engine::auto::EpochClock;
use crate::engine::policy::auto::{AtCap, AutoPolicy, Choice, Load};
use crate::engine::policy::{self, BudgetAction, Refusal};
use crate::engine::record::{LatencySampler, Record};
use crate::engine::unfragmented::Unfragmented;
use crate::engine::{send_each, send_front, Engine, EngineKind, EMPTY_BUFFER};
use crate::error::{Error, Feature, SendError};
use crate::ledger::{Done, Ledger, SlotId};
use crate::report::{CopyReason, Readiness, Released, Stats};
use crate::socket::{Family, Socket};
use crate::sys;

/// Room for several messages' worth of control data; a completion needs 48 bytes.
const CONTROL_LEN: usize = 512;

/// How a socket's zero-copy id counter moves (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdRule {
    /// A failed call took no id.
    Stream,
    /// A failed call may have taken an id, whose completion is already queued.
    Datagram,
    /// Calls capped at one packet; a short call may have taken an id.
    Vsock,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Nothing,
    Writable,
    Completions,
}

pub(crate) struct SendmsgEngine<B> {
    zerocopy: bool,
    /// `auto`: the per-send choice between `MSG_ZEROCOPY` and a plain send.
    auto: Option<AutoPolicy>,
    /// Bytes of zero-copy sends not yet released (`auto`'s locked-memory cap).
    zc_bytes: usize,
    clock: EpochClock,
    rule: IdRule,
    stream: bool,
    /// A stream without message boundaries (not SCTP): a batch's buffers may go in one write.
    byte_stream: bool,
    /// The socket has an error queue worth draining (see `has_error_queue`).
    errqueue: bool,
    /// `copy`: progress calls since the error queue was last read (see
    /// [`COPY_ERRQUEUE_EVERY`]).
    quiet: u32,
    /// Keeps the kernel from fragmenting zero-copy datagrams (see the module docs).
    frag: Unfragmented,
    ledger: Ledger<Record<B>>,
    head: Option<SlotId>,
    /// Set once a stream failed after part of a buffer went out: nothing more may be sent.
    broken: Option<i32>,
    waiting: Wait,
    stats: Stats,
    latency: LatencySampler,
    control: Vec<u8>,
    msgs: Vec<ErrQueueMsg>,
}

impl<B: SendBuf> SendmsgEngine<B> {
    /// `zerocopy` must only be set once `SO_ZEROCOPY` was accepted on `sock`, whose next
    /// zero-copy id is `first_id` (0 on a fresh socket).
    pub(crate) fn new(sock: &Socket, zerocopy: bool, first_id: u32) -> Self {
        Self::with_policy(sock, zerocopy, first_id, None)
    }

    /// As [`new`](Self::new), with `auto`'s policy choosing per send (`zerocopy` must be set).
    pub(crate) fn with_policy(
        sock: &Socket,
        zerocopy: bool,
        first_id: u32,
        auto: Option<AutoPolicy>,
    ) -> Self {
        let rule = if sock.kind.family == Family::Vsock {
            IdRule::Vsock
        } else if sock.kind.is_stream() {
            IdRule::Stream
        } else {
            IdRule::Datagram
        };
        Self {
            zerocopy,
            auto,
            zc_bytes: 0,
            clock: EpochClock::default(),
            rule,
            stream: sock.kind.is_stream(),
            byte_stream: sock.kind.is_byte_stream(),
            errqueue: has_error_queue(sock, zerocopy),
            quiet: 0,
            frag: Unfragmented::new(sock, zerocopy && rule == IdRule::Datagram),
            ledger: Ledger::new(first_id),
            head: None,
            broken: None,
            waiting: Wait::Nothing,
            stats: Stats::default(),
            latency: LatencySampler::default(),
            control: vec![0; CONTROL_LEN],
            msgs: Vec::new(),
        }
    }

    /// Sends from the record's offset until it is fully queued or the socket pushes back.
    #[inline(always)]
    fn write(
        &mut self,
        sock: &Socket,
        slot: SlotId,
        out: &mut Vec<Released<B>>,
    ) -> io::Result<Wait> {
        loop {
            let rec = self.ledger.item(slot);
            let left = rec.left();
            if left == 0 {
                return Ok(Wait::Nothing);
            }
            let mut zc = self.zerocopy && rec.copy.is_none();
            if zc
                && self.rule == IdRule::Datagram
                && !self.frag.may_zerocopy(left, rec.dest.as_deref())
            {
                // Too large for its path when last tried (it would be refused), or the kernel
                // could not be kept from fragmenting: by copy (see the module docs). It tells
                // `auto` nothing of the route.
                zc = false;
                let rec = self.ledger.item_mut(slot);
                rec.kernel_copied = true;
                rec.auto_zc = false;
            }
            if !zc {
                // By copy from here on (a fallback, or a datagram too large for the path).
                let rec = self.ledger.item_mut(slot);
                return match send_copied(&mut self.stats, &mut self.frag, self.stream, sock, rec)? {
                    true => Ok(Wait::Nothing),
                    false => Ok(Wait::Writable),
                };
            }
            let rec = self.ledger.item(slot);
            let rest = &rec.bufs[0].as_bytes()[rec.sent..];
            let len = policy::zerocopy_call_len(self.rule == IdRule::Vsock, rest.len());
            self.stats.syscalls += 1;
            match sys::send_to(
                sock.fd(),
                &rest[..len],
                rec.dest.as_deref(),
                sys::MSG_ZEROCOPY,
            ) {
                Ok(n) => {
                    let short_vsock = self.rule == IdRule::Vsock && n < len;
                    if short_vsock {
                        // Copied (the peer's credit was short), one id or none: see module docs.
                        self.ledger.record_unowned_id();
                        self.stats.zerocopy_ids += 1;
                    } else {
                        self.ledger.record_id(slot);
                        self.stats.zerocopy_ids += 1;
                    }
                    if let Some(auto) = &mut self.auto {
                        auto.on_accepted();
                    }
                    self.stats.bytes += n as u64;
                    let rec = self.ledger.item_mut(slot);
                    rec.sent += n;
                    rec.kernel_copied |= short_vsock;
                    if !self.stream {
                        // Datagrams go whole or not at all.
                        rec.sent = rec.total;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Wait::Writable),
                Err(e) => {
                    if let Some(wait) = self.zc_refused(sock, slot, e, out)? {
                        return Ok(wait);
                    }
                }
            }
        }
    }

    /// A zero-copy call for `slot` failed with `e` (not `EAGAIN`): an error of the buffer
    /// (`Err`), a wait for completions (`Ok(Some)`), or go on sending it (`Ok(None)`: retry, or
    /// by copy from now on, as the record now says).
    fn zc_refused(
        &mut self,
        sock: &Socket,
        slot: SlotId,
        e: io::Error,
        out: &mut Vec<Released<B>>,
    ) -> io::Result<Option<Wait>> {
        // Every failure but EAGAIN (handled by the caller) may come after the id was taken.
        let (took_id, reaped) = if self.rule == IdRule::Datagram {
            self.learn_failed_datagram_id(sock, out)
        } else {
            (false, 0)
        };
        if !took_id && self.rule == IdRule::Datagram && e.raw_os_error() == Some(libc::EMSGSIZE) {
            // The kernel would have fragmented it and refused instead, before taking an id: it
            // goes by copy, fragmented (see the module docs), and tells `auto` nothing.
            let rec = self.ledger.item_mut(slot);
            self.frag.refused(rec.left(), rec.dest.as_deref());
            rec.copy_for(CopyReason::Kernel);
            rec.kernel_copied = true;
            rec.auto_zc = false;
            return Ok(None);
        }
        let budget = match e.raw_os_error() {
            Some(libc::ENOBUFS) => true,
            Some(libc::ENOMEM) => self.rule == IdRule::Vsock,
            _ => false,
        };
        if took_id || !budget {
            // A datagram the stack built and then dropped, or a real error.
            return Err(e);
        }
        self.stats.enobufs += 1;
        if let Some(auto) = &mut self.auto {
            auto.on_refusal();
            if auto.at_cap() == AtCap::Copy {
                // `auto` copies for a while rather than wait on the budget.
                self.ledger.item_mut(slot).copy_for(CopyReason::Budget);
                return Ok(None);
            }
        }
        let reaped = reaped + self.reap_errqueue(sock, out);
        match policy::on_budget_refusal(Refusal {
            freed: reaped > 0,
            may_free: self.ledger.ids_in_flight() > 0,
        }) {
            BudgetAction::Retry => Ok(None),
            BudgetAction::Copy => {
                self.ledger.item_mut(slot).copy_for(CopyReason::Fallback);
                Ok(None)
            }
            BudgetAction::Wait => Ok(Some(Wait::Completions)),
        }
    }

    /// After a zero-copy datagram send failed: did it take an id? The stack frees the skb of a
    /// failed send before the call returns, so its completion, if any, is already queued.
    /// Returns the answer and how many owned ids the error-queue read completed.
    fn learn_failed_datagram_id(
        &mut self,
        sock: &Socket,
        out: &mut Vec<Released<B>>,
    ) -> (bool, u64) {
        let id = self.ledger.record_unowned_id();
        let reaped = self.reap_errqueue(sock, out);
        let taken = !self.ledger.retract_unowned(id);
        if taken {
            self.stats.zerocopy_ids += 1;
        }
        (taken, reaped)
    }

    /// Reads the error queue dry, or until a completion leaves no id in the ledger's window
    /// (owned or not: a failed datagram's id is learnt from its completion) in flight; returns how
    /// many owned ids completed. A message the decoder or the ledger refuses is counted in
    /// `bad_completions` and skipped, never an error of a send.
    ///
    /// The early stop saves the read that would answer `EAGAIN`, one system call per reap when
    /// the kernel completed everything sent (the usual case, one coalesced range per reap): no
    /// completion of this sender can be queued behind that one. Whatever else is (TX timestamps,
    /// ICMP errors) keeps POLLERR up and is read by the next reap, which reads on past anything
    /// that is not such a completion, so a poll loop wakes for it at most once.
    fn reap_errqueue(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> u64 {
        let mut ids = 0;
        self.quiet = 0;
        let mut emptied = false;
        while self.errqueue && !emptied {
            self.stats.errqueue_reads += 1;
            let read = match sys::recv_errqueue(sock.fd(), &mut self.control) {
                Ok(Some(read)) => read,
                Ok(None) => break,
                Err(_) => {
                    // MSG_CTRUNC (cannot happen with CONTROL_LEN) or a socket error: the message
                    // is gone; its ids, if any, stay in flight and the sender times out on them
                    // rather than releasing anything early.
                    self.stats.bad_completions += 1;
                    break;
                }
            };
            if read.control_len == 0 {
                // Not an error-queue message (everything the kernel queues there carries one):
                // stop rather than loop on whatever this socket returns instead.
                self.stats.bad_completions += 1;
                break;
            }
            self.msgs.clear();
            if cmsg::decode(&self.control[..read.control_len], &mut self.msgs).is_err() {
                self.stats.bad_completions += 1;
            }
            // Taken out while the ledger releases records (`ledger_and_release` borrows the
            // engine), and put back with its capacity.
            let mut msgs = std::mem::take(&mut self.msgs);
            for msg in msgs.drain(..) {
                match msg {
                    ErrQueueMsg::Zerocopy(range) => {
                        self.stats.completions += 1;
                        let owned_before = self.ledger.ids_in_flight();
                        let (ledger, mut release) = self.ledger_and_release();
                        let settle = |rec: &mut Record<B>, done| release.settle(rec, done, out);
                        match ledger.complete_with(range, settle) {
                            Ok(n) => {
                                self.stats.zerocopy_ids_completed += n;
                                let owned = self.ledger.ids_in_flight();
                                ids += (owned_before - owned) as u64;
                                emptied = owned == 0 && self.ledger.unowned_in_flight() == 0;
                            }
                            Err(_) => self.stats.bad_completions += 1,
                        }
                    }
                    ErrQueueMsg::Other { .. } => self.stats.skipped_messages += 1,
                }
            }
            self.msgs = msgs;
        }
        if ids > 0 && self.waiting == Wait::Completions {
            // What the blocked send waited for came: it may go as soon as there is room.
            self.waiting = Wait::Writable;
        }
        ids
    }

    /// No more sends for `slot`: release it now if no id is pending.
    fn seal(&mut self, slot: SlotId, out: &mut Vec<Released<B>>) {
        let (ledger, mut release) = self.ledger_and_release();
        ledger.seal_with(slot, |rec, done| release.settle(rec, done, out));
    }

    /// The ledger, and apart from it the parts of the engine a settled record's release touches:
    /// the ledger hands each record over the moment its last id completes.
    #[inline(always)]
    fn ledger_and_release(&mut self) -> (&mut Ledger<Record<B>>, Release<'_>) {
        let release = Release {
            zerocopy: self.zerocopy,
            auto: &mut self.auto,
            zc_bytes: &mut self.zc_bytes,
            stats: &mut self.stats,
        };
        (&mut self.ledger, release)
    }

    /// Gives back a buffer that took no id and no byte; `None` if the kernel holds part of it.
    fn abandon(&mut self, slot: SlotId) -> Option<B> {
        let mut buf = None;
        let (auto, zc_bytes) = (&mut self.auto, &mut self.zc_bytes);
        self.ledger.seal_with(slot, |rec, _| {
            if let Some(auto) = auto {
                *zc_bytes -= rec.charge;
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
    fn fail_partly_sent(&mut self, slot: SlotId, error: io::Error, out: &mut Vec<Released<B>>) {
        if self.stream {
            self.broken = Some(error.raw_os_error().unwrap_or(libc::EIO));
        }
        self.ledger.item_mut(slot).error = Some(error);
        self.seal(slot, out);
    }

    fn push_head(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) {
        let Some(slot) = self.head else { return };
        let written = self.write(sock, slot, out);
        // Out of line (called from `send_one` and `progress`): its return comes before theirs.
        sys::refill_return_stack();
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

    /// The copy engine's send: nothing to wait for once the kernel took the bytes. A buffer the
    /// first call took whole (every datagram) is released at once without a record; a record
    /// enters the ledger only if a stream took part of it (it becomes the head).
    #[inline(always)]
    fn try_send_copy(
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
                    let path = policy::release_path(self.zerocopy, reason, false);
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
    fn finish_partial(
        &mut self,
        sock: &Socket,
        buf: B,
        sent: usize,
        dest: Option<SockAddr>,
        started: Option<std::time::Instant>,
        reason: Option<CopyReason>,
        out: &mut Vec<Released<B>>,
    ) {
        let mut rec = Record::new(buf, dest, started);
        rec.copy = reason;
        rec.sent = sent;
        let sent = send_copied(&mut self.stats, &mut self.frag, self.stream, sock, &mut rec);
        // Out of line: its return comes before its caller's fill.
        sys::refill_return_stack();
        match sent {
            Ok(true) => {
                self.waiting = Wait::Nothing;
                rec.release(self.zerocopy, &mut self.stats, out);
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
                rec.release(self.zerocopy, &mut self.stats, out);
            }
        }
    }

    /// [`Engine::try_send_batch`] up to the fill that follows it: the loop for the socket and
    /// engine. Inlined, with the loops it picks, so their system calls are made in
    /// `try_send_batch`'s own frame, which the fill then covers (see
    /// [`sys::refill_return_stack`]); the out-of-line helpers that also enter the kernel
    /// (`push_head`, `finish_partial`) fill before they return. Not covered: the error-queue
    /// reads (glibc's `recvmsg`, whose own return comes first) and the rare paths through
    /// `zc_datagram_refused`.
    #[inline(always)]
    fn send_batch_now(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        if !self.zerocopy {
            if self.byte_stream {
                return self.send_gathered(sock, bufs, out);
            }
            if !self.stream {
                // Only a stream's partial send leaves a head or breaks the socket.
                debug_assert!(self.head.is_none() && self.broken.is_none());
                return self.send_datagrams(sock, bufs, out);
            }
        } else if self.rule == IdRule::Datagram && self.auto.is_none() {
            debug_assert!(self.head.is_none() && self.broken.is_none());
            return self.send_zc_datagrams(sock, bufs, out);
        }
        send_each(bufs, |buf| self.send_one(sock, buf, None, out))
    }

    /// `copy`'s [`Engine::try_send_batch`] on a datagram socket: one `send` per buffer, each
    /// released as soon as its call returns. The rules are [`send_each`]'s: a failure is the
    /// front buffer's (the kernel took the ones before it), the rest stay in `bufs`; a full
    /// socket puts the buffer back at the front and ends the batch.
    ///
    /// A loop of its own because the general one (`send_one` through `send_each`) cost about 120
    /// user-space instructions per datagram (cachegrind, 4096 B) around a 12-instruction call: it
    /// moved each buffer in and out of a `Result` three times and asked about a head and a broken
    /// stream, which a copied datagram never has. This one costs about 80: the bench's `copy`,
    /// harness included, went from 227 to 193 per datagram, against `raw-copy`'s 74
    /// (benches/compare-raw-results.md has what that did to the throughput).
    #[inline(always)]
    fn send_datagrams(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let path = policy::release_path(false, None, false);
        let fd = sock.fd();
        let mut taken = 0;
        let refused = loop {
            let Some(buf) = bufs.pop_front() else {
                break None;
            };
            let data = buf.as_bytes();
            if data.is_empty() {
                break Some((buf, None));
            }
            // A sampled buffer's latency runs from its own call, as a lone send's does.
            let started = self.latency.next();
            self.stats.syscalls += 1;
            match sys::send_to(fd, data, None, 0) {
                Ok(n) => self.stats.bytes += n as u64,
                Err(error) => break Some((buf, Some(error))),
            }
            taken += 1;
            self.stats.sends += 1;
            self.waiting = Wait::Nothing;
            Record::release_whole(buf, path, started, &mut self.stats, out);
        };
        match refused {
            None => Ok(taken),
            Some((buf, error)) => self.datagram_refused(buf, error, taken, bufs),
        }
    }

    /// [`send_datagrams`](Self::send_datagrams) stopped at `buf`, after `taken` buffers went:
    /// an empty buffer (`error` is `None`) is refused; a full socket puts it back at the front of
    /// `bufs`; any other error hands it back with the error. (A full socket ends
    /// [`send_zc_datagrams`](Self::send_zc_datagrams) here too: no id was taken.)
    #[cold]
    #[inline(never)]
    fn datagram_refused(
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

    /// `msg-zc`'s [`Engine::try_send_batch`] on a datagram socket (UDP: KERNEL.md lists the
    /// datagram sockets that take `SO_ZEROCOPY`): one `send(MSG_ZEROCOPY)` per buffer, each held
    /// in the ledger under the one id its call took until that id completes, as
    /// [`send_one`](Self::send_one) holds it. The call that succeeds is the whole loop: no head,
    /// broken stream or `auto` to ask about (a datagram socket has neither of the first two, and
    /// `msg-zc` no policy), and the record is made after the call, the datagram whole. A full
    /// socket hands the buffer back as `send_one` would. The rest goes the general way with the
    /// same rules ([`send_each`]'s): an empty buffer and a datagram the path would fragment
    /// through `send_one`, a failed call through
    /// [`zc_datagram_refused`](Self::zc_datagram_refused).
    ///
    /// Nothing asks the buffer for its bytes after the call: a panicking `as_bytes` there would
    /// leave the id the call took unrecorded, and the next buffer would be released on that id's
    /// completion.
    ///
    /// A loop of its own because the general one costs about 300 user-space instructions per
    /// datagram (cachegrind, 65000 B) around the call, and a 65000-byte zero-copy datagram into
    /// the black hole takes about 2.6 us: that is about 2% of its send.
    #[inline(always)]
    fn send_zc_datagrams(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let fd = sock.fd();
        let mut taken = 0;
        loop {
            let Some(buf) = bufs.pop_front() else {
                return Ok(taken);
            };
            let data = buf.as_bytes();
            let len = data.len();
            if len == 0 || !self.frag.may_zerocopy(len, None) {
                bufs.push_front(buf);
                if !send_front(bufs, |buf| self.send_one(sock, buf, None, out))? {
                    return Ok(taken);
                }
                taken += 1;
                continue;
            }
            let started = self.latency.next();
            self.stats.syscalls += 1;
            match sys::send_to(fd, data, None, sys::MSG_ZEROCOPY) {
                Ok(n) => {
                    self.stats.bytes += n as u64;
                    self.stats.sends += 1;
                    self.stats.zerocopy_ids += 1;
                    self.waiting = Wait::Nothing;
                    // A datagram goes whole, under the one id its call took: held until that
                    // id completes.
                    match self.ledger.free_item() {
                        Some((free, rec)) => {
                            rec.refill_len(buf, len, None, started);
                            rec.sent = len;
                            self.ledger.insert_refilled_one_id(free);
                        }
                        None => {
                            let mut rec = Record::of_len(buf, len, None::<Box<SockAddr>>, started);
                            rec.sent = len;
                            let slot = self.ledger.insert(rec);
                            self.ledger.record_id(slot);
                            self.seal(slot, out);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // No id taken, nothing sent: back to the front, as `copy`'s loop does.
                    return self.datagram_refused(buf, Some(e), taken, bufs);
                }
                Err(e) => {
                    if !self.zc_datagram_refused(sock, buf, len, started, e, bufs, out)? {
                        return Ok(taken);
                    }
                }
            }
            taken += 1;
        }
    }

    /// [`send_zc_datagrams`](Self::send_zc_datagrams)' call for `buf` (`len` bytes) failed with
    /// `e` (not `EAGAIN`): from here the buffer goes as [`send_one`](Self::send_one) would take
    /// it on, its record in the ledger and `write`'s answer to the failure (learn whether the
    /// call took an id; on the budget's `ENOBUFS` read completions and retry, copy, or wait).
    /// `Ok(true)`: accepted; `Ok(false)`: handed back, at the front of `bufs` again; `Err`: it
    /// failed.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn zc_datagram_refused(
        &mut self,
        sock: &Socket,
        buf: B,
        len: usize,
        started: Option<std::time::Instant>,
        e: io::Error,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<bool, SendError<B>> {
        let slot = self
            .ledger
            .insert(Record::of_len(buf, len, None::<Box<SockAddr>>, started));
        let result = match self.zc_refused(sock, slot, e, out) {
            Ok(Some(wait)) => Ok(wait),
            Ok(None) => self.write(sock, slot, out),
            Err(e) => Err(e),
        };
        match self.finish_send(slot, result, out) {
            Ok(()) => Ok(true),
            Err(SendError::WouldBlock(buf)) => {
                bufs.push_front(buf);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// `copy`'s [`Engine::try_send_batch`] on a byte stream: up to [`sys::GATHER_MAX`] buffers and
    /// [`sys::GATHER_BYTES`] bytes per system call, as one write ([`sys::send_gather`]). Every buffer the kernel took whole is
    /// released at once; the one it cut finishes as [`try_send_copy`](Self::try_send_copy)'s
    /// would. The rules are [`send_each`]'s: a failure is the front buffer's (the kernel took the
    /// buffers before it), the rest stay in `bufs`.
    #[inline(always)]
    fn send_gathered(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let mut accepted = 0;
        loop {
            // A run within the count and byte caps; a buffer larger than the byte cap, or one
            // followed by an empty one, goes alone.
            let slices = sys::gather_run(bufs.iter().map(|b| b.as_bytes()));
            let n = slices.len();
            if n < 2 || self.head.is_some() || self.broken.is_some() {
                // One buffer (or an empty one), or what `send_one` handles first.
                drop(slices);
                if !send_front(bufs, |buf| self.send_one(sock, buf, None, out))? {
                    return Ok(accepted);
                }
                accepted += 1;
                continue;
            }
            // One clock read before the call, if any of these buffers is one the sampler times:
            // their latency runs from the call, as a lone send's does.
            let now = self.latency.due_within(n).then(std::time::Instant::now);
            self.stats.syscalls += 1;
            let result = sys::send_gather(sock.fd(), &slices);
            drop(slices);
            let mut taken = match result {
                Ok(taken) => taken,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.waiting = Wait::Writable;
                    self.stats.would_block += 1;
                    return Ok(accepted);
                }
                Err(error) => {
                    let buf = bufs.pop_front().expect("n >= 2 buffers offered");
                    return Err(SendError::Io { buf, error });
                }
            };
            self.stats.bytes += taken as u64;
            self.waiting = Wait::Nothing;
            let path = policy::release_path(self.zerocopy, None, false);
            while taken > 0 {
                let buf = bufs
                    .pop_front()
                    .expect("the kernel took no more than offered");
                let len = buf.as_bytes().len();
                let started = self.latency.next_at(now);
                self.stats.sends += 1;
                accepted += 1;
                if taken >= len {
                    taken -= len;
                    Record::release_whole(buf, path, started, &mut self.stats, out);
                } else {
                    self.finish_partial(sock, buf, taken, None, started, None, out);
                    taken = 0;
                }
            }
        }
    }

    fn broken_error(&self) -> Option<io::Error> {
        self.broken.map(io::Error::from_raw_os_error)
    }

    /// [`Engine::try_send`], inlined into [`Engine::try_send_batch`] too: a batch then makes
    /// no return per buffer into a frame older than its system call, which costs far more than a
    /// mispredicted branch on some machines (see [`sys::send_to`]).
    #[inline(always)]
    fn send_one(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        if self.head.is_some() {
            self.push_head(sock, out);
            if self.head.is_some() {
                self.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        if let Some(error) = self.broken_error() {
            return Err(SendError::Io { buf, error });
        }
        if !self.zerocopy {
            return self.try_send_copy(sock, buf, dest, None, out);
        }
        let mut probe = false;
        if let Some(auto) = &mut self.auto {
            let load = Load {
                sends: self.ledger.ids_in_flight(),
                bytes: self.zc_bytes,
            };
            let choice = auto.choose(buf.as_bytes().len(), false, load);
            self.clock.tick(auto);
            match choice {
                Choice::Copy(reason) => {
                    return self.try_send_copy(sock, buf, dest, Some(reason), out)
                }
                Choice::Wait => {
                    self.waiting = Wait::Completions;
                    self.stats.would_block += 1;
                    return Err(SendError::WouldBlock(buf));
                }
                Choice::ZeroCopy { probe: p } => probe = p,
            }
        }
        // Built in a free slot of the ledger, where the last settled record is. The destination
        // is boxed first: unboxed, its 128-byte `sockaddr_storage` was copied into the call even
        // when absent.
        let started = self.latency.next();
        let dest = dest.map(Box::new);
        let slot = match self.ledger.free_item() {
            Some((free, rec)) => {
                rec.refill(buf, dest, started);
                self.ledger.insert_refilled(free)
            }
            None => self.ledger.insert(Record::new(buf, dest, started)),
        };
        if self.auto.is_some() {
            let rec = self.ledger.item_mut(slot);
            rec.auto_zc = true;
            rec.probe = probe;
            rec.charge = rec.total;
            self.zc_bytes += rec.total;
        }
        let result = self.write(sock, slot, out);
        self.finish_send(slot, result, out)
    }

    /// How a zero-copy send of the record in `slot` ended, `write`'s `result`, as the caller
    /// sees it: accepted (sealed, released once its ids complete; or the head, if a stream took
    /// part and is full), handed back (nothing went: the buffer leaves the ledger), or failed.
    #[inline(always)]
    fn finish_send(
        &mut self,
        slot: SlotId,
        result: io::Result<Wait>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let sent = self.ledger.item(slot).sent;
        match result {
            Ok(Wait::Nothing) => {
                self.waiting = Wait::Nothing;
                self.stats.sends += 1;
                self.seal(slot, out);
                Ok(())
            }
            Ok(wait) => {
                self.waiting = wait;
                if sent == 0 {
                    if let Some(buf) = self.abandon(slot) {
                        self.stats.would_block += 1;
                        return Err(SendError::WouldBlock(buf));
                    }
                }
                self.stats.sends += 1;
                self.head = Some(slot);
                Ok(())
            }
            Err(error) => {
                if sent == 0 {
                    if let Some(buf) = self.abandon(slot) {
                        return Err(SendError::Io { buf, error });
                    }
                }
                // Part of it is in the kernel: report the error with the release.
                self.stats.sends += 1;
                self.fail_partly_sent(slot, error, out);
                Ok(())
            }
        }
    }
}

impl<B: SendBuf> Engine<B> for SendmsgEngine<B> {
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let sent = self.send_one(sock, buf, dest, out);
        sys::refill_return_stack();
        sent
    }

    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let taken = self.send_batch_now(sock, bufs, out);
        sys::refill_return_stack();
        taken
    }

    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        // Zero-copy reads the error queue every time: its completions are there. Besides them it
        // may hold ICMP errors or timestamps, which keep POLLERR up (a caller's poll loop would
        // spin) until read; `copy` reads it for those alone, so less often (see
        // `COPY_ERRQUEUE_EVERY`).
        if self.zerocopy {
            self.reap_errqueue(sock, out);
        } else {
            self.quiet += 1;
            if self.quiet >= COPY_ERRQUEUE_EVERY {
                self.reap_errqueue(sock, out);
            }
        }
        if self.waiting == Wait::Completions && self.ledger.ids_in_flight() == 0 {
            self.waiting = Wait::Writable;
        }
        self.push_head(sock, out);
        Ok(())
    }

    fn held(&self) -> usize {
        self.ledger.held()
    }

    fn readiness(&mut self, sock: &Socket, retry: bool) -> Readiness {
        use std::os::fd::AsRawFd;
        if !self.zerocopy {
            // The caller is about to sleep on POLLERR: read what would wake it for nothing. A
            // copy sender has no completions, so nothing is released here.
            let mut none = Vec::new();
            self.reap_errqueue(sock, &mut none);
            debug_assert!(none.is_empty(), "a copy sender released on a completion");
        }
        // POLLOUT while a send waits for room, or for completions that have come since (or can
        // no longer come), or when what a handed-back send waited for was resolved meanwhile (a
        // head finished during the caller's reap): the retry may go as soon as there is room.
        // Otherwise only completions (POLLERR, always reported) can help.
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

    fn stats(&self) -> Stats {
        let mut s = self.stats;
        if let Some(auto) = &self.auto {
            auto.counts().add_to(&mut s);
        }
        s
    }

    fn auto_policy(&self) -> Option<&AutoPolicy> {
        self.auto.as_ref()
    }

    fn register_pool(&mut self, _pool: &BufPool) -> Result<(), Error> {
        let engine = if self.zerocopy {
            EngineKind::MsgZerocopy
        } else {
            EngineKind::Copy
        };
        Err(Error::Unsupported {
            feature: Feature::RegisteredBuffers(engine),
            reason: "only io_uring sends from registered memory: use the uring-zc engine".into(),
        })
    }

    fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> usize {
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
        // The kernel may still read them: leak them, never free them.
        let mut kept = 0;
        self.ledger.take_all_with(|rec| {
            for buf in rec.bufs.drain(..) {
                std::mem::forget(buf);
                kept += 1;
            }
        });
        kept
    }

    fn give_back(&mut self, sock: &Socket) {
        self.frag.give_back(sock.fd());
    }
}

/// The engine's parts a settled record's release touches, borrowed apart from the ledger
/// ([`SendmsgEngine::ledger_and_release`]).
struct Release<'a> {
    zerocopy: bool,
    auto: &'a mut Option<AutoPolicy>,
    zc_bytes: &'a mut usize,
    stats: &'a mut Stats,
}

impl Release<'_> {
    /// Gives the record's buffers back; tells `auto` how a record it sent zero-copy went, and
    /// takes it off the load.
    #[inline(always)]
    fn settle<B: SendBuf>(&mut self, rec: &mut Record<B>, done: Done, out: &mut Vec<Released<B>>) {
        rec.kernel_copied |= done.kernel_copied;
        if let Some(auto) = self.auto {
            *self.zc_bytes -= rec.charge;
            if let Some((copied, probe)) = rec.outcome() {
                auto.observe(copied, probe, 1);
            }
        }
        rec.release_in_place(self.zerocopy, self.stats, out);
    }
}

/// Sends the rest of `rec` by copy until the kernel took it all (`Ok(true)`) or the socket is full
/// (`Ok(false)`). A datagram goes whole or not at all.
#[inline(always)]
fn send_copied<B: SendBuf>(
    stats: &mut Stats,
    frag: &mut Unfragmented,
    stream: bool,
    sock: &Socket,
    rec: &mut Record<B>,
) -> io::Result<bool> {
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

/// Whether reading `MSG_ERRQUEUE` on `sock` reads its error queue. AF_UNIX has none (its
/// `recvmsg` ignores the flag and reads the data queue), nor has vsock before 6.7; a socket that
/// took `SO_ZEROCOPY` has one, and so do IP and packet sockets (ICMP errors, timestamps).
fn has_error_queue(sock: &Socket, zerocopy: bool) -> bool {
    zerocopy
        || matches!(
            sock.kind.family,
            Family::Inet4 | Family::Inet6 | Family::Packet
        )
}

/// `copy` reads the error queue in one [`Engine::progress`] call in this many, and whenever the
/// caller asks for [`Engine::readiness`] (right before it sleeps, as the API asks). With nothing
/// to complete, the queue holds only what the caller's own options put there (ICMP errors with
/// `IP_RECVERR`, TX timestamps), and draining it serves only a waiter, which POLLERR would wake
/// in a loop. An empty read costs a system call: about 1% of a 1472-byte datagram's send when it
/// came with every reap. A caller that polls without asking for readiness spins at most this many
/// times before the queue is read.
const COPY_ERRQUEUE_EVERY: u32 = 16;
