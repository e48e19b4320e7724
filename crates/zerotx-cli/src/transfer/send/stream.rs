//! One stream of `zerotx send`, on its own thread: slices of the generated stream or of a mapped
//! file through a [`Sender`], or a file through `sendfile(2)`. Bytes count when the kernel let go
//! of them (a release, or `sendfile` returning), never when merely queued, so the interval lines
//! are what the socket took.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use socket2::Socket;
use zerotx::{CopyReason, EngineKind, Explanation, Released, SendError, SendPath, Sender, Stats};

use super::plan::Conn;
use super::tcp_info::{TcpCounters, TcpSampler, TcpSummary};
use super::train::{self, Trains};
use crate::transfer::iperf3;
use crate::transfer::pattern::Window;

/// How long one blocking call may wait before the loop looks at its deadline and its stall
/// clock again.
const SLICE: Duration = Duration::from_millis(100);

/// Live counters the main thread reads for interval lines.
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes the kernel took.
    pub bytes: AtomicU64,
    /// Of those, sent zero-copy (the kernel said so).
    pub zerocopy: AtomicU64,
    /// Of those, taken by `sendfile(2)` (no completion says how the kernel sent them).
    pub sendfile: AtomicU64,
    /// TCP only: the connection's last `TCP_INFO` sample.
    pub tcp: Arc<TcpCounters>,
}

/// What a stream sends.
pub enum Body {
    /// The generated stream.
    Window(Window),
    /// A mapped file (the whole of it; empty for an empty file).
    Mapped(Bytes),
    /// A file through `sendfile(2)`; the mapped body if the socket refuses `sendfile`.
    Sendfile {
        /// The file.
        file: File,
        /// Its length.
        len: u64,
        /// The file mapped, made only if `sendfile` is refused.
        map: Box<dyn FnOnce() -> anyhow::Result<Bytes> + Send>,
    },
}

/// One stream's work.
pub struct Job {
    /// The socket.
    pub conn: Conn,
    /// For the engine body.
    pub engine: EngineKind,
    /// Bytes per send.
    pub size: usize,
    /// UDP: datagrams per train (1: one per call).
    pub train: usize,
    /// What to send.
    pub body: Body,
    /// When to stop, how fast, how long to wait.
    pub ctl: Control,
}

/// When a stream stops, how fast it goes, how long it waits.
pub struct Control {
    /// Stop after this many bytes (`None`: only the deadline stops it).
    pub bytes: Option<u64>,
    /// Stop at this instant.
    pub deadline: Option<Instant>,
    /// This stream's share of the rate, bytes per second.
    pub rate: Option<f64>,
    /// The budget for the end, and for a stall.
    pub linger: Duration,
    /// Shared with the main thread.
    pub counters: Arc<Counters>,
    /// Set by any stream that failed: the others stop.
    pub abort: Arc<AtomicBool>,
    /// Set by Ctrl-C (SIGINT) or SIGTERM: every stream ends as at its deadline.
    pub interrupted: Arc<AtomicBool>,
    /// When the transfer started.
    pub start: Instant,
}

impl Control {
    fn stop(&self, sent: u64) -> bool {
        self.abort.load(Ordering::Relaxed)
            || self.interrupted.load(Ordering::Relaxed)
            || self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.bytes.is_some_and(|b| sent >= b)
    }

    /// The next send's length: `size`, or what is left of `bytes`.
    fn next_len(&self, sent: u64, size: usize) -> usize {
        self.bytes
            .map_or(size as u64, |b| b.saturating_sub(sent).min(size as u64)) as usize
    }

