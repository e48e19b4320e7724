//! The `auto` engine on real kernel paths: it settles on copy where the kernel copies (loopback),
//! uses zero-copy where it pays (the black hole), gets zero-copy back when a socket's route starts
//! paying, and never surfaces a budget refusal or hangs when option memory is short. Each runs
//! over both of auto's families (io_uring, and `sendmsg(2)` with `auto_uring: false`).

mod util;

use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::time::Duration;

use util::{tcp_pair, Peer};
use zerotx::{AtCap, CopyReason, EngineKind, SendPath, Sender, SenderConfig};

/// Both families `auto` can run on here.
fn configs() -> [(&'static str, SenderConfig); 2] {
    [
        ("io_uring", SenderConfig::new(EngineKind::Auto)),
        (
            "sendmsg",
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ),
    ]
}

/// Sends `n` buffers of `size` through `tx`, reaping as it goes, and returns every release's
/// path in send order... of release (what the policy decided is visible in the paths).
fn send_all(tx: &mut Sender<Vec<u8>>, n: usize, size: usize) -> Vec<SendPath> {
    let mut paths = Vec::with_capacity(n);
    let mut out = Vec::new();
    for i in 0..n {
        tx.send(vec![i as u8; size]).unwrap();
        tx.reap(&mut out).unwrap();
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            paths.push(r.report.path);
        }
    }
    tx.flush(Duration::from_secs(20)).unwrap();
    tx.reap(&mut out).unwrap();
    paths.extend(out.drain(..).map(|r| r.report.path));
    assert_eq!(paths.len(), n);
    paths
}

/// Sends 3000 buffers of 64 KiB over `client` (to a local peer, where the kernel copies every
/// zero-copy send) and checks how `auto` settled: `learns` says whether it had to learn it from
/// a window of COPIED completions (a local address that is not loopback) or knew it from the start
/// (a loopback peer). Either way it copies from then on, probing rarely, and the stream is whole.
fn settles_on_copy(
    family: &str,
    cfg: SenderConfig,
    client: std::net::TcpStream,
    peer: std::thread::JoinHandle<util::Received>,
    learns: bool,
) {
    let mut tx = Sender::with_config(client, cfg).unwrap();
    assert_eq!(tx.explain().path, family);
    let n = 3000;
    let paths = send_all(&mut tx, n, 64 * 1024);
    let stats = tx.stats();
    let count = |want: SendPath| paths.iter().filter(|p| **p == want).count();
    let tried = count(SendPath::Copied(CopyReason::Kernel));
    let route = count(SendPath::Copied(CopyReason::RouteCopies));
    // The rest copied at the in-flight cap (before the switch).
    let budget = count(SendPath::Copied(CopyReason::Budget));
    assert_eq!(route + budget + tried, n, "{family}: {stats:?}");
    if learns {
        // At most a window plus what a sender can have in flight (io_uring's queue limit)
        // before the switch, then one probe per PROBE_MIN sends at most.
        assert!(
            tried <= 32 + 256 + n / 256,
            "{family}: {tried} tried: {stats:?}"
        );
        assert!(stats.switches_to_copy >= 1, "{family}: {stats:?}");
    } else {
        // Probes only.
        assert!(tried <= n / 256 + 1, "{family}: {tried} tried: {stats:?}");
        assert_eq!(stats.switches_to_copy, 0, "{family}: {stats:?}");
        assert!(
            tx.explain().to_string().contains("loopback"),
            "{}",
            tx.explain()
        );
    }
    assert_eq!(
        stats.probes_paid, 0,
        "{family}: a probe paid on a local route"
    );
    // The tail of the run is copy, with probes only.
    let tail_zc = paths[n - 1000..]
        .iter()
        .filter(|p| **p == SendPath::Copied(CopyReason::Kernel))
        .count();
    assert!(tail_zc <= 1000 / 256 + 1, "{family}: {tail_zc} in the tail");
    let explained = tx.explain();
    assert!(!explained.zerocopy, "{family}: {explained}");
    assert!(
        explained.to_string().contains("zero-copy is OFF"),
        "{explained}"
    );
    drop(tx);
    assert_eq!(peer.join().unwrap().bytes, n as u64 * 64 * 1024);
}

