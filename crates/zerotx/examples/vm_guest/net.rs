//! The guest's network checks: zerotx sending through a real NIC driver (virtio-net, on a tap
//! that `scripts/vm-test.sh` puts in a network namespace on the host) to another host's stack.
//! The host side (`vm_host`) checks every byte and answers a verdict (`wire.rs`); the script
//! drops a share of the data and of the ACKs on the host side (nftables), so TCP retransmits
//! from the very pages zerotx lent while each returned buffer is already scribbled with 0xEE.
//!
//! Through the tap the device offers scatter-gather and checksum offload, so every send of a
//! zero-copy engine must come back zero-copy, NOT copied: a silent copy path fails the check.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use zerotx::{BufPool, EngineKind, PooledBuf, Sender, Stats};

use crate::checks::{brief, pooled_stream_hooked, Tally, Variant};
use crate::wire::{self, TcpVerdict, UdpVerdict};

type Check = Result<String, String>;

/// The guest's NIC, as the script's init names it.
pub const NIC: &str = "eth0";
/// Bytes per TCP transfer: enough for a few dozen drops at the script's rates, little for TCG.
const TCP_TOTAL: u64 = 4 << 20;
/// Bytes per TCP send (above `auto`'s stream threshold, so it sends them zero-copy).
const TCP_BLOCK: usize = 64 << 10;
/// Datagrams per UDP transfer.
const UDP_COUNT: u64 = 400;
/// Bytes per datagram: above `auto`'s datagram threshold, below the NIC's MTU (9000), so no
/// datagram is fragmented (fragments are copied).
const UDP_LEN: usize = 8192;
/// Buffers in each check's pool.
const POOL: usize = 16;
/// How long the host may take to answer.
const ANSWER: Duration = Duration::from_secs(20);

/// TCP retransmits the checks saw, and TCP checks run: the drops must have made some.
static RETRANSMITS: AtomicU64 = AtomicU64::new(0);
static TCP_RUNS: AtomicU64 = AtomicU64::new(0);
/// Whether this kernel's io_uring reports copied zero-copy sends (probed once).
static REPORTS_USAGE: OnceLock<bool> = OnceLock::new();

/// Where a network check sends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp4,
    Tcp6,
    Udp4,
    Udp6,
}

impl Proto {
    pub const ALL: [Proto; 4] = [Proto::Tcp4, Proto::Tcp6, Proto::Udp4, Proto::Udp6];

    fn v6(self) -> bool {
        matches!(self, Proto::Tcp6 | Proto::Udp6)
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp4 => "tcp4",
            Proto::Tcp6 => "tcp6",
            Proto::Udp4 => "udp4",
            Proto::Udp6 => "udp6",
        })
    }
}

/// The guest has its NIC (the script always gives it one): the network checks can run.
pub fn nic_present() -> Check {
    let dir = format!("/sys/class/net/{NIC}");
    let read =
        |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).map(|s| s.trim().to_string());
    let driver = std::fs::read_link(format!("{dir}/device/driver"))
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string()
        })
        .map_err(|e| format!("no {NIC} with a driver ({e}): did virtio_net load?"))?;
    let mtu = read("mtu").map_err(|e| format!("{NIC} mtu: {e}"))?;
    let carrier = read("carrier").unwrap_or_else(|e| e.to_string());
    if carrier != "1" {
        return Err(format!("{NIC} ({driver}) has no carrier ({carrier})"));
    }
    Ok(format!("{NIC}: driver {driver}, mtu {mtu}, carrier up"))
}

/// Who receives a TCP transfer on the host.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Receiver {
    /// `vm_host`, checking every byte as fast as it reads.
    Verify,
    /// `vm_host` with a 64 KiB receive buffer that stops reading for [`wire::STALL_MS`] after the
    /// first MiB: the window closes (the host's stack counts it), zero-copy sends queue behind
    /// it, and the guest probes the window (or retransmits into it, when segments were lost).
    Stalled,
    /// socat handing the stream to `sha256sum`, whose hash comes back and must match the
    /// pattern's.
    Sha256,
}

impl fmt::Display for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Receiver::Verify => "",
            Receiver::Stalled => " stalled reader",
            Receiver::Sha256 => " socat|sha256sum",
        })
    }
}

