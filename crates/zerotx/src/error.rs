//! Errors a caller can act on.
//!
//! A send the kernel refused keeps the kernel's own `io::Error` (in [`SendError::Io`],
//! [`Report::error`](crate::Report::error), [`Error::Failed`]), so `raw_os_error()` answers its
//! errno and a caller matches `EMSGSIZE`, `EINVAL`, `EPERM`... on it. What to do where the errno
//! alone says little is [`advice`]: their `Display` adds it, and `advice()` returns it.

use std::fmt;
use std::io;
use std::os::fd::RawFd;

use crate::kind::{EngineKind, SockKind};

/// A feature the kernel, this socket kind or this engine may lack ([`Error::Unsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Sending on this kind of socket at all.
    Socket(SockKind),
    /// `MSG_ZEROCOPY` (`SO_ZEROCOPY`) on this kind of socket.
    MsgZerocopy(SockKind),
    /// io_uring itself (`io_uring_setup`).
    IoUring,
    /// io_uring's zero-copy sends (`IORING_OP_SEND_ZC`/`SENDMSG_ZC`), on this kind of socket.
    UringZerocopy(SockKind),
    /// Sending from registered memory (`IORING_REGISTER_BUFFERS`): with this engine.
    RegisteredBuffers(EngineKind),
    /// Submitting through a shared ring ([`UringShared`](crate::UringShared)): with this engine.
    SharedRing(EngineKind),
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Feature::Socket(k) => write!(f, "sending on a {k} socket"),
            Feature::MsgZerocopy(k) => write!(f, "MSG_ZEROCOPY on {k} sockets"),
            Feature::IoUring => f.write_str("io_uring"),
            Feature::UringZerocopy(k) => write!(f, "io_uring zero-copy sends on {k} sockets"),
            Feature::RegisteredBuffers(e) => write!(f, "registered buffers with the {e} engine"),
            Feature::SharedRing(e) => write!(f, "a shared io_uring with the {e} engine"),
        }
    }
}

/// What to do about a send the kernel refused with `errno`, where the errno alone says little:
/// one table for the crate, read by the `Display` of [`SendError`], [`Report`](crate::Report) and
/// [`Error::Failed`], and by their `advice()`. The kernel's rules behind it: docs/kernel.md, "UDP
/// GSO trains: what each refusal means and what zerotx does".
pub(crate) fn advice(errno: i32) -> Option<&'static str> {
    match errno {
        libc::EMSGSIZE => Some(TOO_LARGE),
        libc::EINVAL => Some(INVALID_TRAIN),
        _ => None,
    }
}

/// [`advice`] for `EMSGSIZE`.
pub(crate) const TOO_LARGE: &str = "the message is larger than the path or the socket takes: a \
    train's every segment plus the IP and UDP headers must fit the path MTU (a segment of at most \
    the MTU less 28 bytes on IPv4, 48 on IPv6; the kernel never fragments one), and a datagram or \
    a whole train one IP packet (65507 bytes to an IPv4 destination, an IPv4-mapped one on an \
    IPv6 socket too); send smaller datagrams or segments, or a shorter train";

/// [`advice`] for `EINVAL`.
pub(crate) const INVALID_TRAIN: &str = "if this was a train, the kernel refused its segments: \
    more than UDP_MAX_SEGMENTS in one call, a segment above the path MTU (older kernels answer \
    that with EINVAL), or a socket with SO_NO_CHECK set (GSO needs the UDP checksum); send fewer \
    or smaller segments";

/// Shows `": {advice}"` for an error's errno ([`advice`]), or nothing.
pub(crate) struct Advice<'a>(pub(crate) &'a io::Error);

impl fmt::Display for Advice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.raw_os_error().and_then(advice) {
            Some(said) => write!(f, ": {said}"),
            None => Ok(()),
        }
    }
}

