//! Every UDP fault class of the hardening issues, for trains (UDP GSO, `Sender::send_train`), on
//! the running kernel, through each engine: `copy`, `msg-zc`, `auto` (on `sendmsg(2)`), and the
//! io_uring engines and `auto` free to pick them, which may refuse trains (`SendError::Invalid`:
//! printed as "not built", never a failure). The kernel's rules behind each class:
//! docs/kernel.md, "UDP GSO trains".
//!
//! Each buffer is overwritten the instant it comes back, each train's report is counted by the
//! train number in its first bytes, and a receiver checks every datagram the path delivers (its
//! bytes, its count, its order). The classes, each in namespaces of its own:
//! - `veth`: trains to a receiver on a veth peer in another namespace arrive whole and in order;
//! - `nft-drop`: an nftables output rule drops every 50th packet: those trains come back with
//!   `EPERM` and their buffer, the others arrive, and the ledger stays in step;
//! - `qdisc-drop`: a `tbf` qdisc far slower than any sender, with `IP_RECVERR`: trains it drops
//!   come back with `ENOBUFS`, the ones it takes arrive whole, none twice;
//! - `refusals`: a segment above the MTU comes back with `EMSGSIZE` (nothing of it sent), too many
//!   segments are refused before any call, and the next train arrives;
//! - `udplite-eio`: UDP-Lite cannot checksum a GSO packet (`EIO`): the train goes one datagram per
//!   call, each delivered once, in order;
//! - `local`: a train to a local socket comes back copied, and `auto` learns it.
//!
//! Prints `VMTEST: pass|FAIL train-faults <class> <engine>: ...` per check (the lines
//! `scripts/vm-test.sh` counts) and exits 1 on any failure. Runs as root; needs `ip`, `nft` and
//! `tc`. Two more modes make the virtio-net path of the Debian guests: `--to ADDR` sends trains
//! through every engine to a receiver at ADDR and prints each engine's zero-copy share;
//! `--receive ADDR` is that receiver (run on the far side), checking every datagram that arrives
//! until the sender says it is done.
//!
//! ```sh
//! cargo run --release -p zerotx-cli --example train_faults
//! ```
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::mem;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::panic::{self, AssertUnwindSafe};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use zerotx::{CopyReason, EngineKind, SendError, SendPath, Sender, SenderConfig, Stats};

/// The datagram size of the trains: a 1500-byte MTU less the IPv4 and UDP headers.
pub const SEG: usize = 1472;
/// Each datagram's header: train, datagram, datagrams in the train, this datagram's length.
const HEADER: usize = 16;
/// What a sender sends when it is done, so its receiver stops without waiting on a timeout.
const DONE: &[u8] = b"train-faults: done";
/// The far side of every veth here.
const FAR: &str = "192.0.2.2:9";

/// Every engine, by the name the CLI gives it. `auto` stays on `sendmsg(2)`; `auto-uring` may
/// pick io_uring.
pub fn engines() -> Vec<(&'static str, SenderConfig)> {
    vec![
        ("copy", SenderConfig::new(EngineKind::Copy)),
        ("msg-zc", SenderConfig::new(EngineKind::MsgZerocopy)),
        (
            "auto",
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ),
        ("uring", SenderConfig::new(EngineKind::Uring)),
        ("uring-zc", SenderConfig::new(EngineKind::UringZc)),
        ("auto-uring", SenderConfig::new(EngineKind::Auto)),
    ]
}

/// Whether an engine may refuse trains as not built yet (the io_uring ones).
fn may_lack_trains(name: &str) -> bool {
    name.contains("uring")
}

/// The byte at `i` of datagram `d` of train `t`.
fn pattern(t: u32, d: u32, i: usize) -> u8 {
    (t.wrapping_mul(31) ^ d.wrapping_mul(7)).wrapping_add(i as u32) as u8
}

