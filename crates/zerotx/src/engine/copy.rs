//! The `copy` engine: plain `sendmsg(2)`, the kernel copies. Works on every socket kind.
//!
//! A buffer the kernel took whole is released as its call returns; a stream that took part of
//! one keeps the rest as the head ([`SendmsgCore`]). A batch goes as the socket's shape asks
//! ([`CopyBatch`], chosen once): on a byte stream up to [`sys::GATHER_MAX`] buffers and
//! [`sys::GATHER_BYTES`] bytes per system call, one `sendmsg` of their bytes in order (what
//! `writev` does, and what the io_uring engines' byte-stream batch does); datagrams one call
//! each. Not `sendmmsg`: it returns how many went and drops the error of the one that failed
//! after them, and an error the socket held (an ICMP port unreachable's `ECONNREFUSED`, taken by
//! the first datagram that meets it) would be gone for good.
//!
//! The error queue holds no completions here, only what the caller's options put there (ICMP
//! errors, timestamps): it is read now and then, and before the caller sleeps
//! ([`copy_reaps`](rules::copy_reaps)).

use std::collections::VecDeque;
use std::io;
use std::time::Instant;

use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::policy;
use crate::engine::policy::sendmsg::{self as rules, CopyBatch};
use crate::engine::record::Record;
use crate::engine::sendmsg_core::{answered_by_core, SendmsgCore, Wait};
use crate::engine::sendmsg_runs::{send_run, RunMode, RunSent};
use crate::engine::sendmsg_train::{plain_batch, plain_send, BatchRuns};
use crate::engine::{send_each, send_front, Engine};
use crate::error::SendError;
use crate::report::{Readiness, Released};
use crate::socket::Socket;
use crate::sys;

/// The `copy` engine. Invariant: its records never take a zero-copy id; one is in the ledger
/// only as a stream's head.
pub(crate) struct CopyEngine<B> {
    core: SendmsgCore<B>,
    batch: CopyBatch,
    /// Progress calls since the error queue was last read (see [`rules::copy_reaps`]).
    quiet: u32,
}

