//! The completion queue's room, and who may use it: a request may be pushed only while the CQ
//! has room for every CQE it and the requests before it can still post, so the CQ never
//! overflows (the kernel would keep the extra CQEs only as long as it can allocate memory for
//! them).
//!
//! - **What posts.** A send request posts at most two CQEs (its result and, zero-copy, its
//!   notification); an owner's cancel one. A request's CQEs are owed from its push until they
//!   are read from the CQ.
//! - **A reserve per owner.** Every owner on the ring has [`RESERVE`] CQEs set aside from its
//!   join until it is gone: one send request and its cancel. A stream has one request in flight,
//!   so streams whose peers do not read (each request parked, its CQEs owed until the peer
//!   reads) can never take the room another stream needs; the ring takes only as many owners as
//!   it has reserves for. A stream whose earlier requests still owe their zero-copy
//!   notifications (sent, not yet acknowledged) takes the pool below for its next request, so
//!   the reserve guarantees progress, not an equal share.
//! - **A shared pool, bounded per owner.** Sends beyond an owner's reserve (datagram sockets,
//!   many requests in flight) take CQEs from a pool all owners share, each owner up to
//!   `per_owner` CQEs in all.
//!
//! The CQ is sized at setup for all of it: `pool + RESERVE * max_owners`.

/// CQEs set aside for each owner: one send request (two) and its cancel (one).
pub(crate) const RESERVE: usize = 3;
/// CQEs a send request posts at most.
pub(crate) const SEND_CQES: usize = 2;
/// The part of [`RESERVE`] an owner's sends may use: the rest is its cancel's.
const SEND_RESERVE: usize = RESERVE - 1;

/// The CQ's room: see the module docs. Each owner's count of CQEs owed by its sends is kept by
/// the caller (one per owner) and passed in.
#[derive(Debug)]
pub(crate) struct Places {
    /// Owners that may be on the ring at once (each has its reserve).
    max_owners: usize,
    /// CQEs shared beyond the reserves.
    pool: usize,
    /// CQEs one owner's sends may be owed at most.
    per_owner: usize,
    /// Owners on the ring (with their reserve).
    owners: usize,
    /// Pool CQEs owed now.
    pool_used: usize,
}

impl Places {
    /// The room of a CQ of `cq` entries for up to `max_owners` owners, each of whose sends may
    /// be owed at most `per_owner` CQEs. `None` if the CQ cannot hold the reserves.
    pub(crate) fn new(cq: usize, max_owners: usize, per_owner: usize) -> Option<Self> {
        let pool = cq.checked_sub(RESERVE.checked_mul(max_owners)?)?;
        Some(Self {
            max_owners,
            pool,
            per_owner: per_owner.max(SEND_RESERVE),
            owners: 0,
            pool_used: 0,
        })
    }

    /// Owners the ring takes at once.
    pub(crate) fn max_owners(&self) -> usize {
        self.max_owners
    }

    /// Sets a new owner's reserve aside; `false` when every reserve is taken.
    pub(crate) fn join(&mut self) -> bool {
        if self.owners == self.max_owners {
            return false;
        }
        self.owners += 1;
        true
    }

    /// An owner is gone (nothing of it is owed any more): its reserve is free.
    pub(crate) fn leave(&mut self) {
        debug_assert!(self.owners > 0);
        self.owners -= 1;
    }

    /// Whether an owner whose sends are owed `owed` CQEs may push another send.
    pub(crate) fn has_room(&self, owed: usize) -> bool {
        let after = owed + SEND_CQES;
        after <= self.per_owner && self.pool_used + grow(owed, after) <= self.pool
    }

    /// An owner's send of `n` CQEs was pushed ([`has_room`](Self::has_room) said so).
    pub(crate) fn take(&mut self, owed: &mut usize, n: usize) {
        self.pool_used += grow(*owed, *owed + n);
        *owed += n;
    }

