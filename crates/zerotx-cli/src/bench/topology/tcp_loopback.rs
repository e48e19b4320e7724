//! TCP over loopback to a sink thread. The kernel copies zero-copy sends delivered locally (and
//! says so): a real outcome users must see, not a zero-copy benchmark.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use zerotx_testbed as testbed;

use super::{on_sender_thread, Body, Cpus, Site, Topology};

/// TCP over loopback.
pub struct TcpLoopback;

impl Topology for TcpLoopback {
    fn name(&self) -> &'static str {
        "tcp-loopback"
    }

    fn description(&self) -> String {
        "TCP over loopback to a sink thread; the kernel copies on local delivery".into()
    }

    fn default_sizes(&self) -> Vec<usize> {
        vec![1400, 4096, 16384, 65536, 262_144, 1_048_576]
    }

    fn max_size(&self) -> usize {
        64 << 20
    }

    fn enter(&self, cpus: Cpus, body: &mut Body<'_>) -> anyhow::Result<()> {
        let mut site = TcpSink::start(cpus.sink)?;
        // The sink moves with the sender thread: its result channel is not Sync.
        on_sender_thread(cpus, move || body(&mut site));
        Ok(())
    }
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
    /// Binds a loopback port and starts the sink thread, pinned to `cpu`.
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
}

impl Site for TcpSink {
    fn open(&mut self) -> anyhow::Result<OwnedFd> {
        let s = TcpStream::connect(self.addr).context("connecting to the loopback sink")?;
        Ok(s.into())
    }

    /// The sink's CPU for the connection that just closed. Take it after every run, or the next
    /// run would read this one's.
    fn sink_cpu(&mut self) -> anyhow::Result<Duration> {
        let (_bytes, cpu) = self
            .results
            .recv_timeout(Duration::from_secs(30))
            .context("the loopback sink did not report")?;
        Ok(cpu)
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
