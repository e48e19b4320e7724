//! What a transfer measures, apart from when it is measured and how it is printed: datagram
//! counts, streams, samples of an interval or a total, CPU time, the verdict of `--verify`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::HostPort;

/// UDP datagram counts of one stream (all zero for TCP; loss, order and corruption are known only
/// with `--verify`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Datagrams {
    /// Datagrams received.
    pub packets: u64,
    /// Datagrams missing, from the gaps in the stream's positions.
    pub lost: u64,
    /// Datagrams that arrived behind one sent after them.
    pub out_of_order: u64,
    /// Datagrams that are not a piece of the generated stream.
    pub corrupt: u64,
}

/// One stream (a TCP connection, or one UDP sender's address).
pub(super) struct Stream {
    /// iperf3's socket id, printed as `[  5]`.
    pub id: u32,
    pub local: HostPort,
    pub remote: HostPort,
    /// Bytes received so far (the TCP reading thread adds to it).
    pub bytes: Arc<AtomicU64>,
    /// When it started and ended, from the transfer's start.
    pub start: Duration,
    pub end: Option<Duration>,
    /// How it ended, when not by an orderly close or the UDP idle time.
    pub note: Option<String>,
    /// The first stream offset that was not the generated stream (TCP), or the stream position
    /// of the first corrupt datagram (UDP).
    pub mismatch: Option<u64>,
    pub datagrams: Datagrams,
    /// Bytes and datagrams at the last interval's end.
    pub last_bytes: u64,
    pub last_datagrams: Datagrams,
}

/// One interval or total, for one stream or the sum.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub id: Option<u32>,
    pub start: Duration,
    pub end: Duration,
    pub bytes: u64,
    pub datagrams: Datagrams,
}

/// CPU time of the receiving process, user and system.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cpu {
    pub user: Duration,
    pub system: Duration,
}

impl Cpu {
    /// The process's CPU time so far.
    pub fn now() -> Self {
        let (user, system) = zerotx_testbed::process_cpu_split();
        Self { user, system }
    }
}

/// What the finished transfer says, for the caller's exit status.
pub(super) struct Verdict {
    /// The first stream that was not the generated stream, and where (`--verify` only).
    pub mismatch: Option<(u32, u64)>,
    /// Corrupt datagrams (UDP `--verify`).
    pub corrupt: u64,
    /// The first stream that ended by a reset or a failed read, and how (`--verify` only): the
    /// sender stopped before the end of its stream.
    pub cut_short: Option<(u32, String)>,
}

/// The counts of `a` since `b`.
pub(super) fn minus(a: Datagrams, b: Datagrams) -> Datagrams {
    Datagrams {
        packets: a.packets - b.packets,
        lost: a.lost.saturating_sub(b.lost),
        out_of_order: a.out_of_order - b.out_of_order,
        corrupt: a.corrupt - b.corrupt,
    }
}

/// The sum of `samples` over `start..end` (no stream id).
pub(super) fn sum_of(samples: &[Sample], start: Duration, end: Duration) -> Sample {
    let mut d = Datagrams::default();
    for s in samples {
        d.packets += s.datagrams.packets;
        d.lost += s.datagrams.lost;
        d.out_of_order += s.datagrams.out_of_order;
        d.corrupt += s.datagrams.corrupt;
    }
    Sample {
        id: None,
        start,
        end,
        bytes: samples.iter().map(|s| s.bytes).sum(),
        datagrams: d,
    }
}

/// Lost datagrams as a share of those sent, as iperf3 prints it (`0.12%`, `0%`).
pub(super) fn percent(d: Datagrams) -> String {
    let p = lost_percent(d);
    if p == 0.0 {
        "0%".into()
    } else {
        format!("{p:.2}%")
    }
}

/// Lost datagrams as a percentage of those sent.
pub(super) fn lost_percent(d: Datagrams) -> f64 {
    let total = d.packets + d.lost;
    if total == 0 {
        0.0
    } else {
        d.lost as f64 * 100.0 / total as f64
    }
}

/// User and system seconds.
pub(super) fn cpu_secs(cpu: Cpu) -> f64 {
    (cpu.user + cpu.system).as_secs_f64()
}

/// CPU seconds per 10^9 bytes received (`None` for no bytes).
pub(super) fn cpu_per_gb(cpu: Cpu, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu_secs(cpu) / (bytes as f64 / 1e9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_prints_as_iperf3_does() {
        let d = Datagrams {
            packets: 99,
            lost: 1,
            ..Default::default()
        };
        assert_eq!(percent(d), "1.00%");
        assert_eq!(percent(Datagrams::default()), "0%");
        assert_eq!(
            cpu_per_gb(
                Cpu {
                    user: Duration::from_millis(300),
                    system: Duration::from_millis(200)
                },
                2_000_000_000
            ),
            Some(0.25)
        );
    }
}