/// Train `t`: `count` datagrams of `segment` bytes, the last `last`; each starts with its
/// [`HEADER`], then [`pattern`].
pub fn train(t: u32, segment: usize, count: usize, last: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(segment * (count - 1) + last);
    for d in 0..count as u32 {
        let len = if d as usize + 1 == count {
            last
        } else {
            segment
        };
        for v in [t, d, count as u32, len as u32] {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        buf.extend((HEADER..len).map(|i| pattern(t, d, i)));
    }
    buf
}

fn word(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(data[at..at + 4].try_into().expect("four bytes"))
}

/// Checks one received datagram against its header: `(train, datagram, count)`, or what was
/// wrong with it.
pub fn check_datagram(data: &[u8]) -> Result<(u32, u32, u32), String> {
    if data.len() < HEADER {
        return Err(format!("a datagram of {} bytes", data.len()));
    }
    let (t, d, n, len) = (word(data, 0), word(data, 4), word(data, 8), word(data, 12));
    if d >= n || data.len() != len as usize {
        return Err(format!(
            "train {t} datagram {d} of {n}: {} bytes, its header says {len}",
            data.len()
        ));
    }
    match (HEADER..data.len()).find(|&i| data[i] != pattern(t, d, i)) {
        Some(i) => Err(format!("train {t} datagram {d}: byte {i} changed")),
        None => Ok((t, d, n)),
    }
}

/// Reads datagrams until [`DONE`] (or 10 s without one): every datagram before it.
fn receive_until_done(sock: &UdpSocket) -> Vec<Vec<u8>> {
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = sock.recv(&mut buf) {
        if &buf[..n] == DONE {
            break;
        }
        got.push(buf[..n].to_vec());
    }
    got
}

/// Checks what a receiver got: every datagram intact, none twice. Returns `(train, datagram)`
/// in arrival order.
fn checked(got: &[Vec<u8>]) -> Vec<(u32, u32)> {
    let mut seen = HashSet::new();
    got.iter()
        .map(|data| {
            let (t, d, _) = check_datagram(data).unwrap_or_else(|e| panic!("{e}"));
            assert!(seen.insert((t, d)), "train {t} datagram {d} arrived twice");
            (t, d)
        })
        .collect()
}

/// Asserts that exactly `trains`, each of `count` datagrams, arrived, in order.
fn assert_arrived_in_order(order: &[(u32, u32)], trains: &[u32], count: u32) {
    let want: Vec<(u32, u32)> = trains
        .iter()
        .flat_map(|&t| (0..count).map(move |d| (t, d)))
        .collect();
    assert_eq!(order.len(), want.len(), "datagrams received");
    if let Some(i) = (0..want.len()).find(|&i| order[i] != want[i]) {
        panic!(
            "datagram {i} was train {} datagram {}, expected {:?}",
            order[i].0, order[i].1, want[i]
        );
    }
}

fn set_int(fd: impl AsFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: v is a live local of the size given; the fd is borrowed for the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A datagram socket of `protocol` (UDP or UDP-Lite) bound to `addr`, its receive buffer
/// forced to 8 MiB (root) so a slow reader drops nothing.
fn receiver(addr: SocketAddr, protocol: i32) -> io::Result<UdpSocket> {
    let sock = datagram_socket(protocol)?;
    sock.bind(&addr.into())?;
    rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, 8 << 20)?;
    Ok(sock.into())
}

fn datagram_socket(protocol: i32) -> io::Result<socket2::Socket> {
    let proto = Some(socket2::Protocol::from(protocol));
    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, proto)
}

/// A socket of `protocol` connected to `dest`.
fn connected(dest: SocketAddr, protocol: i32) -> io::Result<UdpSocket> {
    let sock = datagram_socket(protocol)?;
    sock.connect(&dest.into())?;
    Ok(sock.into())
}

/// Runs a tool; its failure is an error that names it and says what it printed.
fn tool(name: &str, args: &[&str], stdin: Option<&str>) -> io::Result<()> {
    use std::io::Write;
    let mut cmd = Command::new(name);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{name}: {e} (is it installed?)")))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{name} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    tool("ip", args, None)
}

