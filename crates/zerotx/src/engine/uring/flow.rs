//! [`State`]: everything of an io_uring engine but its ring, and a buffer's way through it:
//! queued, formed into a record in the box of its request, pushed, its CQEs applied (what follows
//! each is [`cqe`](super::cqe)'s), released. The socket's [`Order`] is the engine type's, fixed when the
//! factory built it. See the [module docs](super) for order, completions, the budget and leaving.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::time::Instant;

use socket2::SockAddr;

use super::cqe::{self, OnBudget, Req, Then};
use super::state::{op_for, Budget, Due, Next, Op, Order, Seat, Trains};
use crate::buf::{BufPool, SendBuf};
use crate::engine::clock::EpochClock;
use crate::engine::policy;
use crate::engine::policy::auto::{AutoPolicy, Choice, Load};
use crate::engine::record::{LatencySampler, Record};
use crate::report::{CopyReason, Released, Stats};
use crate::sys;
use crate::sys::uring::{
    self as sysu, Cqe, Cut, Lent, Payload, Refused, Ring, SendKind, UringConfig,
};

/// Everything of an io_uring engine but its ring, in named records (`state.rs`), the socket's
/// [`Order`], and the few counters and settings that need no record.
pub(super) struct State<B, O> {
    pub(super) seat: Seat,
    pub(super) order: O,
    pub(super) due: Due<B>,
    budget: Budget<B>,
    /// Trains: the kernel's limits on this socket, the paths that refused GSO.
    pub(super) trains: Trains,
    /// Zero-copy requests may be sent (`uring-zc`, or `auto`).
    pub(super) zc: bool,
    /// `auto`: the per-record choice between zero-copy and copy.
    pub(super) auto: Option<AutoPolicy>,
    pub(super) clock: EpochClock,
    /// `zc_flags` of zero-copy requests (`IORING_SEND_ZC_REPORT_USAGE` where the kernel has it).
    zc_flags: u16,
    pub(super) cfg: UringConfig,
    /// Buffers accepted and not yet in a record, in order. Destinations boxed: an entry moves
    /// twice per send, and most sends have none.
    pub(super) queue: VecDeque<(B, Option<Box<SockAddr>>)>,
    /// This sender's requests in the ring (pushed, last CQE not yet applied).
    in_ring: usize,
    pub(super) latency: LatencySampler,
    /// Boxes of finished requests, for the next ones.
    pub(super) spare: Vec<Box<Op<B>>>,
    /// Shutting down: results are recorded, nothing more is pushed.
    pub(super) closing: bool,
    /// In a batch of sends ([`Engine::batch`]): enter only for a full batch.
    pub(super) batching: bool,
    /// Buffers accepted and not yet given back.
    pub(super) held: usize,
    pub(super) stats: Stats,
}

/// Fixed buffer index for `buf` when it lies in the registered `region` and policy sends it
/// alone from there ([`policy::fixed_buffer`]).
pub(super) fn fixed_index<B: SendBuf>(region: Option<u64>, merge: bool, buf: &B) -> Option<u16> {
    if !policy::fixed_buffer(buf.as_bytes().len(), merge) {
        return None;
    }
    let (r, _) = buf.registered()?;
    (Some(r) == region).then_some(0)
}

impl<B, O> State<B, O> {
    /// Bytes pinned and zero-copy requests in flight against the budget, for `Stats`' gauges.
    pub(super) fn pinned(&self) -> (usize, usize) {
        self.budget.pinned()
    }

    /// The state of a sender that joined its ring as `seat`, its requests in `order`: zero-copy
    /// requests when `zc` (with `zc_flags`), `auto` choosing per record when given; trains as
    /// `trains` allows.
    pub(super) fn new(
        seat: Seat,
        order: O,
        (zc, zc_flags): (bool, u16),
        auto: Option<AutoPolicy>,
        cfg: UringConfig,
        trains: Trains,
    ) -> Self {
        Self {
            seat,
            order,
            due: Due::default(),
            budget: Budget::new(if zc { sysu::pin_limit() } else { None }),
            trains,
            zc,
            auto,
            clock: EpochClock::default(),
            zc_flags,
            cfg,
            queue: VecDeque::new(),
            in_ring: 0,
            latency: LatencySampler::default(),
            spare: Vec::new(),
            closing: false,
            batching: false,
            held: 0,
            stats: Stats::default(),
        }
    }
}