    /// Sleeps until `sent` bytes are due at the stream's rate (never past the deadline).
    fn pace(&self, sent: u64) {
        let Some(rate) = self.rate else { return };
        // The plan refuses rates below one bit per second, so this is finite; a due time past
        // what an `Instant` holds is never (`None`): only the deadline or an interruption ends
        // the wait.
        let due = Duration::try_from_secs_f64(sent as f64 / rate)
            .ok()
            .and_then(|d| self.start.checked_add(d));
        let due = match (due, self.deadline) {
            (Some(due), Some(d)) => Some(due.min(d)),
            (due, d) => due.or(d),
        };
        // In slices, so an interruption ends a slow paced stream at once.
        loop {
            let now = Instant::now();
            let ended =
                self.interrupted.load(Ordering::Relaxed) || self.abort.load(Ordering::Relaxed);
            if ended || due.is_some_and(|d| d <= now) {
                return;
            }
            std::thread::sleep(due.map_or(SLICE, |d| (d - now).min(SLICE)));
        }
    }
}

/// Bytes by the way they left.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct ByPath {
    /// Sent zero-copy (the kernel's completion said it did not copy).
    pub zerocopy: u64,
    /// Through `sendfile(2)`.
    pub sendfile: u64,
    /// Copied by a copy engine.
    pub copied_engine: u64,
    /// Sent zero-copy, but the kernel copied (loopback, a device without scatter-gather).
    pub copied_kernel: u64,
    /// Copied after `ENOBUFS` with nothing in flight.
    pub copied_fallback: u64,
    /// `auto`: copied, too small to pay.
    pub copied_small: u64,
    /// `auto`: copied, the route copies anyway.
    pub copied_route: u64,
    /// `auto`: copied, the zero-copy budget was full.
    pub copied_budget: u64,
}

impl ByPath {
    fn add(&mut self, path: SendPath, n: u64) {
        match path {
            SendPath::ZeroCopy => self.zerocopy += n,
            SendPath::Copied(CopyReason::Engine) => self.copied_engine += n,
            SendPath::Copied(CopyReason::Kernel) => self.copied_kernel += n,
            SendPath::Copied(CopyReason::Fallback) => self.copied_fallback += n,
            SendPath::Copied(CopyReason::Small) => self.copied_small += n,
            SendPath::Copied(CopyReason::RouteCopies) => self.copied_route += n,
            SendPath::Copied(CopyReason::Budget) => self.copied_budget += n,
            // A reason added later: count it as the engine's.
            SendPath::Copied(_) => self.copied_engine += n,
        }
    }

    /// Bytes copied, for whatever reason.
    pub fn copied(&self) -> u64 {
        self.copied_engine
            + self.copied_kernel
            + self.copied_fallback
            + self.copied_small
            + self.copied_route
            + self.copied_budget
    }

    /// Adds another stream's.
    pub fn merge(&mut self, o: &ByPath) {
        self.zerocopy += o.zerocopy;
        self.sendfile += o.sendfile;
        self.copied_engine += o.copied_engine;
        self.copied_kernel += o.copied_kernel;
        self.copied_fallback += o.copied_fallback;
        self.copied_small += o.copied_small;
        self.copied_route += o.copied_route;
        self.copied_budget += o.copied_budget;
    }
}

/// How a stream ended.
pub struct End {
    /// Bytes the kernel took.
    pub bytes: u64,
    /// By path.
    pub by_path: ByPath,
    /// When the last byte was released (or taken by `sendfile`).
    pub finished: Instant,
    /// When the receiver closed after reading to the end (streams only).
    pub confirmed: Option<Instant>,
    /// Why the receiver's end could not be confirmed, when it was not.
    pub unconfirmed: Option<String>,
    /// The engine's counters (`None` for `sendfile`).
    pub stats: Option<Stats>,
    /// Why zero-copy was or was not engaged (`None` for `sendfile`).
    pub explain: Option<Explanation>,
    /// `sendfile`, `mmap`, or the generated stream.
    pub via: &'static str,
    /// What went wrong.
    pub error: Option<anyhow::Error>,
    /// TCP only: `TCP_INFO` over the run (retransmits, window, round trips), last sampled at
    /// the end, before the socket closed.
    pub tcp: Option<TcpSummary>,
    /// Samples the socket while this stream holds it open; finished into `tcp`.
    sampler: Option<TcpSampler>,
    /// UDP: datagrams per train, when the stream sent trains.
    pub trains: Option<usize>,
    /// Why trains stopped part way, when they did.
    pub trains_off: Option<String>,
}

