//! The `sendmsg(2)` engines: `copy` and `msg-zc` (`MSG_ZEROCOPY`).
//!
//! One implementation serves both because the only differences are the flag, the ids it takes and
//! the error queue it must read. A buffer's life:
//! 1. `try_send` inserts it into the [`Ledger`] and calls `sendmsg` until it is fully queued or the
//!    socket is full. Each successful zero-copy call takes the next id. A stream socket may take
//!    part of the buffer; the rest becomes the *head*, pushed first by later calls, so the byte
//!    stream keeps the caller's order.
//! 2. `ENOBUFS` (option memory or locked memory) makes the engine read completions and retry; with
//!    nothing in flight to wait for, the rest of that buffer goes by copy (a *fallback*), so the
//!    engine never spins and never waits for something that cannot come.
//! 3. The error queue is read without blocking; completion ranges go to the ledger, which returns
//!    buffers whose every id completed. Copy sends release at once.

use std::io::{self, IoSlice};
use std::time::Instant;

use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::cmsg::{self, ErrQueueMsg};
use crate::engine::Engine;
use crate::error::SendError;
use crate::ledger::{Ledger, Settled, SlotId};
use crate::report::{Path, Readiness, Released, Report, Stats};
use crate::socket::{Family, Socket};
use crate::sys;

/// Room for several messages' worth of control data; a completion needs 48 bytes.
const CONTROL_LEN: usize = 512;

struct Record<B> {
    buf: B,
    dest: Option<SockAddr>,
    sent: usize,
    fallback: bool,
    error: Option<io::Error>,
    started: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Nothing,
    Writable,
    Completions,
}

pub(crate) struct SendmsgEngine<B> {
    zerocopy: bool,
    ledger: Ledger<Record<B>>,
    head: Option<SlotId>,
    ready: Vec<Released<B>>,
    waiting: Wait,
    stats: Stats,
    control: Vec<u8>,
    msgs: Vec<ErrQueueMsg>,
    settled: Vec<Settled<Record<B>>>,
}

impl<B: SendBuf> SendmsgEngine<B> {
    /// `zerocopy` must only be set once `SO_ZEROCOPY` was accepted on `sock`.
    pub(crate) fn new(sock: &Socket, zerocopy: bool) -> Self {
        let mut ledger = Ledger::new(0);
        // vsock may give one call several ids (KERNEL.md); the ledger resynchronises from ranges.
        ledger.set_multi_id_calls(sock.kind.family == Family::Vsock);
        Self {
            zerocopy,
            ledger,
            head: None,
            ready: Vec::new(),
            waiting: Wait::Nothing,
            stats: Stats::default(),
            control: vec![0; CONTROL_LEN],
            msgs: Vec::new(),
            settled: Vec::new(),
        }
    }

