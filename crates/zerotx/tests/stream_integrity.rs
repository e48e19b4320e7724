//! The byte stream arrives whole and in order while every buffer is overwritten the instant it
//! comes back: 1 GiB over loopback, short writes, a slow reader that keeps the socket buffer
//! full. Over every engine, and `uring-zc` from a registered pool.

mod util;

use std::time::Duration;

use util::{pooled_stream, tcp_pair, Peer, MIB};
use zerotx::{EngineKind, Sender};

/// Every engine, plus `uring-zc` sending from a registered pool (`true`).
fn engine_variants() -> Vec<(EngineKind, bool)> {
    let mut v: Vec<_> = util::engines().iter().map(|&k| (k, false)).collect();
    v.push((EngineKind::UringZc, true));
    v
}

#[test]
fn integrity_1gib_tcp_loopback_with_immediate_overwrite() {
    for (kind, registered) in engine_variants() {
        let (client, peer) = tcp_pair(false, Peer::checking());
        let mut tx = Sender::new(client, kind).unwrap();
        pooled_stream(&mut tx, 1024 * MIB, 256 * 1024, 16, registered);
        let stats = tx.stats();
        drop(tx.close(Duration::from_secs(5)));
        let got = peer.join().unwrap();
        assert_eq!(got.bytes, 1024 * MIB, "{kind}");
        assert_eq!(
            got.mismatches, 0,
            "{kind}: first bad byte at {:?}",
            got.first_mismatch
        );
        assert_eq!(stats.bytes, 1024 * MIB);
    }
}

/// Sends `total` bytes from a pool of `count` buffers of `block` bytes through `kind` to a reader
/// slower than the sender (small `SO_RCVBUF`, a pause between reads) with a small send buffer,
/// overwriting each buffer the moment it comes back; asserts the peer got every byte intact.
fn slow_stream(
    kind: EngineKind,
    registered: bool,
    total: u64,
    block: usize,
    count: usize,
    pause: Duration,
    rcvbuf: usize,
) -> zerotx::Stats {
    let (client, peer) = tcp_pair(
        false,
        Peer {
            verify: true,
            pause,
            rcvbuf: Some(rcvbuf),
            ..Peer::default()
        },
    );
    socket2::SockRef::from(&client)
        .set_send_buffer_size(64 * 1024)
        .unwrap();
    let mut tx = Sender::new(client, kind).unwrap();
    pooled_stream(&mut tx, total, block, count, registered);
    let stats = tx.stats();
    drop(tx.close(Duration::from_secs(5)));
    let got = peer.join().unwrap();
    assert_eq!(
        (got.bytes, got.mismatches),
        (total, 0),
        "{kind} registered={registered}: first bad byte at {:?}, {stats:?}",
        got.first_mismatch
    );
    assert_eq!(stats.bad_completions, 0, "{kind}: {stats:?}");
    stats
}

#[test]
fn short_writes_hold_the_buffer_until_every_part_completed() {
    // A slow reader keeps the socket buffer full: the shape that reorders io_uring streams.
    for (kind, registered) in engine_variants() {
        let stats = slow_stream(
            kind,
            registered,
            64 * MIB,
            4 << 20,
            3,
            Duration::from_millis(1),
            64 * 1024,
        );
        // io_uring sends with MSG_WAITALL: the kernel finishes short writes itself.
        if matches!(kind, EngineKind::Copy | EngineKind::MsgZerocopy) {
            assert!(
                stats.syscalls > stats.sends,
                "{kind}: expected short writes, stats {stats:?}"
            );
        }
    }
}

/// The test that catches early release on TCP: a reader slower than the sender keeps the socket
/// buffer full, so a buffer sits in the kernel (pinned by zero-copy, or queued in an io_uring
/// request) long after its send returned, and each buffer is scribbled over the instant it comes
/// back. A release one completion early puts 0xEE bytes on the wire.
#[test]
fn slow_reader_integrity_with_immediate_overwrite() {
    for (kind, registered) in engine_variants() {
        let stats = slow_stream(
            kind,
            registered,
            24 * MIB,
            64 * 1024,
            8,
            Duration::from_micros(500),
            32 * 1024,
        );
        if kind == EngineKind::MsgZerocopy {
            assert_eq!(
                stats.zerocopy_ids, stats.zerocopy_ids_completed,
                "{stats:?}"
            );
        }
    }
}
