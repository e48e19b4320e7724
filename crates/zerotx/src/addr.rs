//! Where a datagram goes: an IP socket address or a vsock address, without a socket library's
//! types in the API.

use std::fmt;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};

use socket2::SockAddr;

/// An `AF_VSOCK` address: a context id (`VMADDR_CID_HOST` is 2, a guest's is its own) and a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VsockAddr {
    /// The context id.
    pub cid: u32,
    /// The port.
    pub port: u32,
}

impl VsockAddr {
    /// The address `cid:port`.
    pub const fn new(cid: u32, port: u32) -> Self {
        Self { cid, port }
    }
}

impl fmt::Display for VsockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vsock:{}:{}", self.cid, self.port)
    }
}

/// Where [`Sender::send_to`](crate::Sender::send_to) sends a datagram. Made from a
/// [`SocketAddr`] or a [`VsockAddr`] by `into()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Destination {
    /// An IPv4 or IPv6 address and port.
    Inet(SocketAddr),
    /// A vsock address.
    Vsock(VsockAddr),
}

impl From<SocketAddr> for Destination {
    fn from(a: SocketAddr) -> Self {
        Destination::Inet(a)
    }
}

impl From<SocketAddrV4> for Destination {
    fn from(a: SocketAddrV4) -> Self {
        Destination::Inet(a.into())
    }
}

impl From<SocketAddrV6> for Destination {
    fn from(a: SocketAddrV6) -> Self {
        Destination::Inet(a.into())
    }
}

impl From<VsockAddr> for Destination {
    fn from(a: VsockAddr) -> Self {
        Destination::Vsock(a)
    }
}

impl From<VsockAddr> for SockAddr {
    fn from(a: VsockAddr) -> Self {
        SockAddr::vsock(a.cid, a.port)
    }
}

impl From<Destination> for SockAddr {
    fn from(d: Destination) -> Self {
        match d {
            Destination::Inet(a) => a.into(),
            Destination::Vsock(a) => a.into(),
        }
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Inet(a) => a.fmt(f),
            Destination::Vsock(a) => a.fmt(f),
        }
    }
}
