//! The io_uring instance behind the uring engines: private to one sender, or shared by several
//! ([`UringShared`]) so one `io_uring_enter` submits requests for many sockets.
//!
//! - **Owners.** Each sender on a ring is an *owner*; its requests carry the owner id in the top
//!   16 bits of `user_data`. Whoever reaps the completion queue routes each CQE to its owner's
//!   inbox, so a sender never loses a completion another sender happened to reap. An owner's id
//!   is given to a new sender only once the owner left *and* its last request finished, so no
//!   stale CQE reaches the newcomer.
//! - **Submission.** `io_uring_enter` stops at the first SQE whose preparation fails (that one gets
//!   an error CQE) and leaves the rest in the SQ ring, so what is still unsubmitted is always read
//!   from the ring itself, never counted from what was pushed.
//! - **Completion queue.** Requests are capped per ring at the SQ size (each posts at most two
//!   CQEs; the CQ holds twice as many) when they are formed; a request that continues a started
//!   one bypasses the cap, so the CQ can still overflow. The kernel then keeps the extra CQEs
//!   (`IORING_FEAT_NODROP`) until an `io_uring_enter` with `GETEVENTS`: every reap and submit
//!   enters when the ring says `IORING_SQ_CQ_OVERFLOW`, even with nothing to submit.
//! - **Never spin under the lock.** Pushing into a full SQ enters the kernel once; if the SQ is
//!   still full the caller keeps the request and tries again at its next progress.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use io_uring::{opcode, squeue, types, IoUring};

use crate::buf::BufPool;
use crate::error::Error;
use crate::sys::uring as sysu;

use super::uring::UringConfig;

const OWNER_SHIFT: u32 = 48;
/// An owner id never given to a sender: requests of the test hooks.
const NOBODY: u16 = u16::MAX;
/// The request index of an owner's `IORING_OP_ASYNC_CANCEL` (no request of the owner's slab).
pub(crate) const CANCEL_REQ: usize = (1 << OWNER_SHIFT) - 1;
/// io_uring registers at most this much memory per buffer (`IORING_REGISTER_BUFFERS` answers
/// `EFAULT` above it).
pub(crate) const MAX_REGISTERED: usize = 1 << 30;
/// Rounds of "drain the CQ, then flush what overflowed into it" per reap.
const FLUSH_ROUNDS: usize = 4;

/// One completion: `(request index, res, flags)`.
pub(crate) type Cqe = (usize, i32, u32);

/// A sender on the ring.
struct Owner {
    inbox: Vec<Cqe>,
    /// Requests pushed and not yet finished (their last CQE not reaped).
    live: usize,
    /// The sender is gone; its id comes free when `live` reaches 0.
    left: bool,
}

pub(crate) struct RingCore {
    ring: IoUring,
    pub(crate) cfg: UringConfig,
    owners: HashMap<u16, Owner>,
    free_ids: Vec<u16>,
    next_owner: u16,
    /// Requests pushed and not yet finished, over every owner.
    in_flight: usize,
    pool: Option<BufPool>,
    enters: u64,
}

impl RingCore {
    fn new(cfg: UringConfig) -> Result<Self, Error> {
        if cfg.entries == 0 || cfg.batch == 0 || cfg.queue_limit == 0 {
            return Err(Error::Config {
                problem: format!("UringConfig {cfg:?} has a zero entries, batch or queue limit"),
                fix: "give each at least 1".into(),
            });
        }
        let ring = IoUring::builder()
            .setup_cqsize(cfg.entries.saturating_mul(2))
            .build(cfg.entries)
            .map_err(|source| Error::Io {
                context: match source.raw_os_error() {
                    Some(libc::ENOMEM) => {
                        "io_uring_setup: the ring's memory counts against RLIMIT_MEMLOCK without \
                         CAP_IPC_LOCK; raise the limit or lower UringConfig::entries"
                    }
                    _ => "io_uring_setup",
                },
                source,
            })?;
        Ok(Self {
            ring,
            cfg: UringConfig {
                batch: cfg.batch.min(libc::UIO_MAXIOV as usize),
                ..cfg
            },
            owners: HashMap::new(),
            free_ids: Vec::new(),
            next_owner: 0,
            in_flight: 0,
            pool: None,
            enters: 0,
        })
    }

