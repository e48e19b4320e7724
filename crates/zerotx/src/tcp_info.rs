//! [`TcpInfo`]: what the kernel says of a TCP connection (`getsockopt(TCP_INFO)`), for a sender's
//! socket ([`Sender::tcp_info`](crate::Sender::tcp_info)) or any TCP socket ([`tcp_info`]).

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use crate::sys;

/// The essentials of the kernel's `struct tcp_info` for one TCP connection: how the congestion
/// control sees the path now, and what it had to send again. Read with [`tcp_info`] or
/// [`Sender::tcp_info`](crate::Sender::tcp_info); each read is one `getsockopt(2)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpInfo {
    /// Segments retransmitted since the connection began (`tcpi_total_retrans`).
    pub retransmits: u64,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked: u32,
    /// Segments the kernel counts as lost now (`tcpi_lost`).
    pub lost: u32,
    /// Congestion window, in segments (`tcpi_snd_cwnd`).
    pub cwnd: u32,
    /// Sender's maximum segment size, bytes (`tcpi_snd_mss`).
    pub mss: u32,
    /// Slow-start threshold, in segments (`tcpi_snd_ssthresh`; very large while unset).
    pub ssthresh: u32,
    /// Smoothed round-trip time (`tcpi_rtt`, microseconds).
    pub rtt: Duration,
    /// Its mean deviation (`tcpi_rttvar`).
    pub rttvar: Duration,
    /// Retransmission timeout now (`tcpi_rto`).
    pub rto: Duration,
    /// Path MTU, bytes (`tcpi_pmtu`).
    pub pmtu: u32,
}

impl TcpInfo {
    /// The congestion window in bytes: [`cwnd`](Self::cwnd) segments of [`mss`](Self::mss).
    pub fn cwnd_bytes(&self) -> u64 {
        u64::from(self.cwnd) * u64::from(self.mss)
    }
}

/// Reads `fd`'s `TCP_INFO` (`getsockopt(IPPROTO_TCP, TCP_INFO)`). A socket that is not TCP
/// fails as the kernel answers (`EOPNOTSUPP` on UDP, for instance).
///
/// ```
/// # let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let stream = std::net::TcpStream::connect(listener.local_addr()?)?;
/// let info = zerotx::tcp_info(&stream)?;
/// assert!(info.cwnd > 0 && info.mss > 0);
/// println!("rtt {:?}, {} retransmits", info.rtt, info.retransmits);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn tcp_info(fd: impl AsFd) -> io::Result<TcpInfo> {
    let (i, len) = sys::tcp_info(fd.as_fd())?;
    // Every field read here lies up to `tcpi_total_retrans`, which every kernel since 2.6 writes.
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_total_retrans) + 4;
    if len < needed {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("TCP_INFO returned {len} bytes, fewer than the {needed} this reads"),
        ));
    }
    let us = |v: u32| Duration::from_micros(u64::from(v));
    Ok(TcpInfo {
        retransmits: u64::from(i.tcpi_total_retrans),
        unacked: i.tcpi_unacked,
        lost: i.tcpi_lost,
        cwnd: i.tcpi_snd_cwnd,
        mss: i.tcpi_snd_mss,
        ssthresh: i.tcpi_snd_ssthresh,
        rtt: us(i.tcpi_rtt),
        rttvar: us(i.tcpi_rttvar),
        rto: us(i.tcpi_rto),
        pmtu: i.tcpi_pmtu,
    })
}
