//! Batches that become trains: `send_batch` of equal-size datagrams on a connected UDP socket
//! goes as UDP GSO trains, one call (and under `msg-zc` one id) per run, on the real kernel in
//! namespaces these tests create. A receiver across a veth checks every datagram (content, count,
//! order) for `copy`, `msg-zc` and `auto`; the black hole counts calls and ids per run; a run
//! the kernel refuses (a netfilter drop, a qdisc drop with `IP_RECVERR`, UDP-Lite's `EIO`) goes
//! one datagram per call, so the batch's rule holds per datagram. The kernel's rules:
//! docs/kernel.md, "UDP GSO trains".

mod util;

use std::collections::VecDeque;
use std::net::UdpSocket;
use std::time::Duration;

use bytes::Bytes;

use util::trains::{assert_uring, uring_engines};
use util::veth::{over_veth, receive_all, receiver_of, tbf, udp_of};
use util::{connected_udp, require};
use zerotx::{
    BufPool, CopyReason, EngineKind, PoolBufMut, PooledBuf, SendError, SendPath, Sender,
    SenderConfig, Stats,
};

/// The engines whose batches become trains (`auto` kept on `sendmsg(2)`).
fn batch_engines() -> [(&'static str, SenderConfig); 3] {
    [
        ("copy", SenderConfig::new(EngineKind::Copy)),
        ("msg-zc", SenderConfig::new(EngineKind::MsgZerocopy)),
        (
            "auto",
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ),
    ]
}

/// The byte at `i` of datagram `n`, past its 4-byte number.
fn pattern(n: u32, i: usize) -> u8 {
    (n.wrapping_mul(37) as usize).wrapping_add(i * 3) as u8
}

/// Datagram `n` of `len` bytes: its number, then [`pattern`].
fn datagram(n: u32, len: usize) -> Vec<u8> {
    let mut buf = n.to_be_bytes().to_vec();
    buf.extend((4..len).map(|i| pattern(n, i)));
    buf
}

/// A batch of datagrams numbered from `first`, of the sizes `sizes`.
fn batch(first: u32, sizes: &[usize]) -> VecDeque<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| datagram(first + i as u32, len))
        .collect()
}

/// Sizes that mix runs and lone datagrams: a full run of 1472 B with a shorter last, lone sizes
/// between runs, a run that ends at a longer datagram, and a run of two.
fn mixed_sizes() -> Vec<usize> {
    let mut sizes = vec![1472; 30];
    sizes.push(900);
    sizes.extend([700, 1200, 1200, 1200, 1300, 64]);
    sizes.extend([1000; 50]);
    sizes.extend([1472, 333, 333]);
    sizes
}

/// `send_batch` of `sizes` (numbered from 0), `rounds` times, through a sender made by `cfg` on
/// `sock`; every buffer that comes back is checked (no error, its whole length) and overwritten
/// at once. Returns the final counters.
fn send_batches(
    sock: std::net::UdpSocket,
    cfg: SenderConfig,
    sizes: &[usize],
    rounds: u32,
) -> Stats {
    let mut tx = Sender::with_config(sock, cfg).unwrap();
    let mut out = Vec::new();
    let mut back = 0;
    let mut take = |out: &mut Vec<zerotx::Released<Vec<u8>>>| {
        for mut r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            assert_eq!(r.report.bytes, r.buf.len());
            r.buf.fill(0xEE);
            back += 1;
        }
    };
    for round in 0..rounds {
        let mut b = batch(round * sizes.len() as u32, sizes);
        tx.send_batch(&mut b).unwrap();
        assert!(b.is_empty());
        tx.reap(&mut out).unwrap();
        take(&mut out);
    }
    let (mut rest, stats) = util::finish(tx);
    take(&mut rest);
    assert_eq!(
        back,
        sizes.len() * rounds as usize,
        "every buffer back once"
    );
    stats
}

/// Every datagram of every batch arrives whole and in order, as it would one by one, through
/// each engine, with runs sent as trains; with the switch off the same batches go one call each.
#[test]
fn every_datagram_of_a_batch_arrives_as_sent() {
    const ROUNDS: u32 = 8;
    let sizes = mixed_sizes();
    for (name, cfg) in batch_engines() {
        for trains in [true, false] {
            let cfg = cfg.clone().with_batch_trains(trains);
            let result = over_veth(
                1500,
                libc::IPPROTO_UDP,
                || true,
                |sock| receive_all(&sock, Duration::from_secs(1)),
                || {
                    let sock = connected_udp("192.0.2.2:9".parse().unwrap());
                    let stats = send_batches(sock, cfg, &sizes, ROUNDS);
                    let n = (sizes.len() as u64) * u64::from(ROUNDS);
                    let rounds = u64::from(ROUNDS);
                    if trains {
                        // Runs of 30 + 1, 3, 50 and 2, and four lone datagrams, per round; a
                        // zero-copy train carries what fits one skb's page fragments (separate
                        // buffers: at most 17), so `msg-zc` cuts the long runs in several.
                        assert_eq!(stats.batch_train_buffers, 86 * rounds, "{name}: {stats:?}");
                        assert!(stats.trains >= 4 * rounds, "{name}: {stats:?}");
                        assert_eq!(
                            stats.syscalls,
                            stats.trains + 4 * rounds,
                            "{name}: {stats:?}"
                        );
                        if name == "copy" {
                            assert_eq!(stats.trains, 4 * rounds, "{name}: {stats:?}");
                        }
                    } else {
                        assert_eq!((stats.trains, stats.syscalls), (0, n), "{name}: {stats:?}");
                    }
                    assert_eq!(stats.sends, n, "{name}: {stats:?}");
                },
            );
            let Some(got) = result else { return };
            assert_eq!(got.len(), sizes.len() * ROUNDS as usize, "{name} {trains}");
            for (i, data) in got.iter().enumerate() {
                let want = datagram(i as u32, sizes[i % sizes.len()]);
                assert!(*data == want, "{name} {trains}: datagram {i} differs");
            }
        }
    }
}

