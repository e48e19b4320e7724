//! Engines: the ways a buffer can leave, behind one trait.
//!
//! - [`EngineKind::Auto`] (the default): io_uring or `sendmsg(2)` per socket from what the kernel
//!   offers (chosen once by the engine factory, `factory.rs`), zero-copy or copy per send from
//!   what it reports ([`policy::auto`]).
//! - [`EngineKind::Copy`]: `sendmsg(2)`, the kernel copies. Works on every socket kind.
//! - [`EngineKind::MsgZerocopy`]: `sendmsg(MSG_ZEROCOPY)` with completions from the socket error
//!   queue (TCP 4.14, UDP 5.0, vsock 6.7).
//!
//! - [`EngineKind::Uring`]: `IORING_OP_SENDMSG`, the copy path without a syscall per send.
//! - [`EngineKind::UringZc`]: `IORING_OP_SENDMSG_ZC` / `IORING_OP_SEND_ZC` (6.1), from registered
//!   buffers when the sender has a registered [`BufPool`](crate::buf::BufPool).
//!
//! The first two are `sendmsg(2)`: one type per engine and socket shape, built by
//! [`sendmsg::build`]; the trait is shaped for asynchronous engines
//! too: an engine may keep buffers queued in userspace, completes them from [`Engine::progress`],
//! and names the descriptor to wait on in [`Engine::readiness`].

pub(crate) mod clock;
pub(crate) mod copy;
pub(crate) mod errqueue;
pub(crate) mod msg_zc;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod sendmsg;
pub(crate) mod sendmsg_core;
pub(crate) mod sendmsg_runs;
pub(crate) mod sendmsg_train;
pub(crate) mod unfragmented;
pub(crate) mod uring;

pub(crate) use crate::kind::EngineKind;

use std::collections::VecDeque;
use std::io;

use socket2::SockAddr;

use crate::buf::{BufPool, SendBuf};
use crate::config::AtCap;
use crate::error::{Error, SendError};
use crate::report::{AutoFacts, Readiness, Released, Stats};
use crate::socket::Socket;
#[cfg(feature = "tokio")]
use crate::sys::uring::UringShared;

/// [`SendError::Invalid`]'s reason for a buffer of no bytes.
pub(crate) const EMPTY_BUFFER: &str = "zero-length buffer: there is nothing to send";

/// The loop of [`Engine::try_send_batch`]: hands `send` each buffer from the front of `bufs`
/// ([`send_front`]) until one is handed back or fails; returns how many it accepted.
#[inline(always)]
pub(crate) fn send_each<B: SendBuf>(
    bufs: &mut VecDeque<B>,
    mut send: impl FnMut(B) -> Result<(), SendError<B>>,
) -> Result<usize, SendError<B>> {
    let mut accepted = 0;
    while send_front(bufs, &mut send)? {
        accepted += 1;
    }
    Ok(accepted)
}

