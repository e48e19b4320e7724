//! What lies between a socket and the wire, asked of the kernel: the route's egress device
//! (`RTM_GETROUTE` over rtnetlink, as `ip route get` asks), that device's offloads and driver
//! (`SIOCETHTOOL`), its flags (`SIOCGIFFLAGS`), the packet sockets that tap it
//! (`/proc/thread-self/net/packet`) and the socket's TX timestamp flags (`SO_TIMESTAMPING`).
//! None of it runs on a send: [`Sender::explain`](crate::Sender::explain) asks.

use std::io;
use std::mem;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::{getsockopt_int, socket};

/// `struct rtmsg` (linux/rtnetlink.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct RtMsg {
    family: u8,
    dst_len: u8,
    src_len: u8,
    tos: u8,
    table: u8,
    protocol: u8,
    scope: u8,
    kind: u8,
    flags: u32,
}

/// One `RTM_GETROUTE` request for a single destination address.
#[repr(C)]
struct RouteQuery {
    header: libc::nlmsghdr,
    rt: RtMsg,
    attr: libc::rtattr,
    addr: [u8; 16],
}

/// `NLMSG_ALIGN`.
fn nl_align(n: usize) -> usize {
    (n + 3) & !3
}

/// The interface index the kernel routes `dst` through from the calling thread's network
/// namespace (`RTM_GETROUTE`, `RTA_OIF` of the answer).
pub(crate) fn route_oif(dst: IpAddr) -> io::Result<u32> {
    let (family, bits, octets) = match dst {
        IpAddr::V4(a) => {
            let mut o = [0u8; 16];
            o[..4].copy_from_slice(&a.octets());
            (libc::AF_INET, 32u8, (o, 4usize))
        }
        IpAddr::V6(a) => (libc::AF_INET6, 128u8, (a.octets(), 16usize)),
    };
    let (addr, addr_len) = octets;
    let attr_len = mem::size_of::<libc::rtattr>() + addr_len;
    let len = mem::size_of::<libc::nlmsghdr>() + mem::size_of::<RtMsg>() + nl_align(attr_len);
    let query = RouteQuery {
        header: libc::nlmsghdr {
            nlmsg_len: len as u32,
            nlmsg_type: libc::RTM_GETROUTE,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        rt: RtMsg {
            family: family as u8,
            dst_len: bits,
            src_len: 0,
            tos: 0,
            table: 0,
            protocol: 0,
            scope: 0,
            kind: 0,
            flags: 0,
        },
        attr: libc::rtattr {
            rta_len: attr_len as u16,
            rta_type: libc::RTA_DST,
        },
        addr,
    };
    let nl = socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE)?;
    // SAFETY: `query` is a live, initialised value of at least `len` bytes (`len` counts its
    // header, rtmsg, attribute header and at most 16 address bytes); the kernel only reads it.
    let sent = unsafe { libc::send(nl.as_raw_fd(), (&query as *const RouteQuery).cast(), len, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut reply = [0u8; 4096];
    let n = super::retry(|| {
        // SAFETY: `reply` is a live buffer of the length given; the kernel writes at most that.
        let n = unsafe { libc::recv(nl.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    })?;
    oif_of(&reply[..n])
}

/// The `RTA_OIF` of an rtnetlink answer to [`route_oif`]'s query; the kernel's error if it
/// answered one (`ENETUNREACH`: no route). Pure: every length is checked.
fn oif_of(reply: &[u8]) -> io::Result<u32> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed rtnetlink answer");
    let u16_at = |b: &[u8], at: usize| -> Option<u16> {
        Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let hdr = mem::size_of::<libc::nlmsghdr>();
    let len = u32_at(reply, 0).ok_or_else(bad)? as usize;
    let kind = u16_at(reply, 4).ok_or_else(bad)?;
    let msg = reply.get(..len).filter(|_| len >= hdr).ok_or_else(bad)?;
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = u32_at(msg, hdr).ok_or_else(bad)? as i32;
        return Err(io::Error::from_raw_os_error(-errno));
    }
    if kind != libc::RTM_NEWROUTE {
        return Err(bad());
    }
    let mut at = hdr + mem::size_of::<RtMsg>();
    while at + 4 <= msg.len() {
        let alen = u16_at(msg, at).ok_or_else(bad)? as usize;
        let atype = u16_at(msg, at + 2).ok_or_else(bad)?;
        if alen < 4 || at + alen > msg.len() {
            return Err(bad());
        }
        if atype == libc::RTA_OIF {
            return u32_at(msg, at + 4).ok_or_else(bad);
        }
        at += nl_align(alen);
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "the route names no egress device",
    ))
}

/// `if_indextoname(3)`: the device's name in the calling thread's network namespace.
pub(crate) fn if_name(ifindex: u32) -> io::Result<String> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname writes at most.
    let p = unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    let bytes: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A `struct ifreq` naming `dev`, with `data` in its union (a pointer, or flags).
fn ifreq(dev: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is a plain C struct for which all-zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    if dev.len() >= libc::IF_NAMESIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "device name too long",
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(dev.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

/// `ETHTOOL_GTXCSUM`: any transmit checksum offload.
const ETHTOOL_GTXCSUM: u32 = 0x16;
/// `ETHTOOL_GSG`: scatter-gather.
const ETHTOOL_GSG: u32 = 0x18;
/// `ETHTOOL_GDRVINFO`: the driver's name.
const ETHTOOL_GDRVINFO: u32 = 0x03;
/// `sizeof(struct ethtool_drvinfo)`: cmd, five 32-byte strings, 12 reserved bytes, five u32s.
const DRVINFO_LEN: usize = 4 + 5 * 32 + 12 + 5 * 4;

/// `ioctl(SIOCETHTOOL)` with `data` as the command's struct, whose first u32 is the command.
fn ethtool(dev: &str, data: &mut [u8]) -> io::Result<()> {
    let s = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(dev)?;
    req.ifr_ifru.ifru_data = data.as_mut_ptr().cast();
    syscall!(ioctl(
        s.as_raw_fd(),
        libc::SIOCETHTOOL as _,
        &mut req as *mut libc::ifreq
    ))?;
    Ok(())
}

/// One `struct ethtool_value` query: whether the feature is on for `dev` now.
fn ethtool_value(dev: &str, cmd: u32) -> io::Result<bool> {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&cmd.to_ne_bytes());
    ethtool(dev, &mut v)?;
    Ok(u32::from_ne_bytes(v[4..8].try_into().expect("4 bytes")) != 0)
}

/// What the kernel says of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Device {
    /// Its name.
    pub(crate) name: String,
    /// `IFF_LOOPBACK`.
    pub(crate) loopback: bool,
    /// Scatter-gather is on (`None`: the driver does not say).
    pub(crate) sg: Option<bool>,
    /// Some transmit checksum offload is on (`None`: the driver does not say).
    pub(crate) tx_csum: Option<bool>,
    /// The driver's name (`veth`, `bridge`, `tun`, `virtio_net`...), if it says.
    pub(crate) driver: Option<String>,
}

/// The device `ifindex`: its flags (`SIOCGIFFLAGS`), offloads and driver (`SIOCETHTOOL`).
pub(crate) fn device(ifindex: u32) -> io::Result<Device> {
    let name = if_name(ifindex)?;
    let s = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(&name)?;
    syscall!(ioctl(
        s.as_raw_fd(),
        libc::SIOCGIFFLAGS as _,
        &mut req as *mut libc::ifreq
    ))?;
    // SAFETY: SIOCGIFFLAGS succeeded and filled the union's flags member.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let mut info = [0u8; DRVINFO_LEN];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    let driver = ethtool(&name, &mut info).ok().map(|()| {
        let d = &info[4..36];
        let end = d.iter().position(|&c| c == 0).unwrap_or(d.len());
        String::from_utf8_lossy(&d[..end]).into_owned()
    });
    Ok(Device {
        loopback: flags as i32 & libc::IFF_LOOPBACK != 0,
        sg: ethtool_value(&name, ETHTOOL_GSG).ok(),
        tx_csum: ethtool_value(&name, ETHTOOL_GTXCSUM).ok(),
        driver,
        name,
    })
}