/// The thread's kernel id, for `ip link set ... netns`.
fn tid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// A veth pair across two fresh namespaces: the sender's `zc0` (192.0.2.1/24) and the
/// receiver's `zc1` (192.0.2.2/24), MTU 1500. `prep` sets up the sender's namespace; `recv`
/// runs in the receiver's with a socket of `protocol` bound to [`FAR`]; `send` runs in the
/// sender's once a probe came through (until the carrier is up the device drops without an
/// error). Both results come back.
fn over_veth<R: Send, S: Send>(
    protocol: i32,
    prep: impl FnOnce() -> io::Result<()> + Send,
    recv: impl FnOnce(UdpSocket) -> R + Send,
    send: impl FnOnce() -> S + Send,
) -> io::Result<(R, S)> {
    zerotx_testbed::in_new_netns(|| -> io::Result<(R, S)> {
        ip(&["link", "add", "zc0", "type", "veth", "peer", "name", "zc1"])?;
        ip(&["addr", "add", "192.0.2.1/24", "dev", "zc0"])?;
        ip(&["link", "set", "zc0", "mtu", "1500", "up"])?;
        prep()?;
        let (tid_tx, tid_rx) = mpsc::channel();
        let (moved_tx, moved_rx) = mpsc::channel::<()>();
        let (bound_tx, bound_rx) = mpsc::channel();
        let (through_tx, through_rx) = mpsc::channel();
        std::thread::scope(|s| {
            let far = s.spawn(move || {
                zerotx_testbed::in_new_netns(move || -> io::Result<R> {
                    tid_tx.send(tid()).expect("the sender waits");
                    moved_rx.recv().map_err(io::Error::other)?;
                    ip(&["addr", "add", "192.0.2.2/24", "dev", "zc1"])?;
                    ip(&["link", "set", "zc1", "mtu", "1500", "up"])?;
                    let sock = receiver(FAR.parse().expect("an address"), protocol)?;
                    let probes = UdpSocket::bind("192.0.2.2:8")?;
                    bound_tx.send(()).expect("the sender waits");
                    probes.set_read_timeout(Some(Duration::from_secs(10)))?;
                    probes.recv(&mut [0u8; 8])?;
                    through_tx.send(()).expect("the sender waits");
                    Ok(recv(sock))
                })?
            });
            let far_tid = tid_rx.recv().map_err(io::Error::other)?.to_string();
            ip(&["link", "set", "zc1", "netns", &far_tid])?;
            moved_tx.send(()).map_err(io::Error::other)?;
            bound_rx
                .recv()
                .map_err(|_| io::Error::other("the receiver's namespace failed"))?;
            let probe = UdpSocket::bind("192.0.2.1:0")?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while through_rx.try_recv().is_err() && Instant::now() < deadline {
                let _ = probe.send_to(b"probe", "192.0.2.2:8");
                std::thread::sleep(Duration::from_millis(10));
            }
            let sent = send();
            let got = far.join().unwrap_or_else(|p| panic::resume_unwind(p))?;
            Ok((got, sent))
        })
    })?
}

/// Tells the receiver of `protocol` at `dest` that the sender is done (retried: a full qdisc
/// refuses it).
fn say_done(dest: SocketAddr, protocol: i32) {
    let sock = connected(dest, protocol).expect("a socket");
    let deadline = Instant::now() + Duration::from_secs(5);
    while sock.send(DONE).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a sender's trains came to: each train's report by its number, the trains refused at
/// the call with their errno, and the final counters.
#[derive(Debug, Default)]
struct Tally {
    reports: BTreeMap<u32, (SendPath, usize)>,
    refused: BTreeMap<u32, i32>,
    stats: Stats,
}

impl Tally {
    fn paths(&self) -> impl Iterator<Item = SendPath> + '_ {
        self.reports.values().map(|(p, _)| *p)
    }

    fn zero_copy(&self) -> usize {
        self.paths().filter(|p| *p == SendPath::ZeroCopy).count()
    }
}

/// A sender of trains that overwrites every buffer the instant it comes back and counts each
/// train's report once.
struct Trains {
    tx: Sender<Vec<u8>>,
    tally: Tally,
    out: Vec<zerotx::Released<Vec<u8>>>,
}

/// A train refused as not built by an engine that may lack trains.
struct NotBuilt(String);

impl Trains {
    fn new(sock: UdpSocket, cfg: SenderConfig) -> Self {
        Self::from(Sender::with_config(sock, cfg).unwrap_or_else(|e| panic!("the sender: {e}")))
    }

    fn from(tx: Sender<Vec<u8>>) -> Self {
        Trains {
            tx,
            tally: Tally::default(),
            out: Vec::new(),
        }
    }

    /// Sends train `t` (to `dest` if given); a refusal at the call is counted with its errno
    /// after checking the buffer came back unchanged. `Invalid` is returned as it is.
    fn send(
        &mut self,
        t: u32,
        buf: Vec<u8>,
        segment: usize,
        dest: Option<SocketAddr>,
    ) -> Result<(), SendError<Vec<u8>>> {
        let copy = buf.clone();
        let sent = match dest {
            Some(dest) => self.tx.send_train_to(buf, segment as u16, dest),
            None => self.tx.send_train(buf, segment as u16),
        };
        let result = match sent {
            Ok(()) => Ok(()),
            Err(SendError::Io { buf, error }) => {
                assert!(buf == copy, "train {t} came back changed with {error}");
                let errno = error.raw_os_error().unwrap_or(-1);
                assert!(
                    self.tally.refused.insert(t, errno).is_none(),
                    "train {t} refused twice"
                );
                Ok(())
            }
            Err(e) => Err(e),
        };
        self.reap();
        result
    }

