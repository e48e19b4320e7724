//! [`UringDatagram`]: the io_uring engine on a datagram socket (UDP). Many requests in flight,
//! one per buffer ([`Unordered`]), or per run of equal-size datagrams of a batch (`runs.rs`); a
//! failed request is its datagrams' error alone. The socket is named by a registered file slot
//! where the ring has one. The rest is the shared [`UringCore`].

use std::collections::VecDeque;

use socket2::SockAddr;

use super::core::{answered_by_uring_core, UringCore};
use super::state::Unordered;
use crate::buf::SendBuf;
use crate::engine::policy::auto::AutoPolicy;
use crate::engine::sendmsg_train::BatchRuns;
use crate::engine::Engine;
use crate::error::{Error, SendError};
use crate::report::Released;
use crate::socket::Socket;
use crate::sys::uring::{UringConfig, UringShared};

/// The io_uring engine on a datagram socket. Invariant: each buffer is one request, or one of a
/// batch's run in one train request, which nothing orders against the others.
pub(crate) struct UringDatagram<B> {
    core: UringCore<B, Unordered>,
}

impl<B: SendBuf> UringDatagram<B> {
    /// The engine on the datagram socket `sock` (see [`UringCore::open`]); a batch's runs of
    /// equal-size datagrams go as trains if `runs` and the socket and kernel allow
    /// ([`BatchRuns::new`]).
    pub(crate) fn new(
        sock: &Socket,
        zc: bool,
        cfg: UringConfig,
        shared: Option<&UringShared>,
        auto: Option<AutoPolicy>,
        runs: bool,
    ) -> Result<Self, Error> {
        let mut core = UringCore::open(sock, zc, cfg, shared, auto, Unordered)?;
        core.st.trains.runs = BatchRuns::new(sock, runs);
        Ok(Self { core })
    }
}

impl<B: SendBuf> Engine<B> for UringDatagram<B> {
    fn try_send(
        &mut self,
        _sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        self.core.try_send(buf, dest, out)
    }

    /// One request per datagram, or per run of equal-size datagrams (`runs.rs`).
    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        self.core.try_send_batch(sock, bufs, out)
    }

    /// One request per train: `SENDMSG_ZC` or `SENDMSG` with a `UDP_SEGMENT` control message
    /// (`train.rs`).
    fn try_send_train(
        &mut self,
        _sock: &Socket,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        self.core.try_send_train(buf, segment, dest, out)
    }

    answered_by_uring_core!();
}
