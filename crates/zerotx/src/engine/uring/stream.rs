//! [`UringStream`]: the io_uring engine on a connection (TCP, AF_UNIX and vsock streams,
//! SEQPACKET, SCTP). One request in flight at a time ([`Head`]): on a byte stream it carries up
//! to `batch` queued buffers as one iovec with `MSG_WAITALL`, and `auto`'s small copies go as
//! one gathered `sendmsg(2)`; on a message socket one message. The rest is the shared
//! [`UringCore`].

use std::collections::VecDeque;
use std::io;

use socket2::SockAddr;

use super::core::{answered_by_uring_core, UringCore};
use super::state::{Head, Order};
use crate::buf::SendBuf;
use crate::engine::policy::auto::AutoPolicy;
use crate::engine::{send_each, send_front, Engine};
use crate::error::{Error, SendError};
use crate::report::Released;
use crate::socket::Socket;
use crate::sys::uring::{UringConfig, UringShared};

/// The io_uring engine on a connection. Invariant: its one request in flight keeps the stream in
/// order, and after a failed send nothing more goes out ([`Head`]).
pub(crate) struct UringStream<B> {
    core: UringCore<B, Head>,
}

impl<B: SendBuf> UringStream<B> {
    /// The engine on the connected `sock` (see [`UringCore::open`]).
    pub(crate) fn new(
        sock: &Socket,
        zc: bool,
        cfg: UringConfig,
        shared: Option<&UringShared>,
        auto: Option<AutoPolicy>,
    ) -> Result<Self, Error> {
        let head = Head::new(sock.kind.is_byte_stream());
        Ok(Self {
            core: UringCore::open(sock, zc, cfg, shared, auto, head)?,
        })
    }
}

impl<B: SendBuf> Engine<B> for UringStream<B> {
    fn try_send(
        &mut self,
        _sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        self.core.try_send(buf, dest, out)
    }

    /// On a byte stream the whole batch enters the queue first (up to the queue's limit), so the
    /// first request or write carries up to `batch` buffers, not the first buffer alone; a
    /// message socket takes the buffers one by one ([`try_send`](Engine::try_send)).
    fn try_send_batch(
        &mut self,
        _sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        if !self.core.st.order.merge() {
            return send_each(bufs, |buf| self.core.try_send(buf, None, out));
        }
        let (mut ring, st) = self.core.split();
        let mut accepted = 0;
        let mut failed = None;
        loop {
            // `send_front` refuses an empty buffer; a broken stream refuses the rest, and a full
            // queue hands the buffer back.
            let queued = send_front(bufs, |buf| {
                if let Some(errno) = st.refusal() {
                    let error = io::Error::from_raw_os_error(errno);
                    return Err(SendError::Io { buf, error });
                }
                if st.queue.len() >= st.cfg.queue_limit {
                    return Err(SendError::WouldBlock(buf));
                }
                st.held += 1;
                st.stats.sends += 1;
                st.queue.push_back((buf, None));
                Ok(())
            });
            match queued {
                Ok(true) => accepted += 1,
                Ok(false) if bufs.is_empty() => break,
                Ok(false) => {
                    // The queue is full: reap and issue, and take more if that made room.
                    if let Err(error) = st.kick(&mut ring, out) {
                        st.due.owe();
                        let buf = bufs.pop_front().expect("handed back");
                        failed = Some(SendError::Io { buf, error });
                        break;
                    }
                    if st.queue.len() >= st.cfg.queue_limit {
                        st.stats.would_block += 1;
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // What was queued goes now, as after `try_send`; a failure is the next progress's.
        if st
            .issue(&mut ring, out)
            .and_then(|()| ring.submit_if_due(st.eager()))
            .is_err()
        {
            st.due.owe();
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(accepted),
        }
    }

    answered_by_uring_core!();
}