impl Job {
    /// Runs the stream to its end. Never panics on I/O: every failure is in [`End::error`].
    pub fn run(self) -> End {
        let abort = self.ctl.abort.clone();
        let end = match self.body {
            Body::Sendfile { file, len, map } => {
                run_sendfile(self.conn, self.engine, self.size, file, len, map, self.ctl)
            }
            Body::Window(w) => run_engine(
                self.conn,
                self.engine,
                self.size,
                Trains::new(self.size, self.train),
                Source::Window(w),
                self.ctl,
            ),
            Body::Mapped(m) => run_engine(
                self.conn,
                self.engine,
                self.size,
                Trains::new(self.size, self.train),
                Source::Mapped(m),
                self.ctl,
            ),
        };
        if end.error.is_some() {
            abort.store(true, Ordering::Relaxed);
        }
        end
    }
}

/// What the engine loop slices its sends from.
enum Source {
    Window(Window),
    Mapped(Bytes),
}

/// Sends `src` through `engine`: slices of `size` bytes, or trains of `size`-byte datagrams
/// while `trains` go.
fn run_engine(
    conn: Conn,
    engine: EngineKind,
    size: usize,
    mut trains: Trains,
    src: Source,
    ctl: Control,
) -> End {
    let mut end = End::new(match src {
        Source::Window(_) => "generated",
        Source::Mapped(_) => "mmap",
    });
    let stream = conn.stream;
    // The sender owns the socket until `close`, which samples it a last time.
    end.sampler = TcpSampler::new(conn.fd.as_raw_fd(), ctl.counters.tcp.clone());
    if trains.per_train().is_some() {
        if let Some(why) = train::mtu_refusal(conn.fd.as_fd(), size) {
            end.trains_off(&mut trains, format!("the path refuses them: {why}"));
        }
    }
    let mut tx = match Sender::new(conn.fd, engine) {
        Ok(tx) => tx,
        Err(e) => return end.failed(anyhow::anyhow!("engine {engine}: {e}")),
    };
    end.trains = trains.per_train();
    let mut released: Vec<Released<Bytes>> = Vec::new();
    let mut queued = 0u64;
    let mut last_progress = Instant::now();
    while !ctl.stop(queued) {
        let want = ctl.next_len(queued, size * trains.datagrams());
        let buf = match &src {
            Source::Window(w) => w.at(queued, want),
            Source::Mapped(m) => {
                // A file goes once unless --time repeats it (then `bytes` is unset): a once
                // stream never wraps around its mapping, whatever its byte budget says.
                let pos = match ctl.bytes {
                    Some(_) => queued,
                    None if m.is_empty() => break,
                    None => queued % m.len() as u64,
                };
                if pos >= m.len() as u64 {
                    break;
                }
                let pos = pos as usize;
                m.slice(pos..pos + want.min(m.len() - pos))
            }
        };
        let n = buf.len() as u64;
        // A train is its datagrams' share of the rate: due when its first byte is.
        ctl.pace(queued);
        let sent = match trains.segment_for(buf.len()) {
            None => tx.send_timeout(buf, SLICE),
            Some(segment) => match tx.send_train(buf, segment) {
                // Nothing of the train went: the same bytes go again, one datagram per call.
                Err(SendError::Invalid { reason, .. }) => {
                    end.trains_off(&mut trains, format!("the engine refuses them: {reason}"));
                    continue;
                }
                Err(SendError::Io { error, buf }) => match train::refusal(&error) {
                    Some(why) => {
                        end.trains_off(&mut trains, format!("the path refuses them: {why}"));
                        continue;
                    }
                    None => Err(SendError::Io { error, buf }),
                },
                other => other,
            },
        };
        match sent {
            Ok(()) => {
                queued += n;
                last_progress = Instant::now();
            }
            Err(SendError::WouldBlock(_)) => {
                if last_progress.elapsed() > ctl.linger {
                    let e = stalled(ctl.linger, end.bytes);
                    return end.close(tx, stream, Duration::ZERO, Some(e));
                }
            }
            Err(SendError::Invalid { reason, .. }) => {
                let e = anyhow::anyhow!("the engine refused a send: {reason}");
                return end.close(tx, stream, Duration::ZERO, Some(e));
            }
            Err(SendError::Io { error, .. }) => {
                let e = peer_error(&error, end.bytes);
                return end.close(tx, stream, Duration::ZERO, Some(e));
            }
            Err(other) => {
                let e = anyhow::anyhow!("the engine refused a send: {other}");
                return end.close(tx, stream, Duration::ZERO, Some(e));
            }
        }
        match end.account(&mut tx, &mut released, &ctl.counters) {
            Ok(true) => {
                last_progress = Instant::now();
                if trains.datagrams() > 1 && tx.stats().train_splits > 0 {
                    // The library sent those trains one datagram per call: none lost or sent
                    // twice, but later ones would be split again.
                    end.trains_off(
                        &mut trains,
                        "the path splits them: EIO, the device cannot checksum a UDP GSO packet"
                            .into(),
                    );
                }
            }
            Ok(false) => {}
            Err(e) => return end.close(tx, stream, Duration::ZERO, Some(e)),
        }
        end.tick_tcp();
    }

    // The end: every buffer back from the kernel, then the receiver's EOF. In slices, counting
    // what comes back as it comes (the interval lines go on while the last bytes drain).
    let drain_until = Instant::now() + ctl.linger;
    let flushed = loop {
        let now = Instant::now();
        let slice = SLICE.min(drain_until.saturating_duration_since(now));
        let r = tx.flush(slice);
        if let Err(e) = end.account(&mut tx, &mut released, &ctl.counters) {
            return end.close(tx, stream, Duration::ZERO, Some(e));
        }
        end.tick_tcp();
        match r {
            Err(zerotx::Error::TimedOut { .. }) if Instant::now() < drain_until => {}
            r => break r,
        }
    };
    let err = match flushed {
        Ok(()) => None,
        Err(zerotx::Error::TimedOut { outstanding }) => Some(anyhow::anyhow!(
            "the receiver stopped reading: {outstanding} buffer(s) still not sent {:.0} s after \
             the end (--linger)",
            ctl.linger.as_secs_f64()
        )),
        Err(e) => Some(anyhow::anyhow!("{e}")),
    };
    end.close(tx, stream, ctl.linger, err)
}

