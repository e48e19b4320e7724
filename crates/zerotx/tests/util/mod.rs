//! Helpers shared by the real-kernel tests: requirements that skip (or fail under
//! `ZEROTX_STRICT=1`), loopback peers, the stream pattern, and buffer bookkeeping.
#![allow(dead_code, unsafe_code)]

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use zerotx::{EngineKind, Released, SendBuf, Sender};

pub mod trains;
pub mod veth;

/// Every engine, so each scenario runs over all of them.
pub fn engines() -> &'static [EngineKind] {
    EngineKind::ALL
}

#[allow(unused_imports)] // each test file uses its own part
pub use zerotx_testbed::{is_root, require, strict};

/// Returns from the calling test when `ok` is false, after saying why it skips: the message is
/// `format!`'s arguments. Under `ZEROTX_STRICT=1` it fails the test instead (see [`require`]).
/// `require!(ok, else value; "why")` returns `value` from a function that returns one.
macro_rules! require_or_return {
    ($ok:expr, else $ret:expr; $($why:tt)+) => {
        if !$crate::util::require($ok, &format!($($why)+)) {
            return $ret;
        }
    };
    ($ok:expr, $($why:tt)+) => {
        if !$crate::util::require($ok, &format!($($why)+)) {
            return;
        }
    };
}
#[allow(unused_imports)] // each test file uses its own part
pub(crate) use require_or_return as require;

/// Runs `f` inside a fresh network namespace with the black hole built, or skips.
pub fn in_black_hole<T: Send>(
    mtu: u32,
    f: impl FnOnce(zerotx_testbed::BlackHole) -> T + Send,
) -> Option<T> {
    require_or_return!(
        is_root(),
        else None;
        "needs root to create a network namespace for the black hole"
    );
    let res = zerotx_testbed::in_new_netns(|| {
        let bh = zerotx_testbed::black_hole(mtu).expect("building the black hole");
        f(bh)
    });
    match res {
        Ok(v) => Some(v),
        Err(e) => {
            require(false, &format!("network namespace unavailable: {e}"));
            None
        }
    }
}

/// A TCP connection on loopback whose accepted side (returned second) never reads, with a small
/// receive buffer.
pub fn stalled_peer() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    socket2::SockRef::from(&server)
        .set_recv_buffer_size(32 << 10)
        .unwrap();
    (client, server)
}

/// A mebibyte, for sizes in bytes.
pub const MIB: u64 = 1 << 20;

/// A UDP socket of `dest`'s family, connected to it.
pub fn connected_udp(dest: std::net::SocketAddr) -> std::net::UdpSocket {
    let any = if dest.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let sock = std::net::UdpSocket::bind(any).unwrap();
    sock.connect(dest).unwrap();
    sock
}

/// [`connected_udp`] with a send buffer of 4 MiB (forced past `wmem_max`, as root), deeper than
/// any test qdisc's queue, so the queue overflows before the socket fills; and `IP_RECVERR` when
/// `recverr` (IPv4), so a qdisc's drop answers the send with `ENOBUFS`.
#[allow(dead_code)]
pub fn deep_udp(dest: std::net::SocketAddr, recverr: bool) -> std::net::UdpSocket {
    use std::os::fd::AsFd;
    let sock = connected_udp(dest);
    if recverr {
        set_recverr(sock.as_fd(), false);
    }
    set_int_opt(
        sock.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        4 << 20,
    );
    sock
}

