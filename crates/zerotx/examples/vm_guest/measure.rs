//! Raw measurements of vsock `MSG_ZEROCOPY` ids with the flags the library uses
//! (`sendmsg(MSG_ZEROCOPY | MSG_DONTWAIT)`), for kernels with vsock zero-copy (6.7). Facts, not
//! checks: each comes back as a `VMTEST: measure ...` line. Every call goes on a fresh socket
//! (ids from 0); "next id" is the id a following 4 KiB call got, i.e. how many ids came before.
//!
//! - (a) calls of 64 KiB, 128 KiB (within the peer's 256 KiB credit) and 1 MiB (beyond it), with
//!   the reader stalled or reading; and a blocking 1 MiB call for contrast: bytes returned,
//!   completion ranges, what the peer got, the next id;
//! - (b) calls over 64 KiB with `net.core.optmem_max` at 0, and with room for one completion while
//!   a first send is in flight: bytes returned or errno, what the peer got, whether an id was
//!   taken;
//! - (c) calls of 64 KiB and 4 KiB under the same budget, and TCP's answer for contrast.
//!
//! The guest has one vCPU: a reader thread does not run during a `MSG_DONTWAIT` call.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, Socket, Type};
use zerotx::internals::cmsg::{self, ErrQueueMsg, ZcRange};
use zerotx::BufPool;
use zerotx_testbed as testbed;

use crate::peer::{vsock_port, VMADDR_CID_LOCAL};

const KIB: usize = 1024;

/// A page-aligned 1 MiB buffer that lives until the guest powers off: the kernel may still read
/// it when a measurement gives up on a completion.
fn buffer() -> &'static [u8] {
    let pool = BufPool::new(1 << 20, 1).expect("1 MiB pool");
    let mut block = pool.take().expect("one block");
    block.fill(0x5A);
    Box::leak(Box::new(block))
}

/// A vsock connection with `SO_ZEROCOPY` on the sending side; the reader reads everything, but
/// only once `go` is set (until then the sender has exactly the peer's initial credit), and
/// counts what it got.
struct Conn {
    tx: OwnedFd,
    go: Arc<AtomicBool>,
    got: Arc<AtomicU64>,
}

impl Conn {
    fn open(reading: bool) -> io::Result<Conn> {
        let port = vsock_port();
        let listener = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
        listener.bind(&SockAddr::vsock(u32::MAX, port))?;
        listener.listen(1)?;
        let go = Arc::new(AtomicBool::new(reading));
        let got = Arc::new(AtomicU64::new(0));
        let (go2, got2) = (go.clone(), got.clone());
        std::thread::spawn(move || -> io::Result<()> {
            let (s, _) = listener.accept()?;
            while !go2.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut s = std::fs::File::from(OwnedFd::from(s));
            let mut buf = vec![0u8; 64 * KIB];
            loop {
                match s.read(&mut buf)? {
                    0 => return Ok(()),
                    n => got2.fetch_add(n as u64, Ordering::Relaxed),
                };
            }
        });
        let sock = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
        sock.connect(&SockAddr::vsock(VMADDR_CID_LOCAL, port))?;
        set_zerocopy(sock.as_raw_fd())?;
        Ok(Conn {
            tx: sock.into(),
            go,
            got,
        })
    }

    fn start_reader(&self) {
        self.go.store(true, Ordering::Release);
    }

    /// Starts the reader and waits until it has read nothing new for 300 ms: what the peer got.
    fn settle(&self) -> u64 {
        self.start_reader();
        let mut last = u64::MAX;
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.got.load(Ordering::Relaxed);
            if now == last {
                break;
            }
            last = now;
        }
        last
    }

    fn fd(&self) -> RawFd {
        self.tx.as_raw_fd()
    }
}

