//! The io_uring engines: `uring` (`IORING_OP_SENDMSG`, the kernel copies) and `uring-zc`
//! (`IORING_OP_SENDMSG_ZC`, or `IORING_OP_SEND_ZC` with `IORING_RECVSEND_FIXED_BUF` for buffers from
//! a registered [`BufPool`]), both with many requests per `io_uring_enter`. This module decides
//! order, batching and the budget; the ring, the requests and every pointer the kernel reads are
//! in [`sys::uring`].
//!
//! - **Order.** io_uring issues requests independently: two in flight on one connection can
//!   reorder it when the socket buffer fills (KERNEL.md measured a quarter of a TCP stream's bytes
//!   out of order; SEQPACKET messages reorder the same way). So a stream or seqpacket socket has
//!   exactly one request in flight. On a byte stream (TCP, AF_UNIX and vsock streams) it carries
//!   up to `batch` queued buffers as an iovec with `MSG_WAITALL`, and a short result is continued
//!   from its offset; on SEQPACKET and SCTP one request is one message, never merged. Datagram
//!   sockets have many requests in flight, one per buffer. The next record of an ordered socket
//!   may go as soon as the first CQE says the previous one went whole, before its notification.
//! - **Completions.** The first CQE carries bytes or `-errno` and `IORING_CQE_F_MORE` when a
//!   notification follows (read from the flag, also on errors); it decides what follows the
//!   request ([`Then`]). The request holds its record (the buffers) until its **last** CQE (the
//!   `IORING_CQE_F_NOTIF` one, or a first CQE without `F_MORE`), which hands the record back;
//!   only then is it released, or continued: a short `MSG_WAITALL` result, a resubmission and a
//!   copy after the budget refused are built from the returned record, so they wait for the
//!   notification of the request before them. `IORING_SEND_ZC_REPORT_USAGE`, where the kernel has
//!   it, makes the notification say whether the kernel copied. Every CQE reaped is applied, and
//!   whatever must be pushed next waits in `to_push` until the SQ takes it, so a failing
//!   `io_uring_enter` loses nothing.
//! - **The zero-copy budget** (`ENOMEM`, when io_uring charges pinned pages to
//!   `RLIMIT_MEMLOCK`): a refused request waits for one of this sender's requests that holds
//!   pinned pages to finish, if those pages could make room for it; otherwise it goes by copy at
//!   once (a fallback). A request larger than the locked-memory limit is never tried zero-copy.
//!   Nothing is retried on its own completion, so nothing spins. `ENOBUFS` is never the budget
//!   here: io_uring hands the stack its own notification (`msg_ubuf`), so the option-memory
//!   allocation that answers `ENOBUFS` for `MSG_ZEROCOPY` never runs; an `ENOBUFS` is a datagram
//!   a qdisc dropped (reported with `IP_RECVERR`), an error of that datagram, and resending it
//!   into the same full queue would only repeat the drop.
//! - **A thread that exited.** A parked request is retried on the thread that submitted it; if
//!   that thread is gone the kernel cancels it (`-ECANCELED` having sent nothing, measured on 6.18;
//!   `-EFAULT` reported elsewhere). The connection is fine: the request is submitted again (up to
//!   8 times in a row; an `-EFAULT` once, since it also means memory the kernel cannot read, which
//!   no resubmission cures).
//! - **Leaving.** A sender's SQEs name its own duplicate of the socket's descriptor. Shutdown
//!   submits every SQE still in the SQ and cancels parked requests (`IORING_OP_ASYNC_CANCEL`);
//!   the duplicate is closed only if that succeeded, leaked otherwise, so a descriptor number an
//!   SQE names is never reused under it. Records still in the ring after that are kept: shutdown
//!   counts them, and the ring frees them after their last CQE (a sender's own ring is kept for
//!   that after the sender is dropped: see [`sys::uring::Ring`]).
//!   Where the ring gave the sender a registered file slot, its SQEs name that slot instead
//!   (see [`sys::uring::Ring`]).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use socket2::SockAddr;

use super::shared::{RingGuard, RingRef, UringShared};

use crate::buf::{BufPool, SendBuf};
use crate::engine::auto::EpochClock;
use crate::engine::policy::auto::{AtCap, AutoPolicy, Choice, Load};
use crate::engine::policy::{self, BudgetAction, Refusal};
use crate::engine::record::{LatencySampler, Record};
use crate::engine::{send_each, send_front, Engine, EngineKind};
use crate::error::{Error, Feature, SendError};
use crate::report::{CopyReason, Readiness, Released, Stats};
use crate::socket::{Family, SockType, Socket};
use crate::sys;
use crate::sys::uring::{self as sysu, Cqe, Lent, Refused, Ring, SendKind, SendOp};