/// Sends `total` bytes of the stream pattern from pooled buffers, overwriting each buffer the
/// moment it comes back. With `register`, the pool is registered with the sender first.
pub fn pooled_stream(
    tx: &mut Sender<zerotx::PooledBuf>,
    total: u64,
    block: usize,
    count: usize,
    register: bool,
) {
    let pool = zerotx::BufPool::new(block, count).unwrap();
    if register {
        tx.register_pool(&pool).unwrap();
    }
    let mut free: Vec<_> = (0..count).map(|_| pool.take().unwrap()).collect();
    let mut out = Vec::new();
    let recycle = |out: &mut Vec<zerotx::Released<zerotx::PooledBuf>>,
                   free: &mut Vec<zerotx::PoolBufMut>| {
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            assert_eq!(r.report.bytes, r.buf.len());
            let mut m = r.buf.into_mut();
            m.fill(0xEE); // scribble: an early release would put this on the wire
            free.push(m);
        }
    };
    let mut offset = 0u64;
    while offset < total {
        let Some(mut b) = free.pop() else {
            let n = tx
                .wait_released(&mut out, Some(Duration::from_secs(30)))
                .unwrap();
            assert!(n > 0, "no buffer released within 30 s");
            recycle(&mut out, &mut free);
            continue;
        };
        let len = block.min((total - offset) as usize);
        fill(&mut b[..len], offset);
        tx.send(b.freeze(len)).unwrap();
        offset += len as u64;
        tx.reap(&mut out).unwrap();
        recycle(&mut out, &mut free);
    }
    tx.flush(Duration::from_secs(30)).unwrap();
    tx.reap(&mut out).unwrap();
    recycle(&mut out, &mut free);
    assert_eq!(free.len(), count, "every pooled buffer came back");
}

pub fn localhost(v6: bool) -> IpAddr {
    if v6 {
        Ipv6Addr::LOCALHOST.into()
    } else {
        Ipv4Addr::LOCALHOST.into()
    }
}

/// The byte at stream offset `o`: a word counter, so a stale or shifted byte shows.
pub fn pattern(o: u64) -> u8 {
    let w = (o >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5_A5A5_A5A5_A5A5;
    (w >> ((o & 7) * 8)) as u8
}

pub fn fill(buf: &mut [u8], offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(offset + i as u64);
    }
}

/// What a receiving thread saw.
#[derive(Debug, Default)]
pub struct Received {
    pub bytes: u64,
    pub mismatches: u64,
    pub first_mismatch: Option<u64>,
    pub error: Option<String>,
}

impl Received {
    /// Counts `data`, the stream's next bytes, checking each against [`pattern`] if `verify`.
    pub fn take(&mut self, data: &[u8], verify: bool) {
        if verify {
            for (i, &b) in data.iter().enumerate() {
                let o = self.bytes + i as u64;
                if b != pattern(o) {
                    self.mismatches += 1;
                    self.first_mismatch.get_or_insert(o);
                }
            }
        }
        self.bytes += data.len() as u64;
    }
}

/// Options for a receiving peer.
#[derive(Clone, Copy, Default)]
pub struct Peer {
    /// Check every byte against [`pattern`].
    pub verify: bool,
    /// Sleep this long between reads (a slow reader keeps the sender's socket buffer full).
    pub pause: Duration,
    /// Read this many bytes, then reset the connection (SO_LINGER 0 + close).
    pub reset_after: Option<u64>,
    /// Receive buffer size (SO_RCVBUF), if set.
    pub rcvbuf: Option<usize>,
}

impl Peer {
    /// A reader that checks every byte against [`pattern`], as fast as it can.
    pub fn checking() -> Self {
        Self {
            verify: true,
            ..Self::default()
        }
    }

    /// A reader that checks every byte and keeps the sender's socket buffer full: it sleeps
    /// `pause` between reads, with a receive buffer of `rcvbuf` bytes.
    pub fn slow(pause: Duration, rcvbuf: usize) -> Self {
        Self {
            verify: true,
            pause,
            rcvbuf: Some(rcvbuf),
            ..Self::default()
        }
    }
}

/// A TCP listener on loopback and a connected client; the accepted side runs `peer` on a thread.
pub fn tcp_pair(v6: bool, peer: Peer) -> (TcpStream, JoinHandle<Received>) {
    let listener = TcpListener::bind(SocketAddr::new(localhost(v6), 0)).expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).expect("connect loopback");
    // Accepted here, not in the reader: a reader thread scheduled late took a descriptor number
    // at a moment of its own choosing (under load it took the number a test had just freed to
    // watch its reuse).
    let (s, _) = listener.accept().expect("accept");
    let handle = std::thread::spawn(move || receive(s, peer));
    (client, handle)
}