fn run_sendfile(
    conn: Conn,
    engine: EngineKind,
    size: usize,
    file: File,
    len: u64,
    map: Box<dyn FnOnce() -> anyhow::Result<Bytes> + Send>,
    ctl: Control,
) -> End {
    let mut end = End::new("sendfile");
    let sock = Socket::from(conn.fd);
    let setup = sock
        .set_nonblocking(false)
        .and_then(|()| sock.set_write_timeout(Some(SLICE)));
    if let Err(e) = setup {
        return end.failed(anyhow::anyhow!("setting up the socket: {e}"));
    }
    end.sampler = TcpSampler::new(sock.as_raw_fd(), ctl.counters.tcp.clone());
    let mut sent = 0u64;
    let mut off = 0u64;
    let mut last_progress = Instant::now();
    while !ctl.stop(sent) && len > 0 {
        end.tick_tcp();
        if off == len {
            off = 0; // again, until the deadline (only with --time: else `bytes` stopped it)
        }
        let count = (ctl.next_len(sent, size) as u64).min(len - off) as usize;
        ctl.pace(sent);
        match rustix::fs::sendfile(&sock, &file, Some(&mut off), count) {
            Ok(0) => {
                let e = anyhow::anyhow!(
                    "the file ended at byte {off}, before its length when opened ({len}): it was \
                     truncated while being sent"
                );
                return end.finish_stream(sock, Duration::ZERO, Some(e));
            }
            Ok(n) => {
                sent += n as u64;
                end.bytes = sent;
                end.by_path.sendfile = sent;
                ctl.counters.bytes.store(sent, Ordering::Relaxed);
                ctl.counters.sendfile.store(sent, Ordering::Relaxed);
                last_progress = Instant::now();
            }
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => {
                if last_progress.elapsed() > ctl.linger {
                    let e = stalled(ctl.linger, sent);
                    return end.finish_stream(sock, Duration::ZERO, Some(e));
                }
            }
            Err(e)
                if sent == 0
                    && [
                        rustix::io::Errno::INVAL,
                        rustix::io::Errno::NOSYS,
                        rustix::io::Errno::OPNOTSUPP,
                    ]
                    .contains(&e) =>
            {
                // This socket takes no spliced pages: the mapped file through the engine.
                let m = match map() {
                    Ok(m) => m,
                    Err(e) => return end.failed(e),
                };
                let conn = Conn {
                    fd: sock.into(),
                    ..conn
                };
                return run_engine(
                    conn,
                    engine,
                    size,
                    Trains::new(size, 1),
                    Source::Mapped(m),
                    ctl,
                );
            }
            Err(e) => {
                let e = peer_error(&io::Error::from(e), sent);
                return end.finish_stream(sock, Duration::ZERO, Some(e));
            }
        }
    }
    end.finished = Instant::now();
    end.finish_stream(sock, ctl.linger, None)
}

