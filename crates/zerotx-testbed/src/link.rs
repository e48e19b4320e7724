//! What both black holes do to their sending device: `ip` commands, the near addresses, and
//! static neighbour entries for the far ones, which nobody answers.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::process::Command;

/// Runs `ip ARGS` (iproute2) in the calling thread's network namespace.
pub(crate) fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("running `ip` (iproute2) failed: {e}; install iproute2"),
        )
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Gives `device` (up) 192.0.2.1/24 and 2001:db8::1/64, and static neighbour entries for
/// 192.0.2.2 and 2001:db8::2; returns those two as destinations (port 9).
pub(crate) fn addresses(device: &str) -> io::Result<(SocketAddr, SocketAddr)> {
    ip(&["addr", "add", "192.0.2.1/24", "dev", device])?;
    ip(&[
        "-6",
        "addr",
        "add",
        "2001:db8::1/64",
        "dev",
        device,
        "nodad",
    ])?;
    let mac = "02:00:00:00:00:02";
    ip(&["neigh", "add", "192.0.2.2", "lladdr", mac, "dev", device])?;
    ip(&[
        "-6",
        "neigh",
        "add",
        "2001:db8::2",
        "lladdr",
        mac,
        "dev",
        device,
    ])?;
    Ok((
        SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 2), 9).into(),
        SocketAddrV6::new(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2), 9, 0, 0).into(),
    ))
}
