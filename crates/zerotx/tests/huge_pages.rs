//! A registered pool under transparent huge pages `always` (Debian's and RHEL's default): the
//! kernel must charge zero-copy sends from it at their size. On huge pages io_uring merges the
//! registered region into multi-page segments and the stack charges each send from the start of
//! its huge page (see `buf/pool.rs`): 44 times the bytes on loopback here, a peer window of about
//! 1 KB, a stream that crawls at the zero-window probe timer (the Debian 6.12 guest's
//! `integrity uring-zc+pool tcp` check timed out that way). The pool opts out of huge pages.
//!
//! A pool made by `BufPool::huge` is on huge pages on purpose: sends from it that are not
//! registered are charged at their size too; `uring-zc` refuses to register it, and `auto` takes
//! it unregistered.
//!
//! Its own test binary: it sets `/sys/kernel/mm/transparent_hugepage/enabled` for the whole
//! machine while a test runs (one at a time, and puts the old mode back), which no other test
//! binary should see.
#![allow(unsafe_code)]

mod util;

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use util::{finish, is_root, require};
use zerotx::{BufPool, EngineKind, Error, SendPath, Sender};

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// The 2 MiB size's own mode (6.8+), set to `inherit` while a test runs so the machine's applies.
const THP_PMD: &str = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled";

/// One test at a time sets the machine's mode, or makes huge pools (a pool next to another with
/// the same flags may share its mapping, and so its `AnonHugePages` line).
static MODE: Mutex<()> = Mutex::new(());

/// The bracketed word of a THP mode file: `always [madvise] never`.
fn mode_of(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.split(['[', ']'])
            .nth(1)
            .unwrap_or_else(|| panic!("unexpected {path}: {text:?}"))
            .to_string(),
    )
}

/// Transparent huge pages in a mode until dropped, then the modes it found.
struct Thp {
    old: String,
    old_pmd: Option<String>,
    _one: MutexGuard<'static, ()>,
}

impl Thp {
    fn set(mode: &str) -> Option<Self> {
        util::require!(
            is_root(),
            else None;
            "needs root to set transparent huge pages to `{mode}`"
        );
        let one = MODE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(old) = mode_of(THP) else {
            require(false, &format!("no transparent huge pages ({THP})"));
            return None;
        };
        let old_pmd = mode_of(THP_PMD);
        std::fs::write(THP, mode).unwrap_or_else(|e| panic!("writing {THP}: {e}"));
        if old_pmd.is_some() {
            std::fs::write(THP_PMD, "inherit").unwrap_or_else(|e| panic!("writing {THP_PMD}: {e}"));
        }
        Some(Self {
            old,
            old_pmd,
            _one: one,
        })
    }
}

impl Drop for Thp {
    fn drop(&mut self) {
        let restore = |path: &str, mode: &str| {
            if let Err(e) = std::fs::write(path, mode) {
                eprintln!("WARNING: could not put {path} back to `{mode}`: {e}");
            }
        };
        restore(THP, &self.old);
        if let Some(m) = &self.old_pmd {
            restore(THP_PMD, m);
        }
    }
}

/// The `/proc/self/smaps` entry of the mapping that holds `addr`: its `AnonHugePages` (kB) and
/// `VmFlags`.
fn mapping_of(addr: usize) -> (u64, String) {
    zerotx_testbed::mapping_of(addr).unwrap_or_else(|| panic!("no mapping holds {addr:#x}"))
}

/// A TCP connection over loopback: the client, and the accepted peer (whose receive buffer is
/// `rcvbuf`, inherited from the listener, if given).
fn loopback_pair(rcvbuf: Option<usize>) -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    if let Some(n) = rcvbuf {
        socket2::SockRef::from(&listener)
            .set_recv_buffer_size(n)
            .unwrap();
    }
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (peer, _) = listener.accept().unwrap();
    (client, peer)
}

/// `SO_MEMINFO`'s counters of `fd` (`SK_MEMINFO_*`).
fn meminfo(fd: RawFd) -> [u32; 9] {
    let mut mem = [0u32; 9];
    let mut len = std::mem::size_of_val(&mem) as libc::socklen_t;
    // SAFETY: the buffer is live and `len` is its size; the kernel writes at most that.
    let rc =
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, 55, mem.as_mut_ptr().cast(), &mut len) };
    assert_eq!(rc, 0, "SO_MEMINFO: {}", std::io::Error::last_os_error());
    mem
}

/// The receive memory charged to `fd` (`SK_MEMINFO_RMEM_ALLOC`).
fn rmem_alloc(fd: RawFd) -> u32 {
    meminfo(fd)[0]
}

/// The send memory charged to `fd`'s write queue (`SK_MEMINFO_WMEM_QUEUED`): what limits a TCP
/// sender.
fn wmem_queued(fd: RawFd) -> u32 {
    meminfo(fd)[5]
}

