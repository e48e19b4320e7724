//! Trains (UDP GSO) on the io_uring datagram engine: one request per train,
//! `IORING_OP_SENDMSG_ZC` (zero-copy) or `IORING_OP_SENDMSG` (copy), whose `UDP_SEGMENT` control
//! message lives in the request beside its `msghdr` until the request's last CQE
//! ([`Cut::Train`](crate::sys::uring::Cut), `sys/uring/op.rs`). The decisions are the sendmsg
//! family's ([`policy::train`](trains)): the same checks before any request, the same answer to
//! a failed one ([`trains::on_failure`]), and `auto`'s same choice per train
//! ([`trains::auto_copies`], then
//! [`AutoPolicy::choose`](crate::engine::policy::auto::AutoPolicy::choose)).
//!
//! - A train is one record ([`Record::train`]), released once after its last CQE (the
//!   notification of a zero-copy one, whose `IORING_NOTIF_USAGE_ZC_COPIED` says whether the
//!   kernel copied), with one report.
//! - `EIO` (the path cannot checksum a GSO packet; nothing of the train went): the path is
//!   remembered ([`SplitPaths`]) and the train goes one datagram per request by copy
//!   ([`Cut::One`](crate::sys::uring::Cut)), each request pushed after the previous one's last
//!   CQE, so no datagram goes twice and none is lost; later trains to that path go so at once.
//! - Every other failure (a segment above the path MTU, netfilter's `EPERM`, a qdisc's `ENOBUFS`
//!   with `IP_RECVERR`) is that train's error alone. `ENOBUFS` is never the budget on io_uring
//!   (see the module docs), so a failed request always counts as having been built.
//! - A train from a registered [`BufPool`] goes by `SENDMSG_ZC` with `IORING_RECVSEND_FIXED_BUF`
//!   where the kernel has it (6.15, [`sendmsg_zc_fixed`](crate::sys::uring::sendmsg_zc_fixed)):
//!   its pages were pinned once, at registration. Never by a registered buffer's `SEND_ZC`,
//!   whose segment size would have to be the socket's (`UDP_SEGMENT` as a socket option), nor on
//!   older kernels, where it goes by plain `SENDMSG_ZC` (docs/kernel.md, "UDP GSO trains on
//!   io_uring").
//!
//! [`BufPool`]: crate::buf::BufPool

use std::io;

use socket2::SockAddr;

use super::core::UringCore;
use super::flow::{fixed_index, State};
use super::state::{op_for, Op, Order, Unordered};
use crate::buf::SendBuf;
use crate::engine::policy::auto::{Choice, Load};
use crate::engine::policy::train::{self as trains, Train};
use crate::error::SendError;
use crate::report::{CopyReason, Released};
use crate::sys::uring::{self as sysu, Ring};

/// How a train goes: zero-copy or by copy (for `copy`, when zerotx chose it), and whether
/// `auto` chose zero-copy (`probe`: to probe a route that copied).
#[derive(Debug, Clone, Copy)]
pub(super) struct How {
    pub(super) zc: bool,
    probe: Option<bool>,
    copy: Option<CopyReason>,
}

