//! `send_batch` and `try_send_batch`: one io_uring entry per batch, a failing buffer stops the
//! batch and keeps the rest, `copy` gathers a batch into few system calls, a batch on a stream
//! never holds its requests back, a panicking buffer still ends the batch, a non-blocking batch
//! takes what fits.

mod util;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use util::{fill, finish, tcp_pair, Peer};
use zerotx::{EngineKind, SendError, Sender, SenderConfig, UringConfig, UringShared};

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
    // One request per datagram (no runs as trains): these tests count how requests enter.
    let cfg = SenderConfig::shared(EngineKind::UringZc, &ring).with_batch_trains(false);
    let tx = Sender::with_config(sock, cfg).unwrap();
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
