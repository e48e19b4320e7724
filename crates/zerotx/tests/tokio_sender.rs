//! The async sender (feature `tokio`) on real sockets: integrity with a slow reader and immediate
//! overwrite on every engine and both runtimes, many senders on one ring per thread, a peer reset
//! mid-stream, a peer that stops reading, a drop without close on an executor thread, and true
//! zero-copy into the black hole.

mod util;

use std::collections::VecDeque;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Runtime};
use zerotx::tokio::{thread_ring, AsyncSender};
use zerotx::{leaked_buffers, EngineKind, SendError, SenderConfig};

use util::{fill, stalled_peer, tcp_pair, Peer};

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Sends `total` bytes of the stream pattern from `ring` rotating buffers of `block` bytes: each
/// buffer is overwritten the moment it comes back, then refilled, so an early release shows as a
/// mismatch at the reader. Returns how many buffers were released.
async fn pattern_stream(tx: &AsyncSender<Vec<u8>>, total: u64, block: usize, ring: usize) {
    let mut free: Vec<Vec<u8>> = (0..ring).map(|_| vec![0u8; block]).collect();
    let (mut offset, mut sent, mut back) = (0u64, 0u64, 0u64);
    while offset < total {
        let mut buf = match free.pop() {
            Some(b) => b,
            None => {
                let r = tx
                    .released()
                    .await
                    .unwrap()
                    .expect("buffers in flight, so one comes back");
                assert!(r.report.error.is_none(), "{:?}", r.report.error);
                back += 1;
                let mut b = r.buf;
                b.fill(0xEE); // the overwrite an early release would put on the wire
                b
            }
        };
        let n = block.min((total - offset) as usize);
        buf.truncate(n);
        fill(&mut buf, offset);
        tx.send(buf).await.expect("send");
        offset += n as u64;
        sent += 1;
    }
    tx.flush(Duration::from_secs(20)).await.expect("flush");
    while let Some(r) = tx.released().await.unwrap() {
        assert!(r.report.error.is_none());
        back += 1;
    }
    assert_eq!(back, sent, "every buffer came back exactly once");
}

fn integrity(rt: Runtime, name: &str) {
    const TOTAL: u64 = 24 << 20;
    for &kind in util::engines() {
        let peer = Peer::slow(Duration::from_micros(300), 64 << 10);
        let (client, reader) = tcp_pair(false, peer);
        let stats = rt.block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            pattern_stream(&tx, TOTAL, 128 << 10, 8).await;
            let stats = tx.stats();
            let closed = tx.close(Duration::from_secs(5)).await;
            assert_eq!(closed.kept, 0);
            assert!(closed.released.is_empty());
            stats
        });
        let got = reader.join().unwrap();
        assert_eq!(got.bytes, TOTAL, "{name} {kind}: bytes received");
        assert_eq!(
            got.mismatches, 0,
            "{name} {kind}: corrupted at {:?}",
            got.first_mismatch
        );
        assert_eq!(stats.bad_completions, 0, "{name} {kind}: {stats:?}");
        if kind == EngineKind::MsgZerocopy {
            assert_eq!(stats.zerocopy_ids, stats.zerocopy_ids_completed);
        }
    }
}

#[test]
fn integrity_every_engine_current_thread() {
    integrity(current_thread(), "current-thread");
}

#[test]
fn integrity_every_engine_multi_thread() {
    integrity(multi_thread(), "multi-thread");
}

/// Many senders on one ring per runtime thread, all at once, on both runtimes.
#[test]
fn many_senders_share_the_thread_ring() {
    const EACH: u64 = 4 << 20;
    for (name, rt) in [("current", current_thread()), ("multi", multi_thread())] {
        for kind in [EngineKind::Uring, EngineKind::UringZc] {
            let mut readers = Vec::new();
            let mut clients = Vec::new();
            for _ in 0..8 {
                let peer = Peer {
                    verify: true,
                    rcvbuf: Some(64 << 10),
                    pause: Duration::from_micros(200),
                    ..Peer::default()
                };
                let (c, r) = tcp_pair(false, peer);
                clients.push(c);
                readers.push(r);
            }
            rt.block_on(async {
                let mut tasks = Vec::new();
                for c in clients {
                    tasks.push(tokio::spawn(async move {
                        let ring = thread_ring().expect("ring");
                        let cfg = SenderConfig::shared(kind, &ring);
                        let tx = AsyncSender::with_config(c, cfg).expect("sender");
                        pattern_stream(&tx, EACH, 64 << 10, 4).await;
                        tx.close(Duration::from_secs(5)).await.kept
                    }));
                }
                for t in tasks {
                    assert_eq!(t.await.unwrap(), 0, "{name} {kind}: kept at close");
                }
            });
            for r in readers {
                let got = r.join().unwrap();
                assert_eq!(got.bytes, EACH, "{name} {kind}");
                assert_eq!(got.mismatches, 0, "{name} {kind}: {:?}", got.first_mismatch);
            }
        }
    }
}

