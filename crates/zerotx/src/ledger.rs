//! The completion ledger: which buffer each zero-copy id belongs to, and when a buffer is free.
//!
//! Why this is ours: no crate tracks `MSG_ZEROCOPY` ids. The kernel gives every successful
//! `sendmsg(MSG_ZEROCOPY)` the next value of a per-socket u32 counter (wrapping at 2^32) and later
//! reports inclusive, coalesced ranges `[lo, hi]` that may cross the wrap and may arrive in any
//! order. One buffer can take several ids (a short TCP write sends the rest under a new id), and
//! must stay held until every one of them completed.
//!
//! The ledger is pure: no syscalls, no clocks. It keeps a window of the ids in flight, oldest
//! first, each pointing at a slot that holds the caller's item. A range is checked against the
//! window as a whole before anything changes, so a range the kernel never should have sent (a
//! duplicate, a stale id, an id from the future) is an error and leaves the ledger untouched.
//!
//! # The COPIED flag is a sample
//! When the kernel extends a queued completion with a later one, the merged message keeps the
//! first one's `ee_code`, so a coalesced range's COPIED flag describes its first send. The ledger
//! marks every item in the range with the flag it was given; callers that need exact answers must
//! drain the error queue often.
//!
//! # Ids no buffer waits for
//! Some calls leave the caller unsure whether the kernel took an id (docs/kernel.md,
//! "MSG_ZEROCOPY (sendmsg + socket error queue)"):
//! - a UDP `sendmsg(MSG_ZEROCOPY)` that fails after the skb was built (a netfilter drop answers
//!   `EPERM`, a qdisc drop `ENOBUFS` with `IP_RECVERR`) took an id, and the freed skb posted its
//!   completion before the call returned; a failure before that took none;
//! - a vsock zero-copy call that returned fewer bytes than asked went by copy and took one id,
//!   or none if the kernel could not allocate the completion for its last packet.
//!
//! [`Ledger::record_unowned_id`] puts such an id in the window owned by no buffer: a completion
//! may cover it, and nothing is released for it. [`Ledger::retract_unowned`] takes it back when
//! the caller learned it was never taken (UDP: the error queue, read right after the failure, did
//! not complete it). An unowned id that stays is the safe guess: if the kernel did not take it,
//! later buffers are released one completion late, never early.

use std::collections::VecDeque;

use crate::cmsg::ZcRange;

/// Identifies an item in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(usize);

/// A free slot of a [`Ledger`], from [`Ledger::free_item`].
#[derive(Debug)]
#[must_use = "a refilled item is held only once insert_refilled takes its slot"]
pub struct FreeSlot(usize);

/// How a settled item's ids went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Zero-copy ids the item took.
    pub ids: u64,
    /// Any of its ids completed with the COPIED flag.
    pub kernel_copied: bool,
}

/// An item whose ids have all completed and which the caller has sealed, taken out of the ledger
/// (the by-value calls; an engine settles items in their slot with the `_with` calls).
#[derive(Debug)]
pub struct Settled<T> {
    /// The caller's item (typically the buffer and its send record).
    pub item: T,
    /// Zero-copy ids the item took.
    pub ids: u64,
    /// Any of its ids completed with the COPIED flag.
    pub kernel_copied: bool,
}

/// A completion range the ledger could not accept; the ledger is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// Part of the range lies outside the ids in flight.
    #[error(
        "completion [{lo}, {hi}] is outside the ids in flight [{oldest}, {next_id}) (stale, \
         duplicate or never sent)"
    )]
    OutOfWindow {
        /// Range start.
        lo: u32,
        /// Range end.
        hi: u32,
        /// Oldest id in flight.
        oldest: u32,
        /// The id the next send will take.
        next_id: u32,
    },
    /// An id in the range had already completed.
    #[error("id {id} completed twice")]
    Duplicate {
        /// The id.
        id: u32,
    },
}

