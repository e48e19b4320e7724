//! The io_uring engines: `uring` (`IORING_OP_SENDMSG`, the kernel copies) and `uring-zc`
//! (`IORING_OP_SENDMSG_ZC`, or `IORING_OP_SEND_ZC` with `IORING_RECVSEND_FIXED_BUF` for buffers from
//! a registered [`BufPool`]), both with many requests per `io_uring_enter`.
//!
//! - **Order.** io_uring issues requests independently: two in flight on one stream socket can
//!   reorder the byte stream when the socket buffer fills (KERNEL.md measured a quarter of the
//!   bytes out of order). So a stream socket has exactly one request in flight, carrying up to
//!   `batch` queued buffers as an iovec with `MSG_WAITALL`; a short result is continued from its
//!   offset by the next request. Datagram sockets have many requests in flight, one per buffer.
//! - **Completions.** The first CQE carries bytes or `-errno` and `IORING_CQE_F_MORE` when a
//!   notification follows (read from the flag, also on errors); only the `IORING_CQE_F_NOTIF` CQE
//!   releases a zero-copy request's buffers, and it may come before or after later requests'
//!   CQEs. `IORING_SEND_ZC_REPORT_USAGE` makes it say whether the kernel copied.
//! - **CQ overflow.** Requests in flight are capped at half the CQ size (each posts at most two
//!   CQEs), so the CQ cannot overflow; an `EBUSY` from submission is met by reaping first.
//! - **The zero-copy budget** (`ENOBUFS` from option memory, `ENOMEM` when io_uring charges pinned
//!   pages to `RLIMIT_MEMLOCK`): the request is retried zero-copy after another request finished,
//!   or, with nothing else in flight, sent by copy (a fallback). Nothing spins.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types};
use socket2::SockAddr;

use super::ring::{self, Cqe, RingCore, UringShared};

use crate::buf::{BufPool, SendBuf};
use crate::engine::Engine;
use crate::error::{Error, SendError};
use crate::report::{CopyReason, Path, Readiness, Released, Report, Stats};
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

struct Batch<B> {
    bufs: Vec<B>,
    /// Boxed: the kernel reads it from the request, and batches move inside their slab.
    dest: Option<Box<SockAddr>>,
    total: usize,
    sent: usize,
    /// Requests of this batch not yet finished (first CQE and notification both in).
    reqs: u32,
    copied: bool,
    fallback: bool,
    error: Option<i32>,
    started: Instant,
}

/// The memory a request's SQE points at: kept until the request finished.
struct Req {
    batch: usize,
    first_done: bool,
    notif_done: bool,
    _iov: Vec<libc::iovec>,
    _msg: Box<libc::msghdr>,
}

// SAFETY: the raw pointers in iovec/msghdr point into buffers owned by the engine's batches and
// into this struct's own boxes; they are only read by the kernel, never dereferenced here, so
// moving a Req to another thread with its engine is sound.
unsafe impl Send for Req {}

struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Self {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, t: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.items[i] = Some(t);
                i
            }
            None => {
                self.items.push(Some(t));
                self.items.len() - 1
            }
        }
    }
    fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.items.get_mut(i).and_then(Option::as_mut)
    }
    fn remove(&mut self, i: usize) -> Option<T> {
        let t = self.items.get_mut(i)?.take()?;
        self.free.push(i);
        Some(t)
    }
    fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.free.clear();
        self.items.drain(..).flatten()
    }
}

pub(crate) struct UringEngine<B> {
    core: Arc<Mutex<RingCore>>,
    owner: u16,
    zc: bool,
    stream: bool,
    cfg: UringConfig,
    queue: VecDeque<(B, Option<SockAddr>)>,
    batches: Slab<Batch<B>>,
    reqs: Slab<Req>,
    /// This sender's requests pushed and not yet finished.
    in_flight: usize,
    stream_busy: bool,
    /// Batches whose zero-copy request hit the budget, waiting for another request to finish.
    deferred: Vec<usize>,
    broken: Option<i32>,
    held: usize,
    ready: Vec<Released<B>>,
    stats: Stats,
    cqes: Vec<Cqe>,
}

/// How long a sender on a shared ring sleeps before it looks at its inbox again.
const SHARED_WAIT_SLICE: Duration = Duration::from_millis(5);

/// Smallest buffer a stream socket sends from registered memory (see `registered_index`).
const FIXED_STREAM_MIN: usize = 64 * 1024;

