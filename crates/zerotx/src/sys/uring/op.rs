//! The requests a [`Ring`](super::Ring) carries. Each owns every byte its SQE points at and builds
//! that SQE itself (compio's `OpCode::create_entry` habit), so the ring can take one by value and
//! push it safely: the ring keeps the boxed request, untouched, until its last CQE.
//!
//! - [`SendOp`]: one send of a [`Payload`] (buffers and destination): `IORING_OP_SENDMSG`,
//!   `IORING_OP_SENDMSG_ZC`, or `IORING_OP_SEND_ZC` from a registered buffer. Its iovecs (inline
//!   for one buffer) and `msghdr` live in the request, and so does a train's `UDP_SEGMENT`
//!   control message ([`Cut::Train`]); a finished request's box is handed back to its owner,
//!   which reuses it, so a send allocates nothing once the owner is warm.
//! - [`Cancel`] (`IORING_OP_ASYNC_CANCEL` by descriptor) and [`Nop`] point at no memory.

use std::any::Any;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types};
use smallvec::SmallVec;
use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::sys::train::SegmentCmsg;

/// What a [`SendOp`] sends: buffers in stream order, how many of their bytes the kernel already
/// took, and where they go. The whole memory contract between a send request and its owner, and
/// it holds by the types alone, so an implementation needs no `unsafe`:
///
/// - the bytes are [`SendBuf`]s, whose implementations promise they neither move nor change while
///   the buffer lives, and the payload (so the buffer) lives in the request until its last CQE;
/// - the destination is reached through a shared reference to the payload, which nothing can
///   change while the ring holds the request: the request hands out `&mut` to its payload only to
///   its owner (`SendOp::payload_mut`), who has the box only before the push and after the last
///   CQE;
/// - the request computes the unsent slices itself (`unsent`) from [`bufs`](Payload::bufs) and
///   [`sent`](Payload::sent), so a wrong count sends the wrong bytes of the payload's own buffers,
///   never memory outside them.
pub trait Payload: Send + 'static {
    /// The buffers' type.
    type Buf: SendBuf;

    /// The buffers, in stream order.
    fn bufs(&self) -> &[Self::Buf];

    /// Bytes at the front of [`bufs`](Payload::bufs) the kernel already took: the request sends
    /// the rest.
    fn sent(&self) -> usize;

    /// Where the bytes go, on a socket that is not connected.
    fn dest(&self) -> Option<&SockAddr>;

    /// How a datagram socket's kernel cuts the unsent bytes into datagrams: not at all (one
    /// datagram, or a byte stream's bytes) unless the payload is a train.
    fn cut(&self) -> Cut {
        Cut::None
    }
}

/// How a [`SendOp`]'s bytes become datagrams ([`Payload::cut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// As they are: one datagram or message, or a byte stream's bytes.
    None,
    /// A train (UDP GSO): the kernel cuts the unsent bytes into datagrams of this size, the last
    /// possibly shorter, named by a `UDP_SEGMENT` control message the request owns.
    Train(u16),
    /// One datagram of at most this size from the front of the unsent bytes: a train whose path
    /// refused GSO, sent one datagram per request.
    One(u16),
}

/// The unsent bytes of `bufs` after `sent` as iovecs into `iov`, at most `limit` bytes of them.
fn fill_iov<B: SendBuf>(
    iov: &mut SmallVec<[libc::iovec; 1]>,
    bufs: &[B],
    sent: usize,
    limit: usize,
) {
    iov.clear();
    let mut left = limit;
    for bytes in unsent(bufs, sent) {
        if left == 0 {
            break;
        }
        let len = bytes.len().min(left);
        left -= len;
        iov.push(libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: len,
        });
    }
}

/// The bytes of `bufs` after the first `sent`, buffer by buffer, in order.
pub(crate) fn unsent<B: SendBuf>(bufs: &[B], sent: usize) -> impl Iterator<Item = &[u8]> {
    let mut skip = sent;
    bufs.iter().filter_map(move |b| {
        let bytes = b.as_bytes();
        if skip >= bytes.len() {
            skip -= bytes.len();
            return None;
        }
        let rest = &bytes[skip..];
        skip = 0;
        Some(rest)
    })
}

