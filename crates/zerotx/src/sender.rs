//! [`Sender`]: one socket, one engine, every buffer accounted for.

use std::collections::VecDeque;
use std::io;
use std::mem;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::SockAddr;

use crate::addr::{Destination, VsockAddr};
use crate::buf::BufPool;
use crate::buf::SendBuf;
use crate::config::SenderConfig;
use crate::engine::policy::train::{carries_trains, NOT_DATAGRAMS};
use crate::engine::{Engine, EMPTY_BUFFER};
use crate::error::{Error, SendError};
use crate::factory::{build, Built};
use crate::kind::{EngineKind, Family, SockKind, SockType};
use crate::observe::Watch;
use crate::report::{explain, Explanation, Note, Readiness, Released, Stats};
use crate::socket::Socket;
use crate::sys;
use crate::tcp_info::{tcp_info, TcpInfo};

/// [`SendError::Invalid`]'s reason for a send without a destination on an unconnected socket.
const NOT_CONNECTED: &str = "the datagram socket is not connected: give a destination \
                             (try_send_to/send_to) or connect it first";

static LEAKED: AtomicU64 = AtomicU64::new(0);

/// Buffers kept, process-wide, because a sender was dropped or closed while the kernel could
/// still read them. The io_uring engines drop them later, once the kernel's last completion for
/// them arrives (see [`UringShared`](crate::UringShared)); `msg-zc`'s are never freed, since no
/// completion for them is read after the close. The count only grows: non-zero means some peer
/// did not let its data be released in time.
pub fn leaked_buffers() -> u64 {
    LEAKED.load(Ordering::Relaxed)
}

/// How long [`Drop`] waits for outstanding buffers before leaking them.
const DROP_TIMEOUT: Duration = Duration::from_secs(1);

/// What [`Sender::close`] gives back.
#[derive(Debug)]
#[non_exhaustive]
#[must_use = "`kept` says how many buffers the kernel still held (never handed back), and \
              `released` holds the buffers that came back: look at both"]
pub struct Closed<B> {
    /// Buffers released while closing (and any not yet reaped).
    pub released: Vec<Released<B>>,
    /// Buffers the kernel still held at the deadline: never handed back (the io_uring engines
    /// drop them after the kernel's last completion; `msg-zc` never frees them).
    pub kept: usize,
    /// The socket, for a caller that wants to go on using it (to read, shut down, or close it).
    ///
    /// On a stream or seqpacket socket whose sending was cut short, it comes back **shut down
    /// for writing** (`shutdown(SHUT_WR)`): when buffers were kept (`kept > 0`: a request may
    /// still be running, and would write after anything the caller sends), or when a buffer was
    /// released part sent (the rest never went, so anything sent next would land after a gap).
    /// Reading still works. A datagram socket is never shut down.
    ///
    /// A new `msg-zc` sender over it is refused (it has `SO_ZEROCOPY` set and the kernel's id
    /// counter has moved on) unless [`SenderConfig::zerocopy_first_id`] names the next id.
    pub fd: OwnedFd,
}

