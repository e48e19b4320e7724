//! The io_uring engines: `uring` (`IORING_OP_SENDMSG`, the kernel copies) and `uring-zc`
//! (`IORING_OP_SENDMSG_ZC`, or `IORING_OP_SEND_ZC` with `IORING_RECVSEND_FIXED_BUF` for buffers from
//! a registered [`BufPool`]), both with many requests per `io_uring_enter`.
//!
//! - **Order.** io_uring issues requests independently: two in flight on one connection can
//!   reorder it when the socket buffer fills (KERNEL.md measured a quarter of a TCP stream's bytes
//!   out of order; SEQPACKET messages reorder the same way). So a stream or seqpacket socket has
//!   exactly one request in flight. On a byte stream (TCP, AF_UNIX and vsock streams) it carries
//!   up to `batch` queued buffers as an iovec with `MSG_WAITALL`, and a short result is continued
//!   from its offset; on SEQPACKET and SCTP one request is one message, never merged. Datagram
//!   sockets have many requests in flight, one per buffer.
//! - **Completions.** The first CQE carries bytes or `-errno` and `IORING_CQE_F_MORE` when a
//!   notification follows (read from the flag, also on errors); only the `IORING_CQE_F_NOTIF` CQE
//!   releases a zero-copy request's buffers, and it may come before or after later requests'
//!   CQEs. `IORING_SEND_ZC_REPORT_USAGE`, where the kernel has it, makes it say whether the kernel
//!   copied. Every CQE reaped is applied: a request is retired before anything follows from it,
//!   and whatever must be pushed next (a continuation, a copy, a resubmission) waits in `to_push`
//!   until the SQ takes it, so a failing `io_uring_enter` loses nothing.
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
//!   `-EFAULT` reported elsewhere). The connection is fine: the request is submitted again.
//! - **Leaving.** A sender's SQEs name its own duplicate of the socket's descriptor. Shutdown
//!   submits every SQE still in the SQ and cancels parked requests (`IORING_OP_ASYNC_CANCEL`);
//!   the duplicate is closed only if that succeeded, leaked otherwise, so a descriptor number an
//!   SQE names is never reused under it.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types};
use slab::Slab;
use socket2::SockAddr;

use super::ring::{self, Cqe, RingCore, UringShared};

use crate::buf::{BufPool, SendBuf};
use crate::engine::policy::{self, BudgetAction, Refusal};
use crate::engine::record::{LatencySampler, Record};
use crate::engine::Engine;
use crate::error::{Error, SendError};
use crate::report::{Readiness, Released, Stats};
use crate::socket::{Family, SockType, Socket};
use crate::sys::uring as sysu;

/// Ring and batching settings for the io_uring engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Submission queue entries (the CQ gets twice as many).
    pub entries: u32,
    /// Buffers per request on a stream socket, and requests queued before an `io_uring_enter`.
    pub batch: usize,
    /// Buffers accepted but not yet in a request before `try_send` answers `WouldBlock`.
    pub queue_limit: usize,
}

impl Default for UringConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            batch: 32,
            queue_limit: 256,
        }
    }
}

/// A record and the requests that carry it.
struct Batch<B> {
    rec: Record<B>,
    /// Requests of this batch not yet finished (first CQE and notification both in).
    reqs: u32,
    /// A request of it is still to be pushed (it sits in `to_push` or `deferred`).
    waiting: bool,
    /// Resubmissions after a cancelled request that sent nothing, since the batch last moved.
    resubmits: u32,
}

/// The memory a request's SQE points at: kept until the request finished.
struct Req {
    batch: usize,
    /// Sent zero-copy (`SENDMSG_ZC`/`SEND_ZC`).
    zc: bool,
    /// Zero-copy from user memory: io_uring charges its pages to `RLIMIT_MEMLOCK` (a registered
    /// buffer's pages were charged once, at registration).
    charged: bool,
    first_done: bool,
    notif_done: bool,
    /// What io_uring charged for the pages this zero-copy request pinned, once its first CQE said
    /// it sent; they come back with its notification.
    pinned: usize,
    _iov: Vec<libc::iovec>,
    _msg: Box<libc::msghdr>,
}

