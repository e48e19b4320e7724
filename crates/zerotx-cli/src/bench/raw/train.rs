//! `raw-train-copy` and `raw-train-msg-zc`: UDP GSO trains, the baselines of datagram trains.
//! One call sends one buffer of `datagrams` datagrams of `size` bytes each: with `UDP_SEGMENT`
//! the kernel builds one skb for the whole train (one pinning and one completion id with
//! `MSG_ZEROCOPY`), and the device, or the kernel in software, cuts it into datagrams
//! (docs/kernel.md, "UDP GSO trains: the kernel's limits, measured").
//!
//! They are `raw-copy` and `raw-msg-zc` over a socket whose `UDP_SEGMENT` option is set once:
//! the same ring, the same release rule (a zero-copy train's buffer is reused only after its one
//! id completed), the same inline `send`. A sender whose datagram size changes from call to call
//! would pass the segment size as a `UDP_SEGMENT` control message on each `sendmsg` instead; the
//! socket option is the least work per call, which is what a baseline should do.

use anyhow::{bail, Context};
use zerotx::BufPool;

use super::{set_sockopt, sock_type, sockopt, RawCopy, RawMsgZc};

/// Checks that `fd` is a UDP socket and sets its `UDP_SEGMENT` to `size`.
fn segmented(fd: &std::os::fd::OwnedFd, size: usize) -> anyhow::Result<()> {
    let domain = sockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).context("SO_DOMAIN")?;
    if sock_type(fd)? != libc::SOCK_DGRAM || (domain != libc::AF_INET && domain != libc::AF_INET6) {
        bail!("a train is UDP generic segmentation offload: it needs a UDP socket");
    }
    let segment = libc::c_int::try_from(size)
        .ok()
        .filter(|&s| s > 0 && s <= libc::c_int::from(u16::MAX))
        .with_context(|| format!("a {size} B datagram does not fit UDP_SEGMENT (1 to 65535)"))?;
    set_sockopt(fd, libc::SOL_UDP, libc::UDP_SEGMENT, segment)
        .context("setsockopt(UDP_SEGMENT): the kernel has no UDP GSO (Linux 4.18+)")
}

/// A `send(2)` loop of GSO trains of `datagrams` x `size` bytes from `pool` over the UDP `fd`.
pub fn train_copy(
    fd: std::os::fd::OwnedFd,
    pool: &BufPool,
    size: usize,
    datagrams: usize,
) -> anyhow::Result<RawCopy> {
    segmented(&fd, size)?;
    RawCopy::new(fd, pool, size * datagrams)
}

/// A `send(MSG_ZEROCOPY)` loop of GSO trains of `datagrams` x `size` bytes from `pool` over the
/// UDP `fd`.
pub fn train_msg_zc(
    fd: std::os::fd::OwnedFd,
    pool: &BufPool,
    size: usize,
    datagrams: usize,
) -> anyhow::Result<RawMsgZc> {
    segmented(&fd, size)?;
    RawMsgZc::new(fd, pool, size * datagrams)
}