fn set_zerocopy(fd: RawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: `one` is a live c_int of the size passed; `fd` is an open socket owned by the caller.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One `sendmsg(2)` of `buf` with `flags`: bytes sent or the error.
fn send(fd: RawFd, buf: &'static [u8], flags: libc::c_int) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &iov as *const libc::iovec as *mut libc::iovec;
    msg.msg_iovlen = 1;
    // SAFETY: `msg` points at one iovec describing `buf`, which is 'static (never freed or
    // changed), as MSG_ZEROCOPY needs: the kernel may read it after the call returns.
    let n = unsafe { libc::sendmsg(fd, &msg, flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn zc_send(fd: RawFd, buf: &'static [u8]) -> io::Result<usize> {
    send(fd, buf, libc::MSG_ZEROCOPY | libc::MSG_DONTWAIT)
}

/// Reads the error queue until it is empty (`MSG_ERRQUEUE | MSG_DONTWAIT`).
fn drain(fd: RawFd, out: &mut Vec<ZcRange>) -> io::Result<()> {
    loop {
        let mut control = [0u64; 32];
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: the control buffer is live, 8-byte aligned and as long as msg_controllen says;
        // there is no data buffer (msg_iovlen 0).
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(()),
                Some(libc::EINTR) => continue,
                _ => Err(e),
            };
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other("MSG_CTRUNC on the error queue"));
        }
        let len = (msg.msg_controllen as usize).min(std::mem::size_of_val(&control));
        // SAFETY: `control` is a live [u64; 32]; viewing its first `len` (<= its size) bytes as
        // u8 is valid for any content.
        let bytes = unsafe { std::slice::from_raw_parts(control.as_ptr().cast::<u8>(), len) };
        let mut msgs = Vec::new();
        cmsg::decode(bytes, &mut msgs).map_err(io::Error::other)?;
        out.extend(msgs.into_iter().filter_map(|m| match m {
            ErrQueueMsg::Zerocopy(r) => Some(r),
            ErrQueueMsg::Other { .. } => None,
        }));
    }
}

/// Collects completions for up to `max`, stopping 300 ms after the last new one.
fn collect(fd: RawFd, max: Duration) -> io::Result<Vec<ZcRange>> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut last_new = None;
    loop {
        let before = out.len();
        drain(fd, &mut out)?;
        if out.len() > before {
            last_new = Some(Instant::now());
        }
        if last_new.is_some_and(|t| t.elapsed() > Duration::from_millis(300))
            || start.elapsed() > max
        {
            return Ok(out);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ranges(r: &[ZcRange]) -> String {
    if r.is_empty() {
        return "none".into();
    }
    let v: Vec<_> = r
        .iter()
        .map(|r| {
            let copied = if r.copied { " copied" } else { "" };
            format!("[{}-{}]{copied}", r.lo, r.hi)
        })
        .collect();
    v.join(" ")
}

fn result(r: &io::Result<usize>) -> String {
    match r {
        Ok(n) => format!("returned {n} bytes"),
        Err(e) => format!("failed: {}", errno_name(e)),
    }
}

fn errno_name(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::ENOBUFS) => "ENOBUFS",
        Some(libc::EAGAIN) => "EAGAIN",
        Some(libc::EINVAL) => "EINVAL",
        _ => "",
    };
    format!("{name} ({e})")
}

/// Sends 4 KiB zero-copy and waits for its completion: its id is how many ids the socket had
/// handed out before.
fn next_id(c: &Conn, buf: &'static [u8]) -> String {
    if let Err(e) = zc_send(c.fd(), &buf[..4 * KIB]) {
        return format!("the 4 KiB probe send failed: {}", errno_name(&e));
    }
    match collect(c.fd(), Duration::from_secs(5)) {
        Ok(r) => match r.last() {
            Some(last) => format!(
                "next 4 KiB call completed as {}: id {}",
                ranges(&r),
                last.hi
            ),
            None => "next 4 KiB call: no completion within 5 s".into(),
        },
        Err(e) => format!("error queue: {e}"),
    }
}

/// (a): one large call, with the reader stalled (exactly the initial credit) and reading.
fn one_large_call(buf: &'static [u8], reading: bool, flags: libc::c_int) -> io::Result<String> {
    let c = Conn::open(reading)?;
    let r = send(c.fd(), buf, flags);
    // A short call with the reader stalled: does the rest go at once? (The library would try.)
    let again = match r {
        Ok(n) if !reading && flags & libc::MSG_DONTWAIT != 0 && n < buf.len() => format!(
            "; a second call for the remaining {} bytes at once {}",
            buf.len() - n,
            result(&zc_send(c.fd(), &buf[n..]))
        ),
        _ => String::new(),
    };
    let before = collect(c.fd(), Duration::from_millis(500))?;
    let got = c.settle();
    let after = collect(c.fd(), Duration::from_secs(5))?;
    Ok(format!(
        "{}{again}; completions before the reader read: {}; the peer got {got} bytes; \
         completions after: {}; {}",
        result(&r),
        ranges(&before),
        ranges(&after),
        next_id(&c, buf)
    ))
}

/// (a) repeated: `n` fresh sockets, one call of `buf` each with the reader reading; how many bytes
/// each call returned and how many ids it took (its completions, counted once the reader drained).
/// With more than one vCPU the reader can return credit while the call runs.
fn repeated_calls(buf: &'static [u8], n: usize) -> io::Result<String> {
    use std::collections::BTreeMap;
    let (mut returned, mut ids) = (BTreeMap::new(), BTreeMap::new());
    for _ in 0..n {
        let c = Conn::open(true)?;
        let r = zc_send(c.fd(), buf);
        c.settle();
        let done = collect(c.fd(), Duration::from_secs(5))?;
        let taken: u64 = done.iter().map(|r| r.count()).sum();
        *returned.entry(result(&r)).or_insert(0) += 1;
        *ids.entry(taken).or_insert(0) += 1;
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let returned: Vec<_> = returned.iter().map(|(k, v)| format!("{k} x{v}")).collect();
    let ids: Vec<_> = ids.iter().map(|(k, v)| format!("{k} id(s) x{v}")).collect();
    Ok(format!(
        "{n} calls on fresh sockets, {cpus} vCPU(s): {}; ids taken per call: {}",
        returned.join(", "),
        ids.join(", ")
    ))
}

/// Puts `net.core.optmem_max` back when dropped.
struct Optmem(u64);

impl Drop for Optmem {
    fn drop(&mut self) {
        let _ = testbed::set_optmem_max(self.0);
    }
}

/// (b) and (c): calls of `sizes` under `optmem_max` 0, each on a fresh socket (ids from 0) with
/// the reader stalled; then the budget is restored and each socket's next id read.
fn under_budget(buf: &'static [u8], sizes: &[usize]) -> io::Result<(Vec<String>, String)> {
    let conns = sizes
        .iter()
        .map(|_| Conn::open(false))
        .collect::<io::Result<Vec<_>>>()?;
    let restore = Optmem(testbed::optmem_max()?);
    testbed::set_optmem_max(0)?;
    let results: Vec<_> = conns
        .iter()
        .zip(sizes)
        .map(|(c, &n)| zc_send(c.fd(), &buf[..n]))
        .collect();
    // TCP over loopback under the same budget, for contrast.
    let tcp = tcp_under_budget(buf);
    drop(restore);
    let mut lines = Vec::new();
    for ((c, &n), r) in conns.iter().zip(sizes).zip(&results) {
        let queued = collect(c.fd(), Duration::from_millis(500))?;
        let got = c.settle();
        lines.push(format!(
            "{} KiB call with optmem_max=0: {}; the peer got {got} bytes; completions: {}; \
             budget restored, {}",
            n / KIB,
            result(r),
            ranges(&queued),
            next_id(c, buf)
        ));
    }
    Ok((lines, tcp))
}

/// (b) with a send in flight: `optmem_max` with room for about one completion (an skb of
/// ~768 bytes), the reader stalled so the first send's completion stays charged, then a call over
/// 64 KiB.
fn one_slot_budget(buf: &'static [u8]) -> io::Result<String> {
    const ONE_SLOT: u64 = 1000;
    let c = Conn::open(false)?;
    let restore = Optmem(testbed::optmem_max()?);
    testbed::set_optmem_max(ONE_SLOT)?;
    let first = zc_send(c.fd(), &buf[..4 * KIB]);
    let second = zc_send(c.fd(), &buf[..128 * KIB]);
    let queued = collect(c.fd(), Duration::from_millis(500))?;
    drop(restore);
    let got = c.settle();
    let after = collect(c.fd(), Duration::from_secs(5))?;
    Ok(format!(
        "optmem_max={ONE_SLOT} (room for one completion), reader stalled: a 4 KiB call {}, then \
         a 128 KiB call {}; completions while stalled: {}; budget restored, the peer got {got} \
         bytes; completions: {}; {}",
        result(&first),
        result(&second),
        ranges(&queued),
        ranges(&after),
        next_id(&c, buf)
    ))
}

fn tcp_under_budget(buf: &'static [u8]) -> String {
    let go = || -> io::Result<String> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let s = std::net::TcpStream::connect(l.local_addr()?)?;
        let _peer = l.accept()?;
        set_zerocopy(s.as_raw_fd())?;
        let r = zc_send(s.as_raw_fd(), &buf[..64 * KIB]);
        std::mem::forget(s); // the kernel may still hold `buf`'s pages: never close early
        Ok(result(&r))
    };
    go().unwrap_or_else(|e| format!("setup failed: {e}"))
}

/// Every measurement, one line each.
pub fn vsock_ids() -> Result<Vec<String>, String> {
    let buf = buffer();
    let e = |e: io::Error| e.to_string();
    let zc = libc::MSG_ZEROCOPY | libc::MSG_DONTWAIT;
    let mut lines = vec![
        format!(
            "(a) vsock 64 KiB sendmsg(MSG_ZEROCOPY|MSG_DONTWAIT), reader stalled: {}",
            one_large_call(&buf[..64 * KIB], false, zc).map_err(e)?
        ),
        format!(
            "(a) vsock 128 KiB sendmsg(MSG_ZEROCOPY|MSG_DONTWAIT), reader stalled: {}",
            one_large_call(&buf[..128 * KIB], false, zc).map_err(e)?
        ),
        format!(
            "(a) vsock 1 MiB sendmsg(MSG_ZEROCOPY|MSG_DONTWAIT), reader stalled: {}",
            one_large_call(buf, false, zc).map_err(e)?
        ),
        format!(
            "(a) vsock 1 MiB sendmsg(MSG_ZEROCOPY|MSG_DONTWAIT), reader reading: {}",
            one_large_call(buf, true, zc).map_err(e)?
        ),
        format!(
            "(a) vsock 1 MiB sendmsg(MSG_ZEROCOPY|MSG_DONTWAIT), reader reading: {}",
            repeated_calls(buf, 10).map_err(e)?
        ),
        format!(
            "(a) for contrast, blocking sendmsg(MSG_ZEROCOPY) of 1 MiB, reader reading: {}",
            one_large_call(buf, true, libc::MSG_ZEROCOPY).map_err(e)?
        ),
    ];
    let sizes = [128 * KIB, 1 << 20, 64 * KIB, 4 * KIB];
    let (budget, tcp) = under_budget(buf, &sizes).map_err(e)?;
    let (over, upto): (Vec<_>, Vec<_>) = budget
        .into_iter()
        .zip(sizes)
        .partition(|&(_, n)| n > 64 * KIB);
    lines.extend(over.into_iter().map(|(l, _)| format!("(b) vsock {l}")));
    lines.push(format!("(b) vsock {}", one_slot_budget(buf).map_err(e)?));
    lines.extend(upto.into_iter().map(|(l, _)| format!("(c) vsock {l}")));
    lines.push(format!(
        "(c) for contrast, TCP loopback 64 KiB MSG_ZEROCOPY|MSG_DONTWAIT with optmem_max=0: {tcp}"
    ));
    Ok(lines)
}
