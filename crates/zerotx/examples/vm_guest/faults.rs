//! Faults on the guest's network path (virtio-net on the host's tap, `net.rs`), each with the host
//! checking every byte it got and the guest accounting for every buffer: back (and overwritten
//! with 0xEE at once), or kept by [`Sender::close`] and counted. A transfer that cannot finish
//! must end with an error that says why, never a hang.
//! - the guest's link goes down for a while and comes back mid-stream (TCP);
//! - the path MTU drops mid-stream (the NIC's MTU 9000 -> 1500; TCP v4 and v6, UDP);
//! - netem on the guest's NIC delays, reorders and (TCP) duplicates packets;
//! - the receiver resets the connection mid-stream (`SO_LINGER` 0);
//! - the sender is closed while the receiver keeps its window closed: buffers still in flight;
//! - `auto` on the second NIC, which copies (no vnet header: no scatter-gather or checksum
//!   offload), learns that the route copies, and stays zero-copy on the tap; `explain()` says
//!   which.

use std::io::{BufReader, Write};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use zerotx::{BufPool, EngineKind, PoolBufMut, PooledBuf, Released, SendError, Sender, Stats};

use crate::checks::Variant;
use crate::net::{self, Options, Proto, Receiver};
use crate::wire::{self, TcpVerdict};

type Check = Result<String, String>;

/// Bytes per send in the reset and close checks.
const BLOCK: usize = 64 << 10;
/// Buffers in their pools.
const POOL: usize = 16;
/// The reset check's stream: more than the guest's send buffer (4 MiB at most) and the host's
/// window, so the reset meets a sender that still has bytes to go.
const RESET_TOTAL: u64 = 8 << 20;
/// Bytes the host reads before it resets.
const RESET_AFTER: u64 = 1 << 20;
/// How long the host keeps its window closed before reading, in the close check.
const STALL_MS: u64 = 4000;
/// Where the link flap and the MTU drop happen.
const FAULT_AT: u64 = 1 << 20;
/// The NIC's MTU as the script sets it, and the one it drops to.
const MTU: &str = "9000";
const LOW_MTU: &str = "1500";

/// Runs busybox `ip` with `args`.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Waits up to 10 s for the NIC's carrier (after the link came back up).
fn carrier() -> Result<(), String> {
    let path = format!("/sys/class/net/{}/carrier", net::NIC);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if std::fs::read_to_string(&path).is_ok_and(|s| s.trim() == "1") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "{} has no carrier 10 s after coming back up",
        net::NIC
    ))
}

/// The guest's link goes down for 1.5 s after the first MiB and comes back; TCP retransmits the
/// lost segments (from the lent pages) and the stream ends intact, every buffer back. The NIC
/// keeps its IPv6 address while down (`keep_addr_on_down`; by default the kernel drops it, and
/// the later IPv6 checks would find no route).
pub fn link_flap(proto: Proto, v: Variant) -> Check {
    let min_datagrams = None;
    let keep = format!("/proc/sys/net/ipv6/conf/{}/keep_addr_on_down", net::NIC);
    std::fs::write(&keep, "1").map_err(|e| format!("{keep}: {e}"))?;
    let mut flap = None;
    let mut at = |offset: u64| {
        if offset >= FAULT_AT && flap.is_none() {
            flap = Some(std::thread::spawn(|| {
                let down = ip(&["link", "set", net::NIC, "down"]);
                std::thread::sleep(Duration::from_millis(1500));
                // Up again whatever happened: later checks need the link.
                let up = ip(&["link", "set", net::NIC, "up"]);
                down.and(up)
            }));
        }
    };
    let result = net::transfer_with(
        proto,
        v,
        Receiver::Verify,
        Options {
            to: None,
            at: &mut at,
            all_zero_copy: false,
            inspect: None,
            min_datagrams,
        },
    );
    let flapped = match flap {
        Some(t) => t.join().map_err(|_| "the link thread panicked")?,
        None => Err("the stream ended before the link went down".into()),
    };
    let result = result?;
    flapped.and(carrier())?;
    Ok(format!("link down 1.5 s at 1 MiB and up again: {result}"))
}