/// Sends owned buffers on one socket through one engine, and gives each back only after the kernel
/// released it.
///
/// The core never blocks: [`try_send`](Self::try_send) accepts a buffer or hands it back with
/// [`SendError::WouldBlock`]; [`reap`](Self::reap) pushes what is queued and collects released
/// buffers; [`readiness`](Self::readiness) says what to poll for. [`send`](Self::send),
/// [`flush`](Self::flush) and [`close`](Self::close) block on top of it.
///
/// For `msg-zc` the sender counts completion ids from 0, as the kernel does for a fresh socket; a
/// socket that already has `SO_ZEROCOPY` set is refused unless
/// [`SenderConfig::zerocopy_first_id`] says where the kernel's counter stands.
///
/// ## When a send failed
/// One rule, which the async sender (`zerotx::tokio::AsyncSender`, feature `tokio`) follows too:
/// - A buffer the kernel did not take whole comes back with [`Report::error`](crate::Report::error)
///   set (a peer's reset cut it short, a datagram was dropped): its bytes did not all go.
/// - On a stream or seqpacket socket that makes the stream **broken**: from the moment the sender
///   knows it (such a buffer was released, or the kernel refused a send), every later
///   [`send`](Self::send), [`try_send`](Self::try_send) and [`send_batch`](Self::send_batch)
///   fails at once with that error ([`SendError::Io`], the buffer handed back), since anything
///   sent after a gap would corrupt the stream. Buffers accepted before the sender knew (the
///   io_uring engines queue up to [`UringConfig::queue_limit`](crate::UringConfig::queue_limit)
///   in userspace) come back with the error in their reports.
/// - [`flush`](Self::flush) fails with [`Error::Failed`] when a buffer released since the last
///   flush carried an error, once nothing is held any more; the next flush reports only newer
///   failures. A loop that sends and then flushes needs no look at each report to notice a
///   dead peer.
///
/// A sender may move between threads. With the io_uring engines, a request that finds its
/// socket full is retried by the kernel on the thread that submitted it; if that thread has
/// exited, the kernel cancels it and the sender submits it again at its next progress (see
/// [`UringShared`](crate::UringShared)), so no thread must outlive its requests.
///
/// ```no_run
/// use std::net::TcpStream;
/// use std::time::Duration;
/// use zerotx::{EngineKind, Sender};
///
/// let stream = TcpStream::connect("127.0.0.1:9000")?;
/// let mut tx = Sender::new(stream, EngineKind::MsgZerocopy)?;
/// tx.send(vec![7u8; 1 << 20])?;
/// let mut done = Vec::new();
/// tx.flush(Duration::from_secs(5))?;
/// tx.reap(&mut done)?;
/// println!("zero-copy: {}", done[0].report.path.is_zerocopy());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sender<B: SendBuf> {
    sock: Option<Socket>,
    engine: Box<dyn Engine<B>>,
    kind: EngineKind,
    /// The system calls in use ([`Explanation::path`]), and the decisions that chose them and
    /// were made since (for [`Sender::explain`]).
    path: &'static str,
    notes: Vec<Note>,
    ready: Vec<Released<B>>,
    /// The last send was handed back (`WouldBlock`): its caller will retry it when woken.
    handed_back: bool,
    /// Buffers released with an error, for [`flush`](Self::flush).
    failures: Failures,
    /// Log events and metrics (features `tracing`, `metrics`; empty without them).
    watch: Watch,
}

impl<B: SendBuf> std::fmt::Debug for Sender<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("socket", &self.sock.as_ref().map(|s| s.kind))
            .field("engine", &self.kind)
            .field("held", &self.engine.held())
            .finish()
    }
}

impl<B: SendBuf> Sender<B> {
    /// Makes a sender over a socket the caller owns (a `TcpStream`, `UdpSocket`, `UnixStream`,
    /// `socket2::Socket`, `OwnedFd`...). Checks the descriptor (`getsockopt(SO_DOMAIN/SO_TYPE)`,
    /// `getpeername`) and, for `MsgZerocopy`, enables `SO_ZEROCOPY`. Stream sockets must be
    /// connected; datagram sockets may be connected or take a destination per send.
    pub fn new(fd: impl Into<OwnedFd>, kind: EngineKind) -> Result<Self, Error> {
        Self::with_config(fd, SenderConfig::new(kind))
    }

    /// As [`new`](Self::new), with io_uring settings.
    pub fn with_config(fd: impl Into<OwnedFd>, cfg: SenderConfig) -> Result<Self, Error> {
        let sock = Socket::new(fd.into())?;
        let Built {
            engine,
            path,
            notes,
        } = build(&sock, &cfg)?;
        let watch = Watch::new(&sock, cfg.engine, path, &notes, || {
            explain(
                cfg.engine,
                path,
                &notes,
                engine.explain_facts(),
                &crate::egress::inspect(&sock),
                &stats_of(&*engine),
            )
        });
        Ok(Self {
            sock: Some(sock),
            engine,
            kind: cfg.engine,
            path,
            notes,
            ready: Vec::new(),
            handed_back: false,
            failures: Failures::default(),
            watch,
        })
    }

    /// Connects a TCP socket (IPv4 or IPv6) to `addr` and makes a sender over it.
    pub fn connect_tcp(addr: SocketAddr, kind: EngineKind) -> Result<Self, Error> {
        let stream = TcpStream::connect(addr).map_err(|source| Error::Io {
            context: "connect(2) to the TCP peer",
            source,
        })?;
        Self::new(stream, kind)
    }

    /// Connects an `AF_VSOCK` stream socket to `addr` and makes a sender over it.
    pub fn connect_vsock(addr: VsockAddr, kind: EngineKind) -> Result<Self, Error> {
        let io = |context| move |source| Error::Io { context, source };
        let sock = socket2::Socket::new(socket2::Domain::VSOCK, socket2::Type::STREAM, None)
            .map_err(io("socket(AF_VSOCK): is a vsock transport loaded?"))?;
        sock.connect(&addr.into())
            .map_err(io("connect(2) to the vsock peer"))?;
        Self::new(sock, kind)
    }

