//! The io_uring instance: submission, completion, and the memory of every request in between.
//!
//! - **Requests own their memory.** [`Ring::push`] takes a boxed [`Op`] (which built its own SQE)
//!   and keeps it in its one slot until the request's **last** CQE: the notification of a
//!   zero-copy send, or a first CQE without `IORING_CQE_F_MORE` (a notification may come before or
//!   after its request's first CQE: both are awaited). Each earlier CQE reaches the owner with the
//!   request's [`Op::meta`] lent by reference ([`Lent::Live`]: the owner keeps its own account of
//!   the request there, no table of its own, and cannot reach what the SQE points at); the last
//!   hands the box back ([`Lent::Back`]). Stored type-erased (`dyn Any + Send`: one ring carries
//!   senders of different buffer types) beside its `TypeId`; the reaper names the type it pushed
//!   and gets it back typed, checked by that stored id (no virtual call per CQE).
//! - **A request is freed only after its last CQE.** A request of an owner that left (its sender
//!   was closed or dropped with the request in flight: `Closed::kept`) stays in its slot until its
//!   last CQE, whoever reaps it; then it moves to the *departed* list, which the caller takes
//!   ([`Ring::take_departed`]) and drops after it let go of the ring's lock, so the buffers go
//!   back to their owners (a `BufPool` block to its pool) and user `Drop` code never runs under
//!   the lock. A request still in the ring when the ring is dropped is leaked, never freed:
//!   closing a ring's descriptor only starts the kernel's teardown, which cancels and waits for
//!   requests asynchronously, so the kernel may still read their memory after the ring is gone.
//!   A sender's own ring closed with requests in flight is therefore not dropped but adopted
//!   (`orphans.rs`) until they finish.
//! - **Owners.** Each sender on a ring is an *owner*; its requests carry the owner id in the top
//!   16 bits of `user_data` (the ring's slot of the request in the others). Whoever reaps the
//!   completion queue hands the reaper's own CQEs to it at once and routes the others' to their
//!   owners' inboxes, so a sender never loses a completion another sender happened to reap. A
//!   request whose last CQE waits in an inbox keeps its slot until its owner claims it (so the
//!   owner finds it there, and the slot cannot be reused under the CQE). An owner's id is given to
//!   a new sender only once the owner left *and* its last request finished, so no stale CQE
//!   reaches the newcomer.
//! - **Submission.** `io_uring_enter` stops at the first SQE whose preparation fails (that one gets
//!   an error CQE) and leaves the rest in the SQ ring, so what is still unsubmitted is always read
//!   from the ring itself, never counted from what was pushed.
//! - **Completion queue.** Sized at setup for every CQE that can post ([`Places`]): each owner
//!   has a reserve of room (one send request and its cancel), so owners whose requests are parked
//!   (stream peers that do not read) never take the room another owner needs, and sends beyond
//!   the reserve share a pool, bounded per owner. [`Ring::push`] refuses a send the room does
//!   not cover (it waits with its owner for CQEs to be read), and [`Ring::join`] an owner the CQ
//!   has no reserve for. Should the CQ overflow all the same (the test hooks' NOPs), the kernel
//!   keeps the extra CQEs (`IORING_FEAT_NODROP`) until an `io_uring_enter` with `GETEVENTS`:
//!   every reap and submit enters when the ring says `IORING_SQ_CQ_OVERFLOW`, even with nothing
//!   to submit.
//! - **Never spin.** Pushing into a full SQ enters the kernel once; if the SQ is still full the
//!   request is handed back and the caller tries again at its next progress.
//! - **Registered files** (datagram sockets only: see [`FILE_SLOTS`]). The ring registers a sparse table of [`FILE_SLOTS`] files
//!   (`IORING_REGISTER_FILES2`, 5.19); an owner that joins with a descriptor gets the slot of its
//!   id when there is one (`IORING_REGISTER_FILES_UPDATE`), and its requests name that slot
//!   (`IOSQE_FIXED_FILE`): the kernel skips a descriptor lookup (`fget`/`fput`) per request, and
//!   a request names the socket itself, never a number that may be reused. The slot is cleared
//!   only once no SQE can name it: at [`Ring::leave`] when the SQ is empty (a request already
//!   submitted holds its own reference to the file), else when the owner's last request finished.
//!   Without the table (an older kernel, `RLIMIT_NOFILE` below it) or past its size, requests name
//!   the descriptor.

use std::any::{Any, TypeId};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{cqueue, IoUring};
use slab::Slab;

use super::op::{Cancel, Nop, Op};
use super::places::{Places, RESERVE, SEND_CQES};
use crate::buf::BufPool;

