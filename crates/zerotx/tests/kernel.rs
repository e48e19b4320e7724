//! Real-kernel tests: sockets on loopback and in network namespaces these tests create.
//! Each scenario runs over every engine (`util::engines()`).

mod util;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use util::{fill, finish, tcp_pair, Peer};
use zerotx::{
    BufPool, CopyReason, EngineKind, Error, Feature, SendError, SendPath, Sender, SenderConfig,
    UringConfig, UringShared,
};

const MIB: u64 = 1 << 20;

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

/// Every engine, plus `uring-zc` sending from a registered pool (`true`).
fn engine_variants() -> Vec<(EngineKind, bool)> {
    let mut v: Vec<_> = util::engines().iter().map(|&k| (k, false)).collect();
    v.push((EngineKind::UringZc, true));
    v
}

/// Sends `total` bytes of the stream pattern from pooled buffers, overwriting each buffer the
/// moment it comes back. With `register`, the pool is registered with the sender first.
fn pooled_stream(
    tx: &mut Sender<zerotx::PooledBuf>,
    total: u64,
    block: usize,
    count: usize,
    register: bool,
) {
    let pool = BufPool::new(block, count).unwrap();
    if register {
        tx.register_pool(&pool).unwrap();
    }
    let mut free: Vec<_> = (0..count).map(|_| pool.take().unwrap()).collect();
    let mut out = Vec::new();
    let recycle = |out: &mut Vec<zerotx::Released<zerotx::PooledBuf>>,
                   free: &mut Vec<zerotx::PoolBufMut>| {
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            assert_eq!(r.report.bytes, r.buf.len());
            let mut m = r.buf.into_mut();
            m.fill(0xEE); // scribble: an early release would put this on the wire
            free.push(m);
        }
    };
    let mut offset = 0u64;
    while offset < total {
        let Some(mut b) = free.pop() else {
            let n = tx
                .wait_released(&mut out, Some(Duration::from_secs(30)))
                .unwrap();
            assert!(n > 0, "no buffer released within 30 s");
            recycle(&mut out, &mut free);
            continue;
        };
        let len = block.min((total - offset) as usize);
        fill(&mut b[..len], offset);
        tx.send(b.freeze(len)).unwrap();
        offset += len as u64;
        tx.reap(&mut out).unwrap();
        recycle(&mut out, &mut free);
    }
    tx.flush(Duration::from_secs(30)).unwrap();
    tx.reap(&mut out).unwrap();
    recycle(&mut out, &mut free);
    assert_eq!(free.len(), count, "every pooled buffer came back");
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
fn option_memory_enobufs_waits_or_falls_back_and_loses_nothing() {
    util::in_black_hole(65535, |bh| {
        // UDP into the black hole completes in order, and the kernel coalesces in-order
        // completions into the one queued message, so option memory only runs out when not even
        // one completion fits: then each buffer goes by copy.
        zerotx_testbed::set_optmem_max(16).unwrap();
        let mut tx = Sender::connect_udp(bh.v4, EngineKind::MsgZerocopy).unwrap();
        for _ in 0..500 {
            tx.send(vec![3u8; 16000]).unwrap();
        }
        let (released, stats) = finish(tx);
        assert_eq!(released.len(), 500);
        assert!(stats.enobufs >= 500, "{stats:?}");
        assert_eq!(stats.fallbacks, 500, "{stats:?}");
        assert!(released
            .iter()
            .all(|r| r.report.path == SendPath::Copied(CopyReason::Fallback)));
        // The same in a batch (msg-zc's datagram loop): a refused buffer goes by copy in the
        // same call, not back to the caller to retry into the same refusal, so the first call
        // takes buffers (all of them into the black hole, unless the socket buffer fills).
        let mut tx = Sender::connect_udp(bh.v4, EngineKind::MsgZerocopy).unwrap();
        let mut queue: VecDeque<Vec<u8>> = (0..500).map(|_| vec![3u8; 16000]).collect();
        let took = tx.try_send_batch(&mut queue).unwrap();
        assert!(took > 0, "the first batch took nothing: {:?}", tx.stats());
        let mut released = Vec::new();
        util::try_send_all(&mut tx, &mut queue, &mut released);
        let (rest, stats) = finish(tx);
        released.extend(rest);
        assert_eq!(released.len(), 500);
        assert_eq!(stats.fallbacks, 500, "batch: {stats:?}");
        assert!(released
            .iter()
            .all(|r| r.report.path == SendPath::Copied(CopyReason::Fallback)));
        // TCP: completions only come as the peer's ACKs arrive.
        zerotx_testbed::set_optmem_max(2048).unwrap();
        let (client, peer) = tcp_pair(false, Peer::checking());
        let mut tx = Sender::new(client, EngineKind::MsgZerocopy).unwrap();
        pooled_stream(&mut tx, 128 * MIB, 64 * 1024, 64, false);
        let stats = tx.stats();
        drop(tx.close(Duration::from_secs(5)));
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (128 * MIB, 0));
        assert!(stats.enobufs > 0, "tcp: no ENOBUFS, {stats:?}");
    });
}

