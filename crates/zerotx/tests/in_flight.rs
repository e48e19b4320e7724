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