/// Datagrams of `sizes` numbered from 0, as slices of one allocation from the start of a page:
/// contiguous, so a run of them takes as few page fragments as one buffer of their bytes.
fn contiguous(sizes: &[usize]) -> VecDeque<Bytes> {
    contiguous_from(0, sizes)
}

/// As [`contiguous`], numbered from `first`.
fn contiguous_from(first: u32, sizes: &[usize]) -> VecDeque<Bytes> {
    const PAGE: usize = 4096;
    let total: usize = sizes.iter().sum();
    let mut all = Vec::with_capacity(PAGE + total);
    let pad = (PAGE - all.as_ptr() as usize % PAGE) % PAGE;
    all.resize(pad, 0);
    all.extend(
        sizes
            .iter()
            .enumerate()
            .flat_map(|(i, &len)| datagram(first + i as u32, len)),
    );
    let all = Bytes::from(all).slice(pad..);
    assert_eq!(
        all.as_ptr() as usize % PAGE,
        0,
        "the datagrams start a page"
    );
    let mut at = 0;
    sizes
        .iter()
        .map(|&len| {
            at += len;
            all.slice(at - len..at)
        })
        .collect()
}

/// Into the black hole, `msg-zc` sends each run as one call under one id, and every buffer of
/// the run comes back zero-copy once that id completed. Buffers of one allocation make runs cut
/// only by the kernel's limits (bytes, segments); separate buffers take one page fragment each
/// at least, so a zero-copy train carries at most 17 of them, and no call is refused. With the
/// switch off, one id each.
#[test]
fn black_hole_one_id_per_run() {
    util::in_black_hole(1500, |bh| {
        let msg_zc = SenderConfig::new(EngineKind::MsgZerocopy);
        // Three runs by bytes: 44 x 1472, 44 x 1472, 10 x 1472 + 500; three by segments.
        let mut sizes = vec![1472; 98];
        sizes.push(500);
        let per_call = u64::from(max_segments());
        for (sizes, want) in [(sizes, 3), (vec![100; 300], 300u64.div_ceil(per_call))] {
            let n = sizes.len();
            let mut tx = Sender::with_config(connected_udp(bh.v4), msg_zc.clone()).unwrap();
            tx.send_batch(&mut contiguous(&sizes)).unwrap();
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), n);
            assert!(
                released
                    .iter()
                    .all(|r| r.report.path == SendPath::ZeroCopy && r.report.error.is_none()),
                "{stats:?}"
            );
            let mut numbers: Vec<u32> = released
                .iter()
                .map(|r| u32::from_be_bytes(r.buf[..4].try_into().unwrap()))
                .collect();
            numbers.sort_unstable();
            assert_eq!(numbers, (0..n as u32).collect::<Vec<u32>>());
            let counts = (stats.trains, stats.syscalls, stats.zerocopy_ids);
            assert_eq!(counts, (want, want, want), "{stats:?}");
            assert_eq!(stats.zerocopy_ids_completed, want, "{stats:?}");
            assert_eq!(stats.batch_train_buffers, n as u64, "{stats:?}");
        }

        let sizes = vec![1472; 99];
        let mut tx = Sender::with_config(connected_udp(bh.v4), msg_zc.clone()).unwrap();
        tx.send_batch(&mut batch(0, &sizes)).unwrap();
        let (released, stats) = util::finish(tx);
        assert_eq!(released.len(), 99);
        assert!(released.iter().all(|r| r.report.path == SendPath::ZeroCopy));
        assert!(stats.trains >= 99u64.div_ceil(17), "{stats:?}");
        // How many buffers a zero-copy train carries depends on where the allocator put them
        // (17 page fragments per skb), so a run may end with one buffer, which goes alone: every
        // call is a train or a lone datagram, none refused, and each took one id.
        let alone = 99 - stats.batch_train_buffers;
        assert_eq!(
            stats.syscalls,
            stats.trains + alone,
            "no refused call: {stats:?}"
        );
        assert_eq!(stats.zerocopy_ids, stats.syscalls, "{stats:?}");

        let mut tx = Sender::with_config(connected_udp(bh.v4), msg_zc.clone()).unwrap();
        tx.send_batch(&mut batch(0, &[1000, 1000, 700])).unwrap();
        tx.flush(Duration::from_secs(5)).unwrap();
        let said = tx.explain().lines.join("\n");
        assert!(
            said.contains("(3 buffers of batches went in them"),
            "{said}"
        );

        let off = msg_zc.with_batch_trains(false);
        let mut tx = Sender::with_config(connected_udp(bh.v4), off).unwrap();
        tx.send_batch(&mut batch(0, &sizes)).unwrap();
        let (_, stats) = util::finish(tx);
        assert_eq!((stats.trains, stats.zerocopy_ids), (0, 99), "{stats:?}");
    });
}

/// The segments one train call carries on this kernel: 128 from 6.9, 64 before.
fn max_segments() -> u16 {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut it = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    if (it.next().unwrap(), it.next().unwrap()) >= (6, 9) {
        128
    } else {
        64
    }
}