/// Fixed buffer index for `buf` when it lies in the registered `region` (and, on a stream
/// socket, is large enough to go alone: see `UringEngine::registered_index`).
fn fixed_index<B: SendBuf>(region: Option<u64>, stream: bool, buf: &B) -> Option<u16> {
    if stream && buf.as_bytes().len() < FIXED_STREAM_MIN {
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
            let inet = matches!(sock.kind.family, Family::Inet4 | Family::Inet6);
            if !inet || !matches!(sock.kind.ty, SockType::Stream | SockType::Dgram) {
                return Err(unsupported(format!(
                    "zero-copy io_uring sends need a TCP or UDP socket, not {}; use uring",
                    sock.kind
                )));
            }
        }
        let core = match shared {
            Some(r) => r.core.clone(),
            None => ring::private_ring(cfg)?,
        };
        let (owner, cfg) = {
            let mut c = ring::lock(&core);
            (c.join()?, c.cfg)
        };
        Ok(Self {
            core,
            owner,
            zc,
            stream: sock.kind.is_stream(),
            cfg,
            queue: VecDeque::new(),
            batches: Slab::new(),
            reqs: Slab::new(),
            in_flight: 0,
            stream_busy: false,
            deferred: Vec::new(),
            broken: None,
            held: 0,
            ready: Vec::new(),
            stats: Stats::default(),
            cqes: Vec::new(),
        })
    }

    fn core(&self) -> MutexGuard<'_, RingCore> {
        ring::lock(&self.core)
    }

    /// The registered region zero-copy requests may send from, if any.
    fn fixed_region(&self) -> Option<u64> {
        if self.zc {
            self.core().fixed_region()
        } else {
            None
        }
    }

    /// Whether `buf` goes as its own `SEND_ZC` from registered memory. On a stream socket only
    /// large buffers do: one request carries one registered buffer, and with one request in
    /// flight small ones are faster batched into a `SENDMSG_ZC` iovec (measured over TCP loopback,
    /// one registered buffer per request against batched: 278 vs 613 MB/s at 1400 bytes, 2655 vs
    /// 2097 MB/s at 64 KiB).
    fn registered_index(&self, buf: &B) -> Option<u16> {
        fixed_index(self.fixed_region(), self.stream, buf)
    }

    /// Forms requests from the queue while order and the in-flight cap allow.
    fn issue(&mut self, sock: &Socket) -> io::Result<()> {
        loop {
            let blocked = self.stream && self.stream_busy;
            if self.queue.is_empty() || blocked || !self.core().has_room() {
                return Ok(());
            }
            let mut bufs = Vec::new();
            let (first, dest) = self.queue.pop_front().expect("queue not empty");
            let fixed = self.registered_index(&first).is_some();
            bufs.push(first);
            // A stream request carries several buffers as one iovec; a fixed-buffer request and a
            // datagram carry one.
            while self.stream && !fixed && bufs.len() < self.cfg.batch {
                match self.queue.front() {
                    Some((b, _)) if self.registered_index(b).is_none() => {
                        bufs.push(self.queue.pop_front().expect("front exists").0)
                    }
                    _ => break,
                }
            }
            let total = bufs.iter().map(|b| b.as_bytes().len()).sum();
            let batch = self.batches.insert(Batch {
                bufs,
                dest: dest.map(Box::new),
                total,
                sent: 0,
                reqs: 0,
                copied: false,
                fallback: false,
                error: None,
                started: Instant::now(),
            });
            if self.stream {
                self.stream_busy = true;
            }
            self.push_request(sock, batch, self.zc)?;
        }
    }

    /// Builds and pushes one request for the unsent part of `batch`.
    fn push_request(&mut self, sock: &Socket, batch_idx: usize, zc: bool) -> io::Result<()> {
        let region = if zc { self.fixed_region() } else { None };
        let b = self.batches.get_mut(batch_idx).expect("live batch");
        let mut skip = b.sent;
        let mut iov = Vec::with_capacity(b.bufs.len());
        for buf in &b.bufs {
            let bytes = buf.as_bytes();
            if skip >= bytes.len() {
                skip -= bytes.len();
                continue;
            }
            iov.push(libc::iovec {
                iov_base: bytes[skip..].as_ptr() as *mut libc::c_void,
                iov_len: bytes.len() - skip,
            });
            skip = 0;
        }
        // SAFETY: msghdr is a plain C struct for which all-zeroes is a valid value.
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        if let Some(d) = &b.dest {
            msg.msg_name = d.as_ptr() as *mut libc::c_void;
            msg.msg_namelen = d.len();
        }
        let flags = libc::MSG_NOSIGNAL | if self.stream { libc::MSG_WAITALL } else { 0 };
        let fd = types::Fd(sock.fd().as_raw_fd());
        let fixed = match b.bufs.as_slice() {
            [one] => fixed_index(region, self.stream, one),
            _ => None,
        };
        b.reqs += 1;
        let bad = sysu::take_bad_sqe();
        let sqe: squeue::Entry = match fixed {
            Some(index) => {
                let one = iov[0];
                let mut op = opcode::SendZc::new(fd, one.iov_base as *const u8, one.iov_len as u32)
                    .buf_index(Some(index))
                    .flags(flags)
                    .zc_flags(sysu::SEND_ZC_REPORT_USAGE | bad);
                if let Some(d) = &b.dest {
                    op = op.dest_addr(d.as_ptr()).dest_addr_len(d.len());
                }
                op.build()
            }
            None if zc => opcode::SendMsgZc::new(fd, &*msg)
                .flags(flags as u32)
                .ioprio(sysu::SEND_ZC_REPORT_USAGE | bad)
                .build(),
            None => opcode::SendMsg::new(fd, &*msg)
                .flags(flags as u32)
                .ioprio(bad)
                .build(),
        };
        // Moving the Vec and the Box into the request does not move what they point at.
        let req = self.reqs.insert(Req {
            batch: batch_idx,
            first_done: false,
            notif_done: false,
            _iov: iov,
            _msg: msg,
        });
        self.in_flight += 1;
        self.stats.syscalls += 1;
        let owner = self.owner;
        // SAFETY: the SQE points at the iovec and msghdr now owned by `self.reqs[req]`, at the
        // destination address boxed in the batch, and at bytes of buffers owned by the batch.
        // Requests and batches are removed only after the request's last CQE, so all of it stays
        // valid and unchanged until the kernel is done; shutdown leaks what is in flight.
        let pushed = match unsafe { self.core().push(owner, req, sqe) } {
            Ok(true) => Ok(()),
            Ok(false) => Err(io::Error::from_raw_os_error(libc::EBUSY)),
            Err(e) => Err(e),
        };
        if let Err(e) = pushed {
            // Never queued: undo, and give the batch back with the error if nothing else of it
            // is in flight, so no buffer waits for a completion that cannot come.
            self.reqs.remove(req);
            self.in_flight -= 1;
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            let b = self.batches.get_mut(batch_idx).expect("live batch");
            b.reqs -= 1;
            b.error = Some(errno);
            if b.reqs == 0 {
                let b = self.batches.remove(batch_idx).expect("live batch");
                self.release(b);
            }
            if self.stream {
                self.break_stream(errno);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Reaps, forms new requests, and submits everything pushed. Every path that may be followed
    /// by a wait on the ring goes through here: an SQE left unsubmitted with nothing else in
    /// flight would make that wait endless.
    fn kick(&mut self, sock: &Socket) -> io::Result<()> {
        self.reap(sock)?;
        self.issue(sock)?;
        self.core().submit_if_due()
    }

    fn reap(&mut self, sock: &Socket) -> io::Result<()> {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        let owner = self.owner;
        self.core().reap_for(owner, &mut cqes);
        for &(req, res, flags) in &cqes {
            self.on_cqe(sock, req, res, flags)?;
        }
        self.cqes = cqes;
        Ok(())
    }

    fn on_cqe(&mut self, sock: &Socket, req_idx: usize, res: i32, flags: u32) -> io::Result<()> {
        let Some(req) = self.reqs.get_mut(req_idx) else {
            self.stats.bad_completions += 1;
            return Ok(());
        };
        let batch_idx = req.batch;
        if cqueue::notif(flags) {
            req.notif_done = true;
            self.stats.completions += 1;
            let b = self.batches.get_mut(batch_idx).expect("live batch");
            b.copied |= res & sysu::NOTIF_USAGE_ZC_COPIED != 0;
        } else {
            req.first_done = true;
            if !cqueue::more(flags) {
                req.notif_done = true;
            }
            self.on_result(sock, batch_idx, res)?;
        }
        let req = self.reqs.get_mut(req_idx).expect("live request");
        if req.first_done && req.notif_done {
            self.reqs.remove(req_idx);
            self.in_flight -= 1;
            // A request finished, so pages were unpinned: retry what the budget refused.
            for deferred in std::mem::take(&mut self.deferred) {
                self.push_request(sock, deferred, true)?;
            }
            let b = self.batches.get_mut(batch_idx).expect("live batch");
            b.reqs -= 1;
            let finished = b.reqs == 0 && (b.sent >= b.total || b.error.is_some());
            if finished {
                let b = self.batches.remove(batch_idx).expect("live batch");
                self.release(b);
            }
        }
        Ok(())
    }

    /// A request's first CQE: account bytes, continue a short stream send, or fail the batch.
    fn on_result(&mut self, sock: &Socket, batch_idx: usize, res: i32) -> io::Result<()> {
        let stream = self.stream;
        let b = self.batches.get_mut(batch_idx).expect("live batch");
        if res >= 0 {
            let n = res as usize;
            b.sent += n;
            self.stats.bytes += n as u64;
            if !stream {
                b.sent = b.total; // a datagram goes whole
            }
            if b.sent < b.total {
                if n == 0 {
                    b.error = Some(libc::EPIPE);
                    self.break_stream(libc::EPIPE);
                    return Ok(());
                }
                let fallback = b.fallback;
                return self.push_request(sock, batch_idx, self.zc && !fallback);
            }
            if stream {
                self.stream_busy = false;
            }
            return Ok(());
        }
        let errno = -res;
        // The zero-copy budget is full: ENOBUFS (option memory) or ENOMEM (io_uring charges the
        // pinned pages to RLIMIT_MEMLOCK). Retry after another request finished, or copy.
        if self.zc && !b.fallback && matches!(errno, libc::ENOBUFS | libc::ENOMEM) {
            self.stats.enobufs += 1;
            if self.in_flight > 1 {
                self.deferred.push(batch_idx);
                return Ok(());
            }
            b.fallback = true;
            return self.push_request(sock, batch_idx, false);
        }
        b.error = Some(errno);
        if stream {
            self.break_stream(errno);
            return Ok(());
        }
        Ok(())
    }

    /// After a failed stream send nothing more may go out (it would leave a gap): every queued
    /// buffer comes back with the error.
    fn break_stream(&mut self, errno: i32) {
        self.stream_busy = false;
        self.broken = Some(errno);
        while let Some((buf, _)) = self.queue.pop_front() {
            self.held -= 1;
            self.stats.errors += 1;
            self.ready.push(Released {
                buf,
                report: Report {
                    bytes: 0,
                    path: Path::Copied(CopyReason::Engine),
                    latency: std::time::Duration::ZERO,
                    error: Some(io::Error::from_raw_os_error(errno)),
                },
            });
        }
    }

    fn release(&mut self, b: Batch<B>) {
        let path = Path::of_release(self.zc, b.fallback, b.copied);
        let latency = b.started.elapsed();
        let mut sent = b.sent;
        for buf in b.bufs {
            let len = buf.as_bytes().len();
            let bytes = len.min(sent);
            sent -= bytes;
            let error = b
                .error
                .filter(|_| bytes < len)
                .map(io::Error::from_raw_os_error);
            self.stats.count_release(path, error.is_some());
            self.held -= 1;
            self.ready.push(Released {
                buf,
                report: Report {
                    bytes,
                    path,
                    latency,
                    error,
                },
            });
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
}

impl<B> Drop for UringEngine<B> {
    fn drop(&mut self) {
        let owner = self.owner;
        ring::lock(&self.core).leave(owner);
    }
}

impl<B: SendBuf> Engine<B> for UringEngine<B> {
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
    ) -> Result<(), SendError<B>> {
        if let Some(errno) = self.broken {
            return Err(SendError::Io {
                buf,
                error: io::Error::from_raw_os_error(errno),
            });
        }
        if self.queue.len() >= self.cfg.queue_limit {
            if let Err(error) = self.kick(sock) {
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
        let res = self.issue(sock).and_then(|()| self.core().submit_if_due());
        // The buffer is queued either way; a ring failure shows again at the next progress.
        let _ = res;
        Ok(())
    }

    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        self.kick(sock)?;
        out.append(&mut self.ready);
        Ok(())
    }

    fn held(&self) -> usize {
        self.held
    }

    fn readiness(&mut self, _sock: &Socket) -> Readiness {
        // Whoever waits next must not leave requests unsubmitted: they could be waiting behind
        // another socket's request that never completes.
        let mut core = self.core();
        if let Err(e) = core.submit() {
            // The wait returns at once on the ring; the error shows at the next progress.
            let _ = e;
        }
        Readiness {
            fd: core.fd(),
            events: libc::POLLIN,
        }
    }

    fn wait_slice(&self) -> Option<Duration> {
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

    fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> Vec<B> {
        let errno = libc::EPIPE;
        self.break_stream(errno);
        out.append(&mut self.ready);
        // Requests in flight: the kernel may still read their buffers (and, before it issued
        // them, their iovecs), so both are leaked, never freed.
        for req in self.reqs.drain() {
            std::mem::forget(req);
        }
        let kept: Vec<B> = self.batches.drain().flat_map(|b| b.bufs).collect();
        self.held = 0;
        kept
    }
}
