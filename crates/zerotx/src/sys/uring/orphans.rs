//! Rings whose every owner left while the kernel still held some of their requests: a sender's
//! own ring closed with buffers kept. Dropping such a ring would leak those requests for good
//! (see [`Ring`]); kept here instead, each is reaped whenever a new ring is made, and dropped once
//! nothing of it is in flight, so its departed requests' buffers go back to their owners after
//! the kernel's last CQE, as on a shared ring. No thread of its own: a process that makes no more
//! rings keeps them (the same as leaking, bounded by the buffers kept).

use std::io;
use std::sync::Mutex;

use super::op::Nop;
use super::ring::{Ring, NOBODY};

static ORPHANS: Mutex<Vec<Ring>> = Mutex::new(Vec::new());

/// A new ring ([`Ring::new`]), made after a look at the rings kept here: a new sender's ring is
/// the time to free what the departed ones held.
pub(crate) fn new_ring(entries: u32, batch: usize, owners: u32) -> io::Result<Ring> {
    collect();
    Ring::new(entries, batch, owners)
}

/// Keeps `ring` until its requests finished (dropped at once if none is in flight).
pub(crate) fn adopt(mut ring: Ring) {
    settle(&mut ring);
    if ring.in_flight() == 0 {
        drop(ring);
        return;
    }
    ORPHANS.lock().unwrap_or_else(|e| e.into_inner()).push(ring);
}

/// Reaps every kept ring, and drops those with nothing in flight any more (and the requests that
/// finished), after letting go of the list's lock.
fn collect() {
    let (done, departed) = {
        let mut orphans = ORPHANS.lock().unwrap_or_else(|e| e.into_inner());
        if orphans.is_empty() {
            return;
        }
        let mut departed = Vec::new();
        for ring in orphans.iter_mut() {
            settle(ring);
            departed.extend(ring.take_departed());
        }
        let (done, kept): (Vec<Ring>, Vec<Ring>) =
            orphans.drain(..).partition(|r| r.in_flight() == 0);
        *orphans = kept;
        (done, departed)
    };
    drop(departed);
    drop(done);
}

/// Submits what a leaving owner left in the SQ, and reaps: every owner left, so every request
/// whose last CQE arrived departs.
fn settle(ring: &mut Ring) {
    // A failure leaves the SQE for the next look.
    let _ = ring.submit();
    ring.reap_with::<Nop>(NOBODY, |_, _| {});
}