/// Restores the NIC's MTU (and forgets learnt path MTUs) however a check ends.
struct MtuBack;

impl Drop for MtuBack {
    fn drop(&mut self) {
        let _ = ip(&["link", "set", net::NIC, "mtu", MTU]);
        let _ = ip(&["route", "flush", "cache"]);
        let _ = ip(&["-6", "route", "flush", "cache"]);
    }
}

/// The NIC's MTU drops from 9000 to 1500 after the first MiB (a path that shrank): TCP sends
/// smaller segments and the stream ends intact; UDP datagrams of 8 KiB no longer fit, and go
/// fragmented (by copy) or fail with a clear error, every one that arrives intact.
pub fn mtu_drop(proto: Proto, v: Variant) -> Check {
    let _back = MtuBack;
    // After the drop each datagram goes as six fragments, and on IPv6 the host's 3% drop rule
    // meets each fragment (IPv6 reassembles after the input hook): 0.97^6, about 83% of those
    // arrive. Three in four leaves room below that.
    let min_datagrams = Some(300);
    let mut dropped: Option<Result<(), String>> = None;
    let mut at = |offset: u64| {
        if offset >= FAULT_AT && dropped.is_none() {
            dropped = Some(ip(&["link", "set", net::NIC, "mtu", LOW_MTU]));
        }
    };
    let result = net::transfer_with(
        proto,
        v,
        Receiver::Verify,
        Options {
            to: None,
            at: &mut at,
            all_zero_copy: false,
            inspect: None,
            min_datagrams,
        },
    );
    let result = result?;
    dropped.unwrap_or_else(|| Err("the transfer ended before the MTU dropped".into()))?;
    Ok(format!("MTU {MTU} -> {LOW_MTU} at 1 MiB: {result}"))
}

/// What came of the buffers of a fault check's stream.
#[derive(Default)]
struct Ledger {
    /// Buffers sent (the sender took them).
    sent: usize,
    /// Bytes of the buffers sent.
    sent_bytes: u64,
    /// Buffers back without an error, and the bytes their reports say went.
    ok: usize,
    ok_bytes: u64,
    /// Buffers back with an error, and the bytes their reports say went before it.
    failed: usize,
    failed_bytes: u64,
    /// Buffers the sender refused (`send` handed them back), never counted as sent.
    refused: usize,
    /// Buffers still held by the kernel at close, kept by the sender.
    kept: usize,
    /// The first error the sender or a report gave.
    error: Option<String>,
}

impl Ledger {
    /// Counts released buffers and scribbles each at once: a buffer given back while the kernel
    /// still reads it puts 0xEE on the wire, which the host reports.
    fn back(&mut self, out: &mut Vec<Released<PooledBuf>>, free: &mut Vec<PoolBufMut>) {
        for r in out.drain(..) {
            if let Some(e) = &r.report.error {
                self.failed += 1;
                self.failed_bytes += r.report.bytes as u64;
                self.error
                    .get_or_insert_with(|| format!("a buffer came back with: {e}"));
            } else {
                self.ok += 1;
                self.ok_bytes += r.report.bytes as u64;
            }
            let mut m = r.buf.into_mut();
            m.fill(0xEE);
            free.push(m);
        }
    }

    fn line(&self) -> String {
        format!(
            "{} buffers sent ({} B): {} back ({} B sent), {} back with an error ({} B sent \
             before it), {} kept at close, {} refused by send",
            self.sent,
            self.sent_bytes,
            self.ok,
            self.ok_bytes,
            self.failed,
            self.failed_bytes,
            self.kept,
            self.refused
        )
    }
}

