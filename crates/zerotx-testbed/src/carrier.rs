//! The black hole *with carrier* (docs/kernel.md, "This machine (what a test can rely on)"): a
//! veth whose peer is up in a second network namespace, where an nftables `netdev` ingress chain
//! drops every packet before any protocol handler. Unlike the peer-down
//! [`black_hole`](crate::black_hole), which drops at the sender's queue, the device's whole
//! transmit path runs
//! (the queue, GSO segmentation, the device's transmit), as on a NIC, and zero-copy completions
//! still come back NOT copied. With [`Segmentation::Software`] the sending device has UDP
//! segmentation offload off (`ethtool -K zc0 tx-udp-segmentation off`), so the kernel segments
//! UDP GSO trains in software, as for a NIC without that offload.
//!
//! Needs root, `ip` (iproute2), `nft` (nftables) and, for software segmentation, `ethtool`.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};

use crate::link::{self, ip};

/// The sending device's name, as the peer-down black hole's ([`DEVICE`](crate::DEVICE)).
const DEVICE: &str = "zc0";

/// The peer's device name, inside the peer's namespace.
const PEER: &str = "zc1";

/// How the sending device treats a UDP GSO train.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segmentation {
    /// The device takes the train whole (`tx-udp-segmentation on`, veth's default), as a NIC with
    /// UDP segmentation offload does.
    Offload,
    /// The kernel segments the train before the device (`tx-udp-segmentation off`).
    Software,
}

/// A black hole with carrier, valid inside the namespace that built it. The peer's namespace
/// lives as long as this value: dropping it removes the peer, and with it the veth pair.
#[derive(Debug)]
pub struct CarrierBlackHole {
    /// An IPv4 destination (192.0.2.2) the peer drops at its ingress.
    pub v4: SocketAddr,
    /// An IPv6 destination (2001:db8::2) the peer drops at its ingress.
    pub v6: SocketAddr,
    /// The device MTU (both ends).
    pub mtu: u32,
    /// How the sending device treats a UDP GSO train.
    pub segmentation: Segmentation,
    /// The peer's network namespace, held open.
    peer: OwnedFd,
}

impl CarrierBlackHole {
    /// UDP packets the peer dropped at its ingress so far: a train the device took whole counts
    /// once, a train segmented in software once per datagram.
    pub fn dropped(&self) -> io::Result<u64> {
        let listing = in_netns(&self.peer, || {
            let out = Command::new("nft")
                .args(["list", "chain", "netdev", "bh", "in"])
                .output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "`nft list chain netdev bh in` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        })?;
        let mut words = listing.split_whitespace();
        words
            .by_ref()
            .find(|w| *w == "packets")
            .and_then(|_| words.next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no packet counter in: {listing}")))
    }
}

/// Runs `program args` with `stdin`; its failure names the command and what it printed.
fn run(program: &str, package: &str, args: &[&str], stdin: &str) -> io::Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("running `{program}` failed: {e}; install {package}"),
            )
        })?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A new network namespace, held by a descriptor (the thread that made it is gone).
fn new_netns() -> io::Result<OwnedFd> {
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<OwnedFd> {
            // SAFETY: unshare takes no pointers; it moves only the calling thread.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Runs `f` on a thread inside the namespace `ns` (commands it spawns run there too).
fn in_netns<T: Send>(ns: &OwnedFd, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let fd = ns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: setns only reads the descriptor, which `ns` keeps open for the call.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == -1 {
                return Err(io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Builds the black hole with carrier in the calling thread's network namespace, which must be
/// one of ours (see [`in_new_netns`](crate::in_new_netns)): the sending device `zc0` there, its
/// peer up in a namespace of its own that drops everything at ingress. `mtu` is both ends'.
pub fn carrier_black_hole(mtu: u32, segmentation: Segmentation) -> io::Result<CarrierBlackHole> {
    let peer = new_netns()?;
    // `ip` opens the namespace by path: this process's descriptor, seen from the child.
    let peer_path = format!("/proc/{}/fd/{}", std::process::id(), peer.as_raw_fd());
    let mtu_s = mtu.to_string();
    ip(&[
        "link", "add", DEVICE, "mtu", &mtu_s, "type", "veth", "peer", "name", PEER, "mtu", &mtu_s,
        "netns", &peer_path,
    ])?;
    in_netns(&peer, || {
        // Dropped at the device's ingress, before any protocol handler: nothing is delivered
        // (a local delivery would copy), nothing answers (no ARP, no ICMP). UDP is counted
        // first (not the kernel's own IPv6 router solicitations and MLD reports).
        run(
            "nft",
            "nftables",
            &["-f", "-"],
            &format!(
                "table netdev bh {{\n  chain in {{\n    type filter hook ingress device {PEER} \
                 priority 0; policy drop;\n    meta l4proto udp counter\n  }}\n}}\n"
            ),
        )?;
        ip(&["link", "set", PEER, "up"])
    })?;
    if segmentation == Segmentation::Software {
        run(
            "ethtool",
            "ethtool",
            &["-K", DEVICE, "tx-udp-segmentation", "off"],
            "",
        )?;
    }
    ip(&["link", "set", DEVICE, "up"])?;
    let (v4, v6) = link::addresses(DEVICE)?;
    Ok(CarrierBlackHole {
        v4,
        v6,
        mtu,
        segmentation,
        peer,
    })
}
