//! # zerotx: zero-copy socket transmit for Linux
//!
//! Linux can send socket data straight from a program's memory and tell the program later when
//! it may reuse that memory. zerotx puts the kernel's zero-copy paths behind one [`Sender`] that
//! takes owned, immutable buffers ([`SendBuf`]) and gives each back only after the kernel
//! released it, with a [`Report`]: bytes sent, and whether the kernel really skipped the copy.
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
//! [`probe()`] tells what the running host supports.
//!
//! The io_uring engines keep one request in flight per stream socket (several in flight reorder
//! the byte stream when the socket buffer fills), carrying many buffers as one iovec; datagram
//! sockets have many requests in flight. Several senders can share one ring ([`UringShared`]) so
//! one `io_uring_enter` submits for many sockets, and a [`BufPool`] registered with the ring sends
//! with `IORING_RECVSEND_FIXED_BUF`.
//!
//! ## What zerotx gets right, and where it lives
//! - Buffer lifetimes: [`SendBuf`] documents the rule; no path frees a buffer the kernel may read.
//! - Fragmented datagrams: a zero-copy UDP socket is put under a path-MTU mode in which the kernel
//!   refuses, before taking an id, a datagram it would fragment (a dropped fragment would leave
//!   the id's completion to whenever the other fragments are freed); that datagram goes by copy
//!   under the socket's own mode (`engine/unfragmented.rs`).
//! - Completion ids: u32, wrapping, coalesced into ranges that may cross 2^32, one buffer owning
//!   several ids after a short write: the pure ledger (`ledger.rs`). Which calls take an id differs per
//!   protocol (a UDP send that failed after its skb was built took one; a short vsock call took
//!   one for bytes it copied); the `sendmsg` engine follows each rule and never releases on a
//!   guess. A socket that already has `SO_ZEROCOPY` is refused unless
//!   [`SenderConfig::zerocopy_first_id`] says where the kernel's counter stands.
//! - Streams: a stream that failed after part of a buffer went out sends nothing more (a gap
//!   would corrupt it); io_uring keeps one request in flight per stream or seqpacket socket.
//! - Control messages: the pure, length-checked, fuzzed decoder (`cmsg.rs`) (IPv4, IPv6, vsock and
//!   packet levels); other error-queue messages are skipped, never fatal.
//! - `ENOBUFS` (`net.core.optmem_max`, `RLIMIT_MEMLOCK`): read completions and retry; with nothing
//!   in flight, send that buffer by copy and count it ([`Stats::fallbacks`]).
//! - A COPIED completion (loopback always copies) is a statistic ([`CopyReason::Kernel`]), not an
//!   error; `auto` learns from it: when most of a window comes back copied it copies, and probes
//!   now and then (backing off) so a route that starts paying gets zero-copy back.
//! - Small sends, whose pinning and notification cost more than a memcpy: `auto` copies below a
//!   per-socket-kind threshold. Every such choice is counted in [`Stats`] and explained in plain
//!   words by [`Sender::explain`].
//!
//! ## Where each piece lives
//! | file | what |
//! |---|---|
//! | `sender.rs` | [`Sender`]: input checks, one queue of released buffers, blocking on top of the non-blocking core |
//! | `engine/sendmsg.rs` | the `copy` and `msg-zc` engines, with each protocol's id rules |
//! | `engine/uring.rs`, `engine/shared.rs` | the `uring` and `uring-zc` engines; one ring shared by many senders ([`UringShared`]) |
//! | `engine/record.rs` | the one in-flight record every engine keeps, and the one path to a [`Released`] |
//! | `engine/auto.rs` | `auto`: which family (io_uring or `sendmsg`) a socket gets, and why |
//! | `engine/unfragmented.rs` | the path-MTU mode that keeps the kernel from fragmenting zero-copy datagrams |
//! | `engine/policy/` | every decision on how a buffer goes (budget refusals, MTU, registered buffers), pure; `policy/auto.rs`: `auto`'s per-send choice (thresholds, copied windows, probes, budget holds, caps), with property tests |
//! | `ledger.rs` | zero-copy completion ids: ranges, the 2^32 wrap, ids no buffer waits for |
//! | `cmsg.rs` | the error-queue decoder |
//! | `sys/` | every system call and kernel ABI, and with `buf/` the only `unsafe` (tokio's reactor registration too); `sys/uring/`: the io_uring ring (`ring.rs`) and the requests that own their memory and build their SQEs (`op.rs`) |
//! | `buf/` | [`SendBuf`] (the buffer rule) and [`BufPool`] (its own mapping, on small pages for registration, or on huge pages by [`BufPool::huge`]: see `buf/pool.rs`) |
//! | `probe.rs` | [`probe()`]: what this host supports and what to tune |
//! | `tokio/` | feature `tokio`: `tokio::AsyncSender`, readiness through tokio's reactor, one shared ring per runtime thread |
//!
//! ## Why some things are ours
//! The libc calls go through a small `sys` module over `libc` (and `socket2` for addresses);
//! the id ledger, the error-queue decoder, the page-aligned pool, the engines and `auto`'s policy
//! exist in no crate made for the job, so they are written here and tested against the real
//! kernel. So is one thing below the system calls: after its sends and its `io_uring_enter`
//! (made inline through rustix, not through the `io-uring` crate's `submit`, for this reason), the
//! library fills the CPU's return-address predictor (`sys::refill_return_stack`, as the kernel
//! does at a context switch). On AMD VMs with the kernel's SRSO "Safe RET" mitigation the first
//! return after a system call that finds the kernel's stale entries there costs 0.5-0.8 us, which
//! every library call that ended in a system call paid and a hand-written loop never does
//! (`benches/syscall-return.c`, `benches/compare-raw-results.md`).
#![deny(unsafe_code)]
#![deny(missing_docs)]

mod addr;
mod buf;
mod cmsg;
mod engine;
mod error;
mod ledger;
pub mod probe;
mod report;
mod sender;
pub mod socket;
mod sys;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use addr::{Destination, VsockAddr};
pub use buf::{map_sealed, BufPool, PoolBufMut, PooledBuf, SendBuf};
pub use engine::{AtCap, EngineKind, UringConfig, UringShared};
pub use error::{Error, Feature, SendError};
pub use probe::probe;
pub use report::{CopyReason, Explanation, Readiness, Released, Report, SendPath, Stats};
pub use sender::{leaked_buffers, Closed, Sender, SenderConfig};
pub use socket::SockKind;

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
    /// io_uring faults the kernel cannot produce on demand (a failed `io_uring_enter`, an SQE
    /// whose preparation fails), injected for the calling thread only.
    pub mod uring_faults {
        pub use crate::sys::uring::{inject, Faults};
    }
}