const MEMLOCK_CHILD: &str = "ZEROTX_MEMLOCK_CHILD";

#[test]
fn locked_memory_limit_enobufs_in_a_child_process() {
    if !util::require(
        util::is_root(),
        "needs root to drop CAP_IPC_LOCK in a child",
    ) {
        return;
    }
    util::run_child_test("memlock_child", MEMLOCK_CHILD);
}

#[test]
#[ignore = "runs in its own process, started by locked_memory_limit_enobufs_in_a_child_process"]
fn memlock_child() {
    if std::env::var(MEMLOCK_CHILD).is_err() {
        return;
    }
    util::limit_locked_memory(32 * 1024);
    for kind in [EngineKind::MsgZerocopy, EngineKind::UringZc] {
        let (client, peer) = tcp_pair(false, Peer::checking());
        let mut cfg = SenderConfig::new(kind);
        if kind == EngineKind::UringZc {
            // The default ring does not fit in 32 KiB of locked memory: say so clearly.
            let (c, _p) = tcp_pair(false, Peer::default());
            let err = Sender::<Vec<u8>>::new(c, kind).unwrap_err().to_string();
            assert!(err.contains("RLIMIT_MEMLOCK"), "{err}");
            cfg.uring.entries = 16;
        }
        let mut tx = Sender::with_config(client, cfg).unwrap();
        // 16 KiB buffers: a few fit in flight under the limit, then ENOBUFS until completions.
        pooled_stream(&mut tx, 64 * MIB, 16 * 1024, 64, false);
        let stats = tx.stats();
        drop(tx.close(Duration::from_secs(5)));
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (64 * MIB, 0), "{kind}");
        if kind == EngineKind::MsgZerocopy {
            assert!(
                stats.enobufs > 0,
                "no ENOBUFS under a 32 KiB limit: {stats:?}"
            );
        }
        // No spin: a refused request is retried zero-copy only after one that held pinned pages
        // finished, so each refusal is paid for by a buffer that went out.
        let out = stats.fallbacks + stats.zerocopy + stats.kernel_copied;
        assert!(stats.enobufs <= out, "{kind}: {stats:?}");
        println!(
            "memlock_child {kind}: enobufs={} fallbacks={} zerocopy={} kernel_copied={}",
            stats.enobufs, stats.fallbacks, stats.zerocopy, stats.kernel_copied
        );
    }
    // Datagrams, many requests in flight, each larger than the limit: none can ever be pinned.
    // They go by copy at once, and no refused request is retried on another refusal's completion.
    util::in_black_hole(65535, |bh| {
        let mut cfg = SenderConfig::new(EngineKind::UringZc);
        cfg.uring.entries = 16;
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.connect(bh.v4).unwrap();
        let mut tx = Sender::with_config(sock, cfg).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        let mut sent = 0;
        while sent < 500 {
            match tx.try_send(vec![5u8; 60000]) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock(_)) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "udp uring-zc: stuck after {sent} sends: {:?}",
                        tx.stats()
                    );
                    tx.wait_released(&mut out, Some(Duration::from_secs(1)))
                        .unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        }
        let (released, stats) = finish(tx);
        assert_eq!(released.len() + out.len(), 500);
        assert!(stats.enobufs <= stats.sends, "udp uring-zc: {stats:?}");
        assert_eq!(stats.fallbacks, 500, "udp uring-zc: {stats:?}");
        println!(
            "memlock_child udp uring-zc: enobufs={} fallbacks={}",
            stats.enobufs, stats.fallbacks
        );
    });
    // auto under 8 KiB: its ring cannot fit (io_uring_setup answers ENOMEM), so it takes
    // sendmsg(2) and says why; its byte cap (half the limit) and its holds after a refusal keep
    // it from retrying into the limit. True zero-copy in the black hole, one-page buffers from a
    // pool: nothing fails, nothing hangs, every buffer comes back.
    util::limit_locked_memory(8 * 1024);
    util::in_black_hole(65535, |bh| {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.connect(bh.v4).unwrap();
        let mut tx = Sender::with_config(sock, SenderConfig::new(EngineKind::Auto)).unwrap();
        let e = tx.explain();
        assert_eq!(e.path, "sendmsg", "{e}");
        assert!(e.to_string().contains("io_uring refused"), "{e}");
        pooled_stream(&mut tx, 8 * MIB, 4096, 64, true);
        let stats = tx.stats();
        let closed = tx.close(Duration::from_secs(5));
        assert_eq!(closed.kept, 0);
        assert_eq!(stats.sends, 2048, "auto: {stats:?}");
        assert_eq!(stats.errors, 0, "auto: {stats:?}");
        // Zero-copy while the user's locked memory (shared with every process of the user:
        // rings of tests running beside this one count) has room, copies held back otherwise:
        // the refusals back off (16, 32, ... sends copied after each), so few sends are refused.
        assert_eq!(
            stats.zerocopy + stats.copied_budget,
            2048,
            "auto: {stats:?}"
        );
        assert!(stats.enobufs <= 16, "auto retried into refusals: {stats:?}");
        println!(
            "memlock_child udp auto: zerocopy={} budget-copied={} enobufs={}",
            stats.zerocopy, stats.copied_budget, stats.enobufs
        );
    });
    println!("memlock_child: ok");
}

