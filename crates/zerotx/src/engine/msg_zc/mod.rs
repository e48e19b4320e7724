//! The `msg-zc` engines: `sendmsg(MSG_ZEROCOPY)`, completions from the socket error queue (TCP
//! 4.14, UDP 5.0, vsock 6.7), one type per socket shape ([`stream`], [`datagram`]), with what
//! both do alike in [`common`]. A buffer's life:
//! 1. `try_send` puts it in the [`Ledger`](crate::ledger::Ledger) and calls `sendmsg` until it
//!    is fully queued or the socket is full (a stream's rest becomes the head).
//! 2. The zero-copy budget (`ENOBUFS` from option memory or locked memory; `ENOMEM` on vsock)
//!    makes the engine read completions and retry; with nothing in flight to wait for, the rest
//!    of that buffer goes by copy (a *fallback*), so the engine never spins and never waits for
//!    something that cannot come ([`policy::on_budget_refusal`](crate::engine::policy)).
//! 3. The error queue is read without blocking ([`errqueue`](crate::engine::errqueue));
//!    completion ranges go to the ledger, which returns buffers whose every id completed.
//!
//! Which calls take an id, per socket, is [`policy::sendmsg`](crate::engine::policy::sendmsg)'s
//! `IdRule`, the one place that rule is written.

pub(crate) mod common;
pub(crate) mod datagram;
pub(crate) mod stream;