/// `ETH_P_ALL`, as `/proc/net/packet` prints a socket's protocol (host order, hex).
const ETH_P_ALL: u32 = 0x0003;

/// The packet sockets of the calling thread's network namespace that see every frame sent on
/// `ifindex` (the kernel's transmit taps: running, `ETH_P_ALL`, bound to it or to every device),
/// from `/proc/thread-self/net/packet` (the thread's namespace, not the process's).
pub(crate) fn packet_taps(ifindex: u32) -> io::Result<usize> {
    let text = std::fs::read_to_string("/proc/thread-self/net/packet")?;
    Ok(taps_in(&text, ifindex))
}

/// [`packet_taps`] over the file's text: the columns are `sk RefCnt Type Proto Iface R Rmem User
/// Inode`, the protocol in hex, `R` 1 while the socket is hooked into the device.
fn taps_in(text: &str, ifindex: u32) -> usize {
    text.lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let proto = cols.get(3).and_then(|p| u32::from_str_radix(p, 16).ok());
            let iface = cols.get(4).and_then(|i| i.parse::<u32>().ok());
            let running = cols.get(5) == Some(&"1");
            running
                && proto == Some(ETH_P_ALL)
                && matches!(iface, Some(i) if i == ifindex || i == 0)
        })
        .count()
}