const OWNER_SHIFT: u32 = 48;
const SLOT_MASK: u64 = (1 << OWNER_SHIFT) - 1;
/// An owner id never given to a sender: requests of the test hooks.
pub(crate) const NOBODY: u16 = u16::MAX;
/// The request tag ([`Cqe::req`]) of an owner's [`Ring::push_cancel`].
pub const CANCEL: u8 = u8::MAX;
/// The request tag of a CQE whose `user_data` names no request of the ring (a kernel bug).
pub(crate) const UNKNOWN: u8 = u8::MAX - 1;
/// The slot of such a CQE.
const NO_SLOT: u32 = u32::MAX;
/// `IORING_MAX_CQ_ENTRIES`: the kernel refuses a larger CQ (`EINVAL`).
pub(crate) const MAX_CQ_ENTRIES: u32 = 65536;
/// io_uring registers at most this much memory per buffer (`IORING_REGISTER_BUFFERS` answers
/// `EFAULT` above it).
pub(crate) const MAX_REGISTERED: usize = 1 << 30;
/// Rounds of "drain the CQ, then flush what overflowed into it" per reap.
const FLUSH_ROUNDS: usize = 4;
/// Registered file slots per ring: owners with a smaller id that join with a descriptor name their
/// socket by slot.
///
/// **Datagram sockets only.** A stream or seqpacket socket joins without a descriptor (see
/// `SharedRing::join`) and its SQEs name the descriptor: slots for streams are not measured. For
/// a datagram socket the slot saves the kernel's descriptor lookup (`fget`/`fput`) per request
/// (docs/fast-path.md, benches/compare-raw-results.md).
pub(crate) const FILE_SLOTS: u32 = 64;

/// One completion queue entry, decoded. 16 bytes, so it is passed in registers, not through the
/// stack (docs/fast-path.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Bytes, `-errno`, or a notification's usage report.
    pub res: i32,
    /// `IORING_CQE_F_*`.
    pub flags: u32,
    /// The ring's slot of the request (`NO_SLOT` if none).
    slot: u32,
    /// The owner whose request it completes (from the top bits of `user_data`).
    pub owner: u16,
    /// The tag the owner gave the request when it pushed it ([`CANCEL`] for its cancel).
    pub req: u8,
    /// The request's last CQE: the kernel is done with it and its memory.
    pub last: bool,
}

impl Cqe {
    /// `IORING_CQE_F_NOTIF`: a zero-copy request's notification (the kernel let go of the pages).
    pub fn is_notif(&self) -> bool {
        cqueue::notif(self.flags)
    }

    /// `IORING_CQE_F_MORE`: a notification follows this first CQE.
    pub fn more(&self) -> bool {
        cqueue::more(self.flags)
    }

    /// A notification whose `res` has `IORING_NOTIF_USAGE_ZC_COPIED`: the kernel copied the data
    /// after all (only with `IORING_SEND_ZC_REPORT_USAGE`).
    pub(crate) fn copied(&self) -> bool {
        self.is_notif() && self.res & super::NOTIF_USAGE_ZC_COPIED != 0
    }
}

/// The request a [`Cqe`] completes, as [`Ring::reap_with`] gives it to its owner, who pushed
/// requests of type `O` (and perhaps others, such as its cancel).
pub(crate) enum Lent<'a, O: Op> {
    /// Not its last CQE: the request stays in the ring, which lends only its [`Op::meta`] (the
    /// part no SQE points at), never a reference to the whole request.
    Live(&'a mut O::Meta),
    /// Its last CQE: the request, handed back.
    Back(Box<O>),
    /// A request of another type than `O` (its last CQE drops it: the kernel is done with it).
    Other,
    /// The CQE names no request of the ring (a kernel bug).
    Unknown,
}

/// A [`Cqe`] and, with its last CQE, the request handed back (the tests' form of `Lent`).
pub struct Completion<O> {
    /// The entry.
    pub cqe: Cqe,
    /// With the request's last CQE: the request, handed back.
    pub op: Option<Box<O>>,
}

/// A request [`Ring::push`] could not queue, handed back unsubmitted.
pub struct Refused<O> {
    /// The request.
    pub op: Box<O>,
    /// The `io_uring_enter` that tried to make room failed; `None`: the SQ stayed full, or the CQ
    /// has no room for it (`no_place`).
    pub error: Option<io::Error>,
    /// The CQ has no room for its CQEs among its owner's (see `Places`): it waits for CQEs to
    /// be read, not for the SQ.
    pub no_place: bool,
}