    /// `n` of an owner's owed CQEs were read from the CQ (or will never come).
    pub(crate) fn give(&mut self, owed: &mut usize, n: usize) {
        debug_assert!(n <= *owed);
        let after = owed.saturating_sub(n);
        self.pool_used -= grow(after, *owed);
        *owed = after;
    }
}

/// Pool CQEs an owner's count takes going from `from` to `to` (`from <= to`).
fn grow(from: usize, to: usize) -> usize {
    to.saturating_sub(SEND_RESERVE) - from.saturating_sub(SEND_RESERVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owners whose one send each is parked never take the room of another owner's send, however
    /// many of them; the ring refuses an owner it has no reserve for.
    #[test]
    fn stalled_owners_keep_only_their_reserve() {
        let mut p = Places::new(512 + 3 * 300, 300, 512).unwrap();
        let mut owed = vec![0usize; 300];
        for o in owed.iter_mut().take(299) {
            assert!(p.join());
            assert!(p.has_room(*o));
            p.take(o, SEND_CQES);
        }
        assert!(p.join());
        assert!(p.has_room(owed[299]), "the last owner has its reserve");
        assert!(!p.join(), "no reserve for a 301st owner");
    }

    /// One owner's sends take the pool up to its bound; the others keep their reserve; the pool
    /// comes back as CQEs are read.
    #[test]
    fn the_pool_is_bounded_per_owner_and_comes_back() {
        let mut p = Places::new(16 + 3 * 2, 2, 12).unwrap();
        assert!(p.join() && p.join());
        let (mut a, mut b) = (0, 0);
        while p.has_room(a) {
            p.take(&mut a, SEND_CQES);
        }
        assert_eq!(a, 12, "bounded per owner");
        assert!(p.has_room(b));
        p.take(&mut b, SEND_CQES);
        while p.has_room(b) {
            p.take(&mut b, SEND_CQES);
        }
        assert_eq!(a + b, 16 + 2 * SEND_RESERVE, "the pool and both reserves");
        p.give(&mut a, 1);
        assert!(!p.has_room(b), "one CQE is not room for a send");
        p.give(&mut a, 1);
        assert!(p.has_room(b));
        p.give(&mut a, 10);
        let n = b;
        p.give(&mut b, n);
        assert_eq!(p.pool_used, 0);
    }

    proptest::proptest! {
        /// Any order of joins, pushes and CQEs read: what is owed never exceeds the CQ (with one
        /// cancel per owner), no owner exceeds its bound, and an owner with nothing owed always
        /// has room for a send.
        #[test]
        fn the_cq_never_overflows_and_an_idle_owner_always_has_room(
            steps in proptest::collection::vec((0usize..6, 0u8..3), 1..400),
        ) {
            let (cq, max, per) = (40, 6, 16);
            let mut p = Places::new(cq, max, per).unwrap();
            let mut owed: Vec<Option<usize>> = vec![None; max];
            for (who, what) in steps {
                match (owed[who], what) {
                    (None, _) => {
                        proptest::prop_assert!(p.join());
                        owed[who] = Some(0);
                    }
                    (Some(mut o), 0) => {
                        proptest::prop_assert!(o > 0 || p.has_room(o));
                        if p.has_room(o) {
                            p.take(&mut o, SEND_CQES);
                        }
                        owed[who] = Some(o);
                    }
                    (Some(mut o), 1) if o > 0 => {
                        p.give(&mut o, 1);
                        owed[who] = Some(o);
                    }
                    (Some(0), _) => {
                        p.leave();
                        owed[who] = None;
                    }
                    (Some(_), _) => {}
                }
                let all: usize = owed.iter().flatten().sum();
                let owners = owed.iter().flatten().count();
                proptest::prop_assert!(all + owners <= cq, "{all} owed by {owners} owners");
                proptest::prop_assert!(owed.iter().flatten().all(|&o| o <= per));
            }
        }
    }

    /// A CQ that cannot hold the reserves is refused.
    #[test]
    fn a_cq_too_small_for_the_reserves_is_refused() {
        assert!(Places::new(8, 3, 8).is_none());
        assert!(Places::new(9, 3, 8).is_some());
    }
}
