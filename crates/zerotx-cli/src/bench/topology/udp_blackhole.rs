//! UDP into the black hole (docs/kernel.md, "This machine (what a test can rely on)"): inside a
//! fresh network namespace, a veth whose peer is down drops every datagram after the send, so
//! zero-copy completions come back NOT copied: the role the `dummy` device plays in the kernel's
//! io_uring results. Needs root.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use anyhow::Context;
use zerotx_testbed as testbed;

use super::{Body, Cpus, Site, Topology};

/// UDP into the black hole of a private network namespace.
pub struct UdpBlackhole;

impl Topology for UdpBlackhole {
    fn name(&self) -> &'static str {
        "udp-blackhole"
    }

    fn description(&self) -> String {
        "UDP in a private network namespace into a veth whose peer is down (a true zero-copy \
         sink, like the dummy device)"
            .into()
    }

    fn default_sizes(&self) -> Vec<usize> {
        vec![1472, 4096, 16384, 65000]
    }

    fn max_size(&self) -> usize {
        65507
    }

    fn enter(&self, cpus: Cpus, body: &mut Body<'_>) -> anyhow::Result<()> {
        let built = testbed::in_new_netns(|| -> anyhow::Result<()> {
            cpus.pin_sender();
            // MTU 65535: 64 KiB datagrams leave whole (fragments are copied).
            let bh = testbed::black_hole(65535).context("building the black hole")?;
            body(&mut BlackHoleSite { dest: bh.v4 });
            Ok(())
        });
        match built {
            Ok(r) => r,
            Err(e) => Err(anyhow::anyhow!(
                "{e} (run as root to measure true zero-copy)"
            )),
        }
    }
}

/// A UDP destination that a device or its peer drops: each run's socket is connected to it.
pub(super) struct BlackHoleSite {
    /// The destination, valid in the topology's namespace.
    pub(super) dest: SocketAddr,
}

impl Site for BlackHoleSite {
    fn open(&mut self) -> anyhow::Result<OwnedFd> {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.connect(self.dest)?;
        Ok(sock.into())
    }

    /// The sink is the device (or its peer's ingress hook, run by the sender's own softirq): no
    /// other CPU.
    fn sink_cpu(&mut self) -> anyhow::Result<Duration> {
        Ok(Duration::ZERO)
    }

    fn udp_target(&self) -> Option<SocketAddr> {
        Some(self.dest)
    }
}