/// A peer that resets mid-stream: sends fail or buffers come back with the error, and every
/// clone of the shared object comes back (the strong count returns to 1).
#[test]
fn peer_reset_mid_stream_returns_every_buffer() {
    for &kind in util::engines() {
        let object: Arc<[u8]> = vec![0x5Au8; 256 << 10].into();
        let peer = Peer {
            reset_after: Some(1 << 20),
            rcvbuf: Some(64 << 10),
            pause: Duration::from_millis(1),
            ..Peer::default()
        };
        let (client, reader) = tcp_pair(false, peer);
        let (failed_sends, failed_releases) = current_thread().block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            let (mut failed_sends, mut failed_releases) = (0, 0);
            let mut out = Vec::new();
            for _ in 0..64 {
                match tokio::time::timeout(Duration::from_secs(10), tx.send(object.clone())).await {
                    Ok(Ok(())) => {}
                    Ok(Err(SendError::Io { buf, .. })) => {
                        drop(buf);
                        failed_sends += 1;
                        break;
                    }
                    Ok(Err(e)) => panic!("{kind}: {e}"),
                    Err(_) => panic!("{kind}: a send to a reset peer hung"),
                }
                tx.drain_released(&mut out).unwrap();
            }
            let closed = tx.close(Duration::from_secs(10)).await;
            assert_eq!(closed.kept, 0, "{kind}: kept after the peer reset");
            out.extend(closed.released);
            for r in &out {
                if r.report.error.is_some() {
                    failed_releases += 1;
                }
            }
            (failed_sends, failed_releases)
        });
        let got = reader.join().unwrap();
        assert!(got.bytes >= 1 << 20);
        assert!(
            failed_sends + failed_releases > 0,
            "{kind}: the reset was never reported"
        );
        assert_eq!(
            Arc::strong_count(&object),
            1,
            "{kind}: a clone of the object never came back"
        );
    }
}

/// How many 256 KiB buffers `kind` may accept for a [`stalled_peer`]: the socket buffer takes a
/// few; the io_uring engines also queue up to `queue_limit` buffers in userspace and one request
/// of `batch` buffers (a bound by count). (`auto` takes io_uring for TCP here.)
fn stalled_bound(kind: EngineKind) -> usize {
    let cfg = zerotx::UringConfig::default();
    match kind {
        EngineKind::UringZc | EngineKind::Uring | EngineKind::Auto => {
            cfg.queue_limit + cfg.batch + 2
        }
        _ => 32,
    }
}

/// The peer goes away with a reset (SO_LINGER 0).
fn reset(server: TcpStream) {
    socket2::SockRef::from(&server)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
}

/// A peer that stops reading: `send` waits (backpressure) instead of queueing without bound, and
/// everything comes back once the peer goes away.
#[test]
fn stalled_peer_backpressure_then_reset() {
    for kind in [
        EngineKind::Auto,
        EngineKind::MsgZerocopy,
        EngineKind::UringZc,
        EngineKind::Copy,
    ] {
        let (client, server) = stalled_peer();
        let object: Arc<[u8]> = vec![1u8; 256 << 10].into();
        let bound = stalled_bound(kind);
        current_thread().block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            let mut accepted = 0;
            loop {
                let send =
                    tokio::time::timeout(Duration::from_millis(300), tx.send(object.clone()));
                match send.await {
                    Ok(Ok(())) => accepted += 1,
                    Ok(Err(e)) => panic!("{kind}: {e}"),
                    Err(_) => break, // waiting, as it must
                }
                assert!(
                    accepted <= bound,
                    "{kind}: {accepted} buffers accepted by a peer that reads nothing"
                );
            }
            assert!(tx.in_flight() <= accepted);
            // The peer goes away: everything in flight must come back.
            reset(server);
            let closed = tx.close(Duration::from_secs(10)).await;
            assert_eq!(closed.kept, 0, "{kind}");
        });
        assert_eq!(Arc::strong_count(&object), 1, "{kind}: a buffer was lost");
    }
}

