//! `msg-zc` on datagram sockets (UDP: docs/kernel.md lists the datagram sockets that take
//! `SO_ZEROCOPY`): one `send(MSG_ZEROCOPY)` per datagram, each held in the ledger under the one
//! id its call took until that id completes. A failed call may have taken an id
//! ([`IdRule::Datagram`]), and a datagram too large for its path goes by copy
//! ([`Unfragmented`](crate::engine::unfragmented::Unfragmented)); a datagram goes whole or not at
//! all, so there is no broken stream.
//!
//! A train (UDP GSO, [`policy::train`](crate::engine::policy::train)) is one record under one id
//! too: one `sendmsg` with a `UDP_SEGMENT` control message and `MSG_ZEROCOPY`, its failures read
//! under the same id rule. A train whose path refused GSO goes one datagram per call by copy;
//! one that found the socket full part way is the engine's one head, sent before anything else.

use std::collections::VecDeque;
use std::io;
use std::time::Instant;

use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::clock::EpochClock;
use crate::engine::msg_zc::common;
use crate::engine::policy::auto::{AutoPolicy, Choice, Load};
use crate::engine::policy::sendmsg::IdRule;
use crate::engine::policy::train::{self as trains, TrainFailure};
use crate::engine::record::Record;
use crate::engine::sendmsg_core::{answered_by_core, send_copied, SendmsgCore, Wait};
use crate::engine::sendmsg_runs::{send_run, RunMode, RunSent};
use crate::engine::sendmsg_train::{plain_batch, plain_send, split_train, BatchRuns};
use crate::engine::{send_each, send_front, Engine};
use crate::error::SendError;
use crate::ledger::SlotId;
use crate::report::{CopyReason, Readiness, Released};
use crate::socket::Socket;
use crate::sys;

const RULE: IdRule = IdRule::Datagram;

/// `msg-zc` on datagrams. Invariant: never broken; a head only as a split train's rest; every
/// record holds its buffer until the one id its call took completed (or, sent by copy, until its
/// last call returned).
pub(crate) struct MsgZcDatagram<B> {
    core: SendmsgCore<B>,
    clock: EpochClock,
}

impl<B: SendBuf> MsgZcDatagram<B> {
    /// `SO_ZEROCOPY` was accepted on `sock`, whose next zero-copy id is `first_id`; `auto`
    /// chooses per send when given.
    /// `runs`: whether a batch's runs of equal-size datagrams go as trains.
    pub(crate) fn new(
        sock: &Socket,
        first_id: u32,
        auto: Option<AutoPolicy>,
        runs: BatchRuns,
    ) -> Self {
        let mut core = SendmsgCore::new(sock, true, first_id, auto, true);
        core.runs = runs;
        Self {
            core,
            clock: EpochClock::default(),
        }
    }

    #[inline]
    fn send_one(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        debug_assert!(self.core.broken.is_none());
        if self.core.head.is_some() && !self.head_pushed(sock, out) {
            return Err(SendError::WouldBlock(buf));
        }
        let core = &mut self.core;
        common::send_one(core, &mut self.clock, RULE, sock, buf, dest, out)
    }