impl End {
    fn new(via: &'static str) -> Self {
        Self {
            bytes: 0,
            by_path: ByPath::default(),
            finished: Instant::now(),
            confirmed: None,
            unconfirmed: None,
            stats: None,
            explain: None,
            via,
            error: None,
            tcp: None,
            sampler: None,
            trains: None,
            trains_off: None,
        }
    }

    /// Stops `trains` for the rest of the stream, and keeps why for the summary.
    fn trains_off(&mut self, trains: &mut Trains, why: String) {
        trains.stop(why);
        self.trains_off = trains.off().map(str::to_string);
    }

    fn failed(mut self, e: anyhow::Error) -> Self {
        // Its socket may be closed already.
        self.sampler = None;
        self.finished = Instant::now();
        self.error = Some(e);
        self
    }

    /// Takes released buffers into the counts; `true` when any came back. A buffer released
    /// with an error ends the stream (a stream cannot go on after a gap).
    fn account(
        &mut self,
        tx: &mut Sender<Bytes>,
        released: &mut Vec<Released<Bytes>>,
        counters: &Counters,
    ) -> anyhow::Result<bool> {
        let reaped = tx.reap(released);
        let any = !released.is_empty();
        let mut failure = None;
        for r in released.drain(..) {
            let n = r.report.bytes as u64;
            self.bytes += n;
            self.by_path.add(r.report.path, n);
            if let Some(e) = r.report.error {
                failure.get_or_insert(e);
            }
        }
        counters.bytes.store(self.bytes, Ordering::Relaxed);
        counters
            .zerocopy
            .store(self.by_path.zerocopy, Ordering::Relaxed);
        if let Some(e) = failure {
            return Err(peer_error(&e, self.bytes));
        }
        reaped.map_err(|e| peer_error(&e, self.bytes))?;
        Ok(any)
    }

    /// Closes the sender (keeping, never freeing early, what the kernel still holds) and ends
    /// the stream.
    fn close(
        mut self,
        tx: Sender<Bytes>,
        stream: bool,
        wait: Duration,
        error: Option<anyhow::Error>,
    ) -> Self {
        self.stats = Some(tx.stats());
        self.explain = Some(tx.explain());
        let closed = tx.close(if error.is_some() { SLICE } else { wait });
        for r in closed.released {
            self.bytes += r.report.bytes as u64;
            self.by_path.add(r.report.path, r.report.bytes as u64);
        }
        self.error = error;
        // When the stream ended, failed or not: the summary's interval and rate use it.
        self.finished = Instant::now();
        let confirm = stream && self.error.is_none();
        self.end_socket(Socket::from(closed.fd), wait, confirm);
        self
    }

