//! The trains' side of the helpers (UDP GSO): trains of numbered datagrams, the receiver's
//! check of each, a veth pair across two namespaces with a receiver on the far side, and a
//! sender that overwrites each train the instant it comes back. Shared by tests/trains.rs and
//! tests/trains_uring.rs.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use zerotx::{SendPath, Sender, SenderConfig};

use super::require;

/// The datagram size of the trains below: a 1500-byte MTU less the IPv4 and UDP headers.
pub const SEG: usize = 1472;

/// The byte at `i` of datagram `d` of train `t`, past its 8-byte header.
pub fn pattern(t: u32, d: u32, i: usize) -> u8 {
    (t.wrapping_mul(31) ^ d.wrapping_mul(7)).wrapping_add(i as u32) as u8
}

/// Train `t`: `count` datagrams of `segment` bytes, the last `last` bytes; each starts with its
/// train and datagram numbers, then [`pattern`].
pub fn train(t: u32, segment: usize, count: usize, last: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(segment * (count - 1) + last);
    for d in 0..count as u32 {
        let len = if d as usize + 1 == count {
            last
        } else {
            segment
        };
        buf.extend_from_slice(&t.to_be_bytes());
        buf.extend_from_slice(&d.to_be_bytes());
        buf.extend((8..len).map(|i| pattern(t, d, i)));
    }
    buf
}

/// Checks one received datagram; returns its (train, datagram) numbers.
pub fn check_datagram(data: &[u8], segment: usize, count: usize, last: usize) -> (u32, u32) {
    assert!(data.len() >= 8, "a datagram of {} bytes", data.len());
    let t = u32::from_be_bytes(data[..4].try_into().unwrap());
    let d = u32::from_be_bytes(data[4..8].try_into().unwrap());
    assert!((d as usize) < count, "datagram number {d} of train {t}");
    let want = if d as usize + 1 == count {
        last
    } else {
        segment
    };
    assert_eq!(data.len(), want, "train {t} datagram {d}: its length");
    let bad = (8..data.len()).find(|&i| data[i] != pattern(t, d, i));
    assert_eq!(bad, None, "train {t} datagram {d}: a byte changed");
    (t, d)
}

/// Reads datagrams from `sock` until `timeout` passes without one.
pub fn receive_all(sock: &UdpSocket, timeout: Duration) -> Vec<Vec<u8>> {
    sock.set_read_timeout(Some(timeout)).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = sock.recv(&mut buf) {
        got.push(buf[..n].to_vec());
    }
    got
}

/// A UDP socket bound to `addr` with an 8 MiB receive buffer (forced past `rmem_max`, as root).
pub fn receiver(addr: &str) -> UdpSocket {
    receiver_of(addr, libc::IPPROTO_UDP).unwrap()
}

/// As [`receiver`], of `protocol` (UDP or UDP-Lite); `None` (skipped) where the kernel has no
/// such socket.
pub fn receiver_of(addr: &str, protocol: i32) -> Option<UdpSocket> {
    let addr: SocketAddr = addr.parse().unwrap();
    let sock = udp_of(protocol)?;
    sock.bind(&addr.into()).unwrap();
    let sock: UdpSocket = sock.into();
    super::set_int_opt(
        sock.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        8 << 20,
    );
    Some(sock)
}

/// An IPv4 datagram socket of `protocol` (UDP or UDP-Lite), or `None` (skipped) where the
/// kernel has none.
pub fn udp_of(protocol: i32) -> Option<socket2::Socket> {
    let proto = Some(socket2::Protocol::from(protocol));
    match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, proto) {
        Ok(s) => Some(s),
        Err(e) => {
            require(
                false,
                &format!("no datagram sockets of protocol {protocol}: {e}"),
            );
            None
        }
    }
}