/// Why a sender could not be made or a blocking operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The descriptor is not open.
    #[error(
        "fd {fd} is not an open file descriptor (EBADF): pass a socket you own and have not closed"
    )]
    BadFd {
        /// The descriptor.
        fd: RawFd,
    },
    /// The descriptor is open but is not a socket.
    #[error("fd {fd} is not a socket (ENOTSOCK): zerotx sends on sockets only")]
    NotASocket {
        /// The descriptor.
        fd: RawFd,
    },
    /// A listening socket cannot send.
    #[error("the {kind} socket is listening: accept a connection and send on that socket")]
    Listening {
        /// What the socket is.
        kind: SockKind,
    },
    /// A stream socket that is not connected.
    #[error("the {kind} socket is not connected: connect it before making a sender")]
    NotConnected {
        /// What the socket is.
        kind: SockKind,
    },
    /// The kernel, this socket kind or this engine lacks a feature.
    #[error("{feature} is not available: {reason}")]
    Unsupported {
        /// What was asked for.
        feature: Feature,
        /// Why not, and what to do instead.
        reason: String,
    },
    /// The configuration asks for something that cannot work; `fix` says what to change.
    #[error("{problem}: {fix}")]
    Config {
        /// What is wrong.
        problem: String,
        /// What to do instead.
        fix: String,
    },
    /// A deadline passed with buffers still held by the kernel.
    #[error("timed out with {outstanding} buffer(s) still held by the kernel (their completions have not arrived; is the peer reading?)")]
    TimedOut {
        /// Buffers still held.
        outstanding: usize,
    },
    /// A shared io_uring ([`UringShared`](crate::UringShared)) has room for `senders` senders at
    /// once, and each is taken.
    #[error(
        "the shared io_uring keeps completion-queue room for {senders} senders and every one is \
         taken: close a sender first, make another UringShared, or make the ring with \
         UringConfig::with_senders"
    )]
    RingFull {
        /// Senders the ring takes at once.
        senders: usize,
    },
    /// Buffers released since the last flush carried an error ([`Report::error`]): the peer did
    /// not get all of their bytes. On a stream or seqpacket socket that also means the stream is
    /// broken: every later send fails. See [`Sender`](crate::Sender)'s failure rule.
    ///
    /// [`Report::error`]: crate::Report::error
    #[error("{failed} buffer(s) released since the last flush carried an error (the first: {source}{}): their bytes did not all reach the peer (each one's Report says how many went); a stream or seqpacket socket sends nothing more after that: close the sender", Advice(.source))]
    Failed {
        /// How many released buffers carried an error since the last flush.
        failed: usize,
        /// The first of their errors.
        #[source]
        source: io::Error,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// What to do about [`Error::Failed`]'s first error, where its errno says little
    /// ([`SendError::advice`]'s table).
    pub fn advice(&self) -> Option<&'static str> {
        match self {
            Error::Failed { source, .. } => source.raw_os_error().and_then(advice),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::BadFd { .. } | Error::NotASocket { .. } => io::ErrorKind::InvalidInput,
            Error::Listening { .. } | Error::NotConnected { .. } => io::ErrorKind::NotConnected,
            Error::Unsupported { .. } => io::ErrorKind::Unsupported,
            Error::Config { .. } => io::ErrorKind::InvalidInput,
            Error::TimedOut { .. } => io::ErrorKind::TimedOut,
            Error::RingFull { .. } => io::ErrorKind::Other,
            Error::Failed { source, .. } => source.kind(),
            Error::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// A send that did not start. Every variant hands the buffer back.
#[non_exhaustive]
pub enum SendError<B> {
    /// The socket (or the kernel's zero-copy budget) is full: wait for
    /// [`Sender::readiness`](crate::Sender::readiness), [`reap`](crate::Sender::reap), retry.
    WouldBlock(B),
    /// The call was wrong for this buffer or socket; `reason` says how.
    Invalid {
        /// The buffer, untouched.
        buf: B,
        /// What was wrong and what to do.
        reason: &'static str,
    },
    /// The kernel refused the send before taking any byte (`EPIPE`, `EMSGSIZE`, ...).
    Io {
        /// The buffer, untouched.
        buf: B,
        /// The kernel's answer, as it gave it: `raw_os_error()` is its errno. What to do where
        /// the errno says little: [`advice`](SendError::advice), also in this error's `Display`.
        error: io::Error,
    },
}

impl<B> SendError<B> {
    /// The buffer, back.
    pub fn into_inner(self) -> B {
        match self {
            SendError::WouldBlock(buf)
            | SendError::Invalid { buf, .. }
            | SendError::Io { buf, .. } => buf,
        }
    }

    /// Whether this is [`SendError::WouldBlock`].
    pub fn is_would_block(&self) -> bool {
        matches!(self, SendError::WouldBlock(_))
    }

    /// What to do about [`SendError::Io`], where its errno says little: for `EMSGSIZE` and
    /// `EINVAL`, the kernel's limits on a datagram and on a train's segments. `None` for the
    /// other variants ([`SendError::Invalid`]'s `reason` says it) and other errnos.
    pub fn advice(&self) -> Option<&'static str> {
        match self {
            SendError::Io { error, .. } => error.raw_os_error().and_then(advice),
            _ => None,
        }
    }
}

/// Names the variant and its reason or error; the buffer shows as `..` (`B` need not be `Debug`).
impl<B> fmt::Debug for SendError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::WouldBlock(_) => f.debug_struct("WouldBlock").finish_non_exhaustive(),
            SendError::Invalid { reason, .. } => f
                .debug_struct("Invalid")
                .field("reason", reason)
                .finish_non_exhaustive(),
            SendError::Io { error, .. } => f
                .debug_struct("Io")
                .field("error", error)
                .finish_non_exhaustive(),
        }
    }
}