/// Why [`Ring::join`] refused an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinRefused {
    /// 65535 owners are on the ring.
    Ids,
    /// The CQ has room reserved for this many owners, and each reserve is taken.
    Places(usize),
}

/// A request in the ring, and the memory its SQE points at.
struct Slot {
    owner: u16,
    req: u8,
    first: bool,
    notif: bool,
    /// CQEs of it its owner's room still counts (see [`Places`]).
    owed: u8,
    /// The type of the value in `op`.
    ty: TypeId,
    op: Box<dyn Any + Send>,
}

/// A sender on the ring.
struct Owner {
    /// CQEs another owner reaped for it, in order; their requests stay in their slots.
    inbox: Vec<Cqe>,
    /// CQEs went into its inbox since [`Ring::route`] last looked (it is in `Ring::unsaid`).
    unsaid: bool,
    /// Requests pushed and not yet handed back (their slots).
    live: usize,
    /// The sender is gone; its id comes free when `live` reaches 0.
    left: bool,
    /// The registered file slot its requests name (its id), while it holds its socket.
    file: Option<u32>,
    /// CQEs its sends may still post (see [`Places`]).
    owed: usize,
}

/// An io_uring instance (`io_uring_setup`) shared by owners: see the module docs.
pub struct Ring {
    ring: IoUring,
    entries: u32,
    batch: usize,
    /// The CQ's room, by owner.
    places: Places,
    slots: Slab<Slot>,
    /// Slots whose last CQE waits in an inbox: finished, not in flight.
    unclaimed: usize,
    /// By owner id (ids are handed out densely and reused, so this stays as long as the most
    /// owners ever on the ring at once).
    owners: Vec<Option<Owner>>,
    free_ids: Vec<u16>,
    next_owner: u16,
    pool: Option<BufPool>,
    enters: u64,
    /// Slots of the registered file table (0: none).
    file_slots: u32,
    /// Requests of owners that left, whose last CQE arrived: the kernel is done with them.
    departed: Vec<Box<dyn Any + Send>>,
    /// Owners whose `unsaid` is set, for [`Ring::route`] (an id may have gone to a new owner
    /// since: at most twice each).
    unsaid: Vec<u16>,
    /// Called when a reap puts CQEs into another owner's inbox (see [`Ring::on_inbox`]).
    on_inbox: Option<InboxHook>,
}

/// What [`Ring::on_inbox`] calls: it runs under the ring's lock, so it must only signal (wake a
/// task, set a flag), never touch the ring.
pub type InboxHook = std::sync::Arc<dyn Fn() + Send + Sync>;

impl Ring {
    /// The CQEs a ring of `entries` SQEs for up to `owners` owners is set up with: a reserve per
    /// owner, and a pool of two per SQE (see [`Places`]), at most [`MAX_CQ_ENTRIES`] (the pool is
    /// smaller then). The kernel rounds it up to a power of two. `None` if the reserves and one
    /// more request do not fit.
    pub fn cq_size(entries: u32, owners: u32) -> Option<u32> {
        let reserves = RESERVE as u64 * u64::from(owners);
        if reserves + SEND_CQES as u64 > u64::from(MAX_CQ_ENTRIES) {
            return None;
        }
        Some((2 * u64::from(entries) + reserves).min(u64::from(MAX_CQ_ENTRIES)) as u32)
    }

    /// `io_uring_setup` with `entries` SQEs and a CQ of [`cq_size`](Self::cq_size) for up to
    /// `owners` owners, each of which may have up to `entries` send requests in flight.
    /// [`submit_if_due`] enters once `batch` SQEs wait.
    ///
    /// [`submit_if_due`]: Ring::submit_if_due
    pub fn new(entries: u32, batch: usize, owners: u32) -> io::Result<Self> {
        let cq = Self::cq_size(entries, owners)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let ring = IoUring::builder().setup_cqsize(cq).build(entries)?;
        // The kernel's CQ is at least what was asked: the rounding goes to the pool.
        let places = Places::new(
            ring.params().cq_entries() as usize,
            owners as usize,
            2 * entries as usize,
        )
        .ok_or_else(|| io::Error::other("io_uring_setup made a smaller CQ than asked"))?;
        // Registered files are a saving, not a need: without the table, requests name descriptors.
        let file_slots = match FILE_SLOTS {
            0 => 0,
            n => match ring.submitter().register_files_sparse(n) {
                Ok(()) => n,
                Err(_) => 0,
            },
        };
        Ok(Self {
            ring,
            entries,
            batch,
            places,
            slots: Slab::new(),
            unclaimed: 0,
            owners: Vec::new(),
            free_ids: Vec::new(),
            next_owner: 0,
            pool: None,
            enters: 0,
            file_slots,
            departed: Vec::new(),
            unsaid: Vec::new(),
            on_inbox: None,
        })
    }

