//! Zero-copy sends from tokio programs (feature `tokio`): [`AsyncSender`].
//!
//! tokio's `AsyncWrite` borrows the bytes only for the call, so a zero-copy write through it must
//! copy. [`AsyncSender`] takes owned buffers instead, in two stages: [`send`](AsyncSender::send)
//! resolves when the buffer is queued in the kernel (waiting while the socket or the zero-copy
//! budget is full), and the buffer comes back later, when the kernel let go of it, through
//! [`released`](AsyncSender::released) (or [`drain_released`](AsyncSender::drain_released)),
//! with its [`Report`](crate::Report).
//!
//! ## Readiness, without busy polling
//! The sender waits through tokio's reactor on a duplicate of the descriptor
//! [`Sender::readiness`] names (a duplicate, because the same descriptor cannot be registered
//! twice, and one ring serves many senders):
//! - `msg-zc` (and `copy`): the socket, for `Interest::ERROR` (completions on the error queue make
//!   the socket report `EPOLLERR`; tokio 1.32) and `Interest::WRITABLE` only while a send waits
//!   for room. Waiting for completions does not wake on mere writability.
//! - `uring`, `uring-zc`: the io_uring's fd, readable when completions are posted. Senders on a
//!   shared ring also look again every [`Sender::wait_slice`] (another sender may have reaped
//!   their completions for them), with `tokio::time::sleep`-style timeouts, never spinning.
//!
//! Readiness is edge-triggered: it is cleared only after a reap and a retry made no progress,
//! with tokio's readiness tick, so a completion that lands in between is not lost.
//!
//! ## Runtimes and rings
//! Works on the current-thread and the multi-thread runtime. For the io_uring engines,
//! [`thread_ring`] gives one ring per runtime thread, so the senders made on a thread share one
//! `io_uring_enter`. io_uring retries a parked request on the thread that submitted it: a
//! runtime's worker threads live as long as the runtime, and a task that moves to another worker
//! keeps working (the ring is locked per operation; a request whose submitting thread exited is
//! submitted again, see [`UringShared`](crate::UringShared)).
//!
//! ## Never blocking an executor thread
//! [`flush`](AsyncSender::flush) and [`close`](AsyncSender::close) are async with a deadline.
//! Dropping an `AsyncSender` that still has buffers in the kernel does not wait in `Drop`: the
//! sender is moved into a task spawned on the current runtime, which closes it with a deadline of
//! [`DROP_DEADLINE`] (buffers still held then are kept, counted in
//! [`leaked_buffers`](crate::leaked_buffers), never freed). Only when there is no runtime to spawn
//! on (dropped outside one, or while the runtime shuts down) does the blocking [`Sender`]'s own
//! drop run, which waits up to 1 s.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use bytes::Bytes;
//! use std::time::Duration;
//! use zerotx::tokio::AsyncSender;
//! use zerotx::EngineKind;
//!
//! let object = Bytes::from(vec![7u8; 1 << 20]); // shared: each send is a clone, not a copy
//! let stream = tokio::net::TcpStream::connect("127.0.0.1:9000").await?;
//! let mut tx = AsyncSender::from_tcp(stream, EngineKind::MsgZerocopy)?;
//! tx.send(object.clone()).await?;           // queued; waits while the socket is full
//! while let Some(done) = tx.released().await? {
//!     println!("{} bytes, zero-copy: {}", done.report.bytes, done.report.path.is_zerocopy());
//! }
//! let closed = tx.close(Duration::from_secs(5)).await;
//! assert_eq!(closed.kept, 0);
//! # Ok(()) }
//! ```
#![allow(unsafe_code)]

mod ring;

pub use ring::thread_ring;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use ::tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use ::tokio::io::Interest;
use ::tokio::time::Instant;

use crate::addr::Destination;
use crate::buf::SendBuf;
use crate::engine::EngineKind;
use crate::error::{Error, SendError};
use crate::report::{Released, Stats};
use crate::sender::{Closed, Sender, SenderConfig};

/// How long the task that closes a dropped [`AsyncSender`] waits for the kernel to release its
/// buffers before keeping (leaking) them.
pub const DROP_DEADLINE: Duration = Duration::from_secs(5);