/// Ring and batching settings for the io_uring engines: `UringConfig::default()`, then the
/// `with_` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UringConfig {
    /// Submission queue entries, and the requests one sender may have in flight (the CQ gets
    /// twice as many, plus room for each sender of a shared ring).
    pub entries: u32,
    /// Buffers per request on a stream socket, and requests queued before an `io_uring_enter`.
    pub batch: usize,
    /// Buffers accepted but not yet in a request before `try_send` answers `WouldBlock`.
    pub queue_limit: usize,
    /// Senders a shared ring ([`UringShared`](crate::UringShared)) takes at once: its completion
    /// queue keeps room for one request of each (three completions), so senders whose requests
    /// are parked never take the room another sender needs. A sender's own ring takes one.
    pub senders: u32,
}

impl UringConfig {
    /// Submission queue entries.
    pub fn with_entries(mut self, entries: u32) -> Self {
        self.entries = entries;
        self
    }

    /// Buffers per stream request, and requests queued before an `io_uring_enter`.
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Buffers accepted but not yet in a request before `try_send` answers `WouldBlock`.
    pub fn with_queue_limit(mut self, queue_limit: usize) -> Self {
        self.queue_limit = queue_limit;
        self
    }

    /// Senders a shared ring takes at once.
    pub fn with_senders(mut self, senders: u32) -> Self {
        self.senders = senders;
        self
    }
}

impl Default for UringConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            batch: 32,
            queue_limit: 256,
            senders: 4096,
        }
    }
}

/// What follows a request, decided at its first CQE and carried out when its last CQE hands the
/// record back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The record went whole: release it.
    Done,
    /// `MSG_WAITALL` stopped short (its thread exited, measured on 6.18): go on from there.
    Continue,
    /// The zero-copy budget refused it (`ENOMEM`): wait for pinned pages, or copy.
    Budget,
    /// The thread that submitted it exited and the kernel cancelled it: submit it again.
    Resubmit,
    /// It failed with this errno: release the record with the error.
    Fail(i32),
}

/// What the engine knows of a request in the ring, kept in the request's own box
/// ([`SendOp::meta`]), which the ring lends the engine with each CQE: one slot per request.
#[derive(Debug, Clone, Copy, Default)]
struct Req {
    /// Sent zero-copy (`SENDMSG_ZC`/`SEND_ZC`).
    zc: bool,
    /// Zero-copy from user memory: io_uring charges its pages to `RLIMIT_MEMLOCK` (a registered
    /// buffer's pages were charged once, at registration).
    charged: bool,
    /// Bytes it carries: the record's unsent bytes when it was pushed.
    len: usize,
    /// What io_uring charged for the pages it pinned, once its first CQE said it sent; they come
    /// back with its notification.
    pinned: usize,
    /// The first CQE's `res` and what follows, once it came.
    first: Option<(i32, Then)>,
    /// The notification said the kernel copied.
    copied: bool,
    /// Resubmissions of its record after a cancel that sent nothing, in a row.
    resubmits: u32,
}

/// A request of this engine: a record and the engine's account of it.
type Op<B> = SendOp<B, Req>;

/// A record due for its next request, in the box that request will use.
struct Next<B> {
    op: Box<Op<B>>,
    /// Goes zero-copy if it can (else by copy: the `uring` engine, or a fallback).
    zc: bool,
    resubmits: u32,
}

pub(crate) struct UringEngine<B> {
    ring: RingRef,
    /// Everything but the ring, apart so that a call can hold the ring's lock while it changes it.
    st: State<B>,
}