    /// A new owner: a free id (one whose owner left and whose requests all finished), or the next
    /// never used. Refused when 65535 owners are on the ring, or when the CQ has no reserve left
    /// for another (see [`Places`]). Its requests name `fd` through the registered file slot of
    /// its id if there is one (see the module docs), else `fd` itself.
    pub fn join(&mut self, fd: Option<RawFd>) -> Result<u16, JoinRefused> {
        let owner = match self.free_ids.pop() {
            Some(id) => id,
            None if self.next_owner < NOBODY => {
                self.next_owner += 1;
                self.next_owner - 1
            }
            None => return Err(JoinRefused::Ids),
        };
        if !self.places.join() {
            self.free_ids.push(owner);
            return Err(JoinRefused::Places(self.places.max_owners()));
        }
        let i = usize::from(owner);
        if self.owners.len() <= i {
            self.owners.resize_with(i + 1, || None);
        }
        // The slot of a reused id was cleared when its last owner's last request finished, or
        // holds that owner's socket if clearing failed: this update replaces it either way.
        let slot = u32::from(owner);
        let file = fd
            .filter(|_| slot < self.file_slots)
            .filter(|&fd| {
                self.ring
                    .submitter()
                    .register_files_update(slot, &[fd])
                    .is_ok()
            })
            .map(|_| slot);
        self.owners[i] = Some(Owner {
            inbox: Vec::new(),
            unsaid: false,
            live: 0,
            left: false,
            file,
            owed: 0,
        });
        Ok(owner)
    }

    /// The owner left: its requests already finished but not reaped go to the departed list, those
    /// still in flight follow at their last CQE (see the module docs), and its id is reused once
    /// its last request finished.
    pub fn leave(&mut self, owner: u16) {
        let Some(o) = owner_in(&mut self.owners, owner) else {
            return;
        };
        o.left = true;
        for cqe in o.inbox.drain(..).filter(|c| c.last) {
            self.departed.push(self.slots.remove(cqe.slot as usize).op);
            o.live -= 1;
            self.unclaimed -= 1;
        }
        o.inbox = Vec::new();
        let live = o.live;
        // With the SQ empty no SQE names the slot; requests already submitted hold the file.
        if live == 0 || self.sq_len() == 0 {
            self.release_file(owner);
        }
        if live == 0 {
            self.gone(owner);
        }
    }

    /// `owner` left and its last request finished: its id and its reserve come free.
    fn gone(&mut self, owner: u16) {
        self.owners[usize::from(owner)] = None;
        self.free_ids.push(owner);
        self.places.leave();
    }

    /// Clears `owner`'s registered file slot, which no SQE in the SQ may name any more. If the
    /// kernel refuses, the slot keeps the socket open until the id's next owner replaces it.
    fn release_file(&mut self, owner: u16) {
        let Some(slot) = self.owner(owner).and_then(|o| o.file.take()) else {
            return;
        };
        let _ = self.ring.submitter().register_files_update(slot, &[-1]);
    }

    fn owner(&mut self, owner: u16) -> Option<&mut Owner> {
        owner_in(&mut self.owners, owner)
    }

    /// The ring's descriptor: readable when CQEs wait, writable while the SQ has room.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// SQ entries (the cap on requests in flight).
    pub(crate) fn entries(&self) -> u32 {
        self.entries
    }

    /// Test hook: the registered file slot `owner`'s requests name its socket by, if any.
    #[doc(hidden)]
    pub fn file_slot(&self, owner: u16) -> Option<u32> {
        self.owners.get(usize::from(owner))?.as_ref()?.file
    }

    /// Test hook: the ring's registered file slots (0: the kernel has no sparse file table).
    #[doc(hidden)]
    pub fn file_slots(&self) -> u32 {
        self.file_slots
    }

