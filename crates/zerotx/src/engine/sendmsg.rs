//! The `sendmsg(2)` engines, `copy` and `msg-zc` (`MSG_ZEROCOPY`): one type per engine and
//! socket shape, chosen once by [`build`] ([`policy::sendmsg::shape`](rules::shape)).
//!
//! - [`CopyEngine`] (`copy.rs`): plain `sendmsg(2)` on every socket kind.
//! - [`MsgZcStream`] (`msg_zc/stream.rs`): `MSG_ZEROCOPY` on a stream (TCP, vsock).
//! - [`MsgZcDatagram`] (`msg_zc/datagram.rs`): `MSG_ZEROCOPY` on datagrams (UDP).
//!
//! What they keep alike (the ledger, the head, the release, the copy send) is
//! [`SendmsgCore`](crate::engine::sendmsg_core::SendmsgCore); the error-queue reader is
//! [`errqueue`](crate::engine::errqueue), the path-MTU guard
//! [`unfragmented`](crate::engine::unfragmented), and every decision
//! [`policy::sendmsg`](rules).

use crate::buf::SendBuf;
use crate::engine::copy::CopyEngine;
use crate::engine::msg_zc::datagram::MsgZcDatagram;
use crate::engine::msg_zc::stream::MsgZcStream;
use crate::engine::policy::auto::AutoPolicy;
use crate::engine::policy::sendmsg::{self as rules, Shape};
use crate::engine::sendmsg_train::BatchRuns;
use crate::engine::Engine;
use crate::socket::Socket;

/// Builds the `sendmsg(2)` engine for `sock`. `zerocopy` must only be set once `SO_ZEROCOPY`
/// was accepted on `sock`, whose next zero-copy id is `first_id` (0 on a fresh socket); `auto`'s
/// policy chooses per send when given (`zerocopy` must be set). `batch_trains`: a batch's runs
/// of equal-size datagrams go as trains where the socket allows ([`BatchRuns`]).
pub(crate) fn build<B: SendBuf>(
    sock: &Socket,
    zerocopy: bool,
    first_id: u32,
    auto: Option<AutoPolicy>,
    batch_trains: bool,
) -> Box<dyn Engine<B>> {
    debug_assert!(zerocopy || auto.is_none(), "auto needs SO_ZEROCOPY");
    let runs = BatchRuns::new(sock, batch_trains);
    match rules::shape(sock.kind, zerocopy) {
        Shape::Copy => Box::new(CopyEngine::new(sock, runs)),
        Shape::ZcStream => Box::new(MsgZcStream::new(sock, first_id, auto)),
        Shape::ZcDatagram => Box::new(MsgZcDatagram::new(sock, first_id, auto, runs)),
    }
}
