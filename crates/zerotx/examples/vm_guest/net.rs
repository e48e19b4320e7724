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
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use zerotx::{BufPool, EngineKind, PooledBuf, Sender, Stats};

use crate::checks::{brief, pooled_stream, Tally, Variant};
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

/// One engine over one protocol to the host, every byte checked there.
pub fn transfer(proto: Proto, v: Variant) -> Check {
    let pool = BufPool::new(TCP_BLOCK.max(UDP_LEN), POOL).map_err(|e| e.to_string())?;
    match proto {
        Proto::Tcp4 | Proto::Tcp6 => tcp(proto.v6(), v, &pool),
        Proto::Udp4 | Proto::Udp6 => udp(proto.v6(), v, &pool),
    }
}

fn connect(v6: bool) -> Result<TcpStream, String> {
    let to = SocketAddr::new(wire::host(v6), wire::PORT);
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(10))
        .map_err(|e| format!("connecting to the host at {to}: {e}"))?;
    s.set_read_timeout(Some(ANSWER))
        .map_err(|e| format!("read timeout: {e}"))?;
    Ok(s)
}

fn sender(fd: OwnedFd, v: Variant, pool: &BufPool) -> Result<Sender<PooledBuf>, String> {
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

/// Whether `v` must send every buffer zero-copy through the tap (`auto` too: every send is
/// above its threshold), or none.
fn zero_copy_share(v: Variant, t: &Tally, s: &Stats) -> Result<String, String> {
    let zc = !matches!(v.kind, EngineKind::Copy | EngineKind::Uring);
    let share = format!(
        "{} of {} buffers zero-copy ({}%), kernel-copied {}",
        t.zerocopy,
        t.released,
        (t.zerocopy * 100).checked_div(t.released).unwrap_or(0),
        s.kernel_copied
    );
    if t.released == 0 {
        return Err(format!("no buffer came back: {share}"));
    }
    if zc && (t.zerocopy != t.released || s.kernel_copied != 0) {
        return Err(format!(
            "a silent copy through virtio-net: {share}; route-copies {}, small {}, budget {}, \
             fallbacks {}",
            s.copied_route, s.copied_small, s.copied_budget, s.fallbacks
        ));
    }
    if !zc && t.zerocopy != 0 {
        return Err(format!("a copying engine reported zero-copy: {share}"));
    }
    Ok(share)
}

/// `TCP_INFO`'s `tcpi_total_retrans` of a TCP socket.
fn retransmits(fd: &impl AsRawFd) -> Result<u32, String> {
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

fn read_line(r: &mut impl BufRead, what: &str) -> Result<String, String> {
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
fn tcp(v6: bool, v: Variant, pool: &BufPool) -> Check {
    let mut s = connect(v6)?;
    writeln!(s, "{} tcp {TCP_TOTAL} 0", wire::HELLO).map_err(|e| format!("hello: {e}"))?;
    let mut tx = sender(s.into(), v, pool)?;
    let tally = pooled_stream(&mut tx, pool, TCP_TOTAL, TCP_BLOCK)?;
    let (stats, fd) = close(tx)?;
    let s = TcpStream::from(fd);
    let retrans = retransmits(&s)?;
    RETRANSMITS.fetch_add(u64::from(retrans), Ordering::Relaxed);
    TCP_RUNS.fetch_add(1, Ordering::Relaxed);
    s.set_nonblocking(false)
        .and_then(|()| s.shutdown(Shutdown::Write))
        .map_err(|e| format!("ending the stream: {e}"))?;
    let line = read_line(&mut BufReader::new(&s), "verdict")?;
    let verdict = TcpVerdict::parse(&line)?;
    let share = zero_copy_share(v, &tally, &stats);
    let summary = format!(
        "{} bytes verified by the host, {} buffers back and overwritten, {retrans} retransmits; \
         {}; {}",
        verdict.bytes,
        tally.released,
        share.as_deref().unwrap_or_else(|e| e),
        brief(&stats)
    );
    verdict
        .check(TCP_TOTAL)
        .and(share)
        .map(|_| summary.clone())
        .map_err(|e| format!("{e}; {summary}"))
}

/// 400 datagrams of 8 KiB over UDP, each buffer scribbled the moment it comes back; the host
/// places each datagram by its first pattern word and checks every byte. Some are dropped on
/// purpose (the script's nftables rule): at least nine in ten must arrive, every one intact.
fn udp(v6: bool, v: Variant, pool: &BufPool) -> Check {
    let control = connect(v6)?;
    writeln!(&control, "{} udp {UDP_COUNT} {UDP_LEN}", wire::HELLO)
        .map_err(|e| format!("hello: {e}"))?;
    let mut answers = BufReader::new(&control);
    let line = read_line(&mut answers, "port")?;
    let port: u16 = line
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the host answered {line:?}, not a port"))?;
    let to = SocketAddr::new(wire::host(v6), port);
    let local = if v6 { "[::]:0" } else { "0.0.0.0:0" };
    let sock = UdpSocket::bind(local).map_err(|e| format!("UDP bind: {e}"))?;
    sock.connect(to)
        .map_err(|e| format!("UDP connect {to}: {e}"))?;
    let mut tx = sender(sock.into(), v, pool)?;
    let tally = pooled_stream(&mut tx, pool, UDP_COUNT * UDP_LEN as u64, UDP_LEN)?;
    let (stats, _fd) = close(tx)?;
    writeln!(&control, "done").map_err(|e| format!("done: {e}"))?;
    let line = read_line(&mut answers, "verdict")?;
    let verdict = UdpVerdict::parse(&line)?;
    let share = zero_copy_share(v, &tally, &stats);
    let summary = format!(
        "{} of {UDP_COUNT} datagrams intact at the host ({} wrong, {} duplicate), {} buffers \
         back and overwritten; {}; {}",
        verdict.intact,
        verdict.wrong,
        verdict.duplicate,
        tally.released,
        share.as_deref().unwrap_or_else(|e| e),
        brief(&stats)
    );
    let delivered = if verdict.wrong != 0 || verdict.duplicate != 0 {
        Err("datagrams arrived wrong or twice".to_string())
    } else if verdict.intact * 10 < UDP_COUNT * 9 || verdict.intact > UDP_COUNT {
        Err(format!(
            "{} datagrams arrived, expected {UDP_COUNT} less a few drops",
            verdict.intact
        ))
    } else {
        Ok(())
    };
    delivered
        .and(share)
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