impl<B: SendBuf> CopyEngine<B> {
    /// `runs`: whether a batch's runs of equal-size datagrams go as trains.
    pub(crate) fn new(sock: &Socket, runs: BatchRuns) -> Self {
        let mut core = SendmsgCore::new(sock, false, 0, None, false);
        core.runs = runs;
        Self {
            core,
            batch: rules::copy_batch(sock.kind),
            quiet: 0,
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
        if let Some(behind) = self.core.behind(out, |core, out| core.push_head(sock, out)) {
            return Err(behind.refuse(buf));
        }
        self.core.try_send_copy(sock, buf, dest, None, out)
    }

    fn push_head(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) {
        self.core.push_head(sock, out);
    }

    /// [`Engine::try_send_batch`] up to the fill that follows it: the loop for the socket.
    /// Inlined, with the loops it picks, so their system calls are made in `try_send_batch`'s
    /// own frame, which the fill then covers (docs/fast-path.md); the out-of-line helpers that
    /// also enter the kernel (`push_head`, `finish_partial`) fill before they return.
    #[inline(always)]
    fn send_batch_now(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        match self.batch {
            CopyBatch::Gather => self.send_gathered(sock, bufs, out),
            // A split train's rest goes first (`send_one`).
            CopyBatch::Datagrams if self.core.head.is_none() => {
                self.send_datagrams(sock, bufs, out)
            }
            CopyBatch::Datagrams | CopyBatch::EachAlone => {
                send_each(bufs, |buf| self.send_one(sock, buf, None, out))
            }
        }
    }

    /// A train: one GSO call by copy (see [`SendmsgCore::try_send_train_copy`]), after the rest
    /// of a split train before it.
    #[inline]
    fn send_train(
        &mut self,
        sock: &Socket,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        if self.core.head.is_some() {
            self.push_head(sock, out);
            if self.core.head.is_some() {
                self.core.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        if let Err(reason) = self.core.check_train(buf.as_bytes().len(), segment) {
            return Err(SendError::Invalid { buf, reason });
        }
        let rec = self.core.train_record(buf, segment, dest);
        self.core.try_send_train_copy(sock, rec, None, out)
    }

    /// A batch of datagrams: one `send` per buffer, each released as soon as its call returns;
    /// a run of equal-size ones as one train where the socket allows ([`send_run`]).
    /// The rules are [`send_each`]'s: a failure is the front buffer's (the kernel took the ones
    /// before it), the rest stay in `bufs`; a full socket puts the buffer back at the front and
    /// ends the batch. A loop of its own: a copied datagram never has a head or a broken stream
    /// to ask about, and the general loop's moves cost more than the call (docs/fast-path.md).
    #[inline(always)]
    fn send_datagrams(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        // Only a stream's partial send leaves a head or breaks the socket.
        debug_assert!(self.core.head.is_none() && self.core.broken.is_none());
        let path = policy::release_path(false, None, false);
        let fd = sock.fd();
        let core = &mut self.core;
        let runs = core.runs.on();
        // Buffers that go one per call whatever their size: the rest of a run the kernel refused.
        let mut alone = 0usize;
        let mut taken = 0;
        let refused = loop {
            let Some(mut buf) = bufs.pop_front() else {
                break None;
            };
            let len = buf.as_bytes().len();
            if len == 0 {
                break Some((buf, None));
            }
            if alone > 0 {
                alone -= 1;
            } else if runs && bufs.front().is_some_and(|b| b.as_bytes().len() == len) {
                // The one size comparison per buffer: a run may start here.
                match send_run(core, sock, buf, bufs, |_, _| Some(RunMode::Copy(None)), out) {
                    RunSent::Sent(n) => {
                        taken += n;
                        continue;
                    }
                    RunSent::Full => return Ok(taken),
                    RunSent::Alone(b, n) => (buf, alone) = (b, n - 1),
                    RunSent::Failed(b, error) => break Some((b, Some(error))),
                }
            }
            let data = buf.as_bytes();
            // A sampled buffer's latency runs from its own call, as a lone send's does.
            let started = core.latency.next();
            core.stats.syscalls += 1;
            match sys::send_to(fd, data, None, 0) {
                Ok(n) => core.stats.bytes += n as u64,
                Err(error) => break Some((buf, Some(error))),
            }
            taken += 1;
            core.stats.sends += 1;
            core.waiting = Wait::Nothing;
            Record::release_whole(buf, path, started, &mut core.stats, out);
        };
        match refused {
            None => Ok(taken),
            Some((buf, error)) => core.datagram_refused(buf, error, taken, bufs),
        }
    }

    /// A batch on a byte stream: up to [`sys::GATHER_MAX`] buffers and [`sys::GATHER_BYTES`]
    /// bytes per system call, as one write ([`sys::send_gather`]). Every buffer the kernel took
    /// whole is released at once; the one it cut finishes as a lone send's would (the head). The
    /// rules are [`send_each`]'s: a failure is the front buffer's (the kernel took the buffers
    /// before it), the rest stay in `bufs`.
    #[inline(always)]
    fn send_gathered(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        let mut accepted = 0;
        loop {
            // A run within the count and byte caps; a buffer larger than the byte cap, or one
            // followed by an empty one, goes alone.
            let slices = sys::gather_run(bufs.iter().map(|b| b.as_bytes()));
            let n = slices.len();
            if n < 2 || self.core.head.is_some() || self.core.broken.is_some() {
                // One buffer (or an empty one), or what `send_one` handles first.
                drop(slices);
                if !send_front(bufs, |buf| self.send_one(sock, buf, None, out))? {
                    return Ok(accepted);
                }
                accepted += 1;
                continue;
            }
            // One clock read before the call, if any of these buffers is one the sampler times:
            // their latency runs from the call, as a lone send's does.
            let now = self.core.latency.due_within(n).then(Instant::now);
            self.core.stats.syscalls += 1;
            let result = sys::send_gather(sock.fd(), &slices);
            drop(slices);
            let taken = match result {
                Ok(taken) => taken,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.core.waiting = Wait::Writable;
                    self.core.stats.would_block += 1;
                    return Ok(accepted);
                }
                Err(error) => {
                    let buf = bufs.pop_front().expect("n >= 2 buffers offered");
                    return Err(SendError::Io { buf, error });
                }
            };
            accepted += self.gathered(sock, bufs, taken, now, out);
        }
    }

    /// A gathered write took `taken` bytes from the front of `bufs`: releases the buffers it
    /// took whole and finishes the one it cut; returns how many buffers it took (whole or cut).
    #[inline]
    fn gathered(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        mut taken: usize,
        now: Option<Instant>,
        out: &mut Vec<Released<B>>,
    ) -> usize {
        let core = &mut self.core;
        core.stats.bytes += taken as u64;
        core.waiting = Wait::Nothing;
        let path = policy::release_path(false, None, false);
        let mut accepted = 0;
        while taken > 0 {
            let buf = bufs
                .pop_front()
                .expect("the kernel took no more than offered");
            let len = buf.as_bytes().len();
            let started = core.latency.next_at(now);
            core.stats.sends += 1;
            accepted += 1;
            if taken >= len {
                taken -= len;
                Record::release_whole(buf, path, started, &mut core.stats, out);
            } else {
                core.finish_partial(sock, buf, taken, None, started, None, out);
                taken = 0;
            }
        }
        accepted
    }
}

impl<B: SendBuf> Engine<B> for CopyEngine<B> {
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        let buf = plain_send(sock, buf)?;
        sys::fenced!(self.send_one(sock, buf, dest, out))
    }

    fn try_send_batch(
        &mut self,
        sock: &Socket,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        plain_batch(sock, bufs)?;
        sys::fenced!(self.send_batch_now(sock, bufs, out))
    }

    fn try_send_train(
        &mut self,
        sock: &Socket,
        buf: B,
        segment: u16,
        dest: Option<SockAddr>,
        out: &mut Vec<Released<B>>,
    ) -> Result<(), SendError<B>> {
        sys::fenced!(self.send_train(sock, buf, segment, dest, out))
    }

    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        // The queue holds no completions here, only what keeps POLLERR up: read less often.
        self.quiet += 1;
        if rules::copy_reaps(self.quiet) {
            self.quiet = 0;
            self.core.reap(sock, out);
        }
        self.core.push_head(sock, out);
        Ok(())
    }

    fn readiness(&mut self, sock: &Socket, retry: bool) -> Readiness {
        // The caller is about to sleep on POLLERR: read what would wake it for nothing. A copy
        // sender has no completions, so nothing is released here.
        let mut none = Vec::new();
        self.quiet = 0;
        self.core.reap(sock, &mut none);
        debug_assert!(none.is_empty(), "a copy sender released on a completion");
        self.core.readiness(sock, retry)
    }

    answered_by_core!();
}