impl<B: SendBuf> UringCore<B, Unordered> {
    /// [`Engine::try_send_train`](crate::engine::Engine::try_send_train): a train of `buf` in
    /// `segment`-byte datagrams to `dest` (or the connected peer), formed into its request at
    /// once; handed back ([`SendError::WouldBlock`]) while buffers queued before it wait or the
    /// ring has no room, or while `auto` waits for pinned pages.
    pub(super) fn try_send_train(
        &mut self,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let (mut ring, st) = self.split();
        if let Some(errno) = st.refusal() {
            let error = io::Error::from_raw_os_error(errno);
            return Err(SendError::Io { buf, error });
        }
        let len = buf.as_bytes().len();
        if let Err(reason) = st.trains.check(len, segment) {
            return Err(SendError::Invalid { buf, reason });
        }
        // Buffers queued before the train go first; a train never waits in the queue.
        if !(st.queue.is_empty() && st.may_issue(&ring)) {
            if let Err(error) = st.kick(&mut ring, out) {
                return Err(SendError::Io { buf, error });
            }
            if !(st.queue.is_empty() && st.may_issue(&ring)) {
                st.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        let dest = dest.map(Box::new);
        let split = st.trains.splits.splits(dest.as_deref());
        let registered =
            fixed_index(st.fixed_region(&ring), false, &buf).is_some() && sysu::sendmsg_zc_fixed();
        let Some(how) = st.train_how(len, split, registered) else {
            // Pinned pages come back with completions the next progress reaps.
            st.stats.would_block += 1;
            return Err(SendError::WouldBlock(buf));
        };
        st.held += 1;
        st.stats.sends += 1;
        st.stats.trains += 1;
        let train = Train { segment, split };
        let res = st.form_train(&mut ring, buf, dest, train, how).map(drop);
        let res = res.and_then(|()| ring.submit_if_due(st.eager()));
        // The train is in its request either way; the next progress enters again and reports a
        // failure.
        if res.is_err() {
            st.due.owe();
        }
        Ok(())
    }
}

impl<B: SendBuf, O: Order> State<B, O> {
    /// How a train of `len` bytes goes: by copy on a path that refused GSO (`split`); with
    /// `auto`, by copy below [`trains::AUTO_ZEROCOPY_MIN`], else as
    /// [`AutoPolicy::choose`](crate::engine::policy::auto::AutoPolicy::choose) says for a send
    /// from `registered` memory or not (`None`: wait for pinned pages); otherwise as the engine
    /// sends.
    pub(super) fn train_how(&mut self, len: usize, split: bool, registered: bool) -> Option<How> {
        let copy = |reason| How {
            zc: false,
            probe: None,
            copy: reason,
        };
        if split {
            return Some(copy(None));
        }
        let (bytes, sends) = self.pinned();
        let Some(auto) = &mut self.auto else {
            return Some(How {
                zc: self.zc,
                probe: None,
                copy: None,
            });
        };
        if trains::auto_copies(len) {
            return Some(copy(Some(CopyReason::Small)));
        }
        let choice = auto.choose(len, registered, Load { sends, bytes });
        self.clock.tick(auto);
        match choice {
            Choice::ZeroCopy { probe } => Some(How {
                zc: true,
                probe: Some(probe),
                copy: None,
            }),
            Choice::Copy(reason) => Some(copy(Some(reason))),
            Choice::Wait => None,
        }
    }

    /// Forms the record of a train and pushes its request (see [`State::form`]). `false`: the SQ
    /// refused it, and it waits in `to_push`.
    fn form_train(
        &mut self,
        ring: &mut Ring,
        buf: B,
        dest: Option<Box<SockAddr>>,
        train: Train,
        how: How,
    ) -> io::Result<bool> {
        let mut op = op_for(self.spare.pop(), buf, dest, self.latency.next());
        let rec = op.payload_mut();
        rec.train = Some(train);
        // A path that refused GSO: the kernel's copy, which tells `auto` nothing.
        rec.kernel_copied = train.split;
        self.launch_train(ring, op, how)
    }

    /// Pushes the first request of `op`, a train's record (a caller's train, or a batch's run:
    /// `runs.rs`), as `how` says (see [`State::launch`]). `false`: the SQ refused it, and it
    /// waits in `to_push`.
    pub(super) fn launch_train(
        &mut self,
        ring: &mut Ring,
        mut op: Box<Op<B>>,
        how: How,
    ) -> io::Result<bool> {
        let rec = op.payload_mut();
        rec.copy = how.copy;
        if let Some(probe) = how.probe {
            rec.auto_zc = true;
            rec.probe = probe;
        }
        self.launch(ring, op, how.zc)
    }
}