/// Dropping a sender with buffers in flight, on an executor thread, does not wait in `Drop`: a
/// task closes it, and the buffers come back once the peer reads.
#[test]
fn drop_without_close_does_not_block_the_executor() {
    for kind in [EngineKind::MsgZerocopy, EngineKind::UringZc] {
        let leaked_before = leaked_buffers();
        let (client, server) = stalled_peer();
        let object: Arc<[u8]> = vec![2u8; 1 << 20].into();
        current_thread().block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            while let Ok(Ok(())) =
                tokio::time::timeout(Duration::from_millis(200), tx.send(object.clone())).await
            {
            }
            assert!(tx.in_flight() > 0, "{kind}: nothing in flight to test with");
            let t = Instant::now();
            drop(tx);
            assert!(
                t.elapsed() < Duration::from_millis(100),
                "{kind}: drop blocked for {:?}",
                t.elapsed()
            );
            // The reader starts only now: the drop's task must still be there to collect.
            let reader = tokio::task::spawn_blocking(move || {
                let mut s = server;
                std::io::copy(&mut s, &mut std::io::sink()).unwrap()
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while Arc::strong_count(&object) > 1 {
                assert!(Instant::now() < deadline, "{kind}: buffers never came back");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(reader.await.unwrap() > 0);
        });
        assert_eq!(leaked_buffers(), leaked_before, "{kind}: buffers leaked");
    }
}

/// Into the black hole (root): UDP that really goes zero-copy, through the async sender.
#[test]
fn black_hole_udp_is_really_zerocopy() {
    util::in_black_hole(65535, |bh| {
        for kind in [EngineKind::MsgZerocopy, EngineKind::UringZc] {
            let rt = current_thread();
            let (zc, n) = rt.block_on(async {
                let sock = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
                sock.connect(bh.v4).await.unwrap();
                let tx = AsyncSender::from_udp(sock, kind).expect("sender");
                let object = bytes::Bytes::from(vec![3u8; 32 << 10]);
                for _ in 0..512 {
                    tx.send(object.clone()).await.expect("send");
                }
                tx.flush(Duration::from_secs(10)).await.expect("flush");
                let (mut zc, mut n) = (0, 0);
                while let Some(r) = tx.released().await.unwrap() {
                    n += 1;
                    zc += r.report.path.is_zerocopy() as u32;
                }
                assert_eq!(tx.close(Duration::from_secs(1)).await.kept, 0);
                (zc, n)
            });
            assert_eq!(n, 512, "{kind}: every datagram's buffer came back");
            assert!(zc > 0, "{kind}: no completion said zero-copy");
        }
    });
}

/// Made outside a runtime: a clear error, not a panic.
#[test]
fn outside_a_runtime_is_an_error() {
    let (client, _reader) = tcp_pair(false, Peer::default());
    let err = AsyncSender::<Vec<u8>>::new(client, EngineKind::MsgZerocopy).unwrap_err();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}

/// A socket that comes from tokio is non-blocking (`O_NONBLOCK`), and io_uring then answers
/// `EAGAIN` instead of parking a send until there is room: every engine must still deliver the
/// whole stream from a tokio `TcpStream` to a slow reader.
#[test]
fn from_tokio_stream_every_engine() {
    const TOTAL: u64 = 8 << 20;
    let rt = current_thread();
    for &kind in util::engines() {
        let peer = Peer::slow(Duration::from_micros(300), 32 << 10);
        let (client, reader) = tcp_pair(false, peer);
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::from_tcp(stream, kind).expect("sender");
            pattern_stream(&tx, TOTAL, 128 << 10, 8).await;
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0);
        });
        let got = reader.join().unwrap();
        assert_eq!(got.bytes, TOTAL, "{kind}: bytes received");
        assert_eq!(got.mismatches, 0, "{kind}: {:?}", got.first_mismatch);
    }
}

