//! The silent copiers on a socket's way out, looked up when
//! [`Sender::explain`](crate::Sender::explain) asks, never on a send: the egress device the
//! kernel routes the peer through, its offloads and driver, the packet sockets that capture on it,
//! and the socket's TX timestamps (docs/kernel.md, "What copies behind the caller's back").

use std::net::IpAddr;

use crate::report::{Delivery, PathFacts};
use crate::socket::{Family, SockType, Socket};
use crate::sys::egress as sys;

/// What the kernel says of `sock`'s way out. A query that fails leaves its fact unknown.
pub(crate) fn inspect(sock: &Socket) -> PathFacts {
    let mut facts = PathFacts {
        datagram: sock.kind.ty == SockType::Dgram,
        ..PathFacts::default()
    };
    if !matches!(sock.kind.family, Family::Inet4 | Family::Inet6) {
        return facts;
    }
    if let Ok(flags) = sys::timestamping(sock.fd()) {
        if flags & sys::TX_TIMESTAMPS != 0 && flags & sys::OPT_TSONLY == 0 {
            facts.tx_timestamps = Some(flags);
        }
    }
    let Some(peer) = peer_ip(sock) else {
        return facts;
    };
    let Ok(oif) = sys::route_oif(peer) else {
        return facts;
    };
    let Ok(dev) = sys::device(oif) else {
        return facts;
    };
    let delivery = if dev.loopback {
        Delivery::Loopback
    } else {
        match dev.driver.as_deref() {
            Some("veth") => Delivery::Veth,
            Some("bridge") => Delivery::Bridge,
            Some("tun") => Delivery::Tun,
            _ => Delivery::Device,
        }
    };
    facts.sg = dev.sg;
    facts.tx_csum = dev.tx_csum;
    facts.taps = sys::packet_taps(oif).unwrap_or(0);
    facts.device = Some((dev.name, delivery));
    facts
}

/// The connected peer's address (an IPv4-mapped IPv6 address as IPv4); `None` unconnected.
fn peer_ip(sock: &Socket) -> Option<IpAddr> {
    let fd = sock.fd();
    let addr = socket2::SockRef::from(&fd).peer_addr().ok()?.as_socket()?;
    Some(match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    })
}