/// Bytes sent and not yet acknowledged, or not yet sent, on `fd` (`SIOCOUTQ`).
fn unacked(fd: RawFd) -> u32 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int into the live `n`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    assert_eq!(rc, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    n as u32
}

/// Bytes waiting to be read on `fd` (`FIONREAD`).
fn queued(fd: RawFd) -> u32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into the live `n`.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as u32
}

#[test]
fn a_pool_is_never_on_huge_pages_and_its_sends_are_charged_at_their_size() {
    let Some(_thp) = Thp::set("always") else {
        return;
    };
    // A pool large enough for whole huge pages, every byte touched (the first touch decides the
    // page size): its mapping must be marked no-huge-page and hold none.
    let big = BufPool::new(1 << 20, 8).unwrap();
    let mut blocks: Vec<_> = std::iter::from_fn(|| big.take()).collect();
    for b in &mut blocks {
        b.fill(0x5a);
    }
    let (huge, flags) = mapping_of(big.region().0 as usize);
    assert!(
        huge == 0 && flags.split_whitespace().any(|f| f == "nh"),
        "an 8 MiB pool under THP `always`: {huge} kB on huge pages, VmFlags {flags}"
    );
    drop(blocks);

    // And what that is for: zero-copy sends from a registered pool, charged at their size.
    let pool = BufPool::new(64 << 10, 16).unwrap();
    assert_charged_at_size(&pool, EngineKind::UringZc, true);
}

/// Sends 16 of `pool`'s blocks (touched first: the first touch decides the page size) of 64 KiB
/// over TCP loopback with `engine` to a peer that never reads, registering `pool` first if
/// `register`, and checks the receiver is charged about the bytes it holds, and the sender about
/// the bytes its socket holds (more than the receiver takes).
fn assert_charged_at_size(pool: &BufPool, engine: EngineKind, register: bool) {
    let mut blocks: Vec<_> = std::iter::from_fn(|| pool.take()).take(16).collect();
    assert_eq!(blocks.len(), 16);
    for b in &mut blocks {
        b.fill(0x5a);
    }
    // A receive buffer the peer inherits, so what it takes does not depend on the machine's
    // tcp_rmem (a peer that never reads never grows its buffer past the default).
    let (client, peer) = loopback_pair(Some(64 << 10)); // the peer never reads
    let client_fd = client.as_raw_fd();
    let mut tx = Sender::new(client, engine).unwrap();
    if register {
        tx.register_pool(pool).unwrap();
    }
    let mut pending: std::collections::VecDeque<_> =
        blocks.into_iter().map(|b| b.freeze(64 << 10)).collect();
    let mut out = Vec::new();
    // What the receiver holds once it stopped growing, the sender going on as far as it can.
    let fd = peer.as_raw_fd();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = (0, 0);
    loop {
        if !pending.is_empty() {
            tx.try_send_batch(&mut pending).unwrap();
        }
        tx.reap(&mut out).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let now = (queued(fd), rmem_alloc(fd));
        if (now == last && now.0 > 0) || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let (bytes, charged) = last;
    assert!(bytes > 0, "{engine}: nothing arrived within 5 s");
    // And the sender, for what the receiver did not take: its write queue is charged about the
    // bytes in it (plus an skb's overhead per 64 KiB), not whole huge pages.
    let (held, queued_mem) = (unacked(client_fd), wmem_queued(client_fd));
    assert!(
        held > 0,
        "{engine}: the receiver took everything; the sender's charge is not checked"
    );
    assert!(
        u64::from(queued_mem) <= 2 * u64::from(held) + (16 << 10),
        "{engine}: the sender is charged {queued_mem} bytes of send memory for {held} bytes \
         unsent or unacknowledged"
    );
    eprintln!("{engine}: receiver {charged} for {bytes}, sender {queued_mem} for {held}");
    // Small pages: a 64 KiB loopback segment costs its bytes plus about 10% (74560 for 65536
    // measured). Huge pages: 3.3 MB for the same.
    assert!(
        u64::from(charged) <= 2 * u64::from(bytes) + (16 << 10),
        "{engine}: the receiver is charged {charged} bytes of memory for {bytes} bytes of data: \
         zero-copy sends from the pool were charged as if on huge pages"
    );
    drop(peer);
    drop(tx.close(Duration::from_secs(2)));
}

#[test]
fn a_huge_pool_is_on_huge_pages_and_sends_from_it_are_charged_at_their_size() {
    // `madvise`: only the pool's own advice puts it on huge pages.
    let Some(_thp) = Thp::set("madvise") else {
        return;
    };
    let pool = BufPool::huge(64 << 10, 64).unwrap();
    assert!(pool.is_huge());
    let (base, len) = pool.region();
    assert_eq!(
        base as usize % (2 << 20),
        0,
        "a huge pool starts on a huge page"
    );
    let mut blocks: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
    assert_eq!(blocks.len(), 64);
    for (i, b) in blocks.iter_mut().enumerate() {
        assert!(b.iter().all(|&x| x == 0), "block {i} not zeroed");
        b.fill(i as u8);
    }
    assert!(blocks
        .iter()
        .enumerate()
        .all(|(i, b)| b.iter().all(|&x| x == i as u8)));
    let (huge, flags) = mapping_of(base as usize);
    // At least one of its two huge pages (memory may be too fragmented for both).
    assert!(
        huge >= 2048 && flags.split_whitespace().any(|f| f == "hg"),
        "a {len}-byte huge pool under THP `madvise`: {huge} kB on huge pages, VmFlags {flags}"
    );
    drop(blocks);

    // Sends from it that io_uring did not register are charged at their size: the kernel
    // charges the 4 KiB pages a send spans, whatever page they belong to.
    for engine in [
        EngineKind::MsgZerocopy,
        EngineKind::UringZc,
        EngineKind::Copy,
    ] {
        assert_charged_at_size(&pool, engine, false);
    }
}

#[test]
fn registering_a_huge_pool_is_refused_with_what_to_do() {
    let _one = MODE.lock().unwrap_or_else(|e| e.into_inner());
    let pool = BufPool::huge(64 << 10, 4).unwrap();
    let (client, _peer) = loopback_pair(None);
    let mut tx = match Sender::new(client, EngineKind::UringZc) {
        Ok(tx) => tx,
        Err(e @ Error::Unsupported { .. }) => {
            require(false, &format!("no uring-zc here: {e}"));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    match tx.register_pool(&pool) {
        Err(e @ Error::Config { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("BufPool::huge")
                    && text.contains("BufPool::new")
                    && !text.contains("  "),
                "{text}"
            );
        }
        other => panic!("registering a huge pool: {other:?}"),
    }
    // The sender is unharmed: a pool on small pages registers, and sends.
    let small = BufPool::new(64 << 10, 4).unwrap();
    tx.register_pool(&small).unwrap();
    tx.send(small.take().unwrap().freeze(1000)).unwrap();
    let (released, _) = finish(tx);
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].report.bytes, 1000);
}

#[test]
fn auto_takes_a_huge_pool_unregistered_and_says_so() {
    let _one = MODE.lock().unwrap_or_else(|e| e.into_inner());
    let pool = BufPool::huge(64 << 10, 4).unwrap();
    // On whichever path `auto` runs here (io_uring, or sendmsg where io_uring is off).
    let (client, peer) = loopback_pair(None);
    let mut auto: Sender<zerotx::PooledBuf> = Sender::new(client, EngineKind::Auto).unwrap();
    auto.register_pool(&pool).unwrap();
    auto.register_pool(&pool).unwrap();
    let said = auto.explain().lines;
    let notes = said.iter().filter(|l| l.contains("huge pages")).count();
    assert_eq!(notes, 1, "one note, however often it is offered: {said:?}");
    // Its buffers go, and come back whole.
    auto.send(pool.take().unwrap().freeze(5000)).unwrap();
    let (released, _) = finish(auto);
    drop(peer);
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].report.bytes, 5000);
}