/// A loopback peer: the kernel always copies there, and `auto` copies from the first send.
#[test]
fn tcp_loopback_copies_from_the_start() {
    for (family, cfg) in configs() {
        let (client, peer) = tcp_pair(false, Peer::default());
        settles_on_copy(family, cfg, client, peer, false);
    }
}

/// A local peer on an address that is not loopback (an address of `lo` in the test's own
/// namespace): the kernel copies on delivery all the same, and `auto` must learn it from the
/// completions within a window (plus what was in flight) and copy from then on.
#[test]
fn tcp_to_a_local_address_learns_to_copy() {
    util::require!(
        util::is_root(),
        "needs root for a private network namespace"
    );
    zerotx_testbed::in_new_netns(|| {
        let ok = std::process::Command::new("ip")
            .args(["addr", "add", "192.0.2.77/32", "dev", "lo"])
            .status()
            .expect("running ip")
            .success();
        assert!(ok, "ip addr add");
        for (family, cfg) in configs() {
            let listener = std::net::TcpListener::bind("192.0.2.77:0").unwrap();
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (mut server, _) = listener.accept().unwrap();
            let peer = std::thread::spawn(move || {
                let mut r = util::Received::default();
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    match std::io::Read::read(&mut server, &mut buf) {
                        Ok(0) | Err(_) => return r,
                        Ok(n) => r.take(&buf[..n], false),
                    }
                }
            });
            settles_on_copy(family, cfg, client, peer, true);
        }
    })
    .unwrap();
}

/// Small sends copy on every route, counted as such.
#[test]
fn small_sends_are_copied_and_counted() {
    for (family, cfg) in configs() {
        let (client, peer) = tcp_pair(true, Peer::default());
        let mut tx = Sender::with_config(client, cfg).unwrap();
        let paths = send_all(&mut tx, 200, 1000);
        assert!(
            paths
                .iter()
                .all(|p| *p == SendPath::Copied(CopyReason::Small)),
            "{family}: {paths:?}"
        );
        assert_eq!(tx.stats().copied_small, 200, "{family}");
        drop(tx);
        assert_eq!(peer.join().unwrap().bytes, 200 * 1000);
    }
}

/// Into the black hole zero-copy pays: 64 KiB datagrams all go zero-copy, and the sender says so.
#[test]
fn black_hole_uses_zero_copy_at_64k() {
    util::in_black_hole(65535, |bh| {
        for dest in [bh.v4, bh.v6] {
            for (family, cfg) in configs() {
                let sock = UdpSocket::bind(if dest.is_ipv4() {
                    "0.0.0.0:0"
                } else {
                    "[::]:0"
                })
                .unwrap();
                sock.connect(dest).unwrap();
                let mut tx = Sender::with_config(sock, cfg).unwrap();
                let paths = send_all(&mut tx, 500, 64 * 1024 - 1024);
                let zc = paths.iter().filter(|p| p.is_zerocopy()).count();
                assert_eq!(zc, 500, "{family} {dest}: {:?}", tx.stats());
                let e = tx.explain();
                assert!(
                    e.zerocopy && e.to_string().contains("zero-copy is ON"),
                    "{e}"
                );
            }
        }
    });
}

