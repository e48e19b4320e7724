//! AF_VSOCK stream to a peer the user runs (`--vsock CID:PORT`), for example
//! `socat VSOCK-LISTEN:PORT,fork /dev/null` in a VM or on its host.

use std::os::fd::OwnedFd;
use std::time::Duration;

use anyhow::Context;
use socket2::{Domain, SockAddr, Socket, Type};

use super::{on_sender_thread, Body, Cpus, Site, Topology};

/// AF_VSOCK stream to `cid:port`.
pub struct Vsock {
    /// Peer CID.
    pub cid: u32,
    /// Peer port.
    pub port: u32,
}

impl Topology for Vsock {
    fn name(&self) -> &'static str {
        "vsock"
    }

    fn description(&self) -> String {
        format!("AF_VSOCK stream to {}:{}", self.cid, self.port)
    }

    fn default_sizes(&self) -> Vec<usize> {
        vec![1400, 4096, 16384, 65536, 262_144, 1_048_576]
    }

    fn max_size(&self) -> usize {
        64 << 20
    }

    fn enter(&self, cpus: Cpus, body: &mut Body<'_>) -> anyhow::Result<()> {
        let mut site = VsockPeer {
            cid: self.cid,
            port: self.port,
        };
        on_sender_thread(cpus, move || body(&mut site));
        Ok(())
    }
}

struct VsockPeer {
    cid: u32,
    port: u32,
}

impl Site for VsockPeer {
    fn open(&mut self) -> anyhow::Result<OwnedFd> {
        let s = Socket::new(Domain::VSOCK, Type::STREAM, None)
            .context("creating an AF_VSOCK socket (is a vsock transport loaded?)")?;
        s.connect(&SockAddr::vsock(self.cid, self.port))
            .with_context(|| format!("connecting to vsock {}:{}", self.cid, self.port))?;
        Ok(s.into())
    }

    /// The peer is elsewhere: no local CPU.
    fn sink_cpu(&mut self) -> anyhow::Result<Duration> {
        Ok(Duration::ZERO)
    }
}
