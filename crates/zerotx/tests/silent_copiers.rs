//! The silent copiers, each made for real in the test's own network namespaces: the kernel
//! copies zero-copy sends (or reports them copied) without saying why, and
//! `Sender::explain` names the cause in a sentence with its fix. Each case first shows the
//! kernel's answer (the completions' COPIED flag), then the sentence.

mod util;

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use zerotx::{EngineKind, Explanation, Sender, Stats};

use util::require;

/// Sends 32 datagrams (or stream buffers) of 16 KiB through a `msg-zc` sender on `sock`, each
/// waited for before the next (the kernel merges queued completions under the first one's
/// COPIED flag: docs/kernel.md, "MSG_ZEROCOPY"); returns the counters and what `explain` said.
fn send_some(sock: impl Into<std::os::fd::OwnedFd>) -> (Stats, Explanation) {
    let mut tx: Sender<Vec<u8>> = Sender::new(sock, EngineKind::MsgZerocopy).unwrap();
    let mut out = Vec::new();
    for i in 0..32u8 {
        tx.send(vec![i; 16 << 10]).unwrap();
        tx.flush(Duration::from_secs(10)).unwrap();
        tx.reap(&mut out).unwrap();
    }
    tx.flush(Duration::from_secs(10)).unwrap();
    tx.reap(&mut out).unwrap();
    let said = tx.explain();
    let stats = tx.stats();
    let closed = tx.close(Duration::from_secs(5));
    assert_eq!(closed.kept, 0);
    (stats, said)
}