/// A [`Sender`] driven by tokio's reactor: async sends with backpressure, released buffers
/// back asynchronously, async flush and close. See the [module docs](self).
///
/// Every method takes `&mut self`: one task drives a sender. Releases are collected whenever the
/// sender makes progress (also during `send`) and wait, in order, for
/// [`released`](Self::released) or [`drain_released`](Self::drain_released); take them
/// regularly, or they accumulate (each holds its buffer).
pub struct AsyncSender<B: SendBuf> {
    core: Option<Core<B>>,
}

/// The parts, apart from the drop policy (the task that closes a dropped sender holds these).
struct Core<B: SendBuf> {
    /// Declared first: deregistered and closed before the sender closes the socket.
    io: AsyncFd<OwnedFd>,
    tx: Sender<B>,
    ring: bool,
    released: VecDeque<Released<B>>,
    scratch: Vec<Released<B>>,
}

impl<B: SendBuf> std::fmt::Debug for AsyncSender<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("AsyncSender");
        if let Some(c) = &self.core {
            d.field("sender", &c.tx)
                .field("released", &c.released.len());
        }
        d.finish()
    }
}

/// What to wait for next: tokio interest, or `None` to look again at once (after a yield).
fn interest<B: SendBuf>(tx: &mut Sender<B>, ring: bool) -> Option<Interest> {
    let r = tx.readiness();
    let room = r.events & libc::POLLOUT != 0;
    match (ring, room) {
        // A ring asks for POLLOUT only when something could not be submitted: try again now.
        (true, true) => None,
        (true, false) => Some(Interest::READABLE),
        (false, true) => Some(Interest::WRITABLE | Interest::ERROR),
        (false, false) => Some(Interest::ERROR),
    }
}

/// Waits for `interest` on `io`, at most `slice` and never past `deadline`. `Ok(None)`: the
/// slice or the deadline ended the wait, or there was nothing to wait for.
async fn ready<'a>(
    io: &'a AsyncFd<OwnedFd>,
    interest: Option<Interest>,
    slice: Option<Duration>,
    deadline: Option<Instant>,
) -> io::Result<Option<AsyncFdReadyGuard<'a, OwnedFd>>> {
    let Some(interest) = interest else {
        ::tokio::task::yield_now().await;
        return Ok(None);
    };
    let until = match (slice.map(|s| Instant::now() + s), deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match until {
        Some(t) if t <= Instant::now() => {
            ::tokio::task::yield_now().await;
            Ok(None)
        }
        Some(t) => match ::tokio::time::timeout_at(t, io.ready(interest)).await {
            Ok(guard) => guard.map(Some),
            Err(_) => Ok(None),
        },
        None => io.ready(interest).await.map(Some),
    }
}

impl<B: SendBuf> Core<B> {
    /// Reaps into the queue of released buffers; returns how many came.
    fn reap(&mut self) -> io::Result<usize> {
        let n = self.tx.reap(&mut self.scratch)?;
        self.released.extend(self.scratch.drain(..));
        Ok(n)
    }

    /// One wait: for readiness (bounded by `deadline`), then a reap. Readiness is cleared only
    /// when the reap brought nothing and `still_blocked` (a retried send, run after the reap)
    /// says nothing else moved either.
    async fn wait_once(
        &mut self,
        deadline: Option<Instant>,
        mut still_blocked: impl FnMut(&mut Sender<B>) -> bool,
    ) -> io::Result<usize> {
        let interest = interest(&mut self.tx, self.ring);
        let slice = self.tx.wait_slice();
        let guard = ready(&self.io, interest, slice, deadline).await?;
        let n = self.tx.reap(&mut self.scratch)?;
        self.released.extend(self.scratch.drain(..));
        if n == 0 && still_blocked(&mut self.tx) {
            if let Some(mut g) = guard {
                g.clear_ready();
            }
        }
        Ok(n)
    }

    async fn flush(&mut self, deadline: Instant) -> Result<(), Error> {
        let io = |source| Error::Io {
            context: "waiting for completions",
            source,
        };
        loop {
            self.reap().map_err(io)?;
            if self.tx.in_flight() == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::TimedOut {
                    outstanding: self.tx.in_flight(),
                });
            }
            self.wait_once(Some(deadline), |_| true).await.map_err(io)?;
        }
    }

    async fn close(mut self, timeout: Duration) -> Closed<B> {
        let _ = self.flush(Instant::now() + timeout).await;
        let Core {
            io,
            tx,
            mut released,
            ..
        } = self;
        // Deregister and close the duplicate first; the socket itself goes back in `Closed`.
        drop(io);
        // Nothing can be waited for any more: whatever the kernel still holds is kept.
        let mut closed = tx.close(Duration::ZERO);
        released.extend(closed.released.drain(..));
        closed.released = released.into();
        closed
    }
}