struct State<B> {
    owner: u16,
    /// Left the ring (at shutdown): it must not be touched for this owner again.
    left: bool,
    /// The socket, as this engine's own descriptor: every SQE names it. Closed only once no SQE
    /// in the SQ can name it (`leak_fd` otherwise), so the caller may close or hand back theirs.
    fd: Option<OwnedFd>,
    leak_fd: bool,
    /// Zero-copy requests may be sent (`uring-zc`, or `auto`).
    zc: bool,
    /// `auto`: the per-record choice between zero-copy and copy.
    auto: Option<AutoPolicy>,
    /// Requests whose pages are pinned now (`Req::pinned > 0`).
    pinning: usize,
    clock: EpochClock,
    /// `zc_flags` of zero-copy requests (`IORING_SEND_ZC_REPORT_USAGE` where the kernel has it).
    zc_flags: u16,
    /// One request in flight (stream and seqpacket sockets).
    ordered: bool,
    /// Several buffers per request, `MSG_WAITALL`, short results continued (byte streams).
    merge: bool,
    /// What zero-copy requests may pin at most (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`).
    pin_limit: Option<usize>,
    cfg: UringConfig,
    /// Destinations boxed: an entry moves twice per send, and most sends have none.
    queue: VecDeque<(B, Option<Box<SockAddr>>)>,
    /// This sender's requests in the ring (pushed, last CQE not yet applied).
    in_ring: usize,
    latency: LatencySampler,
    /// An ordered socket's request is out (or waiting to be pushed).
    busy: bool,
    /// Records whose next request is due, in order.
    to_push: VecDeque<Next<B>>,
    /// Records whose zero-copy request hit the budget, waiting for pinned pages to come back.
    deferred: Vec<Next<B>>,
    /// Boxes of finished requests, for the next ones.
    spare: Vec<Box<Op<B>>>,
    /// What this sender's requests pin now (sum of `Req::pinned`).
    pinned: usize,
    /// A submit or push failed: the next progress must enter, and a waiter must not sleep.
    owed: bool,
    /// The front of `to_push` waits for room in the CQ (see [`Ring::has_room`]), not for the SQ.
    no_place: bool,
    /// Shutting down: results are recorded, nothing more is pushed.
    closing: bool,
    /// In a batch of sends ([`Engine::batch`]): enter only for a full batch.
    batching: bool,
    broken: Option<i32>,
    held: usize,
    stats: Stats,
}

/// How long a sender on a shared ring sleeps before it looks at its inbox again.
const SHARED_WAIT_SLICE: Duration = Duration::from_millis(5);

/// Resubmissions of a cancelled request that sent nothing before its record fails (an `EFAULT`
/// is resubmitted once: see `on_first`).
const MAX_RESUBMITS: u32 = 8;

/// Fixed buffer index for `buf` when it lies in the registered `region` and policy sends it
/// alone from there ([`policy::fixed_buffer`]).
fn fixed_index<B: SendBuf>(region: Option<u64>, merge: bool, buf: &B) -> Option<u16> {
    if !policy::fixed_buffer(buf.as_bytes().len(), merge) {
        return None;
    }
    let (r, _) = buf.registered()?;
    (Some(r) == region).then_some(0)
}

impl<B: SendBuf> UringEngine<B> {
    pub(crate) fn new(
        sock: &Socket,
        zc: bool,
        cfg: UringConfig,
        shared: Option<&UringShared>,
    ) -> Result<Self, Error> {
        Self::with_policy(sock, zc, cfg, shared, None)
    }

    /// As [`new`](Self::new), with `auto`'s policy choosing per record (`zc` must be set).
    pub(crate) fn with_policy(
        sock: &Socket,
        zc: bool,
        cfg: UringConfig,
        shared: Option<&UringShared>,
        auto: Option<AutoPolicy>,
    ) -> Result<Self, Error> {
        let unsupported = |reason: String| Error::Unsupported {
            feature: if zc {
                Feature::UringZerocopy(sock.kind)
            } else {
                Feature::IoUring
            },
            reason,
        };
        let probe = sysu::probe().map_err(|e| {
            unsupported(format!(
                "io_uring_setup answered {e} (kernel without io_uring, kernel.io_uring_disabled, \
                 or a seccomp filter); use the copy or msg-zc engine"
            ))
        })?;
        if zc {
            if !(probe.send_zc && probe.sendmsg_zc) {
                return Err(unsupported(
                    "this kernel lacks IORING_OP_SEND_ZC/SENDMSG_ZC (6.1); use msg-zc".into(),
                ));
            }
            // The kernel sends zero-copy on TCP and UDP only (other protocols clear
            // SOCK_SUPPORT_ZC, and every send would fail with EOPNOTSUPP).
            let k = sock.kind;
            let inet = matches!(k.family, Family::Inet4 | Family::Inet6);
            let tcp = k.ty == SockType::Stream && k.protocol == libc::IPPROTO_TCP;
            let udp = k.ty == SockType::Dgram && k.protocol == libc::IPPROTO_UDP;
            if !inet || !(tcp || udp) {
                return Err(unsupported(format!(
                    "zero-copy io_uring sends need a TCP or UDP socket, not {} (protocol {}); use \
                     uring",
                    k, k.protocol
                )));
            }
        }
        let fd = sock.fd().try_clone_to_owned().map_err(|source| Error::Io {
            context: "fcntl(F_DUPFD_CLOEXEC) of the socket for io_uring",
            source,
        })?;
        let ring = RingRef::new(cfg, shared)?;
        // A datagram socket names itself by registered file slot (see `FILE_SLOTS`).
        let owner = ring.shared().join(&fd, !sock.kind.is_ordered())?;
        let cfg = ring.shared().cfg;
        let report = zc && sysu::report_usage();
        Ok(Self {
            ring,
            st: State {
                owner,
                left: false,
                fd: Some(fd),
                leak_fd: false,
                zc,
                auto,
                pinning: 0,
                clock: EpochClock::default(),
                zc_flags: if report {
                    sysu::SEND_ZC_REPORT_USAGE
                } else {
                    0
                },
                ordered: sock.kind.is_ordered(),
                merge: sock.kind.is_byte_stream(),
                pin_limit: if zc { sysu::pin_limit() } else { None },
                cfg,
                queue: VecDeque::new(),
                in_ring: 0,
                latency: LatencySampler::default(),
                busy: false,
                to_push: VecDeque::new(),
                deferred: Vec::new(),
                spare: Vec::new(),
                pinned: 0,
                owed: false,
                no_place: false,
                closing: false,
                batching: false,
                broken: None,
                held: 0,
                stats: Stats::default(),
            },
        })
    }

