//! Zero-copy sends from tokio programs (feature `tokio`): [`AsyncSender`].
//!
//! tokio's `AsyncWrite` borrows the bytes only for the call, so a zero-copy write through it must
//! copy. [`AsyncSender`] takes owned buffers instead, in two stages: [`send`](AsyncSender::send)
//! resolves when the sender accepted the buffer (waiting while the socket or the zero-copy budget
//! is full), and the buffer comes back later, when the kernel let go of it, from
//! [`released`](AsyncSender::released) (or [`drain_released`](AsyncSender::drain_released)),
//! with its [`Report`](crate::Report).
//!
//! Releases come as one ordered stream per sender rather than one future per buffer: the kernel
//! completes zero-copy sends in coalesced ranges (one error-queue message can release hundreds of
//! buffers), a server usually only recycles or counts what comes back, and a future per buffer
//! would cost a channel allocation per send. The buffer's identity travels with it, so a caller
//! that wants per-buffer completion matches on the buffer it gets back.
//!
//! A consumer task that runs beside the sending one takes them from a
//! [`releases`](AsyncSender::releases) stream, which waits while nothing is in flight and ends
//! only when the sender is closed. [`write_all`](AsyncSender::write_all) sends one `Bytes` whole,
//! in slices, and resolves once the kernel released them all (or fails with the first failure).
//!
//! ## With no configuration
//! [`from_tcp`](AsyncSender::from_tcp) and [`from_udp`](AsyncSender::from_udp) put the io_uring
//! engines (and `auto` where it takes io_uring) on the runtime thread's shared ring
//! ([`thread_ring`]): one ring per thread, not one per connection. Where that ring cannot take
//! the sender, it is made as [`AsyncSender::new`] makes it;
//! [`from_tcp_with`](AsyncSender::from_tcp_with) takes a [`SenderConfig`] as it is.
//! [`split_tcp`](AsyncSender::split_tcp) splits a connection into a read half and the sender, as
//! tokio's `into_split` does.
//!
//! ## Why not `futures::Sink`
//! A `Sink` fits one stage, and this contract has two. `poll_ready` must promise room before the
//! item is seen, and whether the sender takes a buffer is known only by trying it (the
//! zero-copy budget depends on the buffer), so a `Sink` would hold a buffer of its own between
//! calls. And a `Sink` never gives its items back: the released buffers, their reports and their
//! errors would be dropped inside it, where the two stages hand every buffer back with what
//! became of it. [`send`](AsyncSender::send) and [`send_batch`](AsyncSender::send_batch) are the
//! sink's half; [`releases`](AsyncSender::releases) is the other.
//!
//! ## A driver task, so progress never waits for the owner
//! Each sender spawns one small task on the current runtime that waits on the sender's readiness
//! and makes progress: it pushes bytes the engine still queues (the rest of a short write, the
//! io_uring engines' queued buffers) and reads completions, while the sender's owner awaits
//! something else entirely (reading the next request, say). The owner and the task share the
//! [`Sender`] under a lock held only for non-blocking calls, never across an await.
//!
//! tokio-console lists these tasks by name (`zerotx driver (ENGINE)`, `zerotx ring watcher`) in
//! a build with `RUSTFLAGS="--cfg tokio_unstable"` and zerotx's `tracing` feature, as
//! tokio-console needs anyway: naming a task takes tokio's unstable `task::Builder`. Any other
//! build spawns them unnamed, and the default build needs no unstable flag.
//!
//! ## Readiness, without busy polling
//! The driver waits through tokio's reactor on a duplicate of the descriptor
//! [`Sender::readiness`] names (a duplicate, because the same descriptor cannot be registered
//! twice):
//! - `msg-zc` (and `copy`): the socket, for `Interest::ERROR` (completions on the error queue make
//!   the socket report `EPOLLERR`; tokio 1.32) and `Interest::WRITABLE` only while a send waits
//!   for room, so that waiting for completions does not wake on a writable socket.
//! - `uring`, `uring-zc` on a ring of their own: the io_uring's fd, readable when completions
//!   are posted.
//! - `uring`, `uring-zc` on a shared ring ([`thread_ring`], [`UringShared`](crate::UringShared)):
//!   one registration of the ring's fd per ring and runtime, watched by one task that moves the
//!   completions into their senders' inboxes and wakes only the drivers of the senders that got
//!   some (whoever reaped them), so an idle sender's driver sleeps while others stream.
//!
//! Readiness is edge-triggered: the driver clears it only after a reap brought nothing, with
//! tokio's readiness tick, so a completion that lands in between is not lost.
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
//! Dropping an `AsyncSender` that still has buffers in the kernel does not wait in `Drop`: its
//! driver task goes on collecting completions for up to five seconds, then closes the
//! sender; buffers still held then are kept (counted in [`leaked_buffers`](crate::leaked_buffers)),
//! never freed. When the runtime shuts down before that (dropping the task), the sender closes
//! at once, without waiting: what the kernel may still read is kept the same way, so a runtime
//! with many stalled senders still shuts down at once.
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
//! let tx = AsyncSender::from_tcp(stream, EngineKind::Auto)?; // zero-copy where it pays
//! tx.send(object.clone()).await?;           // accepted; waits while the socket is full
//! tx.flush(Duration::from_secs(5)).await?;  // fails if a buffer came back with an error
//! while let Some(done) = tx.released().await? {
//!     if let Some(e) = done.report.error {
//!         return Err(e.into());
//!     }
//!     println!("{} bytes, zero-copy: {}", done.report.bytes, done.report.path.is_zerocopy());
//! }
//! let closed = tx.close(Duration::from_secs(5)).await;
//! assert_eq!(closed.kept, 0);
//! # Ok(()) }
//! ```