// SAFETY: the raw pointers in iovec/msghdr point into buffers owned by the engine's batches and
// into this struct's own boxes; they are only read by the kernel, never dereferenced here, so
// moving a Req to another thread with its engine is sound.
unsafe impl Send for Req {}

pub(crate) struct UringEngine<B> {
    core: Arc<Mutex<RingCore>>,
    owner: u16,
    /// The socket, as this engine's own descriptor: every SQE names it. Closed only once no SQE
    /// in the SQ can name it (`leak_fd` otherwise), so the caller may close or hand back theirs.
    fd: Option<OwnedFd>,
    leak_fd: bool,
    zc: bool,
    /// `zc_flags` of zero-copy requests (`IORING_SEND_ZC_REPORT_USAGE` where the kernel has it).
    zc_flags: u16,
    /// One request in flight (stream and seqpacket sockets).
    ordered: bool,
    /// Several buffers per request, `MSG_WAITALL`, short results continued (byte streams).
    merge: bool,
    /// What zero-copy requests may pin at most (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`).
    pin_limit: Option<usize>,
    cfg: UringConfig,
    queue: VecDeque<(B, Option<SockAddr>)>,
    batches: Slab<Batch<B>>,
    reqs: Slab<Req>,
    latency: LatencySampler,
    /// This sender's requests pushed and not yet finished.
    in_flight: usize,
    /// An ordered socket's request is out (or waiting to be pushed).
    busy: bool,
    /// Batches whose next request is due, in order, with the way it goes (zero-copy or not).
    to_push: VecDeque<(usize, bool)>,
    /// Batches whose zero-copy request hit the budget, waiting for pinned pages to come back.
    deferred: Vec<usize>,
    /// What this sender's requests pin now (sum of `Req::pinned`).
    pinned: usize,
    /// A submit or push failed: the next progress must enter, and a waiter must not sleep.
    owed: bool,
    /// Shutting down: results are recorded, nothing more is pushed.
    closing: bool,
    broken: Option<i32>,
    held: usize,
    stats: Stats,
    cqes: Vec<Cqe>,
}

/// How long a sender on a shared ring sleeps before it looks at its inbox again.
const SHARED_WAIT_SLICE: Duration = Duration::from_millis(5);

