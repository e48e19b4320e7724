//! A batch's runs of equal-size datagrams as trains on the io_uring datagram engine: the run at
//! the front of a batch (the sendmsg family's rule and limits,
//! [`BatchRuns::run`](crate::engine::sendmsg_train::BatchRuns::run)) becomes one request, one
//! record owning every buffer of the run ([`Record::bufs`]) with
//! [`Record::train`] set, sent as `IORING_OP_SENDMSG_ZC` or `IORING_OP_SENDMSG` with one iovec
//! per buffer and a `UDP_SEGMENT` control message ([`Cut::Train`](crate::sys::uring::Cut)).
//! Its last CQE is read as a train's ([`Trains::after`](super::state::Trains::after)):
//!
//! - it went: every buffer comes back together, with the request's report (copied or not, from
//!   the notification), counted in [`Stats::trains`] and [`Stats::batch_train_buffers`];
//! - `EIO` (the path cannot checksum a GSO packet), or `EMSGSIZE`/`EINVAL` (a segment above a
//!   path MTU that dropped, or more page fragments than one skb holds): nothing went, and the
//!   run's datagrams go one per request by copy ([`Cut::One`](crate::sys::uring::Cut) takes
//!   exactly one buffer: the run's buffers are its segment size, the last possibly shorter);
//!   `EIO` is remembered for the path, `EMSGSIZE`/`EINVAL` make the next run read the path MTU
//!   again;
//! - dropped whole (netfilter's `EPERM`, a qdisc's `ENOBUFS` with `IP_RECVERR`): nothing of it
//!   went, and every buffer of the run comes back with the error. The answer comes after the
//!   batch call returned, and datagrams after the run may have gone since, so nothing of it goes
//!   again: each report is true, and no datagram goes twice or behind its successors;
//! - the zero-copy budget (`ENOMEM`): as for a train, it waits for pinned pages or goes by copy.
//!
//! [`Record::bufs`]: crate::engine::record::Record::bufs
//! [`Record::train`]: crate::engine::record::Record::train
//! [`Stats::trains`]: crate::Stats::trains
//! [`Stats::batch_train_buffers`]: crate::Stats::batch_train_buffers

use std::collections::VecDeque;

use super::core::UringCore;
use super::flow::fixed_index;
use super::state::{op_for, Unordered};
use crate::buf::SendBuf;
use crate::engine::policy::train::{self as trains, Train};
use crate::engine::send_front;
use crate::error::SendError;
use crate::report::Released;
use crate::socket::Socket;
use crate::sys::uring as sysu;

/// What [`UringCore::try_send_run`] did with the front of a batch.
enum RunGone {
    /// The run went in one request: this many buffers.
    Sent(usize),
    /// No request for a run: this many buffers from the front go one datagram per request.
    Alone(usize),
    /// The ring has no room, buffers queued before wait, or `auto` waits for pinned pages: the
    /// batch stops here, its buffers in place.
    Full,
}

impl<B: SendBuf> UringCore<B, Unordered> {
    /// [`Engine::try_send_batch`](crate::engine::Engine::try_send_batch) on a datagram socket:
    /// each buffer one request, except where runs go as trains
    /// ([`SenderConfig::with_batch_trains`](crate::SenderConfig::with_batch_trains), a connected
    /// UDP socket whose kernel has GSO) and the front two buffers are of one size: then the run
    /// from the front goes as one request ([`try_send_run`](Self::try_send_run)).
    pub(super) fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let runs = self.st.trains.runs.on();
        // Buffers that go one per request whatever their size.
        let mut alone = 0usize;
        let mut taken = 0;
        loop {
            if runs && alone == 0 && starts_run(bufs) {
                match self.try_send_run(sock, bufs, out) {
                    RunGone::Sent(n) => {
                        taken += n;
                        continue;
                    }
                    RunGone::Full => return Ok(taken),
                    RunGone::Alone(n) => alone = n,
                }
            }
            alone = alone.saturating_sub(1);
            if !send_front(bufs, |buf| self.try_send(buf, None, out))? {
                return Ok(taken);
            }
            taken += 1;
        }
    }

    /// Sends the run at the front of `bufs` as one train request, if it makes one: zero-copy
    /// (trimmed to what one skb's page fragments carry, [`trains::zerocopy_run_len`]; from the
    /// registered region by `SENDMSG_ZC` with `IORING_RECVSEND_FIXED_BUF` where every buffer lies
    /// there and the kernel has it) or by copy, as the engine sends or, with `auto`, as it
    /// chooses for a train of the bytes one zero-copy request of the run would carry.
    fn try_send_run(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> RunGone {
        let (mut ring, st) = self.split();
        if st.refusal().is_some() {
            // `try_send` hands the buffer back with the error.
            return RunGone::Alone(1);
        }
        // Buffers queued before the run go first; a run never waits in the queue.
        if !(st.queue.is_empty() && st.may_issue(&ring)) {
            if st.kick(&mut ring, out).is_err() {
                // `try_send` queues the buffer, and the next progress reports the failure.
                return RunGone::Alone(1);
            }
            if !(st.queue.is_empty() && st.may_issue(&ring)) {
                st.stats.would_block += 1;
                return RunGone::Full;
            }
        }
        let lens = bufs.iter().map(|b| b.as_bytes().len());
        let Some((count, segment)) = st.trains.runs.run(sock, &st.trains.splits, lens) else {
            return RunGone::Alone(1);
        };
        let run = || bufs.iter().take(count);
        let zc_count = trains::zerocopy_run_len(run().map(|b| {
            let s = b.as_bytes();
            (s.as_ptr() as usize, s.len())
        }));
        let zc_bytes = run().take(zc_count).map(|b| b.as_bytes().len()).sum();
        let region = st.fixed_region(&ring);
        let registered = sysu::sendmsg_zc_fixed()
            && run()
                .take(zc_count)
                .all(|b| fixed_index(region, false, b).is_some());
        let Some(how) = st.train_how(zc_bytes, false, registered) else {
            // Pinned pages come back with completions the next progress reaps.
            st.stats.would_block += 1;
            return RunGone::Full;
        };
        let count = if how.zc { zc_count } else { count };
        if count < 2 {
            return RunGone::Alone(1);
        }
        let first = bufs.pop_front().expect("a run has two buffers");
        let mut op = op_for(st.spare.pop(), first, None, st.latency.next());
        let rec = op.payload_mut();
        for _ in 1..count {
            rec.push(
                bufs.pop_front()
                    .expect("the run's buffers are at the front"),
            );
        }
        rec.train = Some(Train::new(segment));
        st.held += count;
        st.stats.sends += count as u64;
        let res = st.launch_train(&mut ring, op, how).map(drop);
        let res = res.and_then(|()| ring.submit_if_due(st.eager()));
        // The run is in its request either way; the next progress enters again and reports a
        // failure.
        if res.is_err() {
            st.due.owe();
        }
        RunGone::Sent(count)
    }
}

/// Whether a run may start at the front of `bufs`: its first two buffers are of one size (the
/// one size comparison per buffer of a batch).
fn starts_run<B: SendBuf>(bufs: &VecDeque<B>) -> bool {
    match (bufs.front(), bufs.get(1)) {
        (Some(a), Some(b)) => {
            let len = a.as_bytes().len();
            len > 0 && b.as_bytes().len() == len
        }
        _ => false,
    }
}