    fn finish_stream(mut self, sock: Socket, wait: Duration, error: Option<anyhow::Error>) -> Self {
        self.error = error;
        if self.error.is_some() {
            self.finished = Instant::now();
        }
        let confirm = self.error.is_none();
        self.end_socket(sock, wait, confirm);
        self
    }

    /// Samples `TCP_INFO` if the last sample is old enough (while the stream holds its socket).
    fn tick_tcp(&mut self) {
        if let Some(t) = &mut self.sampler {
            t.tick(Instant::now());
        }
    }

    /// The stream's last step with its socket: waits for the receiver's close when `confirm`,
    /// then takes the last `TCP_INFO` sample while the socket is still open (after the close, the
    /// retransmits of every byte count), and closes it.
    fn end_socket(&mut self, s: Socket, wait: Duration, confirm: bool) {
        if answered_as_iperf3(&s) {
            // The bytes went to an iperf3 server, which reads them as its protocol, not data.
            self.error = Some(match self.error.take() {
                Some(seen) => anyhow::anyhow!("{} (the stream: {seen:#})", iperf3::SERVER),
                None => anyhow::anyhow!("{}", iperf3::SERVER),
            });
        }
        let confirm = confirm && self.error.is_none();
        if self.error.is_none() {
            // An orderly end: the close sends what is still queued, then FIN (the connect set
            // a zero linger, which resets instead). Only TCP had it set.
            let _ = s.set_linger(None);
        }
        if confirm {
            match confirm_end(&s, wait) {
                Ok(t) => self.confirmed = Some(t),
                Err(why) => self.unconfirmed = Some(why),
            }
        }
        if let Some(mut t) = self.sampler.take() {
            t.sample();
            self.tcp = Some(t.finish());
        }
    }
}

/// Whether the receiver wrote an iperf3 server's state byte back on the stream (a plain-bytes
/// receiver writes nothing). Looks without taking it, and without waiting.
fn answered_as_iperf3(s: &Socket) -> bool {
    if !matches!(s.r#type(), Ok(socket2::Type::STREAM)) {
        return false;
    }
    let mut first = [0u8; 1];
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    matches!(rustix::net::recv(s, &mut first[..], flags), Ok((_, 1)))
        && iperf3::is_server_state(first[0])
}

/// Ends the stream for writing and waits up to `wait` for the receiver to close: then it has read
/// everything. Any receiver that closes at the end (zerotx recv, socat, `nc -N`, a script) does.
fn confirm_end(s: &Socket, wait: Duration) -> Result<Instant, String> {
    let setup = s
        .set_nonblocking(false)
        .and_then(|()| s.shutdown(std::net::Shutdown::Write))
        .and_then(|()| s.set_read_timeout(Some(wait.max(Duration::from_millis(1)))));
    if let Err(e) = setup {
        return Err(format!("could not end the stream: {e}"));
    }
    let mut buf = [0u8; 4096];
    let mut reader = s;
    let deadline = Instant::now() + wait;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(Instant::now()),
            Ok(_) if Instant::now() < deadline => {} // the receiver talks back: ignore it
            Ok(_) => return Err("the receiver kept sending after the end".into()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "the receiver did not close within {:.0} s of the end (--linger); it may not \
                     have read everything",
                    wait.as_secs_f64()
                ))
            }
            Err(e) => return Err(format!("the receiver ended the connection abruptly: {e}")),
        }
    }
}

fn stalled(linger: Duration, bytes: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "no progress for {:.0} s after {bytes} bytes: the receiver stopped reading (raise \
         --linger to wait longer)",
        linger.as_secs_f64()
    )
}

/// A send error as the user should read it.
pub fn peer_error(e: &io::Error, bytes: u64) -> anyhow::Error {
    let why = match e.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
            "the receiver closed the connection (it stopped, or was killed)"
        }
        io::ErrorKind::ConnectionRefused => {
            "the receiver refused the datagrams (ICMP port unreachable: nothing listens on that \
             port)"
        }
        io::ErrorKind::ConnectionAborted => "the connection was aborted",
        _ => "sending failed",
    };
    anyhow::anyhow!("after {bytes} bytes, {why}: {e}")
}
