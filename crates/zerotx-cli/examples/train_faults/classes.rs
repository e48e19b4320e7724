//! The fault classes, one function each: what the kernel does to a train on that path, and what
//! every buffer, report and datagram must show (docs/kernel.md, "UDP GSO trains").

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use zerotx::{CopyReason, SendError, SendPath, Sender, SenderConfig};

use super::datagrams::{
    assert_arrived_in_order, assert_each_train_in_order, checked, connected, receive_until_done,
    receiver, say_done, set_int, train, SEG,
};
use super::trains::{send_all, Tally, Trains};
use super::veth::{over_veth, tool, FAR};

/// The path a report should name for an engine that sent through a device (not locally).
pub(crate) fn assert_device_paths(name: &str, tally: &Tally) {
    for (t, (path, _)) in &tally.reports {
        let ok = match name {
            "copy" | "uring" => *path == SendPath::Copied(CopyReason::Engine),
            _ => true,
        };
        assert!(ok, "train {t}: {path:?} from {name}");
    }
}

/// (a) Trains to a receiver on a veth peer arrive whole and in order.
pub(crate) fn veth(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 16;
    const COUNT: usize = 44;
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || Ok(()),
        |sock| receive_until_done(&sock),
        || {
            let sock =
                connected(FAR.parse().expect("an address"), libc::IPPROTO_UDP).expect("a socket");
            send_all(cfg, sock, TRAINS, COUNT, 1000)
        },
    )
    .unwrap_or_else(|e| panic!("the veth: {e}"));
    assert_eq!(tally.reports.len(), TRAINS as usize, "trains back");
    assert!(tally.refused.is_empty(), "refused: {:?}", tally.refused);
    assert_eq!(tally.stats.trains, u64::from(TRAINS), "{:?}", tally.stats);
    assert_eq!(tally.stats.train_splits, 0, "{:?}", tally.stats);
    assert_device_paths(name, &tally);
    let order = checked(&got);
    assert_arrived_in_order(&order, &(0..TRAINS).collect::<Vec<_>>(), COUNT as u32);
    format!(
        "{TRAINS} trains x {COUNT} back once, {} datagrams checked in order, {} trains zero-copy",
        order.len(),
        tally.zero_copy()
    )
}

/// (b) An nftables output rule drops every 50th packet to the receiver's port (trains of 34 KB:
/// `auto` sends them zero-copy until it learns the route copies): trains 0, 50 and
/// 100 come back with `EPERM` and their buffer; every other train arrives, and every id
/// completes.
pub(crate) fn nft_drop(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 140;
    const COUNT: usize = 24;
    let rules = "table inet zxtrains {\n  chain out {\n    type filter hook output priority 0; \
                 policy accept;\n    udp dport 9 numgen inc mod 50 == 0 drop\n  }\n}\n";
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || tool("nft", &["-f", "-"], Some(rules)),
        |sock| receive_until_done(&sock),
        || {
            let sock =
                connected(FAR.parse().expect("an address"), libc::IPPROTO_UDP).expect("a socket");
            send_all(cfg, sock, TRAINS, COUNT, 700)
        },
    )
    .unwrap_or_else(|e| panic!("the veth with nftables: {e}"));
    let dropped: Vec<u32> = vec![0, 50, 100];
    assert_eq!(
        tally.refused.keys().copied().collect::<Vec<_>>(),
        dropped,
        "trains refused"
    );
    assert!(
        tally.refused.values().all(|&e| e == libc::EPERM),
        "errnos: {:?}",
        tally.refused
    );
    assert_eq!(tally.reports.len(), TRAINS as usize - dropped.len());
    if name == "msg-zc" {
        assert_eq!(
            tally.stats.zerocopy_ids,
            u64::from(TRAINS),
            "every train took an id, the dropped ones too: {:?}",
            tally.stats
        );
    }
    assert_device_paths(name, &tally);
    let sent: Vec<u32> = (0..TRAINS).filter(|t| !dropped.contains(t)).collect();
    let order = checked(&got);
    assert_arrived_in_order(&order, &sent, COUNT as u32);
    format!(
        "{} of {TRAINS} trains refused with EPERM, {} back once, {} datagrams checked in order, \
         ids {} taken {} completed",
        dropped.len(),
        tally.reports.len(),
        order.len(),
        tally.stats.zerocopy_ids,
        tally.stats.zerocopy_ids_completed
    )
}

