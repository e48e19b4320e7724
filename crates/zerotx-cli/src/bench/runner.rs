//! The benchmark method: how one run of one cell is measured, and the topologies it runs in.
//!
//! - Buffers come from a ring of pooled, page-aligned blocks much larger than the L2 cache, taken
//!   in FIFO order, so every send reads memory that is not hot (a single hot buffer flatters the
//!   copy path). Blocks are filled once; their content does not matter to the kernel.
//! - The sender fills the pipe with blocking sends and reaps releases every [`REAP_EVERY`] sends
//!   (and whenever the ring runs dry), the way a real zero-copy sender amortises
//!   `recvmsg(MSG_ERRQUEUE)`. Release latency therefore has a resolution of that many sends.
//! - Time runs from the first send to the release of the last buffer (a flush), so a zero-copy
//!   engine cannot look fast by leaving work in flight.
//! - Sender CPU is the process's CPU (`getrusage`, which counts io_uring's worker threads) minus
//!   the sink thread's own (`CLOCK_THREAD_CPUTIME_ID`): no hardware counters are needed.
//! - The sender and the sink are pinned to different CPUs when there are two.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use zerotx::{BufPool, EngineKind, PoolBufMut, PooledBuf, Released, Sender, SenderConfig};
use zerotx_testbed as testbed;

use super::result::Run;

/// Sends between two reaps.
pub const REAP_EVERY: u64 = 32;

/// The engines as the CLI and scripts name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum BenchEngine {
    /// `copy`
    Copy,
    /// `msg-zc`
    MsgZc,
    /// `uring`
    Uring,
    /// `uring-zc`
    UringZc,
    /// `uring-zc-fixed`: uring-zc from a registered buffer ring.
    UringZcFixed,
}

impl BenchEngine {
    pub const ALL: [BenchEngine; 5] = [
        BenchEngine::Copy,
        BenchEngine::MsgZc,
        BenchEngine::Uring,
        BenchEngine::UringZc,
        BenchEngine::UringZcFixed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BenchEngine::UringZcFixed => "uring-zc-fixed",
            other => other.kind().name(),
        }
    }

    pub fn kind(self) -> EngineKind {
        match self {
            BenchEngine::Copy => EngineKind::Copy,
            BenchEngine::MsgZc => EngineKind::MsgZerocopy,
            BenchEngine::Uring => EngineKind::Uring,
            BenchEngine::UringZc | BenchEngine::UringZcFixed => EngineKind::UringZc,
        }
    }
}

impl FromStr for BenchEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BenchEngine::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = BenchEngine::ALL.iter().map(|e| e.name()).collect();
                format!(
                    "unknown engine {s:?}; expected one of: {}",
                    names.join(", ")
                )
            })
    }
}

/// A ring of at least `ring_bytes` (and 64 blocks) of `size`-byte buffers, filled once.
pub fn buffer_ring(size: usize, ring_bytes: usize) -> anyhow::Result<BufPool> {
    let block = size.next_multiple_of(4096);
    let count = (ring_bytes / block).max(64);
    let pool = BufPool::new(size, count).context("allocating the buffer ring")?;
    let mut all: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
    for (i, b) in all.iter_mut().enumerate() {
        b.fill(i as u8 | 1);
    }
    Ok(pool)
}

fn percentile(sorted: &[u32], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    f64::from(sorted[i]) / 1000.0
}

/// Sends `size`-byte buffers from `pool` on `sock` through `engine` for `duration`, then waits for
/// every release. `cpu_seconds` is the whole process's; the caller subtracts the sink's.
/// `dest` is for unconnected datagram sockets.
pub fn run_once(
    sock: OwnedFd,
    engine: BenchEngine,
    size: usize,
    pool: &BufPool,
    duration: Duration,
) -> anyhow::Result<Run> {
    let mut tx: Sender<PooledBuf> = Sender::with_config(sock, SenderConfig::new(engine.kind()))
        .with_context(|| format!("creating the {} engine", engine.name()))?;
    if engine == BenchEngine::UringZcFixed {
        tx.register_pool(pool)
            .context("registering the buffer ring with io_uring")?;
    }
    let mut free: VecDeque<PoolBufMut> = std::iter::from_fn(|| pool.take()).collect();
    let mut out: Vec<Released<PooledBuf>> = Vec::new();
    let mut latencies: Vec<u32> = Vec::new();
    let mut recycle = |out: &mut Vec<Released<PooledBuf>>, free: &mut VecDeque<PoolBufMut>| {
        for r in out.drain(..) {
            if let Some(l) = r.report.latency {
                latencies.push(l.as_nanos().min(u32::MAX as u128) as u32);
            }
            if let Some(e) = r.report.error {
                return Err(anyhow::Error::new(e).context("a send failed part way"));
            }
            free.push_back(r.buf.into_mut());
        }
        Ok(())
    };
    let mut sends = 0u64;
    let cpu0 = testbed::process_cpu_time();
    let start = Instant::now();
    while start.elapsed() < duration {
        if sends % REAP_EVERY == 0 {
            tx.reap(&mut out).context("reaping completions")?;
            recycle(&mut out, &mut free)?;
        }
        match free.pop_front() {
            Some(b) => {
                tx.send(b.freeze(size)).map_err(std::io::Error::from)?;
                sends += 1;
            }
            None => {
                tx.wait_released(&mut out, Some(Duration::from_millis(200)))
                    .context("waiting for completions")?;
                recycle(&mut out, &mut free)?;
            }
        }
    }
    tx.flush(Duration::from_secs(30))
        .context("waiting for the last completions")?;
    tx.reap(&mut out)?;
    recycle(&mut out, &mut free)?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = (testbed::process_cpu_time() - cpu0).as_secs_f64();
    let stats = tx.stats();
    let closed = tx.close(Duration::from_secs(1));
    if closed.kept > 0 {
        bail!("{} buffers were still held at close", closed.kept);
    }
    latencies.sort_unstable();
    Ok(Run {
        bytes: stats.bytes,
        sends,
        seconds,
        cpu_seconds,
        zerocopy: stats.zerocopy,
        kernel_copied: stats.kernel_copied,
        engine_copied: stats.engine_copied,
        fallbacks: stats.fallbacks,
        enobufs: stats.enobufs,
        p50_us: percentile(&latencies, 50),
        p99_us: percentile(&latencies, 99),
    })
}

/// A TCP sink on loopback: a pinned thread that reads each connection to its end and reports
/// bytes and its own CPU time per connection.
pub struct TcpSink {
    addr: SocketAddr,
    results: mpsc::Receiver<(u64, Duration)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpSink {
    pub fn start(cpu: Option<usize>) -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding the loopback sink")?;
        let addr = listener.local_addr()?;
        let (tx, results) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = testbed::pin_thread(cpu);
            }
            let mut buf = vec![0u8; 1 << 20];
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut s) = conn else { continue };
                let cpu0 = testbed::thread_cpu_time();
                let mut bytes = 0u64;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    bytes += n as u64;
                }
                let _ = tx.send((bytes, testbed::thread_cpu_time() - cpu0));
            }
        });
        Ok(Self {
            addr,
            results,
            stop,
            thread: Some(thread),
        })
    }

    pub fn connect(&self) -> anyhow::Result<TcpStream> {
        TcpStream::connect(self.addr).context("connecting to the loopback sink")
    }

    /// The (bytes, sink CPU) of the connection that just closed.
    pub fn result(&self) -> anyhow::Result<(u64, Duration)> {
        self.results
            .recv_timeout(Duration::from_secs(30))
            .context("the loopback sink did not report")
    }
}

impl Drop for TcpSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