mod driver;
mod releases;
mod ring;
mod sockets;
mod write_all;

pub use releases::Releases;
pub use ring::thread_ring;
pub use sockets::TcpReadHalf;
#[doc(hidden)]
pub use write_all::WRITE_SLICE;

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use ::tokio::io::Interest;
use ::tokio::task::JoinHandle;
use ::tokio::time::Instant;

use crate::addr::Destination;
use crate::buf::SendBuf;
use crate::config::SenderConfig;
use crate::engine::EngineKind;
use crate::error::{Error, SendError};
use crate::report::{Released, Stats};
use crate::sender::{Closed, Sender};
use crate::socket::SockKind;

use driver::{Leave, Shared, Waker};

/// Spawns one of zerotx's tasks (a sender's driver, a ring's watcher) on `rt`, named so
/// tokio-console lists it by name: naming takes `tokio::task::Builder`, which tokio has only when
/// built with `--cfg tokio_unstable` and its `tracing` feature (which zerotx's `tracing` feature
/// turns on), as tokio-console needs anyway. Any other build spawns it unnamed.
#[cfg_attr(not(all(tokio_unstable, feature = "tracing")), allow(unused_variables))]
pub(crate) fn spawn_named<F>(
    name: &str,
    task: F,
    rt: &::tokio::runtime::Handle,
) -> JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    #[cfg(all(tokio_unstable, feature = "tracing"))]
    return ::tokio::task::Builder::new()
        .name(name)
        .spawn_on(task, rt)
        .expect("tokio's task::Builder::spawn_on fails only where spawn would panic");
    #[cfg(not(all(tokio_unstable, feature = "tracing")))]
    rt.spawn(task)
}

/// How long the driver of a dropped [`AsyncSender`] goes on collecting completions before it
/// closes the sender and keeps (leaks) what the kernel still holds.
pub(crate) const DROP_DEADLINE: Duration = Duration::from_secs(5);

