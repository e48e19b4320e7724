//! The engine's handle on its ring ([`RingRef`]): its own, reached without a lock, or one
//! shared through a [`UringShared`], locked per operation ([`RingGuard`]).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, MutexGuard};

use crate::error::Error;
use crate::sys::uring::{Ring, SharedRing, UringConfig, UringShared};

/// The ring a sender sends on: its own, or one shared through a [`UringShared`].
///
/// A sender's own ring is never locked: the engine reaches it per send and per reap, and an
/// uncontended `Mutex` still costs two atomic read-modify-writes per lock (docs/fast-path.md).
pub(crate) enum RingRef {
    /// The sender's own ring, reached through `&mut` only.
    Own(Box<SharedRing>),
    /// A ring other senders may use at the same time, locked per operation.
    Shared(Arc<SharedRing>),
    /// The sender's own ring, handed on when the sender was dropped ([`RingRef::release`]).
    Gone,
}

/// The ring, borrowed for one operation: directly, or under the shared ring's lock. Dropping it
/// frees the requests of departed senders whose last CQE the operation reaped, after the lock is
/// released ([`Ring::take_departed`]).
pub(crate) enum RingGuard<'a> {
    Own(&'a mut Ring),
    /// `None` only inside `drop`.
    Locked(Option<MutexGuard<'a, Ring>>),
}

impl Deref for RingGuard<'_> {
    type Target = Ring;
    #[inline]
    fn deref(&self) -> &Ring {
        match self {
            RingGuard::Own(r) => r,
            RingGuard::Locked(g) => g.as_ref().expect("locked until dropped"),
        }
    }
}

impl DerefMut for RingGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Ring {
        match self {
            RingGuard::Own(r) => r,
            RingGuard::Locked(g) => g.as_mut().expect("locked until dropped"),
        }
    }
}

impl Drop for RingGuard<'_> {
    fn drop(&mut self) {
        match self {
            RingGuard::Own(r) => {
                if r.has_departed() {
                    drop(r.take_departed());
                }
            }
            RingGuard::Locked(g) => {
                let Some(mut ring) = g.take() else {
                    return;
                };
                let departed = ring.has_departed().then(|| ring.take_departed());
                drop(ring);
                // The buffers' own `Drop` (a pool's lock, user code) runs with the ring unlocked.
                drop(departed);
            }
        }
    }
}

impl RingRef {
    /// The sender's own ring, or `shared`.
    pub(crate) fn new(cfg: UringConfig, shared: Option<&UringShared>) -> Result<Self, Error> {
        Ok(match shared {
            Some(r) => RingRef::Shared(r.ring.clone()),
            None => RingRef::Own(Box::new(SharedRing::new(cfg, false)?)),
        })
    }

    /// The ring for one operation (locked if shared).
    #[inline]
    pub(crate) fn get(&mut self) -> RingGuard<'_> {
        match self {
            RingRef::Own(r) => RingGuard::Own(r.get_mut()),
            RingRef::Shared(r) => RingGuard::Locked(Some(r.lock())),
            RingRef::Gone => unreachable!("the ring goes only when its sender is dropped"),
        }
    }

    /// The ring's settings.
    pub(crate) fn shared(&self) -> &SharedRing {
        match self {
            RingRef::Own(r) => r,
            RingRef::Shared(r) => r,
            RingRef::Gone => unreachable!("the ring goes only when its sender is dropped"),
        }
    }

    /// The sender that is being dropped left the ring: its own ring, if requests of it are still
    /// in flight, is adopted until they finish (see `sys::uring::adopt`) rather than dropped, which
    /// would leak them. A shared ring stays with its other handles.
    pub(crate) fn release(&mut self) {
        if let RingRef::Own(r) = self {
            if r.get_mut().in_flight() > 0 {
                if let RingRef::Own(r) = std::mem::replace(self, RingRef::Gone) {
                    crate::sys::uring::adopt(r.into_ring());
                }
            }
        }
    }

    /// The handle of a ring shared through a [`UringShared`].
    #[cfg(feature = "tokio")]
    pub(crate) fn shared_handle(&self) -> Option<UringShared> {
        match self {
            RingRef::Shared(r) => Some(UringShared { ring: r.clone() }),
            RingRef::Own(_) | RingRef::Gone => None,
        }
    }

    /// Other senders use the ring too (they may reap this sender's completions).
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, RingRef::Shared(r) if Arc::strong_count(r) > 1)
    }
}