    /// A new owner: a free id (one whose sender left and whose requests all finished), or the
    /// next never used.
    pub(crate) fn join(&mut self) -> Result<u16, Error> {
        let owner = match self.free_ids.pop() {
            Some(id) => id,
            None if self.next_owner < NOBODY => {
                self.next_owner += 1;
                self.next_owner - 1
            }
            None => {
                return Err(Error::Config {
                    problem: "more than 65535 senders at once on one ring".into(),
                    fix: "make another UringShared".into(),
                })
            }
        };
        self.owners.insert(
            owner,
            Owner {
                inbox: Vec::new(),
                live: 0,
                left: false,
            },
        );
        Ok(owner)
    }

    /// The sender left: its CQEs are dropped from now on, and its id is reused once its last
    /// request finished.
    pub(crate) fn leave(&mut self, owner: u16) {
        let Some(o) = self.owners.get_mut(&owner) else {
            return;
        };
        o.left = true;
        o.inbox = Vec::new();
        if o.live == 0 {
            self.owners.remove(&owner);
            self.free_ids.push(owner);
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Requests may be added without overflowing the CQ.
    pub(crate) fn has_room(&self) -> bool {
        self.in_flight < self.cfg.entries as usize
    }

    /// SQEs in the SQ ring that the kernel has not consumed, every owner's.
    fn sq_len(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// The kernel holds completions the CQ had no room for.
    fn cq_overflow(&mut self) -> bool {
        self.ring.submission().cq_overflow()
    }

    /// Queues `sqe` for `owner`'s request `req`. A full SQ is met with one `io_uring_enter`;
    /// `Ok(false)` if it is still full (the caller keeps the request and pushes it at its next
    /// progress), `Err` if that enter failed.
    ///
    /// # Safety
    /// Everything the SQE points at (buffers, iovecs, msghdr, address) must stay valid and
    /// unchanged until the request's last CQE has been reaped.
    pub(crate) unsafe fn push(
        &mut self,
        owner: u16,
        req: usize,
        sqe: squeue::Entry,
    ) -> io::Result<bool> {
        let sqe = sqe.user_data((u64::from(owner) << OWNER_SHIFT) | req as u64);
        // SAFETY: upheld by this function's caller.
        if unsafe { self.ring.submission().push(&sqe) }.is_err() {
            self.submit()?;
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                return Ok(false);
            }
        }
        self.in_flight += 1;
        if let Some(o) = self.owners.get_mut(&owner) {
            o.live += 1;
        }
        Ok(true)
    }

    /// Queues an `IORING_OP_ASYNC_CANCEL` of every request of `owner` on the file `fd` names
    /// (`IORING_ASYNC_CANCEL_FD | IORING_ASYNC_CANCEL_ALL`, 5.19): parked requests complete with
    /// `-ECANCELED`. Only submitted requests can be cancelled: submit before it leaves the SQ.
    pub(crate) fn push_cancel(&mut self, owner: u16, fd: RawFd) -> io::Result<bool> {
        let sqe = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all()).build();
        // SAFETY: a cancel by descriptor points at no memory.
        unsafe { self.push(owner, CANCEL_REQ, sqe) }
    }

    /// `io_uring_enter` for everything in the SQ, from every owner, and to flush completions the
    /// kernel holds after a CQ overflow. The kernel stops at an SQE that fails its preparation
    /// (posting its error CQE) and leaves the rest in the ring: enter again while that makes
    /// progress (bounded by the SQ length).
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        let mut overflow = self.cq_overflow();
        loop {
            let pending = self.sq_len();
            if pending == 0 && !overflow {
                return Ok(());
            }
            overflow = false;
            self.enters += 1;
            match sysu::submit(&self.ring) {
                Ok(n) if n > 0 && n < pending => continue,
                Ok(_) => return Ok(()),
                // 5.x: completions are backed up and cannot be flushed yet; the caller reaps
                // and submits on its next progress.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Submits until the SQ is empty; fails if something is left in it.
    pub(crate) fn submit_all(&mut self) -> io::Result<()> {
        self.submit()?;
        match self.sq_len() {
            0 => Ok(()),
            n => Err(io::Error::other(format!(
                "io_uring_enter left {n} SQEs in the submission queue"
            ))),
        }
    }

    /// Enters the kernel if a batch is full, if nothing submitted is still in flight (then no
    /// completion would come to wake a waiter), or if completions overflowed.
    pub(crate) fn submit_if_due(&mut self) -> io::Result<()> {
        let pending = self.sq_len();
        let submitted_in_flight = self.in_flight.saturating_sub(pending);
        if (pending > 0 && (pending >= self.cfg.batch || submitted_in_flight == 0))
            || self.cq_overflow()
        {
            self.submit()
        } else {
            Ok(())
        }
    }

    /// Drains the CQ into the owners' inboxes (flushing what overflowed) and moves `owner`'s into
    /// `out`. A request leaves the counts with its last CQE (the notification, or a first CQE
    /// without `F_MORE`), whoever reaps it.
    pub(crate) fn reap_for(&mut self, owner: u16, out: &mut Vec<Cqe>) {
        for _ in 0..FLUSH_ROUNDS {
            self.drain_cq();
            if !self.cq_overflow() {
                break;
            }
            // The CQ is empty now: an enter with GETEVENTS moves the overflowed CQEs into it. A
            // failure shows at the next submit, which enters again.
            self.enters += 1;
            if sysu::submit(&self.ring).is_err() {
                break;
            }
        }
        if let Some(o) = self.owners.get_mut(&owner) {
            out.append(&mut o.inbox);
        }
    }

    fn drain_cq(&mut self) {
        let mut gone = Vec::new();
        for cqe in self.ring.completion() {
            let ud = cqe.user_data();
            let who = (ud >> OWNER_SHIFT) as u16;
            let req = (ud & ((1 << OWNER_SHIFT) - 1)) as usize;
            let flags = cqe.flags();
            let last = io_uring::cqueue::notif(flags) || !io_uring::cqueue::more(flags);
            if last {
                self.in_flight -= 1;
            }
            // No owner: a test hook's request. A sender that left with requests in flight (it
            // leaked their buffers): its CQEs only count its requests out.
            let Some(o) = self.owners.get_mut(&who) else {
                continue;
            };
            if last {
                o.live -= 1;
            }
            if !o.left {
                o.inbox.push((req, cqe.result(), flags));
            } else if o.live == 0 {
                gone.push(who);
            }
        }
        for who in gone {
            self.owners.remove(&who);
            self.free_ids.push(who);
        }
    }

    /// Registers `pool` as fixed buffer 0 of this ring.
    pub(crate) fn register(&mut self, pool: &BufPool) -> Result<(), Error> {
        if let Some(p) = &self.pool {
            if p.region_id() == pool.region_id() {
                return Ok(());
            }
            return Err(Error::Config {
                problem: "a second BufPool registered with one ring".into(),
                fix: "a ring registers one BufPool; draw every buffer from it".into(),
            });
        }
        let (base, len) = pool.region();
        if len > MAX_REGISTERED {
            return Err(Error::Config {
                problem: format!("registering a BufPool of {} MiB", len >> 20),
                fix: "io_uring registers at most 1 GiB per buffer (IORING_REGISTER_BUFFERS \
                      answers EFAULT above it); use pools of at most 1 GiB"
                    .into(),
            });
        }
        let iov = libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        };
        // SAFETY: the region stays allocated while `self.pool` holds a clone of the pool, which it
        // does for as long as the ring (and so the registration) lives.
        unsafe { self.ring.submitter().register_buffers(&[iov]) }.map_err(|source| Error::Io {
            context: "io_uring_register(IORING_REGISTER_BUFFERS)",
            source,
        })?;
        self.pool = Some(pool.clone());
        Ok(())
    }

    /// The region requests may send from with `IORING_RECVSEND_FIXED_BUF`.
    pub(crate) fn fixed_region(&self) -> Option<u64> {
        self.pool.as_ref().map(BufPool::region_id)
    }
}

/// Locks a ring, recovering from a poisoned lock (the core's state is updated atomically per
/// call, so a panic elsewhere leaves it consistent).
pub(crate) fn lock(core: &Mutex<RingCore>) -> MutexGuard<'_, RingCore> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn private_ring(cfg: UringConfig) -> Result<Arc<Mutex<RingCore>>, Error> {
    Ok(Arc::new(Mutex::new(RingCore::new(cfg)?)))
}

/// One io_uring shared by several senders, so one `io_uring_enter` carries requests for many
/// sockets (set [`SenderConfig::ring`](crate::SenderConfig::ring)).
///
/// Senders on a shared ring may live on different threads; the ring is locked per operation. A
/// sender that waits polls the ring in short slices, since another sender may reap its
/// completions for it. Registered buffers belong to the ring: [`register_pool`] once, and every
/// `uring-zc` sender on it sends that pool's buffers from registered memory.
///
/// - **Waiting.** Requests are entered in batches: a request pushed while others are in flight
///   waits in the SQ until the batch fills or someone calls [`Sender::readiness`], which enters
///   for every sender on the ring. Call `readiness()` right before every wait (the blocking calls
///   do); an event loop that registers the ring's fd once and waits without it can stall until an
///   unrelated request completes.
/// - **Threads.** io_uring retries a request that found its socket full on the thread that
///   submitted it: the thread whose call (`send`, `reap`, `flush`, `readiness`...) entered the
///   kernel, on a shared ring possibly for another sender's request. If that thread has exited,
///   the kernel cancels the request when the socket drains (measured on 6.18: `-ECANCELED` having
///   sent nothing, or the bytes sent before the thread exited). zerotx submits the rest again from
///   the next thread that makes progress, so no thread has to outlive its requests; each such exit
///   costs a resubmission.
/// - **Closing.** A sender closed or dropped here submits whatever it left in the SQ and cancels
///   its parked requests (`IORING_OP_ASYNC_CANCEL`), so they give their ring slots back (a
///   zero-copy request that already sent keeps its slot until its notification, when the kernel
///   lets go of the pages: with a peer that never reads, until the connection ends). Its SQEs
///   name the socket through the sender's own duplicate of the descriptor, closed only once no
///   unsubmitted SQE can name it (leaked if `io_uring_enter` failed), so the caller's descriptor
///   number can be reused at once without a stale request reaching the new socket.
///
/// [`register_pool`]: UringShared::register_pool
/// [`Sender::readiness`]: crate::Sender::readiness
#[derive(Clone)]
pub struct UringShared {
    pub(crate) core: Arc<Mutex<RingCore>>,
}

impl std::fmt::Debug for UringShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let core = lock(&self.core);
        f.debug_struct("UringShared")
            .field("entries", &core.cfg.entries)
            .field("in_flight", &core.in_flight)
            .field("enters", &core.enters)
            .finish()
    }
}

impl UringShared {
    /// Creates the ring (`io_uring_setup`).
    pub fn new(cfg: UringConfig) -> Result<Self, Error> {
        Ok(Self {
            core: private_ring(cfg)?,
        })
    }

    /// Registers `pool`'s memory with the ring (`IORING_REGISTER_BUFFERS`).
    pub fn register_pool(&self, pool: &BufPool) -> Result<(), Error> {
        lock(&self.core).register(pool)
    }

    /// `io_uring_enter` calls made so far, by every sender on the ring.
    pub fn enters(&self) -> u64 {
        lock(&self.core).enters
    }

    /// Test hook: queues `n` `IORING_OP_NOP`s that belong to no sender, as if another sender had
    /// filled the SQ, and submits them when `submit` (their completions can then fill the CQ).
    #[doc(hidden)]
    pub fn inject_nops(&self, n: u32, submit: bool) -> std::io::Result<()> {
        let mut core = lock(&self.core);
        for _ in 0..n {
            // SAFETY: a NOP points at nothing.
            if !unsafe { core.push(NOBODY, 0, opcode::Nop::new().build())? } {
                return Err(io::Error::other("the SQ stayed full"));
            }
        }
        if submit {
            core.submit()?;
        }
        Ok(())
    }
}