/// (c) A `tbf` qdisc at 2 Mbit/s (far below any sender, a TCG guest's too) with `IP_RECVERR`,
/// its burst above a train (a larger train would be cut, and its datagrams dropped silently):
/// the trains it drops come back with `ENOBUFS`, the ones it takes arrive whole, none twice.
pub(crate) fn qdisc_drop(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 60;
    const COUNT: usize = 23;
    let tbf = [
        "qdisc", "add", "dev", "zc0", "root", "tbf", "rate", "2mbit", "burst", "40kb", "limit",
        "80kb",
    ];
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || tool("tc", &tbf, None),
        |sock| receive_until_done(&sock),
        || {
            let sock =
                connected(FAR.parse().expect("an address"), libc::IPPROTO_UDP).expect("a socket");
            set_int(&sock, libc::IPPROTO_IP, libc::IP_RECVERR, 1).expect("IP_RECVERR");
            send_all(cfg, sock, TRAINS, COUNT, SEG)
        },
    )
    .unwrap_or_else(|e| panic!("the veth with a qdisc: {e}"));
    assert!(
        !tally.refused.is_empty(),
        "the qdisc dropped no train: {:?}",
        tally.stats
    );
    assert!(
        tally.refused.values().all(|&e| e == libc::ENOBUFS),
        "errnos: {:?}",
        tally.refused
    );
    assert_eq!(tally.reports.len() + tally.refused.len(), TRAINS as usize);
    assert_device_paths(name, &tally);
    let sent: Vec<u32> = tally.reports.keys().copied().collect();
    let order = checked(&got);
    assert_arrived_in_order(&order, &sent, COUNT as u32);
    format!(
        "{} of {TRAINS} trains refused with ENOBUFS, {} back once and arrived whole ({} \
         datagrams checked)",
        tally.refused.len(),
        tally.reports.len(),
        order.len()
    )
}

/// Whether a train of 128 segments of 100 B goes through a sender made by `cfg` (every datagram
/// arriving), and whether the kernel takes it from a plain socket (`UDP_SEGMENT` set, one
/// `send`): over loopback, to a socket of our own. The two agree where the library asks the
/// kernel its limit rather than guessing it from the version (Debian's 6.1 and 6.12 take 128).
fn takes_128_segments(cfg: &SenderConfig) -> (bool, bool) {
    const UDP_SEGMENT: i32 = 103;
    let rx = receiver(
        "127.0.0.1:0".parse().expect("an address"),
        libc::IPPROTO_UDP,
    )
    .expect("a local socket");
    let to = rx.local_addr().expect("an address");
    let plain = connected(to, libc::IPPROTO_UDP).expect("a socket");
    set_int(&plain, libc::SOL_UDP, UDP_SEGMENT, 100).expect("UDP_SEGMENT");
    let raw = plain.send(&[0u8; 12_800]).is_ok();
    let sock = connected(to, libc::IPPROTO_UDP).expect("a socket");
    let mut tx: Sender<Vec<u8>> = Sender::with_config(sock, cfg.clone()).expect("a sender");
    let lib = match tx.send_train(vec![1u8; 12_800], 100) {
        Ok(()) => match tx.flush(Duration::from_secs(5)) {
            Ok(()) => true,
            Err(e) => panic!("128 segments: {e}"),
        },
        Err(SendError::Invalid { reason, .. }) if reason.contains("UDP_MAX_SEGMENTS") => false,
        Err(e) => panic!("128 segments: {e}"),
    };
    rx.set_nonblocking(true).expect("non-blocking");
    let mut datagrams = 0;
    let mut buf = [0u8; 256];
    while let Ok(n) = rx.recv(&mut buf) {
        assert_eq!(n, 100, "a segment of 128 arrived as {n} bytes");
        datagrams += 1;
    }
    assert_eq!(
        datagrams,
        128 * (usize::from(raw) + usize::from(lib)),
        "datagrams"
    );
    (lib, raw)
}

