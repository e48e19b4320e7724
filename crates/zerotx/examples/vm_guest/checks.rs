//! The guest's checks. Each returns the line to print after `VMTEST: pass` or `VMTEST: FAIL`.

use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;

use zerotx::{BufPool, EngineKind, Error, PoolBufMut, PooledBuf, Released, Sender, Stats};

use crate::peer::{self, Peer};

type Check = Result<String, String>;

/// Where the running check is: the watchdog prints it when a deadline fires, so a hang says
/// which call it sits in and what the sender held then.
static PROGRESS: Mutex<String> = Mutex::new(String::new());

/// Records where the running check is (see [`PROGRESS`]).
pub fn progress(what: impl FnOnce() -> String) {
    *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) = what();
}

/// The last [`progress`] recorded.
pub fn last_progress() -> String {
    PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The sender's state in a [`progress`] line.
fn state<B: zerotx::SendBuf>(tx: &Sender<B>) -> String {
    format!(
        "in_flight {}, outstanding {}; {:?}",
        tx.in_flight(),
        tx.outstanding(),
        tx.stats()
    )
}

/// An engine as the checks run it: `uring-zc` also with a registered pool.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub kind: EngineKind,
    /// Register the sending pool with the sender (`IORING_RECVSEND_FIXED_BUF`).
    pub registered: bool,
}

impl Variant {
    pub const fn plain(kind: EngineKind) -> Self {
        Self {
            kind,
            registered: false,
        }
    }

    /// `uring-zc` sending from a registered pool.
    pub const ZC_POOL: Variant = Variant {
        kind: EngineKind::UringZc,
        registered: true,
    };

    /// `auto` with a registered pool (on io_uring it sends from it; on `sendmsg` it takes it).
    pub const AUTO_POOL: Variant = Variant {
        kind: EngineKind::Auto,
        registered: true,
    };

    /// Every engine, and `uring-zc` from a registered pool.
    pub const ALL: [Variant; 6] = [
        Variant::plain(EngineKind::Auto),
        Variant::plain(EngineKind::Copy),
        Variant::plain(EngineKind::MsgZerocopy),
        Variant::plain(EngineKind::Uring),
        Variant::plain(EngineKind::UringZc),
        Variant::ZC_POOL,
    ];

    /// The io_uring engines.
    pub const URING: [Variant; 3] = [
        Variant::plain(EngineKind::Uring),
        Variant::plain(EngineKind::UringZc),
        Variant::ZC_POOL,
    ];
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}",
            self.kind,
            if self.registered { "+pool" } else { "" }
        )
    }
}

/// Where a check sends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP over the guest's loopback, to a verifying reader.
    Tcp,
    /// vsock over `vsock_loopback` (CID 1), to a verifying reader.
    Vsock,
    /// UDP into the `dummy` device (192.0.2.2 behind `dummyzc`): dropped after the send.
    Dummy,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Vsock => "vsock",
            Transport::Dummy => "dummy",
        })
    }
}

/// A connected socket on `t`, and the reader (none for the dummy device).
fn connect(t: Transport, peer: Peer) -> Result<(OwnedFd, Option<Reader>), String> {
    let setup = |e: std::io::Error| format!("{t} setup: {e}");
    match t {
        Transport::Tcp => {
            let (s, r) = peer::tcp_pair(peer).map_err(setup)?;
            Ok((s.into(), Some(r)))
        }
        Transport::Vsock => {
            let (s, r) = peer::vsock_pair(peer).map_err(setup)?;
            Ok((s.into(), Some(r)))
        }
        Transport::Dummy => {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").map_err(setup)?;
            s.connect("192.0.2.2:9").map_err(setup)?;
            Ok((s.into(), None))
        }
    }
}

type Reader = std::thread::JoinHandle<peer::Received>;

/// What came back from a pooled stream.
#[derive(Default)]
pub struct Tally {
    pub released: usize,
    pub zerocopy: usize,
    pub bytes: u64,
}

