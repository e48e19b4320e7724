//! UDP into the black hole *with carrier* (docs/kernel.md, "This machine (what a test can rely
//! on)"): inside a fresh network namespace, a veth at MTU 1500 whose peer is up in a second
//! namespace and drops everything at its ingress (an nftables `netdev` chain), so the device's
//! whole transmit path runs, as on a NIC, and zero-copy completions still come back NOT copied.
//! Two modes: UDP segmentation offload on (the device takes a GSO train whole), and off (the
//! kernel segments trains in software, as for a NIC without the offload). The peer-down black
//! hole drops a train at the queue, unsegmented, and so flatters trains. Needs root, `nft` and,
//! for software segmentation, `ethtool`.

use anyhow::Context;
use zerotx_testbed::{self as testbed, Segmentation};

use super::udp_blackhole::BlackHoleSite;
use super::{Body, Cpus, Topology};

/// A NIC's MTU: datagrams and train segments up to 1472 B of UDP payload over IPv4.
const MTU: u32 = 1500;

/// UDP into a black hole with carrier, segmentation offload on or off.
pub struct UdpCarrier {
    /// How the sending device treats a GSO train.
    pub segmentation: Segmentation,
}

impl Topology for UdpCarrier {
    fn name(&self) -> &'static str {
        match self.segmentation {
            Segmentation::Offload => "udp-carrier",
            Segmentation::Software => "udp-carrier-sw",
        }
    }

    fn description(&self) -> String {
        let how = match self.segmentation {
            Segmentation::Offload => "UDP segmentation offload on",
            Segmentation::Software => "UDP segmentation in software (offload off)",
        };
        format!(
            "UDP in a private network namespace into a veth at MTU {MTU} whose peer is up and \
             drops everything at ingress (a NIC-like sink with carrier; {how})"
        )
    }

    fn default_sizes(&self) -> Vec<usize> {
        vec![1200, 1472]
    }

    fn max_size(&self) -> usize {
        (MTU - 28) as usize
    }

    fn enter(&self, cpus: Cpus, body: &mut Body<'_>) -> anyhow::Result<()> {
        let segmentation = self.segmentation;
        let built = testbed::in_new_netns(|| -> anyhow::Result<()> {
            cpus.pin_sender();
            let bh = testbed::carrier_black_hole(MTU, segmentation)
                .context("building the black hole with carrier")?;
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
