//! Trains (UDP GSO) on the io_uring engines, on the real kernel, in namespaces these tests
//! create: `uring` (`IORING_OP_SENDMSG` with a `UDP_SEGMENT` control message), `uring-zc`
//! (`IORING_OP_SENDMSG_ZC`), `uring-zc` with a registered pool, and `auto` on io_uring. A
//! receiver on the far side of a veth checks every datagram while the sender overwrites each
//! train the instant it comes back; the black hole gives one notification per train; netfilter
//! and qdisc drops fail that train only; refused trains come back with their buffers; UDP-Lite's
//! `EIO` splits a train into datagrams; a local destination copies, and `auto` learns it. The
//! kernel's rules: docs/kernel.md, "UDP GSO trains".

mod util;

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use util::trains::{check_datagram, send_trains, train, uring_engines, uring_sender, SEG};
use util::veth::{over_veth, receive_all, receiver, receiver_of, tbf, udp_of};
use util::{connected_udp, require};
use zerotx::{
    BufPool, CopyReason, EngineKind, PooledBuf, Released, SendError, SendPath, Sender,
    SenderConfig, Stats, UringConfig, UringShared,
};

/// Sends trains `0..n` (each `count` datagrams of [`SEG`] bytes, the last `last`) from a
/// registered pool through `uring-zc` on `sock`, overwriting each buffer the instant it comes
/// back; returns the reports' paths and the final counters.
fn send_pooled_trains(
    sock: UdpSocket,
    n: u32,
    count: usize,
    last: usize,
) -> (Vec<SendPath>, Stats) {
    let pool = BufPool::new(64 * 1024, 8).unwrap();
    let mut tx: Sender<PooledBuf> = Sender::new(sock, EngineKind::UringZc).unwrap();
    tx.register_pool(&pool).unwrap();
    let mut free: Vec<_> = (0..pool.count()).map(|_| pool.take().unwrap()).collect();
    let (mut out, mut paths) = (Vec::new(), Vec::new());
    let mut recycle = |out: &mut Vec<Released<PooledBuf>>, free: &mut Vec<_>| {
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            paths.push(r.report.path);
            let mut m = r.buf.into_mut();
            m.fill(0xEE); // an early release would put this on the wire
            free.push(m);
        }
    };
    for t in 0..n {
        let mut b = loop {
            if let Some(b) = free.pop() {
                break b;
            }
            tx.wait_released(&mut out, Some(Duration::from_secs(10)))
                .unwrap();
            recycle(&mut out, &mut free);
        };
        let bytes = train(t, SEG, count, last);
        b[..bytes.len()].copy_from_slice(&bytes);
        tx.send_train(b.freeze(bytes.len()), SEG as u16).unwrap();
        tx.reap(&mut out).unwrap();
        recycle(&mut out, &mut free);
    }
    let (mut rest, stats) = util::finish(tx);
    recycle(&mut rest, &mut free);
    assert_eq!(free.len(), pool.count(), "every pooled buffer came back");
    (paths, stats)
}

/// Checks what a receiver got from `trains` trains of `count` datagrams: every datagram once,
/// whole, and each train's datagrams in order. Trains may overtake each other: io_uring issues
/// a datagram socket's requests independently.
fn check_trains(got: &[Vec<u8>], trains: u32, count: usize, last: usize, name: &str) {
    assert_eq!(got.len(), trains as usize * count, "{name}: datagrams");
    let mut next = vec![0u32; trains as usize];
    for data in got {
        let (t, d) = check_datagram(data, SEG, count, last);
        assert_eq!(d, next[t as usize], "{name}: train {t} out of order");
        next[t as usize] += 1;
    }
}