/// A [`Sender`] driven by tokio's reactor: async sends with backpressure, released buffers
/// back asynchronously, async flush and close. See the [module docs](self).
///
/// Methods take `&self`: one task may send while another takes releases. Sends from several
/// tasks at once are each accepted whole, in the order the sender accepts them (on a stream
/// socket, send from one task to keep the order yours). Released buffers wait, in order, for
/// [`released`](Self::released) or [`drain_released`](Self::drain_released): take them
/// regularly, or they accumulate (each holds its buffer).
pub struct AsyncSender<B: SendBuf> {
    shared: Arc<Shared<B>>,
    driver: Option<JoinHandle<()>>,
    kind: EngineKind,
    /// Waits on an io_uring rather than the socket.
    ring: bool,
    /// Woken by a shared ring's watcher (see [`thread_ring`]'s module).
    watched: bool,
}

impl<B: SendBuf> std::fmt::Debug for AsyncSender<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("AsyncSender")
            .field("sender", &st.tx)
            .field("released", &st.released.len())
            .finish()
    }
}

impl<B: SendBuf> AsyncSender<B> {
    /// Makes a sender over a socket the caller owns (see [`Sender::new`]), registers its
    /// readiness with the current tokio runtime and spawns its driver task. Fails with
    /// [`Error::Config`] outside a runtime.
    pub fn new(fd: impl Into<OwnedFd>, kind: EngineKind) -> Result<Self, Error> {
        Self::from_sender(Sender::new(fd, kind)?)
    }

    /// As [`new`](Self::new), with a [`SenderConfig`] (e.g. a shared ring from [`thread_ring`]).
    pub fn with_config(fd: impl Into<OwnedFd>, cfg: SenderConfig) -> Result<Self, Error> {
        Self::from_sender(Sender::with_config(fd, cfg)?)
    }

    /// Wraps a blocking [`Sender`]: registers a duplicate of the descriptor its
    /// [`readiness`](Sender::readiness) names (`dup(2)`, `epoll_ctl` through tokio) and spawns
    /// the driver task on the current runtime.
    pub fn from_sender(mut tx: Sender<B>) -> Result<Self, Error> {
        let Ok(rt) = ::tokio::runtime::Handle::try_current() else {
            return Err(Error::Config {
                problem: "an AsyncSender made outside a tokio runtime".into(),
                fix: "make it from a task, or inside Runtime::enter".into(),
            });
        };
        let kind = tx.engine();
        let wake = Arc::new(::tokio::sync::Notify::new());
        if let Some((ring, owner)) = tx.shared_ring() {
            // One registration of the ring's descriptor serves every sender on it.
            let watch = ring::Watch::new(ring, owner, wake.clone())?;
            let shared = Shared::new(tx, wake);
            let driver = spawn_named(
                &format!("zerotx driver ({kind}, shared ring)"),
                driver::drive(shared.clone(), Waker::Ring(watch), true),
                &rt,
            );
            return Ok(Self {
                shared,
                driver: Some(driver),
                kind,
                ring: true,
                watched: true,
            });
        }
        let fd = tx.readiness().fd;
        // `fd` is the socket or the ring `tx` holds open; the duplicate is independent of `tx`.
        let dup = crate::sys::dup_raw(fd).map_err(|source| Error::Io {
            context: "fcntl(F_DUPFD_CLOEXEC) of the readiness descriptor",
            source,
        })?;
        // A socket (msg-zc, copy) or an io_uring (uring, uring-zc): asked of the descriptor, not
        // the engine's name, so an engine chosen at run time is waited on the right way.
        let ring = socket2::SockRef::from(&dup).r#type().is_err();
        let interest = if ring {
            Interest::READABLE
        } else {
            Interest::WRITABLE | Interest::ERROR
        };
        let io = crate::sys::async_fd(dup, interest).map_err(|e| Error::Io {
            context: "registering the readiness descriptor with tokio (epoll_ctl)",
            source: e,
        })?;
        let shared = Shared::new(tx, wake);
        let driver = spawn_named(
            &format!("zerotx driver ({kind})"),
            driver::drive(shared.clone(), Waker::Fd(io), ring),
            &rt,
        );
        Ok(Self {
            shared,
            driver: Some(driver),
            kind,
            ring,
            watched: false,
        })
    }

    /// The driver's wake-up when a shared ring's watcher wakes it (see `State::reap_for_owner`).
    fn watched(&self) -> Option<&::tokio::sync::Notify> {
        self.watched.then_some(&*self.shared.driver)
    }

