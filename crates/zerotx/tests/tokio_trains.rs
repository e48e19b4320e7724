//! Trains through the async sender (feature `tokio`): `send_train`, `send_train_to` and a
//! `send_batch` of equal-size datagrams, over a veth to a receiver in another namespace that
//! checks every datagram (content, count, order), each buffer overwritten the instant it comes
//! back; a train the checks refuse comes back in the error.

mod util;

use std::collections::VecDeque;
use std::net::UdpSocket;
use std::time::Duration;

use tokio::runtime::Builder;
use util::veth::{over_veth, receive_all};
use zerotx::tokio::AsyncSender;
use zerotx::{EngineKind, SendError, SenderConfig};

/// Bytes per datagram (a 1500-byte MTU less the IPv4 and UDP headers).
const SEG: usize = 1472;
/// Datagrams per train.
const COUNT: usize = 20;
/// Trains sent by `send_train`, by `send_train_to`, and datagrams by `send_batch`.
const TRAINS: u32 = 6;

/// The engines that send trains (`auto` kept on `sendmsg(2)`).
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

/// Datagram `n`: its number, then a pattern of it.
fn datagram(n: u32, len: usize) -> Vec<u8> {
    let mut d = n.to_be_bytes().to_vec();
    d.extend((4..len).map(|i| (n as usize * 13 + i) as u8));
    d
}

/// Datagrams `first..first + COUNT` of [`SEG`] bytes (the last 700) as one buffer.
fn train(first: u32) -> Vec<u8> {
    (0..COUNT as u32)
        .flat_map(|d| datagram(first + d, if d as usize + 1 == COUNT { 700 } else { SEG }))
        .collect()
}

/// Sends `TRAINS` trains with `send_train`, `TRAINS` with `send_train_to` (on an unconnected
/// socket's twin), and `TRAINS * COUNT` datagrams with `send_batch`, datagrams numbered in order,
/// through an async sender made by `cfg`; takes every release (overwriting it) and checks it.
fn send_all(name: &str, cfg: SenderConfig) {
    let rt = Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dest: std::net::SocketAddr = "192.0.2.2:9".parse().unwrap();
        let sock = util::connected_udp(dest);
        let tx = AsyncSender::with_config(sock, cfg.clone()).unwrap();
        let unconnected = UdpSocket::bind("192.0.2.1:0").unwrap();
        let tx_to = AsyncSender::with_config(unconnected, cfg).unwrap();
        let per = (TRAINS as usize * COUNT) as u32;
        for t in 0..TRAINS {
            tx.send_train(train(t * COUNT as u32), SEG as u16)
                .await
                .unwrap();
        }
        tx.flush(Duration::from_secs(10)).await.unwrap();
        for t in 0..TRAINS {
            tx_to
                .send_train_to(train(per + t * COUNT as u32), SEG as u16, dest)
                .await
                .unwrap();
        }
        tx_to.flush(Duration::from_secs(10)).await.unwrap();
        let mut batch: VecDeque<Vec<u8>> = (0..per).map(|n| datagram(2 * per + n, SEG)).collect();
        tx.send_batch(&mut batch).await.unwrap();
        tx.flush(Duration::from_secs(10)).await.unwrap();
        // A train the checks refuse comes back with its buffer.
        let zero = tx.send_train(vec![1u8; 100], 0).await;
        assert!(
            matches!(&zero, Err(SendError::Invalid { buf, .. }) if buf.len() == 100),
            "{name}: {zero:?}"
        );

        let mut back = 0;
        for sender in [&tx, &tx_to] {
            while let Some(mut r) = sender.released().await.unwrap() {
                assert!(r.report.error.is_none(), "{name}: {:?}", r.report.error);
                assert_eq!(r.report.bytes, r.buf.len(), "{name}");
                r.buf.fill(0xEE);
                back += 1;
            }
        }
        assert_eq!(
            back,
            2 * TRAINS as usize + per as usize,
            "{name}: buffers back"
        );
        let stats = tx.stats();
        assert_eq!(
            stats.batch_train_buffers,
            u64::from(per),
            "{name}: {stats:?}"
        );
        assert!(stats.trains > u64::from(TRAINS), "{name}: {stats:?}");
        assert_eq!(tx_to.stats().trains, u64::from(TRAINS), "{name}");
        for sender in [tx, tx_to] {
            let closed = sender.close(Duration::from_secs(5)).await;
            assert_eq!((closed.kept, closed.released.len()), (0, 0), "{name}");
        }
    });
}

/// Every datagram of every train, and of the batch that became trains, arrives whole and in
/// order through each engine that sends trains.
#[test]
fn async_trains_arrive_whole_and_in_order() {
    for (name, cfg) in train_engines() {
        let got = over_veth(
            1500,
            libc::IPPROTO_UDP,
            || true,
            |sock| receive_all(&sock, Duration::from_secs(1)),
            || send_all(name, cfg),
        );
        let Some(got) = got else { return };
        let total = 3 * TRAINS as usize * COUNT;
        assert_eq!(got.len(), total, "{name}: datagrams received");
        for (i, data) in got.iter().enumerate() {
            let n = i as u32;
            let last_of_train = i < 2 * TRAINS as usize * COUNT && i % COUNT == COUNT - 1;
            let want = datagram(n, if last_of_train { 700 } else { SEG });
            assert!(
                *data == want,
                "{name}: datagram {i} differs or is out of order"
            );
        }
    }
}
