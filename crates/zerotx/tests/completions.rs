//! Where completions come from and what each buffer reports: TCP on loopback (the kernel
//! copies), UDP into the black hole (true zero-copy), a registered pool, unconnected UDP with a
//! destination per send. Each scenario runs over every engine (`util::engines()`).

mod util;

use std::collections::VecDeque;
use std::net::UdpSocket;
use std::time::Duration;

use util::{finish, tcp_pair, Peer};
use zerotx::{BufPool, CopyReason, EngineKind, Error, SendPath, Sender};

/// The path every buffer of a loopback or black-hole send should report.
fn expected_path(kind: EngineKind, kernel_copies: bool) -> SendPath {
    match (kind.is_zerocopy(), kernel_copies) {
        (false, _) => SendPath::Copied(CopyReason::Engine),
        (true, true) => SendPath::Copied(CopyReason::Kernel),
        (true, false) => SendPath::ZeroCopy,
    }
}

#[test]
fn tcp_loopback_completions_arrive_and_are_copied() {
    for v6 in [false, true] {
        for &kind in util::engines() {
            let (client, peer) = tcp_pair(v6, Peer::default());
            let mut tx = Sender::new(client, kind).unwrap();
            for i in 0..32u8 {
                tx.send(vec![i; 64 * 1024]).unwrap();
            }
            let (released, stats) = finish(tx);
            assert_eq!(released.len(), 32, "{kind} v6={v6}");
            // auto knows loopback copies: it copies from the first send (tests/auto.rs has the
            // learning path, to a local address that is not loopback).
            let expected = match kind {
                EngineKind::Auto => SendPath::Copied(CopyReason::RouteCopies),
                _ => expected_path(kind, true),
            };
            if kind.is_zerocopy() && kind != EngineKind::Auto {
                assert_eq!(stats.kernel_copied, 32, "{kind} v6={v6}: {stats:?}");
            }
            for r in &released {
                assert_eq!(r.report.path, expected, "{kind} v6={v6}");
                assert_eq!(r.report.bytes, 64 * 1024);
                assert!(r.report.error.is_none());
            }
            assert_eq!(peer.join().unwrap().bytes, 32 * 64 * 1024);
        }
    }
}

#[test]
fn udp_black_hole_completions_are_zerocopy() {
    util::in_black_hole(65535, |bh| {
        for dest in [bh.v4, bh.v6] {
            for &kind in util::engines() {
                let mut tx = Sender::connect_udp(dest, kind).unwrap();
                for _ in 0..200 {
                    tx.send(vec![0x42; 65000]).unwrap();
                }
                let (released, stats) = finish(tx);
                assert_eq!(released.len(), 200, "{kind} {dest}");
                for r in &released {
                    assert_eq!(r.report.path, expected_path(kind, false), "{kind} {dest}");
                    assert_eq!(r.report.bytes, 65000);
                }
                if kind.is_zerocopy() {
                    assert!(stats.completions > 0);
                    assert_eq!(stats.zerocopy, 200, "{stats:?}");
                }
                // Nobody reads a black hole's payload, so early release cannot show on the wire
                // here, and no receiver can be added: delivering to a local socket (another
                // namespace's veth peer included) copies the pages, so the send would no longer
                // be zero-copy. The ledger's accounting is the check: every id taken completed
                // exactly once and no completion was refused (`finish` checks the latter).
                if kind == EngineKind::MsgZerocopy {
                    assert_eq!(stats.zerocopy_ids, 200, "{stats:?}");
                    assert_eq!(stats.zerocopy_ids_completed, 200, "{stats:?}");
                }
            }
        }
    });
}

#[test]
fn registered_pool_datagrams_are_zerocopy_and_other_engines_refuse_registration() {
    util::in_black_hole(65535, |bh| {
        for dest in [bh.v4, bh.v6] {
            let pool = BufPool::new(65000, 32).unwrap();
            let mut tx = Sender::connect_udp(dest, EngineKind::UringZc).unwrap();
            tx.register_pool(&pool).unwrap();
            let mut sent = 0;
            let mut out = Vec::new();
            while sent < 300 {
                match pool.take() {
                    Some(mut b) => {
                        b[..8].copy_from_slice(&(sent as u64).to_le_bytes());
                        tx.send(b.freeze(65000)).unwrap();
                        sent += 1;
                    }
                    None => {
                        tx.wait_released(&mut out, Some(Duration::from_secs(10)))
                            .unwrap();
                        assert!(!out.is_empty(), "no release within 10 s");
                        out.clear(); // dropping a PooledBuf returns its block
                    }
                }
            }
            let (released, stats) = finish(tx);
            assert!(
                released.iter().all(|r| r.report.path == SendPath::ZeroCopy),
                "{stats:?}"
            );
            assert_eq!(stats.zerocopy, 300, "{stats:?}");
            drop(released);
            assert_eq!(pool.available(), 32);
        }
        let pool = BufPool::new(4096, 1).unwrap();
        for kind in [EngineKind::Copy, EngineKind::MsgZerocopy, EngineKind::Uring] {
            let mut tx = Sender::<zerotx::PooledBuf>::connect_udp(bh.v4, kind).unwrap();
            let err = tx.register_pool(&pool).unwrap_err();
            assert!(matches!(err, Error::Unsupported { .. }), "{kind}: {err}");
        }
    });
}

#[test]
fn unconnected_udp_takes_a_destination_per_send() {
    util::in_black_hole(65535, |bh| {
        for &kind in util::engines() {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let mut tx = Sender::new(sock, kind).unwrap();
            let err = tx.try_send(vec![1; 100]).unwrap_err();
            assert!(
                err.to_string().contains("not connected"),
                "unexpected error: {err}"
            );
            assert_eq!(err.into_inner(), vec![1; 100], "buffer handed back");
            // The batch calls refuse the front buffer alike and keep the rest.
            for blocking in [false, true] {
                let mut batch: VecDeque<Vec<u8>> = [vec![7; 10], vec![8; 20]].into();
                let err = if blocking {
                    tx.send_batch(&mut batch).unwrap_err()
                } else {
                    tx.try_send_batch(&mut batch).unwrap_err()
                };
                assert!(err.to_string().contains("not connected"), "{kind}: {err}");
                assert_eq!(err.into_inner(), vec![7; 10], "{kind}: front handed back");
                assert_eq!(batch, VecDeque::from([vec![8u8; 20]]), "{kind}");
            }
            for _ in 0..50 {
                tx.send_to(vec![2; 30000], bh.v4).unwrap();
            }
            let (released, stats) = finish(tx);
            assert_eq!(released.len(), 50);
            for r in &released {
                assert_eq!(
                    r.report.path,
                    expected_path(kind, false),
                    "{kind}: {:?} {stats:?}",
                    r.report
                );
            }
        }
    });
}