const NO_URING_CHILD: &str = "ZEROTX_NO_URING_CHILD";

#[test]
fn io_uring_refused_by_seccomp_gives_a_clear_error_and_probe_knows() {
    util::run_child_test("no_uring_child", NO_URING_CHILD);
}

#[test]
#[ignore = "runs in its own process, started by io_uring_refused_by_seccomp_gives_a_clear_error_and_probe_knows"]
fn no_uring_child() {
    if std::env::var(NO_URING_CHILD).is_err() {
        return;
    }
    util::refuse_io_uring(libc::EPERM as u32);
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let (client, _peer) = tcp_pair(false, Peer::default());
        let err = Sender::<Vec<u8>>::new(client, kind).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{kind}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains("io_uring") && msg.contains("Operation not permitted"),
            "{msg}"
        );
        assert!(msg.contains("use the copy or msg-zc engine"), "{msg}");
    }
    // The other engines are untouched, and auto takes sendmsg(2), saying why.
    let (client, _peer) = tcp_pair(false, Peer::default());
    let mut tx = Sender::new(client, EngineKind::MsgZerocopy).unwrap();
    tx.send(vec![1u8; 4096]).unwrap();
    let (client, _peer) = tcp_pair(false, Peer::default());
    let mut tx = Sender::new(client, EngineKind::Auto).unwrap();
    tx.send(vec![1u8; 64 * 1024]).unwrap();
    let e = tx.explain();
    assert_eq!(e.path, "sendmsg", "{e}");
    assert!(e.to_string().contains("io_uring unavailable"), "{e}");
    let report = zerotx::probe();
    assert!(!report.io_uring.available, "{:?}", report.io_uring);
    assert!(!report.io_uring.send_zc);
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.contains("io_uring is unavailable")),
        "{:?}",
        report.advice
    );
    println!("no_uring_child: ok");
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

