//! `zerotx send` and `zerotx recv`: bulk transfer between hosts, iperf3-style, with plain bytes
//! on the wire (no header, no control connection), so any receiver or sender on the other end
//! works. Shared here: addresses, units, the interval lines.

pub mod iperf3;
pub mod pattern;
pub mod recv;
pub mod send;

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};

/// The port when an address names none (iperf3's).
pub const DEFAULT_PORT: u16 = 5201;

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// A byte stream.
    Tcp,
    /// Datagrams.
    Udp,
}

impl Proto {
    /// As iperf3 names it in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }
}

/// Where to connect or listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// An IP address and port.
    Ip(SocketAddr),
    /// `vsock:CID:PORT` (a stream).
    Vsock {
        /// Context id (`VMADDR_CID_ANY`, u32::MAX, to listen on every one).
        cid: u32,
        /// Port.
        port: u32,
    },
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Ip(a) => write!(f, "{a}"),
            Endpoint::Vsock { cid, port } if *cid == u32::MAX => write!(f, "vsock:any:{port}"),
            Endpoint::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
        }
    }
}

/// `HOST:PORT`, `[V6]:PORT`, `HOST` (port 5201), `vsock:CID:PORT`: every address the name
/// resolves to, in the resolver's order.
pub fn resolve(s: &str) -> anyhow::Result<Vec<Endpoint>> {
    resolve_as(s, SEND_FORMS)
}

/// The address forms `send` takes, for messages.
const SEND_FORMS: &str = "give HOST:PORT, [IPV6]:PORT or vsock:CID:PORT";
/// The address forms `recv --listen` takes, for messages.
const LISTEN_FORMS: &str =
    "give PORT, HOST:PORT, [IPV6]:PORT, HOST (port 5201), vsock:PORT or vsock:CID:PORT";

/// As [`resolve`], naming `forms` when `s` is no address.
fn resolve_as(s: &str, forms: &str) -> anyhow::Result<Vec<Endpoint>> {
    let t = s.trim();
    if let Some(rest) = t.strip_prefix("vsock:") {
        return Ok(vec![parse_vsock(t, rest)?]);
    }
    if t.is_empty() {
        bail!("empty address: {forms}");
    }
    // The resolver reads a bare number as an IPv4 address (70000 is 0.1.17.112): a host that
    // is all digits is a mistake (a port without its host?), never a place to send to.
    let host = match t.rsplit_once(':') {
        Some((h, _)) if !h.contains(':') => h,
        _ => t,
    };
    if !host.is_empty() && host.bytes().all(|b| b.is_ascii_digit()) {
        bail!(
            "invalid address {t:?}: {host} is not a host (a number alone reads as an IPv4 \
             address); {forms}"
        );
    }
    let with_port = if t.parse::<SocketAddr>().is_ok() {
        t.to_string()
    } else if let Ok(ip) = t.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        SocketAddr::new(ip, DEFAULT_PORT).to_string()
    } else if t.rsplit_once(':').is_some_and(|(h, _)| !h.contains(':')) {
        t.to_string()
    } else {
        format!("{t}:{DEFAULT_PORT}")
    };
    let addrs: Vec<_> = with_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {t:?}: {forms}"))?
        .map(Endpoint::Ip)
        .collect();
    if addrs.is_empty() {
        bail!("{t:?} resolves to no address");
    }
    Ok(addrs)
}

/// An address to listen on: as [`resolve`], and also `PORT` or `:PORT` alone (every address),
/// `vsock:any:PORT` or `vsock:PORT` (every CID).
pub fn listen_endpoint(s: &str) -> anyhow::Result<Endpoint> {
    let t = s.trim();
    if let Some(rest) = t.strip_prefix("vsock:") {
        if let Ok(port) = rest.parse::<u32>() {
            return Ok(Endpoint::Vsock {
                cid: u32::MAX,
                port,
            });
        }
        return parse_vsock(t, rest);
    }
    let digits = t.trim_start_matches(':');
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let port = digits.parse::<u16>().map_err(|_| {
            anyhow::anyhow!("invalid port {digits} in --listen {t:?}: give a port from 0 to 65535")
        })?;
        return Ok(Endpoint::Ip(SocketAddr::new(
            Ipv6Addr::UNSPECIFIED.into(),
            port,
        )));
    }
    Ok(resolve_as(t, LISTEN_FORMS)?[0])
}

