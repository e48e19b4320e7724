//! The requests a [`Ring`](super::Ring) carries. Each owns every byte its SQE points at and builds
//! that SQE itself (compio's `OpCode::create_entry` habit), so the ring can take one by value and
//! push it safely: the ring keeps the boxed request, untouched, until its last CQE.
//!
//! - [`SendOp`]: one send of a [`Record`] (its buffers and destination): `IORING_OP_SENDMSG`,
//!   `IORING_OP_SENDMSG_ZC`, or `IORING_OP_SEND_ZC` from a registered buffer. Its iovecs (inline
//!   for one buffer) and `msghdr` live in the request; a finished request's box is handed back to
//!   the engine, which reuses it, so a send allocates nothing once the engine is warm.
//! - [`Cancel`] (`IORING_OP_ASYNC_CANCEL` by descriptor) and [`Nop`] point at no memory.

use std::any::Any;
use std::os::fd::RawFd;
use std::time::Instant;

use io_uring::{opcode, squeue, types};
use smallvec::SmallVec;
use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::record::Record;
use crate::report::{Released, Stats};

/// A request a ring can carry.
///
/// # Safety
/// The entry [`entry`](Op::entry) returns may point only at memory the value owns: its own fields,
/// or the bytes of the [`SendBuf`]s it holds. All of it must stay valid, in place and unchanged
/// for as long as the value lives at the address `entry` was called on (the ring keeps it boxed
/// until the request's last CQE, then hands the box back, or drops it there if its owner reaps
/// another type ([`Lent::Other`](super::Lent::Other)); it never drops one earlier). Between
/// CQEs the ring lends its owner only what [`meta`](Op::meta) points at
/// ([`Lent::Live`](super::Lent::Live)), so [`meta`](Op::meta) must point at memory no entry
/// points at.
pub(crate) unsafe trait Op: Any + Send {
    /// What [`meta`](Op::meta) lends.
    type Meta;

    /// CQEs the request posts at most.
    const CQES: u8;

    /// Builds the SQE (the ring sets its `user_data`). Called on the value at its final address.
    /// A request on a socket names it as registered file `file` (`IOSQE_FIXED_FILE`) when given.
    fn entry(&mut self, file: Option<u32>) -> squeue::Entry;

    /// The part of the request its owner may read and change while the ring holds it (each CQE
    /// before the last lends it): memory the entry does not point at. Reached from a pointer,
    /// not from `&mut self`: a reference to the whole request would claim the memory the kernel
    /// may be reading through the entry at that moment.
    ///
    /// # Safety
    /// `this` must point at a live value of this type.
    unsafe fn meta(this: *mut Self) -> *mut Self::Meta;
}

/// Builds `$op` with `$t` bound to the target: registered file `$file` if `Some`, else
/// descriptor `$fd` (the `io-uring` crate types the two apart).
macro_rules! on_target {
    ($file:expr, $fd:expr, |$t:ident| $op:expr) => {
        match $file {
            Some(slot) => {
                let $t = types::Fixed(slot);
                $op
            }
            None => {
                let $t = types::Fd($fd);
                $op
            }
        }
    };
}

/// How a [`SendOp`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendKind {
    /// `IORING_OP_SENDMSG`: the kernel copies.
    Copy,
    /// `IORING_OP_SENDMSG_ZC` with these `zc_flags` (in the SQE's `ioprio`).
    ZeroCopy {
        /// `IORING_SEND_ZC_REPORT_USAGE` where the kernel has it.
        zc_flags: u16,
    },
    /// `IORING_OP_SEND_ZC` with `IORING_RECVSEND_FIXED_BUF` from registered buffer `index`: the
    /// record must hold one buffer, lying in that registered buffer (else the kernel answers
    /// `EFAULT`).
    Fixed {
        /// The registered buffer the bytes lie in.
        index: u16,
        /// As for [`SendKind::ZeroCopy`].
        zc_flags: u16,
    },
}

