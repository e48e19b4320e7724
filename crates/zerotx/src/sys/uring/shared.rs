//! A ring with the settings of every sender on it ([`SharedRing`]), private to one sender or
//! shared by several through the public handle [`UringShared`], so one `io_uring_enter` submits
//! requests for many sockets. The ring itself (owners, inboxes, submission, the memory of
//! requests in flight) is [`Ring`]; this module adds the settings, the lock and the handle. The
//! engine's own handle on its ring (locked only when shared) is the engine's.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::buf::BufPool;
use crate::error::Error;

use super::config::UringConfig;
use super::{JoinRefused, Ring, MAX_CQ_ENTRIES, MAX_REGISTERED};

/// A ring and the settings of every sender on it.
pub(crate) struct SharedRing {
    /// As given, with `batch` capped at `UIO_MAXIOV` (one request's iovecs).
    pub(crate) cfg: UringConfig,
    ring: Mutex<Ring>,
}

impl SharedRing {
    /// Creates the ring (`io_uring_setup`) for one sender (`shared: false`) or for up to
    /// `cfg.senders`.
    pub(crate) fn new(cfg: UringConfig, shared: bool) -> Result<Self, Error> {
        if cfg.entries == 0 || cfg.batch == 0 || cfg.queue_limit == 0 || cfg.senders == 0 {
            return Err(Error::Config {
                problem: format!(
                    "UringConfig {cfg:?} has a zero entries, batch, queue limit or senders"
                ),
                fix: "give each at least 1".into(),
            });
        }
        let senders = if shared { cfg.senders } else { 1 };
        if Ring::cq_size(cfg.entries, senders).is_none() {
            return Err(Error::Config {
                problem: format!("UringConfig::senders {senders} for one shared ring"),
                fix: format!(
                    "io_uring's completion queue holds at most {MAX_CQ_ENTRIES} entries and keeps \
                     three for each sender: share the senders among more rings"
                ),
            });
        }
        let cfg = UringConfig {
            batch: cfg.batch.min(libc::UIO_MAXIOV as usize),
            ..cfg
        };
        let ring =
            super::new_ring(cfg.entries, cfg.batch, senders).map_err(|source| Error::Io {
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
            cfg,
            ring: Mutex::new(ring),
        })
    }

    /// Locks the ring, recovering from a poisoned lock (the ring's state is updated atomically
    /// per call, so a panic elsewhere leaves it consistent).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ring of an owner that holds it alone: no lock taken.
    pub(crate) fn get_mut(&mut self) -> &mut Ring {
        self.ring.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// The ring itself, for the last owner that leaves it.
    pub(crate) fn into_ring(self) -> Ring {
        self.ring.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the ring as a new owner whose requests go to `fd`: by its registered file slot when
    /// `slot` and the ring has one free (see [`Ring`]), else by the descriptor. Only datagram
    /// sockets take a slot (see `FILE_SLOTS` in `sys::uring`).
    pub(crate) fn join(&self, fd: &OwnedFd, slot: bool) -> Result<u16, Error> {
        self.lock()
            .join(slot.then(|| fd.as_raw_fd()))
            .map_err(|refused| match refused {
                JoinRefused::Ids => Error::Config {
                    problem: "more than 65535 senders at once on one ring".into(),
                    fix: "make another UringShared".into(),
                },
                JoinRefused::Places(senders) => Error::RingFull { senders },
            })
    }

    /// Registers `pool` as fixed buffer 0 of the ring, once: the same pool again is a no-op.
    pub(crate) fn register(&self, pool: &BufPool) -> Result<(), Error> {
        if pool.is_huge() {
            // See `buf/pool.rs`: io_uring merges a registered region's huge pages into one
            // segment and charges each send from it as if it held the huge page up to its end.
            return Err(Error::Config {
                problem: "registering a BufPool made by BufPool::huge".into(),
                fix: "io_uring would charge every send from it for the whole 2 MiB page it starts \
                      in, and the socket's buffer fills at once; register a pool made by \
                      BufPool::new, or send from the huge pool without registering it"
                    .into(),
            });
        }
        let mut ring = self.lock();
        if let Some(p) = ring.registered() {
            if p.region_id() == pool.region_id() {
                return Ok(());
            }
            return Err(Error::Config {
                problem: "a second BufPool registered with one ring".into(),
                fix: "a ring registers one BufPool; draw every buffer from it".into(),
            });
        }
        let (_, len) = pool.region();
        if len > MAX_REGISTERED {
            return Err(Error::Config {
                problem: format!("registering a BufPool of {} MiB", len >> 20),
                fix: "io_uring registers at most 1 GiB per buffer (IORING_REGISTER_BUFFERS \
                      answers EFAULT above it); use pools of at most 1 GiB"
                    .into(),
            });
        }
        ring.register(pool).map_err(|source| Error::Io {
            context: "io_uring_register(IORING_REGISTER_BUFFERS)",
            source,
        })
    }
}

/// One io_uring shared by several senders, so one `io_uring_enter` carries requests for many
/// sockets (set [`SenderConfig::ring`](crate::SenderConfig::ring)).
///
/// Senders on a shared ring may live on different threads; the ring is locked per operation. A
/// sender that waits polls the ring in short slices, since another sender may reap its
/// completions for it. Registered buffers belong to the ring: [`register_pool`] once, and every
/// `uring-zc` sender on it sends that pool's buffers from registered memory.
///
/// - **Room.** The ring keeps room in its completion queue for up to
///   [`UringConfig::senders`] senders at once, each sure of room for one request (a stream whose
///   peer does not read has its one request parked there), and shares room for twice
///   [`UringConfig::entries`] more completions (less where io_uring's limit of 65536 cuts it)
///   among the senders that keep several requests in flight (datagram sockets, and a stream whose
///   earlier requests still owe their zero-copy notifications), each up to `entries` requests. So
///   a sender always has room for a request once its own completions arrived, but one sender
///   that owes many notifications can take the shared part and slow the others to one request at
///   a time. A sender beyond
///   `senders` is refused with [`Error::RingFull`].
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
///   name the socket through a registered file slot of the ring (datagram sockets, while the
///   ring has a slot free; cleared only once no unsubmitted SQE can name it) or through the
///   sender's own duplicate of the descriptor, closed only once no unsubmitted SQE can name it
///   (leaked if `io_uring_enter` failed), so the caller's descriptor number can be reused at once
///   without a stale request reaching the new socket. The buffers of requests still in flight are
///   kept (counted in [`Closed::kept`](crate::Closed::kept) and
///   [`leaked_buffers`](crate::leaked_buffers)) until the kernel's last CQE for them, which any
///   sender still on the ring reaps; then they are dropped (a [`BufPool`] block goes back to its
///   pool), outside the ring's lock. Those of requests in flight when the last handle to the ring
///   goes are leaked, never freed (the kernel may still read them).
///
/// [`register_pool`]: UringShared::register_pool
/// [`Sender::readiness`]: crate::Sender::readiness
#[derive(Clone)]
pub struct UringShared {
    pub(crate) ring: Arc<SharedRing>,
}

impl std::fmt::Debug for UringShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ring = self.ring.lock();
        f.debug_struct("UringShared")
            .field("entries", &ring.entries())
            .field("in_flight", &ring.in_flight())
            .field("enters", &ring.enters())
            .finish()
    }
}

