//! [`UringCore`]: what both io_uring engine types (`stream.rs`, `datagram.rs`) keep and answer
//! alike: the ring (its own or a shared one) and, beside it, the [`State`] a buffer goes through.
//! Joining the ring and leaving it are here; each `Engine` call both types answer alike is a
//! method of the same name (and [`answered_by_uring_core!`] writes the calls).

use std::io;
use std::time::Duration;

use socket2::SockAddr;

use super::flow::{fixed_index, State};
use super::ring_ref::{RingGuard, RingRef};
use super::state::{Order, Seat, Trains};
use crate::buf::{BufPool, SendBuf};
use crate::engine::policy::auto::AutoPolicy;
use crate::engine::EngineKind;
use crate::error::{Error, Feature, SendError};
use crate::report::{Readiness, Released, Stats};
use crate::socket::{Family, SockType, Socket};
use crate::sys::uring::{self as sysu, UringConfig, UringShared};

/// The io_uring engine's core, inside each of its types: the ring, and everything else beside it.
pub(super) struct UringCore<B, O> {
    ring: RingRef,
    /// Everything but the ring, apart so that a call can hold the ring's lock while it changes it.
    pub(super) st: State<B, O>,
}

/// How long a sender on a shared ring sleeps before it looks at its inbox again.
const SHARED_WAIT_SLICE: Duration = Duration::from_millis(5);

/// Refuses what `uring-zc` (`zc`) or `uring` cannot send on `sock`: a kernel without io_uring
/// or without zero-copy requests, or zero-copy on a socket other than TCP or UDP.
fn check_support(sock: &Socket, zc: bool) -> Result<(), Error> {
    let unsupported = |reason: String| Error::Unsupported {
        feature: if zc {
            Feature::UringZerocopy(sock.kind)
        } else {
            Feature::IoUring
        },
        reason,
    };
    let probe = sysu::probe().map_err(|e| {
        unsupported(format!(
            "io_uring_setup answered {e} (kernel without io_uring, kernel.io_uring_disabled, \
             or a seccomp filter); use the copy or msg-zc engine"
        ))
    })?;
    if !zc {
        return Ok(());
    }
    if !(probe.send_zc && probe.sendmsg_zc) {
        return Err(unsupported(
            "this kernel lacks IORING_OP_SEND_ZC/SENDMSG_ZC (6.1); use msg-zc".into(),
        ));
    }
    // The kernel sends zero-copy on TCP and UDP only (other protocols clear
    // SOCK_SUPPORT_ZC, and every send would fail with EOPNOTSUPP).
    let k = sock.kind;
    let inet = matches!(k.family, Family::Inet4 | Family::Inet6);
    let tcp = k.ty == SockType::Stream && k.protocol == libc::IPPROTO_TCP;
    let udp = k.ty == SockType::Dgram && k.protocol == libc::IPPROTO_UDP;
    if !inet || !(tcp || udp) {
        return Err(unsupported(format!(
            "zero-copy io_uring sends need a TCP or UDP socket, not {} (protocol {}); use \
             uring",
            k, k.protocol
        )));
    }
    Ok(())
}

impl<B: SendBuf, O: Order> UringCore<B, O> {
    /// The core of an engine on `sock` whose requests go in `order`: zero-copy requests when
    /// `zc` (`uring-zc`, or `auto`, whose policy then chooses per record), on the sender's own
    /// ring made with `cfg` or on `shared`.
    pub(super) fn open(
        sock: &Socket,
        zc: bool,
        cfg: UringConfig,
        shared: Option<&UringShared>,
        auto: Option<AutoPolicy>,
        order: O,
    ) -> Result<Self, Error> {
        check_support(sock, zc)?;
        let fd = sock.fd().try_clone_to_owned().map_err(|source| Error::Io {
            context: "fcntl(F_DUPFD_CLOEXEC) of the socket for io_uring",
            source,
        })?;
        let ring = RingRef::new(cfg, shared)?;
        // A datagram socket names itself by registered file slot (see `FILE_SLOTS`).
        let owner = ring.shared().join(&fd, !O::ORDERED)?;
        let cfg = ring.shared().cfg;
        let report = zc && sysu::report_usage();
        let zc_flags = if report {
            sysu::SEND_ZC_REPORT_USAGE
        } else {
            0
        };
        let trains = Trains::new(sock.kind.family == Family::Inet6);
        let seat = Seat::new(owner, fd);
        let st = State::new(seat, order, (zc, zc_flags), auto, cfg, trains);
        Ok(Self { ring, st })
    }

