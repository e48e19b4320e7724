//! The async sender's driver on io_uring (feature `tokio`): a submission that keeps failing is
//! retried with a growing pause, not in a loop that keeps the executor busy; senders sharing a
//! thread's ring wake only for their own completions.

mod util;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::runtime::Builder;
use zerotx::internals::uring_faults::{inject, Faults};
use zerotx::tokio::{thread_ring, AsyncSender};
use zerotx::{EngineKind, SenderConfig, UringConfig, UringShared};

use util::{tcp_pair, Peer};

/// Every `io_uring_enter` of the runtime's thread fails (`EAGAIN`, as when the kernel is short of
/// memory for a request) for 500 ms while a buffer waits to be submitted: the driver must not
/// spin on it (the driver runs on this thread, so spinning shows as CPU time here). Once the
/// kernel takes submissions again, the buffer goes and comes back.
#[test]
fn a_submission_that_keeps_failing_does_not_spin() {
    const FAILING: Duration = Duration::from_millis(500);
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let (client, reader) = tcp_pair(false, Peer::checking());
        let rt = Builder::new_current_thread().enable_all().build().unwrap();
        let object: Arc<[u8]> = vec![0u8; 64 << 10].into();
        rt.block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            inject(Faults {
                failed_enters: u32::MAX,
                enter_errno: libc::EAGAIN,
                ..Faults::default()
            });
            tx.send(object.clone()).await.expect("queued");
            let cpu = zerotx_testbed::thread_cpu_time();
            tokio::time::sleep(FAILING).await;
            let spent = zerotx_testbed::thread_cpu_time() - cpu;
            inject(Faults::default());
            assert!(
                spent < FAILING / 5,
                "{kind}: the driver spun on a failing io_uring_enter: {spent:?} CPU in {FAILING:?}"
            );
            // The failure was reported to the owner's next wait, and the buffer went later.
            let mut flushed = tx.flush(Duration::from_secs(5)).await;
            if matches!(&flushed, Err(zerotx::Error::Io { .. })) {
                flushed = tx.flush(Duration::from_secs(5)).await;
            }
            flushed.unwrap_or_else(|e| panic!("{kind}: {e}"));
            let closed = tx.close(Duration::from_secs(5)).await;
            assert_eq!(closed.kept, 0, "{kind}");
        });
        assert_eq!(
            Arc::strong_count(&object),
            1,
            "{kind}: the buffer never came back"
        );
        // The test pattern is not what was sent: only the byte count matters here.
        assert_eq!(reader.join().unwrap().bytes, 64 << 10, "{kind}");
    }
}

/// A loopback TCP connection whose peer does not read, with small buffers, so a request of more
/// than a few dozen KiB parks in the kernel. Returns the sending side and the peer.
fn stalled_pair(l: &TcpListener) -> (TcpStream, TcpStream) {
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (p, _) = l.accept().unwrap();
    SockRef::from(&c).set_send_buffer_size(4 << 10).unwrap();
    SockRef::from(&p).set_recv_buffer_size(4 << 10).unwrap();
    (c, p)
}

/// Issue 34 item 7: senders on one `thread_ring` whose requests are parked (peers that do not
/// read) must not be woken by the completions of another sender streaming on the same ring. Each
/// driver used to register its own duplicate of the ring's fd with tokio, so every completion
/// batch woke every driver on the thread (and each looked again every few ms besides). Counted,
/// not timed: the idle drivers' turns while the stream runs.
#[test]
fn idle_senders_on_a_thread_ring_sleep_while_another_streams() {
    const IDLE: usize = 16;
    const BLOCKS: usize = 2048;
    const BLOCK: usize = 16 << 10;
    let stuck: Arc<[u8]> = vec![0x5a; 256 << 10].into();
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let rt = Builder::new_current_thread().enable_all().build().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (client, reader) = tcp_pair(false, Peer::checking());
        rt.block_on(async {
            let ring = thread_ring().expect("ring");
            let cfg = SenderConfig::shared(kind, &ring);
            let mut idle = Vec::new();
            for _ in 0..IDLE {
                let (c, p) = stalled_pair(&l);
                let tx = AsyncSender::with_config(c, cfg.clone()).expect("idle sender");
                tx.send(stuck.clone()).await.expect("queued");
                idle.push((tx, p));
            }
            // Let every idle driver submit and settle into its wait.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let before: Vec<u64> = idle.iter().map(|(tx, _)| tx.driver_turns()).collect();
            assert!(
                idle.iter().all(|(tx, _)| tx.in_flight() == 1),
                "{kind}: an idle sender's buffer came back from a peer that does not read"
            );

            let enters = ring.enters();
            let tx = AsyncSender::with_config(client, cfg.clone()).expect("streaming sender");
            let mut back = Vec::new();
            for off in 0..BLOCKS {
                let mut b = vec![0u8; BLOCK];
                util::fill(&mut b, (off * BLOCK) as u64);
                tx.send(b).await.expect("sent");
                tx.drain_released(&mut back).expect("released");
                // As a server between requests: the other tasks (drivers) run.
                tokio::task::yield_now().await;
            }
            tx.flush(Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            tx.drain_released(&mut back).expect("released");
            assert_eq!(back.len(), BLOCKS, "{kind}");
            let entered = ring.enters() - enters;
            let woke: Vec<u64> = idle
                .iter()
                .zip(&before)
                .map(|((t, _), b)| t.driver_turns() - b)
                .collect();
            // Each submission of the stream brought completions: as many chances to wake.
            assert!(
                entered > 20,
                "{kind}: the stream took {entered} io_uring_enter calls"
            );
            let most = woke.iter().copied().max().unwrap();
            assert!(
                most <= 2,
                "{kind}: idle drivers woke {woke:?} times while the stream entered the ring \
                 {entered} times"
            );
            drop(tx.close(Duration::from_secs(5)).await);
            for (tx, peer) in idle {
                // The peer goes (a reset): the parked request ends with an error.
                drop(peer);
                drop(tx.close(Duration::from_secs(2)).await);
            }
        });
        assert_eq!(
            reader.join().unwrap().bytes,
            (BLOCKS * BLOCK) as u64,
            "{kind}"
        );
    }
}