    /// Takes what came back: one report per train, buffers overwritten at once.
    fn reap(&mut self) {
        if let Err(e) = self.tx.reap(&mut self.out) {
            panic!("reap: {e}");
        }
        self.take();
    }

    fn take(&mut self) {
        for mut r in self.out.drain(..) {
            let t = word(&r.buf, 0);
            assert!(
                r.report.error.is_none(),
                "train {t} came back with {:?}",
                r.report.error
            );
            assert_eq!(r.report.bytes, r.buf.len(), "train {t}: bytes reported");
            r.buf.fill(0xEE);
            let before = self.tally.reports.insert(t, (r.report.path, r.buf.len()));
            assert!(before.is_none(), "train {t} came back twice");
            assert!(
                !self.tally.refused.contains_key(&t),
                "train {t} refused and released"
            );
        }
    }

    /// Waits for every buffer, closes, and checks that nothing was kept or refused by the
    /// ledger.
    fn finish(mut self) -> Tally {
        if let Err(e) = self.tx.flush(Duration::from_secs(20)) {
            panic!("flush: {e}; {:?}", self.tx.stats());
        }
        self.reap();
        self.tally.stats = self.tx.stats();
        let stats = &self.tally.stats;
        assert_eq!(stats.bad_completions, 0, "the ledger refused completions");
        assert_eq!(
            stats.zerocopy_ids, stats.zerocopy_ids_completed,
            "ids taken and completed differ: {stats:?}"
        );
        let Trains { tx, tally, out } = self;
        let closed = tx.close(Duration::from_secs(1));
        assert_eq!(closed.kept, 0, "buffers kept at close");
        assert!(
            out.is_empty() && closed.released.is_empty(),
            "buffers back after the flush"
        );
        tally
    }
}

/// Sends trains `0..n` of `count` x [`SEG`] (the last `last` bytes) to `dest`, then says done.
fn send_all(cfg: SenderConfig, sock: UdpSocket, n: u32, count: usize, last: usize) -> Tally {
    let dest = sock.peer_addr().expect("a connected socket");
    let mut tx = Trains::new(sock, cfg);
    for t in 0..n {
        if let Err(e) = tx.send(t, train(t, SEG, count, last), SEG, None) {
            panic!("train {t}: {e}");
        }
    }
    let tally = tx.finish();
    say_done(dest, libc::IPPROTO_UDP);
    tally
}

/// Whether the engine sends trains: a train to a local socket, refused with `Invalid` where it
/// does not (the io_uring engines until they take trains).
fn takes_trains(cfg: SenderConfig) -> Result<(), NotBuilt> {
    zerotx_testbed::in_new_netns(move || {
        let rx = receiver(
            "127.0.0.1:0".parse().expect("an address"),
            libc::IPPROTO_UDP,
        )
        .expect("a receiver");
        let sock = connected(rx.local_addr().expect("bound"), libc::IPPROTO_UDP).expect("a socket");
        let mut tx = Trains::new(sock, cfg);
        match tx.send(0, train(0, 1000, 3, 1000), 1000, None) {
            Ok(()) => {
                tx.finish();
                Ok(())
            }
            Err(SendError::Invalid { reason, .. }) => Err(NotBuilt(reason.to_owned())),
            Err(e) => panic!("a train to a local socket: {e}"),
        }
    })
    .unwrap_or_else(|e| panic!("a namespace: {e}"))
}

/// The path a report should name for an engine that sent through a device (not locally).
fn assert_device_paths(name: &str, tally: &Tally) {
    for (t, (path, _)) in &tally.reports {
        let ok = match name {
            "copy" | "uring" => *path == SendPath::Copied(CopyReason::Engine),
            _ => true,
        };
        assert!(ok, "train {t}: {path:?} from {name}");
    }
}

/// (a) Trains to a receiver on a veth peer arrive whole and in order.
fn veth(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 16;
    const COUNT: usize = 44;
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || Ok(()),
        |sock| receive_until_done(&sock),
        || {
            let sock =
                connected(FAR.parse().expect("an address"), libc::IPPROTO_UDP).expect("a socket");
            send_all(cfg, sock, TRAINS, COUNT, 1000)
        },
    )
    .unwrap_or_else(|e| panic!("the veth: {e}"));
    assert_eq!(tally.reports.len(), TRAINS as usize, "trains back");
    assert!(tally.refused.is_empty(), "refused: {:?}", tally.refused);
    assert_eq!(tally.stats.trains, u64::from(TRAINS), "{:?}", tally.stats);
    assert_eq!(tally.stats.train_splits, 0, "{:?}", tally.stats);
    assert_device_paths(name, &tally);
    let order = checked(&got);
    assert_arrived_in_order(&order, &(0..TRAINS).collect::<Vec<_>>(), COUNT as u32);
    format!(
        "{TRAINS} trains x {COUNT} back once, {} datagrams checked in order, {} trains zero-copy",
        order.len(),
        tally.zero_copy()
    )
}

