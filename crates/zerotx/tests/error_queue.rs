//! The socket error queue: messages that are not completions (TX timestamps) are drained, a
//! reap reads no further than it must but never strands a completion, `copy` drains what the
//! caller's options put there, and AF_UNIX (no error queue) is never read.

mod util;

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use util::connected_udp;
use zerotx::{EngineKind, SendError, Sender};

/// AF_UNIX has no error queue: `recvmsg(MSG_ERRQUEUE)` reads its data queue. A sender must never
/// read there (found in review: a drain on every reap ate the peer's datagrams, and on a stream
/// whose peer had written and closed, looped on reads of 0 bytes forever).
#[test]
fn a_unix_sender_never_reads_what_its_peer_sent() {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixDatagram, UnixStream};
    let (a, b) = UnixDatagram::pair().unwrap();
    b.send(b"first").unwrap();
    b.send(b"second").unwrap();
    let mut tx = Sender::new(a, EngineKind::Copy).unwrap();
    for _ in 0..4 {
        tx.send(vec![1u8; 100]).unwrap();
    }
    tx.flush(Duration::from_secs(2)).unwrap();
    let mut out = Vec::new();
    tx.reap(&mut out).unwrap();
    let a = UnixDatagram::from(tx.close(Duration::from_secs(1)).fd);
    a.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        a.recv(&mut buf).ok(),
        Some(5),
        "the peer's first datagram was eaten"
    );
    assert_eq!(
        a.recv(&mut buf).ok(),
        Some(6),
        "the peer's second datagram was eaten"
    );

    let (a, mut b) = UnixStream::pair().unwrap();
    b.write_all(b"hello").unwrap();
    b.shutdown(std::net::Shutdown::Write).unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        b.read_to_end(&mut v).unwrap();
        v.len()
    });
    let mut tx = Sender::new(a, EngineKind::Copy).unwrap();
    tx.send(vec![2u8; 1 << 16]).unwrap();
    tx.flush(Duration::from_secs(2))
        .expect("flush returns: nothing to read on a unix socket");
    let mut a = std::os::unix::net::UnixStream::from(tx.close(Duration::from_secs(1)).fd);
    let mut got = Vec::new();
    a.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"hello");
    drop(a);
    assert_eq!(reader.join().unwrap(), 1 << 16);
}

/// A UDP socket connected to `sink` that queues a software TX timestamp on its error queue for
/// every datagram it sends (`SO_TIMESTAMPING`): messages there that are not completions.
fn udp_with_tx_timestamps(sink: &std::net::UdpSocket) -> std::net::UdpSocket {
    const SO_TIMESTAMPING: libc::c_int = 37;
    const TX_SOFTWARE_AND_REPORT: libc::c_int = (1 << 1) | (1 << 4);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(sink.local_addr().unwrap()).unwrap();
    // SAFETY: setsockopt reads one c_int from a live constant.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_TIMESTAMPING,
            (&TX_SOFTWARE_AND_REPORT as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(rc, 0);
    sock
}

/// The events `fd` reports right now without asking for any (POLLERR, POLLHUP): 0 if none.
fn unasked_events(fd: std::os::fd::RawFd) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    p.revents
}