/// One shared ring whose async senders were made on two threads has a watcher on each: a
/// completion one watcher routes must still wake a driver that came through the other. Four
/// streams, two made on each thread, all send everything and get every buffer back.
#[test]
fn senders_of_one_ring_made_on_two_threads_all_finish() {
    const BLOCKS: usize = 512;
    const BLOCK: usize = 16 << 10;
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let rt = Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let ring = UringShared::new(UringConfig::default()).unwrap();
        let made: Vec<_> = (0..2)
            .map(|_| {
                let (handle, ring) = (rt.handle().clone(), ring.clone());
                std::thread::spawn(move || {
                    let _in = handle.enter();
                    (0..2)
                        .map(|_| {
                            let (client, reader) = tcp_pair(false, Peer::checking());
                            let cfg = SenderConfig::shared(kind, &ring);
                            let tx = AsyncSender::with_config(client, cfg).expect("sender");
                            (tx, reader)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .flat_map(|t| t.join().unwrap())
            .collect();
        let (senders, readers): (Vec<_>, Vec<_>) = made.into_iter().unzip();
        rt.block_on(async {
            let tasks: Vec<_> = senders
                .into_iter()
                .map(|tx| {
                    tokio::spawn(async move {
                        let mut back = Vec::new();
                        for off in 0..BLOCKS {
                            let mut b = vec![0u8; BLOCK];
                            util::fill(&mut b, (off * BLOCK) as u64);
                            tx.send(b).await.expect("sent");
                            tx.drain_released(&mut back).expect("released");
                        }
                        let flushed = tx.flush(Duration::from_secs(5)).await;
                        tx.drain_released(&mut back).expect("released");
                        let closed = tx.close(Duration::from_secs(1)).await;
                        (flushed, back.len() + closed.released.len())
                    })
                })
                .collect();
            for t in tasks {
                let (flushed, back) = t.await.unwrap();
                flushed.unwrap_or_else(|e| panic!("{kind}: {e}"));
                assert_eq!(back, BLOCKS, "{kind}");
            }
        });
        for r in readers {
            let got = r.join().unwrap();
            assert_eq!(
                (got.bytes, got.mismatches),
                ((BLOCKS * BLOCK) as u64, 0),
                "{kind}"
            );
        }
    }
}

/// A ring with senders on two runtimes of one thread: the first runtime is idle (not running, not
/// dropped) while a sender made on the second streams. The second runtime has a watcher of its
/// own, so the stream's completions wake its driver.
#[test]
fn a_stream_on_a_second_runtime_does_not_wait_for_an_idle_first() {
    const BLOCKS: usize = 256;
    const BLOCK: usize = 16 << 10;
    let ring = UringShared::new(UringConfig::default()).unwrap();
    let cfg = SenderConfig::shared(EngineKind::UringZc, &ring);
    let first = Builder::new_current_thread().enable_all().build().unwrap();
    let (c, first_reader) = tcp_pair(false, Peer::checking());
    let idle = first.block_on(async { AsyncSender::<Vec<u8>>::with_config(c, cfg.clone()) });
    let idle = idle.expect("sender on the first runtime");
    let second = Builder::new_current_thread().enable_all().build().unwrap();
    let (client, reader) = tcp_pair(false, Peer::checking());
    second.block_on(async {
        let tx = AsyncSender::with_config(client, cfg.clone()).expect("sender");
        let mut back = Vec::new();
        for off in 0..BLOCKS {
            let mut b = vec![0u8; BLOCK];
            util::fill(&mut b, (off * BLOCK) as u64);
            tx.send(b).await.expect("sent");
            tx.drain_released(&mut back).expect("released");
        }
        // `released` waits for the driver's wake-up, which only a watcher's brings.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while back.len() < BLOCKS {
            let next = tokio::time::timeout_at(deadline, tx.released()).await;
            let next = next
                .unwrap_or_else(|_| panic!("{} of {BLOCKS} buffers back after 5 s", back.len()));
            back.push(next.expect("released").expect("held until released"));
        }
        drop(tx.close(Duration::from_secs(1)).await);
    });
    assert_eq!(reader.join().unwrap().bytes, (BLOCKS * BLOCK) as u64);
    first.block_on(async { drop(idle.close(Duration::from_secs(1)).await) });
    assert_eq!(first_reader.join().unwrap().bytes, 0);
}

/// A completion that another sender's reap moves into a sender's inbox must wake that sender's
/// driver. The ring's watcher learns of completions from the ring's readiness, and epoll reports
/// a readiness only if the ring still holds CQEs when the event loop asks: a reap in between
/// (another sender's `drain_released`, `send` or driver) empties it, and nothing woke the owner,
/// whose buffer then waited for its `flush` to time out (seen under load as a connection of the
/// object server stalled mid-body). Made on demand here: sender A's request parks on a full
/// socket, A's `flush` waits, the peer reads so the kernel completes A's request, and sender B
/// reaps the ring before the event loop runs again.
#[test]
fn a_completion_another_sender_reaped_wakes_its_owner() {
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        reaped_by_another(kind);
    }
}

/// The same, with the ring shared by a second runtime that is not being driven (its watcher of
/// the ring waits, and cannot run): the wake-up must reach this runtime's watcher, not only the
/// first watcher in line.
#[test]
fn a_completion_another_sender_reaped_wakes_its_owner_beside_an_idle_runtime() {
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let idle_rt = Builder::new_current_thread().enable_all().build().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (sock, peer) = stalled_pair(&l);
        let idle = idle_rt.block_on(async {
            let ring = thread_ring().expect("ring");
            let tx = AsyncSender::<Vec<u8>>::with_config(sock, SenderConfig::shared(kind, &ring))
                .expect("a sender on the idle runtime");
            // Its watcher starts, routes once, and waits.
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            tx
        });
        reaped_by_another(kind);
        drop(peer);
        idle_rt.block_on(async { drop(idle.close(Duration::from_secs(2)).await) });
    }
}

/// Sender A's request parks, A's flush waits, the kernel completes the request and sender B
/// reaps it into A's inbox before the event loop runs: A's flush must end.
fn reaped_by_another(kind: EngineKind) {
    use std::io::Read;
    {
        let rt = Builder::new_current_thread().enable_all().build().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        rt.block_on(async {
            let ring = thread_ring().expect("ring");
            let cfg = SenderConfig::shared(kind, &ring);
            // A's socket is full before A exists: its first request parks.
            let (a_sock, mut a_peer) = stalled_pair(&l);
            a_sock.set_nonblocking(true).unwrap();
            let mut prefill = 0usize;
            let chunk = [0x11u8; 4096];
            loop {
                match (&a_sock).write(&chunk) {
                    Ok(n) => prefill += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("prefill: {e}"),
                }
            }
            let a = Arc::new(AsyncSender::with_config(a_sock, cfg.clone()).expect("sender A"));
            let (b_sock, _b_peer) = stalled_pair(&l);
            let b = AsyncSender::<Vec<u8>>::with_config(b_sock, cfg.clone()).expect("sender B");
            const LEN: usize = 1000;
            a.send(vec![0x22u8; LEN]).await.expect("queued");
            let waiter = {
                let a = a.clone();
                // Far longer than the wait below: a flush that wakes only at its deadline (and
                // then reaps its inbox) is the defect.
                tokio::spawn(async move { a.flush(Duration::from_secs(60)).await })
            };
            // A's driver, A's flush and the ring's watcher look once and sleep.
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            assert_eq!(a.in_flight(), 1, "{kind}: A's request did not park");
            // Without returning to the event loop: the peer reads everything, which lets the
            // kernel complete A's request (on this thread, on the way out of a read), and B
            // reaps the ring, which moves A's completion into A's inbox.
            a_peer.set_nonblocking(true).unwrap();
            let mut got = 0usize;
            let mut buf = vec![0u8; 64 << 10];
            let mut spins = 0u32;
            while got < prefill + LEN {
                match a_peer.read(&mut buf) {
                    Ok(0) => panic!("{kind}: A's peer saw the end"),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        spins += 1;
                        assert!(spins < 5_000_000, "{kind}: A's bytes never came ({got})");
                        std::hint::spin_loop();
                    }
                    Err(e) => panic!("{kind}: {e}"),
                }
            }
            let mut none = Vec::new();
            b.drain_released(&mut none).expect("B reaps");
            // A liveness bound, not a speed one: the wake-up is a few task switches.
            let flushed = tokio::time::timeout(Duration::from_secs(2), waiter).await;
            assert!(
                matches!(flushed, Ok(Ok(Ok(())))),
                "{kind}: A's completion, reaped by B, never reached A's flush: {flushed:?}"
            );
            drop(b.close(Duration::from_secs(2)).await);
            let a = Arc::into_inner(a).expect("one owner");
            let closed = a.close(Duration::from_secs(2)).await;
            assert_eq!(closed.kept, 0, "{kind}");
        });
    }
}
