//! Where a benchmark sends: one [`Topology`] per file, each building what it needs (a sink
//! thread, a network namespace, a peer address) and opening sockets inside it.
//!
//! Namespaces are per thread, so a topology does not hand back what it built: it runs the
//! benchmark's body inside it ([`Topology::enter`]), on a sender thread pinned to the sender CPU,
//! and gives the body a [`Site`] to open sockets from.

mod tcp_loopback;
mod udp_blackhole;
mod udp_carrier;
mod vsock;

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::Duration;

use zerotx_testbed::{self as testbed, Segmentation};

pub use tcp_loopback::TcpLoopback;
pub use udp_blackhole::UdpBlackhole;
pub use udp_carrier::UdpCarrier;
pub use vsock::Vsock;

/// A topology as the options name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// TCP over loopback to a sink thread.
    TcpLoopback,
    /// UDP into the black hole of a fresh network namespace.
    UdpBlackhole,
    /// UDP into a black hole with carrier (the peer up, dropping at ingress), segmentation
    /// offload on or off.
    UdpCarrier(Segmentation),
    /// AF_VSOCK stream to `cid:port`.
    Vsock {
        /// Peer CID.
        cid: u32,
        /// Peer port.
        port: u32,
    },
}

impl Choice {
    /// The topology itself.
    pub fn build(self) -> Box<dyn Topology> {
        match self {
            Choice::TcpLoopback => Box::new(TcpLoopback),
            Choice::UdpBlackhole => Box::new(UdpBlackhole),
            Choice::UdpCarrier(segmentation) => Box::new(UdpCarrier { segmentation }),
            Choice::Vsock { cid, port } => Box::new(Vsock { cid, port }),
        }
    }
}

/// Which CPUs the sender (and a local sink) run on; `None`: not pinned (one CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpus {
    /// The sender thread's CPU.
    pub sender: Option<usize>,
    /// A local sink thread's CPU.
    pub sink: Option<usize>,
}

impl Cpus {
    /// Sender on CPU 0 and sink on CPU 1 when there are two CPUs.
    pub fn for_host(cpus: usize) -> Self {
        if cpus >= 2 {
            Self {
                sender: Some(0),
                sink: Some(1),
            }
        } else {
            Self {
                sender: None,
                sink: None,
            }
        }
    }

    /// Pins the calling thread to the sender CPU (best effort: a failure only costs precision).
    pub fn pin_sender(&self) {
        if let Some(cpu) = self.sender {
            let _ = testbed::pin_thread(cpu);
        }
    }
}

/// What runs inside a topology.
pub type Body<'a> = dyn FnMut(&mut dyn Site) + Send + 'a;

/// A place to send to.
pub trait Topology {
    /// Name in flags, tables and JSON (`tcp-loopback`, `udp-blackhole`, `udp-carrier`,
    /// `udp-carrier-sw`, `vsock`).
    fn name(&self) -> &'static str;
    /// What it is, in a few words.
    fn description(&self) -> String;
    /// The sizes the kernel's own tables use for this kind of socket.
    fn default_sizes(&self) -> Vec<usize>;
    /// The largest send that fits (a UDP datagram's payload).
    fn max_size(&self) -> usize;
    /// Builds the topology and runs `body` inside it, on a thread pinned to `cpus.sender`. An
    /// error means the topology could not be built (the table shows it as skipped).
    fn enter(&self, cpus: Cpus, body: &mut Body<'_>) -> anyhow::Result<()>;
}

/// A topology, built: what a run needs from it.
pub trait Site {
    /// A connected socket to send on, fresh for each run.
    fn open(&mut self) -> anyhow::Result<OwnedFd>;
    /// CPU time the local sink spent on the connection that just closed (zero when the sink is a
    /// device or a remote peer). Call once after every run whose socket was opened.
    fn sink_cpu(&mut self) -> anyhow::Result<Duration>;
    /// Where an outside program sends UDP datagrams to reach the same sink, if it can.
    fn udp_target(&self) -> Option<SocketAddr> {
        None
    }
}

/// Runs `f` on a scoped thread pinned to the sender CPU (the sender never shares the caller's
/// affinity, and a topology that needs no namespace still runs pinned).
fn on_sender_thread<T: Send>(cpus: Cpus, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(move || {
            cpus.pin_sender();
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}
