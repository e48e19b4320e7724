//! The kinds a sender is built from: which engine sends ([`EngineKind`]) and what the socket is
//! ([`SockKind`]). Plain data at the bottom of the library: errors, the configuration, the engines
//! and the report all name them, and they name nothing above them.

use std::fmt;
use std::str::FromStr;

/// Which engine a sender uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum EngineKind {
    /// The default: zero-copy where and when it pays, decided per socket and per send from what
    /// the kernel reports (size thresholds, completions that say the kernel copied, the zero-copy
    /// budget). [`Sender::explain`](crate::Sender::explain) says what it chose and why.
    #[default]
    Auto,
    /// Plain `sendmsg(2)`: the kernel copies.
    Copy,
    /// `sendmsg(MSG_ZEROCOPY)` and the socket error queue.
    MsgZerocopy,
    /// io_uring `SENDMSG`: the kernel copies, many sends per `io_uring_enter`.
    Uring,
    /// io_uring `SENDMSG_ZC` / `SEND_ZC` with notification CQEs; registered buffers when a pool is
    /// registered.
    UringZc,
}

impl EngineKind {
    /// Every engine, in the order tables show them.
    pub const ALL: &'static [EngineKind] = &[
        EngineKind::Auto,
        EngineKind::Copy,
        EngineKind::MsgZerocopy,
        EngineKind::Uring,
        EngineKind::UringZc,
    ];

    /// The name the CLI and scripts use.
    pub fn name(&self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::Copy => "copy",
            EngineKind::MsgZerocopy => "msg-zc",
            EngineKind::Uring => "uring",
            EngineKind::UringZc => "uring-zc",
        }
    }

    /// Whether the engine asks the kernel not to copy (`auto`: when it pays).
    pub fn is_zerocopy(&self) -> bool {
        matches!(
            self,
            EngineKind::Auto | EngineKind::MsgZerocopy | EngineKind::UringZc
        )
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        EngineKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = EngineKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown engine {s:?}; expected one of: {}",
                    names.join(", ")
                )
            })
    }
}

/// Address family of a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// `AF_INET`.
    Inet4,
    /// `AF_INET6`.
    Inet6,
    /// `AF_UNIX`.
    Unix,
    /// `AF_VSOCK`.
    Vsock,
    /// `AF_PACKET`.
    Packet,
    /// Anything else, by number.
    Other(i32),
}

/// Socket type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SockType {
    /// `SOCK_STREAM`: bytes in order; a send may be short.
    Stream,
    /// `SOCK_DGRAM`.
    Dgram,
    /// `SOCK_SEQPACKET`.
    Seqpacket,
    /// `SOCK_RAW`.
    Raw,
    /// Anything else, by number.
    Other(i32),
}

/// What a socket is, as the kernel reports it (`SO_DOMAIN`, `SO_TYPE`, `SO_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SockKind {
    /// Address family.
    pub family: Family,
    /// Type.
    pub ty: SockType,
    /// Protocol number.
    pub protocol: i32,
}

impl SockKind {
    pub(crate) fn from_raw(domain: i32, ty: i32, protocol: i32) -> Self {
        let family = match domain {
            libc::AF_INET => Family::Inet4,
            libc::AF_INET6 => Family::Inet6,
            libc::AF_UNIX => Family::Unix,
            libc::AF_VSOCK => Family::Vsock,
            libc::AF_PACKET => Family::Packet,
            other => Family::Other(other),
        };
        let ty = match ty {
            libc::SOCK_STREAM => SockType::Stream,
            libc::SOCK_DGRAM => SockType::Dgram,
            libc::SOCK_SEQPACKET => SockType::Seqpacket,
            libc::SOCK_RAW => SockType::Raw,
            other => SockType::Other(other),
        };
        Self {
            family,
            ty,
            protocol,
        }
    }

    /// A byte stream: sends may be short and must stay in order.
    pub fn is_stream(&self) -> bool {
        self.ty == SockType::Stream
    }

    /// One of the kinds zerotx knows how to send on (even if only by copy).
    pub fn is_known(&self) -> bool {
        !matches!(self.family, Family::Other(_)) && !matches!(self.ty, SockType::Other(_))
    }

    /// Connection-oriented (`SOCK_STREAM`, `SOCK_SEQPACKET`): what is sent must arrive in order.
    pub(crate) fn is_ordered(&self) -> bool {
        matches!(self.ty, SockType::Stream | SockType::Seqpacket)
    }

    /// A byte stream, where several buffers may go in one send: `SOCK_STREAM` except SCTP, whose
    /// stream sockets keep message boundaries (one send is one message).
    pub(crate) fn is_byte_stream(&self) -> bool {
        self.ty == SockType::Stream && self.protocol != libc::IPPROTO_SCTP
    }
}

impl fmt::Display for SockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.family {
            Family::Inet4 => "4",
            Family::Inet6 => "6",
            _ => "",
        };
        match (self.family, self.ty) {
            (Family::Inet4 | Family::Inet6, SockType::Stream) => write!(f, "tcp{v}"),
            (Family::Inet4 | Family::Inet6, SockType::Dgram) => write!(f, "udp{v}"),
            (Family::Inet4 | Family::Inet6, SockType::Raw) => write!(f, "raw{v}"),
            (fam, ty) => {
                let fam = match fam {
                    Family::Unix => "unix".to_string(),
                    Family::Vsock => "vsock".to_string(),
                    Family::Packet => "packet".to_string(),
                    Family::Inet4 => "inet4".to_string(),
                    Family::Inet6 => "inet6".to_string(),
                    Family::Other(n) => format!("family-{n}"),
                };
                let ty = match ty {
                    SockType::Stream => "stream".to_string(),
                    SockType::Dgram => "dgram".to_string(),
                    SockType::Seqpacket => "seqpacket".to_string(),
                    SockType::Raw => "raw".to_string(),
                    SockType::Other(n) => format!("type-{n}"),
                };
                write!(f, "{fam}-{ty}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SockKind;

    /// SCTP cannot be loaded on the test machine (no `sctp` module): check the classification the
    /// engine orders and batches by. Every connection keeps one request in flight; only byte
    /// streams put several buffers into one request (on SCTP that would merge messages).
    #[test]
    fn only_byte_streams_merge_and_every_connection_has_one_request() {
        let kind = SockKind::from_raw;
        let tcp = kind(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_TCP);
        let unix = kind(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        let sctp = kind(libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_SCTP);
        let sctp_many = kind(libc::AF_INET, libc::SOCK_SEQPACKET, libc::IPPROTO_SCTP);
        let seqpacket = kind(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        let udp = kind(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP);
        for k in [tcp, unix, sctp, sctp_many, seqpacket] {
            assert!(k.is_ordered(), "{k:?}");
        }
        assert!(!udp.is_ordered());
        assert!(tcp.is_byte_stream() && unix.is_byte_stream());
        for k in [sctp, sctp_many, seqpacket, udp] {
            assert!(!k.is_byte_stream(), "{k:?}");
        }
    }
}