/// Every datagram of every train arrives whole, once, each train in order, through each io_uring
/// engine (the registered pool too), while each buffer is overwritten the instant it comes back;
/// one request per train.
#[test]
fn every_datagram_of_every_train_arrives() {
    const TRAINS: u32 = 24;
    const COUNT: usize = 44;
    const LAST: usize = 1000;
    let Some(engines) = uring_engines() else {
        return;
    };
    let dest: SocketAddr = "192.0.2.2:9".parse().unwrap();
    for (name, cfg) in engines
        .into_iter()
        .map(|(n, c)| (n, Some(c)))
        .chain([("pool", None)])
    {
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            || true,
            |sock| receive_all(&sock, Duration::from_secs(1)),
            || {
                let sock = connected_udp(dest);
                let (paths, stats) = match cfg {
                    Some(cfg) => send_trains(sock, cfg, TRAINS, COUNT, LAST),
                    None => send_pooled_trains(sock, TRAINS, COUNT, LAST),
                };
                assert_eq!(paths.len(), TRAINS as usize, "{name}: buffers back");
                assert_eq!(stats.trains, u64::from(TRAINS), "{name}: {stats:?}");
                assert_eq!(stats.syscalls, u64::from(TRAINS), "{name}: {stats:?}");
                assert_eq!(stats.train_splits, 0, "{name}: {stats:?}");
            },
        );
        let Some(got) = result else { return };
        check_trains(&got, TRAINS, COUNT, LAST, name);
    }
}

/// Into the black hole, zero-copy trains complete NOT copied, with one notification each, from
/// user memory and from a registered pool; `uring` copies; `explain` counts the trains.
#[test]
fn black_hole_trains_complete_zero_copy_one_notification_each() {
    let Some(engines) = uring_engines() else {
        return;
    };
    util::in_black_hole(1500, |bh| {
        for (name, cfg) in engines.into_iter().take(2) {
            let (paths, stats) = send_trains(connected_udp(bh.v4), cfg, 64, 44, SEG);
            assert_eq!(paths.len(), 64, "{name}");
            let want = if name == "uring" {
                SendPath::Copied(CopyReason::Engine)
            } else {
                SendPath::ZeroCopy
            };
            assert!(paths.iter().all(|p| *p == want), "{name}: {paths:?}");
            let notifications = if name == "uring" { 0 } else { 64 };
            assert_eq!(stats.completions, notifications, "{name}: {stats:?}");
            assert_eq!(
                stats.syscalls, 64,
                "{name}: one request per train: {stats:?}"
            );
            assert_eq!(stats.bytes, 64 * 44 * SEG as u64, "{name}: {stats:?}");
        }
        let (paths, stats) = send_pooled_trains(connected_udp(bh.v4), 64, 44, SEG);
        assert!(
            paths.iter().all(|p| *p == SendPath::ZeroCopy),
            "pool: {paths:?}"
        );
        assert_eq!(stats.completions, 64, "pool: {stats:?}");

        let mut tx = Sender::new(connected_udp(bh.v4), EngineKind::UringZc).unwrap();
        tx.send_train(train(0, SEG, 3, 10), SEG as u16).unwrap();
        tx.flush(Duration::from_secs(5)).unwrap();
        let said = tx.explain().lines.join("\n");
        assert!(
            said.contains("1 trains of datagrams sent as UDP GSO"),
            "{said}"
        );
    });
}

/// Two senders on one shared ring send trains at once, interleaved: every train of each comes
/// back zero-copy to its own sender, with one notification each, whoever reaped the CQE.
#[test]
fn trains_of_two_senders_on_a_shared_ring() {
    if uring_engines().is_none() {
        return;
    }
    util::in_black_hole(1500, |bh| {
        let ring = UringShared::new(UringConfig::default()).unwrap();
        let cfg = SenderConfig::new(EngineKind::UringZc).with_ring(&ring);
        let mut txs: Vec<Sender<Vec<u8>>> = (0..2)
            .map(|_| Sender::with_config(connected_udp(bh.v4), cfg.clone()).unwrap())
            .collect();
        let mut outs = [Vec::new(), Vec::new()];
        for t in 0..32u32 {
            let i = t as usize % 2;
            txs[i]
                .send_train(train(t, SEG, 44, SEG), SEG as u16)
                .unwrap();
            txs[i].reap(&mut outs[i]).unwrap();
        }
        for (i, (tx, mut out)) in txs.into_iter().zip(outs).enumerate() {
            let (released, stats) = util::finish(tx);
            out.extend(released);
            assert_eq!(out.len(), 16, "sender {i}: {stats:?}");
            for r in &out {
                let t = u32::from_be_bytes(r.buf[..4].try_into().unwrap());
                assert_eq!(t as usize % 2, i, "sender {i} got train {t}");
                assert_eq!(r.report.path, SendPath::ZeroCopy, "sender {i}");
            }
            assert_eq!(stats.trains, 16, "sender {i}: {stats:?}");
            assert_eq!(stats.completions, 16, "sender {i}: {stats:?}");
        }
    });
}

