//! The socket a sender owns: its kind, checked once at construction.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Feature};
pub(crate) use crate::kind::{Family, SockKind, SockType};
use crate::sys;

/// A socket checked for use by a sender.
#[derive(Debug)]
pub(crate) struct Socket {
    fd: OwnedFd,
    pub(crate) kind: SockKind,
    pub(crate) connected: bool,
    /// The `UDP_SEGMENT` option as the sendmsg engines' trains set it.
    pub(crate) segment: SegmentOption,
}

/// A UDP socket's `UDP_SEGMENT` option as this sender set it (docs/fast-path.md, "Trains by the
/// socket option"). A train goes as a plain `send(2)` once the option holds its segment size:
/// a `sendmsg(2)` with the `UDP_SEGMENT` control message costs the kernel three copies from user
/// memory per call (the header, the iovec, the control data), which a train of one size needs
/// only once. The option is set after [`STREAK`] trains of one size in a row, so a sender that
/// mixes trains with other sends does not pay two `setsockopt` calls per switch, which cost more
/// than the control message. Every other send on the socket finds the option back at 0 first
/// ([`plain`](Self::plain)): under it a datagram longer than the segment would be cut into
/// several, and one on a path that refuses GSO would fail with `EIO`. The caller gets the socket
/// back with the option at 0 ([`Sender::close`](crate::Sender::close)).
///
/// Inert (trains carry their control message) on a socket that is not UDP, and on one whose
/// option the caller had set: that value is the caller's, and stays. A descriptor the caller
/// kept (or another sender over a duplicate) sees the option while trains go: its own sends are
/// cut by it meanwhile, which zerotx cannot see.
#[derive(Debug)]
pub(crate) struct SegmentOption {
    /// The option's value as this sender set it (0..=65535), [`UNASKED`] before the first train,
    /// or [`INERT`].
    held: AtomicU32,
    /// The trains in a row that went with the control message: their segment size shifted left
    /// by 8, and their count in the low 8 bits; 0 once the option went back to 0.
    streak: AtomicU32,
}

/// Trains of one size in a row, with the control message, before the option is set for them.
pub(crate) const STREAK: u32 = 8;

/// The option was not read yet: no train went.
const UNASKED: u32 = 1 << 16;
/// The option is the caller's, or cannot be set: trains carry their control message.
const INERT: u32 = UNASKED + 1;

impl SegmentOption {
    fn for_kind(kind: SockKind) -> Self {
        let udp = matches!(kind.family, Family::Inet4 | Family::Inet6)
            && kind.ty == SockType::Dgram
            && kind.protocol == libc::IPPROTO_UDP;
        Self {
            held: AtomicU32::new(if udp { UNASKED } else { INERT }),
            streak: AtomicU32::new(0),
        }
    }

    /// Whether a train of `segment`-byte datagrams may go on `fd` as a plain send: the option
    /// holds `segment`, or is set to it now, at the [`STREAK`]th train of that size in a row
    /// (the first time after reading it: an option the caller set leaves this inert).
    #[inline]
    pub(crate) fn train(&self, fd: BorrowedFd<'_>, segment: u16) -> bool {
        let held = self.held.load(Ordering::Relaxed);
        if held == u32::from(segment) {
            return segment > 0;
        }
        if held == INERT {
            return false;
        }
        let streak = self.streak.load(Ordering::Relaxed);
        let count = if streak >> 8 == u32::from(segment) {
            (streak & 0xff) + 1
        } else {
            1
        };
        if count < STREAK {
            let streak = (u32::from(segment) << 8) | count;
            self.streak.store(streak, Ordering::Relaxed);
            return false;
        }
        self.set(fd, held, segment)
    }

    #[cold]
    #[inline(never)]
    fn set(&self, fd: BorrowedFd<'_>, held: u32, segment: u16) -> bool {
        let ours = held != UNASKED || sys::train::segment_option(fd).is_ok_and(|v| v == 0);
        let set = ours && segment > 0 && sys::train::set_segment_option(fd, segment).is_ok();
        let now = if set { u32::from(segment) } else { INERT };
        // A failed set leaves the option as it was: still 0 (then trains keep their control
        // message), or still `held`, which the next plain send clears.
        if set || held == UNASKED || held == 0 {
            self.held.store(now, Ordering::Relaxed);
        }
        set
    }

    /// Before any send that is not a train by [`train`](Self::train): the option back at 0. Fails
    /// only if the kernel refused that, and then nothing may be sent on the socket as a plain
    /// datagram.
    #[inline]
    pub(crate) fn plain(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let held = self.held.load(Ordering::Relaxed);
        if held == 0 || held >= UNASKED {
            // Any other send ends a streak of trains.
            if self.streak.load(Ordering::Relaxed) != 0 {
                self.streak.store(0, Ordering::Relaxed);
            }
            return Ok(());
        }
        self.clear(fd)
    }

    #[cold]
    #[inline(never)]
    fn clear(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        sys::train::set_segment_option(fd, 0)?;
        self.held.store(0, Ordering::Relaxed);
        self.streak.store(0, Ordering::Relaxed);
        Ok(())
    }
}