/// Sends `total` bytes of the stream pattern from a pool of `count` blocks of `block` bytes,
/// scribbling 0xEE over each block the moment the sender gives it back: a buffer released before
/// the kernel was done with it puts 0xEE on the wire, which the verifying reader reports.
pub fn pooled_stream(
    tx: &mut Sender<PooledBuf>,
    pool: &BufPool,
    total: u64,
    block: usize,
) -> Result<Tally, String> {
    pooled_stream_hooked(tx, pool, total, block, &mut |_| {})
}

/// [`pooled_stream`], calling `at` with each send's stream offset just before the send: where a
/// fault check changes the path mid-stream.
pub fn pooled_stream_hooked(
    tx: &mut Sender<PooledBuf>,
    pool: &BufPool,
    total: u64,
    block: usize,
    at: &mut dyn FnMut(u64),
) -> Result<Tally, String> {
    let wait = Duration::from_secs(20);
    let mut free: Vec<PoolBufMut> = std::iter::from_fn(|| pool.take()).collect();
    let count = free.len();
    let mut out = Vec::new();
    let mut tally = Tally::default();
    let mut recycle =
        |out: &mut Vec<Released<PooledBuf>>, free: &mut Vec<PoolBufMut>| -> Result<(), String> {
            for r in out.drain(..) {
                if let Some(e) = &r.report.error {
                    return Err(format!("a buffer came back with an error: {e}"));
                }
                if r.report.bytes != r.buf.len() {
                    return Err(format!(
                        "a buffer of {} bytes came back with {} sent",
                        r.buf.len(),
                        r.report.bytes
                    ));
                }
                tally.released += 1;
                tally.zerocopy += usize::from(r.report.path.is_zerocopy());
                tally.bytes += r.buf.len() as u64;
                let mut m = r.buf.into_mut();
                m.fill(0xEE);
                free.push(m);
            }
            Ok(())
        };
    let mut offset = 0u64;
    while offset < total {
        let Some(mut b) = free.pop() else {
            progress(|| format!("waiting for a buffer at offset {offset}: {}", state(tx)));
            let n = tx
                .wait_released(&mut out, Some(wait))
                .map_err(|e| format!("waiting for a buffer: {e}"))?;
            if n == 0 {
                for line in crate::where_it_hangs() {
                    println!("VMTEST: debug stalled at offset {offset}: {line}");
                }
                return Err(format!(
                    "no buffer released within {wait:?} at offset {offset}"
                ));
            }
            recycle(&mut out, &mut free)?;
            continue;
        };
        let len = block.min((total - offset) as usize);
        peer::fill(&mut b[..len], offset);
        at(offset);
        progress(|| format!("sending at offset {offset}: {}", state(tx)));
        tx.send(b.freeze(len))
            .map_err(|e| format!("send at offset {offset}: {e}"))?;
        offset += len as u64;
        tx.reap(&mut out).map_err(|e| format!("reap: {e}"))?;
        recycle(&mut out, &mut free)?;
    }
    progress(|| format!("flushing after {offset} bytes: {}", state(tx)));
    tx.flush(wait).map_err(|e| format!("flush: {e}"))?;
    tx.reap(&mut out).map_err(|e| format!("reap: {e}"))?;
    recycle(&mut out, &mut free)?;
    if free.len() != count {
        return Err(format!("{} of {count} buffers came back", free.len()));
    }
    Ok(tally)
}

/// Closes the sender (the reader then sees EOF) and checks what the reader got.
fn finish(tx: Sender<PooledBuf>, reader: Option<Reader>, total: u64) -> Result<Stats, String> {
    let stats = tx.stats();
    progress(|| format!("closing: {}", state(&tx)));
    let closed = tx.close(Duration::from_secs(5));
    if closed.kept > 0 {
        return Err(format!("{} buffers still held at close", closed.kept));
    }
    drop(closed.fd);
    progress(|| {
        format!(
            "closed ({} released at close); joining the reader",
            closed.released.len()
        )
    });
    if let Some(r) = reader {
        r.join().map_err(|_| "reader panicked")?.check(total)?;
    }
    if stats.bad_completions != 0 {
        return Err(format!("the ledger refused completions: {stats:?}"));
    }
    Ok(stats)
}

