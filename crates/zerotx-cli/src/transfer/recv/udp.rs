//! UDP datagrams: one loop receives, verifies and writes, and closes the intervals itself. A
//! transfer starts at the first datagram and ends `--idle` seconds after the last; each source
//! address is one stream. With `--verify` each datagram must be a piece of the generated stream
//! ([`locate`] finds where), and the positions show loss and reordering ([`Sequence`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::meter::Meter;
use super::{banner, HostPort, Opts, MAX_SOURCES, UDP_BUF};
use crate::transfer::pattern::{locate, Window, PERIOD};

/// What a datagram's position says about the stream it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// Where it was expected.
    InOrder,
    /// Ahead of where it was expected: this many datagrams (of its length) are missing.
    Gap(u64),
    /// Behind: it was overtaken (or is a duplicate).
    Behind,
}

/// Where one sender's next datagram is expected: right after the last one in order (the stream
/// starts at position 0), modulo the stream's period.
#[derive(Debug, Default)]
pub(super) struct Sequence {
    next: u64,
}

impl Sequence {
    /// Takes a datagram of `len` bytes at period position `pos`. A position up to half a period
    /// ahead is a gap (`gap / len` datagrams lost, rounded); one behind is out of order and
    /// does not move the expectation.
    pub fn arrive(&mut self, pos: u64, len: usize) -> Arrival {
        let period = PERIOD as u64;
        let gap = (pos + period - self.next) % period;
        if gap >= period / 2 {
            return Arrival::Behind;
        }
        self.next = (pos + len as u64) % period;
        if gap == 0 {
            Arrival::InOrder
        } else {
            let len = len.max(1) as u64;
            Arrival::Gap((gap + len / 2) / len)
        }
    }
}

/// One sender's state within a transfer.
struct Peer {
    index: usize,
    seq: Sequence,
}

/// The transfer in progress.
struct Transfer {
    meter: Meter,
    peers: HashMap<SocketAddr, Peer>,
    last: Instant,
    output: Option<BufWriter<File>>,
}

/// Receives datagrams on `sock` and reports each transfer, until one ends with `--once` or a
/// failure (`Err`: corrupt datagrams under `--verify`, or `--output`).
pub(super) fn serve(opts: &Opts, sock: UdpSocket, shown: &str) -> anyhow::Result<()> {
    let window = opts.verify.then(|| Window::new(UDP_BUF));
    // Wake up often enough to close intervals and notice the idle end without a timer.
    let mut poll = opts.idle / 10;
    if let Some(i) = opts.interval {
        poll = poll.min(i / 10);
    }
    let poll = poll.clamp(Duration::from_millis(5), Duration::from_millis(100));
    sock.set_read_timeout(Some(poll))
        .context("cannot set a receive timeout")?;
    let local = sock
        .local_addr()
        .map(HostPort::ip)
        .context("cannot read the bound address")?;
    let mut buf = vec![0u8; UDP_BUF];
    let mut cur: Option<Transfer> = None;
    banner(opts, shown);
    loop {
        if crate::stdout::closed() {
            // Nobody reads the report: end the transfer (flushing --output) and stop.
            return cur.take().map_or(Ok(()), |t| finish(opts, t));
        }
        let got = sock.recv_from(&mut buf);
        let now = Instant::now();
        let (n, from) = match got {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if let Some(t) = &mut cur {
                    let quiet = now.duration_since(t.last);
                    // While datagrams flow, close intervals on time; once they stop, leave the
                    // interval open: the next datagram closes it, or the end does at the last.
                    if quiet < 2 * poll {
                        t.meter.tick(now);
                    }
                    if quiet >= opts.idle {
                        let t = cur.take().expect("a transfer is in progress");
                        finish(opts, t)?;
                        if opts.once {
                            return Ok(());
                        }
                        banner(opts, shown);
                    }
                }
                continue;
            }
            // An ICMP error for an earlier datagram of ours, or a full queue: not fatal.
            Err(e) => {
                eprintln!("receive failed: {e}");
                continue;
            }
        };
        let t = match &mut cur {
            Some(t) => t,
            None => cur.insert(Transfer {
                meter: Meter::new(opts, HostPort::ip(from)),
                peers: HashMap::new(),
                last: now,
                output: match &opts.output {
                    Some(o) => {
                        let f = o.start().with_context(|| {
                            format!("cannot empty --output {}", o.path().display())
                        })?;
                        Some(BufWriter::with_capacity(1 << 20, f))
                    }
                    None => None,
                },
            }),
        };
        t.last = now;
        let meter = &mut t.meter;
        if t.peers.len() >= MAX_SOURCES && !t.peers.contains_key(&from) {
            if meter.ignored == 0 {
                eprintln!(
                    "ignoring datagrams from {from}: a transfer meters at most {MAX_SOURCES} \
                     source addresses (counted apart until it ends)"
                );
            }
            meter.ignored += 1;
            meter.tick(now);
            continue;
        }
        let peer = t.peers.entry(from).or_insert_with(|| Peer {
            index: meter.add_stream(local.clone(), HostPort::ip(from)),
            seq: Sequence::default(),
        });
        let data = &buf[..n];
        let s = &mut meter.streams[peer.index];
        s.bytes.fetch_add(n as u64, Ordering::Relaxed);
        s.datagrams.packets += 1;
        if let Some(w) = &window {
            let located = locate(data);
            let wrong = located.map(|p| w.mismatch(p, data));
            match located.filter(|_| wrong == Some(None)) {
                None => {
                    if s.datagrams.corrupt == 0 {
                        eprintln!(
                            "[{:>3}] verify: datagram {} ({n} bytes) is not the generated stream",
                            s.id, s.datagrams.packets
                        );
                    }
                    s.datagrams.corrupt += 1;
                    if s.mismatch.is_none() {
                        // Where the first wrong byte sits in the period, when the datagram
                        // starts as a piece of the stream.
                        s.mismatch = wrong.flatten();
                    }
                }
                Some(p) => match peer.seq.arrive(p, n) {
                    Arrival::InOrder => {}
                    Arrival::Gap(lost) => s.datagrams.lost += lost,
                    Arrival::Behind => {
                        // It fills a gap counted as lost when its successor came (as iperf3).
                        s.datagrams.out_of_order += 1;
                        s.datagrams.lost = s.datagrams.lost.saturating_sub(1);
                    }
                },
            }
        }
        if let (Some(out), Some(o)) = (&mut t.output, &opts.output) {
            if let Err(e) = out.write_all(data) {
                let t = cur.take().expect("a transfer is in progress");
                let end = t.meter.offset(t.last);
                t.meter.finish(end);
                bail!("cannot write --output {}: {e}", o.path().display());
            }
        }
        t.meter.tick(now);
    }
}