/// One unconnected UDP socket: first to a local peer (the kernel copies), then into the black
/// hole. `auto` switches to copy, and gets zero-copy back once the route pays: within one probe
/// gap (which after this short a copy phase is at most a few thousand sends).
#[test]
fn zero_copy_comes_back_when_the_route_starts_paying() {
    util::in_black_hole(65535, |bh| {
        for (family, cfg) in configs() {
            // A local reader, so loopback datagrams are received (and copied), not dropped.
            let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
            // Forced: `SO_RCVBUF` is capped at net.core.rmem_max (about 416 KiB by default),
            // which does not hold the datagrams between two paced flushes on every host.
            util::set_int_opt(
                sink.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                8 << 20,
            );
            let local = sink.local_addr().unwrap();
            sink.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let reader = std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut n = 0u64;
                while sink.recv(&mut buf).is_ok() {
                    n += 1;
                }
                n
            });
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            let mut tx: Sender<Vec<u8>> = Sender::with_config(sock, cfg).unwrap();
            let mut out = Vec::new();
            let size = 16 * 1024;
            for i in 0..600 {
                tx.send_to(vec![i as u8; size], local).unwrap();
                if i % 8 == 0 {
                    // Pace the local peer so none of its datagrams is dropped uncopied.
                    tx.flush(Duration::from_secs(5)).unwrap();
                }
                tx.reap(&mut out).unwrap();
            }
            tx.flush(Duration::from_secs(5)).unwrap();
            tx.reap(&mut out).unwrap();
            let s = tx.stats();
            assert!(s.switches_to_copy >= 1, "{family}: never switched: {s:?}");
            assert!(!tx.explain().zerocopy, "{family}: {}", tx.explain());
            out.clear();
            let mut zc_since = None;
            for i in 0..6000 {
                tx.send_to(vec![i as u8; size], bh.v4).unwrap();
                tx.reap(&mut out).unwrap();
                if zc_since.is_none() && out.iter().any(|r| r.report.path.is_zerocopy()) {
                    zc_since = Some(i);
                }
                out.clear();
            }
            tx.flush(Duration::from_secs(5)).unwrap();
            let back = zc_since.unwrap_or_else(|| panic!("{family}: never back: {:?}", tx.stats()));
            assert!(
                back < 4096 + 300,
                "{family}: zero-copy back only after {back} sends"
            );
            let s = tx.stats();
            assert!(s.probes_paid >= 1, "{family}: {s:?}");
            assert!(tx.explain().zerocopy, "{family}: {}", tx.explain());
            drop(tx);
            assert!(
                reader.join().unwrap() >= 590,
                "{family}: the local peer lost datagrams"
            );
        }
    });
}

/// With option memory short (`optmem_max` lowered in the test's own namespace), `auto` on
/// `sendmsg(2)` never surfaces `ENOBUFS` and never hangs: lowered before the sender exists, its
/// cap keeps it under the limit; lowered after, the kernel refuses and `auto` copies for a while.
/// Every buffer comes back whole, with copies counted as [`CopyReason::Budget`].
#[test]
fn short_option_memory_never_surfaces_enobufs_or_hangs() {
    util::in_black_hole(65535, |bh| {
        for lower_first in [true, false] {
            for at_cap in [AtCap::Copy, AtCap::Wait] {
                let default = zerotx_testbed::optmem_max().unwrap();
                if lower_first {
                    zerotx_testbed::set_optmem_max(4096).unwrap();
                }
                let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
                sock.connect(bh.v4).unwrap();
                let cfg = SenderConfig::new(EngineKind::Auto)
                    .with_auto_uring(false)
                    .with_at_cap(at_cap);
                let mut tx: Sender<Vec<u8>> = Sender::with_config(sock, cfg).unwrap();
                if !lower_first {
                    zerotx_testbed::set_optmem_max(1024).unwrap();
                }
                let mut out = Vec::new();
                let n = 3000;
                for i in 0..n {
                    // `send` waits at most for this sender's own completions: never forever.
                    tx.send(vec![i as u8; 16 * 1024]).unwrap();
                    if i % 64 == 0 {
                        tx.reap(&mut out).unwrap();
                    }
                }
                tx.flush(Duration::from_secs(10)).unwrap();
                tx.reap(&mut out).unwrap();
                zerotx_testbed::set_optmem_max(default).unwrap();
                let s = tx.stats();
                let case = format!("lower_first={lower_first} {at_cap:?}: {s:?}");
                assert_eq!(out.len(), n, "{case}");
                assert!(out.iter().all(|r| r.report.error.is_none()), "{case}");
                assert!(out.iter().all(|r| r.report.bytes == 16 * 1024), "{case}");
                assert!(s.zerocopy > 0, "{case}");
                if lower_first {
                    // The cap (derived from 4096 bytes: 2 sends) kept the kernel from refusing.
                    assert_eq!(s.enobufs, 0, "{case}");
                    assert!(s.copied_budget > 0 || s.cap_waits > 0, "{case}");
                } else {
                    assert!(s.enobufs > 0, "{case}: the kernel never refused");
                    match at_cap {
                        // Copied for a while after each refusal.
                        AtCap::Copy => assert!(s.copied_budget > 0, "{case}"),
                        // Retried once completions freed room, or waited for them: every buffer
                        // zero-copy, or copied only with nothing in flight to wait for.
                        _ => assert_eq!(s.zerocopy + s.fallbacks, n as u64, "{case}"),
                    }
                }
            }
        }
    });
}

