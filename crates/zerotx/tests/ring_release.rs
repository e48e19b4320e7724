//! Real-kernel tests of what a shared io_uring gives back after a sender left it: the buffers the
//! kernel still held when the sender closed come back (to their pool) once the kernel's last
//! completion for them arrived, never before.

mod util;

use std::io::{self, Read};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::SockRef;
use util::{fill, tcp_pair, Peer, Received};
use zerotx::{BufPool, EngineKind, PooledBuf, Sender, SenderConfig, UringConfig, UringShared};

const KIB: usize = 1024;
const BLOCKS: usize = 8;

/// A loopback TCP connection whose peer does not read yet, with small buffers.
fn stalled_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (p, _) = l.accept().unwrap();
    SockRef::from(&c).set_send_buffer_size(16 * KIB).unwrap();
    SockRef::from(&p).set_recv_buffer_size(16 * KIB).unwrap();
    (c, p)
}

/// Issue 34 item 3: a `uring-zc` sender on a shared ring closes while the kernel still holds its
/// pool blocks (the peer does not read): they are kept, not handed back. Once the peer read
/// everything and another sender on the ring reaped the departed sender's last completions, every
/// block is back in the pool, and the bytes arrived intact (nothing was freed early).
#[test]
fn a_departed_senders_buffers_return_to_the_pool_once_the_kernel_let_go() {
    // `uring` copies: its cancelled request ends at once, so nothing is kept.
    for kind in [EngineKind::UringZc] {
        let pool = BufPool::new(64 * KIB, BLOCKS).unwrap();
        let ring = UringShared::new(UringConfig::default()).unwrap();
        let (c, mut p) = stalled_pair();
        let mut tx: Sender<PooledBuf> =
            Sender::with_config(c, SenderConfig::shared(kind, &ring)).unwrap();
        for i in 0..BLOCKS {
            let mut b = pool.take().unwrap();
            fill(&mut b, (i * 64 * KIB) as u64);
            tx.try_send(b.freeze(64 * KIB)).unwrap();
        }
        let closed = tx.close(Duration::from_millis(100));
        assert!(closed.kept > 0, "{kind}: nothing kept: {closed:?}");
        let handed_back = closed.released.len();
        assert_eq!(handed_back + closed.kept, BLOCKS, "{kind}");
        drop(closed.released);
        // The peer reads the whole stream (the sender shut it down for writing at close).
        let mut got = Received::default();
        let mut buf = vec![0u8; 64 * KIB];
        loop {
            match p.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.take(&buf[..n], true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("{kind}: reading: {e}"),
            }
        }
        assert_eq!(got.mismatches, 0, "{kind}: {got:?}");
        // Another sender on the ring reaps the departed one's completions.
        let (sock, peer) = tcp_pair(false, Peer::default());
        let mut other: Sender<Vec<u8>> =
            Sender::with_config(sock, SenderConfig::shared(kind, &ring)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut out = Vec::new();
        while pool.available() < BLOCKS && Instant::now() < deadline {
            other.send(vec![1u8; 1000]).unwrap();
            other.flush(Duration::from_secs(1)).unwrap();
            other.reap(&mut out).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            pool.available(),
            BLOCKS,
            "{kind}: pool at {} of {BLOCKS} after the kernel let go of every block; {ring:?}",
            pool.available()
        );
        drop(other);
        peer.join().unwrap();
        drop(closed.fd);
    }
}

/// Issue 34 item 3, on a sender's own ring: closed with pool blocks kept, its ring cannot be
/// dropped (the kernel may still read them). Once the peer read everything, every block is back
/// in the pool by the time later senders are made (each new ring reaps the ones left behind).
#[test]
fn a_closed_senders_own_ring_gives_its_buffers_back_once_the_kernel_let_go() {
    let pool = BufPool::new(64 * KIB, BLOCKS).unwrap();
    let (c, mut p) = stalled_pair();
    let mut tx: Sender<PooledBuf> = Sender::new(c, EngineKind::UringZc).unwrap();
    for i in 0..BLOCKS {
        let mut b = pool.take().unwrap();
        fill(&mut b, (i * 64 * KIB) as u64);
        tx.try_send(b.freeze(64 * KIB)).unwrap();
    }
    let closed = tx.close(Duration::from_millis(100));
    assert!(closed.kept > 0, "nothing kept: {closed:?}");
    drop(closed.released);
    let mut got = Received::default();
    let mut buf = vec![0u8; 64 * KIB];
    loop {
        match p.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.take(&buf[..n], true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reading: {e}"),
        }
    }
    assert_eq!(got.mismatches, 0, "{got:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.available() < BLOCKS && Instant::now() < deadline {
        let (sock, _peer) = tcp_pair(false, Peer::default());
        drop(Sender::<Vec<u8>>::new(sock, EngineKind::Uring).unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        pool.available(),
        BLOCKS,
        "pool at {} of {BLOCKS} after the kernel let go of every block",
        pool.available()
    );
    drop(closed.fd);
}
