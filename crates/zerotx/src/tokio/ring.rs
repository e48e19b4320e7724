//! One io_uring per runtime thread, shared by the senders made on it.

use std::cell::RefCell;

use crate::engine::{UringConfig, UringShared};
use crate::error::Error;

thread_local! {
    static RING: RefCell<Option<UringShared>> = const { RefCell::new(None) };
}

/// The calling thread's shared io_uring, made on first use with [`UringConfig::default`]
/// (`io_uring_setup`). Give it to the `uring` and `uring-zc` senders made on this thread
/// ([`SenderConfig::shared`](crate::SenderConfig::shared)), so one `io_uring_enter` submits for
/// all of them; on a multi-thread runtime each worker thread gets its own ring.
///
/// The ring lives as long as the thread, or the last sender on it. A sender may move to another
/// thread afterwards and keep using the ring it was made with (the ring is locked per
/// operation); a request parked by a thread that exited is submitted again (see
/// [`UringShared`]).
pub fn thread_ring() -> Result<UringShared, Error> {
    RING.with(|slot| {
        let mut slot = slot.borrow_mut();
        if let Some(ring) = slot.as_ref() {
            return Ok(ring.clone());
        }
        let ring = UringShared::new(UringConfig::default())?;
        *slot = Some(ring.clone());
        Ok(ring)
    })
}