/// Runs end where the sizes change, at a shorter datagram, and at the kernel's limits: more
/// segments than one call carries (128 from 6.9, 64 before) and more bytes than one GSO packet
/// (65507 on IPv4) make several trains. A datagram above the path MTU is never in a run. (`auto`
/// copies these runs: a zero-copy train of separate buffers would carry too few bytes.)
#[test]
fn runs_split_at_sizes_and_limits() {
    util::in_black_hole(1500, |bh| {
        let segments = u64::from(max_segments());
        let per_call = 300u64.div_ceil(segments);
        let cases: [(&str, Vec<usize>, u64, Option<u64>); 4] = [
            // sizes, trains, system calls (a datagram above the MTU costs `msg-zc` a refused
            // zero-copy call first)
            (
                "mixed",
                vec![1000, 1000, 1000, 500, 700, 1200, 1200, 300, 1000],
                2,
                Some(4),
            ),
            ("segments", vec![100; 300], per_call, Some(per_call)),
            // 44 x 1472 = 64768 fits one GSO packet, 45 do not.
            ("bytes", vec![1472; 60], 2, Some(2)),
            ("above the MTU", vec![2000; 5], 0, None),
        ];
        for (what, sizes, trains, syscalls) in cases {
            // `msg-zc`'s runs of separate buffers: `black_hole_one_id_per_run`.
            for (name, cfg) in batch_engines().into_iter().filter(|(n, _)| *n != "msg-zc") {
                let stats = send_batches(connected_udp(bh.v4), cfg, &sizes, 1);
                assert_eq!(stats.trains, trains, "{what}, {name}: {stats:?}");
                if let Some(calls) = syscalls {
                    assert_eq!(stats.syscalls, calls, "{what}, {name}: {stats:?}");
                }
            }
        }
    });
}

/// `auto` sends a run zero-copy only from the length where zero-copy trains pay, as it does
/// a train the caller built: a short run is copied ([`CopyReason::Small`]), a long one (of
/// contiguous buffers, so one zero-copy call carries it all) not.
#[test]
fn auto_copies_short_runs_and_zero_copies_long_ones() {
    util::in_black_hole(1500, |bh| {
        let cfg = SenderConfig::new(EngineKind::Auto).with_auto_uring(false);
        let mut tx: Sender<Bytes> = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
        let mut sizes = vec![1472; 4];
        sizes.push(100);
        sizes.extend([1472; 44]);
        tx.send_batch(&mut contiguous(&sizes)).unwrap();
        let (released, stats) = util::finish(tx);
        let path_of = |n: u32| {
            released
                .iter()
                .find(|r| r.buf[..4] == n.to_be_bytes())
                .map(|r| r.report.path)
        };
        assert_eq!(path_of(0), Some(SendPath::Copied(CopyReason::Small)));
        assert_eq!(path_of(48), Some(SendPath::ZeroCopy), "{stats:?}");
        assert_eq!((stats.trains, stats.zerocopy_ids), (2, 1), "{stats:?}");
    });
}

/// A rule in the output hook sees a train as one packet, of the train's length: a rule that drops
/// one datagram size (`udp length`) drops that datagram when it goes alone and lets it through in
/// a train (measured on 6.18). A rule that matches the train drops it whole before anything went
/// (`EPERM`): the run fails as its first datagram, which comes back in the error, and the ones
/// after it stay in the batch, as without trains; nothing is sent again behind the drop.
#[test]
fn netfilter_sees_a_train_as_one_packet_and_a_dropped_run_fails_per_datagram() {
    util::in_black_hole(1500, |bh| {
        let rules = "table inet zerotx_runs {\n  chain out {\n    type filter hook output \
                     priority 0; policy accept;\n    udp length 1008 drop\n    udp dport 10 \
                     drop\n  }\n}\n";
        if !util::run_tool("nft", &["-f", "-"], Some(rules)) {
            require!(false, "nft unavailable");
        }
        for (name, cfg) in batch_engines() {
            // 1000-byte datagrams: alone, the length rule drops each one.
            for trains in [true, false] {
                let cfg = cfg.clone().with_batch_trains(trains);
                let mut tx = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
                let mut b = batch(0, &[1000; 4]);
                let sent = tx.send_batch(&mut b);
                match (trains, sent) {
                    (true, Ok(())) => {}
                    (false, Err(SendError::Io { buf, error })) => {
                        assert_eq!(buf, datagram(0, 1000), "{name}");
                        assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{name}");
                        assert_eq!(b.len(), 3, "{name}");
                    }
                    (_, other) => panic!("{name}, trains {trains}: {other:?}"),
                }
                let (_, stats) = util::finish(tx);
                assert_eq!(
                    stats.zerocopy_ids, stats.zerocopy_ids_completed,
                    "{stats:?}"
                );
            }
            // Port 10: every packet dropped, the train whole.
            let dest = std::net::SocketAddr::new(bh.v4.ip(), 10);
            let mut tx = Sender::with_config(connected_udp(dest), cfg).unwrap();
            let mut b = batch(0, &[1000; 5]);
            match tx.send_batch(&mut b) {
                Err(SendError::Io { buf, error }) => {
                    assert_eq!(buf, datagram(0, 1000), "{name}");
                    assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
            let rest: Vec<Vec<u8>> = b.into();
            assert_eq!(
                rest,
                Vec::from(batch(1, &[1000; 4])),
                "{name}: the rest stays"
            );
            let (released, stats) = util::finish(tx);
            assert!(released.is_empty(), "{name}");
            assert_eq!(
                stats.syscalls, 1,
                "{name}: the train, nothing again: {stats:?}"
            );
            assert_eq!(stats.trains, 0, "{name}: {stats:?}");
            assert_eq!(
                stats.zerocopy_ids, stats.zerocopy_ids_completed,
                "{stats:?}"
            );
        }
    });
}

/// A qdisc that drops (a `tbf` far slower than any sender, 50 Mbit/s, with a short queue) under
/// `IP_RECVERR`: a run whose train it dropped whole (`ENOBUFS`) fails as its first datagram, the
/// rest staying queued; every buffer is released once or comes back in an error, nothing is released early (each is
/// overwritten the instant it comes back) and no datagram arrives twice or changed.
#[test]
fn qdisc_drops_with_recverr_lose_no_buffer_and_repeat_no_datagram() {
    const ROUNDS: u32 = 60;
    const RUN: usize = 20;
    for (name, cfg) in batch_engines() {
        let qdisc = || tbf("50mbit", "32kb", "64kb");
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            qdisc,
            |sock| receive_all(&sock, Duration::from_secs(2)),
            || {
                let sock = util::deep_udp("192.0.2.2:9".parse().unwrap(), true);
                let mut tx = Sender::with_config(sock, cfg).unwrap();
                let (mut out, mut refused, mut back) = (Vec::new(), 0, 0);
                for round in 0..ROUNDS {
                    let mut b = batch(round * RUN as u32, &[1472; RUN]);
                    while !b.is_empty() {
                        match tx.send_batch(&mut b) {
                            Ok(()) => {}
                            Err(SendError::Io { error, .. }) => {
                                assert_eq!(error.raw_os_error(), Some(libc::ENOBUFS), "{name}");
                                refused += 1;
                            }
                            Err(e) => panic!("{name}: {e}"),
                        }
                    }
                    tx.reap(&mut out).unwrap();
                    for r in out.iter_mut() {
                        r.buf.fill(0xEE);
                    }
                    back += out.len();
                    out.clear();
                }
                let failed = util::flush_after_faults(&mut tx, Duration::from_secs(20), name);
                assert_eq!(
                    failed, 0,
                    "{name}: a datagram is refused or sent, never cut"
                );
                let (rest, stats) = util::finish(tx);
                back += rest.len();
                assert_eq!(
                    back + refused,
                    ROUNDS as usize * RUN,
                    "{name}: buffers back"
                );
                assert!(stats.trains > 0, "{name}: {stats:?}");
                assert_eq!(
                    stats.zerocopy_ids, stats.zerocopy_ids_completed,
                    "{name}: {stats:?}"
                );
            },
        );
        let Some(got) = result else { return };
        let mut seen = std::collections::HashSet::new();
        for data in &got {
            let n = u32::from_be_bytes(data[..4].try_into().unwrap());
            assert!(*data == datagram(n, 1472), "{name}: datagram {n} changed");
            assert!(seen.insert(n), "{name}: datagram {n} arrived twice");
        }
        assert!(
            !got.is_empty() && got.len() < ROUNDS as usize * RUN,
            "{name}: the qdisc dropped nothing ({} arrived)",
            got.len()
        );
    }
}

/// A UDP-Lite socket never checksums a GSO packet: the first run's train answers `EIO`, and its
/// datagrams go one per call; the path is remembered, so the next batch's runs go so at once.
/// Every datagram arrives, in order.
#[test]
fn a_path_that_cannot_checksum_a_run_gets_its_datagrams_one_by_one() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        let Some(rx) = receiver_of("127.0.0.1:0", libc::IPPROTO_UDPLITE) else {
            return;
        };
        let tx_sock = udp_of(libc::IPPROTO_UDPLITE).unwrap();
        tx_sock.connect(&rx.local_addr().unwrap().into()).unwrap();
        let tx_sock: std::net::UdpSocket = tx_sock.into();
        let sizes = [1000; 10];
        let stats = {
            let mut tx = Sender::new(tx_sock, EngineKind::Copy).unwrap();
            tx.send_batch(&mut batch(0, &sizes)).unwrap();
            tx.send_batch(&mut batch(10, &sizes)).unwrap();
            util::finish(tx).1
        };
        assert_eq!(stats.train_splits, 1, "{stats:?}");
        assert_eq!(stats.trains, 0, "{stats:?}");
        assert_eq!(
            stats.syscalls,
            1 + 20,
            "one refused train, then 20 datagrams"
        );
        let got = receive_all(&rx, Duration::from_millis(300));
        assert_eq!(got.len(), 20);
        for (i, data) in got.iter().enumerate() {
            assert!(*data == datagram(i as u32, 1000), "datagram {i}");
        }
    })
    .unwrap();
}