/// CQEs the kernel has posted on the io_uring instance `fd` (its `CqTail` in
/// `/proc/self/fdinfo`): one per copy request, so the requests a copying sender made.
fn cqes_posted(fd: std::os::fd::RawFd) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("CqTail:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Sends `total` bytes of 1400-byte buffers in batches of 32 through `tx`, recycling buffers
/// from a fixed set, as a throughput sender does.
fn send_small_batches(tx: &mut Sender<Vec<u8>>, total: usize) {
    let size = 1400;
    let mut free: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; size]).collect();
    let mut batch = std::collections::VecDeque::new();
    let mut out = Vec::new();
    let mut sent = 0;
    while sent < total {
        while batch.len() < 32 {
            match free.pop() {
                Some(b) => batch.push_back(b),
                None => break,
            }
        }
        sent += batch.len() * size;
        tx.send_batch(&mut batch).unwrap();
        tx.reap(&mut out).unwrap();
        if free.is_empty() && out.is_empty() {
            tx.wait_released(&mut out, Some(Duration::from_millis(50)))
                .unwrap();
        }
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            free.push(r.buf);
        }
    }
    tx.flush(Duration::from_secs(20)).unwrap();
}

/// Small copies on a byte stream whose socket keeps filling (a slow reader, a small send buffer):
/// `auto` on io_uring writes them as `copy` does, one gathered `sendmsg(2)` per run of buffers,
/// and makes an io_uring request only for what a short write left, which waits in the kernel for
/// room where `copy` waits for writability and writes again. So its kernel entries stay within
/// those of `copy` (measured: 217-219 writes and 71-72 requests against `copy`'s 353-399 calls
/// for 8 MiB), and never one request per run.
#[test]
fn small_stream_copies_on_a_full_socket_go_as_writes() {
    let total = 8 << 20;
    // Keeps the sender's socket full (the bytes are not checked: other tests do that).
    let slow = || Peer {
        pause: Duration::from_micros(200),
        rcvbuf: Some(64 << 10),
        ..Peer::default()
    };
    // A small send buffer: it fills about every other write.
    let pair = || {
        let (client, peer) = tcp_pair(false, slow());
        socket2::SockRef::from(&client)
            .set_send_buffer_size(64 << 10)
            .unwrap();
        (client, peer)
    };
    let (client, peer) = pair();
    let mut copy = Sender::with_config(client, SenderConfig::new(EngineKind::Copy)).unwrap();
    send_small_batches(&mut copy, total);
    let copy_stats = copy.stats();
    let copy_calls = copy_stats.syscalls;
    drop(copy);
    assert_eq!(peer.join().unwrap().bytes, copy_stats.bytes);
    let (client, peer) = pair();
    let mut tx = Sender::with_config(client, SenderConfig::new(EngineKind::Auto)).unwrap();
    util::require!(
        tx.explain().path == "io_uring",
        "auto chose {}: {}",
        tx.explain().path,
        tx.explain()
    );
    let ring = tx.readiness().fd;
    send_small_batches(&mut tx, total);
    let stats = tx.stats();
    let requests = cqes_posted(ring).expect("the ring's fdinfo has CqTail");
    let writes = stats.syscalls - requests;
    drop(tx);
    let got = peer.join().unwrap();
    assert_eq!(got.bytes, stats.bytes);
    assert_eq!((stats.probes, stats.switches_to_copy), (0, 0), "{stats:?}");
    assert_eq!(stats.copied_small, stats.sends, "{stats:?}");
    // A gathered write carries 32 buffers (44 800 bytes): at least this many writes.
    assert!(
        writes >= (total / (32 * 1400)) as u64,
        "{writes} writes: {stats:?}"
    );
    // A request follows a short write only, and the next write waits for it.
    assert!(
        requests <= writes,
        "{requests} requests for {writes} writes: requests carry runs, not what writes left"
    );
    assert!(
        stats.syscalls <= copy_calls + copy_calls / 4 + 16,
        "auto entered the kernel {} times, copy {copy_calls}",
        stats.syscalls
    );
}