impl<B: SendBuf, O: Order> State<B, O> {
    /// The errno a new buffer is refused with: the stream's, once it broke, or `EPIPE` once the
    /// engine shut down.
    pub(super) fn refusal(&self) -> Option<i32> {
        self.order.broken().or(self.closing.then_some(libc::EPIPE))
    }

    /// The registered region zero-copy requests may send from, if any.
    pub(super) fn fixed_region(&self, ring: &Ring) -> Option<u64> {
        if self.zc {
            ring.registered().map(BufPool::region_id)
        } else {
            None
        }
    }

    /// A request waiting in the SQ is entered as soon as nothing submitted is in flight: outside
    /// a batch of sends, and always for an ordered socket, whose one request in flight never
    /// fills a batch (holding it back would idle the connection until the batch ends).
    pub(super) fn eager(&self) -> bool {
        !self.batching || O::ORDERED
    }

    /// Whether `bytes` could ever be pinned: io_uring refuses (`ENOMEM`) a zero-copy send whose
    /// pages exceed `RLIMIT_MEMLOCK`, however long one waits.
    fn may_pin(&self, bytes: usize) -> bool {
        policy::may_pin(sysu::pin_charge(bytes), self.budget.pin_limit())
    }

    /// Order, the CQ's room for this sender and the requests waiting to be pushed let a new
    /// request form.
    pub(super) fn may_issue(&self, ring: &Ring) -> bool {
        self.due.to_push.is_empty() && !self.order.busy() && ring.has_room(self.seat.owner)
    }

    /// Forms records from the queue while order and the in-flight cap allow, and pushes them;
    /// `auto`'s small copies on a byte stream are written at once ([`write_now`]).
    ///
    /// [`write_now`]: Self::write_now
    pub(super) fn issue(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) -> io::Result<()> {
        let region = self.fixed_region(ring);
        loop {
            if self.queue.is_empty() || !self.may_issue(ring) {
                return Ok(());
            }
            let fixed = {
                let (first, _) = self.queue.front().expect("queue not empty");
                fixed_index(region, self.order.merge(), first).is_some()
            };
            let mut zc = self.zc;
            let mut chosen = None;
            let mut copy_reason = None;
            let mut direct = false;
            if let Some(auto) = &mut self.auto {
                let (first, _) = self.queue.front().expect("queue not empty");
                let len = first.as_bytes().len();
                direct = self.order.merge() && policy::write_now(len);
                let (bytes, sends) = self.budget.pinned();
                let load = Load { sends, bytes };
                let choice = auto.choose(len, fixed, load);
                self.clock.tick(auto);
                match choice {
                    Choice::ZeroCopy { probe } => chosen = Some(probe),
                    Choice::Copy(reason) => {
                        zc = false;
                        copy_reason = Some(reason);
                    }
                    // Pinned pages come back with completions this sender's next progress reaps,
                    // and it issues again then.
                    Choice::Wait => return Ok(()),
                }
            }
            if let (Some(reason), true) = (copy_reason, direct) {
                // `may_issue` held: nothing of this stream is in the kernel's hands or waiting.
                if !self.write_now(ring, reason, out)? {
                    return Ok(());
                }
                continue;
            }
            // A record sent by copy batches whatever its memory (registered or not).
            let fixed = fixed && zc;
            let (first, dest) = self.queue.pop_front().expect("queue not empty");
            if !self.form(ring, region, (first, dest), zc, fixed, chosen, copy_reason)? {
                return Ok(());
            }
        }
    }