    /// The ring (locked if shared) and the state beside it.
    #[inline]
    pub(super) fn split(&mut self) -> (RingGuard<'_>, &mut State<B, O>) {
        (self.ring.get(), &mut self.st)
    }
}

impl<B, O> Drop for UringCore<B, O> {
    fn drop(&mut self) {
        if !self.st.seat.left {
            self.ring.get().leave(self.st.seat.owner);
        }
        if self.st.seat.leak_fd {
            // An SQE that names this number may still be in the SQ: never let the number be
            // reused.
            std::mem::forget(self.st.seat.fd.take());
        }
        // Records still in the kernel's hands are freed after their last CQE, never before.
        self.ring.release();
    }
}

/// What both engine types answer alike, from their [`UringCore`]: each `Engine` call of the same
/// name (see [`Engine`](crate::engine::Engine)).
impl<B: SendBuf, O: Order> UringCore<B, O> {
    /// [`Engine::try_send`](crate::engine::Engine::try_send): queues `buf` and issues; with
    /// nothing queued before it, no `auto` and the socket free, its request forms at once.
    #[inline]
    pub(super) fn try_send(
        &mut self,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let (mut ring, st) = self.split();
        if let Some(errno) = st.refusal() {
            return Err(SendError::Io {
                buf,
                error: io::Error::from_raw_os_error(errno),
            });
        }
        if st.queue.len() >= st.cfg.queue_limit {
            if let Err(error) = st.kick(&mut ring, out) {
                return Err(SendError::Io { buf, error });
            }
            if st.queue.len() >= st.cfg.queue_limit {
                st.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        st.held += 1;
        st.stats.sends += 1;
        let dest = dest.map(Box::new);
        let res = if st.queue.is_empty() && st.auto.is_none() && st.may_issue(&ring) {
            // Nothing queued before it: form its request at once, as `issue` would after
            // queueing it (no trip through the queue).
            let region = st.fixed_region(&ring);
            let (zc, merge) = (st.zc, st.order.merge());
            let fixed = zc && fixed_index(region, merge, &buf).is_some();
            st.form(&mut ring, region, (buf, dest), zc, fixed, None, None)
                .map(drop)
        } else {
            st.queue.push_back((buf, dest));
            st.issue(&mut ring, out)
        };
        let res = res.and_then(|()| ring.submit_if_due(st.eager()));
        // The buffer is queued either way; the next progress enters again and reports a failure.
        if res.is_err() {
            st.due.owe();
        }
        Ok(())
    }

    pub(super) fn progress(&mut self, out: &mut Vec<Released<B>>) -> io::Result<()> {
        let (mut ring, st) = self.split();
        st.kick(&mut ring, out)
    }

    pub(super) fn readiness(&mut self) -> Readiness {
        // Whoever waits next must not leave requests unsubmitted: they could be waiting behind
        // another socket's request that never completes.
        let (mut ring, st) = self.split();
        let failed = ring.submit().is_err();
        let fd = ring.fd();
        drop(ring);
        if failed || st.due.is_owed() {
            // Something could not be submitted or pushed: the next progress must try again (and
            // report a failure), so the wait must end at once. A ring's fd is writable while its
            // SQ has room, which a failed submit leaves as it was.
            st.due.owe();
            return Readiness {
                fd,
                events: libc::POLLIN | libc::POLLOUT,
            };
        }
        Readiness {
            fd,
            events: libc::POLLIN,
        }
    }

    pub(super) fn batch(&mut self, open: bool) {
        let (mut ring, st) = self.split();
        st.batching = open;
        // The batch's end: what it left in the SQ is entered now, even with a full batch before
        // it still in flight (no-op with the SQ empty); buffers waiting in `queue` for room go at
        // the next progress, as after `try_send`. A failure is the next progress's to report.
        if !open && !st.seat.left && ring.submit().is_err() {
            st.due.owe();
        }
    }

    pub(super) fn wait_slice(&self) -> Option<Duration> {
        if self.st.due.is_owed() {
            // Not even a full SQ may make the wait on POLLOUT endless.
            return Some(Duration::ZERO);
        }
        // Another sender on a shared ring may reap our completions into our inbox without the
        // ring's fd ever waking us: look again soon.
        self.ring.is_shared().then_some(SHARED_WAIT_SLICE)
    }

    pub(super) fn stats(&self) -> Stats {
        let mut s = self.st.stats;
        let (pinned, in_flight) = self.st.pinned();
        (s.pinned_bytes, s.zerocopy_in_flight) = (pinned as u64, in_flight as u64);
        if let Some(auto) = &self.st.auto {
            auto.counts().add_to(&mut s);
        }
        s
    }

    pub(super) fn auto_policy(&self) -> Option<&AutoPolicy> {
        self.st.auto.as_ref()
    }

    #[cfg(feature = "tokio")]
    pub(super) fn shared_ring(&self) -> Option<(UringShared, u16)> {
        let ring = self.ring.shared_handle().filter(|_| !self.st.seat.left)?;
        Some((ring, self.st.seat.owner))
    }

    pub(super) fn register_pool(&mut self, pool: &BufPool) -> Result<(), Error> {
        if !self.st.zc {
            return Err(Error::Unsupported {
                feature: Feature::RegisteredBuffers(EngineKind::Uring),
                reason: "plain io_uring sends copy anyway; use uring-zc to send from registered \
                         memory"
                    .into(),
            });
        }
        self.ring.shared().register(pool)
    }

    pub(super) fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> usize {
        let (mut ring, st) = self.split();
        st.shutdown(&mut ring, out)
    }
}

/// The `Engine` methods both io_uring engine types answer from their `core` alike.
macro_rules! answered_by_uring_core {
    () => {
        fn progress(
            &mut self,
            _sock: &$crate::socket::Socket,
            out: &mut Vec<$crate::report::Released<B>>,
        ) -> std::io::Result<()> {
            self.core.progress(out)
        }

        fn held(&self) -> usize {
            self.core.st.held
        }

        fn readiness(
            &mut self,
            _sock: &$crate::socket::Socket,
            _retry: bool,
        ) -> $crate::report::Readiness {
            self.core.readiness()
        }

        fn batch(&mut self, open: bool) {
            self.core.batch(open)
        }

        fn wait_slice(&self) -> Option<std::time::Duration> {
            self.core.wait_slice()
        }

        fn stats(&self) -> $crate::report::Stats {
            self.core.stats()
        }

        fn auto_policy(&self) -> Option<&$crate::engine::policy::auto::AutoPolicy> {
            self.core.auto_policy()
        }

        #[cfg(feature = "tokio")]
        fn shared_ring(&self) -> Option<($crate::sys::uring::UringShared, u16)> {
            self.core.shared_ring()
        }

        fn register_pool(
            &mut self,
            pool: &$crate::buf::BufPool,
        ) -> Result<(), $crate::error::Error> {
            self.core.register_pool(pool)
        }

        fn shutdown(&mut self, out: &mut Vec<$crate::report::Released<B>>) -> usize {
            self.core.shutdown(out)
        }
    };
}
pub(super) use answered_by_uring_core;