/// (b) An nftables output rule drops every 50th packet to the receiver's port: trains 0, 50 and
/// 100 come back with `EPERM` and their buffer; every other train arrives, and every id
/// completes.
fn nft_drop(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 140;
    const COUNT: usize = 10;
    let rules = "table inet zxtrains {\n  chain out {\n    type filter hook output priority 0; \
                 policy accept;\n    udp dport 9 numgen inc mod 50 == 0 drop\n  }\n}\n";
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || tool("nft", &["-f", "-"], Some(rules)),
        |sock| receive_until_done(&sock),
        || {
            let sock =
                connected(FAR.parse().expect("an address"), libc::IPPROTO_UDP).expect("a socket");
            send_all(cfg, sock, TRAINS, COUNT, 700)
        },
    )
    .unwrap_or_else(|e| panic!("the veth with nftables: {e}"));
    let dropped: Vec<u32> = vec![0, 50, 100];
    assert_eq!(
        tally.refused.keys().copied().collect::<Vec<_>>(),
        dropped,
        "trains refused"
    );
    assert!(
        tally.refused.values().all(|&e| e == libc::EPERM),
        "errnos: {:?}",
        tally.refused
    );
    assert_eq!(tally.reports.len(), TRAINS as usize - dropped.len());
    if name == "msg-zc" {
        assert_eq!(
            tally.stats.zerocopy_ids,
            u64::from(TRAINS),
            "every train took an id, the dropped ones too: {:?}",
            tally.stats
        );
    }
    assert_device_paths(name, &tally);
    let sent: Vec<u32> = (0..TRAINS).filter(|t| !dropped.contains(t)).collect();
    let order = checked(&got);
    assert_arrived_in_order(&order, &sent, COUNT as u32);
    format!(
        "{} of {TRAINS} trains refused with EPERM, {} back once, {} datagrams checked in order, \
         ids {} taken {} completed",
        dropped.len(),
        tally.reports.len(),
        order.len(),
        tally.stats.zerocopy_ids,
        tally.stats.zerocopy_ids_completed
    )
}

/// (c) A `tbf` qdisc at 2 Mbit/s (far below any sender, a TCG guest's too) with `IP_RECVERR`:
/// the trains it drops come back with `ENOBUFS`, the ones it takes arrive whole, none twice.
fn qdisc_drop(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 60;
    const COUNT: usize = 20;
    let tbf = [
        "qdisc", "add", "dev", "zc0", "root", "tbf", "rate", "2mbit", "burst", "32kb", "limit",
        "64kb",
    ];
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || tool("tc", &tbf, None),
        |sock| receive_until_done(&sock),
        || {
            let sock =
                connected(FAR.parse().expect("an address"), libc::IPPROTO_UDP).expect("a socket");
            set_int(&sock, libc::IPPROTO_IP, libc::IP_RECVERR, 1).expect("IP_RECVERR");
            send_all(cfg, sock, TRAINS, COUNT, SEG)
        },
    )
    .unwrap_or_else(|e| panic!("the veth with a qdisc: {e}"));
    assert!(
        !tally.refused.is_empty(),
        "the qdisc dropped no train: {:?}",
        tally.stats
    );
    assert!(
        tally.refused.values().all(|&e| e == libc::ENOBUFS),
        "errnos: {:?}",
        tally.refused
    );
    assert_eq!(tally.reports.len() + tally.refused.len(), TRAINS as usize);
    assert_device_paths(name, &tally);
    let sent: Vec<u32> = tally.reports.keys().copied().collect();
    let order = checked(&got);
    assert_arrived_in_order(&order, &sent, COUNT as u32);
    format!(
        "{} of {TRAINS} trains refused with ENOBUFS, {} back once and arrived whole ({} \
         datagrams checked)",
        tally.refused.len(),
        tally.reports.len(),
        order.len()
    )
}