    /// A UDP socket bound to the unspecified address of `addr`'s family and connected to `addr`.
    pub fn connect_udp(addr: SocketAddr, kind: EngineKind) -> Result<Self, Error> {
        let any: SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal address")
        } else {
            "[::]:0".parse().expect("literal address")
        };
        let io = |context| move |source| Error::Io { context, source };
        let sock = UdpSocket::bind(any).map_err(io("bind(2) of the UDP socket"))?;
        sock.connect(addr)
            .map_err(io("connect(2) of the UDP socket"))?;
        Self::new(sock, kind)
    }

    fn sock(&self) -> &Socket {
        self.sock.as_ref().expect("socket present until close")
    }

    /// The socket and the engine at once (the engine works on the socket it is given).
    fn parts(&mut self) -> (&Socket, &mut dyn Engine<B>) {
        let sock = self.sock.as_ref().expect("socket present until close");
        (sock, &mut *self.engine)
    }

    /// Registers `pool`'s memory with the engine once (`IORING_REGISTER_BUFFERS`), so its buffers
    /// send with `IORING_RECVSEND_FIXED_BUF` and no per-send page pinning. `uring-zc` and `auto`
    /// on io_uring have registered sends; `auto` on `sendmsg(2)` accepts the pool and sends its
    /// buffers as any other; other engines answer [`Error::Unsupported`]. Other buffers still
    /// work.
    ///
    /// A pool made by [`BufPool::huge`] is never registered: `uring-zc` answers
    /// [`Error::Config`] (io_uring would charge every send from it for its whole huge page),
    /// and `auto` sends its buffers as any other, whichever path it runs on, with a note in
    /// [`explain`](Self::explain). For the fastest sends from registered memory, register a
    /// [`BufPool::new`] pool: its sends skip the page pinning that every send from a huge pool
    /// pays.
    pub fn register_pool(&mut self, pool: &BufPool) -> Result<(), Error> {
        if pool.is_huge() && self.kind == EngineKind::Auto {
            if !self.notes.contains(&Note::HugePoolNotRegistered) {
                self.watch.noted(&Note::HugePoolNotRegistered);
                self.notes.push(Note::HugePoolNotRegistered);
            }
            return Ok(());
        }
        match self.engine.register_pool(pool) {
            Err(Error::Unsupported { .. }) if self.kind == EngineKind::Auto => {
                self.watch.noted(&Note::PoolWithoutRegisteredSends);
                self.notes.push(Note::PoolWithoutRegisteredSends);
                Ok(())
            }
            other => other,
        }
    }

    /// Why zero-copy is or is not engaged on this socket, in plain words: the engine and system
    /// calls in use and why, the size from which `auto` sends zero-copy, whether the route copies
    /// (and when the next probe goes), the caps, what the counters say so far, and what on the
    /// socket's way out copies zero-copy sends without the kernel saying why: a peer on this
    /// machine (loopback, a veth, a bridge, a tap), an egress device without scatter-gather or
    /// checksum offload, a packet socket capturing on it, TX timestamps without
    /// `SOF_TIMESTAMPING_OPT_TSONLY`. Looking those up takes a few system calls (an rtnetlink
    /// route query, `SIOCETHTOOL`, `/proc/net/packet`): call it now and then, not per send.
    pub fn explain(&self) -> Explanation {
        let stats = self.stats();
        let auto = self.engine.explain_facts();
        let way = crate::egress::inspect(self.sock());
        explain(self.kind, self.path, &self.notes, auto, &way, &stats)
    }

    /// The engine in use.
    pub fn engine(&self) -> EngineKind {
        self.kind
    }

    /// What the socket is.
    pub fn socket_kind(&self) -> SockKind {
        self.sock().kind
    }

    /// Sends `buf` on the connected socket without blocking (`sendmsg(2)`, with `MSG_ZEROCOPY`
    /// for the zero-copy engine). `Ok` means the sender owns the buffer until it comes back from
    /// [`reap`](Self::reap); an error hands it back untouched.
    pub fn try_send(&mut self, buf: B) -> Result<(), SendError<B>> {
        self.submit(buf, None)
    }

    /// As [`try_send`](Self::try_send), to `dest` (datagram sockets): a `SocketAddr` or a
    /// [`VsockAddr`].
    pub fn try_send_to(
        &mut self,
        buf: B,
        dest: impl Into<Destination>,
    ) -> Result<(), SendError<B>> {
        self.submit(buf, Some(dest.into().into()))
    }

    // Inlined into each caller, so that a `None` destination is not copied (136 bytes of
    // `Option<SockAddr>`) into the engine's call on every send (docs/fast-path.md).
    #[inline(always)]
    fn submit(&mut self, buf: B, dest: Option<SockAddr>) -> Result<(), SendError<B>> {
        let sock = self.sock();
        if buf.as_bytes().is_empty() {
            return Err(SendError::Invalid {
                buf,
                reason: EMPTY_BUFFER,
            });
        }
        let stream = matches!(sock.kind.ty, SockType::Stream | SockType::Seqpacket);
        if stream && dest.is_some() {
            return Err(SendError::Invalid {
                buf,
                reason: "a destination was given for a connected stream socket: use try_send/send",
            });
        }
        if dest.is_none() && !sock.connected {
            return Err(SendError::Invalid {
                buf,
                reason: NOT_CONNECTED,
            });
        }
        let sock = self.sock.as_ref().expect("socket present until close");
        let result = self.engine.try_send(sock, buf, dest, &mut self.ready);
        self.handed_back = matches!(result, Err(SendError::WouldBlock(_)));
        result
    }

    /// Sends `buf` on the connected UDP socket without blocking as one train of datagrams of
    /// `segment` bytes each (the last may be shorter): one `sendmsg(2)` with a `UDP_SEGMENT`
    /// control message (UDP GSO, Linux 4.18), with `MSG_ZEROCOPY` for the zero-copy engine, so
    /// one call, one completion and one pinning cover every datagram of it. It comes back once,
    /// after the train's completion, with one [`Report`](crate::Report) for the whole train.
    ///
    /// The kernel's rules (docs/kernel.md, "UDP GSO trains"): at most 128 segments per train
    /// from Linux 6.9 and on older kernels that took the change (asked once, with a train of
    /// one-byte datagrams over loopback, the first time a train needs more than 64), 64 on
    /// the others, and at most 65507 bytes (IPv4; 65527 on IPv6), both checked before the call
    /// ([`SendError::Invalid`]); each segment plus the IP and UDP headers must fit
    /// the path MTU, or the train comes back in [`SendError::Io`] (nothing of it was sent). A
    /// path whose device or route cannot checksum a GSO packet (`EIO`) gets its trains one
    /// datagram per call, by copy ([`Stats::train_splits`]), no datagram lost or sent twice. A
    /// train to a local socket is copied by the kernel, as any datagram.
    ///
    /// Every engine sends trains on a UDP socket: `copy` and `msg-zc` by `sendmsg(2)` (by a plain
    /// `send(2)` once the socket's `UDP_SEGMENT` option holds the segment size: zerotx sets it
    /// while trains of one size go, puts it back to 0 before any other send and at
    /// [`close`](Self::close), and leaves an option the caller had set alone; a descriptor the
    /// caller kept sees it meanwhile), `uring`
    /// and `uring-zc` as one `IORING_OP_SENDMSG` or `IORING_OP_SENDMSG_ZC` request per train,
    /// and `auto` choosing between zero-copy and copy per train on either family. On io_uring the
    /// kernel answers after the call: a train it refuses (the path MTU, a netfilter or qdisc
    /// drop) comes back released, with the error in its [`Report`](crate::Report). UDP sockets
    /// only.
    ///
    /// A train the kernel refused keeps the kernel's error as it gave it, on every engine:
    /// `raw_os_error()` of [`SendError::Io`]'s `error` (or of the release's
    /// [`Report::error`](crate::Report::error), and of [`Error::Failed`]'s `source` at the next
    /// flush) is its errno, so a caller matches `EMSGSIZE` (a segment above the path MTU),
    /// `EINVAL`, `EPERM` (a netfilter drop) or `ENOBUFS` (a qdisc drop) on it. Where the errno
    /// alone says little, [`SendError::advice`] and [`Report::advice`](crate::Report::advice) say
    /// what to do, and so does each one's `Display`.
    pub fn try_send_train(&mut self, buf: B, segment: u16) -> Result<(), SendError<B>> {
        self.submit_train(buf, segment, None)
    }

    /// As [`try_send_train`](Self::try_send_train), to `dest` (a `SocketAddr`).
    pub fn try_send_train_to(
        &mut self,
        buf: B,
        segment: u16,
        dest: impl Into<Destination>,
    ) -> Result<(), SendError<B>> {
        self.submit_train(buf, segment, Some(dest.into().into()))
    }

    /// As [`try_send_train`](Self::try_send_train), waiting while the socket or the kernel's
    /// zero-copy budget is full, as [`send`](Self::send) does.
    pub fn send_train(&mut self, buf: B, segment: u16) -> Result<(), SendError<B>> {
        self.send_blocking(buf, None, Some(segment), None)
    }

    /// As [`send_train`](Self::send_train), to `dest` (a `SocketAddr`).
    pub fn send_train_to(
        &mut self,
        buf: B,
        segment: u16,
        dest: impl Into<Destination>,
    ) -> Result<(), SendError<B>> {
        self.send_blocking(buf, Some(dest.into().into()), Some(segment), None)
    }

    /// [`try_send_train`](Self::try_send_train)'s checks of the call, then the engine's.
    fn submit_train(
        &mut self,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
    ) -> Result<(), SendError<B>> {
        let sock = self.sock();
        let reason = if buf.as_bytes().is_empty() {
            Some(EMPTY_BUFFER)
        } else if !carries_trains(sock.kind) {
            Some(NOT_DATAGRAMS)
        } else if dest.is_none() && !sock.connected {
            Some(NOT_CONNECTED)
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(SendError::Invalid { buf, reason });
        }
        let sock = self.sock.as_ref().expect("socket present until close");
        let result = self
            .engine
            .try_send_train(sock, buf, segment, dest, &mut self.ready);
        self.handed_back = matches!(result, Err(SendError::WouldBlock(_)));
        result
    }

    /// Without blocking: pushes queued bytes, reads completions, and appends every buffer the
    /// kernel released to `out`. Returns how many it appended. On an error, what it released
    /// before the error is in `out` all the same: look there before retrying or giving up.
    pub fn reap(&mut self, out: &mut Vec<Released<B>>) -> io::Result<usize> {
        let before = out.len();
        if before == 0 {
            // The common case: hand over the whole list instead of copying it.
            std::mem::swap(out, &mut self.ready);
        } else {
            out.append(&mut self.ready);
        }
        let (sock, engine) = self.parts();
        let progress = engine.progress(sock, out);
        self.failures
            .look(self.engine.stats().errors, &out[before..]);
        let engine = &*self.engine;
        let failed = self.failures.first.as_ref();
        self.watch
            .reaped(|| stats_of(engine), &out[before..], failed);
        progress?;
        Ok(out.len() - before)
    }

    /// What to poll before calling [`reap`](Self::reap) or retrying a send. Call it right before
    /// **every** wait: the io_uring engines batch submissions and enter the kernel here, so
    /// nothing queued waits behind the sleeper (a request pushed while others are in flight is
    /// entered only with a full batch or here). If that entering fails, the readiness is ready at
    /// once, and the next `reap` tries again and reports the error.
    pub fn readiness(&mut self) -> Readiness {
        let retry = self.handed_back;
        let (sock, engine) = self.parts();
        engine.readiness(sock, retry)
    }

    /// Buffers accepted and not yet handed back by [`reap`](Self::reap).
    pub fn outstanding(&self) -> usize {
        self.engine.held() + self.ready.len()
    }

    /// Buffers the kernel still holds (or the engine has queued for it): outstanding minus those
    /// released and waiting to be reaped.
    pub fn in_flight(&self) -> usize {
        self.engine.held()
    }

    /// Counters, and the zero-copy budget gauges against `auto`'s caps.
    pub fn stats(&self) -> Stats {
        stats_of(&*self.engine)
    }

    /// What the kernel says of this sender's TCP connection: retransmits, congestion window,
    /// round-trip time (`getsockopt(TCP_INFO)`, one system call: see [`TcpInfo`]). Fails with
    /// `ErrorKind::Unsupported` on a socket that is not TCP.
    pub fn tcp_info(&self) -> io::Result<TcpInfo> {
        let sock = self.sock();
        let tcp = matches!(sock.kind.family, Family::Inet4 | Family::Inet6)
            && sock.kind.is_stream()
            && sock.kind.protocol == libc::IPPROTO_TCP;
        if !tcp {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "TCP_INFO exists only on TCP sockets, and this sender's is {}",
                    sock.kind
                ),
            ));
        }
        tcp_info(sock.fd())
    }

    /// How long a waiter may sleep on [`readiness`](Self::readiness) before it must look again
    /// even without a wake-up (a shared ring's completions can be reaped by another sender);
    /// `None`: until woken. Event loops that wait on their own honour it as a timeout.
    pub fn wait_slice(&self) -> Option<Duration> {
        self.engine.wait_slice()
    }

    /// The shared ring this sender's requests go to and its owner id there, while it is on one.
    #[cfg(feature = "tokio")]
    pub(crate) fn shared_ring(&self) -> Option<(crate::sys::uring::UringShared, u16)> {
        self.engine.shared_ring()
    }

    /// Waits (`poll(2)`) for the sender's readiness, up to `timeout`, then makes progress into the
    /// sender's own list of released buffers.
    fn wait(&mut self, timeout: Option<Duration>, retry: bool) -> io::Result<()> {
        let (sock, engine) = self.parts();
        let r = engine.readiness(sock, retry);
        let timeout = match (timeout, self.engine.wait_slice()) {
            (Some(t), Some(s)) => Some(t.min(s)),
            (t, s) => t.or(s),
        };
        sys::poll_one(r.fd, r.events, timeout)?;
        self.progress_into_ready()
    }

    fn progress_into_ready(&mut self) -> io::Result<()> {
        let sock = self.sock.as_ref().expect("socket present until close");
        let progress = self.engine.progress(sock, &mut self.ready);
        self.failures.look(self.engine.stats().errors, &self.ready);
        // The buffers stay in `ready`: their bytes count when they are reaped.
        let engine = &*self.engine;
        let failed = self.failures.first.as_ref();
        self.watch.reaped::<B>(|| stats_of(engine), &[], failed);
        progress
    }

    /// What a flush that found nothing held returns: [`Error::Failed`] if buffers released since
    /// the last such answer carried an error (see the failure rule above), and the count starts
    /// again.
    pub(crate) fn flushed(&mut self) -> Result<(), Error> {
        self.failures.look(self.engine.stats().errors, &self.ready);
        self.failures.take()
    }

    /// Blocks until at least one buffer is released or `timeout` passes (`None`: no limit), and
    /// appends the released buffers to `out`. Returns at once with 0 when nothing is held. On an
    /// error, what a reap released before it is in `out`, as with [`reap`](Self::reap); if the
    /// wait itself failed, what was released meanwhile comes with the next `reap`.
    pub fn wait_released(
        &mut self,
        out: &mut Vec<Released<B>>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let n = self.reap(out)?;
            if n > 0 || self.engine.held() == 0 {
                return Ok(n);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(0);
            }
            self.wait(left, false)?;
        }
    }

    /// Sends `buf` on the connected socket, waiting while the socket or the kernel's zero-copy
    /// budget is full. Released buffers wait in the sender for [`reap`](Self::reap).
    pub fn send(&mut self, buf: B) -> Result<(), SendError<B>> {
        self.send_blocking(buf, None, None, None)
    }

    /// As [`send`](Self::send), waiting at most `timeout`: at the deadline the buffer comes back
    /// in [`SendError::WouldBlock`] (the peer is not reading, or the zero-copy budget stays
    /// full). For a loop that must stop on time or notice a stalled peer.
    pub fn send_timeout(&mut self, buf: B, timeout: Duration) -> Result<(), SendError<B>> {
        self.send_blocking(buf, None, None, Some(Instant::now() + timeout))
    }

    /// As [`send`](Self::send), to `dest` (datagram sockets): a `SocketAddr` or a
    /// [`VsockAddr`].
    pub fn send_to(&mut self, buf: B, dest: impl Into<Destination>) -> Result<(), SendError<B>> {
        self.send_blocking(buf, Some(dest.into().into()), None, None)
    }

    /// Sends the buffers of `bufs` in order, front first, as [`send`](Self::send) sends each
    /// (waiting while the socket or the zero-copy budget is full). On a datagram socket the
    /// io_uring engines enter the kernel once per full batch
    /// ([`UringConfig::batch`](crate::UringConfig::batch)) instead of also at once for a send
    /// that finds nothing submitted in flight on the ring; what the last batch left in the
    /// submission queue is entered before it returns (if `io_uring_enter` fails, the next call
    /// reports it). Buffers beyond the ring's requests in flight
    /// ([`UringConfig::entries`](crate::UringConfig::entries)) wait in the sender's queue for
    /// room, as with `send`: the next `reap` or wait moves them. A stream keeps one request in flight, batched from the queue
    /// (the whole batch enters the queue first, so the first request carries up to `batch`
    /// buffers). `copy` on a byte stream (TCP, AF_UNIX, vsock) writes up to 32 buffers per system
    /// call, their bytes in order, and so does `auto` with the buffers under 16 KiB it copies on
    /// io_uring while none of the stream's requests is out. On a connected UDP socket every
    /// engine (`copy`, `msg-zc`, `uring`, `uring-zc`, `auto` on either family) sends each run of
    /// consecutive datagrams of one size (the last of a run may be shorter; each within the path
    /// MTU) as one UDP GSO train: one `sendmsg` (on io_uring one `SENDMSG`/`SENDMSG_ZC` request)
    /// with one iovec per buffer, under `MSG_ZEROCOPY` one id for the run (a zero-copy train
    /// carries what of the run fits one skb's 17 page fragments: buffers of one allocation go
    /// whole), every buffer released after it ([`Stats::batch_train_buffers`];
    /// [`SenderConfig::with_batch_trains`](crate::SenderConfig::with_batch_trains) turns it off).
    /// The receiver gets the same datagrams in the same order, but an output-hook netfilter rule
    /// sees the train as one packet. Other buffers go one system call (or request) each.
    ///
    /// A run's train the kernel refused sent nothing of it, and no datagram of it is ever
    /// reported sent or sent twice: refused as a train (`EIO` where the path cannot checksum GSO,
    /// remembered for the path; `EMSGSIZE`/`EINVAL`, a path MTU that dropped, read again for the
    /// next run; the zero-copy budget) its datagrams go one per call or request; dropped whole
    /// (netfilter's `EPERM`, a qdisc's `ENOBUFS` with `IP_RECVERR`, a pending socket error) each
    /// buffer the answer names fails with the error. Over `sendmsg(2)` the call answers at once,
    /// so the drop names the run's first datagram, which comes back in the error, and the rest
    /// stay in `bufs`; on io_uring it comes in the request's CQE after this call returned, so
    /// every buffer of the run is released with the error (and the batch went on).
    ///
    /// This is the call for throughput on io_uring: where completions come back at once (a send
    /// that drops or copies its data, measured into the black hole), a `send` loop finds nothing
    /// in flight after each reap and enters the kernel for that send alone.
    ///
    /// Stops at the first failure: that buffer comes back in the error, the ones after it stay in
    /// `bufs`, and the ones before it were accepted. Connected sockets only (as `send`).
    pub fn send_batch(&mut self, bufs: &mut VecDeque<B>) -> Result<(), SendError<B>> {
        let batch = Batch::open(self);
        loop {
            batch.0.offer_batch(bufs)?;
            if bufs.is_empty() {
                return Ok(());
            }
            // The front one was handed back: wait for what it waits for, as `send` does.
            if let Err(error) = batch.0.wait(None, true) {
                let buf = bufs.pop_front().expect("the handed-back buffer");
                return Err(SendError::Io { buf, error });
            }
        }
    }

    /// As [`send_batch`](Self::send_batch) without blocking, for an event loop: sends from the
    /// front of `bufs` until the socket, the zero-copy budget or the engine's queue is full, and
    /// returns how many it accepted. The rest stay in `bufs`: wait on
    /// [`readiness`](Self::readiness) and call again. Stops at the first failure: that buffer
    /// comes back in the error, the ones after it stay in `bufs`, and the ones before it were
    /// accepted.
    pub fn try_send_batch(&mut self, bufs: &mut VecDeque<B>) -> Result<usize, SendError<B>> {
        Batch::open(self).0.offer_batch(bufs)
    }

    /// What [`submit`](Self::submit) does for each buffer, for the front of `bufs` in one call to
    /// the engine: sends until one is handed back (back at the front) or fails.
    fn offer_batch(&mut self, bufs: &mut VecDeque<B>) -> Result<usize, SendError<B>> {
        let sock = self.sock.as_ref().expect("socket present until close");
        if bufs.is_empty() {
            return Ok(0);
        }
        if !sock.connected {
            let buf = bufs.pop_front().expect("not empty");
            return Err(SendError::Invalid {
                buf,
                reason: NOT_CONNECTED,
            });
        }
        let result = self.engine.try_send_batch(sock, bufs, &mut self.ready);
        self.handed_back = result.is_ok() && !bufs.is_empty();
        result
    }

    #[inline]
    fn send_blocking(
        &mut self,
        mut buf: B,
        dest: Option<SockAddr>,
        train: Option<u16>,
        deadline: Option<Instant>,
    ) -> Result<(), SendError<B>> {
        loop {
            let sent = match train {
                None => self.submit(buf, dest.clone()),
                Some(segment) => self.submit_train(buf, segment, dest.clone()),
            };
            match sent {
                Err(SendError::WouldBlock(b)) => {
                    buf = b;
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left.is_some_and(|l| l.is_zero()) {
                        return Err(SendError::WouldBlock(buf));
                    }
                    if let Err(error) = self.wait(left, true) {
                        return Err(SendError::Io { buf, error });
                    }
                }
                other => return other,
            }
        }
    }

    /// Waits until the kernel released every buffer this sender holds, up to `timeout`. Released
    /// buffers wait in the sender for [`reap`](Self::reap). Fails with [`Error::TimedOut`] naming
    /// how many are still held, or, once none is, with [`Error::Failed`] when a buffer released
    /// since the last flush carried an error (the peer did not get all of it: see the failure
    /// rule in the type's docs).
    pub fn flush(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let io = |source| Error::Io {
            context: "waiting for completions",
            source,
        };
        loop {
            self.progress_into_ready().map_err(io)?;
            if self.engine.held() == 0 {
                return self.flushed();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::TimedOut {
                    outstanding: self.engine.held(),
                });
            }
            self.wait(Some(left), false).map_err(io)?;
        }
    }

    /// Flushes for up to `timeout`, then gives up the socket. Buffers the kernel still holds at
    /// the deadline are kept (counted in [`Closed::kept`] and [`leaked_buffers`]: the io_uring
    /// engines drop them after the kernel's last completion, `msg-zc` never), never handed back
    /// early. The io_uring engines cancel their requests still parked at the deadline
    /// (`IORING_OP_ASYNC_CANCEL`); a stream cut short comes back shut down for writing (see
    /// [`Closed::fd`]).
    pub fn close(mut self, timeout: Duration) -> Closed<B> {
        let _ = self.flush(timeout);
        let (released, kept) = self.give_up();
        let sock = self.sock.take().expect("socket present until close");
        self.engine.give_back(&sock);
        let cut_short = released
            .iter()
            .any(|r| r.report.error.is_some() && r.report.bytes > 0);
        if sock.kind.is_ordered() && (kept > 0 || cut_short) {
            // Nothing may follow a gap, or a request that may still write: end the stream. It
            // fails only on a socket that is not connected any more, which is then ended anyway.
            let _ = socket2::SockRef::from(&sock.fd()).shutdown(std::net::Shutdown::Write);
        }
        Closed {
            released,
            kept,
            fd: sock.into_fd(),
        }
    }

    fn give_up(&mut self) -> (Vec<Released<B>>, usize) {
        let mut released = mem::take(&mut self.ready);
        // The engine keeps (leaks) the buffers the kernel may still read.
        let n = self.engine.shutdown(&mut released);
        LEAKED.fetch_add(n as u64, Ordering::Relaxed);
        let engine = &*self.engine;
        self.watch.closed(|| stats_of(engine), &released, n);
        (released, n)
    }
}