/// A client whose peer reads about 110 KB, then resets (SO_LINGER 0 and close); the client's
/// send buffer is small, so a 1 MiB send goes part way and the reset cuts the rest off: that
/// buffer comes back with the error on every engine.
pub fn resetting_client() -> (TcpStream, JoinHandle<Received>) {
    let peer = Peer {
        reset_after: Some(110 << 10),
        rcvbuf: Some(64 << 10),
        pause: Duration::from_millis(1),
        ..Peer::default()
    };
    let (client, reader) = tcp_pair(false, peer);
    socket2::SockRef::from(&client)
        .set_send_buffer_size(64 << 10)
        .unwrap();
    (client, reader)
}

/// Reads the accepted side `s` as `peer` says, until the sender closes or `peer` resets.
pub fn receive(mut s: TcpStream, peer: Peer) -> Received {
    if let Some(n) = peer.rcvbuf {
        socket2::SockRef::from(&s).set_recv_buffer_size(n).unwrap();
    }
    let mut r = Received::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        if let Some(limit) = peer.reset_after {
            if r.bytes >= limit {
                let sock = socket2::SockRef::from(&s);
                sock.set_linger(Some(Duration::ZERO)).unwrap();
                return r; // dropping the stream sends RST
            }
        }
        match s.read(&mut buf) {
            Ok(0) => return r,
            Ok(n) => {
                r.take(&buf[..n], peer.verify);
                if !peer.pause.is_zero() {
                    std::thread::sleep(peer.pause);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                r.error = Some(e.to_string());
                return r;
            }
        }
    }
}

/// Flushes, reaps and closes, asserting nothing was kept; returns every released buffer and the
/// final counters.
pub fn finish<B: SendBuf>(mut tx: Sender<B>) -> (Vec<Released<B>>, zerotx::Stats) {
    tx.flush(Duration::from_secs(20))
        .expect("every buffer released within 20 s");
    let mut out = Vec::new();
    tx.reap(&mut out).unwrap();
    let stats = tx.stats();
    assert_eq!(
        stats.bad_completions, 0,
        "the ledger refused completions: {stats:?}"
    );
    let closed = tx.close(Duration::from_secs(1));
    assert_eq!(closed.kept, 0, "buffers kept at close");
    out.extend(closed.released);
    (out, stats)
}

/// Flushes a sender that a test made fail on purpose: [`zerotx::Error::Failed`] (buffers released
/// with an error since the last flush) is what the faults cause, and its count comes back (0 for
/// `Ok`); any other error panics, naming `what`.
pub fn flush_after_faults<B: SendBuf>(tx: &mut Sender<B>, timeout: Duration, what: &str) -> usize {
    match tx.flush(timeout) {
        Ok(()) => 0,
        Err(zerotx::Error::Failed { failed, .. }) => failed,
        Err(e) => panic!("{what}: {e}; {:?}", tx.stats()),
    }
}

/// Drops CAP_IPC_LOCK from the effective and permitted sets (so RLIMIT_MEMLOCK applies to root)
/// and lowers RLIMIT_MEMLOCK to `bytes`.
pub fn limit_locked_memory(bytes: u64) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const V3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut hdr = Header {
        version: V3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two Data structs for version 3, which `data` holds.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    data[0].permitted &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above; capset reads the same two structs.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", io::Error::last_os_error());
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads one rlimit struct.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", io::Error::last_os_error());
}

/// Installs a seccomp filter on the calling thread (and the threads it spawns after) that makes
/// `io_uring_setup` fail with `errno`, the way a container runtime's default profile does.
pub fn refuse_io_uring(errno: u32) {
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let nr = libc::SYS_io_uring_setup as u32;
    // Load arch; if not x86_64 allow everything. Load nr; if io_uring_setup return errno.
    let prog = [
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 4,
        },
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 3,
            k: AUDIT_ARCH_X86_64,
        },
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: nr,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | errno,
        },
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_NO_NEW_PRIVS: {}", io::Error::last_os_error());
    // SAFETY: fprog points at `prog`, which outlives the call; the kernel copies the program.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        )
    };
    assert_eq!(rc, 0, "PR_SET_SECCOMP: {}", io::Error::last_os_error());
}