/// Raises the black hole's peer and drops everything at its ingress (docs/kernel.md, "This
/// machine"): the device transmits (taps and TX timestamps run) and nothing is delivered, so a
/// zero-copy send completes NOT copied unless something on the way copies it. Returns once the
/// kernel has zc0 operationally up: until its link watch runs (later on a loaded machine) the
/// device keeps the noop qdisc, which drops before any tap or timestamp.
fn with_carrier() -> bool {
    let ready = util::run_tool("ip", &["link", "set", "zc1", "up"], None)
        && util::run_tool(
            "nft",
            &["-f", "-"],
            Some(
                "table netdev bh { chain in { type filter hook ingress device zc1 priority 0; \
                 policy drop; }; }",
            ),
        );
    if !ready {
        return false;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("ip")
            .args(["-o", "link", "show", "zc0"])
            .output()
            .expect("ip link show");
        if String::from_utf8_lossy(&out.stdout).contains("state UP") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "zc0 not operationally up 10 s after its peer: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn udp_to(dest: SocketAddr) -> UdpSocket {
    util::connected_udp(dest)
}

fn assert_true_zero_copy(s: &Stats, e: &Explanation, what: &str) {
    assert!(
        s.zerocopy > 0 && s.kernel_copied == 0,
        "{what}: the control should complete NOT copied: {s:?}"
    );
    assert!(e.zerocopy, "{what}: {e}");
}

fn assert_copied(s: &Stats, what: &str) {
    assert!(
        s.kernel_copied > 0 && s.zerocopy == 0,
        "{what}: the kernel should report every send copied: {s:?}"
    );
}

fn says(e: &Explanation, want: &str) {
    assert!(e.to_string().contains(want), "{want:?} missing from:\n{e}");
    assert!(!e.zerocopy, "{e}");
}

#[test]
fn an_egress_device_without_scatter_gather_is_named_with_its_fix() {
    util::in_black_hole(65535, |bh| {
        let (s, e) = send_some(udp_to(bh.v4));
        assert_true_zero_copy(&s, &e, "scatter-gather on");
        assert!(!e.to_string().contains("scatter-gather off"), "{e}");
        if !util::run_tool("ethtool", &["-K", "zc0", "sg", "off"], None) {
            return;
        }
        let (s, e) = send_some(udp_to(bh.v4));
        assert_copied(&s, "scatter-gather off");
        says(&e, "the egress device zc0 has scatter-gather off");
        says(&e, "ethtool -K zc0 sg on");
    });
}

#[test]
fn an_egress_device_without_checksum_offload_is_named_with_its_fix() {
    util::in_black_hole(65535, |bh| {
        if !util::run_tool("ethtool", &["-K", "zc0", "tx", "off"], None) {
            return;
        }
        let (s, e) = send_some(udp_to(bh.v4));
        assert_copied(&s, "tx checksum off");
        says(&e, "zc0 has no transmit checksum offload");
        says(&e, "ethtool -K zc0 tx on");
    });
}

/// A capture on `dev` alone: `socket(AF_PACKET, SOCK_RAW, 0)` (no hook yet), then `bind(2)` to
/// the device with `ETH_P_ALL`, as `tcpdump -i DEV` does. A capture on every device would also
/// tap other tests' devices (and, on kernels whose capture list is global, other namespaces').
#[allow(unsafe_code)]
fn capture_on(dev: &str) -> socket2::Socket {
    use std::os::fd::AsRawFd;
    let sock = socket2::Socket::new(socket2::Domain::PACKET, socket2::Type::RAW, None)
        .expect("a packet socket (root)");
    let name = std::ffi::CString::new(dev).unwrap();
    // SAFETY: if_nametoindex reads the NUL-terminated name, which lives until the call returns.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(ifindex, 0, "no device {dev}");
    // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: bind reads `size_of::<sockaddr_ll>()` bytes of the live local `sll`.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "bind to {dev}: {}", std::io::Error::last_os_error());
    sock
}

#[test]
fn a_packet_socket_capturing_on_the_egress_device_is_named() {
    util::in_black_hole(65535, |bh| {
        if !with_carrier() {
            return;
        }
        let (s, e) = send_some(udp_to(bh.v4));
        assert_true_zero_copy(&s, &e, "no capture");
        let tap = capture_on(zerotx_testbed::DEVICE);
        let (s, e) = send_some(udp_to(bh.v4));
        assert_copied(&s, "with a capture");
        says(&e, "1 packet socket captures every frame sent on zc0");
        drop(tap);
        let (s, e) = send_some(udp_to(bh.v4));
        assert_true_zero_copy(&s, &e, "capture closed");
    });
}

/// `SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE`, and with `tsonly`
/// `SOF_TIMESTAMPING_OPT_TSONLY`.
fn timestamped(dest: SocketAddr, tsonly: bool) -> UdpSocket {
    let sock = udp_to(dest);
    let mut flags = libc::SOF_TIMESTAMPING_TX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
    if tsonly {
        flags |= libc::SOF_TIMESTAMPING_OPT_TSONLY;
    }
    util::set_int_opt(
        sock.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPING,
        flags as i32,
    );
    sock
}

#[test]
fn tx_timestamps_without_tsonly_are_named_with_their_fix() {
    util::in_black_hole(65535, |bh| {
        if !with_carrier() {
            return;
        }
        let (s, e) = send_some(timestamped(bh.v4, true));
        assert_true_zero_copy(&s, &e, "timestamps with OPT_TSONLY");
        assert!(!e.to_string().contains("SO_TIMESTAMPING"), "{e}");
        let (s, e) = send_some(timestamped(bh.v4, false));
        assert_copied(&s, "timestamps without OPT_TSONLY");
        says(&e, "TX timestamps are on for this socket");
        says(&e, "add SOF_TIMESTAMPING_OPT_TSONLY");
    });
}

/// This thread's id, for `ip link set DEV netns TID` (the kernel finds threads by id too).
fn thread_id() -> String {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

/// A peer on this machine in a second network namespace, behind a veth (`bridge`: the veth
/// enslaved to a bridge that holds the address, as a container bridge does): TCP to it reports
/// every zero-copy send copied, and `explain` names the device.
fn local_peer(bridge: bool) -> Option<(Stats, Explanation)> {
    require!(util::is_root(), else None; "needs root for network namespaces");
    zerotx_testbed::in_new_netns(|| {
        let ip = |args: &[&str]| assert!(util::run_tool("ip", args, None));
        ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
        let (tid_tx, tid_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let peer = std::thread::spawn(move || {
            zerotx_testbed::in_new_netns(move || {
                tid_tx.send(thread_id()).unwrap();
                // Wait until the device has moved here.
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while !std::fs::read_to_string("/proc/thread-self/net/dev")
                    .unwrap()
                    .contains("vb:")
                {
                    assert!(std::time::Instant::now() < deadline, "vb never arrived");
                    std::thread::sleep(Duration::from_millis(10));
                }
                let ip = |args: &[&str]| assert!(util::run_tool("ip", args, None));
                ip(&["addr", "add", "10.77.0.2/24", "dev", "vb"]);
                ip(&["link", "set", "vb", "up"]);
                let listener = TcpListener::bind("10.77.0.2:0").unwrap();
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                let (mut s, _) = listener.accept().unwrap();
                let mut sink = Vec::new();
                s.read_to_end(&mut sink).unwrap()
            })
            .unwrap()
        });
        ip(&["link", "set", "vb", "netns", &tid_rx.recv().unwrap()]);
        if bridge {
            ip(&["link", "add", "br0", "type", "bridge"]);
            ip(&["link", "set", "va", "master", "br0"]);
            ip(&["addr", "add", "10.77.0.1/24", "dev", "br0"]);
            ip(&["link", "set", "br0", "up"]);
        } else {
            ip(&["addr", "add", "10.77.0.1/24", "dev", "va"]);
        }
        ip(&["link", "set", "va", "up"]);
        let addr = ready_rx.recv().unwrap();
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
        let got = send_some(stream);
        assert_eq!(peer.join().unwrap(), 32 << 14, "the peer got every byte");
        got
    })
    .ok()
}

#[test]
fn a_peer_behind_a_veth_on_this_machine_is_named() {
    let Some((s, e)) = local_peer(false) else {
        return;
    };
    assert!(
        s.kernel_copied > 0 && s.zerocopy == 0,
        "delivery to a local socket copies: {s:?}"
    );
    assert!(
        e.to_string()
            .contains("the route leaves through va, a veth pair: if the peer is on this machine"),
        "{e}"
    );
}

#[test]
fn a_peer_on_a_container_bridge_is_named() {
    let Some((s, e)) = local_peer(true) else {
        return;
    };
    assert!(
        s.kernel_copied > 0 && s.zerocopy == 0,
        "delivery to a local socket copies: {s:?}"
    );
    assert!(
        e.to_string()
            .contains("the route leaves through br0, a bridge: a peer on this machine"),
        "{e}"
    );
}

#[test]
fn a_peer_on_loopback_is_named_for_every_zero_copy_engine() {
    for &kind in [EngineKind::MsgZerocopy, EngineKind::UringZc].iter() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).unwrap();
        let tx: Result<Sender<Vec<u8>>, _> = Sender::new(client, kind);
        let Ok(tx) = tx else {
            require!(kind != EngineKind::MsgZerocopy, "{kind} unavailable");
            continue;
        };
        let e = tx.explain();
        says(&e, "the route leaves through the loopback device (lo)");
        drop(listener);
    }
}
