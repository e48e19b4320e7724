//! iperf3's `Retr` and `Cwnd` columns: what the kernel says of a TCP connection
//! (`getsockopt(TCP_INFO)`), sampled by the stream's own thread, which owns the socket, and
//! published to the main thread for the interval lines.

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a stream reads `TCP_INFO` (one system call; an interval line shows the last sample,
/// at most this old).
const EVERY: Duration = Duration::from_millis(20);

/// One reading of `TCP_INFO`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpSample {
    /// Segments retransmitted since the connection began (`tcpi_total_retrans`).
    pub retransmits: u64,
    /// Congestion window in bytes (`tcpi_snd_cwnd` segments of `tcpi_snd_mss` bytes).
    pub cwnd: u64,
    /// Smoothed round-trip time and its variation, microseconds (`tcpi_rtt`, `tcpi_rttvar`).
    pub rtt_us: u64,
    /// See `rtt_us`.
    pub rttvar_us: u64,
}

impl TcpSample {
    /// Reads `fd`'s `TCP_INFO` through the library ([`zerotx::tcp_info`]); `None` when it is not
    /// a TCP socket (vsock) or the call fails.
    #[allow(unsafe_code)]
    pub fn read(fd: RawFd) -> Option<Self> {
        // SAFETY: the fd number only decides which socket is read (a closed one fails, a reused
        // number would read another socket: `TcpSampler` samples only while its stream holds
        // the socket open), and the borrow ends with this call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let info = zerotx::tcp_info(fd).ok()?;
        Some(Self {
            retransmits: info.retransmits,
            cwnd: info.cwnd_bytes(),
            rtt_us: info.rtt.as_micros() as u64,
            rttvar_us: info.rttvar.as_micros() as u64,
        })
    }
}

/// What the main thread reads: the last sample of each stream.
#[derive(Debug, Default)]
pub struct TcpCounters {
    /// A sample was taken (the stream is TCP).
    pub known: AtomicBool,
    /// See [`TcpSample`].
    pub retransmits: AtomicU64,
    /// See [`TcpSample`].
    pub cwnd: AtomicU64,
    /// See [`TcpSample`].
    pub rtt_us: AtomicU64,
    /// See [`TcpSample`].
    pub rttvar_us: AtomicU64,
}

impl TcpCounters {
    fn store(&self, s: TcpSample) {
        self.retransmits.store(s.retransmits, Ordering::Relaxed);
        self.cwnd.store(s.cwnd, Ordering::Relaxed);
        self.rtt_us.store(s.rtt_us, Ordering::Relaxed);
        self.rttvar_us.store(s.rttvar_us, Ordering::Relaxed);
        self.known.store(true, Ordering::Release);
    }

    /// The last sample, if any was taken.
    pub fn load(&self) -> Option<TcpSample> {
        self.known.load(Ordering::Acquire).then(|| TcpSample {
            retransmits: self.retransmits.load(Ordering::Relaxed),
            cwnd: self.cwnd.load(Ordering::Relaxed),
            rtt_us: self.rtt_us.load(Ordering::Relaxed),
            rttvar_us: self.rttvar_us.load(Ordering::Relaxed),
        })
    }
}

/// A stream's whole run, as iperf3's `end.streams[].sender` gives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpSummary {
    /// The last sample.
    pub last: TcpSample,
    /// Largest congestion window sampled, bytes.
    pub max_cwnd: u64,
    /// Round-trip times sampled, microseconds.
    pub min_rtt_us: u64,
    /// See `min_rtt_us`.
    pub max_rtt_us: u64,
    /// See `min_rtt_us`.
    pub mean_rtt_us: u64,
}

/// Samples a TCP socket every [`EVERY`] while its stream runs. Its stream samples only while it
/// holds the socket open, and [`finish`](Self::finish)es it before the socket closes.
#[derive(Debug)]
pub struct TcpSampler {
    fd: RawFd,
    counters: Arc<TcpCounters>,
    next: Instant,
    summary: TcpSummary,
    rtt_sum: u64,
    samples: u64,
}

impl TcpSampler {
    /// For the socket `fd`, which the caller keeps open while it samples; `None` if it is not
    /// TCP. Takes the first sample. Each sample goes to `counters`.
    pub fn new(fd: RawFd, counters: Arc<TcpCounters>) -> Option<Self> {
        let first = TcpSample::read(fd)?;
        let mut me = Self {
            fd,
            counters,
            next: Instant::now() + EVERY,
            summary: TcpSummary {
                min_rtt_us: u64::MAX,
                ..TcpSummary::default()
            },
            rtt_sum: 0,
            samples: 0,
        };
        me.record(first);
        Some(me)
    }

    /// Samples if the last one is [`EVERY`] old.
    pub fn tick(&mut self, now: Instant) {
        if now >= self.next {
            self.next = now + EVERY;
            self.sample();
        }
    }

    /// Samples now (at the stream's end: what its last interval line and its totals show).
    pub fn sample(&mut self) {
        if let Some(s) = TcpSample::read(self.fd) {
            self.record(s);
        }
    }

    /// The run, once the socket is done with.
    pub fn finish(self) -> TcpSummary {
        self.summary
    }

    fn record(&mut self, s: TcpSample) {
        self.counters.store(s);
        let m = &mut self.summary;
        m.last = s;
        m.max_cwnd = m.max_cwnd.max(s.cwnd);
        m.min_rtt_us = m.min_rtt_us.min(s.rtt_us);
        m.max_rtt_us = m.max_rtt_us.max(s.rtt_us);
        self.rtt_sum += s.rtt_us;
        self.samples += 1;
        m.mean_rtt_us = self.rtt_sum / self.samples;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream, UdpSocket};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_tcp_socket_has_a_window_and_a_udp_socket_has_no_sample() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let s = TcpSample::read(c.as_raw_fd()).expect("TCP_INFO of a connected TCP socket");
        assert!(s.cwnd > 0, "{s:?}");
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(TcpSample::read(u.as_raw_fd()), None);
    }

    #[test]
    fn the_summary_keeps_extremes_and_the_mean() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let counters = Arc::new(TcpCounters::default());
        assert_eq!(counters.load(), None);
        let mut t = TcpSampler::new(c.as_raw_fd(), counters.clone()).unwrap();
        let first = counters.load().expect("the first sample is published");
        for (rtt, cwnd) in [(10, 100), (30, 50)] {
            t.record(TcpSample {
                rtt_us: rtt,
                cwnd,
                ..TcpSample::default()
            });
        }
        let m = t.finish();
        assert_eq!(m.max_cwnd, first.cwnd.max(100));
        assert_eq!(m.min_rtt_us, first.rtt_us.min(10));
        assert_eq!(m.max_rtt_us, first.rtt_us.max(30));
        assert_eq!(m.mean_rtt_us, (first.rtt_us + 10 + 30) / 3);
        assert_eq!(m.last.cwnd, 50);
        assert_eq!(counters.load().unwrap().rtt_us, 30);
    }
}