pub fn brief(s: &Stats) -> String {
    format!(
        "syscalls {}, zero-copy {}, kernel-copied {}, fallbacks {}, completions {}",
        s.syscalls, s.zerocopy, s.kernel_copied, s.fallbacks, s.completions
    )
}

/// Integrity with immediate overwrite: 4 MiB through a pool of four 64 KiB blocks to a slow,
/// verifying reader ([`through_slow_reader`]).
pub fn integrity(t: Transport, v: Variant) -> Check {
    let pool = BufPool::new(64 << 10, 4).map_err(|e| e.to_string())?;
    through_slow_reader(t, v.kind, &pool, v.registered)
}

/// `kind` sends 4 MiB of the stream pattern over `t` in 64 KiB sends from `pool` (registered
/// first if `register`), every block scribbled the moment it comes back, to a slow, verifying
/// reader (16 KiB receive buffer, 8 KiB reads, 2 ms between them), which keeps the sender's
/// socket full.
fn through_slow_reader(t: Transport, kind: EngineKind, pool: &BufPool, register: bool) -> Check {
    const TOTAL: u64 = 4 << 20;
    const BLOCK: usize = 64 << 10;
    let slow = Peer {
        verify: true,
        pause: Duration::from_millis(2),
        rcvbuf: Some(16 << 10),
        chunk: 8 << 10,
    };
    let (fd, reader) = connect(t, slow)?;
    let mut tx = Sender::new(fd, kind).map_err(|e| format!("Sender::new: {e}"))?;
    if register {
        tx.register_pool(pool)
            .map_err(|e| format!("register_pool: {e}"))?;
    }
    let tally = pooled_stream(&mut tx, pool, TOTAL, BLOCK)?;
    let stats = finish(tx, reader, TOTAL)?;
    Ok(format!(
        "{TOTAL} bytes intact through a slow reader, {} buffers back and overwritten; {}",
        tally.released,
        brief(&stats)
    ))
}

/// A [`BufPool::huge`] pool holds huge pages however its blocks are first touched (a read first
/// maps the huge zero page, and before 6.13 the first write to it split the mapping into small
/// pages), and zero-copy from it is whole: `kind` sends 4 MiB from it to a slow verifying reader
/// over TCP loopback (the slow reader keeps the sender's socket full, scribbling each returned
/// block at once), and 200 datagrams through the dummy device that must come back NOT copied.
pub fn huge_pool(kind: EngineKind) -> Check {
    const BLOCK: usize = 64 << 10;
    let thp = zerotx::internals::probe::huge_page_mode().unwrap_or_default();
    let pool = BufPool::huge(BLOCK, 64).map_err(|e| format!("BufPool::huge: {e}"))?;
    // Every block read before anything is written.
    let mut blocks: Vec<PoolBufMut> = std::iter::from_fn(|| pool.take()).collect();
    let sum: u64 = blocks
        .iter()
        .map(|b| b.iter().map(|&x| u64::from(x)).sum::<u64>())
        .sum();
    if sum != 0 {
        return Err(format!("a fresh pool is not zero (sum {sum})"));
    }
    for b in &mut blocks {
        b.fill(0x5a);
    }
    drop(blocks);
    let huge_kb = zerotx_testbed::mapping_of(pool.region().0 as usize).map_or(0, |(kb, _)| kb);
    let on = !thp.is_empty() && thp != "never";
    if on && huge_kb < 2048 {
        return Err(format!(
            "{huge_kb} kB of a 4 MiB huge pool on huge pages after a read and a write (thp {thp})"
        ));
    }
    let stream = through_slow_reader(Transport::Tcp, kind, &pool, false)?;
    let datagrams = into_dummy(kind, &pool, false)?;
    Ok(format!(
        "{huge_kb} kB on huge pages (thp {thp}); {stream}; {datagrams}"
    ))
}