/// One step of a batch: hands `send` the buffer at the front of `bufs`, refusing an empty one
/// (the one check a batch needs per buffer). `Ok(true)`: accepted; `Ok(false)`: `bufs` is empty,
/// or `send` handed the buffer back and it is at the front again; `Err`: it failed, and comes
/// back in the error.
#[inline(always)]
pub(crate) fn send_front<B: SendBuf>(
    bufs: &mut VecDeque<B>,
    send: impl FnOnce(B) -> Result<(), SendError<B>>,
) -> Result<bool, SendError<B>> {
    let Some(buf) = bufs.pop_front() else {
        return Ok(false);
    };
    if buf.as_bytes().is_empty() {
        return Err(SendError::Invalid {
            buf,
            reason: EMPTY_BUFFER,
        });
    }
    match send(buf) {
        Ok(()) => Ok(true),
        Err(SendError::WouldBlock(buf)) => {
            bufs.push_front(buf);
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// One way of sending. The sender validates input (and [`Engine::try_send_batch`] each buffer's
/// length, the one check a batch needs per buffer) and owns the socket; the engine owns every
/// buffer it accepted until it appends it, released, to `out`: the sender's one queue of released
/// buffers. Every engine keeps its sends as [`record::Record`]s and releases them through
/// [`record::Record::release`]; every decision on how a buffer goes is asked of [`policy`].
pub(crate) trait Engine<B: SendBuf>: Send {
    /// Accepts `buf` (now or queued) or hands it back; may release earlier buffers into `out`.
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>>;

    /// Sends from the front of `bufs` on the connected socket until one is handed back (it goes
    /// back to the front) or fails (the ones after it stay); returns how many it accepted. One
    /// call per batch rather than one dynamic call per buffer: in here each engine's own
    /// `try_send` is called directly, and inlines (an engine whose `try_send` is too large for
    /// the compiler to inline overrides this with [`send_each`] around its inlined body).
    #[inline]
    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        send_each(bufs, |buf| self.try_send(sock, buf, None, out))
    }

    /// Accepts `buf` (now or queued) as one train of `segment`-byte datagrams (UDP GSO: the
    /// kernel cuts it, the last datagram may be shorter) to `dest` or the connected peer, or hands
    /// it back; released once, after the train's completion. The sender checked the socket is
    /// UDP. Every engine that holds a UDP socket sends trains (the io_uring one as one request
    /// per train, `uring/train.rs`); the default, for an engine that holds no datagram socket,
    /// refuses with [`NO_GSO_ENGINE`](policy::train::NO_GSO_ENGINE).
    fn try_send_train(
        &mut self,
        _sock: &Socket,
        buf: B,
        _segment: u16,
        _dest: Option<SockAddr>,
        _out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        Err(SendError::Invalid {
            buf,
            reason: policy::train::NO_GSO_ENGINE,
        })
    }

    /// Without blocking: pushes queued bytes, reads completions, appends released buffers.
    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()>;

    /// Buffers accepted and not yet appended to an `out`: what the kernel (or the engine's queue)
    /// still holds.
    fn held(&self) -> usize;

    /// What to wait for. Called right before a wait: an engine that batches submissions enters
    /// the kernel here so nothing queued waits behind the sleeper. `retry`: the waiter holds a
    /// buffer [`try_send`](Engine::try_send) handed back and will send it again when woken (a
    /// waiter for releases only passes `false`, and must not be woken by room alone).
    fn readiness(&mut self, sock: &Socket, retry: bool) -> Readiness;

    /// A batch of sends begins (`true`) or ends (`false`), for
    /// [`Sender::send_batch`](crate::Sender::send_batch): in between, an engine that batches
    /// submissions enters the kernel only for a full batch; at the end it enters for whatever the
    /// batch left unsubmitted. An engine that sends at once has nothing to do.
    fn batch(&mut self, _open: bool) {}

    /// Counters.
    fn stats(&self) -> Stats;

    /// How long a waiter may sleep before it must look again even without a wake-up (a shared
    /// ring's completions can be reaped by another sender). `None`: sleep until woken.
    fn wait_slice(&self) -> Option<std::time::Duration> {
        None
    }

    /// The shared ring this engine's requests go to, and its owner id there (see
    /// [`UringShared::route`]); `None` for a ring of its own or no ring.
    #[cfg(feature = "tokio")]
    fn shared_ring(&self) -> Option<(UringShared, u16)> {
        None
    }

    /// `auto`'s policy, for [`Sender::explain`](crate::Sender::explain).
    fn auto_policy(&self) -> Option<&policy::auto::AutoPolicy> {
        None
    }

    /// What `auto`'s policy holds now, for [`Sender::explain`](crate::Sender::explain): read
    /// from [`auto_policy`](Self::auto_policy), never overridden.
    fn explain_facts(&self) -> Option<AutoFacts> {
        self.auto_policy().map(auto_facts)
    }

    /// Registers a pool's memory so its buffers send without per-send page pinning.
    fn register_pool(&mut self, pool: &BufPool) -> Result<(), Error>;

    /// Gives up: a partly sent head is ended with an error and released once the kernel is done
    /// with it (into `out`, with anything else ready); returns how many buffers the kernel may
    /// still read. The engine keeps those (leaks them: never frees them, never hands them back),
    /// and the caller counts them as kept.
    fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> usize;

    /// Puts back what the engine changed on `sock` (the path-MTU modes of a zero-copy datagram
    /// socket) before the caller gets it back; after [`shutdown`](Self::shutdown).
    fn give_back(&mut self, _sock: &Socket) {}
}

/// What `p` holds now, as the report explains it.
fn auto_facts(p: &policy::auto::AutoPolicy) -> AutoFacts {
    let thresholds = p.thresholds();
    let caps = p.caps();
    AutoFacts {
        threshold: thresholds.user,
        registered_threshold: thresholds.registered,
        tuned: p.tuned(),
        cap_sends: caps.sends,
        cap_bytes: caps.bytes,
        waits_at_cap: p.at_cap() == AtCap::Wait,
        reports_copies: p.reports_copies(),
        next_probe_in: p.next_probe_in(),
    }
}