/// A pending socket error (the ICMP port unreachable an earlier train met, `ECONNREFUSED`) is
/// taken by the next train's call: that run fails as its first datagram, the rest stay in the
/// batch, and the error is not lost, as with one call per datagram.
#[test]
fn a_pending_socket_error_fails_the_next_run_as_its_first_datagram() {
    let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = closed.local_addr().unwrap();
    drop(closed);
    for (name, cfg) in batch_engines() {
        let mut tx = Sender::with_config(connected_udp(dest), cfg).unwrap();
        let mut met = None;
        // The ICMP is handled on the way out through loopback, or soon after by ksoftirqd.
        for round in 0..50u32 {
            let mut b = batch(round * 4, &[1000; 4]);
            match tx.send_batch(&mut b) {
                Ok(()) => std::thread::sleep(Duration::from_millis(10)),
                Err(SendError::Io { buf, error }) => {
                    met = Some((round, buf, error, b.len()));
                    break;
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        let (round, buf, error, left) = met.unwrap_or_else(|| panic!("{name}: no error met"));
        assert_eq!(error.raw_os_error(), Some(libc::ECONNREFUSED), "{name}");
        assert_eq!(buf, datagram(round * 4, 1000), "{name}: the run's first");
        assert_eq!(left, 3, "{name}: the rest of the run stays");
        let (_, stats) = util::finish(tx);
        assert!(stats.trains >= 1, "{name}: {stats:?}");
        assert_eq!(
            stats.zerocopy_ids, stats.zerocopy_ids_completed,
            "{stats:?}"
        );
    }
}

/// Where a test's batch buffers come from and go back to: heap buffers, or blocks of a pool
/// registered with the sender's ring. Each buffer is overwritten the instant it comes back, so
/// an early release would put the overwrite on the wire.
trait Source<B> {
    /// Datagram `n` of `len` bytes, or `None` until a buffer comes back.
    fn make(&mut self, n: u32, len: usize) -> Option<B>;
    /// A buffer back from the sender: overwritten at once.
    fn back(&mut self, buf: B);
}

/// Heap buffers ([`datagram`]).
struct Heap;

impl Source<Vec<u8>> for Heap {
    fn make(&mut self, n: u32, len: usize) -> Option<Vec<u8>> {
        Some(datagram(n, len))
    }

    fn back(&mut self, mut buf: Vec<u8>) {
        buf.fill(0xEE);
    }
}

/// Blocks of a [`BufPool`] of 2 KiB blocks: two datagrams to a page, each its own page
/// fragment.
struct Pool {
    pool: BufPool,
    free: Vec<PoolBufMut>,
}

impl Pool {
    fn new(blocks: usize) -> Self {
        let pool = BufPool::new(2048, blocks).unwrap();
        let free = (0..blocks).map(|_| pool.take().unwrap()).collect();
        Self { pool, free }
    }
}

impl Source<PooledBuf> for Pool {
    fn make(&mut self, n: u32, len: usize) -> Option<PooledBuf> {
        let mut b = self.free.pop()?;
        b[..len].copy_from_slice(&datagram(n, len));
        Some(b.freeze(len))
    }

    fn back(&mut self, buf: PooledBuf) {
        let mut m = buf.into_mut();
        m.fill(0xEE);
        self.free.push(m);
    }
}

/// [`send_batches`] through `tx` with buffers from `src`: `send_batch` of `sizes` (numbered on
/// across rounds), `rounds` times; every buffer back is checked (no error, its whole length)
/// and given back to `src` at once. Returns the final counters.
fn send_batches_from<B: zerotx::SendBuf>(
    mut tx: Sender<B>,
    src: &mut impl Source<B>,
    sizes: &[usize],
    rounds: u32,
) -> Stats {
    let mut out = Vec::new();
    let mut back = 0;
    let mut take = |out: &mut Vec<zerotx::Released<B>>, src: &mut dyn FnMut(B)| {
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            assert_eq!(r.report.bytes, r.buf.as_bytes().len());
            src(r.buf);
            back += 1;
        }
    };
    for round in 0..rounds {
        let mut b = VecDeque::new();
        for (i, &len) in sizes.iter().enumerate() {
            let n = round * sizes.len() as u32 + i as u32;
            let buf = loop {
                if let Some(buf) = src.make(n, len) {
                    break buf;
                }
                tx.wait_released(&mut out, Some(Duration::from_secs(10)))
                    .unwrap();
                take(&mut out, &mut |buf| src.back(buf));
            };
            b.push_back(buf);
        }
        tx.send_batch(&mut b).unwrap();
        assert!(b.is_empty());
        tx.reap(&mut out).unwrap();
        take(&mut out, &mut |buf| src.back(buf));
    }
    let (mut rest, stats) = util::finish(tx);
    take(&mut rest, &mut |buf| src.back(buf));
    assert_eq!(
        back,
        sizes.len() * rounds as usize,
        "every buffer back once"
    );
    stats
}

/// The io_uring senders whose batches become trains, and whether each sends from a registered
/// pool; `None`: io_uring is unavailable (skipped, or failed under `ZEROTX_STRICT=1`).
fn uring_batch_engines() -> Option<Vec<(&'static str, SenderConfig, bool)>> {
    let mut engines: Vec<_> = uring_engines()?
        .into_iter()
        .map(|(name, cfg)| (name, cfg, false))
        .collect();
    engines.push((
        "uring-zc pool",
        SenderConfig::new(EngineKind::UringZc),
        true,
    ));
    Some(engines)
}

/// A sender made by `cfg` on `sock` (through io_uring), and the batches of `sizes` sent
/// `rounds` times through it from a registered pool (`pooled`) or the heap.
fn send_uring_batches(
    sock: UdpSocket,
    (name, cfg, pooled): (&str, SenderConfig, bool),
    sizes: &[usize],
    rounds: u32,
) -> Stats {
    if pooled {
        let mut pool = Pool::new(2 * sizes.len());
        let mut tx: Sender<PooledBuf> = Sender::with_config(sock, cfg).unwrap();
        tx.register_pool(&pool.pool).unwrap();
        let stats = send_batches_from(tx, &mut pool, sizes, rounds);
        assert_eq!(
            pool.free.len(),
            pool.pool.count(),
            "{name}: every block back"
        );
        stats
    } else {
        let tx = Sender::with_config(sock, cfg).unwrap();
        assert_uring(&tx, name);
        send_batches_from(tx, &mut Heap, sizes, rounds)
    }
}

/// Every request of a batch is a run's train or a lone datagram: none was refused and sent
/// again, and zero-copy runs were cut to one skb's page fragments before the kernel saw them
/// (no `EMSGSIZE`, which would have split them into one request per datagram).
fn assert_no_refused_request(stats: &Stats, n: u64, name: &str) {
    let alone = n - stats.batch_train_buffers;
    assert_eq!(stats.syscalls, stats.trains + alone, "{name}: {stats:?}");
    assert_eq!(stats.train_splits, 0, "{name}: {stats:?}");
}

/// Every datagram of every batch arrives whole, once and in order across a veth, through each
/// io_uring engine (`auto` as a default sender builds it, and `uring-zc` from a registered pool),
/// with each run in one request, while each buffer is overwritten the instant it comes back; with
/// the switch off the same batches go one request per datagram. The send buffer holds every
/// batch, so no request waits for room and none overtakes another.
#[test]
fn uring_every_datagram_of_a_batch_arrives_as_sent() {
    const ROUNDS: u32 = 8;
    let Some(engines) = uring_batch_engines() else {
        return;
    };
    let sizes = mixed_sizes();
    let n = (sizes.len() as u64) * u64::from(ROUNDS);
    let rounds = u64::from(ROUNDS);
    for (name, cfg, pooled) in engines {
        for trains in [true, false] {
            let cfg = cfg.clone().with_batch_trains(trains);
            let result = over_veth(
                1500,
                libc::IPPROTO_UDP,
                || true,
                |sock| receive_all(&sock, Duration::from_secs(1)),
                || {
                    let sock = util::deep_udp("192.0.2.2:9".parse().unwrap(), false);
                    let stats = send_uring_batches(sock, (name, cfg, pooled), &sizes, ROUNDS);
                    assert_eq!(stats.sends, n, "{name}: {stats:?}");
                    if !trains {
                        assert_eq!((stats.trains, stats.syscalls), (0, n), "{name}: {stats:?}");
                        return;
                    }
                    assert_no_refused_request(&stats, n, name);
                    if name == "uring" || name == "auto" {
                        // Runs of 30 + 1, 3, 50 and 2, and four lone datagrams, per round, copied
                        // (`auto`: a zero-copy train of separate buffers would carry too few
                        // bytes, and this route copies anyway).
                        assert_eq!(stats.batch_train_buffers, 86 * rounds, "{name}: {stats:?}");
                        assert_eq!(stats.trains, 4 * rounds, "{name}: {stats:?}");
                    } else {
                        // A zero-copy train of separate buffers carries at most 17 of them.
                        assert!(stats.trains >= 4 * rounds, "{name}: {stats:?}");
                        assert!(
                            stats.batch_train_buffers >= 80 * rounds,
                            "{name}: {stats:?}"
                        );
                    }
                },
            );
            let Some(got) = result else { return };
            assert_eq!(got.len(), n as usize, "{name} {trains}");
            for (i, data) in got.iter().enumerate() {
                let want = datagram(i as u32, sizes[i % sizes.len()]);
                assert!(*data == want, "{name} {trains}: datagram {i} differs");
            }
        }
    }
}

/// Into the black hole, each run of a batch goes as one io_uring request and every buffer of it
/// comes back zero-copy after that request's notification: contiguous buffers in runs cut only
/// by the kernel's limits, separate heap buffers and registered pool blocks in runs of at most
/// 17 (one skb's page fragments), never refused. A default `auto` sender sends a run of 44 x
/// 1472 B as one request too (copied: a zero-copy train of separate buffers would carry too few
/// bytes; zero-copy when the buffers are contiguous). With the switch off, one request each.
#[test]
fn uring_black_hole_one_request_per_run() {
    let Some(engines) = uring_engines() else {
        return;
    };
    util::in_black_hole(1500, |bh| {
        let zc = SenderConfig::new(EngineKind::UringZc);
        // Three runs by bytes: 44 x 1472, 44 x 1472, 10 x 1472 + 500.
        let mut sizes = vec![1472; 98];
        sizes.push(500);
        let mut tx: Sender<Bytes> = Sender::with_config(connected_udp(bh.v4), zc.clone()).unwrap();
        tx.send_batch(&mut contiguous(&sizes)).unwrap();
        let (released, stats) = util::finish(tx);
        assert_eq!(released.len(), 99);
        assert!(
            released
                .iter()
                .all(|r| r.report.path == SendPath::ZeroCopy && r.report.error.is_none()),
            "{stats:?}"
        );
        assert_eq!((stats.trains, stats.syscalls), (3, 3), "{stats:?}");
        assert_eq!(stats.completions, 3, "one notification per run: {stats:?}");
        assert_eq!(stats.batch_train_buffers, 99, "{stats:?}");

        // Separate heap buffers, and blocks of a registered pool.
        let sizes = vec![1472; 99];
        for (name, cfg, pooled) in uring_batch_engines().unwrap() {
            if name != "uring-zc" && name != "uring-zc pool" {
                continue;
            }
            let stats = send_uring_batches(connected_udp(bh.v4), (name, cfg, pooled), &sizes, 1);
            assert!(stats.trains >= 99u64.div_ceil(17), "{name}: {stats:?}");
            assert_no_refused_request(&stats, 99, name);
            assert_eq!(stats.zerocopy, 99, "{name}: {stats:?}");
        }

        // The default sender: `auto` on io_uring.
        let run = vec![1472; 44];
        let tx = Sender::new(connected_udp(bh.v4), EngineKind::Auto).unwrap();
        assert_uring(&tx, "auto");
        let stats = send_batches_from(tx, &mut Heap, &run, 4);
        assert_eq!((stats.trains, stats.syscalls), (4, 4), "auto: {stats:?}");
        assert_eq!(stats.batch_train_buffers, 4 * 44, "auto: {stats:?}");
        let mut tx: Sender<Bytes> = Sender::new(connected_udp(bh.v4), EngineKind::Auto).unwrap();
        tx.send_batch(&mut contiguous(&run)).unwrap();
        let (released, stats) = util::finish(tx);
        assert_eq!((stats.trains, stats.syscalls), (1, 1), "auto: {stats:?}");
        assert!(
            released.iter().all(|r| r.report.path == SendPath::ZeroCopy),
            "auto: {stats:?}"
        );

        for (name, cfg) in engines {
            let tx = Sender::with_config(connected_udp(bh.v4), cfg.with_batch_trains(false));
            let stats = send_batches_from(tx.unwrap(), &mut Heap, &sizes, 1);
            assert_eq!((stats.trains, stats.syscalls), (0, 99), "{name}: {stats:?}");
        }
    });
}

/// A run whose train netfilter drops whole (`EPERM`) on io_uring: the answer comes in the
/// request's CQE, after `send_batch` returned, so every buffer of the run comes back with the
/// error (none of them went), one request, nothing sent again; the batch's lone datagrams after
/// it fail alone. A train passes a rule that drops one datagram size (it sees one packet).
#[test]
fn uring_a_dropped_run_fails_every_buffer_of_it() {
    let Some(engines) = uring_batch_engines() else {
        return;
    };
    util::in_black_hole(1500, |bh| {
        let rules = "table inet zerotx_uring_runs {\n  chain out {\n    type filter hook output \
                     priority 0; policy accept;\n    udp length 1008 drop\n    udp dport 10 \
                     drop\n  }\n}\n";
        if !util::run_tool("nft", &["-f", "-"], Some(rules)) {
            require!(false, "nft unavailable");
        }
        for (name, cfg, pooled) in engines {
            // 1000-byte datagrams in a train pass the length rule.
            let stats = send_uring_batches(
                connected_udp(bh.v4),
                (name, cfg.clone(), pooled),
                &[1000; 4],
                1,
            );
            assert_eq!((stats.trains, stats.syscalls), (1, 1), "{name}: {stats:?}");
            // Port 10: every packet dropped, the train whole; then one lone datagram.
            let dest = std::net::SocketAddr::new(bh.v4.ip(), 10);
            let mut tx = Sender::with_config(connected_udp(dest), cfg).unwrap();
            let mut b = batch(0, &[1000, 1000, 1000, 1000, 1000, 1200]);
            tx.send_batch(&mut b).unwrap();
            assert!(b.is_empty(), "{name}");
            let failed = util::flush_after_faults(&mut tx, Duration::from_secs(5), name);
            assert_eq!(failed, 6, "{name}: {:?}", tx.stats());
            let (released, stats) = util::finish(tx);
            assert_eq!(released.len(), 6, "{name}");
            for (i, r) in released.iter().enumerate() {
                let error = r.report.error.as_ref().map(|e| e.raw_os_error());
                assert_eq!(error, Some(Some(libc::EPERM)), "{name}: buffer {i}");
                assert_eq!(r.report.bytes, 0, "{name}: buffer {i}");
            }
            let mut numbers: Vec<u32> = released
                .iter()
                .map(|r| u32::from_be_bytes(r.buf[..4].try_into().unwrap()))
                .collect();
            numbers.sort_unstable();
            assert_eq!(numbers, [0, 1, 2, 3, 4, 5], "{name}");
            assert_eq!(
                (stats.syscalls, stats.trains),
                (2, 0),
                "{name}: the run's request and the lone one, nothing again: {stats:?}"
            );
        }
    });
}

/// A qdisc that drops (a `tbf` far slower than any sender, 50 Mbit/s, with a short queue) under
/// `IP_RECVERR`, through each io_uring engine: a run whose train it dropped whole (`ENOBUFS` in
/// the CQE) comes back with the error on every buffer; every buffer comes back once, nothing is
/// released early (each is overwritten the instant it comes back), no datagram arrives twice or
/// changed, and none reported failed arrived.
#[test]
fn uring_qdisc_drops_with_recverr_lose_no_buffer_and_repeat_no_datagram() {
    const ROUNDS: u32 = 60;
    const RUN: usize = 20;
    let Some(engines) = uring_engines() else {
        return;
    };
    for (name, cfg) in engines {
        let qdisc = || tbf("50mbit", "32kb", "64kb");
        // The numbers of the datagrams whose buffers came back with the error.
        let failed = std::sync::Mutex::new(Vec::new());
        let result = over_veth(
            1500,
            libc::IPPROTO_UDP,
            qdisc,
            |sock| receive_all(&sock, Duration::from_secs(2)),
            || {
                let sock = util::deep_udp("192.0.2.2:9".parse().unwrap(), true);
                let mut tx = Sender::with_config(sock, cfg).unwrap();
                assert_uring(&tx, name);
                let mut failed = failed.lock().unwrap();
                let mut back = 0;
                let mut take = |out: &mut Vec<zerotx::Released<Vec<u8>>>| {
                    for mut r in out.drain(..) {
                        if let Some(e) = &r.report.error {
                            assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS), "{name}");
                            assert_eq!(r.report.bytes, 0, "{name}");
                            failed.push(u32::from_be_bytes(r.buf[..4].try_into().unwrap()));
                        }
                        r.buf.fill(0xEE);
                        back += 1;
                    }
                };
                let mut out = Vec::new();
                for round in 0..ROUNDS {
                    let mut b = batch(round * RUN as u32, &[1472; RUN]);
                    tx.send_batch(&mut b).unwrap();
                    assert!(b.is_empty(), "{name}");
                    tx.reap(&mut out).unwrap();
                    take(&mut out);
                }
                util::flush_after_faults(&mut tx, Duration::from_secs(20), name);
                tx.reap(&mut out).unwrap();
                take(&mut out);
                let (mut rest, stats) = util::finish(tx);
                take(&mut rest);
                assert_eq!(back, ROUNDS as usize * RUN, "{name}: buffers back once");
                assert!(stats.trains > 0, "{name}: {stats:?}");
            },
        );
        let Some(got) = result else { return };
        let failed = failed.into_inner().unwrap();
        let mut seen = std::collections::HashSet::new();
        for data in &got {
            let n = u32::from_be_bytes(data[..4].try_into().unwrap());
            assert!(*data == datagram(n, 1472), "{name}: datagram {n} changed");
            assert!(seen.insert(n), "{name}: datagram {n} arrived twice");
        }
        for n in &failed {
            assert!(
                !seen.contains(n),
                "{name}: datagram {n} arrived, reported failed"
            );
        }
        assert!(
            !got.is_empty() && got.len() < ROUNDS as usize * RUN,
            "{name}: the qdisc dropped nothing ({} arrived)",
            got.len()
        );
        eprintln!("{name}: {} arrived, {} failed", got.len(), failed.len());
    }
}

