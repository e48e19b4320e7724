//! `zerotx send`'s flags checked into a [`Plan`], and the connections it opens. Every bad value
//! and every failed connect gets a message that names it and says what to do.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use socket2::{Domain, SockAddr, Socket, Type};
use zerotx::EngineKind;

use crate::bench::settings::{MAX_TRAIN, MAX_TRAIN_BYTES};
use crate::options::{FileVia, SendArgs};
use crate::transfer::{resolve, Endpoint, Proto};
use crate::units::{self, MAX_SEND};

/// Largest UDP payload over IPv4 (65535 - 20 - 8); IPv6 allows 20 more, but one rule is simpler.
const UDP_MAX: usize = 65_507;

/// The time a transfer of generated data runs when neither `--bytes` nor `--time` is given.
const DEFAULT_TIME: Duration = Duration::from_secs(10);

/// What to send.
#[derive(Debug)]
pub enum Source {
    /// The generated stream (`transfer::pattern`), `bytes` in all (split across the streams) or
    /// for `time`.
    Generated {
        /// Total bytes, when `--bytes`.
        bytes: Option<u64>,
    },
    /// A file, once or (with `--time`) again and again.
    File {
        /// As given.
        path: PathBuf,
        /// Open for reading.
        file: File,
        /// Its length when opened.
        len: u64,
        /// `sendfile(2)` or the mapped pages through the engine.
        via: Via,
    },
}

/// How a file goes out, once decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `sendfile(2)`.
    Sendfile,
    /// `mmap` and the engine.
    Mmap,
}

impl Via {
    /// As the output names it.
    pub fn name(self) -> &'static str {
        match self {
            Via::Sendfile => "sendfile",
            Via::Mmap => "mmap",
        }
    }
}

/// Checked `zerotx send` options.
#[derive(Debug)]
pub struct Plan {
    /// As the user wrote it (for messages).
    pub addr: String,
    /// What it resolved to, tried in order.
    pub endpoints: Vec<Endpoint>,
    /// TCP (also vsock streams) or UDP.
    pub proto: Proto,
    /// The engine.
    pub engine: EngineKind,
    /// Bytes per send (per datagram for UDP).
    pub size: usize,
    /// UDP: datagrams per train (one `send_train` of `train` datagrams of `size`); 1: one
    /// datagram per call, and always 1 on a stream.
    pub train: usize,
    /// Streams.
    pub parallel: usize,
    /// What to send.
    pub source: Source,
    /// Stop after this long (generated data by default; a file only with `--time`).
    pub time: Option<Duration>,
    /// Bytes per second across all streams.
    pub rate: Option<f64>,
    /// Between interval lines.
    pub interval: Option<Duration>,
    /// One JSON document instead of text.
    pub json: bool,
    /// JSON, one line per event (`--json-stream`).
    pub json_stream: bool,
    /// `-V`: the host and settings first.
    pub verbose: bool,
    /// `-B`: the local address to send from.
    pub bind: Option<SocketAddr>,
    /// `-w`: `SO_SNDBUF`, bytes.
    pub window: Option<usize>,
    /// Per connect attempt.
    pub connect_timeout: Duration,
    /// How long the end may take, and how long without progress counts as a stalled receiver.
    pub linger: Duration,
}