/// Sends up to `total` bytes of the pattern in [`BLOCK`]s from a pool of [`POOL`], each returned
/// buffer scribbled at once; stops at the first error (or, with `patience`, the first send that
/// finds no room for that long); closes the sender after `close_in`. Returns the ledger, whose
/// buffers must add up to the pool, and the socket (shut down for writing).
fn faulty_stream(
    data: TcpStream,
    v: Variant,
    total: u64,
    patience: Option<Duration>,
    close_in: Duration,
) -> Result<(Ledger, Stats, TcpStream), String> {
    let pool = BufPool::new(BLOCK, POOL).map_err(|e| e.to_string())?;
    let mut tx = net::sender(data.into(), v, &pool)?;
    let mut free: Vec<PoolBufMut> = std::iter::from_fn(|| pool.take()).collect();
    let mut out = Vec::new();
    let mut l = Ledger::default();
    let mut offset = 0u64;
    while offset < total && l.error.is_none() {
        let Some(mut b) = free.pop() else {
            match tx.wait_released(&mut out, Some(Duration::from_secs(20))) {
                Ok(0) => return Err(format!("no buffer came back within 20 s at {offset}")),
                Ok(_) => l.back(&mut out, &mut free),
                Err(e) => {
                    l.error = Some(format!("waiting for a buffer: {e}"));
                }
            }
            continue;
        };
        let len = BLOCK.min((total - offset) as usize);
        crate::peer::fill(&mut b[..len], offset);
        let sent = match patience {
            Some(t) => tx.send_timeout(b.freeze(len), t),
            None => tx.send(b.freeze(len)),
        };
        match sent {
            Ok(()) => {
                l.sent += 1;
                l.sent_bytes += len as u64;
                offset += len as u64;
            }
            Err(SendError::WouldBlock(b)) => {
                free.push(b.into_mut());
                l.refused += 1;
                break;
            }
            Err(e) => {
                l.error = Some(format!("send at offset {offset}: {e}"));
                l.refused += 1;
                free.push(e.into_inner().into_mut());
            }
        }
        if let Err(e) = tx.reap(&mut out) {
            l.error.get_or_insert_with(|| format!("reap: {e}"));
        }
        l.back(&mut out, &mut free);
    }
    let stats = tx.stats();
    let leaked = zerotx::leaked_buffers();
    let mut closed = tx.close(close_in);
    l.back(&mut closed.released, &mut free);
    l.kept = closed.kept;
    if zerotx::leaked_buffers() - leaked != l.kept as u64 {
        return Err(format!(
            "close kept {} buffers but the leak counter moved by {}",
            l.kept,
            zerotx::leaked_buffers() - leaked
        ));
    }
    // Every buffer of the pool: free again, or kept by the sender (never freed).
    if free.len() + l.kept != POOL || l.ok + l.failed + l.kept != l.sent {
        return Err(format!(
            "buffers lost: {} free + {} kept of {POOL}; {}",
            free.len(),
            l.kept,
            l.line()
        ));
    }
    if stats.bad_completions != 0 {
        return Err(format!("the ledger refused completions: {stats:?}"));
    }
    let s = TcpStream::from(closed.fd);
    // A sender that kept buffers shut the stream already; the others end it here (a reset
    // stream fails, which is fine).
    let _ = s.shutdown(Shutdown::Write);
    Ok((l, stats, s))
}

/// A control connection to the host and a data connection to the listener it opens for `hello`.
fn data_connection(v6: bool, hello: &str) -> Result<(TcpStream, TcpStream), String> {
    let control = net::connect_to(v6, wire::PORT)?;
    writeln!(&control, "{} data {hello}", wire::HELLO).map_err(|e| format!("hello: {e}"))?;
    let line = net::read_line(&mut BufReader::new(&control), "port")?;
    let port: u16 = line
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the host answered {line:?}, not a port"))?;
    Ok((control, net::connect_to(v6, port)?))
}