/// An io_uring engine either works (a short stream arrives intact, every buffer back) or is
/// refused with [`Error::Unsupported`] when the sender is made or the pool registered: the
/// library's documented way to degrade. Any other error fails the check; the watchdog turns a
/// hang into a failure.
pub fn uring_engine(t: Transport, v: Variant) -> Check {
    const TOTAL: u64 = 1 << 20;
    const BLOCK: usize = 16 << 10;
    let degraded = |what: &str, e: Error| match e {
        Error::Unsupported { .. } => Ok(format!("degraded: {what} refused: {e}")),
        other => Err(format!(
            "{what} failed without saying what is missing: {other}"
        )),
    };
    let peer = Peer {
        verify: true,
        ..Peer::default()
    };
    let (fd, reader) = connect(t, peer)?;
    let mut tx = match Sender::new(fd, v.kind) {
        Ok(tx) => tx,
        Err(e) => return degraded("Sender::new", e),
    };
    let pool = BufPool::new(BLOCK, 16).map_err(|e| e.to_string())?;
    if v.registered {
        if let Err(e) = tx.register_pool(&pool) {
            return degraded("register_pool", e);
        }
    }
    let tally = pooled_stream(&mut tx, &pool, TOTAL, BLOCK)?;
    let stats = finish(tx, reader, TOTAL)?;
    Ok(format!(
        "works: {} bytes, {} buffers back, {} zero-copy; {}",
        tally.bytes,
        tally.released,
        tally.zerocopy,
        brief(&stats)
    ))
}

/// UDP into the dummy device: 200 datagrams of 65000 bytes, every one back NOT copied.
pub fn dummy(v: Variant) -> Check {
    let pool = BufPool::new(65000, 16).map_err(|e| e.to_string())?;
    into_dummy(v.kind, &pool, v.registered)
}

/// `kind` sends 200 datagrams of 65000 bytes from `pool` (registered first if `register`)
/// through the dummy device: every one must come back, zero-copy (NOT copied).
fn into_dummy(kind: EngineKind, pool: &BufPool, register: bool) -> Check {
    const N: u64 = 200;
    const LEN: usize = 65000;
    let (fd, _) = connect(Transport::Dummy, Peer::default())?;
    let mut tx = Sender::new(fd, kind).map_err(|e| format!("Sender::new: {e}"))?;
    if register {
        tx.register_pool(pool)
            .map_err(|e| format!("register_pool: {e}"))?;
    }
    let tally = pooled_stream(&mut tx, pool, N * LEN as u64, LEN)?;
    let path = tx.explain().path;
    let stats = finish(tx, None, 0)?;
    let line = format!(
        "{} datagrams back, {} zero-copy (NOT copied) via {path}; {}",
        tally.released,
        tally.zerocopy,
        brief(&stats)
    );
    if tally.released as u64 != N || tally.zerocopy as u64 != N {
        return Err(line);
    }
    Ok(line)
}

/// Whether this kernel has vsock zero-copy (6.7).
pub fn vsock_zerocopy_expected() -> bool {
    let release = zerotx::internals::probe::kernel_release();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (major, minor) >= (6, 7)
}

/// `msg-zc` over vsock. Before 6.7 the sender must be refused with [`Error::Unsupported`] carrying
/// the kernel's answer to `SO_ZEROCOPY`. From 6.7: 64 sends of 16 KiB, one of 1 MiB (beyond the
/// peer's credit), 16 of 4 KiB; every buffer back, the stream intact, no completion refused.
/// How many ids a send takes is the library's business (it may split sends), not asserted here.
pub fn vsock_msg_zc() -> Check {
    if vsock_zerocopy_expected() {
        return vsock_stream(EngineKind::MsgZerocopy);
    }
    let (fd, reader) = connect(Transport::Vsock, Peer::default())?;
    let refused = match Sender::<Vec<u8>>::new(fd, EngineKind::MsgZerocopy) {
        Ok(_) => return Err("msg-zc sender accepted on a kernel without vsock zero-copy".into()),
        Err(e) => e,
    };
    drop(reader); // the peer sees the socket closed with the refused sender
    let msg = refused.to_string();
    let says_why = msg.contains("SO_ZEROCOPY")
        && (msg.contains("Operation not supported") || msg.contains("os error 95"));
    match refused {
        Error::Unsupported { .. } if says_why => Ok(format!("refused as expected: {msg}")),
        Error::Unsupported { .. } => Err(format!(
            "refused, but the message does not give the kernel's answer (EOPNOTSUPP): {msg}"
        )),
        other => Err(format!(
            "refused with the wrong error (not Unsupported): {other}"
        )),
    }
}

