//! The object server itself: HTTP/1.1 `GET /<size>` over tokio, bodies sent zero-copy by
//! `zerotx::tokio::AsyncSender` from one shared in-memory object (each body chunk is a
//! `Bytes::slice` of it: a reference count, never a copy), or with tokio's `write_all` (mode
//! `copy`) for comparison. Shared by `object_server.rs` (the binary) and `tests/tokio_server.rs`
//! (which runs it in-process).
#![allow(dead_code)] // each includer uses a different part

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zerotx::tokio::{thread_ring, AsyncSender};
use zerotx::{EngineKind, SenderConfig};

/// The engine when `--engine` is not given. Switch to `"auto"` once `EngineKind::Auto` exists.
pub const DEFAULT_ENGINE: &str = "auto";

/// How bodies leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// tokio's `write_all` from the shared object: the kernel copies (`--engine copy`).
    WriteAll,
    /// zerotx's async sender with this engine.
    ZeroTx(EngineKind),
}

impl Mode {
    /// `copy` is the plain tokio mode; every other name is a zerotx engine.
    pub fn parse(s: &str) -> Result<Mode, String> {
        if s == "copy" {
            return Ok(Mode::WriteAll);
        }
        s.parse::<EngineKind>().map(Mode::ZeroTx)
    }

    pub fn name(&self) -> String {
        match self {
            Mode::WriteAll => "copy (write_all)".into(),
            Mode::ZeroTx(k) => k.to_string(),
        }
    }
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    /// The largest object served; the shared object is this big.
    pub max_size: usize,
    /// Bytes per buffer handed to the sender.
    pub chunk: usize,
    /// A body write that makes no progress for this long ends the connection.
    pub write_timeout: Duration,
    /// An idle keep-alive connection is closed after this long.
    pub idle_timeout: Duration,
    /// Closing waits for the kernel to release a connection's buffers while it releases one at
    /// least this often; past that the connection is reset (RST), which makes the kernel let go.
    pub close_timeout: Duration,
    /// Runtime worker threads (0: one current-thread runtime).
    pub threads: usize,
    /// How long a graceful stop waits for open connections to finish their responses.
    pub drain_timeout: Duration,
}