impl UringShared {
    /// Creates the ring (`io_uring_setup`).
    pub fn new(cfg: UringConfig) -> Result<Self, Error> {
        Ok(Self {
            ring: Arc::new(SharedRing::new(cfg, true)?),
        })
    }

    /// Registers `pool`'s memory with the ring (`IORING_REGISTER_BUFFERS`).
    pub fn register_pool(&self, pool: &BufPool) -> Result<(), Error> {
        self.ring.register(pool)
    }

    /// `io_uring_enter` calls made so far, by every sender on the ring.
    pub fn enters(&self) -> u64 {
        self.ring.lock().enters()
    }

    /// The ring's descriptor (`io_uring_setup`'s): readable when CQEs wait. It stays open as long
    /// as the ring.
    #[cfg(feature = "tokio")]
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.ring.lock().fd()
    }

    /// Whether `self` and `other` are handles of one ring.
    #[cfg(feature = "tokio")]
    pub(crate) fn same(&self, other: &UringShared) -> bool {
        Arc::ptr_eq(&self.ring, &other.ring)
    }

    /// Moves the completions waiting in the ring into their owners' inboxes, and appends to
    /// `woken` the owners whose inbox got some since the last call (see `Ring::route`): for an
    /// event loop that watches the ring's descriptor once for every sender on it. Requests of
    /// departed senders whose last CQE came are freed after the lock is let go.
    #[cfg(feature = "tokio")]
    pub(crate) fn route(&self, woken: &mut Vec<u16>) {
        let mut ring = self.ring.lock();
        ring.route(woken);
        let departed = ring.has_departed().then(|| ring.take_departed());
        drop(ring);
        drop(departed);
    }

    /// Sets what a reap calls when it moves completions into another sender's inbox (see
    /// `Ring::on_inbox`).
    #[cfg(feature = "tokio")]
    pub(crate) fn on_inbox(&self, hook: super::InboxHook) {
        self.ring.lock().on_inbox(Some(hook));
    }

    /// Clears the hook [`on_inbox`](Self::on_inbox) set, unless another was set since.
    #[cfg(feature = "tokio")]
    pub(crate) fn clear_on_inbox(&self, hook: &super::InboxHook) {
        self.ring.lock().clear_on_inbox(hook);
    }

    /// Test hook: the completion queue's entries (as the kernel made it).
    #[doc(hidden)]
    pub fn cq_entries(&self) -> u32 {
        self.ring.lock().cq_entries()
    }

    /// Test hook: queues `n` `IORING_OP_NOP`s that belong to no sender, as if another sender had
    /// filled the SQ, and submits them when `submit` (their completions can then fill the CQ).
    #[doc(hidden)]
    pub fn inject_nops(&self, n: u32, submit: bool) -> std::io::Result<()> {
        let mut ring = self.ring.lock();
        for _ in 0..n {
            if !ring.push_nop()? {
                return Err(std::io::Error::other("the SQ stayed full"));
            }
        }
        if submit {
            ring.submit()?;
        }
        Ok(())
    }
}
