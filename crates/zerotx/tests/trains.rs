//! Trains (UDP GSO: one buffer the kernel cuts into datagrams) on the real kernel, in namespaces
//! these tests create: a receiver on the far side of a veth checks every datagram of every train
//! (content, count, order); the black hole gives zero-copy completions; netfilter and qdisc drops
//! fail a train and keep its id; a segment above the MTU and too many segments come back with the
//! buffer; a UDP-Lite socket (which never checksums a GSO packet: `EIO`) splits its trains into
//! datagrams; a local destination copies, and `auto` learns it. The kernel's rules:
//! docs/kernel.md, "UDP GSO trains".

mod util;

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

use util::trains::{check_datagram, send_trains, train, SEG};
use util::veth::{over_veth, receive_all, receiver, receiver_of, tbf, udp_of};
use util::{connected_udp, require};
use zerotx::{CopyReason, EngineKind, SendError, SendPath, Sender, SenderConfig};

/// The sendmsg family's engines that send trains (`auto` kept on `sendmsg(2)`; the io_uring ones:
/// tests/trains_uring.rs).
fn train_engines() -> [(&'static str, SenderConfig); 3] {
    [
        ("copy", SenderConfig::new(EngineKind::Copy)),
        ("msg-zc", SenderConfig::new(EngineKind::MsgZerocopy)),
        (
            "auto",
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ),
    ]
}

/// Every datagram of every train arrives, whole and in order, through each engine that sends
/// trains; every buffer comes back once.
#[test]
fn every_datagram_of_every_train_arrives_in_order() {
    const TRAINS: u32 = 24;
    const COUNT: usize = 44;
    const LAST: usize = 1000;
    for (name, cfg) in train_engines() {
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            || true,
            |sock| receive_all(&sock, Duration::from_secs(1)),
            || {
                let (paths, stats) = send_trains(
                    connected_udp("192.0.2.2:9".parse().unwrap()),
                    cfg,
                    TRAINS,
                    COUNT,
                    LAST,
                );
                assert_eq!(paths.len(), TRAINS as usize, "{name}: buffers back");
                assert_eq!(stats.trains, u64::from(TRAINS), "{name}: {stats:?}");
                assert_eq!(stats.sends, u64::from(TRAINS), "{name}: {stats:?}");
                assert_eq!(stats.train_splits, 0, "{name}: {stats:?}");
            },
        );
        let Some(got) = result else { return };
        assert_eq!(
            got.len(),
            TRAINS as usize * COUNT,
            "{name}: datagrams received"
        );
        for (i, data) in got.iter().enumerate() {
            let (t, d) = check_datagram(data, SEG, COUNT, LAST);
            assert_eq!(
                (t as usize, d as usize),
                (i / COUNT, i % COUNT),
                "{name}: order"
            );
        }
    }
}

/// Into the black hole, zero-copy trains complete NOT copied: one id per train, and the report
/// says zero-copy; `explain` counts the trains.
#[test]
fn black_hole_trains_complete_zero_copy() {
    util::in_black_hole(1500, |bh| {
        let (paths, stats) = send_trains(
            connected_udp(bh.v4),
            SenderConfig::new(EngineKind::MsgZerocopy),
            64,
            44,
            SEG,
        );
        assert_eq!(paths.len(), 64);
        assert!(paths.iter().all(|p| *p == SendPath::ZeroCopy), "{paths:?}");
        assert_eq!(stats.zerocopy_ids, 64, "{stats:?}");
        assert_eq!(stats.zerocopy_ids_completed, 64, "{stats:?}");
        assert_eq!(stats.syscalls, 64, "one call per train: {stats:?}");

        let mut tx = Sender::new(connected_udp(bh.v4), EngineKind::MsgZerocopy).unwrap();
        tx.send_train(train(0, SEG, 3, 10), SEG as u16).unwrap();
        tx.flush(Duration::from_secs(5)).unwrap();
        let said = tx.explain().lines.join("\n");
        assert!(
            said.contains("1 trains of datagrams sent as UDP GSO"),
            "{said}"
        );
    });
}