    /// Forms a record of `first` (on a byte stream with the queued buffers after it, unless
    /// `fixed` or a probe) and pushes its request. `false`: the SQ refused it, and it waits in
    /// `to_push`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn form(
        &mut self,
        ring: &mut Ring,
        region: Option<u64>,
        (first, dest): (B, Option<Box<SockAddr>>),
        zc: bool,
        fixed: bool,
        chosen: Option<bool>,
        copy_reason: Option<CopyReason>,
    ) -> io::Result<bool> {
        // The record is made in the box its request will use (a finished request's).
        let mut op = op_for(self.spare.pop(), first, dest, self.latency.next());
        let rec = op.payload_mut();
        if let Some(probe) = chosen {
            rec.auto_zc = true;
            rec.probe = probe;
        }
        rec.copy = copy_reason;
        // A byte-stream request carries several buffers as one iovec (as many as half the
        // locked-memory limit lets two requests pin at once, and at most
        // `MAX_STREAM_REQUEST` bytes); a fixed-buffer request, a
        // message and a datagram carry one. So does `auto`'s probe: it asks whether the route
        // still copies, and one buffer answers that (a batch would send up to 2 MiB zero-copy
        // on a route that copies it all).
        let probe = chosen == Some(true);
        while self.order.merge() && !fixed && !probe && rec.bufs.len() < self.cfg.batch {
            let next = match self.queue.front() {
                Some((b, _)) if !zc || fixed_index(region, self.order.merge(), b).is_none() => {
                    b.as_bytes().len()
                }
                _ => break,
            };
            let limit = if zc { self.budget.pin_limit() } else { None };
            if !policy::batch_fits(sysu::pin_charge(rec.total + next), limit) {
                break;
            }
            if rec.total + next > policy::MAX_STREAM_REQUEST {
                break;
            }
            rec.push(self.queue.pop_front().expect("front exists").0);
        }
        self.launch(ring, op, zc)
    }

    /// Pushes the first request of a record just formed. `to_push` is empty here (the caller
    /// checked `may_issue`): push at once, and keep the request in `to_push` only if the SQ
    /// refused it, exactly as `flush_pushes` would. `false`: the SQ refused it.
    #[inline]
    pub(super) fn launch(&mut self, ring: &mut Ring, op: Box<Op<B>>, zc: bool) -> io::Result<bool> {
        self.order.take();
        let next = Next {
            op,
            zc,
            resubmits: 0,
        };
        if let Err((next, error)) = self.push_request(ring, next) {
            self.due.to_push.push_front(next);
            return error.map_or(Ok(false), Err);
        }
        Ok(true)
    }

    /// `auto`'s copy of small buffers on a byte stream with nothing of the stream in the kernel's
    /// hands ([`policy::write_now`]): the queue's front run of them goes in one `sendmsg(2)`
    /// ([`sys::send_gather`], at most [`sys::GATHER_MAX`] buffers and [`sys::GATHER_BYTES`]
    /// bytes, the first buffer whatever its size), as the `copy` engine writes a batch, not as a
    /// request. What the kernel took whole is released at once. The rest goes as a request after
    /// all, which waits for room in the kernel: the buffer the kernel cut (from where it cut it),
    /// or the front run if the kernel took nothing (`EAGAIN`). An error is the front buffer's and
    /// ends the stream, as a failed request's does. `false`: the SQ refused that request (it
    /// waits in `to_push`).
    #[inline(never)]
    fn write_now(
        &mut self,
        ring: &mut Ring,
        reason: CopyReason,
        out: &mut Vec<Released<B>>,
    ) -> io::Result<bool> {
        let Some(fd) = self.seat.fd.as_ref() else {
            // Never here: the descriptor goes only when the engine is dropped.
            return self.form_copy(ring, reason);
        };
        // The small buffers at the front: a large one after them goes as a request.
        let run = (self.queue.iter().take(self.cfg.batch.max(1)))
            .map(|(b, _)| b.as_bytes())
            .enumerate()
            .take_while(|(i, b)| *i == 0 || policy::write_now(b.len()))
            .map(|(_, b)| b);
        let slices = sys::gather_run(run);
        let n = slices.len();
        if n == 0 {
            // An empty buffer (the sender refuses them before they are queued): not a write.
            drop(slices);
            return self.form_copy(ring, reason);
        }
        // One clock read before the call, if any of these buffers is one the sampler times.
        let now = self.latency.due_within(n).then(Instant::now);
        self.stats.syscalls += 1;
        // The returns up to the caller's loop, past `issue` and the engine call, come next.
        let result = sys::fenced!(sys::send_gather(fd.as_fd(), &slices));
        drop(slices);
        let mut taken = match result {
            Ok(taken) => taken,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return self.form_copy(ring, reason),
            Err(error) => {
                let errno = error.raw_os_error().unwrap_or(libc::EIO);
                let (buf, dest) = self.queue.pop_front().expect("n >= 1 buffers offered");
                self.held -= 1;
                let mut rec = Record::new(buf, dest, self.latency.next_at(now));
                rec.copy = Some(reason);
                rec.error = Some(error);
                rec.release(self.zc, &mut self.stats, out);
                self.break_stream(errno, out);
                return Ok(true);
            }
        };
        self.stats.bytes += taken as u64;
        let path = policy::release_path(self.zc, Some(reason), false);
        while taken > 0 {
            let (buf, dest) = self
                .queue
                .pop_front()
                .expect("the kernel took no more than offered");
            let len = buf.as_bytes().len();
            let started = self.latency.next_at(now);
            if taken >= len {
                taken -= len;
                self.held -= 1;
                Record::release_whole(buf, path, started, &mut self.stats, out);
            } else {
                let mut op = op_for(self.spare.pop(), buf, dest, started);
                let rec = op.payload_mut();
                rec.copy = Some(reason);
                rec.sent = taken;
                return self.launch(ring, op, false);
            }
        }
        Ok(true)
    }

    /// A copy request of the queue's front run (see [`form`](Self::form)).
    fn form_copy(&mut self, ring: &mut Ring, reason: CopyReason) -> io::Result<bool> {
        let (first, dest) = self.queue.pop_front().expect("queue not empty");
        let region = self.fixed_region(ring);
        self.form(
            ring,
            region,
            (first, dest),
            false,
            false,
            None,
            Some(reason),
        )
    }

    /// Pushes the requests that are due, in order. Stops, keeping the rest, when the SQ stays
    /// full, `io_uring_enter` fails or the CQ has no room for this sender; they go at the next
    /// progress.
    fn flush_pushes(&mut self, ring: &mut Ring) -> io::Result<()> {
        while let Some(next) = self.due.to_push.pop_front() {
            if let Err((next, error)) = self.push_request(ring, next) {
                self.due.to_push.push_front(next);
                return error.map_or(Ok(()), Err);
            }
        }
        Ok(())
    }

    /// Pushes one request for the unsent part of `next`'s record; hands it back if the SQ stayed
    /// full (no error, `owed` set: the next wait must not sleep), `io_uring_enter` failed (`owed`
    /// too), or the CQ has no room for it (`no_place`: it waits for this sender's or another's
    /// CQEs to be read, which the ring's fd or the shared ring's wait slice wakes for).
    #[inline]
    fn push_request(
        &mut self,
        ring: &mut Ring,
        next: Next<B>,
    ) -> Result<(), (Next<B>, Option<io::Error>)> {
        let Next {
            mut op,
            zc: want_zc,
            resubmits,
        } = next;
        let region = if want_zc {
            self.fixed_region(ring)
        } else {
            None
        };
        let (fixed, len) = self.shape(op.payload(), region);
        // A request from user memory charges its pages to the locked-memory limit; one that could
        // never fit goes by copy at once.
        let zc = want_zc && (fixed.is_some() || self.may_pin(len));
        if want_zc && !zc {
            op.payload_mut().copy_for(CopyReason::Fallback);
        }
        let kind = match (zc, fixed) {
            (true, Some(kind)) => kind,
            (true, None) => SendKind::ZeroCopy {
                zc_flags: self.zc_flags,
            },
            (false, _) => SendKind::Copy,
        };
        let flags = libc::MSG_NOSIGNAL
            | if self.order.merge() {
                libc::MSG_WAITALL
            } else {
                0
            };
        op.set(self.seat.raw_fd(), kind, flags);
        op.meta = Req {
            zc,
            charged: zc && fixed.is_none(),
            len,
            pinned: 0,
            first: None,
            copied: false,
            resubmits,
        };
        match ring.push(self.seat.owner, 0, op) {
            Ok(()) => {
                self.in_ring += 1;
                self.stats.syscalls += 1;
                self.due.pushed();
                Ok(())
            }
            Err(Refused {
                op,
                error,
                no_place,
            }) => {
                // Never queued: the caller keeps the record and pushes it again later.
                self.due.refused(no_place);
                let next = Next {
                    op,
                    zc: want_zc,
                    resubmits,
                };
                Err((next, error))
            }
        }
    }

    /// How the next request of `rec` sends from registered memory, if it lies in `region`, and
    /// the bytes it carries. A train needs its control message, so a `msghdr`: from a registered
    /// buffer, a `SENDMSG_ZC` with `FIXED_BUF` where the kernel has it, never a `SEND_ZC`; a
    /// split train's request carries one datagram.
    fn shape(&self, rec: &Record<B>, region: Option<u64>) -> (Option<SendKind>, usize) {
        let zc_flags = self.zc_flags;
        let fixed = match (rec.cut(), rec.bufs.as_slice()) {
            (Cut::None, [one]) => fixed_index(region, self.order.merge(), one)
                .map(|index| SendKind::Fixed { index, zc_flags }),
            // A train, or a batch's run whose every buffer lies in the region.
            (Cut::Train(_), [first, ..]) if sysu::sendmsg_zc_fixed() => {
                let all = rec
                    .bufs
                    .iter()
                    .all(|b| fixed_index(region, false, b).is_some());
                let index = fixed_index(region, false, first).filter(|_| all);
                index.map(|index| SendKind::FixedMsg { index, zc_flags })
            }
            _ => None,
        };
        let len = match rec.cut() {
            Cut::One(size) => rec.left().min(usize::from(size)),
            Cut::None | Cut::Train(_) => rec.left(),
        };
        (fixed, len)
    }

    /// Reaps, pushes what is due, forms new requests, and submits. Every path that may be followed
    /// by a wait on the ring goes through here: an SQE left unsubmitted with nothing else in
    /// flight would make that wait endless. Every step runs even if one failed; the first error
    /// is returned, and what it held back is tried again at the next progress.
    pub(super) fn kick(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) -> io::Result<()> {
        if self.seat.left {
            return Ok(());
        }
        self.reap(ring, out);
        let pushed = self.flush_pushes(ring);
        let issued = self.issue(ring, out);
        let owed = self.due.take_owed();
        let submitted = if owed {
            ring.submit()
        } else {
            ring.submit_if_due(self.eager())
        };
        self.due.settle(submitted.is_err());
        pushed.and(issued).and(submitted)
    }

    /// Applies every completion this owner has on the ring.
    fn reap(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) {
        let owner = self.seat.owner;
        ring.reap_with::<Op<B>>(owner, |cqe, lent| self.on_cqe(cqe, lent, out));
    }

    /// One CQE and its request (lent by the ring, or handed back with its last CQE): record it;
    /// on the first, decide what follows; on the last, carry that out.
    #[inline]
    fn on_cqe(&mut self, cqe: Cqe, lent: Lent<'_, Op<B>>, out: &mut Vec<Released<B>>) {
        match lent {
            Lent::Live(req) => self.account(req, cqe, out),
            Lent::Back(mut op) => {
                self.in_ring -= 1;
                self.account(&mut op.meta, cqe, out);
                self.on_last(op, out);
            }
            // The cancel of a shutdown: its count of cancelled requests is not needed.
            Lent::Other if cqe.req == sysu::CANCEL => {}
            // Every other request of this owner is an `Op<B>`.
            Lent::Other | Lent::Unknown => self.stats.bad_completions += 1,
        }
    }

    /// Records one CQE of `req`: a notification, or its first CQE.
    #[inline]
    fn account(&mut self, req: &mut Req, cqe: Cqe, out: &mut Vec<Released<B>>) {
        if cqe.is_notif() {
            req.copied |= cqe.copied();
            self.stats.completions += 1;
        } else {
            self.on_first(req, cqe.res, out);
        }
    }

    /// A request's first CQE: account bytes and pinned pages, decide what follows, let the next
    /// record of an ordered socket go if this one went whole, and end the stream if it failed.
    fn on_first(&mut self, req: &mut Req, res: i32, out: &mut Vec<Released<B>>) {
        if req.charged && res > 0 {
            req.pinned = sysu::pin_charge(res as usize);
            self.budget.pin(req.pinned);
        }
        if res > 0 {
            self.stats.bytes += res as u64;
        }
        let then = cqe::after_first(req, res, self.order.merge(), self.closing);
        req.first = Some((res, then));
        match then {
            Then::Budget => self.stats.enobufs += 1,
            Then::Done => self.order.went(),
            // After a failed stream send nothing more may go out.
            Then::Fail(errno) if O::ORDERED => self.break_stream(errno, out),
            _ => {}
        }
    }

    /// A request's last CQE: its record is back. Release it, or push what follows.
    fn on_last(&mut self, mut op: Box<Op<B>>, out: &mut Vec<Released<B>>) {
        let req = op.meta;
        if self.budget.unpin(req.pinned) && !self.closing {
            // Pinned pages came back: retry what the budget refused, as far as they make room.
            let charge = |next: &Next<B>| sysu::pin_charge(next.op.payload().left());
            self.due.to_push.extend(self.budget.wake(charge));
        }
        let (res, then) = cqe::at_last(req.first, self.closing);
        let rec = op.payload_mut();
        rec.kernel_copied |= req.copied;
        let then = if rec.train.is_some() {
            let cqe = (req.len, res, then);
            self.trains.after(rec, cqe, self.closing, &mut self.stats)
        } else {
            rec.sent = cqe::sent_after(rec.sent, rec.total, res, self.order.merge());
            then
        };
        // A split train's datagrams go by copy.
        let split = rec.train.is_some_and(|t| t.split);
        let mut next = Next {
            op,
            zc: req.zc && !split,
            resubmits: req.resubmits,
        };
        match then {
            Then::Done => self.release(next.op, out),
            Then::Fail(errno) => {
                let rec = next.op.payload_mut();
                rec.error
                    .get_or_insert_with(|| io::Error::from_raw_os_error(errno));
                self.release(next.op, out);
            }
            Then::Continue => {
                next.resubmits = 0;
                self.due.to_push.push_back(next);
            }
            Then::Resubmit => {
                next.resubmits += 1;
                self.due.to_push.push_back(next);
            }
            Then::Budget => {
                let at_cap = self.auto.as_mut().map(|auto| {
                    auto.on_refusal();
                    auto.at_cap()
                });
                let charge = sysu::pin_charge(next.op.payload().left());
                match cqe::on_budget(at_cap, self.budget.pinned().0, charge) {
                    OnBudget::Wait => self.budget.defer(next),
                    OnBudget::Copy(reason) => {
                        next.op.payload_mut().copy_for(reason);
                        next.zc = false;
                        self.due.to_push.push_back(next);
                    }
                }
            }
        }
    }

    /// Gives a record back with its report, and keeps its request's box for the next one.
    fn release(&mut self, mut op: Box<Op<B>>, out: &mut Vec<Released<B>>) {
        let rec = op.payload();
        self.held -= rec.bufs.len();
        if let (Some(auto), Some((copied, probe))) = (&mut self.auto, rec.outcome()) {
            auto.observe(copied, probe, rec.bufs.len() as u32);
        }
        op.payload_mut()
            .release_in_place(self.zc, &mut self.stats, out);
        if self.spare.len() < self.cfg.entries as usize {
            self.spare.push(op);
        }
    }

    /// After a failed stream send nothing more may go out (it would leave a gap): every queued
    /// buffer comes back with the error.
    fn break_stream(&mut self, errno: i32, out: &mut Vec<Released<B>>) {
        self.order.break_with(errno);
        while let Some((buf, dest)) = self.queue.pop_front() {
            self.held -= 1;
            let mut rec = Record::new(buf, dest, None);
            rec.error = Some(io::Error::from_raw_os_error(errno));
            rec.release(false, &mut self.stats, out);
        }
    }

    /// Leaves nothing of this sender's in the SQ and nothing of it parked: cancels its requests
    /// (`IORING_OP_ASYNC_CANCEL` after them in the SQ, so they are submitted first) and submits
    /// until the SQ is empty. If that fails, an SQE may still name the descriptor: it is leaked,
    /// never closed. A cancel that finds no room is tried again once the SQ drained.
    pub(super) fn withdraw(&mut self, ring: &mut Ring) {
        let (owner, fd) = (self.seat.owner, self.seat.raw_fd());
        let mut cancel = self.in_ring > 0;
        for _ in 0..2 {
            if cancel && matches!(ring.push_cancel(owner, fd), Ok(true)) {
                cancel = false;
            }
            if ring.submit_all().is_err() {
                self.seat.leak_fd = true;
                return;
            }
            if !cancel {
                return;
            }
        }
    }

    /// See [`Engine::shutdown`]: returns how many buffers the ring keeps.
    pub(super) fn shutdown(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) -> usize {
        if self.seat.left {
            return 0;
        }
        let errno = libc::EPIPE;
        self.closing = true;
        self.break_stream(errno, out);
        // Records waiting for a push or for the budget have nothing in the kernel: give them back
        // with the error.
        let waiting: Vec<Next<B>> = self
            .due
            .to_push
            .drain(..)
            .chain(self.budget.drain())
            .collect();
        for Next { mut op, .. } in waiting {
            op.payload_mut()
                .error
                .get_or_insert_with(|| io::Error::from_raw_os_error(errno));
            self.release(op, out);
        }
        self.withdraw(ring);
        // Cancelled requests complete at once (a zero-copy one's notification follows when the
        // kernel let go of its pages): one more look gives back what it can.
        self.reap(ring, out);
        // Requests still in flight: the kernel may still read their buffers and (before it issued
        // them) their iovecs, msghdr and destination. Leaving hands them to the ring, which frees
        // them after their last CQE (or leaks them if it is dropped first), never earlier.
        let kept = self.held;
        ring.leave(self.seat.owner);
        self.seat.left = true;
        self.in_ring = 0;
        self.held = 0;
        kept
    }
}