/// `auto` on io_uring copies a train shorter than the length from which zero-copy trains pay,
/// and sends longer ones zero-copy.
#[test]
fn auto_copies_short_trains_and_zero_copies_long_ones() {
    if uring_engines().is_none() {
        return;
    }
    util::in_black_hole(1500, |bh| {
        let cfg = SenderConfig::new(EngineKind::Auto);
        let mut tx = uring_sender(connected_udp(bh.v4), cfg, "auto");
        for (t, count) in [4, 44, 8, 40].into_iter().enumerate() {
            tx.send_train(train(t as u32, SEG, count, SEG), SEG as u16)
                .unwrap();
            tx.flush(Duration::from_secs(5)).unwrap();
        }
        let (released, stats) = util::finish(tx);
        let paths: Vec<SendPath> = released.iter().map(|r| r.report.path).collect();
        let small = SendPath::Copied(CopyReason::Small);
        assert_eq!(
            paths,
            [small, SendPath::ZeroCopy, small, SendPath::ZeroCopy],
            "{stats:?}"
        );
        assert_eq!(stats.completions, 2, "{stats:?}");
    });
}

/// A train netfilter drops (`EPERM`) comes back with its buffer untouched and the error, to an
/// unconnected socket's destination (`msg_name`); the trains around it go, and every zero-copy
/// request's notification comes, the dropped ones' too.
#[test]
fn a_train_netfilter_drops_fails_alone() {
    let Some(engines) = uring_engines() else {
        return;
    };
    util::in_black_hole(1500, |bh| {
        let rules = "table inet zerotx_trains {\n  chain out {\n    type filter hook output \
                     priority 0; policy accept;\n    udp dport 10 drop\n  }\n}\n";
        if !util::run_tool("nft", &["-f", "-"], Some(rules)) {
            require(false, "nft could not load a rule");
            return;
        }
        for (name, cfg) in engines {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let mut tx = uring_sender(sock, cfg, name);
            for t in 0..40u32 {
                let port = if t % 4 == 3 { 10 } else { 9 };
                let dest = SocketAddr::new(bh.v4.ip(), port);
                tx.send_train_to(train(t, SEG, 24, 500), SEG as u16, dest)
                    .unwrap();
            }
            let failed = util::flush_after_faults(&mut tx, Duration::from_secs(20), name);
            assert_eq!(failed, 10, "{name}");
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), 40, "{name}: {stats:?}");
            let mut dropped = 0;
            for r in &released {
                let t = u32::from_be_bytes(r.buf[..4].try_into().unwrap());
                assert_eq!(r.buf, train(t, SEG, 24, 500), "{name}: train {t} changed");
                match &r.report.error {
                    None => assert_ne!(t % 4, 3, "{name}: dropped train {t} reported sent"),
                    Some(e) => {
                        assert_eq!(t % 4, 3, "{name}: train {t}: {e}");
                        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{name}: {e}");
                        dropped += 1;
                    }
                }
            }
            assert_eq!(dropped, 10, "{name}");
            if name == "uring-zc" {
                assert_eq!(stats.completions, 40, "{name}: {stats:?}");
            }
        }
    });
}