/// One id of the window: 8 bytes, so a cache line holds eight (the window is read and written on
/// every zero-copy send and completion).
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The slot of the item waiting for this id; [`UNOWNED`] for an unowned id (see the module
    /// docs).
    slot: u32,
    done: bool,
}

/// [`Entry::slot`] of an id no item waits for.
const UNOWNED: u32 = u32::MAX;

impl Entry {
    fn slot(self) -> Option<usize> {
        (self.slot != UNOWNED).then_some(self.slot as usize)
    }
}

/// A slot. A free one keeps its last item, settled (an engine's record without buffers), for the
/// next insert to fill in place.
#[derive(Debug)]
struct Held<T> {
    item: T,
    live: bool,
    ids: u64,
    pending: u64,
    sealed: bool,
    copied: bool,
}

/// See the module docs.
///
/// The slots are a slab written here rather than taken from the `slab` crate: an item is built in
/// its slot ([`free_item`](Self::free_item)) and settled there
/// ([`complete_with`](Self::complete_with)), so a zero-copy send's record is not moved between
/// the caller, the ledger and a list of settled items. Each such move of a freshly written record
/// stalled on store forwarding and showed in the profile of every zero-copy send.
#[derive(Debug)]
pub struct Ledger<T> {
    slots: Vec<Held<T>>,
    /// Indices of free slots.
    free: Vec<usize>,
    window: VecDeque<Entry>,
    base: u32,
    held: usize,
    /// Owned ids sent and not completed.
    pending: usize,
    /// Unowned ids not completed (or retracted).
    unowned: usize,
    /// Ids of the window that completed and have not left it: behind an older one that has not
    /// completed, or, after a caller's `settle` panicked part way through a range, at the front
    /// until the next completion. While there are none, a range cannot hold a duplicate and the
    /// oldest id has not completed.
    done_behind: usize,
}