#[test]
fn af_unix_is_copy_only_and_says_so() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut b, &mut v).unwrap();
        v.len()
    });
    let mut tx = Sender::new(a, EngineKind::Copy).unwrap();
    assert_eq!(tx.socket_kind().to_string(), "unix-stream");
    tx.send(vec![1u8; 1 << 20]).unwrap();
    let (released, _) = finish(tx);
    assert_eq!(
        released[0].report.path,
        SendPath::Copied(CopyReason::Engine)
    );
    assert_eq!(reader.join().unwrap(), 1 << 20);

    let (a, _b) = UnixStream::pair().unwrap();
    let err = Sender::<Vec<u8>>::new(a, EngineKind::MsgZerocopy).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("unix-stream"), "{err}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    // A closed descriptor.
    let f = std::fs::File::open("/dev/null").unwrap();
    let raw = f.into_raw_fd();
    // SAFETY: raw came from into_raw_fd and is closed exactly once, here.
    assert_eq!(unsafe { libc::close(raw) }, 0);
    // SAFETY: deliberately wraps a closed number; Sender::new must not close it again.
    let closed = unsafe { OwnedFd::from_raw_fd(raw) };
    let err = Sender::<Vec<u8>>::new(closed, EngineKind::Copy).unwrap_err();
    assert!(matches!(err, Error::BadFd { .. }), "{err}");
    assert!(err.to_string().contains("not an open file descriptor"));

    // Not a socket.
    let f = std::fs::File::open("/dev/null").unwrap();
    let err = Sender::<Vec<u8>>::new(f, EngineKind::Copy).unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");

    // A listening socket, and an unconnected stream socket.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let err = Sender::<Vec<u8>>::new(l, EngineKind::Copy).unwrap_err();
    assert!(err.to_string().contains("listening"), "{err}");
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let err = Sender::<Vec<u8>>::new(s, EngineKind::Copy).unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");

    // Zero-length buffers and stream destinations, handed back.
    for &kind in util::engines() {
        let (client, _peer) = tcp_pair(false, Peer::default());
        let mut tx = Sender::new(client, kind).unwrap();
        let err = tx.try_send(Vec::new()).unwrap_err();
        assert!(err.to_string().contains("zero-length"), "{err}");
        let dest: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let err = tx.try_send_to(vec![1], dest).unwrap_err();
        assert!(err.to_string().contains("stream socket"), "{err}");
        assert_eq!(err.into_inner(), vec![1]);
    }

    // Socket kinds: netlink is unknown to zerotx; raw IP refuses SO_ZEROCOPY on this kernel.
    let nl = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::DGRAM,
        None,
    )
    .unwrap();
    let err = Sender::<Vec<u8>>::new(nl, EngineKind::Copy).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    if util::is_root() {
        let raw = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::RAW,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        match Sender::<Vec<u8>>::new(raw, EngineKind::MsgZerocopy) {
            Err(Error::Unsupported { feature, .. }) => {
                assert!(matches!(feature, Feature::MsgZerocopy(_)), "{feature}");
                assert!(feature.to_string().contains("raw4"), "{feature}");
            }
            Ok(_) => {} // a kernel that grants it is fine too
            Err(e) => panic!("{e}"),
        }
    }
}

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