    /// The ring (locked if shared) and the state beside it.
    #[inline]
    fn split(&mut self) -> (RingGuard<'_>, &mut State<B>) {
        (self.ring.get(), &mut self.st)
    }
}

impl<B: SendBuf> State<B> {
    fn raw_fd(&self) -> i32 {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The registered region zero-copy requests may send from, if any.
    fn fixed_region(&self, ring: &Ring) -> Option<u64> {
        if self.zc {
            ring.registered().map(BufPool::region_id)
        } else {
            None
        }
    }

    /// A request waiting in the SQ is entered as soon as nothing submitted is in flight: outside
    /// a batch of sends, and always for an ordered socket, whose one request in flight never
    /// fills a batch (holding it back would idle the connection until the batch ends).
    fn eager(&self) -> bool {
        !self.batching || self.ordered
    }

    /// Whether `bytes` could ever be pinned: io_uring refuses (`ENOMEM`) a zero-copy send whose
    /// pages exceed `RLIMIT_MEMLOCK`, however long one waits.
    fn may_pin(&self, bytes: usize) -> bool {
        policy::may_pin(sysu::pin_charge(bytes), self.pin_limit)
    }

    /// Order, the CQ's room for this sender and the requests waiting to be pushed let a new
    /// request form.
    fn may_issue(&self, ring: &Ring) -> bool {
        self.to_push.is_empty() && !(self.ordered && self.busy) && ring.has_room(self.owner)
    }

    /// Forms records from the queue while order and the in-flight cap allow, and pushes them;
    /// `auto`'s small copies on a byte stream are written at once ([`write_now`]).
    ///
    /// [`write_now`]: Self::write_now
    fn issue(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) -> io::Result<()> {
        let region = self.fixed_region(ring);
        loop {
            if self.queue.is_empty() || !self.may_issue(ring) {
                return Ok(());
            }
            let fixed = {
                let (first, _) = self.queue.front().expect("queue not empty");
                fixed_index(region, self.merge, first).is_some()
            };
            let mut zc = self.zc;
            let mut chosen = None;
            let mut copy_reason = None;
            let mut direct = false;
            if let Some(auto) = &mut self.auto {
                let (first, _) = self.queue.front().expect("queue not empty");
                let len = first.as_bytes().len();
                direct = self.merge && policy::write_now(len);
                let load = Load {
                    sends: self.pinning,
                    bytes: self.pinned,
                };
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
    fn form(
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
        let mut op = SendOp::for_buf(self.spare.pop(), first, dest, self.latency.next());
        let rec = op.record_mut();
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
        while self.merge && !fixed && !probe && rec.bufs.len() < self.cfg.batch {
            let next = match self.queue.front() {
                Some((b, _)) if !zc || fixed_index(region, self.merge, b).is_none() => {
                    b.as_bytes().len()
                }
                _ => break,
            };
            let limit = if zc { self.pin_limit } else { None };
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
    fn launch(&mut self, ring: &mut Ring, op: Box<Op<B>>, zc: bool) -> io::Result<bool> {
        if self.ordered {
            self.busy = true;
        }
        let next = Next {
            op,
            zc,
            resubmits: 0,
        };
        if let Err((next, error)) = self.push_request(ring, next) {
            self.to_push.push_front(next);
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
        let Some(fd) = self.fd.as_ref() else {
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
        let result = sys::send_gather(fd.as_fd(), &slices);
        // The returns up to the caller's loop, past `issue` and the engine call, come next.
        sys::refill_return_stack();
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
                let mut op = SendOp::for_buf(self.spare.pop(), buf, dest, started);
                let rec = op.record_mut();
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
        while let Some(next) = self.to_push.pop_front() {
            if let Err((next, error)) = self.push_request(ring, next) {
                self.to_push.push_front(next);
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
        let rec = op.record();
        let fixed = match rec.bufs.as_slice() {
            [one] => fixed_index(region, self.merge, one),
            _ => None,
        };
        let len = rec.left();
        // A request from user memory charges its pages to the locked-memory limit; one that could
        // never fit goes by copy at once.
        let zc = want_zc && (fixed.is_some() || self.may_pin(len));
        if want_zc && !zc {
            op.record_mut().copy_for(CopyReason::Fallback);
        }
        let kind = match (zc, fixed) {
            (true, Some(index)) => SendKind::Fixed {
                index,
                zc_flags: self.zc_flags,
            },
            (true, None) => SendKind::ZeroCopy {
                zc_flags: self.zc_flags,
            },
            (false, _) => SendKind::Copy,
        };
        let flags = libc::MSG_NOSIGNAL | if self.merge { libc::MSG_WAITALL } else { 0 };
        op.set(self.raw_fd(), kind, flags);
        op.meta = Req {
            zc,
            charged: zc && fixed.is_none(),
            len,
            pinned: 0,
            first: None,
            copied: false,
            resubmits,
        };
        match ring.push(self.owner, 0, op) {
            Ok(()) => {
                self.in_ring += 1;
                self.stats.syscalls += 1;
                self.no_place = false;
                Ok(())
            }
            Err(Refused {
                op,
                error,
                no_place,
            }) => {
                // Never queued: the caller keeps the record and pushes it again later.
                self.no_place = no_place;
                self.owed |= !no_place;
                let next = Next {
                    op,
                    zc: want_zc,
                    resubmits,
                };
                Err((next, error))
            }
        }
    }

    /// Reaps, pushes what is due, forms new requests, and submits. Every path that may be followed
    /// by a wait on the ring goes through here: an SQE left unsubmitted with nothing else in
    /// flight would make that wait endless. Every step runs even if one failed; the first error
    /// is returned, and what it held back is tried again at the next progress.
    fn kick(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) -> io::Result<()> {
        if self.left {
            return Ok(());
        }
        self.reap(ring, out);
        let pushed = self.flush_pushes(ring);
        let issued = self.issue(ring, out);
        let owed = std::mem::take(&mut self.owed);
        let submitted = if owed {
            ring.submit()
        } else {
            ring.submit_if_due(self.eager())
        };
        if submitted.is_err() || (!self.to_push.is_empty() && !self.no_place) {
            self.owed = true;
        }
        pushed.and(issued).and(submitted)
    }

    /// Applies every completion this owner has on the ring.
    fn reap(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) {
        let owner = self.owner;
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
            self.pinned += req.pinned;
            self.pinning += 1;
        }
        let then = if res >= 0 {
            let n = res as usize;
            self.stats.bytes += n as u64;
            if !self.merge || n >= req.len {
                Then::Done // a datagram or a message goes whole
            } else if n == 0 || self.closing {
                Then::Fail(libc::EPIPE)
            } else {
                Then::Continue
            }
        } else {
            let errno = -res;
            if self.closing {
                Then::Fail(errno)
            } else if req.zc && errno == libc::ENOMEM {
                // The zero-copy budget is full: ENOMEM, io_uring charges pinned pages to
                // RLIMIT_MEMLOCK (not ENOBUFS: see the module docs).
                self.stats.enobufs += 1;
                Then::Budget
            } else if errno == libc::ECANCELED && req.resubmits < MAX_RESUBMITS {
                // The thread that submitted a parked request exited: the kernel cancelled it
                // having sent nothing. The socket is fine; submit it again, from this thread.
                Then::Resubmit
            } else if errno == libc::EFAULT && req.resubmits == 0 {
                // Some kernels report that cancel as EFAULT, which also means memory the kernel
                // could not read (a truncated file mapping): submitted again once, from this
                // thread, which is alive; a second EFAULT is the memory's, and final.
                Then::Resubmit
            } else {
                Then::Fail(errno)
            }
        };
        req.first = Some((res, then));
        match then {
            Then::Done if self.ordered => self.busy = false,
            // After a failed stream send nothing more may go out.
            Then::Fail(errno) if self.ordered => self.break_stream(errno, out),
            _ => {}
        }
    }

    /// A request's last CQE: its record is back. Release it, or push what follows.
    fn on_last(&mut self, mut op: Box<Op<B>>, out: &mut Vec<Released<B>>) {
        let req = op.meta;
        if req.pinned > 0 {
            self.pinned -= req.pinned;
            self.pinning -= 1;
            if !self.closing {
                // Pinned pages came back: retry what the budget refused (never on a refused
                // request's own completion, which pinned nothing).
                self.to_push.extend(self.deferred.drain(..));
            }
        }
        // The ring awaits a first CQE before it calls a request finished.
        let (res, then) = req.first.unwrap_or((-libc::EIO, Then::Fail(libc::EIO)));
        let rec = op.record_mut();
        rec.kernel_copied |= req.copied;
        if res >= 0 {
            rec.sent += res as usize;
            if !self.merge {
                rec.sent = rec.total;
            }
        }
        let then = match then {
            Then::Continue | Then::Budget | Then::Resubmit if self.closing => {
                Then::Fail(if res >= 0 { libc::EPIPE } else { -res })
            }
            then => then,
        };
        match then {
            Then::Done => self.release(op, out),
            Then::Fail(errno) => {
                rec.error = Some(io::Error::from_raw_os_error(errno));
                self.release(op, out);
            }
            Then::Continue => self.to_push.push_back(Next {
                op,
                zc: req.zc,
                resubmits: 0,
            }),
            Then::Resubmit => self.to_push.push_back(Next {
                op,
                zc: req.zc,
                resubmits: req.resubmits + 1,
            }),
            Then::Budget if self.auto.is_some() => {
                let auto = self.auto.as_mut().expect("checked");
                auto.on_refusal();
                let copy = auto.at_cap() == AtCap::Copy;
                let mut next = Next {
                    op,
                    zc: true,
                    resubmits: req.resubmits,
                };
                if copy || self.pinned == 0 {
                    // `auto` copies for a while rather than wait on the budget.
                    next.op.record_mut().copy_for(CopyReason::Budget);
                    next.zc = false;
                    self.to_push.push_back(next);
                } else {
                    self.deferred.push(next);
                }
            }
            Then::Budget => {
                // Wait for this sender's pinned pages if they would make room; else copy.
                let refusal = Refusal {
                    freed: false,
                    may_free: sysu::pin_charge(rec.left()) <= self.pinned,
                };
                let mut next = Next {
                    op,
                    zc: true,
                    resubmits: req.resubmits,
                };
                match policy::on_budget_refusal(refusal) {
                    BudgetAction::Wait => self.deferred.push(next),
                    BudgetAction::Copy | BudgetAction::Retry => {
                        next.op.record_mut().copy_for(CopyReason::Fallback);
                        next.zc = false;
                        self.to_push.push_back(next);
                    }
                }
            }
        }
    }

    /// Gives a record back with its report, and keeps its request's box for the next one.
    fn release(&mut self, mut op: Box<Op<B>>, out: &mut Vec<Released<B>>) {
        let rec = op.record();
        self.held -= rec.bufs.len();
        if let (Some(auto), Some((copied, probe))) = (&mut self.auto, rec.outcome()) {
            auto.observe(copied, probe, rec.bufs.len() as u32);
        }
        op.release(self.zc, &mut self.stats, out);
        if self.spare.len() < self.cfg.entries as usize {
            self.spare.push(op);
        }
    }

    /// After a failed stream send nothing more may go out (it would leave a gap): every queued
    /// buffer comes back with the error.
    fn break_stream(&mut self, errno: i32, out: &mut Vec<Released<B>>) {
        self.busy = false;
        self.broken = Some(errno);
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
    fn withdraw(&mut self, ring: &mut Ring) {
        let (owner, fd) = (self.owner, self.raw_fd());
        let mut cancel = self.in_ring > 0;
        for _ in 0..2 {
            if cancel && matches!(ring.push_cancel(owner, fd), Ok(true)) {
                cancel = false;
            }
            if ring.submit_all().is_err() {
                self.leak_fd = true;
                return;
            }
            if !cancel {
                return;
            }
        }
    }

    /// See [`Engine::shutdown`]: returns how many buffers the ring keeps.
    fn shutdown(&mut self, ring: &mut Ring, out: &mut Vec<Released<B>>) -> usize {
        if self.left {
            return 0;
        }
        let errno = libc::EPIPE;
        self.closing = true;
        self.break_stream(errno, out);
        // Records waiting for a push or for the budget have nothing in the kernel: give them back
        // with the error.
        let waiting: Vec<Next<B>> = self
            .to_push
            .drain(..)
            .chain(self.deferred.drain(..))
            .collect();
        for Next { mut op, .. } in waiting {
            op.record_mut()
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
        ring.leave(self.owner);
        self.left = true;
        self.in_ring = 0;
        self.held = 0;
        kept
    }
}

impl<B> Drop for UringEngine<B> {
    fn drop(&mut self) {
        if !self.st.left {
            self.ring.get().leave(self.st.owner);
        }
        if self.st.leak_fd {
            // An SQE that names this number may still be in the SQ: never let the number be
            // reused.
            std::mem::forget(self.st.fd.take());
        }
        // Records still in the kernel's hands are freed after their last CQE, never before.
        self.ring.release();
    }
}

impl<B: SendBuf> Engine<B> for UringEngine<B> {
    fn try_send(
        &mut self,
        _sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let (mut ring, st) = self.split();
        if let Some(errno) = st.broken {
            return Err(SendError::Io {
                buf,
                error: io::Error::from_raw_os_error(errno),
            });
        }
        if st.queue.len() >= st.cfg.queue_limit {
            if let Err(error) = st.kick(&mut ring, out) {
                return Err(SendError::Io { buf, error });
            }
            if st.queue.len() >= st.cfg.queue_limit {
                st.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        st.held += 1;
        st.stats.sends += 1;
        let dest = dest.map(Box::new);
        let res = if st.queue.is_empty() && st.auto.is_none() && st.may_issue(&ring) {
            // Nothing queued before it: form its request at once, as `issue` would after
            // queueing it (no trip through the queue).
            let region = st.fixed_region(&ring);
            let (zc, merge) = (st.zc, st.merge);
            let fixed = zc && fixed_index(region, merge, &buf).is_some();
            st.form(&mut ring, region, (buf, dest), zc, fixed, None, None)
                .map(drop)
        } else {
            st.queue.push_back((buf, dest));
            st.issue(&mut ring, out)
        };
        let res = res.and_then(|()| ring.submit_if_due(st.eager()));
        // The buffer is queued either way; the next progress enters again and reports a failure.
        if res.is_err() {
            st.owed = true;
        }
        Ok(())
    }

    /// On a byte stream the whole batch enters the queue first (up to the queue's limit), so the
    /// first request or write carries up to `batch` buffers, not the first buffer alone; other
    /// sockets take the buffers one by one ([`try_send`](Engine::try_send)).
    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        if !self.st.merge {
            return send_each(bufs, |buf| self.try_send(sock, buf, None, out));
        }
        let (mut ring, st) = self.split();
        let mut accepted = 0;
        let mut failed = None;
        loop {
            // `send_front` refuses an empty buffer; a broken stream refuses the rest, and a full
            // queue hands the buffer back.
            let queued = send_front(bufs, |buf| {
                if let Some(errno) = st.broken {
                    let error = io::Error::from_raw_os_error(errno);
                    return Err(SendError::Io { buf, error });
                }
                if st.queue.len() >= st.cfg.queue_limit {
                    return Err(SendError::WouldBlock(buf));
                }
                st.held += 1;
                st.stats.sends += 1;
                st.queue.push_back((buf, None));
                Ok(())
            });
            match queued {
                Ok(true) => accepted += 1,
                Ok(false) if bufs.is_empty() => break,
                Ok(false) => {
                    // The queue is full: reap and issue, and take more if that made room.
                    if let Err(error) = st.kick(&mut ring, out) {
                        st.owed = true;
                        let buf = bufs.pop_front().expect("handed back");
                        failed = Some(SendError::Io { buf, error });
                        break;
                    }
                    if st.queue.len() >= st.cfg.queue_limit {
                        st.stats.would_block += 1;
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // What was queued goes now, as after `try_send`; a failure is the next progress's.
        if st
            .issue(&mut ring, out)
            .and_then(|()| ring.submit_if_due(st.eager()))
            .is_err()
        {
            st.owed = true;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(accepted),
        }
    }

    fn progress(&mut self, _sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        let (mut ring, st) = self.split();
        st.kick(&mut ring, out)
    }

    fn held(&self) -> usize {
        self.st.held
    }

    fn readiness(&mut self, _sock: &Socket, _retry: bool) -> Readiness {
        // Whoever waits next must not leave requests unsubmitted: they could be waiting behind
        // another socket's request that never completes.
        let (mut ring, st) = self.split();
        let failed = ring.submit().is_err();
        let fd = ring.fd();
        drop(ring);
        if failed || st.owed {
            // Something could not be submitted or pushed: the next progress must try again (and
            // report a failure), so the wait must end at once. A ring's fd is writable while its
            // SQ has room, which a failed submit leaves as it was.
            st.owed = true;
            return Readiness {
                fd,
                events: libc::POLLIN | libc::POLLOUT,
            };
        }
        Readiness {
            fd,
            events: libc::POLLIN,
        }
    }

    fn batch(&mut self, open: bool) {
        let (mut ring, st) = self.split();
        st.batching = open;
        // The batch's end: what it left in the SQ is entered now, even with a full batch before
        // it still in flight (no-op with the SQ empty); buffers waiting in `queue` for room go at
        // the next progress, as after `try_send`. A failure is the next progress's to report.
        if !open && !st.left && ring.submit().is_err() {
            st.owed = true;
        }
    }

    fn wait_slice(&self) -> Option<Duration> {
        if self.st.owed {
            // Not even a full SQ may make the wait on POLLOUT endless.
            return Some(Duration::ZERO);
        }
        // Another sender on a shared ring may reap our completions into our inbox without the
        // ring's fd ever waking us: look again soon.
        self.ring.is_shared().then_some(SHARED_WAIT_SLICE)
    }

    fn stats(&self) -> Stats {
        let mut s = self.st.stats;
        if let Some(auto) = &self.st.auto {
            auto.counts().add_to(&mut s);
        }
        s
    }

    fn auto_policy(&self) -> Option<&AutoPolicy> {
        self.st.auto.as_ref()
    }

    #[cfg(feature = "tokio")]
    fn shared_ring(&self) -> Option<(UringShared, u16)> {
        let ring = self.ring.shared_handle().filter(|_| !self.st.left)?;
        Some((ring, self.st.owner))
    }

    fn register_pool(&mut self, pool: &BufPool) -> Result<(), Error> {
        if !self.st.zc {
            return Err(Error::Unsupported {
                feature: Feature::RegisteredBuffers(EngineKind::Uring),
                reason: "plain io_uring sends copy anyway; use uring-zc to send from registered \
                         memory"
                    .into(),
            });
        }
        self.ring.shared().register(pool)
    }

    fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> usize {
        let (mut ring, st) = self.split();
        st.shutdown(&mut ring, out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use crate::config::SenderConfig;
    use crate::factory;
    use crate::socket::{SockKind, Socket};

    /// `auto` copies small buffers over loopback. With nothing of the stream in the kernel's
    /// hands, a batch of them goes in gathered `sendmsg(2)` calls, released before the call
    /// returns, not as io_uring requests released only when a later progress reaps their CQEs
    /// (the request path, before: 0.88x `copy` at 1400 B over TCP loopback). Every byte arrives
    /// in order.
    #[test]
    fn auto_writes_a_batch_of_small_copies_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        // Room for the whole batch, so no write is cut (a cut buffer's rest goes as a request).
        socket2::SockRef::from(&client)
            .set_send_buffer_size(4 << 20)
            .unwrap();
        let sock = Socket::new(client.into()).unwrap();
        let built = factory::build::<Vec<u8>>(&sock, &SenderConfig::default()).unwrap();
        if !zerotx_testbed::require(
            built.path == "io_uring",
            &format!("auto chose {}: {:?}", built.path, built.notes),
        ) {
            return;
        }
        let mut engine = built.engine;
        let sizes: Vec<usize> = (0..64).map(|i| 1000 + 37 * i).collect();
        let mut bufs: VecDeque<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8; n])
            .collect();
        let mut out = Vec::new();
        engine.batch(true);
        let accepted = engine.try_send_batch(&sock, &mut bufs, &mut out).unwrap();
        engine.batch(false);
        assert_eq!(accepted, 64);
        let stats = engine.stats();
        assert_eq!(out.len(), 64, "released before any progress: {stats:?}");
        assert_eq!(stats.syscalls, 2, "32 buffers per call: {stats:?}");
        assert_eq!(engine.held(), 0);
        for (r, &n) in out.iter().zip(&sizes) {
            assert!(
                r.report.error.is_none() && r.report.bytes == n,
                "{:?}",
                r.report
            );
        }
        let mut got = vec![0u8; sizes.iter().sum()];
        server.read_exact(&mut got).unwrap();
        let mut at = 0;
        for (i, &n) in sizes.iter().enumerate() {
            assert!(got[at..at + n].iter().all(|&b| b == i as u8), "buffer {i}");
            at += n;
        }
    }

    /// SCTP cannot be loaded on the test machine (no `sctp` module): check the classification the
    /// engine orders and batches by. Every connection keeps one request in flight; only byte
    /// streams put several buffers into one request (on SCTP that would merge messages).
    #[test]
    fn only_byte_streams_merge_and_every_connection_has_one_request() {
        let kind = SockKind::from_raw;
        let tcp = kind(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP);
        let unix = kind(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        let sctp = kind(libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_SCTP);
        let sctp_many = kind(libc::AF_INET, libc::SOCK_SEQPACKET, libc::IPPROTO_SCTP);
        let seqpacket = kind(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        let udp = kind(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP);
        for k in [tcp, unix, sctp, sctp_many, seqpacket] {
            assert!(k.is_ordered(), "{k:?}");
        }
        assert!(!udp.is_ordered());
        assert!(tcp.is_byte_stream() && unix.is_byte_stream());
        for k in [sctp, sctp_many, seqpacket, udp] {
            assert!(!k.is_byte_stream(), "{k:?}");
        }
    }
}