impl<B: SendBuf> AsyncSender<B> {
    /// Makes a sender over a socket the caller owns (see [`Sender::new`]) and registers its
    /// readiness with the current tokio runtime. Fails with [`Error::Config`] outside a runtime.
    pub fn new(fd: impl Into<OwnedFd>, kind: EngineKind) -> Result<Self, Error> {
        Self::from_sender(Sender::new(fd, kind)?)
    }

    /// As [`new`](Self::new), with a [`SenderConfig`] (e.g. a shared ring from [`thread_ring`]).
    pub fn with_config(fd: impl Into<OwnedFd>, cfg: SenderConfig) -> Result<Self, Error> {
        Self::from_sender(Sender::with_config(fd, cfg)?)
    }

    /// A sender over a connected tokio `TcpStream` (taken out of tokio's reactor with
    /// `into_std`; read from a duplicate made beforehand if the connection also receives).
    pub fn from_tcp(stream: ::tokio::net::TcpStream, kind: EngineKind) -> Result<Self, Error> {
        let std = stream.into_std().map_err(|source| Error::Io {
            context: "deregistering the TcpStream from tokio",
            source,
        })?;
        Self::new(std, kind)
    }

    /// A sender over a tokio `UdpSocket` (connected, or sending with [`send_to`](Self::send_to)).
    pub fn from_udp(sock: ::tokio::net::UdpSocket, kind: EngineKind) -> Result<Self, Error> {
        let std = sock.into_std().map_err(|source| Error::Io {
            context: "deregistering the UdpSocket from tokio",
            source,
        })?;
        Self::new(std, kind)
    }