/// Defect 11: messages on the error queue that are not completions (TX timestamps here, ICMP
/// errors with `IP_RECVERR`) keep POLLERR up until read. A reap must read them even with no id in
/// flight, or a caller's poll loop spins.
#[test]
fn error_queue_messages_that_are_not_completions_are_drained() {
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for &kind in util::engines() {
        let sock = udp_with_tx_timestamps(&sink);
        let mut tx = Sender::new(sock, kind).unwrap();
        for _ in 0..4 {
            tx.send(vec![1u8; 1000]).unwrap();
        }
        tx.flush(Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut out = Vec::new();
        tx.reap(&mut out).unwrap();
        let revents = unasked_events(tx.readiness().fd);
        assert_eq!(
            revents,
            0,
            "{kind}: POLLERR still up after a reap (revents {revents:#x}): a poll loop would spin; {:?}",
            tx.stats()
        );
        assert_eq!(out.len(), 4);
        // The io_uring engines (and `auto` on io_uring) never read the error queue: their
        // readiness is the ring's.
        if tx.explain().path != "io_uring" {
            assert!(tx.stats().skipped_messages >= 4, "{kind}: {:?}", tx.stats());
        }
    }
}

/// A reap stops reading the error queue once a completion leaves no id of the sender in flight:
/// no read that finds the queue empty (one system call per reap saved). What may be queued behind
/// it is still read: TX timestamps that follow the completions are gone within two reaps.
#[test]
fn a_reap_that_completes_every_id_reads_the_error_queue_no_further() {
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for stamped in [false, true] {
        let sock = if stamped {
            udp_with_tx_timestamps(&sink)
        } else {
            connected_udp(sink.local_addr().unwrap())
        };
        let fd = sock.as_raw_fd();
        let mut tx = Sender::new(sock, EngineKind::MsgZerocopy).unwrap();
        let mut batch: VecDeque<Vec<u8>> = (0..32).map(|i| vec![i as u8; 1000]).collect();
        assert_eq!(tx.try_send_batch(&mut batch).unwrap(), 32);
        // Loopback copies on delivery and completes at once: wait until POLLERR says so, then a
        // little longer for the last of them.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while unasked_events(fd) == 0 {
            assert!(std::time::Instant::now() < deadline, "no completion came");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        let before = tx.stats();
        let mut out = Vec::new();
        tx.reap(&mut out).unwrap();
        let after = tx.stats();
        assert_eq!(out.len(), 32, "stamped: {stamped}: {after:?}");
        let reads = after.errqueue_reads - before.errqueue_reads;
        let messages = (after.completions - before.completions)
            + (after.skipped_messages - before.skipped_messages);
        if !stamped {
            assert_eq!(reads, messages, "a read found the queue empty: {after:?}");
        } else {
            // Timestamps may sit behind the completions: the next reap reads them.
            tx.reap(&mut out).unwrap();
            let revents = unasked_events(fd);
            assert_eq!(
                revents,
                0,
                "POLLERR still up after two reaps: {:?}",
                tx.stats()
            );
            // At least one timestamp per send call (32 datagrams of one size go as trains).
            let stats = tx.stats();
            assert!(stats.skipped_messages >= stats.syscalls, "{stats:?}");
        }
    }
}

/// The early stop above must not strand a failed datagram's completion. A UDP send that fails
/// after its skb was built (segmentation without checksums: `EINVAL`) took an id; the sender
/// learns that by reading the error queue for that id's completion. With a message that is not a
/// completion queued between the last owned completion and that one (a plain send's TX timestamp
/// here), the kernel cannot merge the two, and a read that stopped once no *owned* id was in
/// flight left the failed send's completion unread: the sender believed no id was taken, stayed
/// one id behind the kernel, released the next buffer on a stale completion and never the last.
/// (Found in review of the early stop; seen failing: `zerocopy_ids` 3, a bad completion.)
#[test]
fn a_failed_datagrams_completion_behind_another_message_is_still_read() {
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sock = udp_with_tx_timestamps(&sink);
    let plain = sock.try_clone().unwrap();
    let set = |name, level, val| util::set_int_opt(plain.as_fd(), level, name, val);
    let mut tx = Sender::new(sock, EngineKind::MsgZerocopy).unwrap();
    tx.send(vec![1u8; 1000]).unwrap(); // id 0
    std::thread::sleep(Duration::from_millis(20));
    // No id, but a timestamp behind id 0's completion.
    plain.send(b"p").unwrap();
    set(libc::UDP_SEGMENT, libc::SOL_UDP, 1000);
    set(libc::SO_NO_CHECK, libc::SOL_SOCKET, 1);
    match tx.send(vec![2u8; 1400]) {
        Err(SendError::Io { error, .. }) => assert_eq!(error.raw_os_error(), Some(libc::EINVAL)),
        other => panic!("a segmented send without checksums was accepted: {other:?}"),
    }
    set(libc::UDP_SEGMENT, libc::SOL_UDP, 0);
    set(libc::SO_NO_CHECK, libc::SOL_SOCKET, 0);
    tx.send(vec![3u8; 1000]).unwrap();
    tx.send(vec![4u8; 1000]).unwrap();
    let flushed = tx.flush(Duration::from_secs(2));
    let mut out = Vec::new();
    tx.reap(&mut out).unwrap();
    let stats = tx.stats();
    assert!(flushed.is_ok(), "{flushed:?}: {stats:?}");
    assert_eq!(
        stats.zerocopy_ids, 4,
        "the failed send took an id: {stats:?}"
    );
    assert_eq!(stats.bad_completions, 0, "{stats:?}");
    let firsts: Vec<u8> = out.iter().map(|r| r.buf[0]).collect();
    assert_eq!(firsts, [1, 3, 4], "{stats:?}");
}

/// The copy engine reads its error queue less often than every reap (it holds no completions,
/// only what the caller's options put there): on every readiness, and in one reap of 16. A caller
/// that polls the descriptor without asking for readiness first still sees POLLERR go within 16
/// reaps, not never.
#[test]
fn copy_drains_its_error_queue_within_sixteen_reaps_without_a_readiness() {
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sock = udp_with_tx_timestamps(&sink);
    let fd = sock.as_raw_fd();
    let mut tx = Sender::new(sock, EngineKind::Copy).unwrap();
    let pollerr = || unasked_events(fd) != 0;
    let mut out = Vec::new();
    for _ in 0..4 {
        tx.try_send(vec![1u8; 1000]).unwrap();
    }
    tx.reap(&mut out).unwrap();
    assert!(pollerr(), "the timestamps are queued: {:?}", tx.stats());
    let mut reaps = 1;
    while pollerr() {
        assert!(
            reaps < 16,
            "POLLERR still up after {reaps} reaps: {:?}",
            tx.stats()
        );
        tx.reap(&mut out).unwrap();
        reaps += 1;
    }
    assert!(tx.stats().skipped_messages >= 4, "{:?}", tx.stats());
    assert_eq!(out.len(), 4);
}