/// A request a ring can carry.
///
/// # Safety
/// The entry [`entry`](Op::entry) returns may point only at memory the value owns: its own fields,
/// or the bytes of the [`SendBuf`]s it holds. All of it must stay valid, in place and unchanged
/// for as long as the value lives at the address `entry` was called on (the ring keeps it boxed
/// until the request's last CQE, then hands the box back, or drops it there if its owner reaps
/// another type (`Lent::Other`); it never drops one earlier). Between
/// CQEs the ring lends its owner only what [`meta`](Op::meta) points at
/// (`Lent::Live`), so [`meta`](Op::meta) must point at memory no entry
/// points at.
pub unsafe trait Op: Any + Send {
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
pub enum SendKind {
    /// `IORING_OP_SENDMSG`: the kernel copies.
    Copy,
    /// `IORING_OP_SENDMSG_ZC` with these `zc_flags` (in the SQE's `ioprio`).
    ZeroCopy {
        /// `IORING_SEND_ZC_REPORT_USAGE` where the kernel has it.
        zc_flags: u16,
    },
    /// `IORING_OP_SENDMSG_ZC` with `IORING_RECVSEND_FIXED_BUF` (6.15, [`sendmsg_zc_fixed`]):
    /// the `msghdr`'s iovecs lie in registered buffer `index`, and the `msghdr` carries a train's
    /// control message; for trains from a registered pool.
    ///
    /// [`sendmsg_zc_fixed`]: super::sendmsg_zc_fixed
    FixedMsg {
        /// The registered buffer the bytes lie in.
        index: u16,
        /// As for [`SendKind::ZeroCopy`].
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

/// One send request: the unsent part of a [`Payload`], on descriptor `fd`, and what its owner
/// keeps of it (`M`) in the same box, so a request is one allocation and one ring slot from its
/// push to its last CQE.
pub struct SendOp<P, M = ()> {
    /// The owner's own account of the request ([`Op::meta`]). No SQE points at it: the only part
    /// of a request the ring lends its owner while it holds the request.
    pub(crate) meta: M,
    payload: P,
    fd: RawFd,
    kind: SendKind,
    flags: i32,
    /// The payload's unsent bytes, buffer by buffer; rebuilt by every [`Op::entry`] that sends a
    /// `msghdr` (a fixed-buffer `SEND_ZC` points straight at its bytes).
    iov: SmallVec<[libc::iovec; 1]>,
    /// Points at `iov`, the payload's destination and, for a train, `segment`; rebuilt by every
    /// [`Op::entry`].
    msg: libc::msghdr,
    /// A train's `UDP_SEGMENT` control message ([`Cut::Train`]), which `msg` points at; rebuilt
    /// by every [`Op::entry`] of a train.
    segment: SegmentCmsg,
}

// SAFETY: the raw pointers in `iov` and `msg` point into this value's own fields and into the
// bytes of its payload's `SendBuf`s (which are `Send`); nothing here dereferences them, only the
// kernel reads through them, so the request may move to another thread with its owner or ring.
unsafe impl<P: Send, M: Send> Send for SendOp<P, M> {}

impl<P: Payload, M: Default> SendOp<P, M> {
    /// A request for `payload`, in a new box (a finished request's box is reused through
    /// [`payload_mut`](Self::payload_mut)).
    pub fn new(payload: P) -> Box<Self> {
        Box::new(Self {
            meta: M::default(),
            payload,
            fd: -1,
            kind: SendKind::Copy,
            flags: 0,
            iov: SmallVec::new(),
            msg: crate::sys::send_msghdr(&[], None),
            segment: SegmentCmsg::new(0),
        })
    }

    /// What this request sends.
    pub fn payload(&self) -> &P {
        &self.payload
    }

    /// What this request sends, to account what the kernel did or to refill a finished request's
    /// box. Only the box's owner can call it, and a ring holds the box from the push to the last
    /// CQE: the payload never changes while the kernel may read it.
    pub(crate) fn payload_mut(&mut self) -> &mut P {
        &mut self.payload
    }

    /// Sets how the next push sends: on `fd`, as `kind`, with `msg_flags` `flags`.
    pub fn set(&mut self, fd: RawFd, kind: SendKind, flags: i32) {
        self.fd = fd;
        self.kind = kind;
        self.flags = flags;
    }
}

// SAFETY: the entry points at `self.iov`, `self.msg` and `self.segment` (fields of the value), at
// the payload's destination and at the unsent bytes of the payload's buffers (the payload is a
// field of the value): by the `Payload` contract these stay in place and unchanged while the
// value lives and its owner cannot reach `payload_mut`, which is the whole time a ring holds the
// value. A train's control message is read by the kernel each time it issues the request (a
// request parked on a full socket is issued again later), never after its first CQE; the value,
// and so the control message, stays boxed in the ring until the last CQE (a `SENDMSG_ZC`'s
// notification), which is later still. `meta`, the one field the ring lends while it holds the
// value, is not pointed at.
unsafe impl<P: Payload, M: Send + 'static> Op for SendOp<P, M> {
    type Meta = M;

    // Its result, and a zero-copy send's notification.
    const CQES: u8 = super::places::SEND_CQES as u8;

    #[inline]
    unsafe fn meta(this: *mut Self) -> *mut M {
        // SAFETY: `this` points at a live value (the caller's promise); the field's address is
        // taken without a reference to the value or the field.
        unsafe { std::ptr::addr_of_mut!((*this).meta) }
    }

    // Inlined into `Ring::push`, so the 64-byte SQE is built in place (docs/fast-path.md).
    #[inline(always)]
    fn entry(&mut self, file: Option<u32>) -> squeue::Entry {
        let bad = super::take_bad_sqe();
        let Self {
            meta: _,
            payload,
            fd,
            kind,
            flags,
            iov,
            msg,
            segment,
        } = self;
        let bufs = payload.bufs();
        let dest = payload.dest();
        let sent = payload.sent();
        let cut = payload.cut();
        let fd = *fd;
        // A fixed-buffer SEND_ZC needs no iovec and no msghdr: its SQE points at the bytes.
        if !matches!(kind, SendKind::Fixed { .. }) {
            let limit = match cut {
                Cut::One(size) => usize::from(size),
                Cut::None | Cut::Train(_) => usize::MAX,
            };
            fill_iov(iov, bufs, sent, limit);
        }
        // The control message a train's msghdr points at, in this value.
        let mut train = |msg: &mut libc::msghdr| {
            if let Cut::Train(size) = cut {
                *segment = SegmentCmsg::new(size);
                segment.attach(msg);
            }
        };
        match *kind {
            SendKind::Fixed { index, zc_flags } => {
                debug_assert_eq!(bufs.len(), 1, "a fixed-buffer request carries one buffer");
                debug_assert_eq!(
                    cut,
                    Cut::None,
                    "a fixed-buffer request has no control message"
                );
                let one = unsent(bufs, sent).next().unwrap_or_default();
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
                train(msg);
                on_target!(file, fd, |t| opcode::SendMsgZc::new(t, &*msg))
                    .flags(*flags as u32)
                    .ioprio(zc_flags | bad)
                    .build()
            }
            SendKind::FixedMsg { index, zc_flags } => {
                *msg = crate::sys::send_msghdr(iov, dest);
                train(msg);
                on_target!(file, fd, |t| opcode::SendMsgZc::new(t, &*msg))
                    .flags(*flags as u32)
                    .ioprio(zc_flags | bad)
                    .buf_index(Some(index))
                    .build()
            }
            SendKind::Copy => {
                *msg = crate::sys::send_msghdr(iov, dest);
                train(msg);
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

#[cfg(test)]
mod tests {
    use super::{fill_iov, unsent};

    /// A request sends its payload's bytes after `sent`, across buffer edges, and nothing when
    /// everything (or more, by a wrong count) went: never bytes outside the buffers.
    #[test]
    fn unsent_skips_what_went_across_buffers() {
        let bufs = [vec![1u8; 3], vec![2; 0], vec![3; 4]];
        let at = |sent| unsent(&bufs, sent).map(<[u8]>::to_vec).collect::<Vec<_>>();
        assert_eq!(at(0), vec![vec![1; 3], vec![3; 4]]);
        assert_eq!(at(2), vec![vec![1; 1], vec![3; 4]]);
        assert_eq!(at(3), vec![vec![3; 4]]);
        assert_eq!(at(5), vec![vec![3; 2]]);
        assert!(at(7).is_empty());
        assert!(at(100).is_empty());
    }

    /// One datagram of a split train: at most `limit` bytes from `sent`, across buffer edges.
    #[test]
    fn an_iovec_stops_at_its_limit() {
        let bufs = [vec![1u8; 3], vec![3; 4]];
        let lens = |sent, limit| {
            let mut iov = smallvec::SmallVec::new();
            fill_iov(&mut iov, &bufs, sent, limit);
            iov.iter().map(|v| v.iov_len).collect::<Vec<_>>()
        };
        assert_eq!(lens(0, usize::MAX), [3, 4]);
        assert_eq!(lens(0, 2), [2]);
        assert_eq!(lens(1, 4), [2, 2]);
        assert_eq!(lens(3, 10), [4]);
        assert!(lens(7, 10).is_empty());
    }
}
