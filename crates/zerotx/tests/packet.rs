//! `AF_PACKET` senders on a real veth pair inside a namespace of the test's own: a packet socket
//! bound to an interface sends there without a name (the kernel takes the bound device and
//! protocol), so a sender over one sends, and the frames arrive at a packet socket on the peer.
//! Sockets zerotx cannot send on are refused at `Sender::new`, saying what to do.

mod util;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use zerotx::{EngineKind, Error, Sender};

/// A local experimental EtherType (IEEE 802 "Local Experimental Ethertype 1").
const ETHERTYPE: u16 = 0x88b5;

/// An `AF_PACKET` socket of type `ty` for [`ETHERTYPE`], bound to `ifname` if given.
fn packet_socket(ty: i32, ifname: Option<&str>) -> OwnedFd {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_PACKET, ty, i32::from(ETHERTYPE.to_be())) };
    assert!(
        fd >= 0,
        "socket(AF_PACKET): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(name) = ifname {
        let cname = std::ffi::CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        assert!(ifindex > 0, "no interface {name}");
        // SAFETY: sockaddr_ll is a plain C struct for which all-zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETHERTYPE.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: bind reads `size_of::<sockaddr_ll>()` bytes of a live local.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "bind to {name}: {}", std::io::Error::last_os_error());
    }
    fd
}

/// Frame `seq`: broadcast destination, a made-up source, [`ETHERTYPE`], then the number and the
/// stream pattern from an offset it picks.
fn frame(seq: u64) -> Vec<u8> {
    let mut f = vec![0u8; 200];
    util::fill(&mut f, seq << 16);
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    f[14..22].copy_from_slice(&seq.to_le_bytes());
    f
}

/// Reads frames of [`ETHERTYPE`] from `rx` until `n` arrived or 2 s passed; returns them.
fn receive(rx: &OwnedFd, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 2048];
    let end = Instant::now() + Duration::from_secs(2);
    while got.len() < n && Instant::now() < end {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which outlives the call.
        let r = unsafe {
            libc::recv(
                rx.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            let f = &buf[..r as usize];
            if f.len() >= 14 && f[12..14] == ETHERTYPE.to_be_bytes() {
                got.push(f.to_vec());
            }
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// Issue 34 item 6: `Sender::new` took a bound packet socket, then every send answered "not
/// connected" (`getpeername` fails on packet sockets). A packet socket bound to an interface
/// sends there without a name: each engine's frames arrive whole at the peer.
#[test]
fn a_bound_packet_socket_sends_on_every_engine_that_copies() {
    util::in_black_hole(1500, |_bh| {
        if !util::run_tool("ip", &["link", "set", "zc1", "up"], None) {
            return;
        }
        let rx = packet_socket(libc::SOCK_RAW, Some("zc1"));
        for &engine in &[
            EngineKind::Copy,
            EngineKind::Auto,
            EngineKind::Uring,
            EngineKind::UringZc,
            EngineKind::MsgZerocopy,
        ] {
            let fd = packet_socket(libc::SOCK_RAW, Some("zc0"));
            let mut tx = match Sender::<Vec<u8>>::new(fd, engine) {
                Ok(tx) => tx,
                Err(Error::Unsupported { .. })
                    if matches!(engine, EngineKind::MsgZerocopy | EngineKind::UringZc) =>
                {
                    // This kernel refuses SO_ZEROCOPY on packet sockets (docs/kernel.md,
                    // "MSG_ZEROCOPY (sendmsg + socket error queue)"); io_uring's zero-copy
                    // sends may be refused too.
                    continue;
                }
                Err(e) => panic!("{engine}: a bound packet socket was refused: {e}"),
            };
            let n = 20;
            for seq in 0..n {
                if let Err(e) = tx.send(frame(seq)) {
                    panic!("{engine}: frame {seq}: {e}");
                }
            }
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), n as usize, "{engine}: {stats:?}");
            for r in &released {
                assert!(r.report.error.is_none(), "{engine}: {:?}", r.report.error);
            }
            let got = receive(&rx, n as usize);
            let mut seen: Vec<u64> = got
                .iter()
                .map(|f| {
                    let seq = u64::from_le_bytes(f[14..22].try_into().unwrap());
                    assert_eq!(f[..], frame(seq)[..], "{engine}: frame {seq} changed");
                    seq
                })
                .collect();
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{engine}: frames lost");
        }
    });
}

/// A packet socket zerotx cannot send on is refused when the sender is made, saying what to do:
/// one bound to no interface (a send without a name has no device), and a `SOCK_DGRAM` one on a
/// device with link-layer addresses (the kernel builds the header from a destination address
/// the sender does not take).
#[test]
fn packet_sockets_that_cannot_send_are_refused_at_new() {
    util::in_black_hole(1500, |_bh| {
        let unbound = packet_socket(libc::SOCK_RAW, None);
        match Sender::<Vec<u8>>::new(unbound, EngineKind::Copy) {
            Err(e @ Error::Config { .. }) => {
                assert!(e.to_string().contains("bind"), "{e}");
            }
            other => panic!("an unbound packet socket: {:?}", other.map(|_| ())),
        }
        let dgram = packet_socket(libc::SOCK_DGRAM, Some("zc0"));
        match Sender::<Vec<u8>>::new(dgram, EngineKind::Copy) {
            Err(e @ Error::Unsupported { .. }) => {
                assert!(e.to_string().contains("SOCK_RAW"), "{e}");
            }
            other => panic!(
                "a SOCK_DGRAM packet socket on Ethernet: {:?}",
                other.map(|_| ())
            ),
        }
    });
}

/// Packets (or drops) the interface `name` transmitted, from `/proc/thread-self/net/dev` (this
/// thread's namespace).
fn tx_count(name: &str) -> u64 {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    let line = dev
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} not in /proc/net/dev"));
    let fields: Vec<u64> = line
        .split(':')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    // Receive has 8 fields; transmit: bytes, packets, errs, drop, ...
    fields[9] + fields[11]
}

/// A `SOCK_DGRAM` packet socket on an interface without link-layer addresses (a tun device)
/// sends without a name as well: the kernel builds no link-layer header.
#[test]
fn a_dgram_packet_socket_on_an_interface_without_link_addresses_sends() {
    util::in_black_hole(1500, |_bh| {
        if !util::run_tool("ip", &["tuntap", "add", "zctun", "mode", "tun"], None)
            || !util::run_tool("ip", &["link", "set", "zctun", "up"], None)
        {
            return;
        }
        let before = tx_count("zctun");
        let fd = packet_socket(libc::SOCK_DGRAM, Some("zctun"));
        let mut tx = Sender::<Vec<u8>>::new(fd, EngineKind::Copy)
            .unwrap_or_else(|e| panic!("a SOCK_DGRAM packet socket on a tun device: {e}"));
        for seq in 0..5 {
            tx.send(frame(seq)[14..].to_vec())
                .unwrap_or_else(|e| panic!("packet {seq}: {e}"));
        }
        let (released, stats) = util::finish(tx);
        assert_eq!(released.len(), 5, "{stats:?}");
        assert!(released.iter().all(|r| r.report.error.is_none()));
        assert_eq!(
            tx_count("zctun") - before,
            5,
            "the tun device saw the packets"
        );
    });
}
