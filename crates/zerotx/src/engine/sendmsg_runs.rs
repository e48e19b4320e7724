//! A batch's runs of equal-size datagrams as trains (issue: datagram trains without building
//! them), on the `sendmsg(2)` engines: [`send_run`] sends the run at the front of a batch as one
//! UDP GSO call, one iovec per buffer, whose one record owns every buffer of the run (one id under
//! `MSG_ZEROCOPY`); a run the kernel refused goes one datagram per call, as if there were no
//! trains. Where runs are looked for, and within what: [`BatchRuns`](super::sendmsg_train::BatchRuns).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::time::Instant;

use smallvec::SmallVec;
use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::policy::train::{self as trains, Train, TrainFailure};
use crate::engine::record::Record;
use crate::engine::sendmsg_core::{SendmsgCore, Wait};
use crate::report::{CopyReason, Released};
use crate::socket::Socket;
use crate::sys;

/// How a run goes: by copy (for `reason` on a zero-copy engine; `None` on `copy`), or
/// zero-copy under one id (`probe`: `auto` probes a route that copied).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RunMode {
    Copy(Option<CopyReason>),
    ZeroCopy { probe: bool },
}

/// What [`send_run`] did with the buffer it was given.
pub(crate) enum RunSent<B> {
    /// The run went as one train: this many buffers, released (copy) or held under its id.
    Sent(usize),
    /// No train: `buf` back, and this many buffers from it on go one datagram per call (1: it
    /// starts no run; more: the kernel refused the run's train, and nothing of it went).
    Alone(B, usize),
    /// The socket is full (or `auto` waits for completions): `buf` is back at the front of the
    /// batch.
    Full,
    /// The kernel dropped the train whole (a netfilter drop's `EPERM`, a qdisc's `ENOBUFS`, a
    /// pending socket error): nothing of it went, `buf` (its first) fails with the error, and
    /// the rest of the run stays at the front of the batch.
    Failed(B, io::Error),
}

/// Sends `buf` and the buffers after it at the front of `bufs` as one train, if they make a run
/// ([`BatchRuns::run`](super::sendmsg_train::BatchRuns::run)), as `mode` says for the run's
/// zero-copy bytes (what of the run one zero-copy train carries: its pages must fit one skb's
/// fragments, [`trains::zerocopy_run_len`]; `None`: wait for completions, the buffer back at the
/// front): one `sendmsg` with one iovec per buffer and `UDP_SEGMENT` set to the
/// run's size, `MSG_ZEROCOPY` under [`RunMode::ZeroCopy`]. The run's record is made after the
/// call, from lengths read before it (nothing asks a buffer for its bytes between a call that
/// took an id and the record of that id): one record owns every buffer of the run, under the
/// one id, released together after its completion.
///
/// A train the kernel refused sent nothing (docs/kernel.md, "UDP GSO trains"), and a zero-copy id
/// it took is left unowned ([`SendmsgCore::learn_failed_id`]). Dropped whole (a netfilter drop's
/// `EPERM`, a qdisc's `ENOBUFS`, a pending socket error), the run fails as its first datagram:
/// that buffer comes back in the error and the rest stay queued, the batch's rule, without a
/// second chance at the drop. Refused as a train (`EIO` where the path cannot checksum GSO, a
/// segment above a path MTU that dropped, the zero-copy budget), its buffers go one datagram
/// per call; `EIO` is remembered for the path (`SendmsgCore::splits`), so later runs go so at
/// once.
///
/// Out of line (the cold branch of a batch loop), so it fills the return stack before its own
/// return (docs/fast-path.md, "The return-stack fill").
#[inline(never)]
pub(crate) fn send_run<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    sock: &Socket,
    buf: B,
    bufs: &mut VecDeque<B>,
    mode: impl FnOnce(&mut SendmsgCore<B>, usize) -> Option<RunMode>,
    out: &mut Vec<Released<B>>,
) -> RunSent<B> {
    sys::fenced!('run: {
        let lens =
            std::iter::once(buf.as_bytes().len()).chain(bufs.iter().map(|b| b.as_bytes().len()));
        let Some((count, segment)) = core.runs.run(sock, &core.splits, lens) else {
            break 'run RunSent::Alone(buf, 1);
        };
        let run = || std::iter::once(&buf).chain(bufs.iter().take(count - 1));
        // What of the run one zero-copy call can carry: its pages must fit the skb's fragments.
        let zc_count = trains::zerocopy_run_len(run().map(|b| {
            let s = b.as_bytes();
            (s.as_ptr() as usize, s.len())
        }));
        let zc_bytes = run().take(zc_count).map(|b| b.as_bytes().len()).sum();
        let Some(mode) = mode(core, zc_bytes) else {
            // `auto` waits for completions, as it would for any send.
            bufs.push_front(buf);
            core.waiting = Wait::Completions;
            core.stats.would_block += 1;
            break 'run RunSent::Full;
        };
        let zerocopy = matches!(mode, RunMode::ZeroCopy { .. });
        let count = if zerocopy { zc_count } else { count };
        if count < 2 {
            break 'run RunSent::Alone(buf, 1);
        }
        let flags = if zerocopy { sys::MSG_ZEROCOPY } else { 0 };
        let mut lens: SmallVec<[usize; 64]> = SmallVec::new();
        let result = {
            let slices: SmallVec<[IoSlice<'_>; 64]> = std::iter::once(&buf)
                .chain(bufs.iter().take(count - 1))
                .map(|b| IoSlice::new(b.as_bytes()))
                .collect();
            lens.extend(slices.iter().map(|s| s.len()));
            let started = core.latency.next();
            core.stats.syscalls += 1;
            sys::train::send_train_gather(sock.fd(), &slices, segment, None, flags)
                .map(|n| (n, started))
        };
        match result {
            Ok((n, started)) => {
                let rec = run_record(buf, bufs, &lens, segment, started);
                run_went(core, rec, n, mode, out);
                RunSent::Sent(count)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                bufs.push_front(buf);
                core.waiting = Wait::Writable;
                core.stats.would_block += 1;
                RunSent::Full
            }
            Err(e) => run_refused(core, sock, buf, count, e, zerocopy, out),
        }
    })
}