/// `SOF_TIMESTAMPING_TX_HARDWARE | _TX_SOFTWARE | _TX_SCHED | _TX_ACK`: the flags that make
/// the kernel report a sent packet on the error queue.
pub(crate) const TX_TIMESTAMPS: u32 = (1 << 0) | (1 << 1) | (1 << 8) | (1 << 9);
/// `SOF_TIMESTAMPING_OPT_TSONLY`: report the timestamp without the packet.
pub(crate) const OPT_TSONLY: u32 = 1 << 11;

/// `getsockopt(SO_TIMESTAMPING)`: the socket's timestamping flags (the first field of what the
/// kernel answers).
pub(crate) fn timestamping(fd: BorrowedFd<'_>) -> io::Result<u32> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPING).map(|v| v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_taps_are_running_eth_p_all_sockets_on_the_device_or_every_device() {
        let text = "sk       RefCnt Type Proto  Iface R Rmem   User   Inode\n\
                    0000000000000001 3      3    0003   2     1 0      0      100\n\
                    0000000000000002 3      3    0003   0     1 0      0      101\n\
                    0000000000000003 3      3    0003   3     1 0      0      102\n\
                    0000000000000004 3      3    0800   2     1 0      0      103\n\
                    0000000000000005 3      3    0003   2     0 0      0      104\n";
        assert_eq!(taps_in(text, 2), 2);
        assert_eq!(taps_in(text, 3), 2);
        assert_eq!(taps_in(text, 4), 1);
        assert_eq!(taps_in("", 2), 0);
        assert_eq!(taps_in("header\ngarbage\n", 2), 0);
    }

    #[test]
    fn a_route_answer_gives_its_oif_and_an_error_answer_its_errno() {
        let hdr = mem::size_of::<libc::nlmsghdr>();
        let rt = mem::size_of::<RtMsg>();
        let mut m = vec![0u8; hdr + rt];
        // RTA_TABLE (4 bytes), then RTA_OIF = 7.
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&15u16.to_ne_bytes());
        m.extend_from_slice(&254u32.to_ne_bytes());
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&libc::RTA_OIF.to_ne_bytes());
        m.extend_from_slice(&7u32.to_ne_bytes());
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m[4..6].copy_from_slice(&libc::RTM_NEWROUTE.to_ne_bytes());
        assert_eq!(oif_of(&m).unwrap(), 7);
        // Cut short: refused, not read past.
        assert!(oif_of(&m[..m.len() - 2]).is_err());
        let mut e = vec![0u8; hdr + 4];
        e[..4].copy_from_slice(&((hdr + 4) as u32).to_ne_bytes());
        e[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        e[hdr..].copy_from_slice(&(-libc::ENETUNREACH).to_ne_bytes());
        assert_eq!(
            oif_of(&e).unwrap_err().raw_os_error(),
            Some(libc::ENETUNREACH)
        );
        assert!(oif_of(&[]).is_err());
    }

    #[test]
    fn loopback_routes_through_the_loopback_device() {
        let oif = route_oif("127.0.0.1".parse().unwrap()).unwrap();
        let dev = device(oif).unwrap();
        assert!(dev.loopback, "{dev:?}");
    }
}