fn parse_vsock(all: &str, rest: &str) -> anyhow::Result<Endpoint> {
    let (cid, port) = rest.split_once(':').with_context(|| {
        format!("invalid address {all:?}: expected vsock:CID:PORT, e.g. vsock:2:5201")
    })?;
    let cid = if cid == "any" {
        u32::MAX
    } else {
        cid.parse()
            .with_context(|| format!("invalid address {all:?}: CID {cid:?} is not a number"))?
    };
    let port = port
        .parse()
        .with_context(|| format!("invalid address {all:?}: port {port:?} is not a number"))?;
    Ok(Endpoint::Vsock { cid, port })
}

/// Bytes as iperf3 prints a transfer: `4.12 GBytes`, `512 KBytes`.
pub fn fmt_bytes(b: u64) -> String {
    let units = ["Bytes", "KBytes", "MBytes", "GBytes", "TBytes"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} Bytes")
    } else if v < 10.0 {
        format!("{v:.2} {}", units[i])
    } else if v < 100.0 {
        format!("{v:.1} {}", units[i])
    } else {
        format!("{v:.0} {}", units[i])
    }
}

/// The host as iperf3 names it: `Linux HOST RELEASE ARCH`.
pub fn system_info() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "Linux {} {} {}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/osrelease"),
        std::env::consts::ARCH
    )
}

/// What `-V` prints first: the version, the host and the time, as iperf3 does.
pub fn verbose_header() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    crate::stdout::outln!(
        "zerotx {}\n{}\nTime: {}",
        env!("CARGO_PKG_VERSION"),
        system_info(),
        http_date(now)
    );
}

/// Bits per second as iperf3 prints a bitrate: `35.4 Gbits/sec`.
pub fn fmt_bitrate(bits_per_sec: f64) -> String {
    let units = [
        "bits/sec",
        "Kbits/sec",
        "Mbits/sec",
        "Gbits/sec",
        "Tbits/sec",
    ];
    let mut v = bits_per_sec;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    if v < 10.0 {
        format!("{v:.2} {}", units[i])
    } else if v < 100.0 {
        format!("{v:.1} {}", units[i])
    } else {
        format!("{v:.0} {}", units[i])
    }
}

