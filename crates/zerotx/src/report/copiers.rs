//! The silent copiers: what on a socket's way out makes the kernel copy zero-copy sends (or
//! report them as copied) without saying why. [`Sender::explain`](crate::Sender::explain) looks
//! them up (`egress.rs`) and names each in a sentence a user can act on, written here.

/// How the route's egress device delivers, where that decides whether the kernel copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The loopback device: the peer is on this machine.
    Loopback,
    /// A veth pair: the peer may be in another network namespace of this machine.
    Veth,
    /// A bridge: the peer may be a container or VM on this machine.
    Bridge,
    /// A tun/tap device: a program on this machine (a VM, a VPN) reads the packets.
    Tun,
    /// Any other device.
    Device,
}

/// What the socket's way out holds, as far as the kernel says: every field is what a cheap
/// query answered, `None` where it did not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PathFacts {
    /// The egress device's name, and how it delivers.
    pub(crate) device: Option<(String, Delivery)>,
    /// The device has scatter-gather on.
    pub(crate) sg: Option<bool>,
    /// The device has a transmit checksum offload on.
    pub(crate) tx_csum: Option<bool>,
    /// The socket sends datagrams (UDP), which the kernel sends zero-copy only with the
    /// device's checksum offload.
    pub(crate) datagram: bool,
    /// Packet sockets that see every frame sent on the device.
    pub(crate) taps: usize,
    /// The socket's `SO_TIMESTAMPING` flags, when they ask for TX timestamps with the packet
    /// (without `SOF_TIMESTAMPING_OPT_TSONLY`).
    pub(crate) tx_timestamps: Option<u32>,
}

impl PathFacts {
    /// Whether the kernel copies (or reports as copied) every zero-copy send on this path.
    pub(crate) fn copies_all(&self) -> bool {
        let dev = |d: &Delivery| matches!(&self.device, Some((_, x)) if x == d);
        dev(&Delivery::Loopback)
            || self.sg == Some(false)
            || (self.datagram && self.tx_csum == Some(false))
            || self.taps > 0
            || self.tx_timestamps.is_some()
    }

    /// One sentence per copier found. `loopback_said`: `auto` already named a loopback peer.
    pub(crate) fn lines(&self, loopback_said: bool) -> Vec<String> {
        let mut out = Vec::new();
        let Some((name, delivery)) = &self.device else {
            return self.timestamp_line().into_iter().collect();
        };
        match delivery {
            Delivery::Loopback if !loopback_said => out.push(format!(
                "the route leaves through the loopback device ({name}): the peer is on this \
                 machine, and the kernel copies every zero-copy send on delivery to a local \
                 socket; zero-copy pays only through a device that leaves the machine"
            )),
            Delivery::Veth => out.push(format!(
                "the route leaves through {name}, a veth pair: if the peer is on this machine \
                 (another network namespace, a container), the kernel copies every zero-copy \
                 send on delivery and reports it copied; zero-copy pays only where the packets \
                 leave the machine"
            )),
            Delivery::Bridge => out.push(format!(
                "the route leaves through {name}, a bridge: a peer on this machine (a container \
                 or VM on the bridge) gets its packets copied on delivery, and the kernel reports \
                 those zero-copy sends copied"
            )),
            Delivery::Tun => out.push(format!(
                "the route leaves through {name}, a tun/tap device: the program that reads it (a \
                 VM, a VPN) takes a copy of every packet, so the kernel reports zero-copy sends \
                 copied"
            )),
            Delivery::Loopback | Delivery::Device => {}
        }
        if self.sg == Some(false) {
            out.push(format!(
                "the egress device {name} has scatter-gather off, so the kernel copies zero-copy \
                 sends into its own buffers: turn it on with `ethtool -K {name} sg on` where the \
                 driver can, or send by copy"
            ));
        }
        if self.tx_csum == Some(false) {
            out.push(format!(
                "the egress device {name} has no transmit checksum offload, so the kernel \
                 checksums in software: it copies every zero-copy datagram{}; turn the offload \
                 on with `ethtool -K {name} tx on` where the driver can",
                if self.datagram {
                    ""
                } else {
                    " (a stream's pages it reads in place)"
                }
            ));
        }
        if self.taps > 0 {
            out.push(format!(
                "{} packet socket{} capture{} every frame sent on {name} (tcpdump, a DHCP or \
                 LLDP daemon: see /proc/net/packet); the kernel copies each zero-copy send it \
                 hands to a capture and reports it copied: stop the capture, or filter it to \
                 another device",
                self.taps,
                if self.taps == 1 { "" } else { "s" },
                if self.taps == 1 { "s" } else { "" },
            ));
        }
        out.extend(self.timestamp_line());
        out
    }

    fn timestamp_line(&self) -> Option<String> {
        self.tx_timestamps.map(|flags| {
            format!(
                "TX timestamps are on for this socket (SO_TIMESTAMPING {flags:#x}) without \
                 SOF_TIMESTAMPING_OPT_TSONLY: the kernel queues a copy of each timestamped \
                 packet's data on the error queue and reports the zero-copy send copied; add \
                 SOF_TIMESTAMPING_OPT_TSONLY to the flags"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(d: Delivery) -> PathFacts {
        PathFacts {
            device: Some(("eth0".into(), d)),
            sg: Some(true),
            tx_csum: Some(true),
            ..PathFacts::default()
        }
    }

    #[test]
    fn a_plain_device_with_offloads_names_nothing() {
        let f = dev(Delivery::Device);
        assert!(f.lines(false).is_empty());
        assert!(!f.copies_all());
        assert!(PathFacts::default().lines(false).is_empty());
    }

    #[test]
    fn each_copier_gets_its_sentence_and_its_fix() {
        let f = PathFacts {
            sg: Some(false),
            tx_csum: Some(false),
            taps: 2,
            tx_timestamps: Some(0x2),
            ..dev(Delivery::Device)
        };
        assert!(f.copies_all());
        let no_csum = |datagram| PathFacts {
            tx_csum: Some(false),
            datagram,
            ..dev(Delivery::Device)
        };
        assert!(no_csum(true).copies_all());
        assert!(!no_csum(false).copies_all());
        assert_eq!(no_csum(false).lines(false).len(), 1);
        let text = f.lines(false).join("\n");
        for want in [
            "ethtool -K eth0 sg on",
            "ethtool -K eth0 tx on",
            "2 packet sockets capture every frame sent on eth0",
            "SO_TIMESTAMPING 0x2",
            "add SOF_TIMESTAMPING_OPT_TSONLY",
        ] {
            assert!(text.contains(want), "{want:?} missing from {text}");
        }
    }

    #[test]
    fn local_delivery_is_named_once_and_only_loopback_is_certain() {
        let lo = dev(Delivery::Loopback);
        assert!(lo.copies_all());
        assert!(lo.lines(false)[0].contains("loopback device (eth0)"));
        assert!(lo.lines(true).is_empty());
        for d in [Delivery::Veth, Delivery::Bridge, Delivery::Tun] {
            let f = dev(d);
            assert!(!f.copies_all());
            assert_eq!(f.lines(false).len(), 1);
        }
        let unconnected = PathFacts {
            tx_timestamps: Some(0x102),
            ..PathFacts::default()
        };
        assert_eq!(unconnected.lines(false).len(), 1);
    }
}