/// Waits until every buffer `tx` holds came back, into `out`.
fn release_all<B: zerotx::SendBuf>(tx: &mut Sender<B>, out: &mut Vec<zerotx::Released<B>>) {
    while tx.outstanding() > 0 {
        let n = tx
            .wait_released(out, Some(Duration::from_secs(10)))
            .unwrap();
        assert!(n > 0, "no release within 10 s");
    }
}

/// A `uring-zc` sender to `dest` on a shared ring of its own with `batch`, whose `enters()` count
/// its `io_uring_enter` calls.
fn uring_zc_on_shared_ring<B: zerotx::SendBuf>(
    dest: SocketAddr,
    batch: usize,
) -> (UringShared, Sender<B>) {
    let ring = UringShared::new(UringConfig::default().with_batch(batch)).unwrap();
    let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
    sock.connect(dest).unwrap();
    let tx = Sender::with_config(sock, SenderConfig::shared(EngineKind::UringZc, &ring)).unwrap();
    (ring, tx)
}

/// Black-hole sends complete inside the `io_uring_enter` that submits them, so every reap finds
/// nothing in flight. A `send` loop then enters for the first send after the reap alone (so that
/// a lone send goes at once) and again for the rest at the next reap; `send_batch` enters once per
/// full batch, and once at its end for what a short batch left, before it returns.
#[test]
fn send_batch_enters_io_uring_once_per_batch_and_leaves_nothing_behind() {
    util::in_black_hole(65535, |bh| {
        const BATCH: usize = 8;
        let rounds = 20u64;
        let (ring, mut tx) = uring_zc_on_shared_ring(bh.v4, BATCH);
        let mut out = Vec::new();

        let before = ring.enters();
        for _ in 0..rounds {
            for _ in 0..BATCH {
                tx.send(vec![0x11; 1000]).unwrap();
            }
            release_all(&mut tx, &mut out);
        }
        let by_send = ring.enters() - before;

        let before = ring.enters();
        for _ in 0..rounds {
            let mut batch: VecDeque<Vec<u8>> = (0..BATCH).map(|_| vec![0x22; 1000]).collect();
            tx.send_batch(&mut batch).unwrap();
            assert!(batch.is_empty(), "every buffer accepted");
            release_all(&mut tx, &mut out);
        }
        let by_batch = ring.enters() - before;
        eprintln!("{rounds} rounds of {BATCH}: {by_send} enters by send, {by_batch} by send_batch");
        assert_eq!(by_batch, rounds, "one io_uring_enter per full batch");
        assert!(
            by_send > by_batch,
            "{by_send} enters by send, {by_batch} by batch"
        );

        // A short batch with nothing in flight is entered before `send_batch` returns: nothing
        // waits in the SQ for a call that may never come.
        let before = ring.enters();
        let mut batch: VecDeque<Vec<u8>> = (0..3).map(|_| vec![0x33; 1000]).collect();
        tx.send_batch(&mut batch).unwrap();
        assert_eq!(
            ring.enters(),
            before + 1,
            "the short batch was entered at its end"
        );
        release_all(&mut tx, &mut out);

        // A batch and a half: the tail is entered at the end although the full batch before it
        // is still in flight (its completions not reaped), so it too is with the kernel when
        // `send_batch` returns.
        let before = ring.enters();
        let mut batch: VecDeque<Vec<u8>> = (0..12).map(|_| vec![0x44; 1000]).collect();
        tx.send_batch(&mut batch).unwrap();
        assert_eq!(
            ring.enters(),
            before + 2,
            "one full batch, then the tail at the end"
        );
        let total = 2 * rounds * BATCH as u64 + 3 + 12;
        assert_eq!(tx.stats().syscalls, total);

        let (released, stats) = finish(tx);
        out.extend(released);
        assert_eq!(out.len() as u64, total, "every buffer back");
        assert!(out.iter().all(|r| r.report.error.is_none()), "{stats:?}");
        assert_eq!(stats.zerocopy, out.len() as u64, "{stats:?}");
    });
}