/// Bytes the engine still queues after `send` resolved (the io_uring engines' queued buffers, the
/// rest of a short `MSG_ZEROCOPY` write) go out while the owner awaits something else: the
/// driver task makes progress, not the owner's calls. (Without it, the object server sent the
/// first 256 KiB of a 1 MiB body with `uring-zc` and stalled until the client gave up.)
#[test]
fn progress_without_the_owner() {
    const CHUNK: usize = 256 << 10;
    for (name, rt) in [("current", current_thread()), ("multi", multi_thread())] {
        for &kind in util::engines() {
            let peer = Peer::slow(Duration::from_millis(1), 32 << 10);
            let (client, reader) = tcp_pair(false, peer);
            rt.block_on(async {
                let tx = AsyncSender::new(client, kind).expect("sender");
                for i in 0..8u64 {
                    let mut b = vec![0u8; CHUNK];
                    fill(&mut b, i * CHUNK as u64);
                    tx.send(b).await.expect("send");
                }
                // The owner now only sleeps; the driver alone must finish the stream.
                let deadline = Instant::now() + Duration::from_secs(10);
                while tx.in_flight() > 0 {
                    assert!(
                        Instant::now() < deadline,
                        "{name} {kind}: stalled with {} buffers held",
                        tx.in_flight()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let mut out = Vec::new();
                tx.drain_released(&mut out).unwrap();
                assert_eq!(out.len(), 8, "{name} {kind}: every buffer released");
                assert_eq!(tx.close(Duration::from_secs(1)).await.kept, 0);
            });
            let got = reader.join().unwrap();
            assert_eq!(got.bytes, 8 * CHUNK as u64, "{name} {kind}");
            assert_eq!(got.mismatches, 0, "{name} {kind}");
        }
    }
}

/// One task sends while another takes the releases, on the multi-thread runtime.
#[test]
fn send_and_release_from_two_tasks() {
    const N: usize = 2000;
    let rt = multi_thread();
    for kind in [EngineKind::MsgZerocopy, EngineKind::UringZc] {
        let (client, reader) = tcp_pair(false, Peer::default());
        rt.block_on(async {
            let tx = Arc::new(AsyncSender::new(client, kind).expect("sender"));
            let object = bytes::Bytes::from(vec![9u8; 16 << 10]);
            let taker = {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut n = 0;
                    while n < N {
                        match tx.released().await.unwrap() {
                            Some(_) => n += 1,
                            None => tokio::task::yield_now().await,
                        }
                    }
                    n
                })
            };
            for _ in 0..N {
                tx.send(object.clone()).await.expect("send");
            }
            let got = tokio::time::timeout(Duration::from_secs(20), taker)
                .await
                .expect("every release reached the other task")
                .unwrap();
            assert_eq!(got, N);
            let tx = Arc::into_inner(tx).expect("one owner left");
            assert_eq!(tx.close(Duration::from_secs(1)).await.kept, 0);
        });
        assert_eq!(reader.join().unwrap().bytes, (N * (16 << 10)) as u64);
    }
}

/// Waiting costs no CPU: sends blocked on a peer that reads a trickle (so completions and room
/// come now and then, and readiness must be cleared after each), and a wait for releases, each for
/// 500 ms on a current-thread runtime (the driver runs on this thread, so a readiness that is
/// never cleared shows as CPU time here).
#[test]
fn waiting_does_not_spin() {
    const IDLE: Duration = Duration::from_millis(500);
    for kind in [
        EngineKind::Auto,
        EngineKind::Copy,
        EngineKind::MsgZerocopy,
        EngineKind::Uring,
        EngineKind::UringZc,
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        socket2::SockRef::from(&server)
            .set_recv_buffer_size(32 << 10)
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickle = {
            let (mut server, stop) = (server.try_clone().unwrap(), stop.clone());
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if matches!(server.read(&mut buf), Ok(0) | Err(_)) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let object: Arc<[u8]> = vec![4u8; 256 << 10].into();
        current_thread().block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            while let Ok(Ok(())) =
                tokio::time::timeout(Duration::from_millis(200), tx.send(object.clone())).await
            {
            }
            let cpu = zerotx_testbed::thread_cpu_time();
            let _ = tokio::time::timeout(IDLE, async {
                loop {
                    tx.send(object.clone()).await.expect("send");
                }
            })
            .await;
            let spent = zerotx_testbed::thread_cpu_time() - cpu;
            assert!(
                spent < IDLE / 5,
                "{kind}: blocked sends spun: {spent:?} CPU"
            );
            let cpu = zerotx_testbed::thread_cpu_time();
            let _ = tokio::time::timeout(IDLE, async {
                while let Some(r) = tx.released().await.unwrap() {
                    drop(r);
                }
            })
            .await;
            let spent = zerotx_testbed::thread_cpu_time() - cpu;
            assert!(
                spent < IDLE / 5,
                "{kind}: waiting for releases spun: {spent:?} CPU"
            );
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            socket2::SockRef::from(&server)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            drop(server);
            assert_eq!(tx.close(Duration::from_secs(10)).await.kept, 0, "{kind}");
        });
        trickle.join().unwrap();
        assert_eq!(Arc::strong_count(&object), 1, "{kind}");
    }
}