/// A UDP-Lite socket never checksums a GSO packet: on `uring` the first run's train request
/// answers `EIO` in its CQE, and its datagrams go one per request, each request exactly one
/// buffer of the run; the path is remembered, so the next batch's runs go one per request at
/// once. Every datagram arrives once, whole, in order.
#[test]
fn uring_a_path_that_cannot_checksum_a_run_gets_its_datagrams_one_by_one() {
    require!(util::is_root(), "needs root for a network namespace");
    if uring_engines().is_none() {
        return;
    }
    zerotx_testbed::in_new_netns(|| {
        let Some(rx) = receiver_of("127.0.0.1:0", libc::IPPROTO_UDPLITE) else {
            return;
        };
        let tx_sock = udp_of(libc::IPPROTO_UDPLITE).unwrap();
        tx_sock.connect(&rx.local_addr().unwrap().into()).unwrap();
        let tx_sock: std::net::UdpSocket = tx_sock.into();
        let mut sizes = vec![1000; 9];
        sizes.push(600);
        let mut tx = Sender::new(tx_sock, EngineKind::Uring).unwrap();
        tx.send_batch(&mut batch(0, &sizes)).unwrap();
        tx.flush(Duration::from_secs(5)).unwrap();
        tx.send_batch(&mut batch(10, &sizes)).unwrap();
        let (released, stats) = util::finish(tx);
        assert_eq!(released.len(), 20);
        assert!(released.iter().all(|r| r.report.error.is_none()));
        assert_eq!(stats.train_splits, 1, "{stats:?}");
        assert_eq!(stats.trains, 0, "{stats:?}");
        assert_eq!(
            stats.syscalls,
            1 + 20,
            "one refused train, then 20 datagrams: {stats:?}"
        );
        let got = receive_all(&rx, Duration::from_millis(300));
        assert_eq!(got.len(), 20);
        for (i, data) in got.iter().enumerate() {
            let want = datagram(i as u32, sizes[i % 10]);
            assert!(*data == want, "datagram {i}");
        }
    })
    .unwrap();
}