/// One send request: the unsent part of a [`Record`], on descriptor `fd`, and what its owner
/// keeps of it (`M`) in the same box, so a request is one allocation and one ring slot from its
/// push to its last CQE.
pub(crate) struct SendOp<B, M = ()> {
    /// The owner's own account of the request ([`Op::meta`]). No SQE points at it: the only part
    /// of a request the ring lends its owner while it holds the request.
    pub(crate) meta: M,
    /// `None` only while the engine keeps the box for reuse.
    rec: Option<Record<B>>,
    fd: RawFd,
    kind: SendKind,
    flags: i32,
    /// The record's unsent bytes, buffer by buffer; rebuilt by every [`Op::entry`] that sends a
    /// `msghdr` (a fixed-buffer `SEND_ZC` points straight at its bytes).
    iov: SmallVec<[libc::iovec; 1]>,
    /// Points at `iov` and the record's boxed destination; rebuilt by every [`Op::entry`].
    msg: libc::msghdr,
}

// SAFETY: the raw pointers in `iov` and `msg` point into this value's own fields and into the
// bytes of its `SendBuf`s (which are `Send`); nothing here dereferences them, only the kernel
// reads through them, so the request may move to another thread with its engine or ring.
unsafe impl<B: Send, M: Send> Send for SendOp<B, M> {}

impl<B: SendBuf, M: Default> SendOp<B, M> {
    /// A request for `rec`, in `spare` (a finished request's box) if there is one.
    pub(crate) fn new(rec: Record<B>, spare: Option<Box<Self>>) -> Box<Self> {
        match spare {
            Some(mut op) => {
                op.rec = Some(rec);
                op
            }
            None => Box::new(Self {
                meta: M::default(),
                rec: Some(rec),
                fd: -1,
                kind: SendKind::Copy,
                flags: 0,
                iov: SmallVec::new(),
                msg: crate::sys::send_msghdr(&[], None),
            }),
        }
    }

    /// A request for a new record of `buf` (see [`Record::new`]), in `spare` (a finished
    /// request's box) if there is one: its record is refilled in place, not built and moved in.
    pub(crate) fn for_buf(
        spare: Option<Box<Self>>,
        buf: B,
        dest: Option<Box<SockAddr>>,
        started: Option<Instant>,
    ) -> Box<Self> {
        match spare {
            Some(mut op) => {
                match &mut op.rec {
                    Some(rec) => rec.refill(buf, dest, started),
                    None => op.rec = Some(Record::new(buf, dest, started)),
                }
                op
            }
            None => Self::new(Record::new(buf, dest, started), None),
        }
    }

    /// Gives the record's buffers back ([`Record::release_in_place`]) and keeps the emptied
    /// record in the box for [`for_buf`](Self::for_buf).
    pub(crate) fn release(
        &mut self,
        zerocopy_engine: bool,
        stats: &mut Stats,
        out: &mut Vec<Released<B>>,
    ) {
        self.record_mut()
            .release_in_place(zerocopy_engine, stats, out);
    }

    /// The record this request sends.
    pub(crate) fn record(&self) -> &Record<B> {
        self.rec.as_ref().expect("a request holds its record")
    }

    /// The record, to account what the kernel did (only its owner can call this: never while the
    /// ring holds the request).
    pub(crate) fn record_mut(&mut self) -> &mut Record<B> {
        self.rec.as_mut().expect("a request holds its record")
    }

    /// Sets how the next push sends: on `fd`, as `kind`, with `msg_flags` `flags`.
    pub(crate) fn set(&mut self, fd: RawFd, kind: SendKind, flags: i32) {
        self.fd = fd;
        self.kind = kind;
        self.flags = flags;
    }

    /// The record back, and the empty box for the next request (the tests' form of
    /// [`release`](Self::release)).
    #[cfg(test)]
    pub(crate) fn take(mut self: Box<Self>) -> (Record<B>, Box<Self>) {
        let rec = self.rec.take().expect("a request holds its record");
        (rec, self)
    }
}