    /// Wraps a blocking [`Sender`]: registers a duplicate of the descriptor its
    /// [`readiness`](Sender::readiness) names (`dup(2)`, `epoll_ctl` through tokio).
    pub fn from_sender(mut tx: Sender<B>) -> Result<Self, Error> {
        if ::tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Config {
                problem: "an AsyncSender made outside a tokio runtime".into(),
                fix: "make it from a task, or inside Runtime::enter".into(),
            });
        }
        let ring = matches!(tx.engine(), EngineKind::Uring | EngineKind::UringZc);
        let fd = tx.readiness().fd;
        // SAFETY: `fd` is the socket or the ring `tx` holds open, and `tx` lives across this
        // borrow; the duplicate made from it is independent of `tx` afterwards.
        let dup = unsafe { BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|source| Error::Io {
                context: "fcntl(F_DUPFD_CLOEXEC) of the readiness descriptor",
                source,
            })?;
        let interest = if ring {
            Interest::READABLE
        } else {
            Interest::WRITABLE | Interest::ERROR
        };
        // SAFETY: the AsyncFd owns `dup`, an open descriptor only it closes, so it stays open and
        // names the same file for the AsyncFd's whole life.
        let io =
            unsafe { AsyncFd::register_with_interest(dup, interest) }.map_err(|e| Error::Io {
                context: "registering the readiness descriptor with tokio (epoll_ctl)",
                source: e.into(),
            })?;
        Ok(Self {
            core: Some(Core {
                io,
                tx,
                ring,
                released: VecDeque::new(),
                scratch: Vec::new(),
            }),
        })
    }

    fn core(&mut self) -> &mut Core<B> {
        self.core.as_mut().expect("present until close")
    }

    /// The blocking sender inside, for what this type does not wrap ([`Sender::stats`],
    /// [`Sender::socket_kind`], [`Sender::register_pool`]...). Do not call its blocking methods
    /// from a task.
    pub fn sender(&mut self) -> &mut Sender<B> {
        &mut self.core().tx
    }

    /// The engine in use.
    pub fn engine(&self) -> EngineKind {
        self.core.as_ref().expect("present until close").tx.engine()
    }

    /// Counters ([`Sender::stats`]).
    pub fn stats(&self) -> Stats {
        self.core.as_ref().expect("present until close").tx.stats()
    }

    /// Sends `buf` on the connected socket: resolves once the kernel (or the engine's queue) took
    /// it, waiting without blocking the thread while the socket or the zero-copy budget is full.
    /// The buffer comes back later from [`released`](Self::released). An error hands it back.
    ///
    /// Cancel-safe in the sense that matters: dropping the future before it resolves drops the
    /// buffer only if it was not accepted (an accepted buffer stays with the sender).
    pub async fn send(&mut self, buf: B) -> Result<(), SendError<B>> {
        self.send_inner(buf, None).await
    }

    /// As [`send`](Self::send), to `dest` (datagram sockets).
    pub async fn send_to(
        &mut self,
        buf: B,
        dest: impl Into<Destination>,
    ) -> Result<(), SendError<B>> {
        self.send_inner(buf, Some(dest.into())).await
    }

    async fn send_inner(&mut self, buf: B, dest: Option<Destination>) -> Result<(), SendError<B>> {
        let core = self.core();
        let attempt = |tx: &mut Sender<B>, buf: B| match dest {
            None => tx.try_send(buf),
            Some(d) => tx.try_send_to(buf, d),
        };
        let mut held = match attempt(&mut core.tx, buf) {
            Err(SendError::WouldBlock(b)) => b,
            other => return other,
        };
        loop {
            // The retry runs after the reap inside the wait, so readiness is cleared only when
            // neither made progress; the outcome leaves through `outcome`.
            let mut slot = Some(held);
            let mut outcome = None;
            let waited = core
                .wait_once(None, |tx| {
                    let buf = slot.take().expect("one retry per wait");
                    match attempt(tx, buf) {
                        Err(SendError::WouldBlock(b)) => {
                            slot = Some(b);
                            true
                        }
                        other => {
                            outcome = Some(other);
                            false
                        }
                    }
                })
                .await;
            if let Some(outcome) = outcome {
                return outcome;
            }
            let buf = slot.take().expect("handed back");
            if let Err(error) = waited {
                return Err(SendError::Io { buf, error });
            }
            held = buf;
        }
    }

    /// The next released buffer, in the order they came: waits (without blocking the thread)
    /// while the kernel holds buffers and none is released; `Ok(None)` once nothing is held
    /// and every released buffer was taken.
    pub async fn released(&mut self) -> io::Result<Option<Released<B>>> {
        let core = self.core();
        loop {
            if let Some(r) = core.released.pop_front() {
                return Ok(Some(r));
            }
            if core.reap()? > 0 {
                continue;
            }
            if core.tx.in_flight() == 0 {
                return Ok(None);
            }
            core.wait_once(None, |_| true).await?;
        }
    }

    /// Without waiting: collects what the kernel released and moves every released buffer into
    /// `out`. Returns how many it moved.
    pub fn drain_released(&mut self, out: &mut Vec<Released<B>>) -> io::Result<usize> {
        let core = self.core();
        core.reap()?;
        let n = core.released.len();
        out.extend(core.released.drain(..));
        Ok(n)
    }

    /// Buffers accepted and not yet taken back (in the kernel, or released and waiting here).
    pub fn outstanding(&self) -> usize {
        let c = self.core.as_ref().expect("present until close");
        c.tx.outstanding() + c.released.len()
    }

    /// Buffers the kernel (or the engine's queue) still holds.
    pub fn in_flight(&self) -> usize {
        self.core
            .as_ref()
            .expect("present until close")
            .tx
            .in_flight()
    }

    /// Waits until the kernel released every buffer, up to `timeout` ([`Error::TimedOut`] names
    /// how many are still held). Released buffers wait for [`released`](Self::released).
    pub async fn flush(&mut self, timeout: Duration) -> Result<(), Error> {
        self.core().flush(Instant::now() + timeout).await
    }

    /// Flushes for up to `timeout`, then gives up the socket (see [`Sender::close`]): buffers the
    /// kernel still holds at the deadline are kept (leaked on purpose, counted in
    /// [`Closed::kept`]), never handed back early; every other buffer, including released ones
    /// not yet taken, comes back in [`Closed::released`].
    pub async fn close(mut self, timeout: Duration) -> Closed<B> {
        let core = self.core.take().expect("present until close");
        core.close(timeout).await
    }
}

impl<B: SendBuf> Drop for AsyncSender<B> {
    fn drop(&mut self) {
        let Some(core) = self.core.take() else {
            return;
        };
        if core.tx.in_flight() == 0 {
            return;
        }
        // Not here: this may be an executor thread. The task owns a `Core`, which has no drop
        // policy of its own: if the runtime drops the task unrun, the blocking sender's drop runs.
        if let Ok(rt) = ::tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = core.close(DROP_DEADLINE).await;
            });
        }
    }
}