/// `send_batch` stops at the first buffer that fails: it comes back in the error, the ones after
/// it stay in the caller's queue, the ones before it were sent and come back released.
#[test]
fn send_batch_stops_at_a_failing_buffer_and_keeps_the_rest() {
    util::in_black_hole(65535, |bh| {
        for &kind in util::engines() {
            let mut tx = Sender::connect_udp(bh.v4, kind).unwrap();
            let mut batch: VecDeque<Vec<u8>> =
                [vec![1; 100], vec![2; 200], Vec::new(), vec![4; 400]].into();
            match tx.send_batch(&mut batch) {
                Err(SendError::Invalid { buf, .. }) => assert!(buf.is_empty(), "{kind}"),
                other => panic!("{kind}: {other:?}"),
            }
            assert_eq!(batch, VecDeque::from([vec![4u8; 400]]), "{kind}");
            let (released, _) = finish(tx);
            let mut sizes: Vec<usize> = released.iter().map(|r| r.report.bytes).collect();
            sizes.sort_unstable();
            assert_eq!(sizes, [100, 200], "{kind}");
            assert!(released.iter().all(|r| r.report.error.is_none()), "{kind}");
        }
        // On io_uring, what the batch accepted before the failure is entered as it returns, and
        // the batch is over: a lone send after it goes at once.
        let (ring, mut tx) = uring_zc_on_shared_ring(bh.v4, 8);
        let mut batch: VecDeque<Vec<u8>> = [vec![1; 100], vec![2; 200], Vec::new()].into();
        let before = ring.enters();
        assert!(tx.send_batch(&mut batch).is_err());
        assert_eq!(ring.enters(), before + 1, "the two accepted were entered");
        let mut out = Vec::new();
        release_all(&mut tx, &mut out);
        let before = ring.enters();
        tx.send(vec![3; 300]).unwrap();
        assert_eq!(
            ring.enters(),
            before + 1,
            "a lone send after the failed batch went at once"
        );
        let (released, _) = finish(tx);
        assert_eq!(out.len() + released.len(), 3);
    });
}