impl<T> Ledger<T> {
    /// A ledger whose first send will take `first_id` (0 on a fresh socket).
    pub fn new(first_id: u32) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            window: VecDeque::new(),
            base: first_id,
            held: 0,
            pending: 0,
            unowned: 0,
            done_behind: 0,
        }
    }

    /// The id the next successful zero-copy send takes.
    pub fn next_id(&self) -> u32 {
        self.base.wrapping_add(self.window.len() as u32)
    }

    /// Items held: inserted and not yet settled.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Ids sent for held items and not yet completed: what a sender can wait for.
    pub fn ids_in_flight(&self) -> usize {
        self.pending
    }

    /// Ids the ledger keeps: from the oldest not completed to the newest (those after the oldest
    /// may have completed); none once every id completed. (After a caller's `settle` panicked in
    /// [`complete_with`](Self::complete_with), completed ids may stay at the front until the next
    /// completion.)
    pub fn ids_kept(&self) -> usize {
        self.window.len()
    }

    /// Unowned ids not yet completed (see the module docs).
    pub fn unowned_in_flight(&self) -> usize {
        self.unowned
    }

    /// Starts holding `item`. It is returned only once it is sealed and all its ids completed.
    #[inline]
    pub fn insert(&mut self, item: T) -> SlotId {
        if let Some((free, old)) = self.free_item() {
            *old = item;
            return self.insert_refilled(free);
        }
        assert!(
            self.slots.len() < UNOWNED as usize,
            "more than 2^32 - 1 items held"
        );
        self.slots.push(Held {
            item,
            live: true,
            ids: 0,
            pending: 0,
            sealed: false,
            copied: false,
        });
        self.held += 1;
        SlotId(self.slots.len() - 1)
    }

    /// A free slot and the settled item it keeps, for the caller to make into a new item in place
    /// and then [`insert_refilled`](Self::insert_refilled); `None` if no slot is free
    /// ([`insert`](Self::insert) a new item then). Nothing is counted until `insert_refilled`, so
    /// a panic while refilling (a buffer's `as_bytes`) leaves the ledger as it was.
    ///
    /// Two calls rather than one taking closures: the new item's parts then go from the caller's
    /// registers straight into the slot. Passed through a closure's argument, a buffer was copied
    /// through the stack with loads wider than its stores, which stalled every zero-copy send.
    #[inline(always)]
    pub fn free_item(&mut self) -> Option<(FreeSlot, &mut T)> {
        let &i = self.free.last()?;
        let held = &mut self.slots[i];
        assert!(!held.live, "free slot {i} is live");
        Some((FreeSlot(i), &mut held.item))
    }

    /// Starts holding the item the caller refilled in `free` ([`free_item`](Self::free_item)).
    /// Settled as [`insert`](Self::insert)'s.
    #[inline(always)]
    pub fn insert_refilled(&mut self, free: FreeSlot) -> SlotId {
        let i = free.0;
        assert_eq!(
            self.free.last(),
            Some(&i),
            "slot {i} is not the next free one"
        );
        self.free.pop();
        self.held += 1;
        let held = &mut self.slots[i];
        held.live = true;
        held.ids = 0;
        held.pending = 0;
        held.sealed = false;
        held.copied = false;
        SlotId(i)
    }

    /// Starts holding the item the caller refilled in `free` as one whole send: the one id the
    /// caller's call just took is recorded and no more will be. What
    /// [`insert_refilled`](Self::insert_refilled), [`record_id`](Self::record_id) and
    /// [`seal_with`](Self::seal_with) do in a row (the item, its id pending, does not settle), in
    /// one step: a zero-copy datagram's. Returns the id.
    #[inline(always)]
    pub fn insert_refilled_one_id(&mut self, free: FreeSlot) -> u32 {
        let SlotId(i) = self.insert_refilled(free);
        let id = self.push_owned_id(i);
        self.slots[i].sealed = true;
        id
    }

    /// The next id, taken for the live, unsealed item in slot `i`: pending until it completes.
    #[inline(always)]
    fn push_owned_id(&mut self, i: usize) -> u32 {
        let held = &mut self.slots[i];
        held.pending += 1;
        held.ids += 1;
        self.pending += 1;
        self.push_id(i as u32)
    }

    /// The next id, at the end of the window, for `slot` ([`UNOWNED`] for none).
    #[inline(always)]
    fn push_id(&mut self, slot: u32) -> u32 {
        let id = self.next_id();
        self.window.push_back(Entry { slot, done: false });
        id
    }

    #[inline]
    fn held_mut(&mut self, slot: SlotId) -> &mut Held<T> {
        self.slots
            .get_mut(slot.0)
            .filter(|h| h.live)
            .expect("ledger slot used after it was settled")
    }

    /// The item in `slot`, to update its record while it is held.
    #[inline]
    pub fn item_mut(&mut self, slot: SlotId) -> &mut T {
        &mut self.held_mut(slot).item
    }

    /// The item in `slot`.
    #[inline]
    pub fn item(&self, slot: SlotId) -> &T {
        &self
            .slots
            .get(slot.0)
            .filter(|h| h.live)
            .expect("ledger slot used after it was settled")
            .item
    }

    /// Records that a zero-copy send for `slot` succeeded and took the next id; returns that id.
    #[inline]
    pub fn record_id(&mut self, slot: SlotId) -> u32 {
        let held = self.held_mut(slot);
        assert!(!held.sealed, "record_id on a sealed slot");
        self.push_owned_id(slot.0)
    }

    /// Records an id the kernel may have taken for a call whose bytes no buffer needs to wait
    /// for; returns it. See the module docs.
    pub fn record_unowned_id(&mut self) -> u32 {
        self.unowned += 1;
        self.push_id(UNOWNED)
    }

    /// Takes back the unowned `id` if it is still the newest id and has not completed: the caller
    /// learned the kernel never took it. Returns whether it was taken back; `false` means a
    /// completion covered it (the kernel took it) or later ids were recorded after it, and it
    /// stays.
    pub fn retract_unowned(&mut self, id: u32) -> bool {
        let newest = self.next_id().wrapping_sub(1);
        match self.window.back() {
            Some(e) if id == newest && e.slot().is_none() && !e.done => {
                self.window.pop_back();
                self.unowned -= 1;
                true
            }
            _ => false,
        }
    }

    /// No more ids will be recorded for `slot`. If none are pending, settles it at once: hands
    /// the item to `settle` in its slot, frees the slot and returns `true`; otherwise the item
    /// settles in [`complete_with`](Self::complete_with). Always inlined, as `free_item`.
    #[inline(always)]
    pub fn seal_with(&mut self, slot: SlotId, settle: impl FnOnce(&mut T, Done)) -> bool {
        let held = self.held_mut(slot);
        held.sealed = true;
        if held.pending == 0 {
            let i = slot.0;
            settle_slot(
                &mut self.free,
                &mut self.held,
                &mut self.slots[i],
                i,
                settle,
            );
            true
        } else {
            false
        }
    }

    /// Applies the completion `range`, handing each item it settles to `settle` in its slot, in id
    /// order. Returns how many ids it completed. On error nothing changes.
    #[inline]
    pub fn complete_with(
        &mut self,
        range: ZcRange,
        mut settle: impl FnMut(&mut T, Done),
    ) -> Result<u64, LedgerError> {
        let off = u64::from(range.lo.wrapping_sub(self.base));
        let count = range.count();
        let len = self.window.len() as u64;
        let out_of_window = LedgerError::OutOfWindow {
            lo: range.lo,
            hi: range.hi,
            oldest: self.base,
            next_id: self.next_id(),
        };
        let end = off + count;
        if off >= len || end > len {
            return Err(out_of_window);
        }
        let (lo, end) = (off as usize, end as usize);
        // Completed ids still in the window: none (the usual case, completions in order) means
        // the range holds no duplicate and the oldest id had not completed.
        let behind = self.done_behind;
        if behind > 0 {
            if let Some(i) = (lo..end).find(|&i| self.window[i].done) {
                return Err(LedgerError::Duplicate {
                    id: self.base.wrapping_add(i as u32),
                });
            }
        }
        let Self {
            slots,
            free,
            window,
            held: held_count,
            pending,
            unowned,
            done_behind,
            ..
        } = self;
        for entry in window.range_mut(lo..end) {
            // Counted as each is marked, so a panic below leaves the count true.
            entry.done = true;
            *done_behind += 1;
            let Some(slot) = entry.slot() else {
                *unowned -= 1;
                continue;
            };
            *pending -= 1;
            let held = &mut slots[slot];
            assert!(held.live, "id {} points at free slot {slot}", range.lo);
            held.pending -= 1;
            held.copied |= range.copied;
            if held.pending == 0 && held.sealed {
                // If the caller's `settle` panics (a buffer's `as_bytes`), the ids after this
                // one stay in flight: their items are never settled early, only kept.
                settle_slot(free, held_count, held, slot, &mut settle);
            }
        }
        // The completed ids at the front leave the window. With none completed before, they
        // are exactly this range if it began at the front, and none if it did not.
        let leaving = match (behind, lo) {
            (0, 0) => end,
            (0, _) => 0,
            _ => self.window.iter().take_while(|e| e.done).count(),
        };
        self.done_behind -= leaving;
        self.window.drain(..leaving);
        self.base = self.base.wrapping_add(leaving as u32);
        Ok(count)
    }

    /// Hands every item still held to `take`, whatever its ids, for a caller that will never
    /// settle them (it leaks their buffers so the kernel may keep reading). Ids in flight are
    /// forgotten.
    pub fn take_all_with(&mut self, mut take: impl FnMut(&mut T)) {
        self.window.clear();
        self.done_behind = 0;
        self.held = 0;
        self.pending = 0;
        self.unowned = 0;
        self.free.clear();
        for (i, held) in self.slots.iter_mut().enumerate() {
            if held.live {
                held.live = false;
                take(&mut held.item);
            }
            self.free.push(i);
        }
    }
}