/// Two senders on one ring: one stalled (a peer that reads nothing), one streaming. Every
/// completion of the streaming one wakes the stalled one's driver too (both wait on the ring's
/// fd) with nothing for it: its readiness must be cleared, or it spins for ever once woken.
#[test]
fn a_stalled_sender_on_a_busy_ring_does_not_spin() {
    let rt = current_thread();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let stalled = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    socket2::SockRef::from(&server)
        .set_recv_buffer_size(32 << 10)
        .unwrap();
    let (busy, reader) = tcp_pair(false, Peer::default());
    rt.block_on(async {
        let ring = thread_ring().unwrap();
        let a = AsyncSender::with_config(stalled, SenderConfig::shared(EngineKind::UringZc, &ring))
            .unwrap();
        let b = AsyncSender::with_config(busy, SenderConfig::shared(EngineKind::UringZc, &ring))
            .unwrap();
        let object: Arc<[u8]> = vec![5u8; 256 << 10].into();
        for _ in 0..32 {
            a.send(object.clone()).await.unwrap();
        }
        pattern_stream(&b, 32 << 20, 64 << 10, 8).await;
        assert_eq!(b.close(Duration::from_secs(5)).await.kept, 0);
        assert!(a.in_flight() > 0, "the stalled sender holds nothing");
        let cpu = zerotx_testbed::thread_cpu_time();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let spent = zerotx_testbed::thread_cpu_time() - cpu;
        assert!(
            spent < Duration::from_millis(60),
            "the stalled sender's driver spun: {spent:?} CPU in 300 ms"
        );
        socket2::SockRef::from(&server)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(server);
        assert_eq!(a.close(Duration::from_secs(10)).await.kept, 0);
    });
    assert_eq!(reader.join().unwrap().bytes, 32 << 20);
}

/// `send_batch` on every engine: a stream sent as batches of 16 buffers arrives whole and in
/// order, with each buffer overwritten the moment it comes back (an early release would show at
/// the reader), and every buffer comes back once.
#[test]
fn send_batch_keeps_the_stream_whole_on_every_engine() {
    const BLOCK: usize = 64 << 10;
    const BATCH: usize = 16;
    const TOTAL: u64 = 8 << 20;
    let rt = current_thread();
    for &kind in util::engines() {
        let peer = Peer::slow(Duration::from_micros(300), 64 << 10);
        let (client, reader) = tcp_pair(false, peer);
        rt.block_on(async {
            let tx: AsyncSender<Vec<u8>> = AsyncSender::new(client, kind).expect("sender");
            let mut free: Vec<Vec<u8>> = (0..2 * BATCH).map(|_| vec![0u8; BLOCK]).collect();
            let mut queue = VecDeque::new();
            let (mut offset, mut sent, mut back) = (0u64, 0u64, 0u64);
            while offset < TOTAL {
                while queue.len() < BATCH && offset < TOTAL {
                    let mut buf = match free.pop() {
                        Some(b) => b,
                        None => {
                            let r = tx.released().await.unwrap().expect("buffers in flight");
                            assert!(r.report.error.is_none(), "{kind}: {:?}", r.report.error);
                            back += 1;
                            let mut b = r.buf;
                            b.fill(0xEE);
                            b
                        }
                    };
                    fill(&mut buf, offset);
                    offset += BLOCK as u64;
                    queue.push_back(buf);
                }
                sent += queue.len() as u64;
                tx.send_batch(&mut queue).await.expect("send_batch");
                assert!(queue.is_empty(), "{kind}: resolved with buffers left");
            }
            tx.flush(Duration::from_secs(20)).await.expect("flush");
            while let Some(r) = tx.released().await.unwrap() {
                assert!(r.report.error.is_none());
                back += 1;
            }
            assert_eq!(back, sent, "{kind}: every buffer came back exactly once");
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0, "{kind}");
        });
        let got = reader.join().unwrap();
        assert_eq!(got.bytes, TOTAL, "{kind}: bytes received");
        assert_eq!(got.mismatches, 0, "{kind}: at {:?}", got.first_mismatch);
    }
}