/// The host reads 1 MiB of an 8 MiB stream, checking it, and resets the connection: the sender
/// must end with an error naming the reset (or the broken pipe), and give back or keep every
/// buffer; no byte the host read is wrong.
pub fn reset(v6: bool, v: Variant) -> Check {
    let (control, data) = data_connection(v6, &format!("reset {RESET_AFTER}"))?;
    let (l, stats, _s) = faulty_stream(data, v, RESET_TOTAL, None, Duration::from_secs(2))?;
    let line = net::read_line(&mut BufReader::new(&control), "verdict")?;
    let verdict = TcpVerdict::parse(&line)?;
    let summary = format!(
        "host read {} of {RESET_AFTER} bytes before its reset ({} wrong); {}; {}",
        verdict.bytes,
        verdict.wrong,
        l.line(),
        crate::checks::brief(&stats)
    );
    verdict
        .check(RESET_AFTER)
        .map_err(|e| format!("{e}; {summary}"))?;
    match &l.error {
        None => Err(format!(
            "the reset went unnoticed: no error from the sender; {summary}"
        )),
        Some(e) if !(e.contains("reset") || e.contains("roken pipe")) => {
            Err(format!("the error does not name the reset: {e}; {summary}"))
        }
        Some(e) => Ok(format!("error: {e}; {summary}")),
    }
}

/// The host keeps its 64 KiB window closed for 4 s while the guest sends 16 buffers of 64 KiB
/// (each waiting at most 1 s for room) and then closes the sender after 300 ms: the buffers the
/// kernel still holds are kept, counted, and never handed back; the stream is shut down; the
/// host, reading at last, gets only pattern bytes, at least every byte of the buffers given
/// back as sent, and at most what was sent.
pub fn closed_in_flight(v6: bool, v: Variant) -> Check {
    let (control, data) = data_connection(v6, &format!("stall {STALL_MS}"))?;
    let (l, stats, _s) = faulty_stream(
        data,
        v,
        (POOL * BLOCK) as u64,
        Some(Duration::from_secs(1)),
        Duration::from_millis(300),
    )?;
    let line = net::read_line(&mut BufReader::new(&control), "verdict")?;
    let verdict = TcpVerdict::parse(&line)?;
    let summary = format!(
        "host read {} bytes after its stall ({} wrong); {}; {}",
        verdict.bytes,
        verdict.wrong,
        l.line(),
        crate::checks::brief(&stats)
    );
    let zero_copy = !matches!(v.kind, EngineKind::Copy | EngineKind::Uring);
    let fail = |e: String| Err(format!("{e}; {summary}"));
    if let Some(e) = &verdict.error {
        return fail(format!("the host's read failed: {e}"));
    }
    if verdict.wrong != 0 {
        return fail(format!(
            "{} wrong bytes at the host, first {:?}",
            verdict.wrong, verdict.first
        ));
    }
    if verdict.bytes < l.ok_bytes || verdict.bytes > l.sent_bytes {
        return fail(format!(
            "the host got {} bytes: not between the bytes given back as sent ({}) and those \
             sent ({})",
            verdict.bytes, l.ok_bytes, l.sent_bytes
        ));
    }
    if zero_copy && l.kept == 0 {
        return fail("closed with nothing in flight: the window did not hold the buffers".into());
    }
    Ok(summary)
}

/// `auto` to the host, every byte checked there; then what `explain()` says must match
/// `copying`: over UDP through the NIC without offloads the route copies (auto switches to
/// copying, zero-copy OFF, and the NIC's missing scatter-gather is named as the reason), over
/// TCP through the tap zero-copy stays ON with nothing copied and no device named.
///
/// Not TCP on the copying NIC: TCP sockets always get scatter-gather in their route caps (GSO
/// is always on), so the kernel builds zero-copy packets and copies them when it segments them
/// in software for the device, flagging only some completions as copied: from 13 to 64 of 64
/// sends, varying from run to run ([`tcp_through_copying`] shows the share).
pub fn auto_explained(copying: bool) -> Check {
    let inspect = move |tx: &Sender<PooledBuf>| -> Check {
        let x = tx.explain();
        let s = tx.stats();
        let text = x.to_string().replace('\n', " ");
        let learnt = s.copied_route > 0 || s.switches_to_copy > 0;
        // The NIC without offloads is named as the reason, with its fix; the tap's is not.
        let named = text.contains(&format!(
            "the egress device {} has scatter-gather off",
            wire::NIC_COPYING
        ));
        let off = text.contains("zero-copy is OFF") && !x.zerocopy && named;
        let on = text.contains("zero-copy is ON") && x.zerocopy && !named;
        let counts = format!(
            "route-copies {}, switches to copy {}, kernel-copied {}, zero-copy {}",
            s.copied_route, s.switches_to_copy, s.kernel_copied, s.zerocopy
        );
        match (copying, learnt, off, on) {
            (true, true, true, _) | (false, false, _, true) => {
                Ok(format!("{counts}; explain(): {text}"))
            }
            _ => Err(format!(
                "auto on the {} NIC: {counts}; explain(): {text}",
                if copying { "copying" } else { "offloading" }
            )),
        }
    };
    let to = copying.then_some(IpAddr::V4(wire::HOST4_COPYING));
    net::transfer_with(
        if copying { Proto::Udp4 } else { Proto::Tcp4 },
        Variant::plain(EngineKind::Auto),
        Receiver::Verify,
        Options {
            to,
            at: &mut |_| {},
            all_zero_copy: !copying,
            inspect: Some(&inspect),
            min_datagrams: None,
        },
    )
}