/// A path MTU that dropped under a run: the run's train, cut for the old MTU, is refused in its
/// CQE (`EMSGSIZE`, measured on 6.18: a segment above the path MTU), and its datagrams go one per request by copy
/// (the kernel fragments each), every buffer back without an error; the next batch reads the
/// path MTU again and sends no train of datagrams above it.
#[test]
fn uring_a_run_above_a_path_mtu_that_dropped_goes_datagram_by_datagram() {
    let Some(engines) = uring_engines() else {
        return;
    };
    util::in_black_hole(1500, |bh| {
        for (name, cfg) in engines {
            assert!(util::run_tool(
                "ip",
                &["link", "set", "zc0", "mtu", "1500"],
                None
            ));
            let mut tx: Sender<Bytes> = Sender::with_config(connected_udp(bh.v4), cfg).unwrap();
            assert_uring(&tx, name);
            let sizes = [1472; 10];
            tx.send_batch(&mut contiguous(&sizes)).unwrap();
            tx.flush(Duration::from_secs(5)).unwrap();
            assert_eq!(tx.stats().trains, 1, "{name}: {:?}", tx.stats());
            assert!(util::run_tool(
                "ip",
                &["link", "set", "zc0", "mtu", "1200"],
                None
            ));
            tx.send_batch(&mut contiguous(&sizes)).unwrap();
            tx.flush(Duration::from_secs(5)).unwrap();
            tx.send_batch(&mut contiguous(&sizes)).unwrap();
            let (released, stats) = util::finish(tx);
            assert!(
                released.iter().all(|r| r.report.error.is_none()),
                "{name}: {stats:?}"
            );
            assert_eq!(stats.sends, 30, "{name}: {stats:?}");
            assert_eq!(
                (stats.trains, stats.train_splits, stats.syscalls),
                (1, 0, 1 + 1 + 10 + 10),
                "{name}: a train, a refused one, its datagrams, then datagrams: {stats:?}"
            );
        }
    });
}