impl Plan {
    /// Checks every flag, resolves the address and opens the file (not the connections).
    pub fn check(a: SendArgs) -> anyhow::Result<Self> {
        let engine: EngineKind = a.engine.trim().parse().map_err(anyhow::Error::msg)?;
        let mut endpoints = resolve(&a.addr)?;
        if a.ipv4 || a.ipv6 {
            let (v4, name) = if a.ipv4 {
                (true, "IPv4")
            } else {
                (false, "IPv6")
            };
            endpoints.retain(|e| matches!(e, Endpoint::Ip(ip) if ip.is_ipv4() == v4));
            if endpoints.is_empty() {
                bail!(
                    "{} has no {name} address: drop -{} or give an address of that family",
                    a.addr.trim(),
                    if v4 { 4 } else { 6 }
                );
            }
        }
        if let Some(b) = a.logfile.as_deref() {
            crate::stdout::log_to(b)?;
        }
        let bind = a.bind.as_deref().map(parse_bind).transpose()?;
        if let Some(b) = bind {
            endpoints.retain(|e| matches!(e, Endpoint::Ip(ip) if ip.is_ipv4() == b.is_ipv4()));
            if endpoints.is_empty() {
                bail!(
                    "-B {b}: {} has no address of that family, or is vsock: give a local address \
                     of the receiver's family",
                    a.addr.trim()
                );
            }
        }
        let window = a
            .window
            .as_deref()
            .map(|w| units::send_size("--window", w, i32::MAX as usize / 2, "1G"))
            .transpose()?;
        let vsock = matches!(endpoints[0], Endpoint::Vsock { .. });
        if vsock && a.udp {
            bail!("--udp with a vsock address: zerotx sends vsock as a stream; drop --udp");
        }
        let proto = if a.udp { Proto::Udp } else { Proto::Tcp };
        let size = match &a.size {
            Some(s) => units::send_size("--size", s, MAX_SEND, "64M")?,
            None if a.udp => 1472,
            // Measured on loopback (median of 6 interleaved runs each): 1 MiB sends moved ~20
            // Gbit/s, 256 KiB ~17.5, 4 MiB ~16.6.
            None => 1 << 20,
        };
        if a.udp && size > UDP_MAX {
            bail!(
                "invalid --size {size} with --udp: a UDP datagram carries at most {UDP_MAX} bytes"
            );
        }
        if a.train == 0 || a.train > MAX_TRAIN {
            bail!(
                "invalid --train {}: give 1 to {MAX_TRAIN} datagrams per train (the kernel's \
                 segment limit per call), or 1 for one datagram per call",
                a.train
            );
        }
        // As many datagrams as one GSO packet carries; a stream has none.
        let train = match proto {
            Proto::Udp => a.train.min(MAX_TRAIN_BYTES / size).max(1),
            Proto::Tcp => 1,
        };
        if a.parallel == 0 || a.parallel > 128 {
            bail!("invalid --parallel {}: give 1 to 128 streams", a.parallel);
        }
        let time = a.time.map(|t| units::seconds("--time", t)).transpose()?;
        let source = match &a.file {
            Some(path) => {
                if a.bytes.is_some() {
                    bail!("--bytes with --file: the file's length says how much to send; drop --bytes");
                }
                if a.parallel > 1 {
                    bail!(
                        "--parallel {} with --file: a file goes as one stream (plain bytes: a \
                         receiver could not put parallel pieces back together); drop --parallel",
                        a.parallel
                    );
                }
                let file = File::open(path)
                    .with_context(|| format!("cannot open --file {}", path.display()))?;
                let meta = file
                    .metadata()
                    .with_context(|| format!("cannot stat --file {}", path.display()))?;
                if !meta.is_file() {
                    bail!("--file {} is not a regular file", path.display());
                }
                let via = match a.file_via {
                    FileVia::Sendfile if proto == Proto::Udp => bail!(
                        "--file-via sendfile with --udp: sendfile cannot cut datagrams; use \
                         --file-via mmap (the default for UDP)"
                    ),
                    FileVia::Sendfile => Via::Sendfile,
                    // Measured on TCP loopback (scripts/vs-iperf3.py, 7 interleaved rounds of
                    // 5 s, a 256 MiB file): the mapped file through `auto` moved 23.7 Gbit/s at
                    // 0.30 sender CPU s/GB, sendfile 22.0 at 0.35 (its receiver also paid more,
                    // copying out of page-cache fragments). Through a device both send the
                    // file's pages without a copy.
                    FileVia::Mmap | FileVia::Auto => Via::Mmap,
                };
                Source::File {
                    path: path.clone(),
                    file,
                    len: meta.len(),
                    via,
                }
            }
            None => Source::Generated {
                bytes: a
                    .bytes
                    .as_deref()
                    .map(|b| units::bytes("--bytes", b))
                    .transpose()?,
            },
        };
        let time = match (&source, time) {
            (_, Some(t)) => Some(t),
            (Source::Generated { bytes: None }, None) => Some(DEFAULT_TIME),
            _ => None,
        };
        let rate = a
            .bitrate
            .as_deref()
            .map(|b| units::bitrate("--bitrate", b))
            .transpose()?
            .map(|bits| bits as f64 / 8.0);
        if proto == Proto::Udp && rate.is_none() {
            // Unpaced on purpose (the tool measures the sending path, and the black hole and
            // loopback lose nothing by it), but said, since iperf3's -u paces to 1 Mbit/s.
            eprintln!(
                "warning: UDP without -b is not paced: it sends as fast as this host can, with \
                 no congestion control (iperf3 -u sends 1 Mbit/s); give -b RATE on a shared \
                 network"
            );
        }
        let interval = units::seconds_or_none("--interval", a.interval)?;
        Ok(Self {
            addr: a.addr,
            endpoints,
            proto,
            engine,
            size,
            train,
            parallel: a.parallel,
            source,
            time,
            rate,
            interval,
            json: a.json || a.json_stream,
            json_stream: a.json_stream,
            verbose: a.verbose,
            bind,
            window,
            connect_timeout: units::seconds("--connect-timeout", a.connect_timeout)?,
            linger: units::seconds("--linger", a.linger)?,
        })
    }