/// (d, e) A segment above the MTU comes back with `EMSGSIZE`, nothing of it sent; too many
/// segments are refused before any call; the next train arrives whole.
fn refusals(_name: &str, cfg: SenderConfig) -> String {
    let (got, tally) = over_veth(
        libc::IPPROTO_UDP,
        || Ok(()),
        |sock| receive_until_done(&sock),
        || {
            let dest: SocketAddr = FAR.parse().expect("an address");
            let mut tx = Trains::new(connected(dest, libc::IPPROTO_UDP).expect("a socket"), cfg);
            let big = train(0, SEG + 1, 2, SEG + 1);
            match tx.tx.send_train(big.clone(), SEG as u16 + 1) {
                Err(SendError::Io { buf, error }) => {
                    assert!(buf == big, "the buffer came back changed");
                    // The kernel's errno is in the text (the error carries a hint).
                    let errno = io::Error::from_raw_os_error(libc::EMSGSIZE).to_string();
                    let said = error.to_string();
                    assert!(said.contains(&errno) && said.contains("path MTU"), "{said}");
                }
                other => panic!("a segment above the MTU: {other:?}"),
            }
            let calls = tx.tx.stats().syscalls;
            let many = train(1, 100, 129, 100);
            match tx.tx.send_train(many.clone(), 100) {
                Err(SendError::Invalid { buf, reason }) => {
                    assert!(buf == many, "the buffer came back changed");
                    assert!(reason.contains("UDP_MAX_SEGMENTS"), "{reason}");
                }
                other => panic!("129 segments: {other:?}"),
            }
            assert_eq!(tx.tx.stats().syscalls, calls, "129 segments made a call");
            if let Err(e) = tx.send(2, train(2, SEG, 40, SEG), SEG, None) {
                panic!("the train after the refusals: {e}");
            }
            let tally = tx.finish();
            say_done(dest, libc::IPPROTO_UDP);
            tally
        },
    )
    .unwrap_or_else(|e| panic!("the veth: {e}"));
    assert_eq!(tally.reports.keys().copied().collect::<Vec<_>>(), [2]);
    let order = checked(&got);
    assert_arrived_in_order(&order, &[2], 40);
    "a segment above the MTU: EMSGSIZE, nothing sent; 129 segments refused before any call; \
     the next train arrived whole"
        .into()
}

/// (f) UDP-Lite never checksums a GSO packet (`EIO`): each train goes one datagram per call,
/// every datagram once and in order, and the path is remembered. UDP-Lite has no
/// `SO_ZEROCOPY` (`EOPNOTSUPP`): a zero-copy engine refuses the socket, saying to copy.
fn udplite_eio(name: &str, cfg: SenderConfig) -> String {
    let zero_copy_only = matches!(name, "msg-zc" | "uring-zc");
    zerotx_testbed::in_new_netns(move || {
        let rx = receiver(
            "127.0.0.1:0".parse().expect("an address"),
            libc::IPPROTO_UDPLITE,
        )
        .unwrap_or_else(|e| panic!("a UDP-Lite socket: {e}"));
        let dest = rx.local_addr().expect("bound");
        let sock = connected(dest, libc::IPPROTO_UDPLITE).expect("a socket");
        let tx = match Sender::with_config(sock, cfg) {
            Ok(tx) => tx,
            Err(e) if zero_copy_only => {
                let said = e.to_string();
                assert!(said.contains("copy engine"), "{said}");
                return format!("the socket refused: {said}");
            }
            Err(e) => panic!("the sender: {e}"),
        };
        let mut tx = Trains::from(tx);
        let reader = std::thread::spawn(move || receive_until_done(&rx));
        for t in 0..3 {
            if let Err(e) = tx.send(t, train(t, 1000, 10, 500), 1000, None) {
                panic!("train {t}: {e}");
            }
        }
        let tally = tx.finish();
        say_done(dest, libc::IPPROTO_UDPLITE);
        let got = reader.join().expect("the reader");
        assert_eq!(tally.reports.len(), 3, "trains back");
        assert!(tally.refused.is_empty(), "refused: {:?}", tally.refused);
        assert_eq!(tally.stats.train_splits, 1, "{:?}", tally.stats);
        assert_eq!(tally.stats.trains, 3, "{:?}", tally.stats);
        assert_eq!(
            tally.stats.syscalls,
            1 + 30,
            "one refused train call, then 30 datagrams: {:?}",
            tally.stats
        );
        let order = checked(&got);
        assert_arrived_in_order(&order, &[0, 1, 2], 10);
        format!(
            "EIO split each train into datagrams: {} calls, {} datagrams checked in order, \
             paths {:?}",
            tally.stats.syscalls,
            order.len(),
            tally.paths().collect::<HashSet<_>>()
        )
    })
    .unwrap_or_else(|e| panic!("a namespace: {e}"))
}