/// The engine's counters, with `auto`'s caps beside the budget gauges.
fn stats_of<B: SendBuf>(engine: &dyn Engine<B>) -> Stats {
    let mut s = engine.stats();
    if let Some(caps) = engine.auto_policy().map(|p| p.caps()) {
        s.cap_sends = caps.sends.map(|c| c as u64);
        s.cap_bytes = caps.bytes.map(|c| c as u64);
    }
    s
}

/// Buffers released with an error, counted by the engine ([`Stats::errors`]): how many there were
/// at the last flush and at the last look, and the first error since the last flush.
#[derive(Debug, Default)]
struct Failures {
    at_flush: u64,
    seen: u64,
    first: Option<io::Error>,
}

impl Failures {
    /// After a progress that appended released buffers (the last of them in `released`): when
    /// the engine's count `errors` moved, remembers the first error among them. Only a count
    /// that moved costs a scan.
    fn look<B>(&mut self, errors: u64, released: &[Released<B>]) {
        if errors == self.seen {
            return;
        }
        self.seen = errors;
        if self.first.is_none() {
            self.first = released
                .iter()
                .find_map(|r| r.report.error.as_ref())
                .map(|e| match e.raw_os_error() {
                    Some(errno) => io::Error::from_raw_os_error(errno),
                    None => io::Error::new(e.kind(), e.to_string()),
                });
        }
    }

