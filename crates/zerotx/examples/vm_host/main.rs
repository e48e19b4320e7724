//! The host's side of the VM test's guest network: `scripts/vm-test.sh` runs it in the network
//! namespace that holds the guest's tap, where it receives every transfer the guest's network
//! checks send (`vm_guest`'s `net.rs`) and checks every byte against the pattern. The exchange
//! is described in `vm_guest/wire.rs`; each connection gets its own thread, and one line per
//! transfer goes to stdout (the script keeps it as the host's log).
//!
//! Usage: `vm_host [PORT]` (default 7000). Listens on every address of the namespace, IPv4 and
//! IPv6; runs until killed.

#[path = "../vm_guest/wire.rs"]
#[allow(dead_code)] // the guest's half of the exchange is not used here
mod wire;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use wire::{TcpVerdict, UdpVerdict};

/// A guest that stops sending for this long has hung or died: the transfer ends.
const IDLE: Duration = Duration::from_secs(60);
/// After the guest's `done`, datagrams still in flight get this long to arrive.
const UDP_TAIL: Duration = Duration::from_millis(500);

fn main() -> io::Result<()> {
    let port = match std::env::args().nth(1) {
        Some(p) => p
            .parse()
            .map_err(|_| io::Error::other(format!("port {p:?} is not a number")))?,
        None => wire::PORT,
    };
    let sock = Socket::new(Domain::IPV6, Type::STREAM, None)?;
    sock.set_only_v6(false)?;
    sock.set_reuse_address(true)?;
    sock.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    sock.listen(64)?;
    let listener = TcpListener::from(sock);
    println!("vm_host: listening on [::]:{port} (IPv4 and IPv6)");
    loop {
        let (conn, from) = listener.accept()?;
        std::thread::spawn(move || {
            let line = match serve(conn) {
                Ok(l) => l,
                Err(e) => format!("error: {e}"),
            };
            println!("vm_host: {from}: {line}");
        });
    }
}

/// Reads the hello and runs the transfer it names; returns the line for the log.
fn serve(conn: TcpStream) -> io::Result<String> {
    conn.set_read_timeout(Some(IDLE))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut hello = String::new();
    reader.by_ref().take(200).read_line(&mut hello)?;
    let words: Vec<&str> = hello.split_whitespace().collect();
    let num = |i: usize| -> io::Result<u64> {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad hello {hello:?}")))
    };
    match words.as_slice() {
        [wire::HELLO, "tcp", ..] => {
            let (total, stall) = (num(2)?, Duration::from_millis(num(3)?));
            if !stall.is_zero() {
                // A small buffer that fills while the reader sleeps: the window closes.
                socket2::SockRef::from(&conn).set_recv_buffer_size(64 << 10)?;
            }
            let before = tcp_ext("TCPToZeroWindowAdv");
            let mut verdict = stream(reader, stall, None);
            verdict.zero_windows = tcp_ext("TCPToZeroWindowAdv").saturating_sub(before);
            writeln!(&conn, "{verdict}")?;
            Ok(format!("tcp {total} bytes sent: {verdict}"))
        }
        [wire::HELLO, "data", mode @ ("reset" | "stall"), ..] => {
            let mode = if *mode == "reset" {
                Fault::Reset(num(3)?)
            } else {
                Fault::Stall(Duration::from_millis(num(3)?))
            };
            faulty(conn, mode)
        }
        [wire::HELLO, "udp", ..] => {
            let (count, len) = (num(2)?, num(3)? as usize);
            datagrams(conn, reader, count, len)
        }
        _ => Err(io::Error::other(format!("bad hello {hello:?}"))),
    }
}

/// A `TcpExt` counter of this network namespace's `/proc/net/netstat` (0 if absent).
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

/// What the host does to a fault check's data connection.
enum Fault {
    /// Reads this many bytes, then resets the connection (`SO_LINGER` 0).
    Reset(u64),
    /// Reads nothing for this long, then reads to EOF.
    Stall(Duration),
}