/// (g) A train to a local socket comes back copied; `auto` learns it and copies the rest.
fn local(name: &str, cfg: SenderConfig) -> String {
    const TRAINS: u32 = 64;
    let name = name.to_owned();
    zerotx_testbed::in_new_netns(move || {
        let rx = receiver(
            "127.0.0.1:0".parse().expect("an address"),
            libc::IPPROTO_UDP,
        )
        .expect("a receiver");
        let dest = rx.local_addr().expect("bound");
        let reader = std::thread::spawn(move || receive_until_done(&rx));
        let sock = UdpSocket::bind("127.0.0.1:0").expect("a socket");
        let mut tx = Trains::new(sock, cfg);
        for t in 0..TRAINS {
            if let Err(e) = tx.send(t, train(t, 1000, 40, 1000), 1000, Some(dest)) {
                panic!("train {t}: {e}");
            }
            if let Err(e) = tx.tx.flush(Duration::from_secs(5)) {
                panic!("flush: {e}");
            }
            tx.reap();
        }
        let tally = tx.finish();
        say_done(dest, libc::IPPROTO_UDP);
        let order = checked(&reader.join().expect("the reader"));
        assert_arrived_in_order(&order, &(0..TRAINS).collect::<Vec<_>>(), 40);
        assert_eq!(tally.reports.len(), TRAINS as usize);
        let last = tally.reports[&(TRAINS - 1)].0;
        match name.as_str() {
            "copy" | "uring" => assert!(
                tally
                    .paths()
                    .all(|p| p == SendPath::Copied(CopyReason::Engine)),
                "{:?}",
                tally.reports
            ),
            "msg-zc" | "uring-zc" => assert!(
                tally
                    .paths()
                    .all(|p| p == SendPath::Copied(CopyReason::Kernel)),
                "every train copied by the kernel: {:?}",
                tally.reports
            ),
            _ => {
                assert_eq!(tally.stats.switches_to_copy, 1, "{:?}", tally.stats);
                assert_eq!(last, SendPath::Copied(CopyReason::RouteCopies));
            }
        }
        format!(
            "{TRAINS} trains back once, {} zero-copy, the last {last:?}; {} datagrams checked",
            tally.zero_copy(),
            order.len()
        )
    })
    .unwrap_or_else(|e| panic!("a namespace: {e}"))
}

type Class = fn(&str, SenderConfig) -> String;

/// Every class, by the name its lines carry.
pub const CLASSES: [(&str, Class); 6] = [
    ("veth", veth),
    ("nft-drop", nft_drop),
    ("qdisc-drop", qdisc_drop),
    ("refusals", refusals),
    ("udplite-eio", udplite_eio),
    ("local", local),
];

/// Runs `f`, turning a panic into its message.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".into())
    })
}

/// Runs every class through every engine, printing one `VMTEST:` line per check; returns how
/// many failed.
pub fn run_all() -> usize {
    let mut failed = 0;
    for (name, cfg) in engines() {
        match caught(|| takes_trains(cfg.clone())) {
            Ok(Ok(())) => {}
            Ok(Err(NotBuilt(reason))) if may_lack_trains(name) => {
                println!("VMTEST: pass train-faults {name}: trains not built yet ({reason})");
                continue;
            }
            Ok(Err(NotBuilt(reason))) => {
                println!("VMTEST: FAIL train-faults {name}: refuses trains: {reason}");
                failed += 1;
                continue;
            }
            Err(e) => {
                println!("VMTEST: FAIL train-faults {name}: a first train: {e}");
                failed += 1;
                continue;
            }
        }
        for (class, f) in CLASSES {
            let t0 = Instant::now();
            match caught(|| f(name, cfg.clone())) {
                Ok(said) => println!(
                    "VMTEST: pass train-faults {class} {name}: {said} ({} ms)",
                    t0.elapsed().as_millis()
                ),
                Err(e) => {
                    println!("VMTEST: FAIL train-faults {class} {name}: {e}");
                    failed += 1;
                }
            }
        }
    }
    failed
}