/// A tbf qdisc that drops, with `IP_RECVERR`: a train dropped whole comes back with `ENOBUFS`;
/// no buffer comes back before the kernel is done with it (each is overwritten the instant it
/// does, and the receiver checks every byte that arrives), none is lost, and no datagram arrives
/// twice. The qdisc's rate is far below any sender's, so it drops however slow the machine.
#[test]
fn qdisc_drops_with_recverr_fail_their_trains_only() {
    const TRAINS: u32 = 200;
    const COUNT: usize = 20;
    let Some(engines) = uring_engines() else {
        return;
    };
    for (name, cfg) in engines {
        let qdisc = || tbf("20mbit", "32kb", "64kb");
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            qdisc,
            |sock| receive_all(&sock, Duration::from_secs(2)),
            || {
                let sock = connected_udp("192.0.2.2:9".parse().unwrap());
                util::set_recverr(sock.as_fd(), false);
                let mut tx = uring_sender(sock, cfg, name);
                let (mut out, mut back, mut refused) = (Vec::new(), 0, 0);
                let mut take = |out: &mut Vec<Released<Vec<u8>>>| {
                    for r in out.iter_mut() {
                        if let Some(e) = &r.report.error {
                            assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS), "{name}: {e}");
                            let t = u32::from_be_bytes(r.buf[..4].try_into().unwrap());
                            assert_eq!(r.buf, train(t, SEG, COUNT, SEG), "{name}");
                            refused += 1;
                        }
                        r.buf.fill(0xEE);
                    }
                    back += out.len();
                    out.clear();
                };
                for t in 0..TRAINS {
                    tx.send_train(train(t, SEG, COUNT, SEG), SEG as u16)
                        .unwrap();
                    tx.reap(&mut out).unwrap();
                    take(&mut out);
                }
                let failed = util::flush_after_faults(&mut tx, Duration::from_secs(20), name);
                let (mut rest, stats) = util::finish(tx);
                take(&mut rest);
                assert_eq!(back, TRAINS as usize, "{name}: buffers back: {stats:?}");
                assert!(
                    failed <= refused,
                    "{name}: {failed} failed, {refused} with ENOBUFS"
                );
                assert!(
                    refused > 0,
                    "{name}: the qdisc dropped no whole train: {stats:?}"
                );
            },
        );
        let Some(got) = result else { return };
        let mut seen = HashSet::new();
        for data in &got {
            let id = check_datagram(data, SEG, COUNT, SEG);
            assert!(seen.insert(id), "{name}: {id:?} arrived twice");
        }
        assert!(
            !got.is_empty() && got.len() < TRAINS as usize * COUNT,
            "{name}"
        );
    }
}

/// Trains that find the socket full (a small send buffer, a slow qdisc that drops nothing) are
/// parked by io_uring and issued again later: the kernel reads each request's `UDP_SEGMENT`
/// control message again then, from the request, so every datagram still arrives at its
/// segment size, whole, once (a control message freed or moved would send 64 KiB datagrams or
/// garbage), while each buffer is overwritten the instant it comes back.
#[test]
fn trains_parked_on_a_full_socket_keep_their_segments() {
    const TRAINS: u32 = 24;
    const COUNT: usize = 44;
    let Some(engines) = uring_engines() else {
        return;
    };
    for (name, cfg) in engines {
        let qdisc = || tbf("50mbit", "32kb", "4mb");
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            qdisc,
            |sock| receive_all(&sock, Duration::from_secs(1)),
            || {
                let sock = connected_udp("192.0.2.2:9".parse().unwrap());
                socket2::SockRef::from(&sock)
                    .set_send_buffer_size(4096)
                    .unwrap();
                let (paths, stats) = send_trains(sock, cfg, TRAINS, COUNT, SEG);
                assert_eq!(paths.len(), TRAINS as usize, "{name}: {stats:?}");
            },
        );
        let Some(got) = result else { return };
        check_trains(&got, TRAINS, COUNT, SEG, name);
    }
}

/// A segment above the path MTU is refused by the kernel: the train comes back with its buffer
/// and an error that names the MTU rule, and the next train goes. More segments than the kernel
/// takes, or more bytes than one GSO packet carries, are refused before any request.
#[test]
fn trains_the_kernel_cannot_take_come_back_with_their_buffers() {
    let Some(engines) = uring_engines() else {
        return;
    };
    util::in_black_hole(1500, |bh| {
        for (name, cfg) in engines {
            let mut tx = uring_sender(connected_udp(bh.v4), cfg, name);
            let big = train(0, SEG + 1, 30, SEG + 1);
            tx.send_train(big.clone(), SEG as u16 + 1).unwrap();
            let many = vec![1u8; 129 * 100];
            match tx.send_train(many.clone(), 100) {
                Err(SendError::Invalid { buf, reason }) => {
                    assert_eq!(buf, many, "{name}");
                    assert!(reason.contains("UDP_MAX_SEGMENTS"), "{name}: {reason}");
                }
                other => panic!("{name}: {other:?}"),
            }
            match tx.send_train(vec![1u8; 65_508], 1000) {
                Err(SendError::Invalid { reason, .. }) => {
                    assert!(reason.contains("65507"), "{name}: {reason}")
                }
                other => panic!("{name}: {other:?}"),
            }
            tx.send_train(train(1, SEG, 40, SEG), SEG as u16).unwrap();
            let failed = util::flush_after_faults(&mut tx, Duration::from_secs(20), name);
            assert_eq!(failed, 1, "{name}");
            let (mut released, stats) = util::finish(tx);
            released.sort_by_key(|r| r.buf.len());
            assert_eq!(released.len(), 2, "{name}: {stats:?}");
            let [refused, sent] = &released[..] else {
                unreachable!()
            };
            assert!(sent.report.error.is_none(), "{name}: {:?}", sent.report);
            assert_eq!(refused.buf, big, "{name}: the refused train changed");
            let error = refused.report.error.as_ref().expect("refused");
            assert_eq!(error.raw_os_error(), Some(libc::EMSGSIZE), "{name}");
            let said = refused.report.to_string();
            assert!(said.contains("path MTU"), "{name}: {said}");
            if name == "uring-zc" {
                assert_eq!(sent.report.path, SendPath::ZeroCopy, "{name}");
            }
        }
    });
}