/// `auto` copies a train shorter than the length from which zero-copy trains pay (measured:
/// `examples/train_cost.rs`) and sends longer ones zero-copy.
#[test]
fn auto_copies_short_trains_and_zero_copies_long_ones() {
    util::in_black_hole(1500, |bh| {
        let cfg = SenderConfig::new(EngineKind::Auto).with_auto_uring(false);
        let mut tx = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
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
        assert_eq!(stats.zerocopy_ids, 2, "{stats:?}");
    });
}

/// A train netfilter drops comes back with its buffer and `EPERM`, having taken its id (the
/// kernel built the skb): the trains around it complete in step, none released early.
#[test]
fn a_train_netfilter_drops_comes_back_and_keeps_its_id() {
    util::in_black_hole(1500, |bh| {
        let rules = "table inet zerotx_trains {\n  chain out {\n    type filter hook output \
                     priority 0; policy accept;\n    udp dport 10 drop\n  }\n}\n";
        if !util::run_tool("nft", &["-f", "-"], Some(rules)) {
            return;
        }
        for (name, cfg) in train_engines() {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let mut tx = Sender::with_config(sock, cfg).unwrap();
            let mut dropped = 0;
            for t in 0..40u32 {
                let port = if t % 4 == 3 { 10 } else { 9 };
                let dest = SocketAddr::new(bh.v4.ip(), port);
                let buf = train(t, SEG, 20, 500);
                match tx.send_train_to(buf, SEG as u16, dest) {
                    Ok(()) => assert_eq!(port, 9, "{name}: a dropped train was accepted"),
                    Err(SendError::Io { buf, error }) => {
                        assert_eq!(port, 10, "{name}: {error}");
                        assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{name}: {error}");
                        assert_eq!(buf, train(t, SEG, 20, 500), "{name}: the buffer changed");
                        dropped += 1;
                    }
                    Err(e) => panic!("{name}: {e}"),
                }
            }
            assert_eq!(dropped, 10, "{name}");
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), 30, "{name}: {stats:?}");
            assert!(released.iter().all(|r| r.report.error.is_none()), "{name}");
            assert_eq!(
                stats.zerocopy_ids, stats.zerocopy_ids_completed,
                "{name}: {stats:?}"
            );
            if name == "msg-zc" {
                // Every train took an id, the dropped ones too.
                assert_eq!(stats.zerocopy_ids, 40, "{name}: {stats:?}");
                assert!(
                    released.iter().all(|r| r.report.path == SendPath::ZeroCopy),
                    "{name}"
                );
            }
        }
    });
}

