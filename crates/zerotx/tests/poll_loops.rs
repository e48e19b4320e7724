//! A caller's own event loop over the non-blocking calls (`try_send`, `reap`, `readiness`):
//! it drives every engine, and never sleeps forever when the zero-copy budget is full.

mod util;

use std::time::Duration;

use util::{tcp_pair, Peer, MIB};
use zerotx::{EngineKind, Sender};

#[test]
fn an_external_poll_loop_drives_every_engine_with_the_non_blocking_calls() {
    for &kind in util::engines() {
        let (client, peer) = tcp_pair(
            false,
            Peer {
                verify: true,
                rcvbuf: Some(128 * 1024),
                // A slow reader: the socket fills, so the loop must wait and be woken.
                pause: Duration::from_millis(1),
                ..Peer::default()
            },
        );
        let mut tx = Sender::new(client, kind).unwrap();
        let total = 48 * MIB;
        let waits = util::poll_loop(&mut tx, total, 64 * 1024, Duration::ZERO);
        assert!(waits > 0, "{kind}: the loop never had to wait");
        drop(tx.close(Duration::from_secs(5)));
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (total, 0), "{kind}");
    }
}

/// Defect 7: a caller's own poll loop that reaps before it waits. When a send is handed back
/// because the zero-copy budget is full and the reap then drains every completion, nothing is
/// left to raise POLLERR: the readiness must then ask for what can still come (room), or the
/// loop sleeps forever.
#[test]
fn a_poll_loop_that_reaps_before_waiting_never_sleeps_forever() {
    util::require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        // Option memory for a couple of completions only: sends hit ENOBUFS with ids in flight.
        zerotx_testbed::set_optmem_max(1024).unwrap();
        for &kind in util::engines() {
            let (client, peer) = tcp_pair(false, Peer::checking());
            let mut tx = Sender::new(client, kind).unwrap();
            let total = 32 * MIB;
            // The caller does other work before it reaps a handed-back send: every completion
            // the send waited for arrives meanwhile, and the reap drains them all.
            util::poll_loop(&mut tx, total, 64 * 1024, Duration::from_millis(2));
            let stats = tx.stats();
            drop(tx.close(Duration::from_secs(5)));
            let got = peer.join().unwrap();
            assert_eq!((got.bytes, got.mismatches), (total, 0), "{kind}");
            if kind == EngineKind::MsgZerocopy {
                assert!(stats.enobufs > 0, "the budget never ran out: {stats:?}");
            }
        }
    })
    .unwrap();
}