/// `send_batch` to a peer that reads nothing waits (without taking more than the engine may
/// hold), and a future dropped while it waits leaves every buffer it had not handed over in the
/// caller's queue: none lost, none sent twice.
#[test]
fn send_batch_waits_for_room_and_a_dropped_future_keeps_the_rest() {
    const COUNT: usize = 400;
    for kind in [
        EngineKind::Copy,
        EngineKind::MsgZerocopy,
        EngineKind::Uring,
        EngineKind::UringZc,
    ] {
        let (client, server) = stalled_peer();
        let object: Arc<[u8]> = vec![1u8; 256 << 10].into();
        let bound = stalled_bound(kind);
        let mut queue: VecDeque<Arc<[u8]>> = (0..COUNT).map(|_| object.clone()).collect();
        current_thread().block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            let waited =
                tokio::time::timeout(Duration::from_millis(300), tx.send_batch(&mut queue)).await;
            assert!(
                waited.is_err(),
                "{kind}: a peer that reads nothing took it all"
            );
            let accepted = COUNT - queue.len();
            assert!(
                accepted > 0 && accepted <= bound,
                "{kind}: {accepted} buffers accepted by a peer that reads nothing"
            );
            assert_eq!(
                tx.outstanding(),
                accepted,
                "{kind}: the sender holds what it took"
            );
            // The peer goes away: everything accepted comes back, nothing more.
            reset(server);
            let closed = tx.close(Duration::from_secs(10)).await;
            assert_eq!(closed.kept, 0, "{kind}");
            assert_eq!(closed.released.len(), accepted, "{kind}");
        });
        assert_eq!(
            queue.len() + 1,
            Arc::strong_count(&object),
            "{kind}: a buffer was lost"
        );
    }
}

/// A reap that fails part way (the shared ring cannot enter the kernel for another sender's
/// requests) after it collected a release: that buffer is the owner's at once. `released` hands it
/// over, then the error, then `Ok(None)`; it never answers `Ok(None)` (nothing held, every buffer
/// taken) while the buffer waits. The failing `io_uring_enter` is injected: the kernel fails it
/// only on allocation failures. The driver task never runs in between: on a current-thread
/// runtime it runs only when the owner yields, and the owner blocks instead.
#[test]
fn a_release_collected_by_a_failed_reap_is_handed_over_first() {
    use zerotx::internals::uring_faults::{inject, Faults};
    use zerotx::{UringConfig, UringShared};
    let ring = UringShared::new(UringConfig::default().with_entries(8)).unwrap();
    let (client, reader) = tcp_pair(false, Peer::checking());
    current_thread().block_on(async {
        let cfg = SenderConfig::shared(EngineKind::Uring, &ring);
        let tx = AsyncSender::with_config(client, cfg).expect("sender");
        let mut b = vec![0u8; 1000];
        fill(&mut b, 0);
        tx.send(b).await.expect("send");
        // The request completes in the kernel; nothing reaps it (the thread blocks, not yields).
        std::thread::sleep(Duration::from_millis(200));
        // Another owner's requests wait in the SQ, so the next reap enters the kernel, and fails.
        ring.inject_nops(4, false).unwrap();
        inject(Faults {
            failed_enters: 1,
            ..Faults::default()
        });
        let first = tx.released().await;
        inject(Faults::default());
        let r = first
            .expect("the release before the error")
            .expect("Ok(None) while the released buffer waited in the sender");
        assert!(r.report.error.is_none(), "{:?}", r.report);
        assert_eq!(r.report.bytes, 1000);
        let e = tx
            .released()
            .await
            .expect_err("the reap's error, reported next");
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
        assert!(tx.released().await.unwrap().is_none());
        assert_eq!(tx.close(Duration::from_secs(1)).await.kept, 0);
    });
    let got = reader.join().unwrap();
    assert_eq!((got.bytes, got.mismatches), (1000, 0));
}
