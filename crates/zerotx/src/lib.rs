//! # zerotx: zero-copy socket transmit for Linux
//!
//! Linux can send socket data straight from a program's memory and tell the program later when
//! it may reuse that memory. zerotx puts the kernel's zero-copy paths (`MSG_ZEROCOPY`, io_uring
//! `SEND_ZC`) behind one [`Sender`], and promises:
//!
//! - **Your buffer comes back only after the kernel let go of it.** A [`Sender`] takes owned,
//!   immutable buffers ([`SendBuf`]) and hands each back with a [`Report`]: bytes sent, whether
//!   the kernel really skipped the copy (and if not, why), and the error if the send failed. No
//!   path (an error, a timeout, a close) frees memory the kernel may still read: what it still
//!   holds at a close is kept and counted ([`Closed::kept`]), never handed back early.
//! - **Zero-copy only where it pays.** The default engine, [`EngineKind::Auto`], runs on any
//!   kernel and socket, copies small sends and routes that come back copied, and tells why in
//!   plain words ([`Sender::explain`]).
//! - **Failures show where you look.** Once a buffer of a stream came back with an error, later
//!   sends fail, and [`Sender::flush`] answers [`Error::Failed`]; every error says what was wrong
//!   and what to do.
//!
//! ## Blocking
//! ```
//! use std::io::Read;
//! use std::net::{TcpListener, TcpStream};
//! use std::time::Duration;
//! use zerotx::{EngineKind, Sender};
//!
//! # let listener = TcpListener::bind("127.0.0.1:0")?;
//! # let addr = listener.local_addr()?;
//! # let peer = std::thread::spawn(move || {
//! #     let mut got = Vec::new();
//! #     listener.accept().unwrap().0.read_to_end(&mut got).unwrap();
//! #     got.len()
//! # });
//! let mut tx = Sender::new(TcpStream::connect(addr)?, EngineKind::Auto)?;
//! tx.send(vec![7u8; 1 << 20])?;       // blocks only while the socket or zero-copy budget is full
//! tx.flush(Duration::from_secs(5))?;  // every buffer released; fails if one carried an error
//! let mut done = Vec::new();
//! tx.reap(&mut done)?;                // the buffers, back, each with its Report
//! for r in &done {
//!     if let Some(e) = &r.report.error {
//!         return Err(e.to_string().into());
//!     }
//!     println!("{} bytes, zero-copy: {}", r.report.bytes, r.report.path.is_zerocopy());
//! }
//! println!("{}", tx.explain());      // why zero-copy is or is not engaged on this socket
//! let closed = tx.close(Duration::from_secs(5));
//! assert_eq!(closed.kept, 0);
//! # drop(closed);
//! # assert_eq!(peer.join().unwrap(), 1 << 20);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Async (feature `tokio`)
//! [`tokio::AsyncSender`] sends without blocking the runtime. The io_uring engines share one
//! ring per runtime thread with no configuration, [`write_all`](tokio::AsyncSender::write_all)
//! sends a whole `Bytes` and fails on the first release that failed, and
//! [`split_tcp`](tokio::AsyncSender::split_tcp) keeps a connection's read half for requests.
//! Released buffers come back from [`released`](tokio::AsyncSender::released), or from a
//! [`releases`](tokio::AsyncSender::releases) stream a consumer task runs beside the sender.
//! ```
//! # #[cfg(feature = "tokio")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use tokio::io::AsyncReadExt;
//! use bytes::Bytes;
//! use std::time::Duration;
//! use zerotx::{tokio::AsyncSender, EngineKind};
//!
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! # rt.block_on(async {
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let addr = listener.local_addr()?;
//! # let peer = tokio::spawn(async move {
//! #     let mut got = Vec::new();
//! #     listener.accept().await.unwrap().0.read_to_end(&mut got).await.unwrap();
//! #     got.len()
//! # });
//! let object = Bytes::from(vec![7u8; 1 << 20]);  // shared: each send is a clone, not a copy
//! let stream = tokio::net::TcpStream::connect(addr).await?;
//! let tx = AsyncSender::from_tcp(stream, EngineKind::Auto)?;
//! tx.write_all(object.clone()).await?;           // sent, and released by the kernel
//! tx.send(object.slice(..4096)).await?;          // accepted; comes back later
//! tx.flush(Duration::from_secs(5)).await?;       // fails if a buffer came back with an error
//! while let Some(done) = tx.released().await? {
//!     if let Some(e) = done.report.error {
//!         return Err(e.into());
//!     }
//! }
//! let closed = tx.close(Duration::from_secs(5)).await;
//! assert_eq!(closed.kept, 0);
//! # drop(closed);
//! # assert_eq!(peer.await?, (1 << 20) + 4096);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! # #[cfg(not(feature = "tokio"))]
//! # fn main() {}
//! ```
//!
//! ## Buffers
//! `Vec<u8>`, `Box<[u8]>`, `bytes::Bytes`, `Arc<[u8]>` and `&'static [u8]` send as they are.
//! Any other owner of immutable bytes (a memory-mapped file, another library's buffer) sends as
//! a `Bytes` made by `Bytes::from_owner`, without copying and without `unsafe` of your own: see
//! [`SendBuf`]; a sealed file maps safely with [`map_sealed`]. A [`BufPool`] hands out page-aligned blocks to fill and reuse, registered with
//! io_uring if you like ([`Sender::register_pool`]); its buffers also convert into `Bytes` for
//! code built on the `bytes` crate, and return to the pool when the last clone is dropped.
//!
//! ## Engines ([`EngineKind`])
//! | engine | system call | kernel | without it |
//! |---|---|---|---|
//! | `auto` (default) | io_uring (TCP/UDP, 6.2+) or `sendmsg(2)`; zero-copy per send where it pays | any | copies |
//! | `copy` | `sendmsg(2)` | any | - |
//! | `msg-zc` | `sendmsg(MSG_ZEROCOPY)` + `recvmsg(MSG_ERRQUEUE)` | TCP 4.14, UDP 5.0, vsock 6.7 | [`Error::Unsupported`] from [`Sender::new`] (`ENOPROTOOPT`/`EOPNOTSUPP` from `SO_ZEROCOPY`) |
//! | `uring` | io_uring `IORING_OP_SENDMSG` | 5.3 | [`Error::Unsupported`] (`ENOSYS`, `EPERM` from `io_uring_setup`) |
//! | `uring-zc` | io_uring `SENDMSG_ZC`, `SEND_ZC` + fixed buffers, `REPORT_USAGE` | 6.1 (usage report 6.2) | [`Error::Unsupported`] |
//!
//! Kernel 6.18 refuses `SO_ZEROCOPY` on RAW, `AF_PACKET` and `AF_UNIX` sockets (`EOPNOTSUPP`):
//! those send with `copy`. An `AF_PACKET` socket must be bound to an interface: each buffer goes
//! out there as one frame, with the socket's protocol (a `SOCK_RAW` buffer holds the link-layer
//! header; a `SOCK_DGRAM` socket is taken only on an interface without link-layer addresses).
//!
//! ## Logs, metrics and the kernel's view
//! - Feature `tracing`: one log event (target `zerotx`, with the socket's peer) per decision an
//!   operator asks about: the engine chosen and why, `auto` switching to copy and back, budget
//!   refusals and holds, the io_uring fallback, a pool not registered, a stream cut short, a
//!   refused completion, buffers kept at a close. None per send.
//! - Feature `metrics`: process-wide counters by engine and path (bytes zero-copy, bytes copied
//!   and why, refusals, probes, switches, kept buffers), budget gauges and a release-latency
//!   histogram on the `metrics` facade, published at each reap from the sender's [`Stats`]. The
//!   same gauges are in [`Stats`] (pinned bytes and zero-copy sends in flight, against `auto`'s
//!   caps); [`Stats::merge`] sums many senders.
//! - Without either feature nothing of them is compiled in: the send path is the same.
//! - [`Sender::tcp_info`] ([`tcp_info`] for any TCP socket): retransmits, congestion window,
//!   round-trip time from `TCP_INFO`.
//!
//! [`probe()`] tells what the running host supports and what to tune. How the library is built
//! (where each piece lives, and why) is in the repository's `docs/architecture.md`.
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod addr;
mod buf;
mod cmsg;
mod config;
mod egress;
mod engine;
mod error;
mod factory;
mod kind;
mod ledger;
mod observe;
pub mod probe;
mod report;
mod sender;
mod socket;
mod sys;
mod tcp_info;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use addr::{Destination, VsockAddr};
pub use buf::{map_sealed, BufPool, PoolBufMut, PooledBuf, SendBuf};
pub use config::{AtCap, SenderConfig};
pub use error::{Error, Feature, SendError};
pub use kind::{EngineKind, Family, SockKind, SockType};
pub use probe::probe;
pub use report::{CopyReason, Explanation, Readiness, Released, Report, SendPath, Stats};
pub use sender::{leaked_buffers, Closed, Sender};
pub use sys::uring::{UringConfig, UringShared};
pub use tcp_info::{tcp_info, TcpInfo};