/// `copy` sends a batch on a byte stream in few system calls, one `sendmsg` of up to 32 buffers'
/// bytes; datagrams one call each (`sendmmsg` would drop errors: see
/// `a_refused_datagram_in_a_batch_is_reported_not_swallowed`). Every byte arrives in order, every
/// datagram whole and in order, every buffer comes back once and whole; an empty buffer in the
/// middle stops the batch there. The stream checks also hold `auto` (over loopback it copies:
/// buffers under 16 KiB by the same gathered `sendmsg`, larger ones as io_uring requests, mixed
/// here in one stream) and `uring` (a batch enters its queue whole, a request per 32 buffers).
#[test]
fn copy_gathers_a_batch_into_few_system_calls() {
    // A stream, sizes that line up with nothing: to a reader that keeps up, and to a slow one
    // behind a small send buffer, which makes the kernel take part of a gathered write again and
    // again (the rest of the cut buffer finishes before the next gather).
    for (kind, slow) in [EngineKind::Copy, EngineKind::Auto, EngineKind::Uring]
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
    {
        let reader = match slow {
            true => Peer::slow(Duration::from_micros(200), 64 << 10),
            false => Peer::checking(),
        };
        let (client, peer) = tcp_pair(false, reader);
        if slow {
            socket2::SockRef::from(&client)
                .set_send_buffer_size(32 << 10)
                .unwrap();
        }
        let mut tx = Sender::new(client, kind).unwrap();
        let sizes: Vec<usize> = (0..600).map(|i| 1 + (i * 7919) % 20000).collect();
        let mut offset = 0u64;
        let mut batch: VecDeque<Vec<u8>> = sizes
            .iter()
            .map(|&n| {
                let mut b = vec![0; n];
                fill(&mut b, offset);
                offset += n as u64;
                b
            })
            .collect();
        tx.send_batch(&mut batch).unwrap();
        let (released, stats) = finish(tx);
        assert_eq!(released.len(), sizes.len(), "{kind}");
        assert!(
            released
                .iter()
                .all(|r| r.report.error.is_none() && r.report.bytes == r.buf.len()),
            "{kind}"
        );
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (offset, 0), "{kind}: {got:?}");
        eprintln!(
            "{kind} stream (slow reader: {slow}): {} buffers in {} system calls or requests, {} \
             waits for room",
            stats.sends, stats.syscalls, stats.would_block
        );
        if slow && kind == EngineKind::Copy {
            // The io_uring engines wait for room in a request, not in the caller.
            assert!(stats.would_block > 0, "the socket never filled: {stats:?}");
        } else if !slow {
            assert!(
                stats.syscalls < stats.sends / 4,
                "{kind}: not gathered: {stats:?}"
            );
        }
    }

    // Datagrams: each buffer one datagram, boundaries and order kept. Small ones (100-765 B):
    // the receive buffer is capped by rmem_max (about 416 KiB by default), and all 96 sit in it
    // at once with their skb overhead.
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    socket2::SockRef::from(&rx)
        .set_recv_buffer_size(4 << 20)
        .unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(rx.local_addr().unwrap()).unwrap();
    let mut tx = Sender::new(sock, EngineKind::Copy).unwrap();
    let mut batch: VecDeque<Vec<u8>> = (0..96).map(|i| vec![i as u8; 100 + 7 * i]).collect();
    tx.send_batch(&mut batch).unwrap();
    let (released, stats) = finish(tx);
    assert_eq!(released.len(), 96);
    let mut buf = vec![0u8; 65536];
    for i in 0..96 {
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(n, 100 + 7 * i, "datagram {i}");
        assert!(buf[..n].iter().all(|&b| b == i as u8), "datagram {i}");
    }
    assert_eq!(stats.syscalls, 96, "one call per datagram: {stats:?}");

    // An empty buffer in the middle of a stream batch: the ones before it go, it comes back
    // refused, the one after it stays queued.
    for kind in [EngineKind::Copy, EngineKind::Auto, EngineKind::Uring] {
        let (client, peer) = tcp_pair(false, Peer::checking());
        let mut tx = Sender::new(client, kind).unwrap();
        let (mut a, mut b) = (vec![0; 3000], vec![0; 5000]);
        fill(&mut a, 0);
        fill(&mut b, 3000);
        let mut batch: VecDeque<Vec<u8>> = [a, b, Vec::new(), vec![9; 10]].into();
        match tx.send_batch(&mut batch) {
            Err(SendError::Invalid { buf, .. }) => assert!(buf.is_empty(), "{kind}"),
            other => panic!("{kind}: {other:?}"),
        }
        assert_eq!(batch, [vec![9u8; 10]], "{kind}");
        let (released, stats) = finish(tx);
        assert_eq!(released.len(), 2, "{kind}");
        assert_eq!(
            stats.syscalls, 1,
            "{kind}: the two went in one call: {stats:?}"
        );
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (8000, 0), "{kind}");
    }
}

/// A stream keeps one request in flight, which never fills a batch: inside `send_batch` each
/// next request is entered as soon as the one before it completed, as with `send`, not held
/// back until the queue fills and the sender has to wait (`Stats::would_block`).
#[test]
fn a_batch_on_a_stream_does_not_hold_its_requests_back() {
    let (client, peer) = tcp_pair(false, Peer::default());
    let cfg =
        SenderConfig::new(EngineKind::Uring).with_uring(UringConfig::default().with_queue_limit(4));
    let mut tx = Sender::with_config(client, cfg).unwrap();
    let mut batch: VecDeque<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1000]).collect();
    tx.send_batch(&mut batch).unwrap();
    let waits = tx.stats().would_block;
    let (released, _) = finish(tx);
    assert_eq!(released.len(), 64);
    let got = peer.join().unwrap();
    assert_eq!(got.bytes, 64 * 1000);
    eprintln!("64 buffers through a queue of 4: {waits} waits");
    assert!(
        waits <= 4,
        "{waits} waits for a full queue: requests held back"
    );
}