const MEMLOCK_CHILD: &str = "ZEROTX_RUNS_MEMLOCK_CHILD";

/// The zero-copy budget on io_uring runs: see [`uring_runs_memlock_child`].
#[test]
fn uring_runs_under_a_locked_memory_limit() {
    require!(
        util::is_root(),
        "needs root to drop CAP_IPC_LOCK in a child"
    );
    util::run_child_test("uring_runs_memlock_child", MEMLOCK_CHILD);
}

/// Under a 64 KiB locked-memory limit, `uring-zc` runs of 11 x 1472 B (one allocation, about 16
/// KiB of pinned pages each) queue behind a slow `tbf` (no drops): the pages stay pinned, and
/// the kernel refuses later runs (`ENOMEM`, counted in `Stats::enobufs`); a refused run waits
/// for pages or goes by copy, as a train does, still one request: every buffer comes back
/// without an error and every datagram arrives once, whole.
#[test]
#[ignore = "runs in its own process, started by uring_runs_under_a_locked_memory_limit"]
fn uring_runs_memlock_child() {
    const ROUNDS: u32 = 40;
    const RUN: usize = 11;
    if std::env::var(MEMLOCK_CHILD).is_err() {
        return;
    }
    util::limit_locked_memory(64 * 1024);
    let qdisc = || tbf("50mbit", "16kb", "8mb");
    let got = over_veth(
        1500,
        libc::IPPROTO_UDP,
        qdisc,
        |sock| receive_all(&sock, Duration::from_secs(2)),
        || {
            let mut cfg = SenderConfig::new(EngineKind::UringZc);
            cfg.uring.entries = 16;
            let sock = util::deep_udp("192.0.2.2:9".parse().unwrap(), false);
            let mut tx: Sender<Bytes> = Sender::with_config(sock, cfg).unwrap();
            let mut out = Vec::new();
            for round in 0..ROUNDS {
                let mut b = contiguous_from(round * RUN as u32, &[1472; RUN]);
                tx.send_batch(&mut b).unwrap();
                tx.reap(&mut out).unwrap();
            }
            let (rest, stats) = util::finish(tx);
            out.extend(rest);
            assert_eq!(out.len(), ROUNDS as usize * RUN, "{stats:?}");
            assert!(out.iter().all(|r| r.report.error.is_none()), "{stats:?}");
            assert!(
                stats.enobufs > 0,
                "no ENOMEM under a 64 KiB limit: {stats:?}"
            );
            assert_eq!(stats.trains, u64::from(ROUNDS), "{stats:?}");
            assert_eq!(stats.batch_train_buffers, u64::from(ROUNDS) * RUN as u64);
            println!(
                "uring_runs_memlock_child: enobufs={} fallbacks={} zerocopy={} requests={}",
                stats.enobufs, stats.fallbacks, stats.zerocopy, stats.syscalls
            );
        },
    );
    if let Some(got) = got {
        let mut seen = std::collections::HashSet::new();
        for data in &got {
            let n = u32::from_be_bytes(data[..4].try_into().unwrap());
            assert!(*data == datagram(n, 1472), "datagram {n} changed");
            assert!(seen.insert(n), "datagram {n} arrived twice");
        }
        assert_eq!(got.len(), ROUNDS as usize * RUN);
    }
    println!("uring_runs_memlock_child: ok");
}