/// Hands the item `held` (slot `i`) to `settle` and frees the slot, on the ledger's parts (so
/// `complete_with` can call it while it holds the window apart).
#[inline(always)]
fn settle_slot<T>(
    free: &mut Vec<usize>,
    held_count: &mut usize,
    held: &mut Held<T>,
    i: usize,
    settle: impl FnOnce(&mut T, Done),
) {
    // Counted out before the caller's `settle` runs, which may panic (a buffer's `as_bytes`):
    // the ledger stays consistent either way.
    free.push(i);
    *held_count -= 1;
    assert!(held.live, "slot {i} settled twice");
    held.live = false;
    settle(
        &mut held.item,
        Done {
            ids: held.ids,
            kernel_copied: held.copied,
        },
    );
}

/// The by-value calls, for items that leave a settled slot empty (`Default`).
impl<T: Default> Ledger<T> {
    /// As [`seal_with`](Self::seal_with), returning the item if it settled.
    pub fn seal(&mut self, slot: SlotId) -> Option<Settled<T>> {
        let mut out = None;
        self.seal_with(slot, |item, done| out = Some(settled(item, done)));
        out
    }

    /// As [`complete_with`](Self::complete_with), appending the items it settles to `out`.
    pub fn complete(
        &mut self,
        range: ZcRange,
        out: &mut Vec<Settled<T>>,
    ) -> Result<u64, LedgerError> {
        self.complete_with(range, |item, done| out.push(settled(item, done)))
    }

