//! Real-kernel tests of the places of a shared io_uring: streams whose peers never read hold
//! their request (and its completion-queue room) until the peer reads, and must never take the
//! place a healthy stream on the same ring needs.

mod util;

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use util::{fill, require, tcp_pair, Peer};
use zerotx::{EngineKind, Sender, SenderConfig, UringConfig, UringShared};

const KIB: usize = 1024;

/// More stalled streams than the ring has SQ entries (`UringConfig::default`, as `thread_ring`).
const STALLED: usize = 257;

/// Raises the soft descriptor limit to the hard one: each stream takes three descriptors.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill, then to pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

/// A loopback TCP connection whose peer never reads, with small buffers, so a request of more
/// than a few dozen KiB parks in the kernel. Returns the sending side and the peer (kept open).
fn stalled_pair(l: &TcpListener) -> (TcpStream, TcpStream) {
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (p, _) = l.accept().unwrap();
    SockRef::from(&c).set_send_buffer_size(4 * KIB).unwrap();
    SockRef::from(&p).set_recv_buffer_size(4 * KIB).unwrap();
    (c, p)
}

/// Issue 34 item 2: 257 streams whose peers never read, and one whose peer reads at full speed,
/// on one shared ring with the default settings (those of `tokio::thread_ring`), for every
/// engine on io_uring: the healthy stream's buffers must reach the kernel and be released.
#[test]
fn stalled_streams_never_starve_a_healthy_one_on_a_shared_ring() {
    raise_nofile();
    // One buffer, shared by every stalled stream: larger than what its socket takes.
    let stuck: Arc<[u8]> = vec![0x5a; 256 * KIB].into();
    for kind in [EngineKind::Uring, EngineKind::UringZc, EngineKind::Auto] {
        let ring = UringShared::new(UringConfig::default()).unwrap();
        let cfg = SenderConfig::shared(kind, &ring);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut stalled = Vec::new();
        for i in 0..STALLED {
            let (c, p) = stalled_pair(&l);
            let mut tx: Sender<Arc<[u8]>> = Sender::with_config(c, cfg.clone())
                .unwrap_or_else(|e| panic!("{kind}: stalled sender {i}: {e}"));
            if kind == EngineKind::Auto
                && !require(
                    tx.explain().path == "io_uring",
                    &format!("auto chose {} on loopback TCP", tx.explain()),
                )
            {
                return;
            }
            tx.try_send(stuck.clone()).unwrap();
            let _ = tx.readiness();
            stalled.push((tx, p));
        }
        let (sock, peer) = tcp_pair(false, Peer::checking());
        let mut healthy: Sender<Vec<u8>> = Sender::with_config(sock, cfg.clone()).unwrap();
        let total = 1024 * KIB;
        for off in (0..total).step_by(64 * KIB) {
            let mut b = vec![0u8; 64 * KIB];
            fill(&mut b, off as u64);
            healthy.send(b).unwrap();
        }
        let flushed = healthy.flush(Duration::from_secs(5));
        assert!(
            flushed.is_ok(),
            "{kind}: the healthy stream behind {STALLED} stalled ones: {}; {ring:?}",
            flushed.unwrap_err()
        );
        let mut out = Vec::new();
        healthy.reap(&mut out).unwrap();
        assert_eq!(out.len(), total / (64 * KIB), "{kind}");
        assert!(out.iter().all(|r| r.report.error.is_none()), "{kind}");
        drop(healthy);
        let got = peer.join().unwrap();
        assert_eq!((got.bytes, got.mismatches), (total as u64, 0), "{kind}");
        for (tx, _peer) in stalled {
            let _ = tx.close(Duration::ZERO);
        }
    }
}

/// A shared ring takes as many senders as it keeps room for; the next one is refused with an
/// error that names the cause and the fix, and a sender closed makes room again.
#[test]
fn a_sender_beyond_the_rings_room_is_refused_with_the_cause_named() {
    let ring = UringShared::new(UringConfig::default().with_senders(4)).unwrap();
    let cfg = SenderConfig::shared(EngineKind::Uring, &ring);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut pairs: Vec<_> = (0..5).map(|_| stalled_pair(&l)).collect();
    let mut senders = Vec::new();
    for (c, _) in pairs.drain(..4) {
        senders.push(Sender::<Vec<u8>>::with_config(c, cfg.clone()).unwrap());
    }
    let (c, _p) = pairs.pop().unwrap();
    let c2 = c.try_clone().unwrap();
    let err = Sender::<Vec<u8>>::with_config(c, cfg.clone()).unwrap_err();
    assert!(
        matches!(err, zerotx::Error::RingFull { senders: 4 }),
        "{err}"
    );
    assert!(err.to_string().contains("with_senders"), "{err}");
    drop(senders.pop());
    Sender::<Vec<u8>>::with_config(c2, cfg).unwrap();
}