/// How a fault check (`faults.rs`) bends a transfer.
pub struct Options<'a> {
    /// The host's address to send to (the tap's, or another NIC's).
    pub to: Option<IpAddr>,
    /// Called with each send's stream offset just before the send.
    pub at: &'a mut dyn FnMut(u64),
    /// Whether every send of a zero-copy engine must come back NOT copied (the tap, no fault).
    pub all_zero_copy: bool,
    /// Called with the sender after the last buffer came back, before it closes: its line joins
    /// the check's.
    pub inspect: Option<&'a Inspect>,
    /// UDP: datagrams that must arrive (default nine in ten).
    pub min_datagrams: Option<u64>,
}

/// What [`Options::inspect`] runs.
pub type Inspect = dyn Fn(&Sender<PooledBuf>) -> Check;

/// One engine over one protocol to the host, every byte checked there.
pub fn transfer(proto: Proto, v: Variant, rx: Receiver) -> Check {
    transfer_with(
        proto,
        v,
        rx,
        Options {
            to: None,
            at: &mut |_| {},
            all_zero_copy: true,
            inspect: None,
            min_datagrams: None,
        },
    )
}

/// [`transfer`], bent as `opts` says.
pub fn transfer_with(proto: Proto, v: Variant, rx: Receiver, mut opts: Options) -> Check {
    let pool = BufPool::new(TCP_BLOCK.max(UDP_LEN), POOL).map_err(|e| e.to_string())?;
    match proto {
        Proto::Tcp4 | Proto::Tcp6 => tcp(proto.v6(), v, &pool, rx, &mut opts),
        Proto::Udp4 | Proto::Udp6 => udp(proto.v6(), v, &pool, &mut opts),
    }
}

/// A TCP connection to the host's `port`.
pub fn connect_to(v6: bool, port: u16) -> Result<TcpStream, String> {
    connect_at(wire::host(v6), port)
}

fn connect_at(host: IpAddr, port: u16) -> Result<TcpStream, String> {
    let to = SocketAddr::new(host, port);
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(10))
        .map_err(|e| format!("connecting to the host at {to}: {e}"))?;
    s.set_read_timeout(Some(ANSWER))
        .map_err(|e| format!("read timeout: {e}"))?;
    Ok(s)
}

pub fn sender(fd: OwnedFd, v: Variant, pool: &BufPool) -> Result<Sender<PooledBuf>, String> {
    let mut tx = Sender::new(fd, v.kind).map_err(|e| format!("Sender::new: {e}"))?;
    if v.registered {
        tx.register_pool(pool)
            .map_err(|e| format!("register_pool: {e}"))?;
    }
    Ok(tx)
}

/// Closes the sender: every buffer must be back (none kept), no completion refused.
fn close(tx: Sender<PooledBuf>) -> Result<(Stats, OwnedFd), String> {
    let stats = tx.stats();
    let closed = tx.close(Duration::from_secs(5));
    if closed.kept > 0 {
        return Err(format!("{} buffers still held at close", closed.kept));
    }
    if stats.bad_completions != 0 {
        return Err(format!("the ledger refused completions: {stats:?}"));
    }
    Ok((stats, closed.fd))
}

/// Whether `v` sent every buffer zero-copy through the tap (`auto` too: every send is above its
/// threshold) or none: the share's description, and the error if it is wrong.
fn zero_copy_share(
    v: Variant,
    t: &Tally,
    s: &Stats,
    all_zero_copy: bool,
) -> (String, Result<(), String>) {
    let zc = !matches!(v.kind, EngineKind::Copy | EngineKind::Uring);
    let share = format!(
        "{} of {} buffers zero-copy ({}%), kernel-copied {}",
        t.zerocopy,
        t.released,
        (t.zerocopy * 100).checked_div(t.released).unwrap_or(0),
        s.kernel_copied
    );
    // Without IORING_SEND_ZC_REPORT_USAGE (6.0-6.1 upstream) io_uring never says "copied".
    let uring_blind = matches!(v.kind, EngineKind::UringZc | EngineKind::Auto)
        && !*REPORTS_USAGE.get_or_init(|| zerotx::probe().io_uring.report_usage == Some(true));
    let share = if uring_blind {
        format!("{share} (this kernel's io_uring does not report copies)")
    } else {
        share
    };
    let verdict = if t.released == 0 {
        Err("no buffer came back".to_string())
    } else if all_zero_copy && zc && (t.zerocopy != t.released || s.kernel_copied != 0) {
        Err(format!(
            "a silent copy through virtio-net (route-copies {}, small {}, budget {}, fallbacks {})",
            s.copied_route, s.copied_small, s.copied_budget, s.fallbacks
        ))
    } else if !zc && t.zerocopy != 0 {
        Err("a copying engine reported zero-copy".to_string())
    } else {
        Ok(())
    };
    (share, verdict)
}