    /// Sends from the record's offset until it is fully queued or the socket pushes back.
    fn write(&mut self, sock: &Socket, slot: SlotId) -> io::Result<Wait> {
        loop {
            let rec = self.ledger.item(slot);
            let rest = &rec.buf.as_bytes()[rec.sent..];
            if rest.is_empty() {
                return Ok(Wait::Nothing);
            }
            let zc = self.zerocopy && !rec.fallback;
            let flags = if zc { sys::MSG_ZEROCOPY } else { 0 };
            self.stats.syscalls += 1;
            match sys::sendmsg(sock.fd(), &[IoSlice::new(rest)], rec.dest.as_ref(), flags) {
                Ok(n) => {
                    if zc {
                        self.ledger.record_id(slot);
                    }
                    self.stats.bytes += n as u64;
                    let rec = self.ledger.item_mut(slot);
                    rec.sent += n;
                    if !sock.kind.is_stream() {
                        // Datagrams go whole or not at all.
                        rec.sent = rec.buf.as_bytes().len();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Wait::Writable),
                Err(e) if zc && e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.stats.enobufs += 1;
                    if self.reap_errqueue(sock)? > 0 {
                        continue;
                    }
                    if self.ledger.ids_in_flight() == 0 {
                        self.ledger.item_mut(slot).fallback = true;
                        continue;
                    }
                    return Ok(Wait::Completions);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads the error queue dry; returns how many ids completed.
    fn reap_errqueue(&mut self, sock: &Socket) -> io::Result<u64> {
        let mut ids = 0;
        while let Some(read) = sys::recv_errqueue(sock.fd(), &mut self.control)? {
            self.msgs.clear();
            if cmsg::decode(&self.control[..read.control_len], &mut self.msgs).is_err() {
                self.stats.bad_completions += 1;
            }
            for msg in self.msgs.drain(..) {
                match msg {
                    ErrQueueMsg::Zerocopy(range) => {
                        self.stats.completions += 1;
                        match self.ledger.complete(range, &mut self.settled) {
                            Ok(n) => ids += n,
                            Err(_) => self.stats.bad_completions += 1,
                        }
                    }
                    ErrQueueMsg::Other { .. } => self.stats.skipped_messages += 1,
                }
            }
        }
        let mut settled = std::mem::take(&mut self.settled);
        for s in settled.drain(..) {
            let released = self.release(s);
            self.ready.push(released);
        }
        self.settled = settled;
        Ok(ids)
    }

    fn release(&mut self, s: Settled<Record<B>>) -> Released<B> {
        let rec = s.item;
        let path = Path::of_release(self.zerocopy, rec.fallback, s.kernel_copied);
        self.stats.count_release(path, rec.error.is_some());
        Released {
            buf: rec.buf,
            report: Report {
                bytes: rec.sent,
                path,
                latency: rec.started.elapsed(),
                error: rec.error,
            },
        }
    }

    /// No more sends for `slot`: release it now if no id is pending.
    fn seal(&mut self, slot: SlotId) {
        if let Some(s) = self.ledger.seal(slot) {
            let released = self.release(s);
            self.ready.push(released);
        }
    }

    /// Gives back a buffer that took no id and no byte; `None` if the kernel holds part of it.
    fn abandon(&mut self, slot: SlotId) -> Option<B> {
        self.ledger.seal(slot).map(|s| s.item.buf)
    }

    fn push_head(&mut self, sock: &Socket) {
        let Some(slot) = self.head else { return };
        match self.write(sock, slot) {
            Ok(Wait::Nothing) => {
                self.head = None;
                self.waiting = Wait::Nothing;
                self.seal(slot);
            }
            Ok(wait) => self.waiting = wait,
            Err(e) => {
                self.head = None;
                self.waiting = Wait::Nothing;
                self.ledger.item_mut(slot).error = Some(e);
                self.seal(slot);
            }
        }
    }
}

impl<B: SendBuf> Engine<B> for SendmsgEngine<B> {
    fn try_send(
        &mut self,
        sock: &Socket,
        buf: B,
        dest: Option<SockAddr>,
    ) -> Result<(), SendError<B>> {
        if self.head.is_some() {
            self.push_head(sock);
            if self.head.is_some() {
                self.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
        }
        let slot = self.ledger.insert(Record {
            buf,
            dest,
            sent: 0,
            fallback: false,
            error: None,
            started: Instant::now(),
        });
        let result = self.write(sock, slot);
        let sent = self.ledger.item(slot).sent;
        match result {
            Ok(Wait::Nothing) => {
                self.waiting = Wait::Nothing;
                self.stats.sends += 1;
                self.seal(slot);
                Ok(())
            }
            Ok(wait) => {
                self.waiting = wait;
                if sent == 0 {
                    if let Some(buf) = self.abandon(slot) {
                        self.stats.would_block += 1;
                        return Err(SendError::WouldBlock(buf));
                    }
                }
                self.stats.sends += 1;
                self.head = Some(slot);
                Ok(())
            }
            Err(error) => {
                if sent == 0 {
                    if let Some(buf) = self.abandon(slot) {
                        return Err(SendError::Io { buf, error });
                    }
                }
                // Part of it is in the kernel: report the error with the release.
                self.stats.sends += 1;
                self.ledger.item_mut(slot).error = Some(error);
                self.seal(slot);
                Ok(())
            }
        }
    }

    fn progress(&mut self, sock: &Socket, out: &mut Vec<Released<B>>) -> io::Result<()> {
        // No id in flight, no completion to read: spare the recvmsg.
        if self.zerocopy && self.ledger.ids_in_flight() > 0 {
            self.reap_errqueue(sock)?;
        }
        self.push_head(sock);
        out.append(&mut self.ready);
        Ok(())
    }

    fn held(&self) -> usize {
        self.ledger.held() + self.ready.len()
    }

    fn readiness(&mut self, sock: &Socket) -> Readiness {
        use std::os::fd::AsRawFd;
        // POLLOUT only while blocked on room; otherwise only completions (POLLERR) can help.
        let events = match self.waiting {
            Wait::Writable => libc::POLLOUT,
            Wait::Completions | Wait::Nothing => 0,
        };
        Readiness {
            fd: sock.fd().as_raw_fd(),
            events,
        }
    }

    fn stats(&self) -> Stats {
        self.stats
    }

    fn shutdown(&mut self, out: &mut Vec<Released<B>>) -> Vec<B> {
        if let Some(slot) = self.head.take() {
            self.ledger.item_mut(slot).error = Some(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "sender closed before the rest of the buffer was sent",
            ));
            self.seal(slot);
        }
        out.append(&mut self.ready);
        self.ledger.take_all().into_iter().map(|r| r.buf).collect()
    }
}