    /// Pushes a split train's rest; whether it is all gone (else the caller's send waits).
    #[cold]
    #[inline(never)]
    fn head_pushed(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> bool {
        self.core.push_head(sock, out);
        if self.core.head.is_some() {
            self.core.stats.would_block += 1;
            return false;
        }
        true
    }

    /// A train of `buf` in `segment`-byte datagrams: `auto`'s choice for the train's bytes, then
    /// one zero-copy GSO call ([`write_train`]), or by copy.
    fn send_train(
        &mut self,
        sock: &Socket,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        if self.core.head.is_some() && !self.head_pushed(sock, out) {
            return Err(SendError::WouldBlock(buf));
        }
        let len = buf.as_bytes().len();
        if let Err(reason) = self.core.check_train(len, segment) {
            return Err(SendError::Invalid { buf, reason });
        }
        let core = &mut self.core;
        let mut rec = core.train_record(buf, segment, dest);
        let mut probe = false;
        if let Some(auto) = &mut core.settle.auto {
            if trains::auto_copies(len) {
                let small = Some(CopyReason::Small);
                return core.try_send_train_copy(sock, rec, small, out);
            }
            let load = Load {
                sends: core.ledger.ids_in_flight(),
                bytes: core.settle.zc_bytes,
            };
            let choice = auto.choose(len, false, load);
            self.clock.tick(auto);
            match choice {
                Choice::Copy(reason) => {
                    return core.try_send_train_copy(sock, rec, Some(reason), out)
                }
                Choice::Wait => {
                    core.waiting = Wait::Completions;
                    core.stats.would_block += 1;
                    return Err(SendError::WouldBlock(rec.take_buf()));
                }
                Choice::ZeroCopy { probe: p } => probe = p,
            }
        }
        // A path that refused GSO before: the kernel's copy, which tells `auto` nothing.
        let split = rec.train.is_some_and(|t| t.split);
        rec.kernel_copied = split;
        let slot = core.insert_charged(rec, probe && !split);
        core.ledger.item_mut(slot).auto_zc &= !split;
        let result = write_train(core, sock, slot, out);
        common::finish_send(core, slot, result, out).map(|()| core.stats.trains += 1)
    }

    /// A batch without `auto`: one `send(MSG_ZEROCOPY)` per buffer, the record made after the
    /// call, the datagram whole. The call that succeeds is the whole loop; a full socket hands
    /// the buffer back as [`send_one`](Self::send_one) would. The rest goes the general way
    /// with the same rules ([`send_each`]'s): an empty buffer and a datagram the path would
    /// fragment through `send_one`, a failed call through
    /// [`refused`](Self::refused). A loop of its own: the general one's moves cost a measurable
    /// part of a large datagram's send (docs/fast-path.md).
    ///
    /// Nothing asks the buffer for its bytes after the call: a panicking `as_bytes` there would
    /// leave the id the call took unrecorded, and the next buffer would be released on that id's
    /// completion.
    #[inline(always)]
    fn send_plain(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let fd = sock.fd();
        let runs = self.core.runs.on();
        // Buffers that go one per call whatever their size: the rest of a run the kernel refused.
        let mut alone = 0usize;
        let mut taken = 0;
        loop {
            let Some(mut buf) = bufs.pop_front() else {
                return Ok(taken);
            };
            if alone > 0 {
                alone -= 1;
            } else if runs {
                // The one size comparison per buffer: a run may start here.
                let len = buf.as_bytes().len();
                if len > 0 && bufs.front().is_some_and(|b| b.as_bytes().len() == len) {
                    let zc = |_: &mut SendmsgCore<B>, _| Some(RunMode::ZeroCopy { probe: false });
                    match send_run(&mut self.core, sock, buf, bufs, zc, out) {
                        RunSent::Sent(n) => {
                            taken += n;
                            continue;
                        }
                        RunSent::Full => return Ok(taken),
                        RunSent::Alone(b, n) => (buf, alone) = (b, n - 1),
                        RunSent::Failed(buf, error) => return Err(SendError::Io { buf, error }),
                    }
                }
            }
            let data = buf.as_bytes();
            let len = data.len();
            if len == 0 || !self.core.frag.may_zerocopy(len, None) {
                bufs.push_front(buf);
                if !send_front(bufs, |buf| self.send_one(sock, buf, None, out))? {
                    return Ok(taken);
                }
                taken += 1;
                continue;
            }
            let started = self.core.latency.next();
            self.core.stats.syscalls += 1;
            match sys::send_to(fd, data, None, sys::MSG_ZEROCOPY) {
                Ok(n) => self.sent_whole(buf, len, n, started, out),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // No id taken, nothing sent: back to the front, as `copy`'s loop does.
                    return self.core.datagram_refused(buf, Some(e), taken, bufs);
                }
                Err(e) => {
                    if !self.refused(sock, buf, len, started, e, bufs, out)? {
                        return Ok(taken);
                    }
                }
            }
            taken += 1;
        }
    }

