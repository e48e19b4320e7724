//! Async senders over tokio's own sockets: on the runtime thread's shared ring unless told
//! otherwise, and a TCP connection split into a read half and an [`AsyncSender`].
//!
//! One io_uring per connection costs a ring (its descriptor, its memory, its pinned pages) and a
//! registration with the reactor each, and many `io_uring_enter` calls where one would do; so
//! the io_uring engines (`uring`, `uring-zc`, and `auto` where it chooses io_uring) go through
//! [`thread_ring`] by default. Where the shared ring cannot take the sender (`auto` on a kernel
//! or socket without io_uring zero-copy sends, a ring whose places are all taken), the sender is
//! made as [`AsyncSender::new`] makes it: `auto` then chooses on its own, and an io_uring engine
//! gets a ring of its own.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use ::tokio::io::{AsyncRead, ReadBuf};

use super::{thread_ring, AsyncSender};
use crate::buf::SendBuf;
use crate::config::SenderConfig;
use crate::engine::EngineKind;
use crate::error::Error;

impl<B: SendBuf> AsyncSender<B> {
    /// A sender over a connected tokio `TcpStream`, taken out of tokio's reactor (`into_std`).
    /// The io_uring engines submit through the runtime thread's shared ring ([`thread_ring`]),
    /// falling back as the [module docs](crate::tokio#with-no-configuration) say;
    /// [`from_tcp_with`](Self::from_tcp_with) takes a [`SenderConfig`] instead. A connection that also reads is split with
    /// [`split_tcp`](Self::split_tcp).
    pub fn from_tcp(stream: ::tokio::net::TcpStream, kind: EngineKind) -> Result<Self, Error> {
        Self::on_thread_ring(tcp_into_fd(stream)?, kind)
    }

    /// As [`from_tcp`](Self::from_tcp), with `cfg` as it is (a ring of the sender's own unless
    /// `cfg` names one).
    pub fn from_tcp_with(
        stream: ::tokio::net::TcpStream,
        cfg: SenderConfig,
    ) -> Result<Self, Error> {
        Self::with_config(tcp_into_fd(stream)?, cfg)
    }

    /// A sender over a tokio `UdpSocket` (connected, or sending with
    /// [`send_to`](Self::send_to)), on the runtime thread's shared ring as
    /// [`from_tcp`](Self::from_tcp) is.
    pub fn from_udp(sock: ::tokio::net::UdpSocket, kind: EngineKind) -> Result<Self, Error> {
        Self::on_thread_ring(udp_into_fd(sock)?, kind)
    }

    /// As [`from_udp`](Self::from_udp), with `cfg` as it is.
    pub fn from_udp_with(sock: ::tokio::net::UdpSocket, cfg: SenderConfig) -> Result<Self, Error> {
        Self::with_config(udp_into_fd(sock)?, cfg)
    }

    /// Splits a connected tokio `TcpStream` into a read half, still registered with tokio, and a
    /// sender that owns the writing (as [`from_tcp`](Self::from_tcp) makes it), as tokio's
    /// `TcpStream::into_split` does. The read half reads from a duplicate of the socket
    /// (`fcntl(F_DUPFD_CLOEXEC)`): dropping it closes only the duplicate, and the connection
    /// stays open for the sender until the sender is closed or dropped.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use tokio::io::AsyncReadExt;
    /// use zerotx::tokio::AsyncSender;
    /// use zerotx::EngineKind;
    ///
    /// let stream = tokio::net::TcpStream::connect("127.0.0.1:9000").await?;
    /// let (mut rd, tx) = AsyncSender::<Bytes>::split_tcp(stream, EngineKind::Auto)?;
    /// let mut request = [0u8; 512];
    /// let n = rd.read(&mut request).await?;
    /// tx.send(Bytes::copy_from_slice(&request[..n])).await?;
    /// let closed = tx.close(std::time::Duration::from_secs(5)).await;
    /// assert_eq!(closed.kept, 0);
    /// # Ok(()) }
    /// ```
    pub fn split_tcp(
        stream: ::tokio::net::TcpStream,
        kind: EngineKind,
    ) -> Result<(TcpReadHalf, Self), Error> {
        let std = stream.into_std().map_err(|source| Error::Io {
            context: "deregistering the TcpStream from tokio",
            source,
        })?;
        let read = std
            .try_clone()
            .and_then(::tokio::net::TcpStream::from_std)
            .map_err(|source| Error::Io {
                context: "duplicating the TcpStream for its read half (F_DUPFD_CLOEXEC, epoll_ctl)",
                source,
            })?;
        let tx = Self::on_thread_ring(std.into(), kind)?;
        Ok((TcpReadHalf { stream: read }, tx))
    }

    /// The sender over `fd` for `kind`, on the thread's shared ring where it can be (see the
    /// module docs).
    fn on_thread_ring(fd: OwnedFd, kind: EngineKind) -> Result<Self, Error> {
        if !matches!(
            kind,
            EngineKind::Uring | EngineKind::UringZc | EngineKind::Auto
        ) {
            return Self::new(fd, kind);
        }
        // Without the thread's ring (io_uring refused), the sender's own attempt says why.
        let Ok(ring) = thread_ring() else {
            return Self::new(fd, kind);
        };
        // Tried on a duplicate, so `fd` is still there for the fallback. A refused attempt
        // changes nothing on the socket: the shared ring is asked before `SO_ZEROCOPY` is set.
        let dup = fd.try_clone().map_err(|source| Error::Io {
            context: "duplicating the socket to try the thread's shared ring (F_DUPFD_CLOEXEC)",
            source,
        })?;
        match Self::with_config(dup, SenderConfig::shared(kind, &ring)) {
            Ok(tx) => Ok(tx),
            Err(_) => Self::new(fd, kind),
        }
    }
}

fn tcp_into_fd(stream: ::tokio::net::TcpStream) -> Result<OwnedFd, Error> {
    let std = stream.into_std().map_err(|source| Error::Io {
        context: "deregistering the TcpStream from tokio",
        source,
    })?;
    Ok(std.into())
}

fn udp_into_fd(sock: ::tokio::net::UdpSocket) -> Result<OwnedFd, Error> {
    let std = sock.into_std().map_err(|source| Error::Io {
        context: "deregistering the UdpSocket from tokio",
        source,
    })?;
    Ok(std.into())
}

/// The read half of a TCP connection split by [`AsyncSender::split_tcp`]: reads through tokio
/// ([`AsyncRead`]), on a duplicate of the socket; the writing belongs to the sender.
#[derive(Debug)]
pub struct TcpReadHalf {
    stream: ::tokio::net::TcpStream,
}

impl TcpReadHalf {
    /// The connection's peer (`getpeername(2)`).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// The connection's local address (`getsockname(2)`).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Waits until the socket is readable (tokio's `TcpStream::readable`).
    pub async fn readable(&self) -> io::Result<()> {
        self.stream.readable().await
    }

    /// Reads without waiting (`recv(2)`); `WouldBlock` when nothing is there yet.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.try_read(buf)
    }
}

impl AsFd for TcpReadHalf {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl AsyncRead for TcpReadHalf {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}
