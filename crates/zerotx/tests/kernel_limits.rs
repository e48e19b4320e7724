//! The kernel's budgets and refusals: option memory (`optmem_max`) and `RLIMIT_MEMLOCK`
//! answering ENOBUFS, io_uring refused by a seccomp filter. The last two run in a child
//! process of this test binary, since they change the process's limits for good.

mod util;

use std::collections::VecDeque;
use std::net::UdpSocket;
use std::time::Duration;

use util::{finish, pooled_stream, tcp_pair, Peer, MIB};
use zerotx::{CopyReason, EngineKind, Error, SendError, SendPath, Sender, SenderConfig};

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
    util::require!(
        util::is_root(),
        "needs root to drop CAP_IPC_LOCK in a child"
    );
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