/// Resubmissions of a cancelled request that sent nothing before its batch fails.
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
        let unsupported = |reason: String| Error::Unsupported {
            feature: if zc { "io_uring SEND_ZC" } else { "io_uring" }.into(),
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
        let core = match shared {
            Some(r) => r.core.clone(),
            None => ring::private_ring(cfg)?,
        };
        let (owner, cfg) = {
            let mut c = ring::lock(&core);
            (c.join()?, c.cfg)
        };
        let report = zc && sysu::report_usage();
        Ok(Self {
            core,
            owner,
            fd: Some(fd),
            leak_fd: false,
            zc,
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
            batches: Slab::new(),
            reqs: Slab::new(),
            latency: LatencySampler::default(),
            in_flight: 0,
            busy: false,
            to_push: VecDeque::new(),
            deferred: Vec::new(),
            pinned: 0,
            owed: false,
            closing: false,
            broken: None,
            held: 0,
            stats: Stats::default(),
            cqes: Vec::new(),
        })
    }

    fn core(&self) -> MutexGuard<'_, RingCore> {
        ring::lock(&self.core)
    }

    fn raw_fd(&self) -> i32 {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The registered region zero-copy requests may send from, if any.
    fn fixed_region(&self) -> Option<u64> {
        if self.zc {
            self.core().fixed_region()
        } else {
            None
        }
    }

    /// Whether `buf` goes as its own `SEND_ZC` from registered memory.
    fn registered_index(&self, buf: &B) -> Option<u16> {
        fixed_index(self.fixed_region(), self.merge, buf)
    }

    /// Whether `bytes` could ever be pinned: io_uring refuses (`ENOMEM`) a zero-copy send whose
    /// pages exceed `RLIMIT_MEMLOCK`, however long one waits.
    fn may_pin(&self, bytes: usize) -> bool {
        policy::may_pin(sysu::pin_charge(bytes), self.pin_limit)
    }

    /// Forms requests from the queue while order and the in-flight cap allow.
    fn issue(&mut self) -> io::Result<()> {
        loop {
            let blocked = self.ordered && self.busy;
            if !self.to_push.is_empty()
                || self.queue.is_empty()
                || blocked
                || !self.core().has_room()
            {
                return Ok(());
            }
            let (first, dest) = self.queue.pop_front().expect("queue not empty");
            let fixed = self.registered_index(&first).is_some();
            let mut rec = Record::new(first, dest, self.latency.next());
            // A byte-stream request carries several buffers as one iovec (as many as half the
            // locked-memory limit lets two requests pin at once); a fixed-buffer request, a
            // message and a datagram carry one.
            while self.merge && !fixed && rec.bufs.len() < self.cfg.batch {
                let next = match self.queue.front() {
                    Some((b, _)) if self.registered_index(b).is_none() => b.as_bytes().len(),
                    _ => break,
                };
                let limit = if self.zc { self.pin_limit } else { None };
                if !policy::batch_fits(sysu::pin_charge(rec.total + next), limit) {
                    break;
                }
                rec.push(self.queue.pop_front().expect("front exists").0);
            }
            let batch = self.batches.insert(Batch {
                rec,
                reqs: 0,
                waiting: true,
                resubmits: 0,
            });
            if self.ordered {
                self.busy = true;
            }
            self.to_push.push_back((batch, self.zc));
            self.flush_pushes()?;
        }
    }

    /// Pushes the requests that are due, in order. Stops, keeping the rest, when the SQ stays
    /// full or `io_uring_enter` fails; they go at the next progress.
    fn flush_pushes(&mut self) -> io::Result<()> {
        while let Some(&(batch, zc)) = self.to_push.front() {
            match self.push_request(batch, zc) {
                Ok(true) => {
                    self.to_push.pop_front();
                    if let Some(b) = self.batches.get_mut(batch) {
                        b.waiting = false;
                    }
                }
                Ok(false) => {
                    self.owed = true;
                    return Ok(());
                }
                Err(e) => {
                    self.owed = true;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Builds and pushes one request for the unsent part of `batch`. `Ok(false)`: the SQ is full.
    fn push_request(&mut self, batch_idx: usize, zc: bool) -> io::Result<bool> {
        let region = if zc { self.fixed_region() } else { None };
        let fd = types::Fd(self.raw_fd());
        let b = self.batches.get(batch_idx).expect("live batch");
        let fixed = match b.rec.bufs.as_slice() {
            [one] => fixed_index(region, self.merge, one),
            _ => None,
        };
        // A request from user memory charges its pages to the locked-memory limit; one that could
        // never fit goes by copy at once.
        let charged = zc && fixed.is_none();
        let zc = zc && (fixed.is_some() || self.may_pin(b.rec.left()));
        let b = self.batches.get_mut(batch_idx).expect("live batch");
        b.rec.fallback |= self.zc && !zc;
        let mut iov: Vec<libc::iovec> = b
            .rec
            .unsent()
            .map(|bytes| libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: bytes.len(),
            })
            .collect();
        // SAFETY: msghdr is a plain C struct for which all-zeroes is a valid value.
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        if let Some(d) = &b.rec.dest {
            msg.msg_name = d.as_ptr() as *mut libc::c_void;
            msg.msg_namelen = d.len();
        }
        let flags = libc::MSG_NOSIGNAL | if self.merge { libc::MSG_WAITALL } else { 0 };
        let bad = sysu::take_bad_sqe();
        let sqe: squeue::Entry = match fixed {
            Some(index) => {
                let one = iov[0];
                // A registered buffer lies in a region of at most 1 GiB (checked at
                // registration), so its length fits the SQE's 32 bits.
                let len = u32::try_from(one.iov_len).expect("registered buffers are <= 1 GiB");
                let mut op = opcode::SendZc::new(fd, one.iov_base as *const u8, len)
                    .buf_index(Some(index))
                    .flags(flags)
                    .zc_flags(self.zc_flags | bad);
                if let Some(d) = &b.rec.dest {
                    op = op.dest_addr(d.as_ptr()).dest_addr_len(d.len());
                }
                op.build()
            }
            None if zc => opcode::SendMsgZc::new(fd, &*msg)
                .flags(flags as u32)
                .ioprio(self.zc_flags | bad)
                .build(),
            None => opcode::SendMsg::new(fd, &*msg)
                .flags(flags as u32)
                .ioprio(bad)
                .build(),
        };
        // Moving the Vec and the Box into the request does not move what they point at.
        let req = self.reqs.insert(Req {
            batch: batch_idx,
            zc,
            charged: charged && zc,
            first_done: false,
            notif_done: false,
            pinned: 0,
            _iov: iov,
            _msg: msg,
        });
        let owner = self.owner;
        // SAFETY: the SQE points at the iovec and msghdr now owned by `self.reqs[req]`, at the
        // destination address boxed in the batch, and at bytes of buffers owned by the batch.
        // Requests and batches are removed only after the request's last CQE, so all of it stays
        // valid and unchanged until the kernel is done; shutdown leaks what is in flight.
        let pushed = unsafe { self.core().push(owner, req, sqe) };
        if !matches!(pushed, Ok(true)) {
            // Never queued: the caller keeps the batch and pushes it again later.
            self.reqs.remove(req);
            return pushed;
        }
        self.batches.get_mut(batch_idx).expect("live batch").reqs += 1;
        self.in_flight += 1;
        self.stats.syscalls += 1;
        Ok(true)
    }

    /// Reaps, pushes what is due, forms new requests, and submits. Every path that may be followed
    /// by a wait on the ring goes through here: an SQE left unsubmitted with nothing else in
    /// flight would make that wait endless. Every step runs even if one failed; the first error
    /// is returned, and what it held back is tried again at the next progress.
    fn kick(&mut self, out: &mut Vec<Released<B>>) -> io::Result<()> {
        self.reap(out);
        let pushed = self.flush_pushes();
        let issued = self.issue();
        let owed = std::mem::take(&mut self.owed);
        let submitted = if owed {
            self.core().submit()
        } else {
            self.core().submit_if_due()
        };
        if submitted.is_err() || !self.to_push.is_empty() {
            self.owed = true;
        }
        pushed.and(issued).and(submitted)
    }

    /// Applies every completion this owner has on the ring.
    fn reap(&mut self, out: &mut Vec<Released<B>>) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        let owner = self.owner;
        self.core().reap_for(owner, &mut cqes);
        for &(req, res, flags) in &cqes {
            self.on_cqe(req, res, flags, out);
        }
        self.cqes = cqes;
    }

    /// One CQE: record it, retire the request if it is done, then decide what follows.
    fn on_cqe(&mut self, req_idx: usize, res: i32, flags: u32, out: &mut Vec<Released<B>>) {
        if req_idx == ring::CANCEL_REQ {
            return; // the cancel of a shutdown: its count of cancelled requests is not needed
        }
        let Some(req) = self.reqs.get_mut(req_idx) else {
            self.stats.bad_completions += 1;
            return;
        };
        let batch_idx = req.batch;
        let zc = req.zc;
        let mut first = None;
        if cqueue::notif(flags) {
            req.notif_done = true;
            self.stats.completions += 1;
            if res & sysu::NOTIF_USAGE_ZC_COPIED != 0 {
                if let Some(b) = self.batches.get_mut(batch_idx) {
                    b.rec.kernel_copied = true;
                }
            }
        } else {
            req.first_done = true;
            if !cqueue::more(flags) {
                req.notif_done = true;
            }
            if req.charged && res > 0 {
                req.pinned = sysu::pin_charge(res as usize);
                self.pinned += req.pinned;
            }
            first = Some(res);
        }
        let done = req.first_done && req.notif_done;
        let mut unpinned = false;
        if done {
            let r = self.reqs.remove(req_idx);
            self.in_flight -= 1;
            self.pinned -= r.pinned;
            unpinned = r.pinned > 0;
            if let Some(b) = self.batches.get_mut(batch_idx) {
                b.reqs -= 1;
            }
        }
        if let Some(res) = first {
            self.on_result(batch_idx, res, zc, out);
        }
        if unpinned && !self.closing {
            // Pinned pages came back: retry what the budget refused (never on a refused
            // request's own completion, which pinned nothing).
            for d in std::mem::take(&mut self.deferred) {
                self.to_push.push_back((d, true));
            }
        }
        self.settle(batch_idx, out);
    }

    /// A request's first CQE: account bytes, continue a short send, wait for the budget or copy,
    /// resubmit a cancelled request, or fail the batch.
    fn on_result(&mut self, batch_idx: usize, res: i32, zc: bool, out: &mut Vec<Released<B>>) {
        let merge = self.merge;
        let Some(b) = self.batches.get_mut(batch_idx) else {
            return;
        };
        if res >= 0 {
            let n = res as usize;
            b.rec.sent += n;
            self.stats.bytes += n as u64;
            if n > 0 {
                b.resubmits = 0;
            }
            if !merge {
                b.rec.sent = b.rec.total; // a datagram or a message goes whole
            }
            if b.rec.left() == 0 {
                if self.ordered {
                    self.busy = false;
                }
                return;
            }
            if n == 0 || self.closing {
                let errno = libc::EPIPE;
                b.rec.error = Some(io::Error::from_raw_os_error(errno));
                self.break_stream(errno, out);
                return;
            }
            // MSG_WAITALL stopped short (its thread exited, measured on 6.18): go on from there.
            b.waiting = true;
            self.to_push.push_back((batch_idx, zc));
            return;
        }
        let errno = -res;
        if self.closing {
            b.rec.error = Some(io::Error::from_raw_os_error(errno));
            return;
        }
        // The zero-copy budget is full: ENOMEM, io_uring charges pinned pages to RLIMIT_MEMLOCK
        // (not ENOBUFS: see the module docs). Wait for this sender's pinned pages if they would
        // make room; else copy. Never retried on the refused request's own completion.
        if zc && errno == libc::ENOMEM {
            self.stats.enobufs += 1;
            b.waiting = true;
            let refusal = Refusal {
                freed: false,
                may_free: sysu::pin_charge(b.rec.left()) <= self.pinned,
            };
            match policy::on_budget_refusal(refusal) {
                BudgetAction::Wait => self.deferred.push(batch_idx),
                BudgetAction::Copy | BudgetAction::Retry => {
                    b.rec.fallback = true;
                    self.to_push.push_back((batch_idx, false));
                }
            }
            return;
        }
        // The thread that submitted a parked request exited: the kernel cancelled it having sent
        // nothing. The socket is fine; submit it again, from this thread.
        if matches!(errno, libc::ECANCELED | libc::EFAULT) && b.resubmits < MAX_RESUBMITS {
            b.resubmits += 1;
            b.waiting = true;
            self.to_push.push_back((batch_idx, zc));
            return;
        }
        b.rec.error = Some(io::Error::from_raw_os_error(errno));
        if self.ordered {
            self.break_stream(errno, out);
        }
    }

    /// Releases `batch` if it is done: nothing of it in the kernel or still to push, and every
    /// byte sent or an error recorded.
    fn settle(&mut self, batch_idx: usize, out: &mut Vec<Released<B>>) {
        let done = self.batches.get(batch_idx).is_some_and(|b| {
            b.reqs == 0 && !b.waiting && (b.rec.left() == 0 || b.rec.error.is_some())
        });
        if done {
            let b = self.batches.remove(batch_idx);
            self.held -= b.rec.bufs.len();
            b.rec.release(self.zc, &mut self.stats, out);
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

    /// Registers `pool`'s region as fixed buffer 0 of the ring (`IORING_REGISTER_BUFFERS`).
    pub(crate) fn register(&mut self, pool: &BufPool) -> Result<(), Error> {
        if !self.zc {
            return Err(Error::Unsupported {
                feature: "registered buffers with the uring engine".into(),
                reason: "plain io_uring sends copy anyway; use uring-zc to send from registered \
                         memory"
                    .into(),
            });
        }
        self.core().register(pool)
    }

    /// Leaves nothing of this sender's in the SQ and nothing of it parked: cancels its requests
    /// (`IORING_OP_ASYNC_CANCEL` after them in the SQ, so they are submitted first) and submits
    /// until the SQ is empty. If that fails, an SQE may still name the descriptor: it is leaked,
    /// never closed. A cancel that finds no room is tried again once the SQ drained.
    fn withdraw(&mut self) {
        let (owner, fd) = (self.owner, self.raw_fd());
        let mut cancel = self.in_flight > 0;
        let mut core = self.core();
        for _ in 0..2 {
            if cancel && matches!(core.push_cancel(owner, fd), Ok(true)) {
                cancel = false;
            }
            if core.submit_all().is_err() {
                drop(core);
                self.leak_fd = true;
                return;
            }
            if !cancel {
                return;
            }
        }
    }
}

impl<B> Drop for UringEngine<B> {
    fn drop(&mut self) {
        let owner = self.owner;
        ring::lock(&self.core).leave(owner);
        if self.leak_fd {
            // An SQE that names this number may still be in the SQ: never let the number be
            // reused.
            std::mem::forget(self.fd.take());
        }
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
        if let Some(errno) = self.broken {
            return Err(SendError::Io {
                buf,
                error: io::Error::from_raw_os_error(errno),
            });
        }
        if self.queue.len() >= self.cfg.queue_limit {
            if let Err(error) = self.kick(out) {
                return Err(SendError::Io { buf, error });
            }
            if self.queue.len() >= self.cfg.queue_limit {
                self.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        self.queue.push_back((buf, dest));
        self.held += 1;
        self.stats.sends += 1;
        let res = self.issue().and_then(|()| self.core().submit_if_due());
        // The buffer is queued either way; the next progress enters again and reports a failure.
        if res.is_err() {
            self.owed = true;
        }
        Ok(())
    }

    fn progress(&mut self, _sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        self.kick(out)
    }

    fn held(&self) -> usize {
        self.held
    }

    fn readiness(&mut self, _sock: &Socket, _retry: bool) -> Readiness {
        // Whoever waits next must not leave requests unsubmitted: they could be waiting behind
        // another socket's request that never completes.
        let mut core = self.core();
        let failed = core.submit().is_err();
        let fd = core.fd();
        drop(core);
        if failed || self.owed {
            // Something could not be submitted or pushed: the next progress must try again (and
            // report a failure), so the wait must end at once. A ring's fd is writable while its
            // SQ has room, which a failed submit leaves as it was.
            self.owed = true;
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

    fn wait_slice(&self) -> Option<Duration> {
        if self.owed {
            // Not even a full SQ may make the wait on POLLOUT endless.
            return Some(Duration::ZERO);
        }
        // Another sender on a shared ring may reap our completions into our inbox without the
        // ring's fd ever waking us: look again soon.
        (Arc::strong_count(&self.core) > 1).then_some(SHARED_WAIT_SLICE)
    }

    fn stats(&self) -> Stats {
        self.stats
    }

    fn register_pool(&mut self, pool: &BufPool) -> Result<(), Error> {
        self.register(pool)
    }

    fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> usize {
        let errno = libc::EPIPE;
        self.closing = true;
        self.break_stream(errno, out);
        // Batches waiting for a push or for the budget have nothing in the kernel unless an
        // earlier request of theirs is still out: give those back with the error.
        let waiting: Vec<usize> = self
            .to_push
            .drain(..)
            .map(|(b, _)| b)
            .chain(self.deferred.drain(..))
            .collect();
        for idx in waiting {
            if let Some(b) = self.batches.get_mut(idx) {
                b.waiting = false;
                b.rec
                    .error
                    .get_or_insert_with(|| io::Error::from_raw_os_error(errno));
            }
            self.settle(idx, out);
        }
        self.withdraw();
        // Cancelled requests complete at once (a zero-copy one's notification follows when the
        // kernel let go of its pages): one more look gives back what it can.
        self.reap(out);
        // Requests still in flight: the kernel may still read their buffers and (before it issued
        // them) their iovecs, msghdr and destination, so all of it is leaked, never freed.
        for req in self.reqs.drain() {
            std::mem::forget(req);
        }
        let mut kept = 0;
        for b in self.batches.drain() {
            let Record { bufs, dest, .. } = b.rec;
            std::mem::forget(dest);
            kept += bufs.len();
            std::mem::forget(bufs);
        }
        self.held = 0;
        kept
    }
}

#[cfg(test)]
mod tests {
    use crate::socket::SockKind;

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