    /// Opens one connection (TCP, vsock) or connected UDP socket per stream.
    pub fn connect(&self) -> anyhow::Result<Vec<Conn>> {
        (0..self.parallel).map(|_| self.connect_one()).collect()
    }

    fn connect_one(&self) -> anyhow::Result<Conn> {
        let mut last = None;
        for ep in &self.endpoints {
            match self.try_connect(*ep) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some((ep, e)),
            }
        }
        let (ep, e) = last.expect("resolve gives at least one address");
        let vsock = matches!(ep, Endpoint::Vsock { .. });
        let unreachable = matches!(
            e.raw_os_error(),
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
        );
        let hint = match e.kind() {
            _ if unreachable => "no route to it from here: check the address and `ip route`",
            // vsock answers a connect to a port nobody listens on with a reset.
            io::ErrorKind::ConnectionReset if vsock => {
                "nothing listens there (vsock answers with a reset): start `zerotx recv` (or \
                 another receiver) first"
            }
            io::ErrorKind::ConnectionRefused => match self.proto {
                Proto::Tcp => {
                    "nothing listens there: start `zerotx recv` (or another receiver) first"
                }
                Proto::Udp => "nothing listens on that UDP port: start `zerotx recv --udp` first",
            },
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                "no answer: the host is down, unreachable, or a firewall drops the connection"
            }
            io::ErrorKind::AddrNotAvailable => "no local address can reach it",
            _ => "check the address, and that the receiver is running",
        };
        let named = if ep.to_string() == self.addr.trim() {
            ep.to_string()
        } else {
            format!("{ep} ({})", self.addr.trim())
        };
        Err(anyhow::anyhow!("cannot connect to {named}: {e}: {hint}"))
    }

    /// `-w` and (TCP) `-B` on a socket before it connects.
    fn prepare(&self, s: &Socket) -> io::Result<()> {
        if let Some(w) = self.window {
            s.set_send_buffer_size(w)?;
        }
        if let (Some(b), Type::STREAM) = (self.bind, s.r#type()?) {
            s.bind(&b.into())?;
        }
        Ok(())
    }

    fn try_connect(&self, ep: Endpoint) -> io::Result<Conn> {
        match (ep, self.proto) {
            (Endpoint::Ip(a), Proto::Tcp) => {
                let s = Socket::new(Domain::for_address(a), Type::STREAM, None)?;
                self.prepare(&s)?;
                s.connect_timeout(&a.into(), self.connect_timeout)?;
                let s = TcpStream::from(s);
                // Until the stream ends in order, its close resets the connection: a sender
                // that fails or is killed tells the receiver the stream was cut short, where
                // a plain close would look like its end. `End::end_socket` sets it back.
                socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
                Ok(Conn {
                    local: s.local_addr()?.to_string(),
                    remote: a.to_string(),
                    fd: s.into(),
                    stream: true,
                })
            }
            (Endpoint::Ip(a), Proto::Udp) => {
                let any: SocketAddr = if a.is_ipv4() {
                    "0.0.0.0:0".parse().expect("literal")
                } else {
                    "[::]:0".parse().expect("literal")
                };
                let s = UdpSocket::bind(self.bind.unwrap_or(any))?;
                self.prepare(&socket2::SockRef::from(&s))?;
                s.connect(a)?;
                Ok(Conn {
                    local: s.local_addr()?.to_string(),
                    remote: a.to_string(),
                    fd: s.into(),
                    stream: false,
                })
            }
            (Endpoint::Vsock { cid, port }, _) => {
                let s = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
                s.connect_timeout(&SockAddr::vsock(cid, port), self.connect_timeout)?;
                let local = s
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_vsock_address())
                    .map(|(c, p)| format!("vsock:{c}:{p}"))
                    .unwrap_or_else(|| "vsock".into());
                Ok(Conn {
                    local,
                    remote: ep.to_string(),
                    fd: s.into(),
                    stream: true,
                })
            }
        }
    }
}

/// `-B`: `IP` or `IP:PORT` (port 0, any, when none).
fn parse_bind(s: &str) -> anyhow::Result<SocketAddr> {
    let t = s.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    match t
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<std::net::IpAddr>()
    {
        Ok(ip) => Ok(SocketAddr::new(ip, 0)),
        Err(_) => bail!(
            "invalid -B {t:?}: give a local IP address to send from (192.0.2.1, ::1, or with a \
             port, 192.0.2.1:6000)"
        ),
    }
}

/// One open stream.
#[derive(Debug)]
pub struct Conn {
    /// Local address, printed.
    pub local: String,
    /// Peer address, printed.
    pub remote: String,
    /// The socket.
    pub fd: OwnedFd,
    /// A byte stream (TCP, vsock), whose end the receiver can confirm.
    pub stream: bool,
}