    /// As [`take_all_with`](Self::take_all_with), returning the items.
    pub fn take_all(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        self.take_all_with(|item| out.push(std::mem::take(item)));
        out
    }
}

fn settled<T: Default>(item: &mut T, done: Done) -> Settled<T> {
    Settled {
        item: std::mem::take(item),
        ids: done.ids,
        kernel_copied: done.kernel_copied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::policy::train::Train;
    use crate::engine::record::Record;
    use crate::report::{SendPath, Stats};

    fn r(lo: u32, hi: u32) -> ZcRange {
        ZcRange {
            lo,
            hi,
            copied: false,
        }
    }

    #[test]
    fn a_settle_that_panics_part_way_leaves_the_ledger_consistent() {
        // A caller's `settle` can panic (a buffer's `as_bytes`): the ids it had marked stay
        // completed, the items after it stay held, and the next completion clears the window.
        let mut l: Ledger<u32> = Ledger::new(10);
        for b in 0..4 {
            let s = l.insert(b);
            l.record_id(s);
            assert!(!l.seal_with(s, |_, _| {}));
        }
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            l.complete_with(r(10, 13), |item, _| assert_ne!(*item, 1, "as_bytes"))
        }));
        assert!(panicked.is_err());
        assert_eq!((l.ids_in_flight(), l.held(), l.ids_kept()), (2, 2, 4));
        assert!(
            l.complete_with(r(11, 11), |_, _| {}).is_err(),
            "a completed id again"
        );
        let mut got = Vec::new();
        assert_eq!(l.complete_with(r(12, 13), |item, _| got.push(*item)), Ok(2));
        assert_eq!(got, [2, 3]);
        assert_eq!((l.ids_in_flight(), l.held(), l.ids_kept()), (0, 0, 0));
        assert_eq!(l.next_id(), 14);
    }

    #[test]
    fn coalesced_range_across_the_wrap_releases_in_any_order() {
        let mut l = Ledger::new(u32::MAX - 1);
        let a = l.insert("a");
        let b = l.insert("b");
        let c = l.insert("c");
        assert_eq!(l.record_id(a), u32::MAX - 1);
        assert_eq!(l.record_id(b), u32::MAX);
        assert_eq!(l.record_id(c), 0);
        for s in [a, b, c] {
            assert!(l.seal(s).is_none());
        }
        let mut out = Vec::new();
        assert_eq!(l.complete(r(0, 0), &mut out), Ok(1));
        assert_eq!(out.pop().unwrap().item, "c");
        assert_eq!(l.complete(r(u32::MAX - 1, u32::MAX), &mut out), Ok(2));
        assert_eq!(out.len(), 2);
        assert_eq!(l.held(), 0);
        assert_eq!(l.next_id(), 1);
    }

    /// A record of `lens.len()` buffers of `lens` bytes (each filled with its number from
    /// `first`): a train of one buffer or a batch's run of several, sent whole, as the engines
    /// keep it.
    fn train_record(first: u8, lens: &[usize]) -> Record<Vec<u8>> {
        let mut bufs = lens.iter().zip(first..).map(|(&len, n)| vec![n; len]);
        let mut rec = Record::new(bufs.next().unwrap(), None::<Box<socket2::SockAddr>>, None);
        bufs.for_each(|b| rec.push(b));
        rec.sent = rec.total;
        rec.train = Some(Train::new(lens[0] as u16));
        rec
    }

    /// Trains across the u32 wrap: a run's train takes id 0xFFFF_FFFF and the next train id 0,
    /// between single datagrams; one coalesced completion [0xFFFF_FFFE, 1] releases every
    /// buffer of each, in order, once, whole. No kernel makes 2^32 ids on demand: the real
    /// trains are `tests/trains_batch.rs`'s.
    #[test]
    fn trains_across_the_wrap_release_every_buffer_of_each() {
        let mut l: Ledger<Record<Vec<u8>>> = Ledger::new(0xFFFF_FFFE);
        let records = [
            (train_record(0, &[100]), 0xFFFF_FFFE),
            (train_record(1, &[1000, 1000, 400]), 0xFFFF_FFFF),
            (train_record(4, &[1472, 1472]), 0),
            (train_record(6, &[50]), 1),
        ];
        for (rec, want) in records {
            let s = l.insert(rec);
            assert_eq!(l.record_id(s), want);
            assert!(!l.seal_with(s, |_, _| panic!("released before its id completed")));
        }
        // A train that failed after its skb was built left its id unowned: the next one.
        let unowned = l.record_unowned_id();
        assert_eq!(unowned, 2);
        let (mut stats, mut out) = (Stats::default(), Vec::new());
        let released = l.complete_with(r(0xFFFF_FFFE, 1), |rec, done| {
            assert_eq!(done.ids, 1);
            rec.release_in_place(true, &mut stats, &mut out);
        });
        assert_eq!(released, Ok(4));
        let got: Vec<(u8, usize)> = out.iter().map(|r| (r.buf[0], r.report.bytes)).collect();
        let want = [
            (0, 100),
            (1, 1000),
            (2, 1000),
            (3, 400),
            (4, 1472),
            (5, 1472),
            (6, 50),
        ];
        assert_eq!(got, want);
        assert!(out
            .iter()
            .all(|r| r.report.error.is_none() && r.report.path == SendPath::ZeroCopy));
        assert_eq!(
            (l.held(), l.ids_in_flight(), l.unowned_in_flight()),
            (0, 0, 1)
        );
        // The unowned id completes alone, releasing nothing; the window is empty after it.
        assert_eq!(l.complete_with(r(2, 2), |_, _| panic!("unowned")), Ok(1));
        assert_eq!((l.ids_kept(), l.next_id()), (0, 3));
    }

    /// The same wrap completed in pieces and out of order: the train at 0 first, then the one at
    /// 0xFFFF_FFFF with the datagram before it; a range that reaches past the ids sent is refused
    /// and changes nothing.
    #[test]
    fn trains_across_the_wrap_complete_in_any_order() {
        let mut l: Ledger<Record<Vec<u8>>> = Ledger::new(0xFFFF_FFFE);
        let slots: Vec<SlotId> = [
            train_record(0, &[10]),
            train_record(1, &[20, 20, 5]),
            train_record(4, &[30, 30]),
        ]
        .into_iter()
        .map(|rec| {
            let s = l.insert(rec);
            l.record_id(s);
            assert!(!l.seal_with(s, |_, _| {}));
            s
        })
        .collect();
        assert_eq!(slots.len(), 3);
        let (mut stats, mut out) = (Stats::default(), Vec::new());
        let mut settle =
            |rec: &mut Record<Vec<u8>>, _| rec.release_in_place(true, &mut stats, &mut out);
        assert!(
            l.complete_with(r(0, 1), &mut settle).is_err(),
            "id 1 was never sent"
        );
        assert_eq!(l.complete_with(r(0, 0), &mut settle), Ok(1));
        assert_eq!(
            l.complete_with(r(0xFFFF_FFFE, 0xFFFF_FFFF), &mut settle),
            Ok(2)
        );
        let got: Vec<u8> = out.iter().map(|r| r.buf[0]).collect();
        assert_eq!(got, [4, 5, 0, 1, 2, 3]);
        assert_eq!((l.held(), l.next_id()), (0, 1));
    }

    #[test]
    fn a_settled_slot_is_refilled_in_place_and_never_settles_twice() {
        // The item is a Vec: its capacity shows whether the slot's old item was refilled.
        let mut l: Ledger<Vec<u8>> = Ledger::new(5);
        let mut news = 0;
        let mut insert = |l: &mut Ledger<Vec<u8>>, byte: u8| match l.free_item() {
            Some((free, v)) => {
                assert!(v.is_empty(), "refilled a slot whose item was not settled");
                v.push(byte);
                l.insert_refilled(free)
            }
            None => {
                news += 1;
                let mut v = Vec::with_capacity(64);
                v.push(byte);
                l.insert(v)
            }
        };
        let a = insert(&mut l, 1);
        let b = insert(&mut l, 2);
        l.record_id(a);
        l.record_id(b);
        assert!(!l.seal_with(a, |_, _| panic!("settled with an id in flight")));
        // b settles at its seal once its id completed, without a list in between.
        let mut seen = Vec::new();
        let r6 = ZcRange {
            lo: 6,
            hi: 6,
            copied: true,
        };
        l.complete_with(r6, |v, d| seen.push((v.clone(), d)))
            .unwrap();
        assert!(seen.is_empty(), "b is not sealed yet");
        assert!(l.seal_with(b, |v, d| {
            seen.push((v.clone(), d));
            v.clear();
        }));
        let done = Done {
            ids: 1,
            kernel_copied: true,
        };
        assert_eq!(seen, vec![(vec![2], done)]);
        // The next insert takes b's slot and refills its item in place.
        let c = insert(&mut l, 3);
        assert_eq!(c, b);
        assert_eq!(l.item(c), &vec![3]);
        assert!(
            l.item(c).capacity() >= 64,
            "the item was rebuilt, not refilled"
        );
        l.complete_with(r(5, 5), |v, _| v.clear()).unwrap();
        let d = insert(&mut l, 4);
        assert_eq!((d, l.held()), (a, 2));
        assert_eq!(news, 2, "a new item only while no slot was free");
        // Both live items come out at take_all, once; the slots stay reusable.
        let mut taken = Vec::new();
        l.take_all_with(|v| taken.push(std::mem::take(v)));
        taken.sort();
        assert_eq!(taken, vec![vec![3], vec![4]]);
        assert_eq!(l.held(), 0);
        l.take_all_with(|_| panic!("taken twice"));
    }

    #[test]
    fn a_settle_that_panics_leaves_the_ledger_consistent() {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let mut l = Ledger::new(0);
        let a = l.insert(1u32);
        let b = l.insert(2u32);
        l.record_id(a);
        l.record_id(b);
        assert!(l.seal(a).is_none() && l.seal(b).is_none());
        // The caller's release panics on a (a buffer whose `as_bytes` panics).
        let res = catch_unwind(AssertUnwindSafe(|| {
            l.complete_with(r(0, 1), |v, _| assert_ne!(*v, 1, "a panicking release"))
        }));
        assert!(res.is_err());
        assert_eq!(l.held(), 1, "a counted out, b still held");
        assert_eq!(
            l.ids_in_flight(),
            1,
            "b's id stays in flight, never released early"
        );
        // The ledger goes on: the next item takes a's slot and settles normally.
        let c = l.insert(3);
        assert_eq!(c, a);
        assert_eq!(l.record_id(c), 2);
        assert!(l.seal(c).is_none());
        let mut out = Vec::new();
        assert_eq!(l.complete(r(2, 2), &mut out), Ok(1));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].item, 3);
        assert_eq!(l.take_all(), vec![2], "b is kept at shutdown");
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn short_write_holds_until_every_id_completes() {
        let mut l = Ledger::new(10);
        let a = l.insert(());
        l.record_id(a);
        l.record_id(a);
        assert!(l.seal(a).is_none());
        let mut out = Vec::new();
        l.complete(
            ZcRange {
                lo: 10,
                hi: 10,
                copied: true,
            },
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty(), "released with an id still in flight");
        l.complete(r(11, 11), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].kernel_copied);
        assert_eq!(out[0].ids, 2);
    }

    #[test]
    fn bad_ranges_change_nothing() {
        let mut l = Ledger::new(0);
        let a = l.insert(1);
        l.record_id(a);
        l.record_id(a);
        l.seal(a);
        let mut out = Vec::new();
        assert!(matches!(
            l.complete(r(0, 2), &mut out),
            Err(LedgerError::OutOfWindow { .. })
        ));
        assert!(matches!(
            l.complete(r(5, 5), &mut out),
            Err(LedgerError::OutOfWindow { .. })
        ));
        l.complete(r(1, 1), &mut out).unwrap();
        assert_eq!(
            l.complete(r(0, 1), &mut out),
            Err(LedgerError::Duplicate { id: 1 })
        );
        assert_eq!(l.ids_in_flight(), 1);
        l.complete(r(0, 0), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        // Stale: id 0 is long gone.
        assert!(l.complete(r(0, 0), &mut out).is_err());
    }

    #[test]
    fn unowned_ids_release_nothing_and_can_be_taken_back() {
        let mut l = Ledger::new(7);
        let a = l.insert("a");
        assert_eq!(l.record_id(a), 7);
        l.seal(a);
        // A failed UDP send that took no id: recorded, then taken back.
        let maybe = l.record_unowned_id();
        assert_eq!(maybe, 8);
        assert!(l.retract_unowned(maybe));
        assert_eq!(l.next_id(), 8);
        // One that did take an id: its completion (coalesced with a's) arrives first.
        let maybe = l.record_unowned_id();
        let mut out = Vec::new();
        assert_eq!(l.complete(r(7, 8), &mut out), Ok(2));
        assert_eq!(out.len(), 1);
        assert!(
            !l.retract_unowned(maybe),
            "a completed id cannot be taken back"
        );
        assert_eq!(l.next_id(), 9);
        // An unowned id that stays holds nobody back and counts apart from owned ids.
        let b = l.insert("b");
        let ghost = l.record_unowned_id();
        assert_eq!(l.record_id(b), 10);
        assert!(!l.retract_unowned(ghost), "not the newest: it stays");
        l.seal(b);
        assert_eq!((l.ids_in_flight(), l.unowned_in_flight()), (1, 1));
        assert_eq!(l.complete(r(10, 10), &mut out), Ok(1));
        assert_eq!(out.len(), 2);
        assert_eq!(l.complete(r(9, 9), &mut out), Ok(1));
        assert_eq!(
            (l.ids_in_flight(), l.unowned_in_flight(), l.held()),
            (0, 0, 0)
        );
        // Beyond the newest id is refused: there is no multi-id guess.
        let c = l.insert("c");
        l.record_id(c);
        assert!(l.complete(r(11, 12), &mut out).is_err());
    }
}