/// Checks that the `AF_PACKET` socket `fd` can send without a destination, which is how zerotx
/// sends on it (it has no destination for packet sockets), and answers `true`: it is connected in
/// effect. A packet socket has no peer (`getpeername` fails), but `packet_snd` sends a call
/// without a name on the interface the socket is bound to, with its protocol. So it must be bound
/// to one interface; and a `SOCK_DGRAM` one builds the link-layer header from the destination
/// address, which a call without a name does not give, except on an interface without
/// link-layer addresses.
fn packet_sends_unnamed(fd: BorrowedFd<'_>, kind: SockKind) -> Result<bool, Error> {
    let bound = sys::packet_binding(fd).map_err(|source| Error::Io {
        context: "getsockname(2) of the packet socket",
        source,
    })?;
    if bound.ifindex == 0 {
        return Err(Error::Config {
            problem: format!("a {kind} socket bound to no interface"),
            fix: "zerotx sends on a packet socket without a destination, which the kernel sends \
                  on the interface the socket is bound to: bind it to one interface first \
                  (bind(2) with a sockaddr_ll whose sll_ifindex names it)"
                .into(),
        });
    }
    if kind.ty == SockType::Dgram && bound.halen != 0 {
        return Err(Error::Unsupported {
            feature: Feature::Socket(kind),
            reason: "a SOCK_DGRAM packet socket needs a link-layer destination address for each \
                     send on this interface, and zerotx takes none for packet sockets: use a \
                     SOCK_RAW packet socket and put the link-layer header in each buffer"
                .into(),
        });
    }
    Ok(true)
}

impl Socket {
    /// Classifies `fd`; refuses closed fds, non-sockets, listening and unconnected stream sockets,
    /// and packet sockets that cannot send without a destination ([`packet_sends_unnamed`]).
    pub(crate) fn new(fd: OwnedFd) -> Result<Self, Error> {
        let raw = fd.as_raw_fd();
        let info = match sys::sock_info(fd.as_fd()) {
            Ok(info) => info,
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => {
                // Not open: there is nothing to close, and closing the number later could close
                // a descriptor someone else opened meanwhile.
                std::mem::forget(fd);
                return Err(Error::BadFd { fd: raw });
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => {
                return Err(Error::NotASocket { fd: raw })
            }
            Err(source) => {
                return Err(Error::Io {
                    context: "getsockopt(SO_DOMAIN/SO_TYPE) on the socket",
                    source,
                })
            }
        };
        let kind = SockKind::from_raw(info.domain, info.ty, info.protocol);
        if !kind.is_known() {
            return Err(Error::Unsupported {
                feature: Feature::Socket(kind),
                reason: "zerotx sends on TCP, UDP, RAW, AF_UNIX, AF_VSOCK and AF_PACKET sockets"
                    .into(),
            });
        }
        if kind.family == Family::Vsock && kind.ty == SockType::Seqpacket {
            return Err(Error::Unsupported {
                feature: Feature::Socket(kind),
                reason: "a non-blocking vsock SOCK_SEQPACKET send can answer EAGAIN after part of \
                         the message was queued, so a retry would send its start twice; use a \
                         vsock stream socket"
                    .into(),
            });
        }
        if info.listening {
            return Err(Error::Listening { kind });
        }
        if matches!(kind.ty, SockType::Stream | SockType::Seqpacket) && !info.connected {
            return Err(Error::NotConnected { kind });
        }
        let connected = match kind.family {
            Family::Packet => packet_sends_unnamed(fd.as_fd(), kind)?,
            _ => info.connected,
        };
        Ok(Self {
            fd,
            kind,
            connected,
            segment: SegmentOption::for_kind(kind),
        })
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Turns on `SO_ZEROCOPY` and returns the id the next zero-copy send takes, with "not
    /// supported here" answers mapped to [`Error::Unsupported`].
    ///
    /// The kernel numbers zero-copy sends per socket from 0 and never says where its counter
    /// stands. A socket that already has `SO_ZEROCOPY` may have sent with `MSG_ZEROCOPY` (through
    /// another sender or a clone of the descriptor): counting from 0 then would release buffers
    /// on other sends' completions. So such a socket is refused unless the caller names the next
    /// id (`first_id`; 0 for a socket accepted from a listener that had `SO_ZEROCOPY` set).
    pub(crate) fn enable_zerocopy(&self, first_id: Option<u32>) -> Result<u32, Error> {
        let already = sys::zerocopy_enabled(self.fd()).unwrap_or(false);
        if already && first_id.is_none() {
            return Err(Error::Config {
                problem: format!(
                    "a msg-zc sender on a {} socket that already has SO_ZEROCOPY",
                    self.kind
                ),
                fix: "earlier MSG_ZEROCOPY sends may have moved the kernel's id counter, and \
                         counting from 0 would release buffers early; give a fresh socket, or set \
                         SenderConfig::zerocopy_first_id to the id its next zero-copy send takes \
                         (0 for a socket accepted from a listener with SO_ZEROCOPY set)"
                    .into(),
            });
        }
        self.set_zerocopy()?;
        Ok(first_id.unwrap_or(0))
    }

    fn set_zerocopy(&self) -> Result<(), Error> {
        sys::enable_zerocopy(self.fd()).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOPROTOOPT | libc::EOPNOTSUPP | sys::ENOTSUPP) => Error::Unsupported {
                feature: Feature::MsgZerocopy(self.kind),
                reason: format!(
                    "setsockopt(SO_ZEROCOPY) answered {e}; use the copy engine (this kernel \
                     offers zero-copy on TCP, UDP and, with a vhost/virtio transport, vsock)"
                ),
            },
            _ => Error::Io {
                context: "setsockopt(SO_ZEROCOPY)",
                source: e,
            },
        })
    }
}