/// Hooks for zerotx's own tests, fuzzers and benchmarks: not part of the API, may change at any
/// time.
#[doc(hidden)]
pub mod internals {
    /// The error-queue decoder.
    pub mod cmsg {
        pub use crate::cmsg::*;
    }
    /// The completion ledger.
    pub mod ledger {
        pub use crate::ledger::*;
    }
    /// Host facts the CLI and the VM checks print, and the probe's advice rule (tested on
    /// made-up reports); users call [`probe()`](crate::probe()).
    pub mod probe {
        pub use crate::probe::{advise, huge_page_mode, kernel_release};
    }
    /// The size of the slices [`AsyncSender::write_all`](crate::tokio::AsyncSender::write_all)
    /// cuts.
    #[cfg(feature = "tokio")]
    pub mod tokio {
        pub use crate::tokio::WRITE_SLICE;
    }
    /// An engine as the factory builds it, driven without a `Sender`.
    pub mod engine {
        pub use crate::factory::Bare;
    }
    /// What io_uring offers on this host, and the one-send check behind it.
    pub mod uring {
        pub use crate::sys::poll_one;
        pub use crate::sys::uring::{
            probe, report_usage, send_zc_once, sendmsg_zc_fixed, UringProbe,
        };
        pub use crate::sys::uring::{Completion, Cqe, InboxHook, JoinRefused, Ring, CANCEL};
        pub use crate::sys::uring::{Cut, Op, Payload, Refused, SendKind, SendOp};
    }
    /// io_uring faults the kernel cannot produce on demand (a failed `io_uring_enter`, an SQE
    /// whose preparation fails), injected for the calling thread only.
    pub mod uring_faults {
        pub use crate::sys::uring::{inject, Faults};
    }
    /// Trains: the segment limit that decides a train of `count` segments where the version
    /// rule says `rule` (the kernel's answer to the probe train, asked once per process where
    /// the rule would refuse a train the kernel may take).
    pub mod trains {
        pub use crate::engine::sendmsg_train::segment_limit;
    }
}