// SAFETY: the entry points at `self.iov` and `self.msg` (fields of the value), at the record's
// destination (boxed inside the record, which the value owns) and at the unsent bytes of the
// record's buffers, which `SendBuf` promises stay in place and unchanged while the buffers live:
// they live in the value. `rec` is replaced only by its owner, never while a ring holds the value;
// `meta`, the one field the ring lends while it holds the value, is not pointed at.
unsafe impl<B: SendBuf, M: Send + 'static> Op for SendOp<B, M> {
    type Meta = M;

    // Its result, and a zero-copy send's notification.
    const CQES: u8 = super::places::SEND_CQES as u8;

    #[inline]
    unsafe fn meta(this: *mut Self) -> *mut M {
        // SAFETY: `this` points at a live value (the caller's promise); the field's address is
        // taken without a reference to the value or the field.
        unsafe { std::ptr::addr_of_mut!((*this).meta) }
    }

    // Inlined into `Ring::push`: called, it built the 64-byte SQE on the stack and the push copied
    // it twice more (perf: ~30% of `push_request`'s samples on those copies).
    #[inline(always)]
    fn entry(&mut self, file: Option<u32>) -> squeue::Entry {
        let bad = super::take_bad_sqe();
        let Self {
            meta: _,
            rec,
            fd,
            kind,
            flags,
            iov,
            msg,
        } = self;
        let rec = rec.as_ref().expect("a request holds its record");
        let dest = rec.dest.as_deref();
        let fd = *fd;
        // A fixed-buffer SEND_ZC needs no iovec and no msghdr: its SQE points at the bytes.
        if !matches!(kind, SendKind::Fixed { .. }) {
            iov.clear();
            iov.extend(rec.unsent().map(|bytes| libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: bytes.len(),
            }));
        }
        match *kind {
            SendKind::Fixed { index, zc_flags } => {
                debug_assert_eq!(
                    rec.bufs.len(),
                    1,
                    "a fixed-buffer request carries one buffer"
                );
                let one = rec.unsent().next().unwrap_or_default();
                // A registered buffer lies in a region of at most 1 GiB (checked at registration),
                // so its length fits the SQE's 32 bits.
                let len = u32::try_from(one.len()).expect("registered buffers are <= 1 GiB");
                let mut op = on_target!(file, fd, |t| opcode::SendZc::new(t, one.as_ptr(), len))
                    .buf_index(Some(index))
                    .flags(*flags)
                    .zc_flags(zc_flags | bad);
                if let Some(d) = dest {
                    op = op.dest_addr(d.as_ptr()).dest_addr_len(d.len());
                }
                op.build()
            }
            SendKind::ZeroCopy { zc_flags } => {
                *msg = crate::sys::send_msghdr(iov, dest);
                on_target!(file, fd, |t| opcode::SendMsgZc::new(t, &*msg))
                    .flags(*flags as u32)
                    .ioprio(zc_flags | bad)
                    .build()
            }
            SendKind::Copy => {
                *msg = crate::sys::send_msghdr(iov, dest);
                on_target!(file, fd, |t| opcode::SendMsg::new(t, &*msg))
                    .flags(*flags as u32)
                    .ioprio(bad)
                    .build()
            }
        }
    }
}

/// `IORING_OP_ASYNC_CANCEL` of every request on the file descriptor `fd` names
/// (`IORING_ASYNC_CANCEL_FD | IORING_ASYNC_CANCEL_ALL`, 5.19): parked requests complete with
/// `-ECANCELED`. The kernel matches requests by their `struct file`, so it also finds those that
/// named the file by its registered slot (`io_cancel_req_match`).
pub(crate) struct Cancel {
    pub(crate) fd: RawFd,
}

// SAFETY: a cancel by descriptor points at no memory.
unsafe impl Op for Cancel {
    type Meta = Self;

    const CQES: u8 = 1;

    unsafe fn meta(this: *mut Self) -> *mut Self {
        // No SQE of it points at memory: the whole value is its meta.
        this
    }

    fn entry(&mut self, _file: Option<u32>) -> squeue::Entry {
        opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(self.fd)).all()).build()
    }
}

/// `IORING_OP_NOP`.
pub(crate) struct Nop;

// SAFETY: a NOP points at no memory.
unsafe impl Op for Nop {
    type Meta = Self;

    const CQES: u8 = 1;

    unsafe fn meta(this: *mut Self) -> *mut Self {
        // No SQE of it points at memory: the whole value is its meta.
        this
    }

    fn entry(&mut self, _file: Option<u32>) -> squeue::Entry {
        opcode::Nop::new().build()
    }
}