    /// A batch with `auto` (or behind a split train's rest): [`send_each`]'s loop, where a run of
    /// equal-size datagrams goes as one train ([`send_run`]) once no head waits, zero-copy or by
    /// copy as `auto` chooses for the run's bytes ([`auto_run`]).
    fn send_each_or_run(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let mut alone = 0usize;
        let mut taken = 0;
        loop {
            let run = match (bufs.front(), bufs.get(1)) {
                (Some(a), Some(b)) => {
                    let len = a.as_bytes().len();
                    len > 0 && b.as_bytes().len() == len
                }
                _ => false,
            };
            if alone == 0 && run && self.core.head.is_none() {
                let buf = bufs.pop_front().expect("checked");
                let clock = &mut self.clock;
                let mode = |core: &mut SendmsgCore<B>, bytes| auto_run(core, clock, bytes);
                match send_run(&mut self.core, sock, buf, bufs, mode, out) {
                    RunSent::Sent(n) => {
                        taken += n;
                        continue;
                    }
                    RunSent::Full => return Ok(taken),
                    RunSent::Alone(b, n) => {
                        bufs.push_front(b);
                        alone = n;
                    }
                    RunSent::Failed(buf, error) => return Err(SendError::Io { buf, error }),
                }
            }
            alone = alone.saturating_sub(1);
            if !send_front(bufs, |buf| self.send_one(sock, buf, None, out))? {
                return Ok(taken);
            }
            taken += 1;
        }
    }

    /// [`send_plain`](Self::send_plain)'s call took `buf` (`len` bytes; `n` counted) whole under
    /// the one id it took: held until that id completes.
    #[inline]
    fn sent_whole(
        &mut self,
        buf: B,
        len: usize,
        n: usize,
        started: Option<Instant>,
        out: &mut Vec<Released<B>>,
    ) {
        let core = &mut self.core;
        core.stats.bytes += n as u64;
        core.stats.sends += 1;
        core.stats.zerocopy_ids += 1;
        core.waiting = Wait::Nothing;
        match core.ledger.free_item() {
            Some((free, rec)) => {
                rec.refill_len(buf, len, None, started);
                rec.sent = len;
                core.ledger.insert_refilled_one_id(free);
            }
            None => {
                let mut rec = Record::of_len(buf, len, None::<Box<SockAddr>>, started);
                rec.sent = len;
                let slot = core.ledger.insert(rec);
                core.ledger.record_id(slot);
                core.seal(slot, out);
            }
        }
    }