/// UDP-Lite never checksums a GSO packet: the kernel answers a train's request with `EIO`
/// having sent nothing. The train goes one datagram per request by copy, every datagram once and
/// in order, the path is remembered (the next trains are not tried as one), and `Stats` and
/// `explain` say so.
#[test]
fn a_path_that_cannot_checksum_a_train_gets_its_datagrams_one_by_one() {
    require!(util::is_root(), "needs root for a network namespace");
    if uring_engines().is_none() {
        return;
    }
    zerotx_testbed::in_new_netns(|| {
        let Some(rx) = receiver_of("127.0.0.1:0", libc::IPPROTO_UDPLITE) else {
            return;
        };
        let tx_sock = udp_of(libc::IPPROTO_UDPLITE).unwrap();
        tx_sock.connect(&rx.local_addr().unwrap().into()).unwrap();
        let mut tx = Sender::new(tx_sock, EngineKind::Uring).unwrap();
        for t in 0..3 {
            tx.send_train(train(t, 1000, 10, 500), 1000).unwrap();
            tx.flush(Duration::from_secs(5)).unwrap();
        }
        let said = tx.explain().lines.join("\n");
        let (released, stats) = util::finish(tx);
        assert_eq!(released.len(), 3);
        assert!(
            released
                .iter()
                .all(|r| r.report.error.is_none() && r.report.bytes == 9500),
            "{released:?}"
        );
        assert_eq!(stats.train_splits, 1, "{stats:?}");
        assert_eq!(stats.trains, 3, "{stats:?}");
        assert_eq!(
            stats.syscalls,
            1 + 30,
            "one refused train, then 30 datagrams: {stats:?}"
        );
        assert!(said.contains("one datagram per call"), "{said}");
        let got = receive_all(&rx, Duration::from_millis(300));
        assert_eq!(got.len(), 30);
        for (i, data) in got.iter().enumerate() {
            let (t, d) = check_datagram(data, 1000, 10, 500);
            assert_eq!((t as usize, d as usize), (i / 10, i % 10));
        }
    })
    .unwrap();
}

/// A train to a local socket is copied on delivery, and the notification says so; `auto` on
/// io_uring learns it and copies the trains that follow.
#[test]
fn a_local_destination_copies_and_auto_learns_it() {
    require!(util::is_root(), "needs root for a network namespace");
    if uring_engines().is_none() {
        return;
    }
    zerotx_testbed::in_new_netns(|| {
        let rx = receiver("127.0.0.1:0");
        let dest = rx.local_addr().unwrap();
        let reader = std::thread::spawn(move || receive_all(&rx, Duration::from_millis(500)).len());
        let mut copied = Vec::new();
        for (name, kind) in [
            ("uring-zc", EngineKind::UringZc),
            ("auto", EngineKind::Auto),
        ] {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut tx = uring_sender(sock, SenderConfig::new(kind), name);
            for t in 0..64 {
                tx.send_train_to(train(t, 1000, 40, 1000), 1000, dest)
                    .unwrap();
                tx.flush(Duration::from_secs(5)).unwrap();
            }
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), 64, "{name}");
            copied.push((released, stats));
        }
        let (zc, _) = &copied[0];
        assert!(
            zc.iter()
                .all(|r| r.report.path == SendPath::Copied(CopyReason::Kernel)),
            "uring-zc: every train copied by the kernel"
        );
        let (auto, stats) = &copied[1];
        assert_eq!(stats.switches_to_copy, 1, "{stats:?}");
        assert_eq!(
            auto.last().unwrap().report.path,
            SendPath::Copied(CopyReason::RouteCopies),
            "auto copies once it learnt the route copies"
        );
        assert_eq!(
            reader.join().unwrap(),
            2 * 64 * 40,
            "every datagram arrived"
        );
    })
    .unwrap();
}