impl<B> fmt::Display for SendError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::WouldBlock(_) => {
                f.write_str("send would block: wait for readiness, reap, retry")
            }
            SendError::Invalid { reason, .. } => write!(f, "invalid send: {reason}"),
            SendError::Io { error, .. } => write!(f, "send failed: {error}{}", Advice(error)),
        }
    }
}

impl<B> std::error::Error for SendError<B> {}

impl<B> From<SendError<B>> for io::Error {
    fn from(e: SendError<B>) -> Self {
        match e {
            SendError::WouldBlock(_) => io::ErrorKind::WouldBlock.into(),
            SendError::Invalid { reason, .. } => {
                io::Error::new(io::ErrorKind::InvalidInput, reason)
            }
            SendError::Io { error, .. } => error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer type with no `Debug`: the error's `Debug` must not need one.
    struct Opaque;

    #[test]
    fn send_error_debug_names_its_variant() {
        let would_block = format!("{:?}", SendError::WouldBlock(Opaque));
        assert_eq!(would_block, "WouldBlock { .. }");

        let invalid = SendError::Invalid {
            buf: Opaque,
            reason: "an empty buffer: send at least one byte",
        };
        assert_eq!(
            format!("{invalid:?}"),
            r#"Invalid { reason: "an empty buffer: send at least one byte", .. }"#
        );

        let io = SendError::Io {
            buf: Opaque,
            error: io::Error::from_raw_os_error(libc::EPIPE),
        };
        let shown = format!("{io:?}");
        assert!(shown.starts_with("Io { error: "), "{shown}");
        assert!(shown.contains("code: 32"), "{shown}");
        assert!(shown.ends_with(", .. }"), "{shown}");
    }

    #[test]
    fn a_refusal_keeps_its_errno_and_says_what_to_do() {
        let refused = |errno| SendError::Io {
            buf: Opaque,
            error: io::Error::from_raw_os_error(errno),
        };
        let e = refused(libc::EMSGSIZE);
        assert_eq!(e.advice(), Some(TOO_LARGE));
        let shown = e.to_string();
        assert!(shown.starts_with("send failed: "), "{shown}");
        assert!(
            shown.ends_with(&format!("(os error 90): {TOO_LARGE}")),
            "{shown}"
        );
        assert!(
            refused(libc::EINVAL)
                .to_string()
                .contains("UDP_MAX_SEGMENTS"),
            "{}",
            refused(libc::EINVAL)
        );
        // An errno that says enough gets nothing added.
        let e = refused(libc::EPERM);
        assert_eq!(e.advice(), None);
        assert!(e.to_string().ends_with("(os error 1)"), "{e}");
        assert_eq!(
            io::Error::from(refused(libc::EMSGSIZE)).raw_os_error(),
            Some(libc::EMSGSIZE)
        );

        let failed = Error::Failed {
            failed: 1,
            source: io::Error::from_raw_os_error(libc::EMSGSIZE),
        };
        assert_eq!(failed.advice(), Some(TOO_LARGE));
        assert!(failed.to_string().contains(TOO_LARGE), "{failed}");
    }
}
