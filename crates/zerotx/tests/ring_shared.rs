//! One io_uring shared by many senders: a batch across stream sockets keeps each stream intact,
//! and a registered pool serves many datagram sockets.

mod util;

use std::time::Duration;

use util::{fill, finish, tcp_pair, Peer, MIB};
use zerotx::{BufPool, EngineKind, SendPath, Sender, SenderConfig, UringConfig, UringShared};

#[test]
fn a_shared_ring_batches_across_sockets_and_keeps_each_stream_intact() {
    let ring = UringShared::new(UringConfig::default()).unwrap();
    let mut senders = Vec::new();
    let mut peers = Vec::new();
    for kind in [EngineKind::UringZc, EngineKind::Uring, EngineKind::UringZc] {
        let (client, peer) = tcp_pair(false, Peer::checking());
        senders.push(Sender::with_config(client, SenderConfig::shared(kind, &ring)).unwrap());
        peers.push(peer);
    }
    // One thread drives every sender, round robin, as an event loop would.
    let total = 64 * MIB;
    let block = 128 * 1024;
    let mut offset = 0u64;
    let mut out = Vec::new();
    while offset < total {
        for tx in senders.iter_mut() {
            let mut buf = vec![0u8; block];
            fill(&mut buf, offset);
            tx.send(buf).unwrap();
            tx.reap(&mut out).unwrap();
        }
        offset += block as u64;
    }
    let mut requests = 0;
    for tx in senders {
        let (released, stats) = finish(tx);
        out.extend(released);
        requests += stats.syscalls;
    }
    assert_eq!(
        out.len() as u64,
        3 * total / block as u64,
        "every buffer back"
    );
    for peer in peers {
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (total, 0));
    }
    eprintln!(
        "shared ring, 3 TCP streams: {} enters for {requests} requests",
        ring.enters()
    );
    assert!(
        ring.enters() < requests,
        "{} io_uring_enter calls for {requests} requests: no batching",
        ring.enters()
    );
}

#[test]
fn a_shared_ring_with_a_registered_pool_serves_many_datagram_sockets() {
    util::in_black_hole(65535, |bh| {
        let ring = UringShared::new(UringConfig::default()).unwrap();
        let pool = BufPool::new(65000, 64).unwrap();
        ring.register_pool(&pool).unwrap();
        let mut senders: Vec<Sender<zerotx::PooledBuf>> = [bh.v4, bh.v6, bh.v4, bh.v6]
            .into_iter()
            .map(|dest| {
                let sock = std::net::UdpSocket::bind(if dest.is_ipv4() {
                    "0.0.0.0:0"
                } else {
                    "[::]:0"
                })
                .unwrap();
                sock.connect(dest).unwrap();
                Sender::with_config(sock, SenderConfig::shared(EngineKind::UringZc, &ring)).unwrap()
            })
            .collect();
        let mut out = Vec::new();
        let (mut sent, mut checked) = (0, 0);
        while sent < 2000 {
            for tx in senders.iter_mut() {
                let buf = loop {
                    match pool.take() {
                        Some(b) => break b,
                        None => {
                            tx.wait_released(&mut out, Some(Duration::from_secs(10)))
                                .unwrap();
                            for r in out.drain(..) {
                                assert_eq!(r.report.path, SendPath::ZeroCopy, "{:?}", r.report);
                                assert!(r.report.error.is_none());
                                checked += 1;
                            }
                        }
                    }
                };
                // No reap per send: black-hole sends complete inside io_uring_enter, so a reap
                // finds nothing in flight and must submit at once; reap when the pool runs dry.
                tx.send(buf.freeze(65000)).unwrap();
                sent += 1;
            }
        }
        let mut requests = 0;
        let mut zerocopy = 0;
        for tx in senders {
            let (released, stats) = finish(tx);
            assert!(
                released.iter().all(|r| r.report.path == SendPath::ZeroCopy),
                "{stats:?}"
            );
            checked += released.len();
            requests += stats.syscalls;
            zerocopy += stats.zerocopy;
        }
        assert_eq!((checked, zerocopy), (2000, 2000), "every release checked");
        assert_eq!(pool.available(), 64, "every pooled buffer back");
        eprintln!(
            "shared ring, 4 UDP sockets: {} enters for {requests} requests",
            ring.enters()
        );
        assert!(
            ring.enters() < requests,
            "{} enters for {requests}",
            ring.enters()
        );
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let err =
            Sender::<Vec<u8>>::with_config(sock, SenderConfig::shared(EngineKind::Copy, &ring))
                .unwrap_err();
        assert!(err.to_string().contains("shared io_uring"), "{err}");
    });
}