/// The thread's kernel id, for `ip link set ... netns`.
pub fn tid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// A veth pair across two fresh namespaces: the sender's side `zc0` (192.0.2.1/24) and the
/// receiver's `zc1` (192.0.2.2/24), both at `mtu`. `recv` runs in the receiver's namespace with a
/// socket of `protocol` (UDP, UDP-Lite) bound to 192.0.2.2:9; `send` runs in the sender's once it is bound, after `prep`
/// set up the sender's namespace. `None`: skipped.
pub fn over_veth<R: Send>(
    mtu: u32,
    protocol: i32,
    prep: impl FnOnce() -> bool + Send,
    recv: impl FnOnce(UdpSocket) -> R + Send,
    send: impl FnOnce() + Send,
) -> Option<R> {
    require!(super::is_root(), else None; "needs root for network namespaces");
    let mtu = mtu.to_string();
    let ip = |args: &[&str]| super::run_tool("ip", args, None);
    zerotx_testbed::in_new_netns(|| {
        let ok = ip(&["link", "add", "zc0", "type", "veth", "peer", "name", "zc1"])
            && ip(&["addr", "add", "192.0.2.1/24", "dev", "zc0"])
            && ip(&["link", "set", "zc0", "mtu", &mtu, "up"])
            && prep();
        if !ok {
            return None;
        }
        let (tid_tx, tid_rx) = mpsc::channel();
        let (moved_tx, moved_rx) = mpsc::channel();
        let (bound_tx, bound_rx) = mpsc::channel();
        let (through_tx, through_rx) = mpsc::channel();
        std::thread::scope(|s| {
            let far = s.spawn(|| {
                zerotx_testbed::in_new_netns(move || {
                    tid_tx.send(tid()).unwrap();
                    moved_rx.recv().unwrap();
                    assert!(ip(&["addr", "add", "192.0.2.2/24", "dev", "zc1"]));
                    assert!(ip(&["link", "set", "zc1", "mtu", &mtu, "up"]));
                    let sock = receiver_of("192.0.2.2:9", protocol).unwrap();
                    // The path carries datagrams once one probe came through: until the carrier
                    // is up, the sending device's queue drops everything without an error.
                    let probes = UdpSocket::bind("192.0.2.2:8").unwrap();
                    bound_tx.send(()).unwrap();
                    probes
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    probes
                        .recv(&mut [0u8; 8])
                        .expect("a probe through the veth");
                    through_tx.send(()).unwrap();
                    recv(sock)
                })
                .expect("the receiver's namespace")
            });
            let far_tid = tid_rx.recv().unwrap().to_string();
            assert!(ip(&["link", "set", "zc1", "netns", &far_tid]));
            moved_tx.send(()).unwrap();
            bound_rx.recv().unwrap();
            let probe = UdpSocket::bind("192.0.2.1:0").unwrap();
            while through_rx.try_recv().is_err() {
                let _ = probe.send_to(b"probe", "192.0.2.2:8");
                std::thread::sleep(Duration::from_millis(10));
            }
            send();
            Some(far.join().unwrap())
        })
    })
    .unwrap_or_else(|e| {
        require(false, &format!("network namespace unavailable: {e}"));
        None
    })
}

/// Sends trains `0..n` (each `count` datagrams of [`SEG`] bytes, the last `last`) through a
/// sender made by `cfg` on `sock`, overwriting every buffer the instant it comes back; returns
/// the reports' paths and the final counters.
pub fn send_trains(
    sock: UdpSocket,
    cfg: SenderConfig,
    n: u32,
    count: usize,
    last: usize,
) -> (Vec<SendPath>, zerotx::Stats) {
    let mut tx = Sender::with_config(sock, cfg).unwrap();
    let mut out = Vec::new();
    let mut paths = Vec::new();
    let mut take = |out: &mut Vec<zerotx::Released<Vec<u8>>>| {
        for mut r in out.drain(..) {
            r.buf.fill(0xEE);
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            paths.push(r.report.path);
        }
    };
    for t in 0..n {
        tx.send_train(train(t, SEG, count, last), SEG as u16)
            .unwrap();
        tx.reap(&mut out).unwrap();
        take(&mut out);
    }
    let (mut rest, stats) = super::finish(tx);
    take(&mut rest);
    (paths, stats)
}