/// Runs the ignored test `name` of this test binary in a child process with `env` set, and
/// asserts it printed `"{name}: ok"`.
pub fn run_child_test(name: &str, env: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("{name}: ok")),
        "child {name} failed:\n{stdout}\n{stderr}"
    );
}

/// Runs a command (`nft`, `tc`...) in the calling thread's network namespace; panics with its
/// output when it fails, or fails/skips (see [`require`]) when the tool is missing.
pub fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> bool {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return require(false, &format!("`{tool}` is not installed ({e})"));
        }
    };
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "`{tool} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// `setsockopt` of one `c_int`; panics naming the error if the kernel refuses.
pub fn set_int_opt(fd: std::os::fd::BorrowedFd<'_>, level: i32, name: i32, val: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads one c_int from a live local.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt({level}, {name}): {}",
        io::Error::last_os_error()
    );
}

/// `IP_RECVERR` / `IPV6_RECVERR` on a socket: the kernel reports ICMP errors and, for UDP,
/// qdisc drops (`ENOBUFS`) to the caller, as QUIC stacks ask it to.
pub fn set_recverr(fd: std::os::fd::BorrowedFd<'_>, v6: bool) {
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
    } else {
        (libc::IPPROTO_IP, libc::IP_RECVERR)
    };
    set_int_opt(fd, level, name, 1);
}

/// Gets all of `queue` through `tx` the way an event loop does: waits on `readiness`, reaps into
/// `out`, calls `try_send_batch` again; asserts each call took exactly what left the queue.
pub fn try_send_all<B: SendBuf>(
    tx: &mut Sender<B>,
    queue: &mut VecDeque<B>,
    out: &mut Vec<Released<B>>,
) {
    while !queue.is_empty() {
        wait_ready(tx);
        tx.reap(out).unwrap();
        let before = queue.len();
        let took = tx.try_send_batch(queue).unwrap();
        assert_eq!(queue.len(), before - took, "{}", tx.engine());
    }
}

/// Waits (up to 10 s, else panics) on what `tx.readiness()` names, as an event loop would.
pub fn wait_ready<B: SendBuf>(tx: &mut Sender<B>) {
    let r = tx.readiness();
    let mut p = libc::pollfd {
        fd: r.fd,
        events: r.events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, 10_000) };
    assert!(
        n > 0,
        "{}: asleep 10 s with {} held (events {}), {:?}",
        tx.engine(),
        tx.outstanding(),
        r.events,
        tx.stats()
    );
}

/// Drives `tx` the way a caller's own event loop does, with the non-blocking calls only:
/// `try_send` until the sender hands a buffer back, `reap`, then `poll(2)` on what `readiness`
/// names. Sends `total` bytes of the stream pattern in `block`-sized buffers. `think` is work
/// the caller does between a handed-back send and its reap (so completions arrive meanwhile and
/// the reap drains them). A lost wake-up fails after 10 s. Returns how many times it waited.
pub fn poll_loop(tx: &mut Sender<Vec<u8>>, total: u64, block: usize, think: Duration) -> u32 {
    let kind = tx.engine();
    let count = total / block as u64;
    let (mut offset, mut released, mut waits) = (0u64, 0u64, 0u32);
    let mut pending: Option<Vec<u8>> = None;
    let mut out = Vec::new();
    while released < count {
        loop {
            let buf = match pending.take() {
                Some(b) => b,
                None if offset < total => {
                    let mut b = vec![0u8; block];
                    fill(&mut b, offset);
                    b
                }
                None => break,
            };
            match tx.try_send(buf) {
                Ok(()) => offset += block as u64,
                Err(zerotx::SendError::WouldBlock(b)) => {
                    pending = Some(b);
                    break;
                }
                Err(e) => panic!("{kind}: {e}"),
            }
        }
        if pending.is_some() && !think.is_zero() {
            std::thread::sleep(think);
        }
        released += tx.reap(&mut out).unwrap() as u64;
        for r in out.drain(..) {
            assert!(r.report.error.is_none(), "{kind}: {:?}", r.report);
            assert_eq!(r.report.bytes, block, "{kind}");
        }
        if released == count {
            break;
        }
        wait_ready(tx);
        waits += 1;
    }
    waits
}
