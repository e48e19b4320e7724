//! `msg-zc` on a stream socket (TCP; vsock, whose calls are capped at one packet): one
//! `sendmsg(MSG_ZEROCOPY)` per buffer, held in the ledger until every id its calls took
//! completed. A call that takes part of a buffer leaves the rest as the head, pushed first by
//! later calls; a failure after part of a buffer went out breaks the stream
//! ([`SendmsgCore`]).

use std::collections::VecDeque;
use std::io;

use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::clock::EpochClock;
use crate::engine::msg_zc::common;
use crate::engine::policy::auto::AutoPolicy;
use crate::engine::policy::sendmsg::{self as rules, IdRule};
use crate::engine::sendmsg_core::{answered_by_core, SendmsgCore};
use crate::engine::{send_each, Engine};
use crate::error::SendError;
use crate::report::{Readiness, Released};
use crate::socket::Socket;
use crate::sys;

/// `msg-zc` on a stream. Invariant: `rule` is [`IdRule::Stream`] or [`IdRule::Vsock`], the
/// socket's; every record holds its buffer until its ids completed.
pub(crate) struct MsgZcStream<B> {
    core: SendmsgCore<B>,
    rule: IdRule,
    clock: EpochClock,
}

impl<B: SendBuf> MsgZcStream<B> {
    /// `SO_ZEROCOPY` was accepted on `sock`, whose next zero-copy id is `first_id`; `auto`
    /// chooses per send when given.
    pub(crate) fn new(sock: &Socket, first_id: u32, auto: Option<AutoPolicy>) -> Self {
        let rule = rules::id_rule(sock.kind);
        debug_assert_ne!(rule, IdRule::Datagram);
        Self {
            core: SendmsgCore::new(sock, true, first_id, auto, false),
            rule,
            clock: EpochClock::default(),
        }
    }

    /// [`Engine::try_send`], inlined into [`Engine::try_send_batch`] too: a batch then makes
    /// no return per buffer into a frame older than its system call (see [`sys::send_to`]).
    #[inline(always)]
    fn send_one(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let rule = self.rule;
        let push_head =
            |core: &mut SendmsgCore<B>, out: &mut _| Self::push_head(core, rule, sock, out);
        if let Some(behind) = self.core.behind(out, push_head) {
            return Err(behind.refuse(buf));
        }
        let core = &mut self.core;
        common::send_one(core, &mut self.clock, self.rule, sock, buf, dest, out)
    }

    /// Writes what the kernel has room for of the stream's head, if it has one.
    fn push_head(
        core: &mut SendmsgCore<B>,
        rule: IdRule,
        sock: &Socket,
        out: &mut Vec<Released<B>>,
    ) {
        let Some(slot) = core.head else { return };
        // Out of line (called from `send_one` and `progress`): its return comes before theirs.
        let written = sys::fenced!(common::write(core, rule, sock, slot, out));
        core.head_written(slot, written, out);
    }
}

impl<B: SendBuf> Engine<B> for MsgZcStream<B> {
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        sys::fenced!(self.send_one(sock, buf, dest, out))
    }

    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        // One call per buffer: one id per buffer lets each come back as soon as its own pages
        // are free.
        sys::fenced!(send_each(bufs, |buf| self.send_one(sock, buf, None, out)))
    }

    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        self.core.reap_completions(sock, out);
        Self::push_head(&mut self.core, self.rule, sock, out);
        Ok(())
    }

    fn readiness(&mut self, sock: &Socket, retry: bool) -> Readiness {
        self.core.readiness(sock, retry)
    }

    answered_by_core!();
}