/// (d, e) A segment above the MTU comes back with `EMSGSIZE`, nothing of it sent; too many
/// segments are refused before any call; as many as the kernel takes go (128 on 6.1, 6.12 and
/// 6.18, whatever the version says); the next train arrives whole.
pub(crate) fn refusals(_name: &str, cfg: SenderConfig) -> String {
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || Ok(()),
        |sock| receive_until_done(&sock),
        || {
            let dest: SocketAddr = FAR.parse().expect("an address");
            let (lib, raw) = takes_128_segments(&cfg);
            assert_eq!(
                lib, raw,
                "128 segments: the library took them {lib}, the kernel {raw}"
            );
            let mut tx = Trains::new(connected(dest, libc::IPPROTO_UDP).expect("a socket"), cfg);
            let big = train(0, SEG + 1, 2, SEG + 1);
            // The kernel's errno comes back as it gave it; what to do is in the advice.
            match tx.tx.send_train(big.clone(), SEG as u16 + 1) {
                Err(e @ SendError::Io { .. }) => {
                    let advice = e.advice().unwrap_or_default();
                    assert!(advice.contains("path MTU"), "{e}");
                    let SendError::Io { buf, error } = e else {
                        unreachable!()
                    };
                    assert!(buf == big, "the buffer came back changed");
                    assert_eq!(error.raw_os_error(), Some(libc::EMSGSIZE), "{error}");
                }
                // io_uring: the request takes the train, and the kernel's refusal comes back
                // with the buffer.
                Ok(()) => {
                    // The flush says a buffer came back with an error: that one.
                    let flushed = tx.tx.flush(Duration::from_secs(5));
                    let mut out = Vec::new();
                    if let Err(e) = tx.tx.reap(&mut out) {
                        panic!("reap: {e}");
                    }
                    let [r] = &out[..] else {
                        panic!("one buffer back, not {} ({flushed:?})", out.len());
                    };
                    assert!(r.buf == big, "the buffer came back changed");
                    let error = r.report.error.as_ref();
                    let error = error.unwrap_or_else(|| panic!("a segment above the MTU went"));
                    assert_eq!(error.raw_os_error(), Some(libc::EMSGSIZE), "{error}");
                    let advice = r.report.advice().unwrap_or_default();
                    assert!(advice.contains("path MTU"), "{}", r.report);
                }
                other => panic!("a segment above the MTU: {other:?}"),
            }
            let calls = tx.tx.stats().syscalls;
            let many = train(1, 100, 129, 100);
            match tx.tx.send_train(many.clone(), 100) {
                Err(SendError::Invalid { buf, reason }) => {
                    assert!(buf == many, "the buffer came back changed");
                    assert!(reason.contains("UDP_MAX_SEGMENTS"), "{reason}");
                }
                other => panic!("129 segments: {other:?}"),
            }
            assert_eq!(tx.tx.stats().syscalls, calls, "129 segments made a call");
            if let Err(e) = tx.send(2, train(2, SEG, 40, SEG), SEG, None) {
                panic!("the train after the refusals: {e}");
            }
            let tally = tx.finish();
            say_done(dest, libc::IPPROTO_UDP);
            tally
        },
    )
    .unwrap_or_else(|e| panic!("the veth: {e}"));
    assert_eq!(tally.reports.keys().copied().collect::<Vec<_>>(), [2]);
    let order = checked(&got);
    assert_arrived_in_order(&order, &[2], 40);
    "a segment above the MTU: EMSGSIZE, nothing sent; 129 segments refused before any call; \
     128 went where the kernel takes them; the next train arrived whole"
        .into()
}

