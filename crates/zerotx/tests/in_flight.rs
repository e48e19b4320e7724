//! What `Sender::in_flight()` and `Sender::outstanding()` count, on real sockets: in flight is
//! what the kernel (or the engine, for the kernel) still holds; outstanding adds the buffers
//! released and waiting for `reap`. Before issue 8 the `copy` and `msg-zc` engines counted their
//! released-but-unreaped buffers as in flight.

mod util;

use std::time::Duration;

use util::{tcp_pair, Peer};
use zerotx::{EngineKind, Sender};

/// `copy` on TCP loopback: a send the kernel took whole is released at once, so it is no longer
/// in flight, but it is outstanding until `reap` hands it back.
#[test]
fn a_copy_send_the_kernel_took_whole_is_outstanding_not_in_flight() {
    let (client, peer) = tcp_pair(false, Peer::default());
    let mut tx = Sender::new(client, EngineKind::Copy).unwrap();
    tx.try_send(vec![0x11; 4096]).unwrap();
    assert_eq!(
        tx.in_flight(),
        0,
        "released at once: the kernel holds nothing"
    );
    assert_eq!(tx.outstanding(), 1, "released, not yet reaped");
    let mut out = Vec::new();
    assert_eq!(tx.reap(&mut out).unwrap(), 1);
    assert_eq!((tx.in_flight(), tx.outstanding()), (0, 0));
    assert_eq!(out[0].report.bytes, 4096);
    drop(tx);
    assert_eq!(peer.join().unwrap().bytes, 4096);
}

/// `msg-zc` on TCP loopback: a send is in flight from its acceptance until the engine reads its
/// completion (never before: nothing reads the error queue in `try_send`); once released it stays
/// outstanding, no longer in flight, until `reap`. Every engine agrees after a flush.
#[test]
fn in_flight_counts_accepted_not_released_and_outstanding_adds_the_unreaped() {
    for &kind in util::engines() {
        let (client, peer) = tcp_pair(false, Peer::default());
        let mut tx = Sender::new(client, kind).unwrap();
        tx.try_send(vec![0x22; 4096]).unwrap();
        if kind == EngineKind::MsgZerocopy {
            // Its completion can only be learned from the error queue, which nothing read yet.
            assert_eq!((tx.in_flight(), tx.outstanding()), (1, 1), "{kind}");
        }
        assert_eq!(tx.outstanding(), 1, "{kind}");
        // Released into the sender's queue, not handed back.
        tx.flush(Duration::from_secs(5)).unwrap();
        assert_eq!(tx.in_flight(), 0, "{kind}: released");
        assert_eq!(tx.outstanding(), 1, "{kind}: released, not yet reaped");
        let mut out = Vec::new();
        assert_eq!(tx.reap(&mut out).unwrap(), 1, "{kind}");
        assert_eq!((tx.in_flight(), tx.outstanding()), (0, 0), "{kind}");
        drop(tx);
        assert_eq!(peer.join().unwrap().bytes, 4096, "{kind}");
    }
}