/// A stream of owned `Vec`s over vsock, including one send larger than the peer's credit.
pub fn vsock_stream(kind: EngineKind) -> Check {
    let peer = Peer {
        verify: true,
        ..Peer::default()
    };
    let (fd, reader) = connect(Transport::Vsock, peer)?;
    let mut tx = Sender::new(fd, kind).map_err(|e| format!("Sender::new: {e}"))?;
    let mut offset = 0u64;
    let mut sends = 0usize;
    let mut send = |tx: &mut Sender<Vec<u8>>, len: usize| -> Result<(), String> {
        let mut buf = vec![0u8; len];
        peer::fill(&mut buf, offset);
        offset += len as u64;
        sends += 1;
        tx.send(buf).map_err(|e| format!("send: {e}"))
    };
    let flush = |tx: &mut Sender<Vec<u8>>| {
        tx.flush(Duration::from_secs(20))
            .map_err(|e| format!("flush: {e}"))
    };
    for _ in 0..64 {
        send(&mut tx, 16 << 10)?;
    }
    flush(&mut tx)?;
    // Alone in flight, larger than the peer's credit (256 KiB).
    send(&mut tx, 1 << 20)?;
    flush(&mut tx)?;
    for _ in 0..16 {
        send(&mut tx, 4096)?;
    }
    flush(&mut tx)?;
    let mut out = Vec::new();
    tx.reap(&mut out).map_err(|e| format!("reap: {e}"))?;
    let stats = tx.stats();
    progress(|| format!("closing: {}", state(&tx)));
    let closed = tx.close(Duration::from_secs(5));
    out.extend(closed.released);
    drop(closed.fd);
    let got = reader
        .expect("vsock has a reader")
        .join()
        .map_err(|_| "reader panicked")?;
    let zc = out.iter().filter(|r| r.report.path.is_zerocopy()).count();
    let line = format!(
        "{} of {sends} buffers back, {zc} zero-copy, {} bytes; {}",
        out.len(),
        got.bytes,
        brief(&stats)
    );
    got.check(offset).map_err(|e| format!("{e}; {line}"))?;
    if out.len() != sends || closed.kept != 0 {
        return Err(format!("not every buffer came back: {line}"));
    }
    if stats.bad_completions != 0 {
        return Err(format!(
            "the ledger refused {} completions: {line}",
            stats.bad_completions
        ));
    }
    if kind == EngineKind::MsgZerocopy && zc == 0 {
        return Err(format!("no zero-copy completion at all: {line}"));
    }
    Ok(line)
}

/// `zerotx::probe()` sees vsock zero-copy exactly where the kernel has it, with the kernel's
/// answer when it has not.
pub fn probe_vsock() -> Check {
    let report = zerotx::probe();
    let vsock = report
        .sockets
        .iter()
        .find(|s| s.kind == "vsock")
        .ok_or("probe has no vsock entry")?;
    let u = &report.io_uring;
    let line = format!(
        "vsock zerocopy={} ({}); transport={}; io_uring send_zc={} sendmsg_zc={} report_usage={:?}",
        vsock.zerocopy,
        vsock.detail,
        report.vsock_transport,
        u.send_zc,
        u.sendmsg_zc,
        u.report_usage
    );
    let expected = vsock_zerocopy_expected();
    if vsock.zerocopy != expected {
        return Err(format!("expected vsock zerocopy={expected}: {line}"));
    }
    let kernel_answer =
        vsock.detail.contains("SO_ZEROCOPY") && vsock.detail.contains("os error 95");
    if !expected && !kernel_answer {
        return Err(format!(
            "the detail should give the kernel's answer (EOPNOTSUPP): {line}"
        ));
    }
    Ok(line)
}