    /// Test hook: how often the driver task woke and looked at the sender so far.
    #[doc(hidden)]
    pub fn driver_turns(&self) -> u64 {
        self.shared.turns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the sender submits through a shared ring ([`thread_ring`], or a
    /// [`UringShared`](crate::UringShared) its configuration named) rather than a ring or socket
    /// of its own.
    pub fn shares_ring(&self) -> bool {
        self.watched
    }

    /// The engine in use.
    pub fn engine(&self) -> EngineKind {
        self.kind
    }

    /// Why zero-copy is or is not engaged on this socket (see [`Sender::explain`]).
    pub fn explain(&self) -> crate::Explanation {
        self.shared.lock().tx().explain()
    }

    /// What the socket is.
    pub fn socket_kind(&self) -> SockKind {
        self.shared.lock().tx().socket_kind()
    }

    /// Counters ([`Sender::stats`]).
    pub fn stats(&self) -> Stats {
        self.shared.lock().tx().stats()
    }

    /// What the kernel says of this sender's TCP connection ([`Sender::tcp_info`]).
    pub fn tcp_info(&self) -> io::Result<crate::TcpInfo> {
        self.shared.lock().tx().tcp_info()
    }

    /// Sends `buf` on the connected socket: resolves once the sender accepted it, waiting without
    /// blocking the thread while the socket or the zero-copy budget is full. The buffer comes
    /// back later from [`released`](Self::released). An error hands it back.
    ///
    /// Cancel-safe: a future dropped before it resolved drops the buffer only if it was not
    /// accepted (an accepted buffer stays with the sender until the kernel released it).
    pub async fn send(&self, buf: B) -> Result<(), SendError<B>> {
        self.send_inner(buf, None).await
    }

    /// As [`send`](Self::send), to `dest` (datagram sockets).
    pub async fn send_to(&self, buf: B, dest: impl Into<Destination>) -> Result<(), SendError<B>> {
        self.send_inner(buf, Some(dest.into())).await
    }

    /// Sends the buffers of `bufs` in order, front first, as [`send`](Self::send) sends each:
    /// resolves once every one was accepted, waiting without blocking the thread while the socket
    /// or the zero-copy budget is full. The buffers accepted at one go form one batch for the
    /// io_uring engines, entered in one `io_uring_enter` per full batch; on `copy`, `msg-zc` and
    /// `auto` over `sendmsg(2)`, runs of equal-size datagrams go as UDP GSO trains (see
    /// [`Sender::send_batch`]). Connected sockets only.
    ///
    /// Stops at the first failure: that buffer comes back in the error, the ones after it stay in
    /// `bufs`. Cancel-safe: a future dropped before it resolved leaves every buffer it had not
    /// handed to the sender in `bufs`.
    pub async fn send_batch(&self, bufs: &mut VecDeque<B>) -> Result<(), SendError<B>> {
        self.offer(bufs).await
    }

    /// Sends `buf` as one train of datagrams of `segment` bytes each (the last may be shorter),
    /// as [`Sender::send_train`] does: one `sendmsg(2)` with a `UDP_SEGMENT` control message
    /// (UDP GSO), `MSG_ZEROCOPY` on the zero-copy engines; it comes back once, after the train's
    /// completion, with one report. Resolves once the sender accepted it, waiting without
    /// blocking the thread while the socket or the zero-copy budget is full. A train the checks
    /// or the kernel refuse comes back in the error (the kernel's rules: [`Sender::send_train`]).
    /// Connected UDP sockets; cancel-safe as [`send`](Self::send) is.
    pub async fn send_train(&self, buf: B, segment: u16) -> Result<(), SendError<B>> {
        self.offer(One {
            buf: Some(buf),
            dest: None,
            segment: Some(segment),
        })
        .await
    }

    /// As [`send_train`](Self::send_train), to `dest` (a `SocketAddr`).
    pub async fn send_train_to(
        &self,
        buf: B,
        segment: u16,
        dest: impl Into<Destination>,
    ) -> Result<(), SendError<B>> {
        self.offer(One {
            buf: Some(buf),
            dest: Some(dest.into()),
            segment: Some(segment),
        })
        .await
    }

    async fn send_inner(&self, buf: B, dest: Option<Destination>) -> Result<(), SendError<B>> {
        self.offer(One {
            buf: Some(buf),
            dest,
            segment: None,
        })
        .await
    }

    /// Offers `what` to the sender until it took all of it, waiting for the driver while the
    /// sender hands buffers back for lack of room.
    async fn offer(&self, mut what: impl Offer<B>) -> Result<(), SendError<B>> {
        loop {
            let notified = self.shared.owner.notified();
            ::tokio::pin!(notified);
            // Registered before the attempt, so a wake-up between the attempt and the await is
            // not lost.
            notified.as_mut().enable();
            {
                let mut st = self.shared.lock();
                let (accepted, res) = what.offer(st.tx());
                // The driver sleeps when nothing is held; a ring also wants its fresh requests
                // entered soon.
                if accepted > 0 && (st.idle || self.ring) {
                    st.idle = false;
                    self.shared.driver.notify_one();
                }
                if res? {
                    return Ok(());
                }
                if let Some(error) = st.error.take() {
                    let buf = what.take_front().expect("a handed-back buffer waits");
                    return Err(SendError::Io { buf, error });
                }
            }
            // Handed back: the driver must now wait for what this send needs.
            self.shared.lock().blocked += 1;
            self.shared.driver.notify_one();
            let _unblock = Unblock(&self.shared);
            notified.await;
        }
    }

    /// The next released buffer, in the order they came: waits (without blocking the thread)
    /// while the kernel holds buffers and none was released; `Ok(None)` once nothing is held and
    /// every released buffer was taken.
    pub async fn released(&self) -> io::Result<Option<Released<B>>> {
        loop {
            let notified = self.shared.owner.notified();
            ::tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.shared.lock();
                if let Some(r) = st.released.pop_front() {
                    return Ok(Some(r));
                }
                if let Some(e) = st.error.take() {
                    return Err(e);
                }
                if st.reap_for_owner(&self.shared.owner, self.watched()) > 0 {
                    continue;
                }
                if st.tx().in_flight() == 0 {
                    return Ok(None);
                }
            }
            notified.await;
        }
    }

    /// Without waiting: collects what the kernel released and moves every released buffer into
    /// `out`. Returns how many it moved.
    pub fn drain_released(&self, out: &mut Vec<Released<B>>) -> io::Result<usize> {
        let mut st = self.shared.lock();
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        st.reap_for_owner(&self.shared.owner, self.watched());
        let n = st.released.len();
        out.extend(st.released.drain(..));
        Ok(n)
    }

    /// Buffers accepted and not yet taken back (in the kernel, or released and waiting here).
    pub fn outstanding(&self) -> usize {
        let mut st = self.shared.lock();
        st.tx().outstanding() + st.released.len()
    }

    /// Buffers the kernel (or the engine's queue) still holds.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().tx().in_flight()
    }

