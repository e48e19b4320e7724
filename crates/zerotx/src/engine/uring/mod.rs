//! The io_uring engine family, one file per job:
//!
//! - `stream.rs`: [`UringStream`], the engine on a connection (`uring` and `uring-zc`, and
//!   `auto`'s io_uring path): one request in flight, a byte stream's buffers merged into it.
//! - `datagram.rs`: [`UringDatagram`], the engine on a datagram socket: a request per buffer,
//!   or per run of a batch (`runs.rs`).
//! - `core.rs`: what both keep and do alike (`UringCore`): the ring and the sender's seat, the
//!   queue, forming and pushing requests, applying their CQEs, the budget, `auto`, leaving; the
//!   socket's order is the engine type's (`Order`), chosen once by the factory.
//! - `cqe.rs`: what follows a request's CQEs, as pure functions of the CQE and the request's
//!   record, and the record the engine keeps of each request in the ring.
//! - `state.rs`: the records the engine's state is made of, each with its invariant.
//! - `train.rs`: trains (UDP GSO) on a datagram socket: one request per train, the `UDP_SEGMENT`
//!   control message in the request, the sendmsg family's decisions (`policy::train`); what a
//!   train's last CQE means is `state.rs`'s `Trains`.
//! - `runs.rs`: a batch's runs of equal-size datagrams on a datagram socket, one train request
//!   per run (the sendmsg family's run rule, `BatchRuns`).
//! - `ring_ref.rs`: the engine's handle on its ring, its own or a shared one
//!   ([`UringShared`](crate::UringShared)); the ring's settings
//!   ([`UringConfig`](crate::UringConfig)) and the ring with them are in [`crate::sys::uring`].
//!
//! The ring itself, the requests and every pointer the kernel reads are in [`crate::sys::uring`].
//!
//! The engines: `uring` (`IORING_OP_SENDMSG`, the kernel copies) and `uring-zc`
//! (`IORING_OP_SENDMSG_ZC`, or `IORING_OP_SEND_ZC` with `IORING_RECVSEND_FIXED_BUF` for buffers from
//! a registered [`BufPool`]), both with many requests per `io_uring_enter`. This module decides
//! order, batching and the budget; the ring, the requests and every pointer the kernel reads are
//! in [`crate::sys::uring`].
//!
//! - **Order.** io_uring issues requests independently: two in flight on one connection can
//!   reorder it when the socket buffer fills (a quarter of a TCP stream's bytes arrived out of order
//!   in a measurement, docs/kernel.md, "io_uring SEND_ZC / SENDMSG_ZC"; SEQPACKET messages reorder the same way). So a stream or seqpacket socket has
//!   exactly one request in flight. On a byte stream (TCP, AF_UNIX and vsock streams) it carries
//!   up to `batch` queued buffers as an iovec with `MSG_WAITALL`, and a short result is continued
//!   from its offset; on SEQPACKET and SCTP one request is one message, never merged. Datagram
//!   sockets have many requests in flight, one per buffer. The next record of an ordered socket
//!   may go as soon as the first CQE says the previous one went whole, before its notification.
//! - **Completions.** The first CQE carries bytes or `-errno` and `IORING_CQE_F_MORE` when a
//!   notification follows (read from the flag, also on errors); it decides what follows the
//!   request (`cqe::Then`). The request holds its record (the buffers) until its **last** CQE (the
//!   `IORING_CQE_F_NOTIF` one, or a first CQE without `F_MORE`), which hands the record back;
//!   only then is it released, or continued: a short `MSG_WAITALL` result, a resubmission and a
//!   copy after the budget refused are built from the returned record, so they wait for the
//!   notification of the request before them. `IORING_SEND_ZC_REPORT_USAGE`, where the kernel has
//!   it, makes the notification say whether the kernel copied. Every CQE reaped is applied, and
//!   whatever must be pushed next waits in `to_push` until the SQ takes it, so a failing
//!   `io_uring_enter` loses nothing.
//! - **The zero-copy budget** (`ENOMEM`, when io_uring charges pinned pages to
//!   `RLIMIT_MEMLOCK`): a refused request waits for one of this sender's requests that holds
//!   pinned pages to finish, if those pages could make room for it; otherwise it goes by copy at
//!   once (a fallback). A request larger than the locked-memory limit is never tried zero-copy.
//!   Nothing is retried on its own completion, so nothing spins. `ENOBUFS` is never the budget
//!   here: io_uring hands the stack its own notification (`msg_ubuf`), so the option-memory
//!   allocation that answers `ENOBUFS` for `MSG_ZEROCOPY` never runs; an `ENOBUFS` is a datagram
//!   a qdisc dropped (reported with `IP_RECVERR`), an error of that datagram, and resending it
//!   into the same full queue would only repeat the drop.
//! - **A thread that exited.** A parked request is retried on the thread that submitted it; if
//!   that thread is gone the kernel cancels it (`-ECANCELED` having sent nothing, measured on 6.18;
//!   `-EFAULT` reported elsewhere). The connection is fine: the request is submitted again (up to
//!   8 times in a row; an `-EFAULT` once, since it also means memory the kernel cannot read, which
//!   no resubmission cures).
//! - **Leaving.** A sender's SQEs name its own duplicate of the socket's descriptor. Shutdown
//!   submits every SQE still in the SQ and cancels parked requests (`IORING_OP_ASYNC_CANCEL`);
//!   the duplicate is closed only if that succeeded, leaked otherwise, so a descriptor number an
//!   SQE names is never reused under it. Records still in the ring after that are kept: shutdown
//!   counts them, and the ring frees them after their last CQE (a sender's own ring is kept for
//!   that after the sender is dropped: see [`Ring`](crate::sys::uring::Ring)).
//!   Where the ring gave the sender a registered file slot, its SQEs name that slot instead
//!   (see [`Ring`](crate::sys::uring::Ring)).

mod core;
mod cqe;
mod datagram;
mod flow;
mod ring_ref;
mod runs;
mod state;
mod stream;
mod train;

pub(crate) use datagram::UringDatagram;
pub(crate) use stream::UringStream;