/// (f) UDP-Lite never checksums a GSO packet (`EIO`): each train goes one datagram per call,
/// every datagram once and in order, and the path is remembered. UDP-Lite has no
/// `SO_ZEROCOPY` (`EOPNOTSUPP`): a zero-copy engine refuses the socket, saying to copy.
pub(crate) fn udplite_eio(name: &str, cfg: SenderConfig) -> String {
    let zero_copy_only = matches!(name, "msg-zc" | "uring-zc");
    zerotx_testbed::in_new_netns(move || {
        let rx = receiver(
            "127.0.0.1:0".parse().expect("an address"),
            libc::IPPROTO_UDPLITE,
        )
        .unwrap_or_else(|e| panic!("a UDP-Lite socket: {e}"));
        let dest = rx.local_addr().expect("bound");
        let sock = connected(dest, libc::IPPROTO_UDPLITE).expect("a socket");
        let tx = match Sender::with_config(sock, cfg) {
            Ok(tx) => tx,
            Err(e) if zero_copy_only => {
                let said = e.to_string();
                assert!(
                    said.contains("copy engine") || said.contains("use uring"),
                    "{said}"
                );
                return format!("the socket refused: {said}");
            }
            Err(e) => panic!("the sender: {e}"),
        };
        let mut tx = Trains::from(tx);
        let reader = std::thread::spawn(move || receive_until_done(&rx));
        for t in 0..3 {
            if let Err(e) = tx.send(t, train(t, 1000, 10, 500), 1000, None) {
                panic!("train {t}: {e}");
            }
        }
        let tally = tx.finish();
        say_done(dest, libc::IPPROTO_UDPLITE);
        let got = reader.join().expect("the reader");
        assert_eq!(tally.reports.len(), 3, "trains back");
        assert!(tally.refused.is_empty(), "refused: {:?}", tally.refused);
        assert_eq!(tally.stats.train_splits, 1, "{:?}", tally.stats);
        assert_eq!(tally.stats.trains, 3, "{:?}", tally.stats);
        assert_eq!(
            tally.stats.syscalls,
            1 + 30,
            "one refused train call, then 30 datagrams: {:?}",
            tally.stats
        );
        let order = checked(&got);
        if name.contains("uring") {
            // io_uring orders a train's datagrams, not one datagram request against another.
            assert_each_train_in_order(&order, &[0, 1, 2], 10);
        } else {
            assert_arrived_in_order(&order, &[0, 1, 2], 10);
        }
        format!(
            "EIO split each train into datagrams: {} calls, {} datagrams checked in order, \
             paths {:?}",
            tally.stats.syscalls,
            order.len(),
            tally.paths().collect::<HashSet<_>>()
        )
    })
    .unwrap_or_else(|e| panic!("a namespace: {e}"))
}

/// (g) A train to a local socket comes back copied; `auto` learns it and copies the rest.
pub(crate) fn local(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 64;
    let name = name.to_owned();
    zerotx_testbed::in_new_netns(move || {
        let rx = receiver(
            "127.0.0.1:0".parse().expect("an address"),
            libc::IPPROTO_UDP,
        )
        .expect("a receiver");
        let dest = rx.local_addr().expect("bound");
        let reader = std::thread::spawn(move || receive_until_done(&rx));
        let sock = UdpSocket::bind("127.0.0.1:0").expect("a socket");
        let mut tx = Trains::new(sock, cfg);
        for t in 0..TRAINS {
            if let Err(e) = tx.send(t, train(t, 1000, 40, 1000), 1000, Some(dest)) {
                panic!("train {t}: {e}");
            }
            if let Err(e) = tx.tx.flush(Duration::from_secs(5)) {
                panic!("flush: {e}");
            }
            tx.reap();
        }
        let tally = tx.finish();
        say_done(dest, libc::IPPROTO_UDP);
        let order = checked(&reader.join().expect("the reader"));
        assert_arrived_in_order(&order, &(0..TRAINS).collect::<Vec<_>>(), 40);
        assert_eq!(tally.reports.len(), TRAINS as usize);
        let last = tally.reports[&(TRAINS - 1)].0;
        match name.as_str() {
            "copy" | "uring" => assert!(
                tally
                    .paths()
                    .all(|p| p == SendPath::Copied(CopyReason::Engine)),
                "{:?}",
                tally.reports
            ),
            "msg-zc" | "uring-zc" => assert!(
                tally
                    .paths()
                    .all(|p| p == SendPath::Copied(CopyReason::Kernel)),
                "every train copied by the kernel: {:?}",
                tally.reports
            ),
            _ => {
                assert_eq!(tally.stats.switches_to_copy, 1, "{:?}", tally.stats);
                assert_eq!(last, SendPath::Copied(CopyReason::RouteCopies));
            }
        }
        format!(
            "{TRAINS} trains back once, {} zero-copy, the last {last:?}; {} datagrams checked",
            tally.zero_copy(),
            order.len()
        )
    })
    .unwrap_or_else(|e| panic!("a namespace: {e}"))
}

pub(crate) type Class = fn(&str, SenderConfig) -> String;

/// Every class, by the name its lines carry.
pub(crate) const CLASSES: [(&str, Class); 6] = [
    ("veth", veth),
    ("nft-drop", nft_drop),
    ("qdisc-drop", qdisc_drop),
    ("refusals", refusals),
    ("udplite-eio", udplite_eio),
    ("local", local),
];