/// Ends a transfer at its last datagram: flushes `--output`, prints the totals, fails on corrupt
/// datagrams.
fn finish(opts: &Opts, mut t: Transfer) -> anyhow::Result<()> {
    let end = t.meter.offset(t.last);
    for s in &mut t.meter.streams {
        s.end = Some(s.end.unwrap_or(end));
    }
    let flushed = t.output.as_mut().map_or(Ok(()), |o| o.flush());
    let verdict = t.meter.finish(end);
    if let (Err(e), Some(o)) = (flushed, &opts.output) {
        bail!("cannot write --output {}: {e}", o.path().display());
    }
    if verdict.corrupt > 0 {
        bail!(
            "verification failed: {} datagrams were not the generated stream (was the sender \
             zerotx send --udp without --file?)",
            verdict.corrupt
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_count_missing_datagrams_and_late_ones_are_out_of_order() {
        let mut s = Sequence::default();
        assert_eq!(s.arrive(0, 1000), Arrival::InOrder);
        assert_eq!(s.arrive(1000, 1000), Arrival::InOrder);
        // 2000 and 3000 missing.
        assert_eq!(s.arrive(4000, 1000), Arrival::Gap(2));
        // 6000 overtook 5000.
        assert_eq!(s.arrive(6000, 1000), Arrival::Gap(1));
        assert_eq!(s.arrive(5000, 1000), Arrival::Behind);
        assert_eq!(s.arrive(7000, 1000), Arrival::InOrder);
    }

    #[test]
    fn the_period_wraps_without_counting_loss() {
        let p = PERIOD as u64;
        let mut s = Sequence { next: p - 100 };
        assert_eq!(s.arrive(p - 100, 1000), Arrival::InOrder);
        assert_eq!(s.arrive(900, 1000), Arrival::InOrder);
        // Behind across the wrap.
        assert_eq!(s.arrive(p - 100, 1000), Arrival::Behind);
        // A stream whose first datagram was lost.
        let mut s = Sequence::default();
        assert_eq!(s.arrive(1472, 1472), Arrival::Gap(1));
    }
}