/// A run's train call took `n` bytes: `rec` (every buffer of the run) is released at once when
/// copied, or held under the one id the call took until it completes.
fn run_went<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    mut rec: Record<B>,
    n: usize,
    mode: RunMode,
    out: &mut Vec<Released<B>>,
) {
    let count = rec.bufs.len() as u64;
    core.stats.bytes += n as u64;
    core.stats.sends += count;
    core.stats.trains += 1;
    core.stats.batch_train_buffers += count;
    core.waiting = Wait::Nothing;
    match mode {
        RunMode::Copy(reason) => {
            rec.copy = reason;
            rec.release(core.settle.zerocopy, &mut core.stats, out);
        }
        RunMode::ZeroCopy { probe } => {
            let slot = core.insert_charged(rec, probe);
            core.ledger.record_id(slot);
            core.stats.zerocopy_ids += 1;
            if let Some(auto) = &mut core.settle.auto {
                auto.on_accepted();
            }
            core.seal(slot, out);
        }
    }
}

/// The kernel refused the train of a run of `count` buffers from `buf` with `e` (nothing of it
/// went; a zero-copy call may have taken an id, left unowned): fails as its first datagram when
/// dropped whole, else its buffers go one datagram per call (see [`send_run`]).
fn run_refused<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    sock: &Socket,
    buf: B,
    count: usize,
    e: io::Error,
    zerocopy: bool,
    out: &mut Vec<Released<B>>,
) -> RunSent<B> {
    let took_id = zerocopy && core.learn_failed_id(sock, out).0;
    match trains::on_failure(e.raw_os_error(), took_id) {
        TrainFailure::Split => {
            core.splits.refused(None);
            core.stats.train_splits += 1;
        }
        TrainFailure::Fail(Some(_)) => core.runs.forget_mtu(),
        TrainFailure::Budget => {}
        // Dropped whole: the run fails as its first datagram, the rest stay queued.
        TrainFailure::Fail(None) => return RunSent::Failed(buf, e),
    }
    RunSent::Alone(buf, count)
}

/// The record of a run that went: `buf` and the next `lens.len() - 1` buffers of `bufs`, of
/// those lengths (read before the call), as one train of `segment`-byte datagrams.
fn run_record<B: SendBuf>(
    buf: B,
    bufs: &mut VecDeque<B>,
    lens: &[usize],
    segment: u16,
    started: Option<Instant>,
) -> Record<B> {
    let mut rec = Record::of_len(buf, lens[0], None::<Box<SockAddr>>, started);
    for &len in &lens[1..] {
        let b = bufs
            .pop_front()
            .expect("the run's buffers are at the front");
        rec.bufs.push(b);
        rec.total += len;
    }
    rec.sent = rec.total;
    rec.train = Some(Train::new(segment));
    rec
}