    /// Waits until the kernel released every buffer, up to `timeout` ([`Error::TimedOut`] names
    /// how many are still held). Released buffers wait for [`released`](Self::released). Once
    /// none is held, fails with [`Error::Failed`] when a buffer released since the last flush
    /// carried an error: the rule of [`Sender`](crate::Sender#when-a-send-failed),
    /// which `send` and `send_batch` follow too (they fail once the stream is known broken).
    pub async fn flush(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.owner.notified();
            ::tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.shared.lock();
                st.reap_for_owner(&self.shared.owner, self.watched());
                if let Some(source) = st.error.take() {
                    return Err(Error::Io {
                        context: "waiting for completions",
                        source,
                    });
                }
                let held = st.tx().in_flight();
                if held == 0 {
                    return st.tx().flushed();
                }
                if Instant::now() >= deadline {
                    return Err(Error::TimedOut { outstanding: held });
                }
            }
            let _ = ::tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// Flushes for up to `timeout`, then gives up the socket (see [`Sender::close`]): buffers the
    /// kernel still holds at the deadline are kept (counted in [`Closed::kept`]), never handed
    /// back early; every other buffer, including released ones not yet taken, comes back in
    /// [`Closed::released`]. The driver task has ended, and the duplicate descriptor it waited on
    /// is closed, when this returns.
    pub async fn close(mut self, timeout: Duration) -> Closed<B> {
        let _ = self.flush(timeout).await;
        self.shared.lock().leaving = Some(Leave::Now);
        self.shared.driver.notify_one();
        if let Some(driver) = self.driver.take() {
            let _ = driver.await;
        }
        let mut st = self.shared.lock();
        let tx = st.tx.take().expect("present until close");
        let mut released: Vec<_> = st.released.drain(..).collect();
        drop(st);
        // A release stream ends now.
        self.shared.owner.notify_waiters();
        // Nothing can be waited for any more: whatever the kernel still holds is kept.
        let mut closed = tx.close(Duration::ZERO);
        released.append(&mut closed.released);
        closed.released = released;
        closed
    }
}