/// `--to ADDR`: trains through every engine that takes them to the receiver at ADDR (a real
/// path: the guests' virtio-net), each engine's trains numbered from its own thousand; prints
/// each engine's zero-copy share of its trains' completions. Returns how many failed.
fn send_to(dest: SocketAddr) -> usize {
    const TRAINS: u32 = 32;
    const COUNT: usize = 44;
    let mut failed = 0;
    for (i, (name, cfg)) in engines().into_iter().enumerate() {
        let first = 1000 * i as u32;
        let run = caught(|| {
            let sock = connected(dest, libc::IPPROTO_UDP).expect("a socket");
            let mut tx = Trains::new(sock, cfg);
            for t in first..first + TRAINS {
                match tx.send(t, train(t, SEG, COUNT, 1000), SEG, None) {
                    Ok(()) => {}
                    Err(SendError::Invalid { reason, .. }) if may_lack_trains(name) => {
                        return Err(reason);
                    }
                    Err(e) => panic!("train {t}: {e}"),
                }
            }
            Ok(tx.finish())
        });
        match run {
            Ok(Ok(tally)) => {
                let back = tally.reports.len();
                if back == TRAINS as usize && tally.refused.is_empty() {
                    println!(
                        "VMTEST: pass train-faults net {name}: {back} of {TRAINS} trains back \
                         once, {} of {back} trains zero-copy (paths {:?})",
                        tally.zero_copy(),
                        tally.paths().collect::<HashSet<_>>()
                    );
                } else {
                    println!(
                        "VMTEST: FAIL train-faults net {name}: {back} of {TRAINS} trains back, \
                         refused {:?}",
                        tally.refused
                    );
                    failed += 1;
                }
            }
            Ok(Err(reason)) => {
                println!("VMTEST: pass train-faults net {name}: trains not built yet ({reason})")
            }
            Err(e) => {
                println!("VMTEST: FAIL train-faults net {name}: {e}");
                failed += 1;
            }
        }
    }
    for _ in 0..5 {
        say_done(dest, libc::IPPROTO_UDP);
        std::thread::sleep(Duration::from_millis(100));
    }
    failed
}

/// Per train: the datagrams that arrived, and how many it had.
type Arrivals = BTreeMap<u32, (u32, u32)>;

/// `--receive ADDR`: checks every datagram that arrives until the sender is done (or 10 min
/// pass before the first datagram, 20 s without one after it: the path may drop the sender's
/// last word); prints, per engine, the datagrams checked and the trains that arrived whole (the path
/// may drop datagrams; it must not change or repeat them). Returns how many failed.
fn receive(addr: SocketAddr) -> usize {
    let sock = receiver(addr, libc::IPPROTO_UDP).unwrap_or_else(|e| {
        println!("VMTEST: FAIL train-faults receiver on {addr}: {e}");
        std::process::exit(1)
    });
    println!("train-faults: listening on {addr}");
    sock.set_read_timeout(Some(Duration::from_secs(600)))
        .expect("a timeout");
    let mut seen = HashSet::new();
    let mut per_engine: BTreeMap<u32, (usize, Arrivals)> = BTreeMap::new();
    let mut bad = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = sock.recv(&mut buf) {
        let data = &buf[..n];
        if data == DONE {
            break;
        }
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("a timeout");
        match check_datagram(data) {
            Ok((t, d, count)) => {
                if !seen.insert((t, d)) {
                    bad.push(format!("train {t} datagram {d} arrived twice"));
                }
                let e = per_engine.entry(t / 1000).or_default();
                e.0 += 1;
                e.1.entry(t).or_insert((0, count)).0 += 1;
            }
            Err(e) => bad.push(e),
        }
    }
    let names = engines();
    for (i, (datagrams, trains)) in &per_engine {
        let name = names.get(*i as usize).map_or("?", |(n, _)| n);
        let whole = trains.iter().filter(|(_, (got, sent))| got == sent).count();
        println!(
            "VMTEST: pass train-faults net {name} received: {datagrams} datagrams checked, {whole} \
             of {} trains whole",
            trains.len()
        );
    }
    for b in &bad {
        println!("VMTEST: FAIL train-faults net received: {b}");
    }
    if per_engine.is_empty() {
        println!("VMTEST: FAIL train-faults net received: no datagram arrived");
        return 1;
    }
    bad.len()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |i: usize| -> SocketAddr {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{} ADDR: give an address such as 198.18.0.1:7300", args[0]))
    };
    let failed = match args.first().map(String::as_str) {
        None => run_all(),
        Some("--to") => send_to(addr(1)),
        Some("--receive") => receive(addr(1)),
        Some(other) => {
            eprintln!("usage: train_faults [--to ADDR | --receive ADDR] (not {other})");
            2
        }
    };
    if failed > 0 {
        std::process::exit(1);
    }
}
