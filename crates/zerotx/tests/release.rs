//! Every buffer comes back, and never early: a peer that resets mid-transfer, a sender closed
//! with buffers in flight, every owned buffer type, a send timeout. Over every engine.

mod util;

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use util::{fill, finish, tcp_pair, Peer, MIB};
use zerotx::{EngineKind, SendError, Sender};

#[test]
fn peer_reset_mid_transfer_fails_clearly_and_returns_every_buffer() {
    for &kind in util::engines() {
        let (client, peer) = tcp_pair(
            false,
            Peer {
                reset_after: Some(8 * MIB),
                ..Peer::default()
            },
        );
        let mut tx = Sender::new(client, kind).unwrap();
        let (mut created, mut back) = (0usize, 0usize);
        let mut failure = None;
        let mut out = Vec::new();
        for _ in 0..4000 {
            let mut buf = vec![7u8; 256 * 1024];
            buf[..8].copy_from_slice(&(created as u64).to_le_bytes());
            created += 1;
            match tx.send(buf) {
                Ok(()) => {}
                Err(SendError::Io { buf, error }) => {
                    assert_eq!(buf.len(), 256 * 1024);
                    back += 1;
                    failure = Some(error);
                    break;
                }
                Err(e) => panic!("{kind}: unexpected {e}"),
            }
            tx.reap(&mut out).unwrap();
        }
        let err = failure.unwrap_or_else(|| panic!("{kind}: 1 GB sent to a reset peer"));
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
            "{kind}: {err}"
        );
        let what = format!("{kind}: buffers stuck after reset");
        util::flush_after_faults(&mut tx, Duration::from_secs(10), &what);
        tx.reap(&mut out).unwrap();
        back += out.len();
        // Once a buffer came back short or failed, the stream is over: every buffer after it
        // carries no bytes, and the bytes reported sent cover at least what the peer read.
        let seq = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
        out.sort_by_key(|r| seq(&r.buf));
        let reported: u64 = out.iter().map(|r| r.report.bytes as u64).sum();
        let cut = out
            .iter()
            .position(|r| r.report.error.is_some() || r.report.bytes < 256 * 1024);
        if let Some(i) = cut {
            assert!(
                out[i].report.error.is_some(),
                "{kind}: a short release says why"
            );
            assert!(
                out[i + 1..].iter().all(|r| r.report.bytes == 0),
                "{kind}: bytes reported sent after the stream broke"
            );
        }
        assert_eq!(back, created, "{kind}: every buffer handed back");
        assert_eq!(tx.outstanding(), 0);
        let got = peer.join().unwrap();
        assert!(
            reported >= got.bytes,
            "{kind}: the peer read {} bytes but releases report {reported}",
            got.bytes
        );
    }
}

#[test]
fn closing_with_buffers_in_flight_keeps_them() {
    // A peer that never reads: unsent zero-copy data stays pinned in the socket buffer.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (_idle_peer, _) = listener.accept().unwrap();
    let mut tx = Sender::new(client, EngineKind::MsgZerocopy).unwrap();
    let mut accepted = 0;
    loop {
        match tx.try_send(vec![9u8; 256 * 1024]) {
            Ok(()) => accepted += 1,
            Err(SendError::WouldBlock(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(accepted > 0);
    let before = zerotx::leaked_buffers();
    let closed = tx.close(Duration::from_millis(200));
    assert!(closed.kept > 0, "nothing kept: the peer never read");
    assert_eq!(closed.kept + closed.released.len(), accepted);
    assert!(zerotx::leaked_buffers() >= before + closed.kept as u64);
}

/// Sends one of each owned buffer type through `kind` and checks it comes back unchanged.
fn round_trip<B: zerotx::SendBuf + PartialEq + std::fmt::Debug>(kind: EngineKind, make: fn() -> B) {
    let (client, peer) = tcp_pair(false, Peer::default());
    let mut tx = Sender::new(client, kind).unwrap();
    for _ in 0..8 {
        tx.send(make()).unwrap();
    }
    let (released, _) = finish(tx);
    assert_eq!(released.len(), 8, "{kind}");
    for r in released {
        assert_eq!(r.buf, make(), "{kind}: the buffer came back changed");
        assert_eq!(r.report.bytes, make().as_bytes().len());
    }
    assert_eq!(peer.join().unwrap().bytes, 8 * 100_000);
}

#[test]
fn every_owned_buffer_type_goes_and_comes_back() {
    for &kind in util::engines() {
        round_trip(kind, || vec![1u8; 100_000]);
        round_trip(kind, || vec![2u8; 100_000].into_boxed_slice());
        round_trip(kind, || bytes::Bytes::from(vec![3u8; 100_000]));
        round_trip(kind, || std::sync::Arc::<[u8]>::from(vec![4u8; 100_000]));
        round_trip(kind, || -> &'static [u8] {
            static DATA: [u8; 100_000] = [5u8; 100_000];
            &DATA
        });
    }
}

/// `send_timeout` on a socket whose peer reads slowly: once the socket (and, for io_uring, the
/// queue) is full it gives the very buffer back in `WouldBlock` at its deadline instead of
/// waiting for the peer; everything accepted before still arrives.
#[test]
fn send_timeout_hands_the_buffer_back_when_the_peer_falls_behind() {
    for &kind in util::engines() {
        let peer = Peer {
            verify: true,
            // A pause per read, not a tiny receive buffer: a window smaller than the loopback
            // MSS leaves large writes to TCP's persist timer (minutes of zero-window probes).
            pause: Duration::from_millis(50),
            ..Peer::default()
        };
        let (client, rx) = tcp_pair(false, peer);
        socket2::SockRef::from(&client)
            .set_send_buffer_size(16 << 10)
            .unwrap();
        let mut tx = Sender::new(client, kind).unwrap();
        let mut offset = 0u64;
        let mut gave_back = None;
        for _ in 0..10_000 {
            let mut buf = vec![0u8; 4096];
            fill(&mut buf, offset);
            match tx.send_timeout(buf, Duration::from_millis(5)) {
                Ok(()) => offset += 4096,
                Err(SendError::WouldBlock(b)) => {
                    gave_back = Some(b);
                    break;
                }
                Err(e) => panic!("{kind}: {e}"),
            }
        }
        let b = gave_back.unwrap_or_else(|| panic!("{kind}: 40 MB accepted from a stalled peer"));
        let mut want = vec![0u8; 4096];
        fill(&mut want, offset);
        assert_eq!(b, want, "{kind}: the buffer came back as it went in");
        let (_, stats) = finish(tx);
        let got = rx.join().unwrap();
        assert_eq!(got.bytes, offset, "{kind}");
        assert_eq!(got.first_mismatch, None, "{kind}");
        assert!(stats.sends > 0, "{kind}");
    }
}
