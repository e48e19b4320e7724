//! `zerotx recv`: the receiving end of a bulk transfer, iperf3-style, taking plain bytes from any
//! sender (`zerotx send`, iperf3's data is not it, but socat, nc or a Python socket are).
//!
//! A TCP *transfer* is the set of connections that overlap in time: it starts with the first
//! connection accepted while none is active and ends when the last active one ends, which is
//! what a sender with `--parallel N` produces. A UDP transfer starts at the first datagram and
//! ends after `--idle` seconds without one; each source address is one stream.
//!
//! The pieces: [`tcp`] (one reading thread per connection) and [`udp`] (one loop) feed a
//! [`meter::Meter`], which prints the interval lines and the totals, as text or as iperf3's JSON
//! ([`json`]).

mod json;
mod meter;
mod output;
mod sample;
mod tcp;
mod udp;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use socket2::{Domain, SockAddr, Socket, Type};

use super::{listen_endpoint, Endpoint, Proto};
use crate::options::RecvArgs;
use crate::stdout::outln;

/// Bytes per `read` on a TCP connection (and the longest slice verified at once). 128 KiB, as
/// iperf3: on loopback here 128 KiB reads moved 20.5 Gbit/s (median of 8) against 18-19 for 256 KiB
/// and 1 MiB (shorter holds of the socket lock let the sender's softirq queue behind less).
const TCP_BUF: usize = 128 << 10;
/// Bytes per `recv` of a datagram: more than the largest UDP payload.
const UDP_BUF: usize = 1 << 16;
/// The most source addresses one transfer meters (one stream each): datagrams from others are
/// counted apart ([`meter::Meter::ignored`]), neither verified nor written to `--output`.
const MAX_SOURCES: usize = 128;

/// The flags, checked.
#[derive(Debug, Clone)]
struct Opts {
    proto: Proto,
    verify: bool,
    output: Option<Arc<output::Output>>,
    once: bool,
    /// `None` for no interval lines.
    interval: Option<Duration>,
    idle: Duration,
    json: bool,
    /// `--json-stream`: one JSON line per event, nothing kept.
    json_stream: bool,
}

impl Opts {
    fn check(args: &RecvArgs) -> anyhow::Result<Self> {
        let interval = crate::units::seconds_or_none("--interval", args.interval)?;
        Ok(Self {
            proto: if args.udp { Proto::Udp } else { Proto::Tcp },
            verify: args.verify,
            output: args
                .output
                .as_deref()
                .map(output::Output::open)
                .transpose()?
                .map(Arc::new),
            once: args.once,
            interval,
            idle: crate::units::seconds("--idle", args.idle)?,
            json: args.json || args.json_stream,
            json_stream: args.json_stream,
        })
    }
}

/// Runs `zerotx recv`.
pub fn run(args: RecvArgs) -> anyhow::Result<()> {
    let endpoint = listen_endpoint(&args.listen)?;
    if let Some(l) = args.logfile.as_deref() {
        crate::stdout::log_to(l)?;
    }
    let window = args
        .window
        .as_deref()
        .map(|w| crate::units::send_size("--window", w, i32::MAX as usize / 2, "1G"))
        .transpose()?;
    if args.verbose && !args.json {
        super::verbose_header();
    }
    // Opens --output now, before any sender connects.
    let opts = Opts::check(&args)?;
    match (opts.proto, endpoint) {
        (Proto::Tcp, Endpoint::Ip(addr)) => {
            let (sock, addr) = listen_ip(addr, Proto::Tcp, window)?;
            tcp::serve(&opts, sock, &Endpoint::Ip(addr).to_string())
        }
        (Proto::Udp, Endpoint::Ip(addr)) => {
            let (sock, addr) = listen_ip(addr, Proto::Udp, window)?;
            udp::serve(&opts, sock.into(), &addr.to_string())
        }
        (Proto::Tcp, Endpoint::Vsock { cid, port }) => tcp::serve(
            &opts,
            listen_vsock(cid, port, &endpoint)?,
            &endpoint.to_string(),
        ),
        (Proto::Udp, Endpoint::Vsock { .. }) => {
            bail!("vsock carries streams only here: drop --udp to listen on {endpoint}")
        }
    }
}

/// A bound (and for TCP, listening) socket on `addr`, and the address it got. The IPv6 wildcard
/// takes IPv4 too (`IPV6_V6ONLY` off), and falls back to `0.0.0.0` where IPv6 is missing.
/// `window` (`-w`) sets `SO_RCVBUF`, which accepted connections inherit.
fn listen_ip(
    addr: SocketAddr,
    proto: Proto,
    window: Option<usize>,
) -> anyhow::Result<(Socket, SocketAddr)> {
    let bind = |a: SocketAddr| -> io::Result<Socket> {
        let ty = match proto {
            Proto::Tcp => Type::STREAM,
            Proto::Udp => Type::DGRAM,
        };
        let s = Socket::new(Domain::for_address(a), ty, None)?;
        if a.is_ipv6() {
            s.set_only_v6(false)?;
        }
        if proto == Proto::Tcp {
            // As iperf3: a restart does not wait for the last run's TIME_WAIT. Linux still
            // refuses a second listener on the port. Not for UDP, where it would share the port.
            s.set_reuse_address(true)?;
        }
        s.bind(&a.into())?;
        if let Some(w) = window {
            s.set_recv_buffer_size(w)?;
        }
        if proto == Proto::Tcp {
            s.listen(1024)?;
        } else if window.is_none() {
            // Best effort: a bigger queue loses fewer datagrams at high rates, and a sender's
            // train lands as up to 128 datagrams at once. Past net.core.rmem_max where allowed
            // (SO_RCVBUFFORCE, CAP_NET_ADMIN), else capped by it.
            if rustix::net::sockopt::set_socket_recv_buffer_size_force(&s, 8 << 20).is_err() {
                let _ = s.set_recv_buffer_size(8 << 20);
            }
        }
        Ok(s)
    };
    let wildcard6 = addr.ip() == IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED);
    let (sock, addr) = match bind(addr) {
        Err(e) if wildcard6 && no_ipv6(&e) => {
            let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port());
            (
                bind(v4).map_err(|e| listen_error(&v4.to_string(), proto, e))?,
                v4,
            )
        }
        r => (
            r.map_err(|e| listen_error(&addr.to_string(), proto, e))?,
            addr,
        ),
    };
    let local = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .unwrap_or(addr);
    Ok((sock, local))
}