/// A fault check's transfer: a data listener of its own in the control connection's family, with
/// a 64 KiB receive buffer (the window closes soon), its port sent back; one connection on it
/// treated as `fault` says, every byte it carried checked; the verdict goes back on the control
/// connection, which outlives a reset data connection.
fn faulty(conn: TcpStream, fault: Fault) -> io::Result<String> {
    let mut local = conn.local_addr()?;
    local.set_port(0);
    let sock = Socket::new(Domain::for_address(local), Type::STREAM, None)?;
    sock.set_recv_buffer_size(64 << 10)?;
    sock.bind(&local.into())?;
    sock.listen(1)?;
    let listener = TcpListener::from(sock);
    writeln!(&conn, "port {}", listener.local_addr()?.port())?;
    listener.set_nonblocking(true)?;
    let started = Instant::now();
    let data = loop {
        match listener.accept() {
            Ok((d, _)) => break d,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && started.elapsed() < IDLE => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    };
    data.set_nonblocking(false)?;
    data.set_read_timeout(Some(IDLE))?;
    let (verdict, what) = match fault {
        Fault::Reset(n) => {
            let v = stream(&data, Duration::ZERO, Some(n));
            socket2::SockRef::from(&data).set_linger(Some(Duration::ZERO))?;
            drop(data);
            (v, format!("reset after {n} bytes"))
        }
        Fault::Stall(t) => {
            std::thread::sleep(t);
            (
                stream(&data, Duration::ZERO, None),
                format!("read after {} ms", t.as_millis()),
            )
        }
    };
    writeln!(&conn, "{verdict}")?;
    Ok(format!("tcp {what}: {verdict}"))
}

/// Reads the stream to EOF (or `limit` bytes), checking every byte; pauses `stall` once after
/// the first MiB.
fn stream(r: impl Read, stall: Duration, limit: Option<u64>) -> TcpVerdict {
    let mut r = r.take(limit.unwrap_or(u64::MAX));
    let mut v = TcpVerdict::default();
    let mut buf = vec![0u8; 256 << 10];
    let mut stalled = stall.is_zero();
    loop {
        match r.read(&mut buf) {
            Ok(0) => return v,
            Ok(n) => {
                for (i, &b) in buf[..n].iter().enumerate() {
                    let o = v.bytes + i as u64;
                    if b != wire::pattern(o) {
                        v.wrong += 1;
                        v.first.get_or_insert((o, b));
                    }
                }
                v.bytes += n as u64;
                if !stalled && v.bytes >= 1 << 20 {
                    stalled = true;
                    std::thread::sleep(stall);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                v.error = Some(e.to_string());
                return v;
            }
        }
    }
}

/// A UDP transfer: a fresh socket in the control connection's family, its port sent back, every
/// datagram placed and checked until the guest says `done` and the tail has drained.
fn datagrams(
    conn: TcpStream,
    mut control: BufReader<TcpStream>,
    count: u64,
    len: usize,
) -> io::Result<String> {
    let mut local = conn.local_addr()?;
    local.set_port(0);
    let udp = Socket::new(Domain::for_address(local), Type::DGRAM, None)?;
    // Room for a burst from the guest while this thread is not scheduled (root may force it).
    let _ = udp
        .set_recv_buffer_size(8 << 20)
        .or_else(|_| udp.set_recv_buffer_size(4 << 20));
    udp.bind(&local.into())?;
    let udp = UdpSocket::from(udp);
    udp.set_read_timeout(Some(Duration::from_millis(100)))?;
    let port = udp.local_addr()?.port();
    let done = Arc::new(AtomicBool::new(false));
    let receiver = {
        let done = done.clone();
        std::thread::spawn(move || receive(udp, count, len, &done))
    };
    writeln!(&conn, "port {port}")?;
    let mut line = String::new();
    control.by_ref().take(100).read_line(&mut line)?;
    done.store(true, Ordering::Relaxed);
    let verdict = receiver
        .join()
        .map_err(|_| io::Error::other("the UDP receiver panicked"))?;
    writeln!(&conn, "{verdict}")?;
    if line.trim() != "done" {
        return Err(io::Error::other(format!(
            "the guest ended with {line:?}, not done ({verdict})"
        )));
    }
    Ok(format!("udp {count} x {len} B sent: {verdict}"))
}

fn receive(udp: UdpSocket, count: u64, len: usize, done: &AtomicBool) -> UdpVerdict {
    let mut seen = vec![false; count as usize];
    let mut v = UdpVerdict::default();
    let mut buf = vec![0u8; 65536];
    let mut last = Instant::now();
    let mut done_at = None;
    loop {
        if done_at.is_none() && done.load(Ordering::Relaxed) {
            done_at = Some(Instant::now());
        }
        if done_at.is_some_and(|t| t.elapsed() >= UDP_TAIL && last.elapsed() >= UDP_TAIL)
            || last.elapsed() >= IDLE
        {
            return v;
        }
        match udp.recv(&mut buf) {
            Ok(n) => {
                last = Instant::now();
                match UdpVerdict::place(&buf[..n], count, len) {
                    Some(i) if seen[i as usize] => v.duplicate += 1,
                    Some(i) => {
                        seen[i as usize] = true;
                        v.intact += 1;
                    }
                    None => v.wrong += 1,
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                v.wrong += 1;
                return v;
            }
        }
    }
}
