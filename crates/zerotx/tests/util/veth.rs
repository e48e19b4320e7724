//! A receiver across a veth pair in namespaces the tests create, and the UDP sockets around it
//! (UDP and UDP-Lite), shared by the datagram-train tests.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use super::require;

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

/// A tbf qdisc on the sender's side `zc0` (an [`over_veth`] `prep`): `rate`, `burst`, and a queue
/// of `limit`; what does not fit the queue is dropped. `false`: `tc` failed (the test skips).
pub fn tbf(rate: &str, burst: &str, limit: &str) -> bool {
    let args = ["qdisc", "add", "dev", "zc0", "root", "tbf"];
    let args = [&args[..], &["rate", rate, "burst", burst, "limit", limit]].concat();
    super::run_tool("tc", &args, None)
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