    /// Requests pushed and not yet finished, every owner's.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.unclaimed
    }

    /// `io_uring_enter` calls made so far.
    pub(crate) fn enters(&self) -> u64 {
        self.enters
    }

    /// `owner` may push a send request: the CQ has room for its CQEs (see [`Places`]).
    pub(crate) fn has_room(&self, owner: u16) -> bool {
        let owed = self.owners.get(usize::from(owner)).and_then(Option::as_ref);
        owed.is_some_and(|o| self.places.has_room(o.owed))
    }

    /// CQ entries (as the kernel made the CQ).
    pub(crate) fn cq_entries(&self) -> u32 {
        self.ring.params().cq_entries()
    }

    /// SQEs in the SQ ring that the kernel has not consumed, every owner's.
    fn sq_len(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// The kernel holds completions the CQ had no room for.
    fn cq_overflow(&mut self) -> bool {
        self.ring.submission().cq_overflow()
    }

    /// Queues `op` for `owner` as its request `req` (the tag its CQEs will carry). A send (any
    /// request of an owner but its [`CANCEL`]) the CQ has no room for comes back unqueued
    /// (`no_place`). A full SQ is met with one `io_uring_enter`; if it is still full, or that
    /// enter failed, `op` comes back unqueued. The ring keeps a queued `op` until its last CQE.
    pub fn push<O: Op>(&mut self, owner: u16, req: u8, mut op: Box<O>) -> Result<(), Refused<O>> {
        let counted = owner != NOBODY && req != CANCEL;
        if counted && !self.has_room(owner) {
            return Err(Refused {
                op,
                error: None,
                no_place: true,
            });
        }
        let slot = self.slots.vacant_key();
        debug_assert!(slot < NO_SLOT as usize, "slot {slot} does not fit a Cqe");
        debug_assert!(req < UNKNOWN || req == CANCEL, "tag {req} is reserved");
        let file = self.owner(owner).and_then(|o| o.file);
        let entry = op
            .entry(file)
            .user_data((u64::from(owner) << OWNER_SHIFT) | slot as u64);
        // SAFETY: the entry points only at memory `op` owns (the `Op` contract), in its box. The
        // box goes into slot `slot` below and leaves it only with the request's last CQE (or is
        // leaked: see the module docs); until then it is only lent by reference, and the `Op`
        // contract keeps what the entry points at unchanged. If the push fails, nothing was
        // queued.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            if let Err(e) = self.submit() {
                return Err(Refused {
                    op,
                    error: Some(e),
                    no_place: false,
                });
            }
            // SAFETY: as above (`submit` enters the kernel but changes no slot).
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                return Err(Refused {
                    op,
                    error: None,
                    no_place: false,
                });
            }
        }
        let owed = if counted { O::CQES } else { 0 };
        let key = self.slots.insert(Slot {
            owner,
            req,
            first: false,
            notif: false,
            owed,
            ty: TypeId::of::<O>(),
            op,
        });
        debug_assert_eq!(key, slot);
        if let Some(o) = owner_in(&mut self.owners, owner) {
            o.live += 1;
            self.places.take(&mut o.owed, usize::from(owed));
        }
        Ok(())
    }

    /// Queues an `IORING_OP_ASYNC_CANCEL` of every request of `owner` on the file `fd` names;
    /// its CQE carries [`CANCEL`]. Only submitted requests can be cancelled: submit before it
    /// leaves the SQ. `Ok(false)`: the SQ stayed full.
    pub fn push_cancel(&mut self, owner: u16, fd: RawFd) -> io::Result<bool> {
        match self.push(owner, CANCEL, Box::new(Cancel { fd })) {
            Ok(()) => Ok(true),
            Err(Refused { error: None, .. }) => Ok(false),
            Err(Refused { error: Some(e), .. }) => Err(e),
        }
    }

    /// Queues an `IORING_OP_NOP` that belongs to no owner (a test hook). `Ok(false)`: the SQ
    /// stayed full.
    pub fn push_nop(&mut self) -> io::Result<bool> {
        match self.push(NOBODY, 0, Box::new(Nop)) {
            Ok(()) => Ok(true),
            Err(Refused { error: None, .. }) => Ok(false),
            Err(Refused { error: Some(e), .. }) => Err(e),
        }
    }

    /// `io_uring_enter` for everything in the SQ, from every owner, and to flush completions the
    /// kernel holds after a CQ overflow. The kernel stops at an SQE that fails its preparation
    /// (posting its error CQE) and leaves the rest in the ring: enter again while that makes
    /// progress (bounded by the SQ length).
    pub fn submit(&mut self) -> io::Result<()> {
        let mut overflow = self.cq_overflow();
        loop {
            let pending = self.sq_len();
            if pending == 0 && !overflow {
                return Ok(());
            }
            overflow = false;
            match self.enter() {
                Ok(n) if n > 0 && n < pending => continue,
                Ok(_) => return Ok(()),
                // 5.x: completions are backed up and cannot be flushed yet; the caller reaps
                // and submits on its next progress.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// `io_uring_enter` for what the SQ holds (with `IORING_ENTER_GETEVENTS` when the kernel holds
    /// overflowed completions, which flushes them; the crate's check for task work is kept,
    /// though this ring is set up without the flags that make it), retried on `EINTR`. Returns
    /// the SQEs consumed. The test hooks can make it fail ([`super::inject`]).
    ///
    /// What the `io-uring` crate's `Submitter::submit` does for a ring without SQPOLL or IOPOLL
    /// (this one never has either), with the system call made here, inline (rustix), and the
    /// return stack filled after it ([`sys::refill_return_stack`](crate::sys::refill_return_stack)):
    /// through the crate it went through glibc's `syscall()`, whose return, and the crate's, paid
    /// the cost that fill avoids, once per enter.
    fn enter(&mut self) -> io::Result<usize> {
        self.enters += 1;
        if let Some(e) = super::take_failed_enter() {
            return Err(e);
        }
        let entered = crate::sys::fenced!(crate::sys::retry(|| {
            let (pending, flags) = {
                let sq = self.ring.submission();
                let getevents = sq.cq_overflow() || sq.taskrun();
                let flags = if getevents {
                    rustix::io_uring::IoringEnterFlags::GETEVENTS
                } else {
                    rustix::io_uring::IoringEnterFlags::empty()
                };
                (sq.len(), flags)
            };
            let pending = u32::try_from(pending).expect("the SQ holds at most 2^15 entries");
            // SAFETY: the ring's descriptor stays open while `self.ring` lives. Every SQE in the
            // SQ points only at memory its request owns, and the ring keeps each request in its
            // slot until the request's last CQE (see `push`): what the kernel reads while it
            // consumes them stays valid. No argument pointer is passed.
            unsafe {
                let fd = std::os::fd::BorrowedFd::borrow_raw(self.ring.as_raw_fd());
                rustix::io_uring::io_uring_enter(fd, pending, 0, flags)
            }
            .map(|n| n as usize)
            .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
        }));
        entered
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

    /// Enters the kernel if a batch is full, if completions overflowed, or (`eager`) if nothing
    /// submitted is still in flight: then the requests waiting in the SQ would wait for the
    /// caller's next call, however long that is, and a lone send goes at once. A caller in the
    /// middle of a batch of sends passes `eager: false` and enters once at its end.
    pub(crate) fn submit_if_due(&mut self, eager: bool) -> io::Result<()> {
        let pending = self.sq_len();
        let submitted_in_flight = self.in_flight().saturating_sub(pending);
        if (pending > 0 && (pending >= self.batch || (eager && submitted_in_flight == 0)))
            || self.cq_overflow()
        {
            self.submit()
        } else {
            Ok(())
        }
    }

    /// [`reap_with`](Self::reap_with) into a list (the tests' form).
    pub fn reap_for<O: Op>(&mut self, owner: u16, out: &mut Vec<Completion<O>>) {
        self.reap_with::<O>(owner, |cqe, lent| {
            let op = match lent {
                Lent::Back(op) => Some(op),
                Lent::Live(_) | Lent::Other | Lent::Unknown => None,
            };
            out.push(Completion { cqe, op });
        });
    }

    /// Hands `owner`'s inbox to `apply`, then drains the CQ (flushing what overflowed): `owner`'s
    /// CQEs to `apply` as they are read (no list in between), the others' to their inboxes. Each
    /// CQE comes with its request, lent or (with its last CQE) handed back ([`Lent`]).
    pub(crate) fn reap_with<O: Op>(&mut self, owner: u16, mut apply: impl FnMut(Cqe, Lent<'_, O>)) {
        // What others reaped for it came first: keep each request's CQEs in order.
        if let Some(o) = owner_in(&mut self.owners, owner) {
            if !o.inbox.is_empty() {
                let mut inbox = std::mem::take(&mut o.inbox);
                for cqe in inbox.drain(..) {
                    if cqe.last {
                        self.unclaimed -= 1;
                    }
                    lend(&mut self.slots, o, cqe, &mut apply);
                }
                o.inbox = inbox;
            }
        }
        for _ in 0..FLUSH_ROUNDS {
            self.drain_cq(owner, &mut apply);
            if !self.cq_overflow() {
                break;
            }
            // The CQ is empty now: an enter with GETEVENTS moves the overflowed CQEs into it. A
            // failure shows at the next submit, which enters again.
            if self.enter().is_err() {
                break;
            }
        }
    }

    /// Sets what a reap calls when it moves CQEs into the inbox of an owner that was not yet
    /// waiting to be named by [`route`](Self::route) (`None`: nothing). An event loop that learns
    /// of completions from the ring's readiness needs it: epoll reports the ring readable only if
    /// CQEs are still in the CQ when the loop asks, so CQEs another owner's reap took first
    /// would otherwise wait in their inbox with nobody told.
    pub fn on_inbox(&mut self, hook: Option<InboxHook>) {
        self.on_inbox = hook;
    }

    /// Clears the hook if it is still `hook` (a newer one set since stays).
    pub fn clear_on_inbox(&mut self, hook: &InboxHook) {
        if self
            .on_inbox
            .as_ref()
            .is_some_and(|h| std::sync::Arc::ptr_eq(h, hook))
        {
            self.on_inbox = None;
        }
    }

    /// Moves every CQE waiting in the CQ (and what overflowed) into its owner's inbox, as a reap
    /// by an owner with none of them would, and appends to `woken` each owner whose inbox got
    /// CQEs since this call last looked and still holds some: whether this call or another
    /// owner's reap put them there. An event loop that watches the ring's fd once for all its
    /// owners wakes just those (the others have nothing new to reap).
    pub fn route(&mut self, woken: &mut Vec<u16>) {
        for _ in 0..FLUSH_ROUNDS {
            // No owner has the id `NOBODY`: every CQE goes to an inbox (or, an owner that left,
            // to the departed list), none to `apply`.
            self.drain_cq::<Nop>(NOBODY, &mut |_, _| {});
            if !self.cq_overflow() || self.enter().is_err() {
                break;
            }
        }
        for id in self.unsaid.drain(..) {
            let Some(o) = owner_in(&mut self.owners, id).filter(|o| o.unsaid) else {
                continue; // gone, or a new owner of the id already looked at
            };
            o.unsaid = false;
            // An owner that claimed its inbox since, or left, has nothing to be woken for.
            if !o.left && !o.inbox.is_empty() {
                woken.push(id);
            }
        }
    }

    /// Hands every CQE of `reaper` to `apply`, and moves the others' to their owners' inboxes, in
    /// order.
    fn drain_cq<O: Op>(&mut self, reaper: u16, apply: &mut impl FnMut(Cqe, Lent<'_, O>)) {
        let mut gone = Vec::new();
        for e in self.ring.completion() {
            let ud = e.user_data();
            let idx = (ud & SLOT_MASK) as usize;
            let mut cqe = Cqe {
                res: e.result(),
                flags: e.flags(),
                slot: NO_SLOT,
                owner: (ud >> OWNER_SHIFT) as u16,
                req: UNKNOWN,
                last: false,
            };
            let who = cqe.owner;
            // CQEs read from the CQ: the room they took is free (all of it at the last).
            let mut read = 0;
            if let Some(s) = self.slots.get_mut(idx).filter(|s| s.owner == who) {
                if cqe.is_notif() {
                    s.notif = true;
                } else {
                    s.first = true;
                    s.notif |= !cqe.more();
                }
                cqe.req = s.req;
                cqe.last = s.first && s.notif;
                cqe.slot = idx as u32;
                read = if cqe.last { s.owed } else { s.owed.min(1) };
                s.owed -= read;
            }
            let Some(o) = owner_in(&mut self.owners, who) else {
                // No owner: a test hook's request, dropped (the kernel is done with it).
                if cqe.last {
                    self.slots.remove(idx);
                }
                continue;
            };
            self.places.give(&mut o.owed, usize::from(read));
            if o.left {
                if cqe.last {
                    // The kernel is done with it: freed once the caller let go of the lock.
                    self.departed.push(self.slots.remove(idx).op);
                    o.live -= 1;
                    if o.live == 0 {
                        gone.push(who);
                    }
                }
            } else if who == reaper {
                lend(&mut self.slots, o, cqe, apply);
            } else {
                // Its request keeps its slot until its owner claims this CQE.
                if cqe.last {
                    self.unclaimed += 1;
                }
                if !o.unsaid {
                    o.unsaid = true;
                    self.unsaid.push(who);
                    // `route` itself names the owners it routed for before it returns.
                    if reaper != NOBODY {
                        if let Some(hook) = &self.on_inbox {
                            hook();
                        }
                    }
                }
                o.inbox.push(cqe);
            }
        }
        for who in gone {
            // Its last request finished: no SQE names its slot any more.
            self.release_file(who);
            self.gone(who);
        }
    }

    /// Registers `pool`'s region as fixed buffer 0 (`IORING_REGISTER_BUFFERS`); the ring keeps
    /// the pool (and so its memory) for as long as it lives. The kernel refuses a second
    /// registration (`EBUSY`) and a region over [`MAX_REGISTERED`] (`EFAULT`).
    pub(crate) fn register(&mut self, pool: &BufPool) -> io::Result<()> {
        let (base, len) = pool.region();
        let iov = libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        };
        // SAFETY: the region stays allocated while `self.pool` holds a clone of the pool, which
        // it does for as long as the ring (and so the registration) lives.
        unsafe { self.ring.submitter().register_buffers(&[iov]) }?;
        self.pool = Some(pool.clone());
        Ok(())
    }

    /// Requests of owners that left whose last CQE arrived (see the module docs): the caller drops
    /// them after it let go of the ring's lock.
    pub fn take_departed(&mut self) -> Vec<Box<dyn Any + Send>> {
        std::mem::take(&mut self.departed)
    }

    /// Whether [`take_departed`](Self::take_departed) has anything to give.
    pub(crate) fn has_departed(&self) -> bool {
        !self.departed.is_empty()
    }

    /// The pool registered as fixed buffer 0, if any.
    pub(crate) fn registered(&self) -> Option<&BufPool> {
        self.pool.as_ref()
    }
}

/// Owner `id` of `owners`, borrowing only that field (so the slots can be borrowed beside it).
fn owner_in(owners: &mut [Option<Owner>], id: u16) -> Option<&mut Owner> {
    owners.get_mut(usize::from(id))?.as_mut()
}

/// Gives `cqe` to `apply` with its request from `slots`: lent, or handed back (and its slot freed)
/// with the request's last CQE.
#[inline]
fn lend<O: Op>(
    slots: &mut Slab<Slot>,
    o: &mut Owner,
    cqe: Cqe,
    apply: &mut impl FnMut(Cqe, Lent<'_, O>),
) {
    let idx = match cqe.slot {
        NO_SLOT => return apply(cqe, Lent::Unknown),
        idx => idx as usize,
    };
    let ours = slots[idx].ty == TypeId::of::<O>();
    if cqe.last {
        o.live -= 1;
        let op = slots.remove(idx).op;
        if !ours {
            drop(op);
            return apply(cqe, Lent::Other);
        }
        // SAFETY: the box holds an `O`: `ty` is the `TypeId` of the value boxed at `push`, and
        // equal ids are the same type. The cast keeps the allocation and its layout.
        let op = unsafe { Box::from_raw(Box::into_raw(op).cast::<O>()) };
        apply(cqe, Lent::Back(op));
    } else if ours {
        // The request's address, with no reference to it formed: the kernel may be reading it.
        let value = std::ptr::addr_of_mut!(*slots[idx].op).cast::<O>();
        // SAFETY: the value is an `O` (as above), alive in its box while its slot holds it, which
        // it does while `apply` runs (nothing else touches the slots meanwhile). `Op::meta`
        // points at the part no SQE points at, and this is the only reference to it.
        let meta = unsafe { &mut *O::meta(value) };
        apply(cqe, Lent::Live(meta));
    } else {
        apply(cqe, Lent::Other);
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel tears the ring down after its descriptor closes, asynchronously: what is
        // still in flight may be read after that. Leak it (see the module docs).
        for slot in self.slots.drain() {
            std::mem::forget(slot.op);
        }
    }
}

#[cfg(test)]
mod tests {
    use socket2::SockAddr;

    use super::*;
    use crate::sys::uring::op::Payload;
    use crate::sys::uring::SendOp;

    /// A request of one whole buffer, for the sizes below.
    struct One(Vec<u8>);

    impl Payload for One {
        type Buf = Vec<u8>;

        fn bufs(&self) -> &[Vec<u8>] {
            std::slice::from_ref(&self.0)
        }

        fn sent(&self) -> usize {
            0
        }

        fn dest(&self) -> Option<&SockAddr> {
            None
        }
    }

    /// The CQ holds a reserve per owner and two CQEs per SQE, within the kernel's limit, which
    /// only the pool gives way to.
    #[test]
    fn the_cq_is_sized_by_what_can_post() {
        assert_eq!(Ring::cq_size(256, 4096), Some(512 + 3 * 4096));
        assert_eq!(Ring::cq_size(32768, 1), Some(MAX_CQ_ENTRIES));
        assert_eq!(Ring::cq_size(8, 21844), Some(MAX_CQ_ENTRIES));
        assert_eq!(Ring::cq_size(8, 21845), None);
    }

    /// The CQE routing passes a `Cqe` and a `Lent` by value per completion: at 16 bytes each they
    /// travel in registers, not through the stack (where reading them back stalled).
    #[test]
    fn a_cqe_and_a_lent_request_fit_two_registers() {
        assert_eq!(std::mem::size_of::<Cqe>(), 16);
        assert_eq!(std::mem::size_of::<Lent<'_, SendOp<One>>>(), 16);
    }
}