/// A buffer whose `as_bytes` panics on demand: user code failing in the middle of a batch.
struct Panicky(Vec<u8>, bool);

// SAFETY: as for `Vec<u8>`: a heap allocation that does not move and that nobody changes.
unsafe impl zerotx::SendBuf for Panicky {
    fn as_bytes(&self) -> &[u8] {
        assert!(!self.1, "a buffer that panics");
        &self.0
    }
}

/// A panic in the middle of `send_batch` still ends the batch: what it pushed is entered as the
/// panic leaves, and a lone send after it goes at once instead of waiting for a full batch.
#[test]
fn a_batch_that_panics_still_ends() {
    util::in_black_hole(65535, |bh| {
        let (ring, mut tx) = uring_zc_on_shared_ring(bh.v4, 8);
        let mut batch: VecDeque<Panicky> =
            [Panicky(vec![1; 100], false), Panicky(vec![2; 100], true)].into();
        let before = ring.enters();
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tx.send_batch(&mut batch)));
        assert!(r.is_err(), "the second buffer panics");
        assert_eq!(
            ring.enters(),
            before + 1,
            "the first buffer was entered on the way out"
        );
        let mut out = Vec::new();
        release_all(&mut tx, &mut out);
        assert_eq!(out.len(), 1);

        let before = ring.enters();
        tx.send(Panicky(vec![3; 100], false)).unwrap();
        assert_eq!(
            ring.enters(),
            before + 1,
            "a lone send after the batch went at once"
        );
        let (released, _) = finish(tx);
        assert_eq!(released.len(), 1);
    });
}

/// `try_send_batch` takes what fits and leaves the rest in the caller's queue, without blocking
/// and without an error; an event loop that waits on `readiness` and calls it again gets the
/// whole stream through, in order, on every engine.
#[test]
fn try_send_batch_takes_what_fits_and_leaves_the_rest() {
    const BLOCK: usize = 64 << 10;
    // More than the io_uring engines queue in userspace (`queue_limit` 256, plus a request).
    const COUNT: usize = 512;
    for &kind in util::engines() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut tx = Sender::new(client, kind).unwrap();
        let mut queue: VecDeque<Vec<u8>> = (0..COUNT)
            .map(|i| {
                let mut b = vec![0; BLOCK];
                fill(&mut b, (i * BLOCK) as u64);
                b
            })
            .collect();
        let first = tx.try_send_batch(&mut queue).unwrap();
        assert!(
            first > 0 && first < COUNT,
            "{kind}: a peer that reads nothing took {first} of {COUNT} x 64 KiB at once"
        );
        assert_eq!(queue.len(), COUNT - first, "{kind}");
        // The reader starts only now, so the first call met a peer that reads nothing whatever
        // the machine's load.
        let slow = Peer::slow(Duration::from_micros(500), 64 << 10);
        let peer = std::thread::spawn(move || util::receive(server, slow));
        let mut out = Vec::new();
        util::try_send_all(&mut tx, &mut queue, &mut out);
        let (rest, _) = finish(tx);
        out.extend(rest);
        assert_eq!(out.len(), COUNT, "{kind}: every buffer back once");
        assert!(out.iter().all(|r| r.report.error.is_none()), "{kind}");
        let got = peer.join().unwrap();
        assert_eq!(got.bytes, (COUNT * BLOCK) as u64, "{kind}");
        assert_eq!(got.mismatches, 0, "{kind}: at {:?}", got.first_mismatch);
    }
}
