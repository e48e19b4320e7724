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