#[test]
fn zero_copy_from_a_huge_pool_is_zero_copy() {
    let Some(_thp) = Thp::set("madvise") else {
        return;
    };
    let pool = BufPool::huge(65000, 64).unwrap();
    // Every block written (its index in each byte), so the sends read the pool's own pages.
    let mut blocks: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
    for (i, b) in blocks.iter_mut().enumerate() {
        b.fill(i as u8);
    }
    drop(blocks);
    let (huge, _) = mapping_of(pool.region().0 as usize);
    if huge < 2048 {
        // Memory too fragmented for a huge page: the sends below still go from the pool.
        eprintln!("NOTE: {huge} kB of the pool on huge pages (memory fragmented?)");
    }
    util::in_black_hole(65535, |bh| {
        for engine in [EngineKind::MsgZerocopy, EngineKind::UringZc] {
            let mut tx = Sender::connect_udp(bh.v4, engine).unwrap();
            let mut out = Vec::new();
            let mut sent = 0;
            while sent < 300 {
                match pool.take() {
                    Some(b) => {
                        tx.send(b.freeze(65000)).unwrap();
                        sent += 1;
                    }
                    None => {
                        tx.wait_released(&mut out, Some(Duration::from_secs(10)))
                            .unwrap();
                        assert!(!out.is_empty(), "{engine}: no release within 10 s");
                        for r in out.drain(..) {
                            assert_eq!(r.report.path, SendPath::ZeroCopy, "{engine}");
                            assert_eq!(r.report.bytes, 65000, "{engine}");
                        }
                    }
                }
            }
            let (released, stats) = finish(tx);
            assert!(
                released.iter().all(|r| r.report.path == SendPath::ZeroCopy),
                "{engine}: {stats:?}"
            );
            assert_eq!(stats.zerocopy, 300, "{engine}: {stats:?}");
        }
    });
}