/// `copy` on UDP loopback: every datagram the kernel took comes back at once with the report and
/// counters a record's release would give (the engine skips the record for a buffer taken whole),
/// one send in 61 timed; a datagram the kernel refuses comes back in the error, uncounted.
#[test]
fn copy_datagrams_come_back_at_once_with_the_full_report() {
    use zerotx::{CopyReason, SendError, SendPath};
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(rx.local_addr().unwrap()).unwrap();
    let mut tx = Sender::new(sock, EngineKind::Copy).unwrap();
    let mut out = Vec::new();
    for i in 0..122u32 {
        tx.try_send(vec![i as u8; 1000 + i as usize]).unwrap();
        assert_eq!((tx.in_flight(), tx.outstanding()), (0, 1), "send {i}");
        assert_eq!(tx.reap(&mut out).unwrap(), 1);
    }
    let bytes: usize = (0..122).map(|i| 1000 + i).sum();
    for (i, r) in out.iter().enumerate() {
        assert_eq!(r.buf.len(), 1000 + i);
        assert_eq!(r.report.bytes, 1000 + i, "whole");
        assert_eq!(r.report.path, SendPath::Copied(CopyReason::Engine));
        assert!(r.report.error.is_none());
        assert_eq!(
            r.report.latency.is_some(),
            i % 61 == 0,
            "send {i}: one in 61 timed"
        );
    }
    let s = tx.stats();
    assert_eq!(
        (s.sends, s.syscalls, s.bytes, s.engine_copied, s.errors),
        (122, 122, bytes as u64, 122, 0),
        "{s:?}"
    );
    // Larger than any UDP datagram: EMSGSIZE, the buffer back untouched, nothing counted as sent.
    match tx.try_send(vec![7; 70_000]) {
        Err(SendError::Io { buf, error }) => {
            assert_eq!(buf.len(), 70_000);
            assert_eq!(error.raw_os_error(), Some(libc::EMSGSIZE), "{error}");
        }
        other => panic!("expected EMSGSIZE, got {other:?}"),
    }
    let s = tx.stats();
    assert_eq!(
        (s.sends, s.syscalls, s.bytes),
        (122, 123, bytes as u64),
        "{s:?}"
    );
    assert_eq!(tx.outstanding(), 0);
}

/// The budget gauges of `Stats`: zero-copy sends a peer that never reads leaves with the kernel
/// are counted while held (and, on io_uring and `auto`, the bytes they pin), against `auto`'s
/// caps; once the peer reads everything, they are back at 0.
#[test]
fn budget_gauges_count_what_the_kernel_holds_and_fall_back_to_zero() {
    for kind in [EngineKind::MsgZerocopy, EngineKind::UringZc] {
        let (client, server) = util::stalled_peer();
        let mut tx = Sender::new(client, kind).unwrap();
        let mut sent = 0;
        while sent < 256 {
            match tx.try_send(vec![7u8; 64 << 10]) {
                Ok(()) => sent += 1,
                Err(zerotx::SendError::WouldBlock(_)) => break,
                Err(e) => panic!("{kind}: {e}"),
            }
        }
        // io_uring counts a request's pages once its first CQE said what it sent.
        let mut out = Vec::new();
        for _ in 0..200 {
            tx.reap(&mut out).unwrap();
            if tx.stats().zerocopy_in_flight > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let held = tx.stats();
        assert!(held.zerocopy_in_flight > 0, "{kind}: {held:?}");
        assert!(held.zerocopy_in_flight <= sent, "{kind}: {held:?}");
        if kind == EngineKind::UringZc {
            assert!(held.pinned_bytes >= 64 << 10, "{kind}: {held:?}");
        }
        assert_eq!(
            (held.cap_sends, held.cap_bytes),
            (None, None),
            "{kind}: no auto"
        );
        let reader = std::thread::spawn(move || util::receive(server, Peer::default()));
        tx.flush(Duration::from_secs(10)).unwrap();
        let done = tx.stats();
        assert_eq!(
            (done.zerocopy_in_flight, done.pinned_bytes),
            (0, 0),
            "{kind}: {done:?}"
        );
        drop(tx.close(Duration::from_secs(5)));
        assert_eq!(reader.join().unwrap().bytes, sent * (64 << 10), "{kind}");
    }
    // `auto` on `sendmsg(2)` shows its cap on sends in flight (from optmem_max) beside them.
    let (client, peer) = tcp_pair(false, Peer::default());
    let cfg = zerotx::SenderConfig::new(EngineKind::Auto).with_auto_uring(false);
    let tx: Sender<Vec<u8>> = Sender::with_config(client, cfg).unwrap();
    let s = tx.stats();
    assert!(s.cap_sends.is_some_and(|c| c > 0), "{s:?}");
    drop(tx);
    peer.join().unwrap();
}