/// A tbf qdisc that drops, with `IP_RECVERR`: a train dropped whole comes back with `ENOBUFS`
/// (its id taken), one cut by the qdisc loses datagrams; no buffer comes back before the kernel
/// is done with it (each is overwritten the instant it does, and the receiver checks every byte
/// that arrives), none is lost, and no datagram arrives twice.
#[test]
fn qdisc_drops_with_recverr_release_nothing_early() {
    const TRAINS: u32 = 200;
    const COUNT: usize = 20;
    for (name, cfg) in train_engines() {
        let qdisc = || tbf("20mbit", "32kb", "64kb");
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            qdisc,
            |sock| receive_all(&sock, Duration::from_secs(2)),
            || {
                let sock = connected_udp("192.0.2.2:9".parse().unwrap());
                util::set_recverr(sock.as_fd(), false);
                let mut tx = Sender::with_config(sock, cfg).unwrap();
                let (mut out, mut refused, mut back) = (Vec::new(), 0, 0);
                for t in 0..TRAINS {
                    match tx.send_train(train(t, SEG, COUNT, SEG), SEG as u16) {
                        Ok(()) => {}
                        Err(SendError::Io { buf, error }) => {
                            assert_eq!(error.raw_os_error(), Some(libc::ENOBUFS), "{name}");
                            assert_eq!(buf, train(t, SEG, COUNT, SEG), "{name}");
                            refused += 1;
                        }
                        Err(e) => panic!("{name}: {e}"),
                    }
                    tx.reap(&mut out).unwrap();
                    for r in out.iter_mut() {
                        r.buf.fill(0xEE);
                    }
                    back += out.len();
                    out.clear();
                }
                let failed = util::flush_after_faults(&mut tx, Duration::from_secs(20), name);
                assert_eq!(failed, 0, "{name}: a train is refused or sent, never cut");
                let (rest, stats) = util::finish(tx);
                back += rest.len();
                assert_eq!(back + refused, TRAINS as usize, "{name}: buffers back");
                assert!(
                    refused > 0,
                    "{name}: the qdisc dropped no whole train: {stats:?}"
                );
                assert_eq!(
                    stats.zerocopy_ids, stats.zerocopy_ids_completed,
                    "{name}: {stats:?}"
                );
            },
        );
        let Some(got) = result else { return };
        let mut seen = std::collections::HashSet::new();
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

/// A segment larger than the path MTU allows is refused by the kernel after it built the train:
/// the buffer comes back with an error that says what to do, having taken its id, and the next
/// train completes in step. More segments than the kernel takes, or more bytes than one GSO
/// packet carries, are refused before any call.
#[test]
fn trains_the_kernel_cannot_take_come_back_with_their_buffers() {
    util::in_black_hole(1500, |bh| {
        for (name, cfg) in train_engines() {
            let mut tx = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
            let big = vec![7u8; 2 * (SEG + 1)];
            match tx.send_train(big.clone(), SEG as u16 + 1) {
                Err(e @ SendError::Io { .. }) => {
                    assert!(e.to_string().contains("path MTU"), "{name}: {e}");
                    let SendError::Io { buf, error } = e else {
                        unreachable!()
                    };
                    assert_eq!(buf, big, "{name}");
                    assert_eq!(error.raw_os_error(), Some(libc::EMSGSIZE), "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
            let many = vec![1u8; 129 * 100];
            match tx.send_train(many.clone(), 100) {
                Err(SendError::Invalid { buf, reason }) => {
                    assert_eq!(buf, many, "{name}");
                    assert!(reason.contains("UDP_MAX_SEGMENTS"), "{name}: {reason}");
                }
                other => panic!("{name}: {other:?}"),
            }
            let long = vec![1u8; 65_508];
            match tx.send_train(long, 1000) {
                Err(SendError::Invalid { reason, .. }) => {
                    assert!(reason.contains("65507"), "{name}: {reason}")
                }
                other => panic!("{name}: {other:?}"),
            }
            match tx.send_train(vec![1u8; 10], 0) {
                Err(SendError::Invalid { .. }) => {}
                other => panic!("{name}: {other:?}"),
            }
            tx.send_train(train(1, SEG, 40, SEG), SEG as u16).unwrap();
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), 1, "{name}");
            assert_eq!(
                stats.zerocopy_ids, stats.zerocopy_ids_completed,
                "{name}: {stats:?}"
            );
            if name == "msg-zc" {
                assert_eq!(released[0].report.path, SendPath::ZeroCopy);
            }
        }
    });
}

/// A train the kernel refuses keeps the kernel's errno on every engine, so a caller can match
/// it: a segment above the path MTU answers `EMSGSIZE`, in the call's `SendError::Io` on the
/// sendmsg family and in the release's `Report::error` on io_uring (where the flush's
/// `Error::Failed` carries it too). What to do is in the error's `Display` (the hint the
/// errno alone does not give).
#[test]
fn a_refused_train_keeps_its_errno_on_every_engine() {
    let uring_ok = {
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let made = Sender::<Vec<u8>>::new(probe, EngineKind::UringZc);
        require(made.is_ok(), "io_uring zero-copy unavailable")
    };
    let mut engines = train_engines().to_vec();
    if uring_ok {
        engines.extend([
            ("uring", SenderConfig::new(EngineKind::Uring)),
            ("uring-zc", SenderConfig::new(EngineKind::UringZc)),
            ("auto-uring", SenderConfig::new(EngineKind::Auto)),
        ]);
    }
    util::in_black_hole(1500, |bh| {
        for (name, cfg) in engines {
            let mut tx = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
            let uring = tx.explain().path == "io_uring";
            let big = vec![7u8; 2 * (SEG + 1)];
            let (error, said) = match tx.send_train(big.clone(), SEG as u16 + 1) {
                Err(e @ SendError::Io { .. }) => {
                    assert!(!uring, "{name}: io_uring answers in the release");
                    let said = e.to_string();
                    let SendError::Io { buf, error } = e else {
                        unreachable!()
                    };
                    assert_eq!(buf, big, "{name}");
                    (error, said)
                }
                Ok(()) if uring => {
                    match tx.flush(Duration::from_secs(20)) {
                        Err(zerotx::Error::Failed { failed, source }) => {
                            assert_eq!(failed, 1, "{name}");
                            assert_eq!(source.raw_os_error(), Some(libc::EMSGSIZE), "{name}");
                        }
                        other => panic!("{name}: flush: {other:?}"),
                    }
                    let mut out = Vec::new();
                    tx.reap(&mut out).unwrap();
                    let [r] = &mut out[..] else {
                        panic!("{name}: {} buffers back", out.len())
                    };
                    assert_eq!(r.buf, big, "{name}");
                    let said = r.report.to_string();
                    (r.report.error.take().expect("refused"), said)
                }
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(
                error.raw_os_error(),
                Some(libc::EMSGSIZE),
                "{name}: {error}"
            );
            assert!(said.contains("path MTU"), "{name}: {said}");
            let (released, _) = util::finish(tx);
            assert!(released.is_empty(), "{name}");
        }
    });
}

/// Whether this kernel's release is 6.9 or later: `UDP_MAX_SEGMENTS` is 128 there.
fn kernel_from_6_9() -> bool {
    let release = zerotx::internals::probe::kernel_release();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = v.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = v.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 9)
}

/// The kernel's segment limit is what it answers, not its version's guess: on this kernel (6.9
/// or later) a train of 128 segments goes on every engine and 129 are refused before any call;
/// and where the version rule would say 64, the probe train finds the 128 the kernel takes.
#[test]
fn a_train_of_128_segments_goes_where_the_kernel_takes_it() {
    require!(
        kernel_from_6_9(),
        "needs a kernel of 6.9 or later (128 segments per call)"
    );
    let uring_ok = {
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let made = Sender::<Vec<u8>>::new(probe, EngineKind::UringZc);
        require(made.is_ok(), "io_uring zero-copy unavailable")
    };
    let mut engines = train_engines().to_vec();
    if uring_ok {
        engines.extend([
            ("uring", SenderConfig::new(EngineKind::Uring)),
            ("uring-zc", SenderConfig::new(EngineKind::UringZc)),
        ]);
    }
    util::in_black_hole(1500, |bh| {
        // The probe itself, as a kernel before 6.9 would run it (loopback of this namespace).
        use zerotx::internals::trains::segment_limit;
        assert_eq!(segment_limit(100, 64), 128, "the probe train");
        assert_eq!(segment_limit(129, 64), 64, "above 128: never probed");
        assert_eq!(segment_limit(64, 64), 64);
        for (name, cfg) in engines {
            let mut tx = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
            tx.send_train(train(0, 100, 128, 100), 100)
                .unwrap_or_else(|e| panic!("{name}: 128 segments: {e}"));
            let calls = tx.stats().syscalls;
            match tx.send_train(vec![1u8; 129 * 100], 100) {
                Err(SendError::Invalid { reason, .. }) => {
                    assert!(reason.contains("UDP_MAX_SEGMENTS"), "{name}: {reason}")
                }
                other => panic!("{name}: 129 segments: {other:?}"),
            }
            assert_eq!(
                tx.stats().syscalls,
                calls,
                "{name}: 129 segments made a call"
            );
            let (released, stats) = util::finish(tx);
            let [r] = &released[..] else {
                panic!("{name}: {} buffers back", released.len())
            };
            assert!(r.report.error.is_none(), "{name}: {}", r.report);
            assert_eq!(r.report.bytes, 128 * 100, "{name}");
            assert_eq!(stats.trains, 1, "{name}: {stats:?}");
        }
    });
}

const NO_LOOPBACK_CHILD: &str = "ZEROTX_TRAIN_PROBE_CHILD";

/// The probe train needs loopback: asked first from a namespace where loopback is down, it
/// cannot run, and the limit is the version rule's; it keeps no answer, so once loopback is up
/// the same process finds what the kernel takes. (A kept failure would refuse every train of 65
/// to 128 segments for the life of the process.)
#[test]
fn the_segment_probe_answers_the_version_rule_without_loopback() {
    require!(util::is_root(), "needs root for a network namespace");
    util::run_child_test("segment_probe_child", NO_LOOPBACK_CHILD);
}

#[test]
#[ignore = "runs in its own process, started by the_segment_probe_answers_the_version_rule_without_loopback"]
fn segment_probe_child() {
    use zerotx::internals::trains::segment_limit;
    if std::env::var(NO_LOOPBACK_CHILD).is_err() {
        return;
    }
    // SAFETY: unshare has no memory preconditions; it moves this thread to a new network
    // namespace, where only a loopback device exists, down.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
    assert_eq!(segment_limit(100, 64), 64, "no loopback: the version rule");
    assert_eq!(segment_limit(100, 64), 64, "asked again, still the rule");
    assert!(util::run_tool("ip", &["link", "set", "lo", "up"], None));
    let found = segment_limit(100, 64);
    if kernel_from_6_9() {
        assert_eq!(found, 128, "loopback up: the kernel's answer");
    } else {
        assert!(matches!(found, 64 | 128), "{found}");
    }
    println!("segment_probe_child: ok");
}

/// UDP-Lite never checksums a GSO packet: the kernel answers a train with `EIO` having sent
/// nothing (as it did for every device without checksum offload before Linux 6.11). The train
/// goes one datagram per call, every datagram once and in order, the path is remembered (the
/// next train is not tried as one), and `Stats` and `explain` say so.
#[test]
fn a_path_that_cannot_checksum_a_train_gets_its_datagrams_one_by_one() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        let Some(rx) = receiver_of("127.0.0.1:0", libc::IPPROTO_UDPLITE) else {
            return;
        };
        let tx_sock = udp_of(libc::IPPROTO_UDPLITE).unwrap();
        tx_sock.connect(&rx.local_addr().unwrap().into()).unwrap();
        let mut tx = Sender::new(tx_sock, EngineKind::Copy).unwrap();
        for t in 0..3 {
            tx.send_train(train(t, 1000, 10, 500), 1000).unwrap();
        }
        let said = tx.explain().lines.join("\n");
        let (released, stats) = util::finish(tx);
        assert_eq!(released.len(), 3);
        let engine = SendPath::Copied(CopyReason::Engine);
        assert!(released
            .iter()
            .all(|r| r.report.path == engine && r.report.bytes == 9500));
        assert_eq!(stats.train_splits, 1, "{stats:?}");
        assert_eq!(stats.trains, 3, "{stats:?}");
        assert_eq!(
            stats.syscalls,
            1 + 30,
            "one refused train call, then 30 datagrams"
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

/// A split train that finds the socket full part way (a slow qdisc holds its datagrams, charged
/// to a small send buffer) keeps the rest as the sender's head: it goes before the next train,
/// so every datagram arrives once, in order.
#[test]
fn a_split_train_that_fills_the_socket_finishes_first() {
    const TRAINS: u32 = 12;
    let qdisc = || tbf("4mbit", "8kb", "1mb");
    let result = over_veth(
        1500,
        libc::IPPROTO_UDPLITE,
        qdisc,
        |sock| receive_all(&sock, Duration::from_secs(1)),
        || {
            let sock = udp_of(libc::IPPROTO_UDPLITE).unwrap();
            sock.set_send_buffer_size(4096).unwrap();
            let dest: SocketAddr = "192.0.2.2:9".parse().unwrap();
            sock.connect(&dest.into()).unwrap();
            let mut tx = Sender::new(sock, EngineKind::Copy).unwrap();
            let mut out = Vec::new();
            for t in 0..TRAINS {
                tx.send_train(train(t, 1000, 10, 700), 1000).unwrap();
                tx.reap(&mut out).unwrap();
                for r in out.iter_mut() {
                    r.buf.fill(0xEE);
                }
            }
            let (rest, stats) = util::finish(tx);
            assert_eq!(out.len() + rest.len(), TRAINS as usize, "{stats:?}");
            assert_eq!(stats.train_splits, 1, "{stats:?}");
            assert!(stats.would_block > 0, "the socket never filled: {stats:?}");
        },
    );
    let Some(got) = result else { return };
    assert_eq!(got.len(), TRAINS as usize * 10);
    for (i, data) in got.iter().enumerate() {
        let (t, d) = check_datagram(data, 1000, 10, 700);
        assert_eq!((t as usize, d as usize), (i / 10, i % 10));
    }
}

/// A train to a local socket is copied on delivery, and its report says so; `auto` learns it and
/// copies the trains that follow.
#[test]
fn a_local_destination_copies_and_auto_learns_it() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        let rx = receiver("127.0.0.1:0");
        let dest = rx.local_addr().unwrap();
        let reader = std::thread::spawn(move || receive_all(&rx, Duration::from_millis(500)).len());
        let mut copied = Vec::new();
        for cfg in [
            SenderConfig::new(EngineKind::MsgZerocopy),
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ] {
            let mut tx = Sender::with_config(UdpSocket::bind("127.0.0.1:0").unwrap(), cfg).unwrap();
            for t in 0..64 {
                tx.send_train_to(train(t, 1000, 40, 1000), 1000, dest)
                    .unwrap();
                tx.flush(Duration::from_secs(5)).unwrap();
            }
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), 64);
            copied.push((released, stats));
        }
        let (zc, _) = &copied[0];
        assert!(
            zc.iter()
                .all(|r| r.report.path == SendPath::Copied(CopyReason::Kernel)),
            "msg-zc: every train copied by the kernel"
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

/// Trains are for UDP: a stream socket refuses them, the reason says what to do, and the buffer
/// comes back. The io_uring engines send them (tests/trains_uring.rs): a train through `uring`
/// arrives as its datagrams.
#[test]
fn streams_refuse_trains_and_io_uring_sends_them() {
    let (stream, _peer) = util::stalled_peer();
    let mut tx = Sender::new(stream, EngineKind::Copy).unwrap();
    match tx.send_train(vec![1u8; 3000], 1000) {
        Err(SendError::Invalid { buf, reason }) => {
            assert_eq!(buf.len(), 3000);
            assert!(reason.contains("UDP"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sock = connected_udp(rx.local_addr().unwrap());
    let Ok(mut tx) = Sender::new(sock, EngineKind::Uring) else {
        require(false, "io_uring unavailable");
        return;
    };
    tx.send_train(train(0, 1000, 3, 1000), 1000).unwrap();
    let (released, stats) = util::finish(tx);
    assert_eq!(released.len(), 1, "{stats:?}");
    assert!(
        released[0].report.error.is_none(),
        "{:?}",
        released[0].report
    );
    assert_eq!(stats.trains, 1, "{stats:?}");
    let got = receive_all(&rx, Duration::from_millis(300));
    assert_eq!(got.len(), 3, "the train's datagrams");
}