/// What [`AsyncSender::offer`] offers: one buffer, or a queue of them.
trait Offer<B: SendBuf> {
    /// One attempt without blocking: how many buffers the sender accepted, and whether that was
    /// all of them (`false`: a buffer was handed back for lack of room and waits here).
    fn offer(&mut self, tx: &mut Sender<B>) -> (usize, Result<bool, SendError<B>>);

    /// The buffer that waits, to come back with an error.
    fn take_front(&mut self) -> Option<B>;
}

/// One buffer, to the connected peer or to `dest`; a train of `segment`-byte datagrams if given.
struct One<B> {
    buf: Option<B>,
    dest: Option<Destination>,
    segment: Option<u16>,
}

impl<B: SendBuf> Offer<B> for One<B> {
    fn offer(&mut self, tx: &mut Sender<B>) -> (usize, Result<bool, SendError<B>>) {
        let Some(buf) = self.buf.take() else {
            return (0, Ok(true));
        };
        let res = match (self.dest, self.segment) {
            (None, None) => tx.try_send(buf),
            (Some(d), None) => tx.try_send_to(buf, d),
            (None, Some(segment)) => tx.try_send_train(buf, segment),
            (Some(d), Some(segment)) => tx.try_send_train_to(buf, segment, d),
        };
        match res {
            Ok(()) => (1, Ok(true)),
            Err(SendError::WouldBlock(b)) => {
                self.buf = Some(b);
                (0, Ok(false))
            }
            Err(e) => (0, Err(e)),
        }
    }

    fn take_front(&mut self) -> Option<B> {
        self.buf.take()
    }
}

impl<B: SendBuf> Offer<B> for &mut VecDeque<B> {
    fn offer(&mut self, tx: &mut Sender<B>) -> (usize, Result<bool, SendError<B>>) {
        let before = self.len();
        match tx.try_send_batch(self) {
            Ok(n) => (n, Ok(self.is_empty())),
            // The failed buffer left the queue with the error.
            Err(e) => (before - self.len() - 1, Err(e)),
        }
    }

    fn take_front(&mut self) -> Option<B> {
        self.pop_front()
    }
}

/// Counts a handed-back send as waiting until it retries (or its future is dropped).
struct Unblock<'a, B: SendBuf>(&'a Shared<B>);

impl<B: SendBuf> Drop for Unblock<'_, B> {
    fn drop(&mut self) {
        self.0.lock().blocked -= 1;
    }
}

impl<B: SendBuf> Drop for AsyncSender<B> {
    fn drop(&mut self) {
        if self.driver.is_none() {
            return; // closed
        }
        // Not here: this may be an executor thread. The driver collects what is still held up to
        // the deadline, then closes the sender, and ends.
        self.shared.lock().leaving = Some(Leave::Drain(Instant::now() + DROP_DEADLINE));
        self.shared.driver.notify_one();
    }
}