/// `TCP_INFO`'s `tcpi_total_retrans` of a TCP socket.
pub fn retransmits(fd: &impl AsRawFd) -> Result<u32, String> {
    // SAFETY: `tcp_info` is plain integers; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the buffer is a live `tcp_info` and `len` says its size; the kernel writes at most
    // `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(format!("TCP_INFO: {}", std::io::Error::last_os_error()));
    }
    Ok(info.tcpi_total_retrans)
}

pub fn read_line(r: &mut impl BufRead, what: &str) -> Result<String, String> {
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("reading the host's {what}: {e}"))?;
    if line.is_empty() {
        return Err(format!("the host closed without its {what}"));
    }
    Ok(line.trim().to_string())
}

/// 4 MiB over TCP in 64 KiB sends, each buffer scribbled the moment it comes back; the host
/// checks every byte and answers after the guest's EOF.
fn tcp(v6: bool, v: Variant, pool: &BufPool, rx: Receiver, opts: &mut Options) -> Check {
    let host = opts.to.unwrap_or(wire::host(v6));
    let mut s = if rx == Receiver::Sha256 {
        connect_at(host, wire::SHA256_PORT)?
    } else {
        let stall = if rx == Receiver::Stalled {
            wire::STALL_MS
        } else {
            0
        };
        let mut s = connect_at(host, wire::PORT)?;
        writeln!(s, "{} tcp {TCP_TOTAL} {stall}", wire::HELLO)
            .map_err(|e| format!("hello: {e}"))?;
        s
    };
    let probes_before = tcp_ext("TCPWinProbe");
    let mut tx = sender(s.into(), v, pool)?;
    let tally = pooled_stream_hooked(&mut tx, pool, TCP_TOTAL, TCP_BLOCK, opts.at)?;
    let inspected = opts.inspect.map(|f| f(&tx));
    let (stats, fd) = close(tx)?;
    let probes = tcp_ext("TCPWinProbe").saturating_sub(probes_before);
    s = TcpStream::from(fd);
    let retrans = retransmits(&s)?;
    RETRANSMITS.fetch_add(u64::from(retrans), Ordering::Relaxed);
    TCP_RUNS.fetch_add(1, Ordering::Relaxed);
    s.set_nonblocking(false)
        .and_then(|()| s.shutdown(Shutdown::Write))
        .map_err(|e| format!("ending the stream: {e}"))?;
    let line = read_line(&mut BufReader::new(&s), "verdict")?;
    let mut zero_windows = None;
    let (received, intact) = if rx == Receiver::Sha256 {
        let want = pattern_sha256(TCP_TOTAL)?;
        let got = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let ok = if got == want {
            Ok(())
        } else {
            Err(format!(
                "sha256sum on the host says {got}, the stream's is {want}"
            ))
        };
        (
            "sha256 matched by socat|sha256sum on the host".to_string(),
            ok,
        )
    } else {
        let verdict = TcpVerdict::parse(&line)?;
        zero_windows = Some(verdict.zero_windows);
        (
            format!("{} bytes verified by the host", verdict.bytes),
            verdict.check(TCP_TOTAL),
        )
    };
    let (share, zero_copy) = zero_copy_share(v, &tally, &stats, opts.all_zero_copy);
    let windows = zero_windows.map_or(String::new(), |n| {
        format!("{n} zero windows from the host, ")
    });
    let (inspected, inspect) = match inspected {
        Some(Ok(line)) => (format!("; {line}"), Ok(())),
        Some(Err(e)) => (String::new(), Err(e)),
        None => (String::new(), Ok(())),
    };
    let summary = format!(
        "{received}, {} buffers back and overwritten, {retrans} retransmits, {windows}{probes} \
         zero-window probes; {share}; {}{inspected}",
        tally.released,
        brief(&stats)
    );
    // The window's closing is the host's to report: with segments lost in flight the guest
    // retransmits on its RTO instead of probing a zero window, so probes need not appear.
    let window = if rx == Receiver::Stalled && zero_windows == Some(0) {
        Err(
            "the stalled reader's window never closed (the host advertised no zero window)"
                .to_string(),
        )
    } else {
        Ok(())
    };
    intact
        .and(window)
        .and(zero_copy)
        .and(inspect)
        .map(|_| summary.clone())
        .map_err(|e| format!("{e}; {summary}"))
}

