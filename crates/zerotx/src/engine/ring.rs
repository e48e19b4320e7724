//! The io_uring instance behind the uring engines: private to one sender, or shared by several
//! ([`UringShared`]) so one `io_uring_enter` submits requests for many sockets.
//!
//! Each sender on a ring is an *owner*; its requests carry the owner id in the top 16 bits of
//! `user_data`. Whoever reaps the completion queue routes each CQE to its owner's inbox, so a
//! sender never loses a completion another sender happened to reap. Requests in flight are capped
//! per ring at the SQ size (each posts at most two CQEs; the CQ holds twice as many), so the CQ
//! cannot overflow however many senders share it.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use io_uring::{squeue, IoUring};

use crate::buf::BufPool;
use crate::error::Error;

use super::uring::UringConfig;

const OWNER_SHIFT: u32 = 48;
/// An owner id never given to a sender: requests of the test hooks.
const NOBODY: u16 = u16::MAX;

/// One completion: `(request index, res, flags)`.
pub(crate) type Cqe = (usize, i32, u32);

pub(crate) struct RingCore {
    ring: IoUring,
    pub(crate) cfg: UringConfig,
    inbox: HashMap<u16, Vec<Cqe>>,
    next_owner: u16,
    /// Requests pushed and not yet finished, over every owner.
    pub(crate) in_flight: usize,
    /// Requests pushed since the last `io_uring_enter`.
    pub(crate) unsubmitted: usize,
    pool: Option<BufPool>,
    enters: u64,
}

impl RingCore {
    fn new(cfg: UringConfig) -> Result<Self, Error> {
        if cfg.entries == 0 || cfg.batch == 0 || cfg.queue_limit == 0 {
            return Err(Error::Unsupported {
                feature: "an io_uring config with zero entries, batch or queue limit".into(),
                reason: "give each at least 1".into(),
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
            inbox: HashMap::new(),
            next_owner: 0,
            in_flight: 0,
            unsubmitted: 0,
            pool: None,
            enters: 0,
        })
    }

    pub(crate) fn join(&mut self) -> Result<u16, Error> {
        let owner = self.next_owner;
        self.next_owner = owner.checked_add(1).ok_or_else(|| Error::Unsupported {
            feature: "more than 65535 senders on one ring".into(),
            reason: "make another UringShared".into(),
        })?;
        self.inbox.insert(owner, Vec::new());
        Ok(owner)
    }

    pub(crate) fn leave(&mut self, owner: u16) {
        self.inbox.remove(&owner);
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Requests may be added without overflowing the CQ.
    pub(crate) fn has_room(&self) -> bool {
        self.in_flight < self.cfg.entries as usize
    }

    /// Queues `sqe` for `owner`'s request `req`, entering the kernel first if the SQ is full.
    ///
    /// # Safety
    /// Everything the SQE points at (buffers, iovecs, msghdr, address) must stay valid and
    /// unchanged until the request's last CQE has been reaped.
    pub(crate) unsafe fn push(
        &mut self,
        owner: u16,
        req: usize,
        sqe: squeue::Entry,
    ) -> io::Result<()> {
        let sqe = sqe.user_data((u64::from(owner) << OWNER_SHIFT) | req as u64);
        loop {
            // SAFETY: upheld by this function's caller.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                self.in_flight += 1;
                self.unsubmitted += 1;
                return Ok(());
            }
            self.submit()?;
        }
    }

    /// `io_uring_enter` for everything queued, from every owner.
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        if self.unsubmitted == 0 {
            return Ok(());
        }
        self.enters += 1;
        match crate::sys::uring::submit(&self.ring) {
            Ok(_) => {
                self.unsubmitted = 0;
                Ok(())
            }
            // Completions are backed up: the caller reaps, and submits on its next progress.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Enters the kernel if a batch is full, or if nothing submitted is still in flight (then no
    /// completion would come to wake a waiter, who would submit the rest).
    pub(crate) fn submit_if_due(&mut self) -> io::Result<()> {
        let submitted_in_flight = self.in_flight - self.unsubmitted;
        if self.unsubmitted >= self.cfg.batch || submitted_in_flight == 0 {
            self.submit()
        } else {
            Ok(())
        }
    }

    /// Drains the CQ into the owners' inboxes and moves `owner`'s into `out`. A request leaves
    /// the ring's count with its last CQE (the notification, or a first CQE without `F_MORE`),
    /// whoever reaps it.
    pub(crate) fn reap_for(&mut self, owner: u16, out: &mut Vec<Cqe>) {
        for cqe in self.ring.completion() {
            let ud = cqe.user_data();
            let who = (ud >> OWNER_SHIFT) as u16;
            let req = (ud & ((1 << OWNER_SHIFT) - 1)) as usize;
            let flags = cqe.flags();
            if io_uring::cqueue::notif(flags) || !io_uring::cqueue::more(flags) {
                self.in_flight -= 1;
            }
            // No inbox: a sender that left with requests in flight (it leaked their buffers);
            // its CQEs are dropped once they counted the request out above.
            if let Some(inbox) = self.inbox.get_mut(&who) {
                inbox.push((req, cqe.result(), flags));
            }
        }
        if let Some(mine) = self.inbox.get_mut(&owner) {
            out.append(mine);
        }
    }

    /// Registers `pool` as fixed buffer 0 of this ring.
    pub(crate) fn register(&mut self, pool: &BufPool) -> Result<(), Error> {
        if let Some(p) = &self.pool {
            if p.region_id() == pool.region_id() {
                return Ok(());
            }
            return Err(Error::Unsupported {
                feature: "registering a second pool".into(),
                reason: "a ring registers one BufPool; draw every buffer from it".into(),
            });
        }
        let (base, len) = pool.region();
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
/// [`register_pool`]: UringShared::register_pool
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
            unsafe { core.push(NOBODY, 0, io_uring::opcode::Nop::new().build())? };
        }
        if submit {
            core.submit()?;
        }
        Ok(())
    }
}