/// The copying NIC is there, up, and has no scatter-gather (its driver offers none without the
/// tap's vnet header).
pub fn copying_nic() -> Check {
    let nic = wire::NIC_COPYING;
    let carrier = std::fs::read_to_string(format!("/sys/class/net/{nic}/carrier"))
        .map_err(|e| format!("no {nic} ({e}): did QEMU get the second NIC?"))?;
    if carrier.trim() != "1" {
        return Err(format!("{nic} has no carrier"));
    }
    Ok(format!(
        "{nic} up (virtio-net on a tap without vnet header)"
    ))
}

/// `v` over TCP through the NIC that copies: every byte checked at the host, every buffer back;
/// the line says how many completions the kernel flagged as copied (a silent copier: the kernel
/// copies every packet for this device, and flags only some).
pub fn tcp_through_copying(v: Variant) -> Check {
    net::transfer_with(
        Proto::Tcp4,
        v,
        Receiver::Verify,
        Options {
            to: Some(IpAddr::V4(wire::HOST4_COPYING)),
            at: &mut |_| {},
            all_zero_copy: false,
            inspect: None,
            min_datagrams: None,
        },
    )
}

/// The script's `tc` (iproute2: busybox's has no netem).
const TC: &str = "/usr/sbin/tc";

/// Removes the netem qdisc however a check ends.
struct NetemOff;

impl Drop for NetemOff {
    fn drop(&mut self) {
        let _ = Command::new(TC)
            .args(["qdisc", "del", "dev", net::NIC, "root"])
            .output();
    }
}

/// netem on the guest's NIC for one transfer: 5 ms +- 5 ms of delay with a quarter of the
/// packets sent at once (reordered), and on TCP 2% duplicated, on top of the host's drops; every
/// byte checked at the host, every buffer back and overwritten. UDP gets no duplicates (the
/// host counts a datagram twice as a failure).
pub fn netem(proto: Proto, v: Variant) -> Check {
    let mut args = vec![
        "qdisc",
        "add",
        "dev",
        net::NIC,
        "root",
        "netem",
        "delay",
        "5ms",
        "5ms",
        "reorder",
        "25%",
        "50%",
    ];
    if matches!(proto, Proto::Tcp4 | Proto::Tcp6) {
        args.extend(["duplicate", "2%"]);
    }
    let out = Command::new(TC)
        .args(&args)
        .output()
        .map_err(|e| format!("{TC}: {e} (the script copies the host's tc into the guest)"))?;
    if !out.status.success() {
        return Err(format!(
            "tc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let _off = NetemOff;
    let spec = args[5..].join(" ");
    let result = net::transfer_with(
        proto,
        v,
        Receiver::Verify,
        Options {
            to: None,
            at: &mut |_| {},
            all_zero_copy: false,
            inspect: None,
            min_datagrams: None,
        },
    )?;
    let stats = Command::new(TC)
        .args(["-s", "qdisc", "show", "dev", net::NIC])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Ok(format!("{spec}: {result}; {stats}"))
}