/// A `TcpExt` counter of the guest's `/proc/net/netstat` (0 if absent). The checks run one at a
/// time, so a difference across one check is that check's.
fn tcp_ext(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut rows = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// The SHA-256 of the first `total` bytes of the pattern, from the guest's own `sha256sum`.
fn pattern_sha256(total: u64) -> Result<String, String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("sha256sum: no stdin")?;
    let mut block = vec![0u8; TCP_BLOCK];
    let mut offset = 0;
    while offset < total {
        let len = TCP_BLOCK.min((total - offset) as usize);
        crate::peer::fill(&mut block[..len], offset);
        stdin
            .write_all(&block[..len])
            .map_err(|e| format!("sha256sum: {e}"))?;
        offset += len as u64;
    }
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// 400 datagrams of 8 KiB over UDP, each buffer scribbled the moment it comes back; the host
/// places each datagram by its first pattern word and checks every byte. Some are dropped on
/// purpose (the script's nftables rule): at least nine in ten must arrive, every one intact.
fn udp(v6: bool, v: Variant, pool: &BufPool, opts: &mut Options) -> Check {
    let control = connect_at(opts.to.unwrap_or(wire::host(v6)), wire::PORT)?;
    writeln!(&control, "{} udp {UDP_COUNT} {UDP_LEN}", wire::HELLO)
        .map_err(|e| format!("hello: {e}"))?;
    let mut answers = BufReader::new(&control);
    let line = read_line(&mut answers, "port")?;
    let port: u16 = line
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the host answered {line:?}, not a port"))?;
    let to = SocketAddr::new(opts.to.unwrap_or(wire::host(v6)), port);
    let local = if v6 { "[::]:0" } else { "0.0.0.0:0" };
    let sock = UdpSocket::bind(local).map_err(|e| format!("UDP bind: {e}"))?;
    sock.connect(to)
        .map_err(|e| format!("UDP connect {to}: {e}"))?;
    let mut tx = sender(sock.into(), v, pool)?;
    let tally = pooled_stream_hooked(&mut tx, pool, UDP_COUNT * UDP_LEN as u64, UDP_LEN, opts.at)?;
    let inspected = opts.inspect.map(|f| f(&tx));
    let (stats, _fd) = close(tx)?;
    writeln!(&control, "done").map_err(|e| format!("done: {e}"))?;
    let line = read_line(&mut answers, "verdict")?;
    let verdict = UdpVerdict::parse(&line)?;
    let (share, zero_copy) = zero_copy_share(v, &tally, &stats, opts.all_zero_copy);
    let (inspected, inspect) = match inspected {
        Some(Ok(line)) => (format!("; {line}"), Ok(())),
        Some(Err(e)) => (String::new(), Err(e)),
        None => (String::new(), Ok(())),
    };
    let summary = format!(
        "{} of {UDP_COUNT} datagrams intact at the host ({} wrong, {} duplicate), {} buffers \
         back and overwritten; {share}; {}{inspected}",
        verdict.intact,
        verdict.wrong,
        verdict.duplicate,
        tally.released,
        brief(&stats)
    );
    let least = opts.min_datagrams.unwrap_or(UDP_COUNT * 9 / 10);
    let delivered = if verdict.wrong != 0 || verdict.duplicate != 0 {
        Err("datagrams arrived wrong or twice".to_string())
    } else if verdict.intact < least || verdict.intact > UDP_COUNT {
        Err(format!(
            "{} datagrams arrived, expected {least} to {UDP_COUNT}",
            verdict.intact
        ))
    } else {
        Ok(())
    };
    delivered
        .and(zero_copy)
        .and(inspect)
        .map(|_| summary.clone())
        .map_err(|e| format!("{e}; {summary}"))
}

/// After the TCP checks: the host's drops made TCP retransmit (from the lent pages) somewhere.
pub fn retransmits_seen() -> Check {
    let (n, runs) = (
        RETRANSMITS.load(Ordering::Relaxed),
        TCP_RUNS.load(Ordering::Relaxed),
    );
    let line = format!("{n} retransmits over {runs} TCP transfers");
    if runs > 0 && n == 0 {
        return Err(format!("{line}: the host's drops did not take effect"));
    }
    Ok(line)
}