/// Trains from a registered pool go by `SENDMSG_ZC` with `IORING_RECVSEND_FIXED_BUF` (6.15):
/// their pages were pinned once, at registration, so a train in flight pins nothing more, while
/// the same trains from the same pool unregistered pin their pages until their notifications. A
/// slow qdisc holds the notifications back after every first CQE came; every datagram of both
/// arrives whole, while each buffer is overwritten the instant it comes back.
#[test]
fn registered_trains_pin_nothing_per_request() {
    const TRAINS: u32 = 4;
    const COUNT: usize = 44;
    if uring_engines().is_none() {
        return;
    }
    require!(
        zerotx::internals::uring::sendmsg_zc_fixed(),
        "this kernel sends no SENDMSG_ZC from registered buffers (Linux 6.15)"
    );
    let qdisc = || tbf("2mbit", "32kb", "4mb");
    let len = SEG * COUNT;
    let result = over_veth(
        1500,
        libc::IPPROTO_UDP,
        qdisc,
        |sock| receive_all(&sock, Duration::from_secs(1)),
        || {
            for (round, registered) in [true, false].into_iter().enumerate() {
                let sock = connected_udp("192.0.2.2:9".parse().unwrap());
                let pool = BufPool::new(64 * 1024, TRAINS as usize).unwrap();
                let mut tx: Sender<PooledBuf> = Sender::new(sock, EngineKind::UringZc).unwrap();
                if registered {
                    tx.register_pool(&pool).unwrap();
                }
                for t in 0..TRAINS {
                    let mut b = pool.take().unwrap();
                    let bytes = train(t + round as u32 * TRAINS, SEG, COUNT, SEG);
                    b[..len].copy_from_slice(&bytes);
                    tx.send_train(b.freeze(len), SEG as u16).unwrap();
                }
                // Every first CQE in: the kernel took every train.
                let (mut out, deadline) = (Vec::new(), Instant::now() + Duration::from_secs(10));
                while tx.stats().bytes < u64::from(TRAINS) * len as u64 {
                    assert!(Instant::now() < deadline, "{registered}: {:?}", tx.stats());
                    tx.reap(&mut out).unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                }
                let stats = tx.stats();
                assert!(
                    tx.in_flight() > 0,
                    "the qdisc let every train go: {stats:?}"
                );
                if registered {
                    assert_eq!(stats.pinned_bytes, 0, "registered: {stats:?}");
                } else {
                    assert!(stats.pinned_bytes >= len as u64, "user memory: {stats:?}");
                }
                let (rest, stats) = util::finish(tx);
                out.extend(rest);
                assert_eq!(out.len(), TRAINS as usize, "{stats:?}");
                for r in out {
                    assert!(r.report.error.is_none(), "{:?}", r.report);
                    r.buf.into_mut().fill(0xEE);
                }
            }
        },
    );
    let Some(got) = result else { return };
    check_trains(&got, 2 * TRAINS, COUNT, SEG, "registered and not");
}

const PROBE_CHILD: &str = "ZEROTX_TRAINS_PROBE_CHILD";

/// The probe for `SENDMSG_ZC` from registered buffers sends nothing and needs no network: in a
/// namespace without even loopback up it answers as the kernel's release says (Linux 6.15). Its
/// answer is cached per process, so a probe that needed loopback would have turned the registered
/// path off for a whole process whose first train went from such a namespace.
#[test]
fn the_fixed_buffer_probe_needs_no_network() {
    require!(util::is_root(), "needs root for a network namespace");
    if uring_engines().is_none() {
        return;
    }
    util::run_child_test("fixed_probe_child", PROBE_CHILD);
}

#[test]
#[ignore = "runs in its own process, started by the_fixed_buffer_probe_needs_no_network"]
fn fixed_probe_child() {
    if std::env::var(PROBE_CHILD).is_err() {
        return;
    }
    // SAFETY: unshare has no memory preconditions; it moves this thread to a new network
    // namespace, where only a loopback device exists, down.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().unwrap().parse().unwrap();
    let minor: u32 = parts.next().unwrap().parse().unwrap();
    let want = (major, minor) >= (6, 15);
    assert_eq!(
        zerotx::internals::uring::sendmsg_zc_fixed(),
        want,
        "kernel {release}"
    );
    println!("fixed_probe_child: ok");
}
