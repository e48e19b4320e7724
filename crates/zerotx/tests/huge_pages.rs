//! A registered pool under transparent huge pages `always` (Debian's and RHEL's default): the
//! kernel must charge zero-copy sends from it at their size. On huge pages io_uring merges the
//! registered region into multi-page segments and the stack charges each send from the start of
//! its huge page (see `buf/pool.rs`): 44 times the bytes on loopback here, a peer window of about
//! 1 KB, a stream that crawls at the zero-window probe timer (the Debian 6.12 guest's
//! `integrity uring-zc+pool tcp` check timed out that way). The pool opts out of huge pages.
//!
//! Its own test binary: it sets `/sys/kernel/mm/transparent_hugepage/enabled` to `always` for the
//! whole machine while it runs (and puts the old mode back), which no other test should see.
#![allow(unsafe_code)]

mod util;

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use util::{is_root, require};
use zerotx::{BufPool, EngineKind, Sender};

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Transparent huge pages `always` until dropped, then the mode it found.
struct ThpAlways {
    old: String,
}

impl ThpAlways {
    fn set() -> Option<Self> {
        if !require(
            is_root(),
            "needs root to set transparent huge pages to `always`",
        ) {
            return None;
        }
        let text = match std::fs::read_to_string(THP) {
            Ok(t) => t,
            Err(e) => {
                require(false, &format!("no transparent huge pages ({THP}: {e})"));
                return None;
            }
        };
        // "always [madvise] never": the bracketed word is the mode.
        let old = text
            .split(['[', ']'])
            .nth(1)
            .unwrap_or_else(|| panic!("unexpected {THP}: {text:?}"))
            .to_string();
        std::fs::write(THP, "always").unwrap_or_else(|e| panic!("writing {THP}: {e}"));
        Some(Self { old })
    }
}

impl Drop for ThpAlways {
    fn drop(&mut self) {
        let _ = std::fs::write(THP, &self.old);
    }
}

/// The `/proc/self/smaps` entry of the mapping that holds `addr`: its `AnonHugePages` (kB) and
/// `VmFlags` lines.
fn mapping_of(addr: usize) -> (u64, String) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let (mut huge, mut flags) = (None, None);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = (a..b).contains(&addr);
                continue;
            }
        }
        if !inside {
            continue;
        }
        if let Some(kb) = line.strip_prefix("AnonHugePages:") {
            huge = kb.trim().trim_end_matches("kB").trim().parse().ok();
        } else if let Some(f) = line.strip_prefix("VmFlags:") {
            flags = Some(f.trim().to_string());
        }
    }
    (
        huge.unwrap_or_else(|| panic!("no mapping holds {addr:#x}")),
        flags.unwrap_or_default(),
    )
}

/// `SO_MEMINFO`'s first counter: the receive memory charged to `fd`.
fn rmem_alloc(fd: RawFd) -> u32 {
    let mut mem = [0u32; 9];
    let mut len = std::mem::size_of_val(&mem) as libc::socklen_t;
    // SAFETY: the buffer is live and `len` is its size; the kernel writes at most that.
    let rc =
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, 55, mem.as_mut_ptr().cast(), &mut len) };
    assert_eq!(rc, 0, "SO_MEMINFO: {}", std::io::Error::last_os_error());
    mem[0]
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
    let Some(_thp) = ThpAlways::set() else {
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
    let pool = BufPool::new(64 << 10, 4).unwrap();
    let mut blocks: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
    for b in &mut blocks {
        b.fill(0x5a); // the first touch decides the page size
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (peer, _) = listener.accept().unwrap(); // never reads
    let mut tx = Sender::new(client, EngineKind::UringZc).unwrap();
    tx.register_pool(&pool).unwrap();
    for b in blocks {
        tx.try_send(b.freeze(64 << 10)).unwrap();
    }
    // What the receiver holds once it stopped growing.
    let fd = peer.as_raw_fd();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = (0, 0);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = (queued(fd), rmem_alloc(fd));
        if (now == last && now.0 > 0) || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let (bytes, charged) = last;
    assert!(bytes > 0, "nothing arrived within 5 s");
    // Small pages: a 64 KiB loopback segment costs its bytes plus about 10% (74560 for 65536
    // measured). Huge pages: 3.3 MB for the same.
    assert!(
        u64::from(charged) <= 2 * u64::from(bytes) + (16 << 10),
        "the receiver is charged {charged} bytes of memory for {bytes} bytes of data: zero-copy \
         sends from the registered pool were charged as if on huge pages"
    );
    drop(peer);
    drop(tx.close(Duration::from_secs(2)));
}