    /// [`Error::Failed`] for the failures since the last call, if there were any.
    fn take(&mut self) -> Result<(), Error> {
        let failed = self.seen - self.at_flush;
        if failed == 0 {
            return Ok(());
        }
        self.at_flush = self.seen;
        let source = self.first.take().unwrap_or_else(|| {
            io::Error::other("a released buffer carried an error (taken before this flush)")
        });
        Err(Error::Failed {
            failed: failed as usize,
            source,
        })
    }
}

impl<B: SendBuf> Drop for Sender<B> {
    fn drop(&mut self) {
        if self.sock.is_none() {
            return; // closed: `close` gave up already
        }
        if self.engine.held() > 0 {
            let _ = self.flush(DROP_TIMEOUT);
            let _ = self.give_up();
        } else {
            // Nothing to give up; the watch still publishes its last changes and takes this
            // sender's gauges off.
            let engine = &*self.engine;
            self.watch.closed(|| stats_of(engine), &self.ready, 0);
        }
        // A descriptor the caller kept gets the socket's options back as `close` leaves them
        // (the `UDP_SEGMENT` option at 0, the path-MTU modes the caller had).
        if let Some(sock) = &self.sock {
            self.engine.give_back(sock);
        }
    }
}

/// A [`Sender::send_batch`] in progress: the engine batches its submissions until this is dropped,
/// on every way out (an error, or a panic in a buffer's `as_bytes`), so no later lone send waits in
/// the SQ for a full batch.
struct Batch<'a, B: SendBuf>(&'a mut Sender<B>);

impl<'a, B: SendBuf> Batch<'a, B> {
    fn open(tx: &'a mut Sender<B>) -> Self {
        tx.engine.batch(true);
        Self(tx)
    }
}

impl<B: SendBuf> Drop for Batch<'_, B> {
    fn drop(&mut self) {
        self.0.engine.batch(false);
    }
}