/// Bits per second of `bytes` over `secs` (0 for no time).
pub fn bitrate(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

/// An address printed as `host:port` (`[v6]:port`, `vsock:cid:port`) split into host and port,
/// as iperf3's JSON and lines keep them (port 0 when there is none).
pub fn host_port(addr: &str) -> (String, u64) {
    match addr.rsplit_once(':') {
        Some((h, p)) => match p.parse() {
            Ok(port) => (h.trim_matches(|c| c == '[' || c == ']').to_string(), port),
            Err(_) => (addr.to_string(), 0),
        },
        None => (addr.to_string(), 0),
    }
}

/// One iperf3-style line: `[  5]   0.00-1.00   sec  4.12 GBytes  35.4 Gbits/sec` and
/// whatever the caller appends.
pub fn interval_line(id: &str, start: Duration, end: Duration, bytes: u64, tail: &str) -> String {
    let secs = end.saturating_sub(start).as_secs_f64();
    format!(
        "[{id:>3}] {:>6.2}-{:<6.2} sec  {:>11}  {:>14}{tail}",
        start.as_secs_f64(),
        end.as_secs_f64(),
        fmt_bytes(bytes),
        fmt_bitrate(bitrate(bytes, secs)),
    )
}

/// Seconds since the epoch as iperf3's `timestamp.time` (RFC 7231's date:
/// `Sun, 09 Sep 2001 01:46:40 GMT`), by the `httpdate` crate.
pub fn http_date(secs: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_every_form_and_name_what_is_wrong() {
        let ip = |s: &str| resolve(s).unwrap()[0];
        assert_eq!(
            ip("127.0.0.1:9"),
            Endpoint::Ip("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(
            ip("127.0.0.1"),
            Endpoint::Ip("127.0.0.1:5201".parse().unwrap())
        );
        assert_eq!(ip("[::1]:7"), Endpoint::Ip("[::1]:7".parse().unwrap()));
        assert_eq!(ip("::1"), Endpoint::Ip("[::1]:5201".parse().unwrap()));
        assert_eq!(ip("[::1]"), Endpoint::Ip("[::1]:5201".parse().unwrap()));
        assert!(resolve("localhost").unwrap().iter().all(|e| matches!(e,
            Endpoint::Ip(a) if a.port() == 5201 && a.ip().is_loopback())));
        assert_eq!(ip("vsock:2:5201"), Endpoint::Vsock { cid: 2, port: 5201 });
        let e = resolve("vsock:x:1").unwrap_err().to_string();
        assert!(e.contains("CID \"x\""), "{e}");
        let e = resolve("vsock:2").unwrap_err().to_string();
        assert!(e.contains("vsock:CID:PORT"), "{e}");
        let e = resolve("no-such-host.invalid:1").unwrap_err().to_string();
        assert!(e.contains("cannot resolve"), "{e}");
        assert!(resolve("").is_err());
        for numeric in ["70000", "70000:80", "1"] {
            let e = resolve(numeric).unwrap_err().to_string();
            assert!(e.contains("is not a host"), "{numeric}: {e}");
        }
    }

    #[test]
    fn dates_print_as_iperf3_prints_them() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(1_000_000_000), "Sun, 09 Sep 2001 01:46:40 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(1_795_348_573), "Sun, 22 Nov 2026 11:56:13 GMT");
    }

    /// `host:port`, `[v6]:port` and `vsock:cid:port` apart, as iperf3's JSON keeps them.
    #[test]
    fn host_and_port_come_apart() {
        assert_eq!(host_port("127.0.0.1:80"), ("127.0.0.1".into(), 80));
        assert_eq!(host_port("[::1]:5201"), ("::1".into(), 5201));
        assert_eq!(host_port("vsock:3:9"), ("vsock:3".into(), 9));
        assert_eq!(host_port("odd"), ("odd".into(), 0));
    }

    #[test]
    fn listen_addresses_may_be_a_port_alone() {
        assert_eq!(
            listen_endpoint("5300").unwrap(),
            Endpoint::Ip("[::]:5300".parse().unwrap())
        );
        assert_eq!(
            listen_endpoint(":5300").unwrap(),
            Endpoint::Ip("[::]:5300".parse().unwrap())
        );
        assert_eq!(
            listen_endpoint("vsock:5300").unwrap(),
            Endpoint::Vsock {
                cid: u32::MAX,
                port: 5300
            }
        );
        assert_eq!(
            listen_endpoint("127.0.0.1:1").unwrap(),
            Endpoint::Ip("127.0.0.1:1".parse().unwrap())
        );
        for bad in ["70000", ":65536", "99999999999"] {
            let e = listen_endpoint(bad).unwrap_err().to_string();
            assert!(e.contains("invalid port"), "{bad}: {e}");
        }
    }

    #[test]
    fn units_parse_and_print_as_iperf3_does() {
        use crate::units::{bitrate, bytes};
        assert_eq!(bytes("-n", "1500").unwrap(), 1500);
        assert_eq!(bytes("-n", "10G").unwrap(), 10 << 30);
        assert_eq!(bytes("-n", "1.5k").unwrap(), 1536);
        assert_eq!(bitrate("-b", "100M").unwrap(), 100_000_000);
        assert_eq!(bitrate("-b", "2.5G").unwrap(), 2_500_000_000);
        for bad in ["", "0", "-1", "G", "1X", "nan", "0.4", "inf", "1e30G"] {
            assert!(bytes("-n", bad).is_err(), "{bad}");
            assert!(bitrate("-b", bad).is_err(), "{bad}");
        }
        assert_eq!(fmt_bytes(512), "512 Bytes");
        assert_eq!(fmt_bytes(4_423_000_000), "4.12 GBytes");
        assert_eq!(fmt_bitrate(35.4e9), "35.4 Gbits/sec");
        assert_eq!(fmt_bitrate(941e6), "941 Mbits/sec");
        let l = interval_line(
            "5",
            Duration::ZERO,
            Duration::from_secs(1),
            4_423_000_000,
            "",
        );
        assert_eq!(l, "[  5]   0.00-1.00   sec  4.12 GBytes  35.4 Gbits/sec");
    }
}