impl Config {
    pub fn new(mode: Mode) -> Self {
        Config {
            mode,
            max_size: 64 << 20,
            chunk: 256 << 10,
            write_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(5),
            threads: 2,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Counters, for `GET /stats` and the tests.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub open: AtomicU64,
    pub requests: AtomicU64,
    /// Responses whose whole body was handed to the kernel.
    pub responses: AtomicU64,
    pub body_bytes: AtomicU64,
    /// Buffers the sender accepted.
    pub buffers_sent: AtomicU64,
    /// Buffers the kernel released (taken back from the sender, or at close).
    pub buffers_released: AtomicU64,
    pub released_zerocopy: AtomicU64,
    pub released_with_error: AtomicU64,
    /// Buffers still held by the kernel when a connection closed (never handed back: see `zerotx::Closed::kept`).
    pub kept: AtomicU64,
    /// Sends the kernel refused (peer gone), and bodies cut short by a stalled peer.
    pub send_errors: AtomicU64,
    pub write_timeouts: AtomicU64,
    /// Connections reset because the kernel did not release their buffers in time.
    pub aborted: AtomicU64,
    pub headers_copied: AtomicU64,
    pub headers_queued: AtomicU64,
    pub bad_requests: AtomicU64,
    /// Connections per engine the sender reports (what `auto` chose, once it exists).
    pub engines: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// The library's counters of every finished connection's sender, merged.
    pub senders: std::sync::Mutex<zerotx::Stats>,
}

impl Stats {
    pub fn render(&self) -> String {
        let f = |a: &AtomicU64| a.load(Relaxed);
        let engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        let engines: String = engines
            .iter()
            .map(|(k, n)| format!("engine.{k}={n}\n"))
            .collect();
        engines
            + &format!(
            "connections={}\nopen={}\nrequests={}\nresponses={}\nbody_bytes={}\nbuffers_sent={}\n\
             buffers_released={}\nreleased_zerocopy={}\nreleased_with_error={}\nkept={}\n\
             send_errors={}\nwrite_timeouts={}\naborted={}\nheaders_copied={}\nheaders_queued={}\n\
             bad_requests={}\nleaked_buffers={}\n",
            f(&self.connections),
            f(&self.open),
            f(&self.requests),
            f(&self.responses),
            f(&self.body_bytes),
            f(&self.buffers_sent),
            f(&self.buffers_released),
            f(&self.released_zerocopy),
            f(&self.released_with_error),
            f(&self.kept),
            f(&self.send_errors),
            f(&self.write_timeouts),
            f(&self.aborted),
            f(&self.headers_copied),
            f(&self.headers_queued),
            f(&self.bad_requests),
            zerotx::leaked_buffers(),
        )
    }
}

/// The byte at offset `o` of every object: a word counter, so a shifted or stale byte shows (the
/// same pattern as the library's tests).
pub fn pattern(o: u64) -> u8 {
    let w = (o >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5_A5A5_A5A5_A5A5;
    (w >> ((o & 7) * 8)) as u8
}

/// The one shared object: `GET /<n>` serves its first `n` bytes.
pub fn make_object(size: usize) -> Bytes {
    let mut v = vec![0u8; size];
    for (i, chunk) in v.chunks_mut(8).enumerate() {
        let o = (i * 8) as u64;
        let w = (o >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5_A5A5_A5A5_A5A5;
        let bytes = w.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    Bytes::from(v)
}

/// `4096`, `64K`, `1M`, `1GiB`: the CLI's size grammar (binary units), from the `parse-size` crate.
pub fn parse_size(s: &str) -> Option<usize> {
    let bytes = parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .ok()?;
    usize::try_from(bytes).ok()
}

/// A server running on its own runtime thread(s).
pub struct Running {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    shutdown: tokio::sync::watch::Sender<bool>,
    thread: std::thread::JoinHandle<Drained>,
}

/// How a graceful stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Connections still open when the drain time ran out (0: every one finished).
    pub left_open: u64,
}

impl Running {
    /// Stops gracefully: no new connections; idle keep-alive connections close; a response
    /// being sent is finished (its buffers released) before its connection closes. Waits for
    /// that at most `cfg.drain_timeout`.
    pub fn stop(self) -> Drained {
        let _ = self.shutdown.send(true);
        self.thread.join().unwrap_or(Drained {
            left_open: u64::MAX,
        })
    }
}

/// The server's stop signal, as each connection sees it.
#[derive(Clone)]
pub struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    /// Resolves once a stop was asked for (never, if nobody can ask any more).
    async fn wait(&mut self) {
        if self.0.wait_for(|&stop| stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Why `/metrics` answers 404.
const NO_METRICS: &str = "no metrics: built without zerotx's `metrics` feature, or another \
                          metrics recorder was installed in this process first\n";

/// The process's Prometheus recorder for the `metrics` facade, installed by the first server
/// (the library publishes its counters there); `None` without the `metrics` feature or when
/// another recorder was installed first.
#[cfg(feature = "metrics")]
pub fn prometheus() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .ok()
        })
        .as_ref()
}

/// Without the `metrics` feature the library publishes nothing: no `/metrics`.
#[cfg(not(feature = "metrics"))]
pub fn prometheus() -> Option<&'static NoMetrics> {
    None
}

/// Stands for the recorder's handle in a build without the `metrics` feature.
#[cfg(not(feature = "metrics"))]
pub enum NoMetrics {}

#[cfg(not(feature = "metrics"))]
impl NoMetrics {
    fn render(&self) -> String {
        match *self {}
    }
}

pub fn spawn(addr: SocketAddr, cfg: Config) -> std::io::Result<Running> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let stats = Arc::new(Stats::default());
    let object = make_object(cfg.max_size);
    let rt = runtime(cfg.threads)?;
    let s = stats.clone();
    let (shutdown, rx) = tokio::sync::watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("object-server".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                serve(listener, Arc::new(cfg), object, s, Shutdown(rx)).await
            })
        })?;
    Ok(Running {
        addr,
        stats,
        shutdown,
        thread,
    })
}

pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// Accepts forever; one task per connection.
/// Accepts and serves connections until `shutdown`, then waits for the open ones to finish (at
/// most `cfg.drain_timeout`).
pub async fn serve(
    listener: TcpListener,
    cfg: Arc<Config>,
    object: Bytes,
    stats: Arc<Stats>,
    mut shutdown: Shutdown,
) -> Drained {
    // Installed before the first connection, so every sender's metrics reach it.
    let _ = prometheus();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = shutdown.wait() => break,
        };
        let (stream, _) = match accepted {
            Ok(c) => c,
            Err(e) => {
                eprintln!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        stats.connections.fetch_add(1, Relaxed);
        stats.open.fetch_add(1, Relaxed);
        let (cfg, object, stats) = (cfg.clone(), object.clone(), stats.clone());
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &cfg, object, &stats, shutdown).await {
                if std::env::var_os("OBJECT_SERVER_DEBUG").is_some() {
                    eprintln!("connection: {e}");
                }
            }
            stats.open.fetch_sub(1, Relaxed);
        });
    }
    // No new connections from here on.
    drop(listener);
    let deadline = tokio::time::Instant::now() + cfg.drain_timeout;
    while stats.open.load(Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Drained {
        left_open: stats.open.load(Relaxed),
    }
}

enum Request {
    /// `GET` or `HEAD` (`body: false`) of an object.
    Object {
        size: usize,
        close: bool,
        body: bool,
    },
    Stats {
        close: bool,
        body: bool,
    },
    /// `GET /metrics`: the library's metrics in Prometheus text (feature `metrics`).
    Metrics {
        close: bool,
        body: bool,
    },
    Bad(&'static str),
}

/// The largest request head taken.
const MAX_HEAD: usize = 8192;

/// Reads the next request head (`None`: the peer closed, it stayed idle past `idle`, or the
/// server is shutting down and the connection is between requests).
async fn read_request(
    rd: &mut TcpStream,
    buf: &mut Vec<u8>,
    idle: Duration,
    shutdown: &mut Shutdown,
) -> std::io::Result<Option<Request>> {
    loop {
        match parse_request(buf) {
            Parsed::Done(req, len) => {
                buf.drain(..len);
                return Ok(Some(req));
            }
            Parsed::Bad(why) => return Ok(Some(Request::Bad(why))),
            Parsed::Partial if buf.len() >= MAX_HEAD => {
                return Ok(Some(Request::Bad("request head over 8 KiB")))
            }
            Parsed::Partial => {}
        }
        let mut tmp = [0u8; 2048];
        // Between requests a shutdown closes the connection; a partial head is abandoned.
        let n = tokio::select! {
            r = tokio::time::timeout(idle, rd.read(&mut tmp)) => match r {
                Ok(r) => r?,
                Err(_) => return Ok(None),
            },
            () = shutdown.wait(), if buf.is_empty() => return Ok(None),
        };
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

enum Parsed {
    /// A request, and the bytes its head took.
    Done(Request, usize),
    Partial,
    Bad(&'static str),
}

/// One request head, by `httparse`.
fn parse_request(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Bad("more than 32 headers"),
        Err(_) => return Parsed::Bad("not an HTTP/1.x request"),
    };
    // httparse: version 1 is HTTP/1.1, 0 is HTTP/1.0 (which closes unless asked not to).
    let mut close = req.version != Some(1);
    for h in req.headers.iter() {
        let v = String::from_utf8_lossy(h.value);
        let v = v.trim();
        if h.name.eq_ignore_ascii_case("connection") {
            if v.eq_ignore_ascii_case("close") {
                close = true;
            } else if v.eq_ignore_ascii_case("keep-alive") {
                close = false;
            }
        } else if h.name.eq_ignore_ascii_case("content-length") && v != "0"
            || h.name.eq_ignore_ascii_case("transfer-encoding")
        {
            return Parsed::Done(Request::Bad("request bodies are not accepted"), len);
        }
    }
    let body = match req.method {
        Some("GET") => true,
        Some("HEAD") => false,
        _ => return Parsed::Done(Request::Bad("only GET and HEAD"), len),
    };
    let r = match req.path.and_then(|t| t.strip_prefix('/')) {
        Some("stats") => Request::Stats { close, body },
        Some("metrics") => Request::Metrics { close, body },
        Some(s) => match parse_size(s) {
            Some(size) => Request::Object { size, close, body },
            None => Request::Bad("GET /<size>, e.g. /4096, /64K, /1M"),
        },
        None => Request::Bad("no target"),
    };
    Parsed::Done(r, len)
}

fn head(status: &str, len: usize, close: bool, kind: &str) -> Vec<u8> {
    let conn = if close { "close" } else { "keep-alive" };
    format!(
        "HTTP/1.1 {status}\r\nContent-Length: {len}\r\nContent-Type: {kind}\r\n\
         Connection: {conn}\r\n\r\n"
    )
    .into_bytes()
}

async fn connection(
    stream: TcpStream,
    cfg: &Config,
    object: Bytes,
    stats: &Stats,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    match cfg.mode {
        Mode::WriteAll => connection_write_all(stream, cfg, object, stats, shutdown).await,
        Mode::ZeroTx(kind) => connection_zerotx(stream, kind, cfg, object, stats, shutdown).await,
    }
}

/// What one response needs to know besides the socket.
struct Answer {
    head: Vec<u8>,
    body: Option<Bytes>,
    close: bool,
}

fn answer(req: Request, cfg: &Config, object: &Bytes, stats: &Stats) -> Answer {
    stats.requests.fetch_add(1, Relaxed);
    match req {
        Request::Object { size, close, body } if size <= cfg.max_size => Answer {
            head: head("200 OK", size, close, "application/octet-stream"),
            body: (body && size > 0).then(|| object.slice(..size)),
            close,
        },
        Request::Object { .. } => {
            let msg = format!("objects go up to {} bytes\n", cfg.max_size);
            let mut h = head("404 Not Found", msg.len(), false, "text/plain");
            h.extend_from_slice(msg.as_bytes());
            Answer {
                head: h,
                body: None,
                close: false,
            }
        }
        Request::Stats { close, body } => {
            let msg = stats.render();
            let mut h = head("200 OK", msg.len(), close, "text/plain");
            if body {
                h.extend_from_slice(msg.as_bytes());
            }
            Answer {
                head: h,
                body: None,
                close,
            }
        }
        Request::Metrics { close, body } => {
            let (status, msg) = match prometheus() {
                Some(handle) => ("200 OK", handle.render()),
                None => ("404 Not Found", NO_METRICS.to_string()),
            };
            let mut h = head(status, msg.len(), close, "text/plain; version=0.0.4");
            if body {
                h.extend_from_slice(msg.as_bytes());
            }
            Answer {
                head: h,
                body: None,
                close,
            }
        }
        Request::Bad(why) => {
            stats.bad_requests.fetch_add(1, Relaxed);
            let msg = format!("{why}\n");
            let mut h = head("400 Bad Request", msg.len(), true, "text/plain");
            h.extend_from_slice(msg.as_bytes());
            Answer {
                head: h,
                body: None,
                close: true,
            }
        }
    }
}

/// `--engine copy`: tokio's `write_all`, which borrows the bytes for the call: the kernel copies.
async fn connection_write_all(
    mut stream: TcpStream,
    cfg: &Config,
    object: Bytes,
    stats: &Stats,
    mut shutdown: Shutdown,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    while let Some(req) =
        read_request(&mut stream, &mut buf, cfg.idle_timeout, &mut shutdown).await?
    {
        let a = answer(req, cfg, &object, stats);
        let write = async {
            stream.write_all(&a.head).await?;
            if let Some(body) = &a.body {
                for piece in body.chunks(cfg.chunk) {
                    match tokio::time::timeout(cfg.write_timeout, stream.write_all(piece)).await {
                        Ok(r) => r?,
                        Err(_) => {
                            stats.write_timeouts.fetch_add(1, Relaxed);
                            return Err(std::io::ErrorKind::TimedOut.into());
                        }
                    }
                }
                stats.body_bytes.fetch_add(body.len() as u64, Relaxed);
                stats.responses.fetch_add(1, Relaxed);
            }
            Ok::<_, std::io::Error>(())
        };
        if let Err(e) = write.await {
            stats.send_errors.fetch_add(1, Relaxed);
            return Err(e);
        }
        if a.close {
            break;
        }
    }
    Ok(())
}

/// zerotx mode: requests are read (and headers written by copy) on a duplicate of the socket
/// registered with tokio; bodies go through the async sender, which owns the socket.
async fn connection_zerotx(
    stream: TcpStream,
    kind: EngineKind,
    cfg: &Config,
    object: Bytes,
    stats: &Stats,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let std = stream.into_std()?;
    let mut rd = TcpStream::from_std(std.try_clone()?)?;
    let sender_cfg = match kind {
        // One ring per runtime thread, shared by the connections accepted on it.
        // (auto too: it takes io_uring for TCP where the kernel reports copies, and the shared
        // ring where it does not fall back to sendmsg(2) on its own.)
        EngineKind::Uring | EngineKind::UringZc => SenderConfig::shared(kind, &thread_ring()?),
        EngineKind::Auto => match thread_ring() {
            Ok(ring) => SenderConfig::shared(kind, &ring),
            Err(_) => SenderConfig::new(kind),
        },
        _ => SenderConfig::new(kind),
    };
    let tx: AsyncSender<Bytes> = match AsyncSender::with_config(std.try_clone()?, sender_cfg) {
        Ok(tx) => tx,
        // auto on a shared ring is refused where io_uring has no zero-copy sends that report
        // copies: it takes sendmsg(2) on its own then.
        Err(_) if kind == EngineKind::Auto => {
            AsyncSender::with_config(std, SenderConfig::new(kind))?
        }
        Err(e) => return Err(e.into()),
    };
    // What the sender runs on: the engine, and for auto what it chose.
    let label = match tx.engine() {
        EngineKind::Auto => format!("auto({})", tx.explain().path),
        k => k.to_string(),
    };
    *stats
        .engines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(label)
        .or_default() += 1;
    let result = zerotx_requests(&mut rd, &tx, cfg, &object, stats, shutdown).await;
    finish(tx, &rd, cfg, stats).await;
    result
}

async fn zerotx_requests(
    rd: &mut TcpStream,
    tx: &AsyncSender<Bytes>,
    cfg: &Config,
    object: &Bytes,
    stats: &Stats,
    mut shutdown: Shutdown,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut done = Vec::new();
    loop {
        // The previous body may still be queued (an io_uring engine accepts a whole body at
        // once): a peer that stopped reading it is timed out here too, not only in `send`.
        let req = tokio::select! {
            r = read_request(rd, &mut buf, cfg.idle_timeout, &mut shutdown) => r?,
            e = stalled(tx, cfg.write_timeout) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    stats.write_timeouts.fetch_add(1, Relaxed);
                }
                return Err(e);
            }
        };
        let Some(req) = req else {
            break;
        };
        let a = answer(req, cfg, object, stats);
        // The head goes by copy when nothing of ours is queued or in flight (a plain write then
        // lands after every byte sent before); otherwise it must queue behind the previous body
        // in the sender, or it would overtake it on the wire.
        if tx.in_flight() == 0 {
            stats.headers_copied.fetch_add(1, Relaxed);
            rd.write_all(&a.head).await?;
        } else {
            stats.headers_queued.fetch_add(1, Relaxed);
            send(tx, Bytes::from(a.head), cfg, stats).await?;
        }
        if let Some(body) = a.body {
            let mut off = 0;
            while off < body.len() {
                let end = (off + cfg.chunk).min(body.len());
                send(tx, body.slice(off..end), cfg, stats).await?;
                off = end;
                collect(tx, &mut done, stats)?;
            }
            stats.body_bytes.fetch_add(body.len() as u64, Relaxed);
            stats.responses.fetch_add(1, Relaxed);
        }
        collect(tx, &mut done, stats)?;
        if a.close {
            break;
        }
    }
    Ok(())
}

/// Resolves when buffers are held and none was released for `timeout` (`TimedOut`), or when a
/// flush says a body was cut short (the peer reset: `Error::Failed`, the stream is over); never
/// once nothing is held (nothing is sent while the caller waits for the next request).
async fn stalled(tx: &AsyncSender<Bytes>, timeout: Duration) -> std::io::Error {
    loop {
        let before = tx.in_flight();
        if before == 0 {
            return std::future::pending().await;
        }
        match tx.flush(timeout).await {
            Ok(()) => {}
            Err(e @ zerotx::Error::Failed { .. }) => return e.into(),
            Err(e) if tx.in_flight() >= before => return e.into(),
            Err(_) => {}
        }
    }
}

/// One buffer into the sender, within the write timeout.
async fn send(
    tx: &AsyncSender<Bytes>,
    buf: Bytes,
    cfg: &Config,
    stats: &Stats,
) -> std::io::Result<()> {
    match tokio::time::timeout(cfg.write_timeout, tx.send(buf)).await {
        Ok(Ok(())) => {
            stats.buffers_sent.fetch_add(1, Relaxed);
            Ok(())
        }
        Ok(Err(e)) => {
            stats.send_errors.fetch_add(1, Relaxed);
            Err(e.into())
        }
        Err(_) => {
            stats.write_timeouts.fetch_add(1, Relaxed);
            Err(std::io::ErrorKind::TimedOut.into())
        }
    }
}

/// Takes back what the kernel released and counts it (the `Bytes` clones drop here).
fn collect(
    tx: &AsyncSender<Bytes>,
    done: &mut Vec<zerotx::Released<Bytes>>,
    stats: &Stats,
) -> std::io::Result<()> {
    tx.drain_released(done)?;
    count(done.drain(..), stats);
    Ok(())
}

fn count(released: impl Iterator<Item = zerotx::Released<Bytes>>, stats: &Stats) {
    for r in released {
        stats.buffers_released.fetch_add(1, Relaxed);
        if r.report.path.is_zerocopy() {
            stats.released_zerocopy.fetch_add(1, Relaxed);
        }
        if let Some(e) = &r.report.error {
            if std::env::var_os("OBJECT_SERVER_DEBUG").is_some() {
                eprintln!("released with error after {} bytes: {e}", r.report.bytes);
            }
            stats.released_with_error.fetch_add(1, Relaxed);
        }
    }
}

/// Ends a connection without keeping buffers: waits for the kernel to release them (the peer
/// reading and acknowledging) for as long as it releases at least one every `close_timeout`;
/// a peer that stops reading gets its connection reset, which makes the kernel drop what it
/// still queued and release it.
async fn finish(tx: AsyncSender<Bytes>, rd: &TcpStream, cfg: &Config, stats: &Stats) {
    loop {
        let before = tx.in_flight();
        match tx.flush(cfg.close_timeout).await {
            // Everything released; a body cut short (`Error::Failed`) is counted by its report.
            Ok(()) | Err(zerotx::Error::Failed { .. }) => break,
            Err(_) if tx.in_flight() < before => continue, // still reading: wait on
            Err(_) => {
                stats.aborted.fetch_add(1, Relaxed);
                abort(rd);
                break;
            }
        }
    }
    let library = tx.stats();
    let closed = tx.close(cfg.close_timeout).await;
    let mut merged = stats.senders.lock().unwrap_or_else(|e| e.into_inner());
    merged.merge(&library);
    drop(merged);
    count(closed.released.into_iter(), stats);
    stats.kept.fetch_add(closed.kept as u64, Relaxed);
}

/// Resets a TCP connection while its descriptor stays open: `connect(AF_UNSPEC)` disconnects the
/// socket (`tcp_disconnect`: RST to the peer, the write queue purged, zero-copy completions
/// posted). Closing with `SO_LINGER` 0 would do the same, but the sender still owns the socket.
fn abort(sock: &TcpStream) {
    let addr = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: connect reads `size_of::<sockaddr>()` bytes from a live local `sockaddr`; the
    // descriptor is borrowed from a stream that lives across the call.
    let rc = unsafe {
        libc::connect(
            sock.as_fd().as_raw_fd(),
            &addr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc != 0 && std::env::var_os("OBJECT_SERVER_DEBUG").is_some() {
        eprintln!("abort: {}", std::io::Error::last_os_error());
    }
}