    /// [`send_plain`](Self::send_plain)'s call for `buf` (`len` bytes) failed with `e` (not
    /// `EAGAIN`): from here the buffer goes as [`send_one`](Self::send_one) would take it on, its
    /// record in the ledger and [`common::refused`]'s answer (learn whether the call took an id;
    /// on the budget's `ENOBUFS` read completions and retry, copy, or wait). `Ok(true)`:
    /// accepted; `Ok(false)`: handed back, at the front of `bufs` again; `Err`: it failed.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn refused(
        &mut self,
        sock: &Socket,
        buf: B,
        len: usize,
        started: Option<Instant>,
        e: io::Error,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<bool, SendError<B>> {
        let core = &mut self.core;
        let slot = core
            .ledger
            .insert(Record::of_len(buf, len, None::<Box<SockAddr>>, started));
        let result = match common::refused(core, RULE, sock, slot, e, out) {
            Ok(Some(wait)) => Ok(wait),
            Ok(None) => common::write(core, RULE, sock, slot, out),
            Err(e) => Err(e),
        };
        match common::finish_send(core, slot, result, out) {
            Ok(()) => Ok(true),
            Err(SendError::WouldBlock(buf)) => {
                bufs.push_front(buf);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// Sends the train in `slot` until it is queued whole or the socket pushes back: one zero-copy
/// GSO call, or by copy once the record says so (a fallback, a split path). A failed zero-copy
/// call is read under [`IdRule::Datagram`] (did it take an id?) and answered by
/// [`trains::on_failure`].
fn write_train<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    sock: &Socket,
    slot: SlotId,
    out: &mut Vec<Released<B>>,
) -> io::Result<Wait> {
    loop {
        let rec = core.ledger.item_mut(slot);
        let mut train = rec.train.expect("a train's record");
        if rec.copy.is_some() || train.split {
            let all = send_copied(
                &mut core.stats,
                &mut core.frag,
                &mut core.splits,
                false,
                sock,
                rec,
            )?;
            return Ok(if all { Wait::Nothing } else { Wait::Writable });
        }
        core.stats.syscalls += 1;
        let (bytes, dest) = (rec.bufs[0].as_bytes(), rec.dest.as_deref());
        let sent = if sock.segment.train(sock.fd(), train.segment) {
            sys::send_to(sock.fd(), bytes, dest, sys::MSG_ZEROCOPY)
        } else {
            sys::train::send_train(sock.fd(), bytes, train.segment, dest, sys::MSG_ZEROCOPY)
        };
        let error = match sent {
            Ok(n) => {
                core.ledger.record_id(slot);
                core.stats.zerocopy_ids += 1;
                core.stats.bytes += n as u64;
                if let Some(auto) = &mut core.settle.auto {
                    auto.on_accepted();
                }
                let rec = core.ledger.item_mut(slot);
                rec.sent = rec.total;
                return Ok(Wait::Nothing);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Wait::Writable),
            Err(e) => e,
        };
        let (took_id, reaped) = core.learn_failed_id(sock, out);
        match trains::on_failure(error.raw_os_error(), took_id) {
            TrainFailure::Budget => {
                if let Some(wait) = common::on_budget(core, sock, slot, reaped, out) {
                    return Ok(wait);
                }
            }
            TrainFailure::Split => {
                let rec = core.ledger.item_mut(slot);
                split_train(&mut core.stats, &mut core.splits, rec, &mut train);
                rec.kernel_copied = true;
                rec.auto_zc = false;
            }
            TrainFailure::Fail(_) => return Err(error),
        }
    }
}

/// How a run goes under `auto` ([`send_run`]'s mode): by copy below [`trains::auto_copies`]'s
/// threshold (of what a zero-copy train of it would carry), else as `auto`'s per-send rules choose
/// (`None`: wait for completions). Zero-copy without `auto`.
fn auto_run<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    clock: &mut EpochClock,
    zc_bytes: usize,
) -> Option<RunMode> {
    let Some(auto) = &mut core.settle.auto else {
        return Some(RunMode::ZeroCopy { probe: false });
    };
    // A zero-copy train would carry only `zc_bytes`: short of the threshold, the whole run
    // goes as one copied train instead.
    if trains::auto_copies(zc_bytes) {
        return Some(RunMode::Copy(Some(CopyReason::Small)));
    }
    let load = Load {
        sends: core.ledger.ids_in_flight(),
        bytes: core.settle.zc_bytes,
    };
    let choice = auto.choose(zc_bytes, false, load);
    clock.tick(auto);
    match choice {
        Choice::Copy(reason) => Some(RunMode::Copy(Some(reason))),
        Choice::Wait => None,
        Choice::ZeroCopy { probe } => Some(RunMode::ZeroCopy { probe }),
    }
}

impl<B: SendBuf> Engine<B> for MsgZcDatagram<B> {
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let buf = plain_send(sock, buf)?;
        sys::fenced!(self.send_one(sock, buf, dest, out))
    }

    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        plain_batch(sock, bufs)?;
        sys::fenced!(
            if self.core.settle.auto.is_none() && self.core.head.is_none() {
                self.send_plain(sock, bufs, out)
            } else if self.core.runs.on() {
                self.send_each_or_run(sock, bufs, out)
            } else {
                send_each(bufs, |buf| self.send_one(sock, buf, None, out))
            }
        )
    }

    fn try_send_train(
        &mut self,
        sock: &Socket,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        sys::fenced!(self.send_train(sock, buf, segment, dest, out))
    }

    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        self.core.reap_completions(sock, out);
        self.core.push_head(sock, out);
        Ok(())
    }

    fn readiness(&mut self, sock: &Socket, retry: bool) -> Readiness {
        self.core.readiness(sock, retry)
    }

    answered_by_core!();
}