fn no_ipv6(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL) | Some(libc::EPROTONOSUPPORT)
    )
}

fn listen_error(what: &str, proto: Proto, e: io::Error) -> anyhow::Error {
    let hint = match e.kind() {
        io::ErrorKind::AddrInUse => match proto {
            Proto::Tcp => "address already in use (another zerotx recv or iperf3 -s?)".to_string(),
            Proto::Udp => "address already in use (another zerotx recv --udp?)".to_string(),
        },
        io::ErrorKind::PermissionDenied => format!("{e} (ports below 1024 need root)"),
        io::ErrorKind::AddrNotAvailable => {
            format!("{e} (no interface has this address: give a PORT alone to take every one)")
        }
        _ => e.to_string(),
    };
    anyhow::anyhow!("cannot listen on {what} ({}): {hint}", proto.name())
}

/// A listening vsock stream socket (`VMADDR_CID_ANY` is `u32::MAX`).
fn listen_vsock(cid: u32, port: u32, endpoint: &Endpoint) -> anyhow::Result<Socket> {
    let listen = || -> io::Result<Socket> {
        let s = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
        s.bind(&SockAddr::vsock(cid, port))?;
        s.listen(128)?;
        Ok(s)
    };
    listen().map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::AddrInUse {
            "address already in use (another zerotx recv?)".to_string()
        } else {
            format!("{e} (is the vsock transport loaded? modprobe vsock_loopback or vhost_vsock)")
        };
        anyhow::anyhow!("cannot listen on {endpoint}: {hint}")
    })
}

/// A host and port as iperf3 prints and reports them: IPv4-mapped IPv6 shown as IPv4, vsock as
/// its CID.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPort {
    host: String,
    port: u32,
}

impl HostPort {
    fn of(a: &SockAddr) -> Self {
        if let Some(s) = a.as_socket() {
            Self::ip(s)
        } else if let Some((cid, port)) = a.as_vsock_address() {
            Self {
                host: format!("vsock:{cid}"),
                port,
            }
        } else {
            Self {
                host: "?".into(),
                port: 0,
            }
        }
    }

    fn ip(s: SocketAddr) -> Self {
        Self {
            host: s.ip().to_canonical().to_string(),
            port: s.port().into(),
        }
    }
}

/// iperf3's "Server listening" box (text mode only).
fn banner(opts: &Opts, shown: &str) {
    if !opts.json {
        let rule = "-".repeat(59);
        outln!(
            "{rule}\nzerotx recv listening on {shown} ({}{})\n{rule}",
            opts.proto.name(),
            if opts.verify { ", verifying" } else { "" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_print_as_ipv4() {
        let a: SocketAddr = "[::ffff:127.0.0.1]:4000".parse().unwrap();
        assert_eq!(
            HostPort::ip(a),
            HostPort {
                host: "127.0.0.1".into(),
                port: 4000
            }
        );
        let v: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(HostPort::ip(v).host, "::1");
    }

    #[test]
    fn a_port_in_use_names_the_address_and_the_likely_holder() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let e = listen_ip(addr, Proto::Tcp, None).unwrap_err().to_string();
        assert!(e.contains(&addr.to_string()), "{e}");
        assert!(e.contains("already in use"), "{e}");
    }

    /// `--help` states the bounds the code keeps.
    #[test]
    fn help_states_the_bounds() {
        use clap::CommandFactory;
        let mut cmd = crate::options::Cli::command();
        let help = cmd
            .find_subcommand_mut("recv")
            .expect("recv")
            .render_long_help()
            .to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for needle in [
            format!("at most {} connections", tcp::MAX_STREAMS),
            format!("at most {} source addresses", MAX_SOURCES),
            format!("at most {} interval samples", meter::MAX_KEPT_SAMPLES),
        ] {
            assert!(help.contains(&needle), "--help lacks {needle:?}: {help}");
        }
    }

    #[test]
    fn bad_intervals_are_refused() {
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let mut argv = vec!["zerotx", "recv"];
            argv.extend_from_slice(extra);
            match crate::options::Cli::try_parse_from(argv).unwrap().command {
                crate::options::Command::Recv(a) => Opts::check(&a),
                _ => unreachable!(),
            }
        };
        assert!(parse(&[]).is_ok());
        assert_eq!(parse(&["-i", "0"]).unwrap().interval, None);
        assert!(parse(&["--idle", "0"]).is_err());
        assert!(parse(&["--interval=-1"]).is_err());
        assert!(parse(&["-i", "nan"]).is_err());
    }
}
