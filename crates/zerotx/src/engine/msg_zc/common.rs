//! What both `msg-zc` engines do alike: a lone send from `auto`'s choice to its end, the write
//! loop of one record under the socket's [`IdRule`], and the answer to a refused call. Every
//! decision is asked of [`policy::sendmsg`](rules) and [`policy::on_budget_refusal`].

use std::io;

use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::config::AtCap;
use crate::engine::clock::EpochClock;
use crate::engine::policy::auto::{Choice, Load};
use crate::engine::policy::sendmsg::{self as rules, CallId, IdRule, ZcFailure, ZcNext};
use crate::engine::policy::{self, BudgetAction, Refusal};
use crate::engine::record::Record;
use crate::engine::sendmsg_core::{send_copied, SendmsgCore, Wait};
use crate::error::SendError;
use crate::ledger::SlotId;
use crate::report::{CopyReason, Released};
use crate::socket::Socket;
use crate::sys;

/// A lone zero-copy send of `buf` once the head and a broken stream were asked about: `auto`'s
/// choice (copy it, wait, or zero-copy), then a record in the ledger written under `rule`.
#[inline(always)]
pub(crate) fn send_one<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    clock: &mut EpochClock,
    rule: IdRule,
    sock: &Socket,
    buf: B,
    dest: Option<SockAddr>,
    out: &mut Vec<Released<B>>,
) -> Result<(), SendError<B>> {
    let mut probe = false;
    if let Some(auto) = &mut core.settle.auto {
        let load = Load {
            sends: core.ledger.ids_in_flight(),
            bytes: core.settle.zc_bytes,
        };
        let choice = auto.choose(buf.as_bytes().len(), false, load);
        clock.tick(auto);
        match choice {
            Choice::Copy(reason) => return core.try_send_copy(sock, buf, dest, Some(reason), out),
            Choice::Wait => {
                core.waiting = Wait::Completions;
                core.stats.would_block += 1;
                return Err(SendError::WouldBlock(buf));
            }
            Choice::ZeroCopy { probe: p } => probe = p,
        }
    }
    let slot = insert(core, buf, dest, probe);
    let result = write(core, rule, sock, slot, out);
    finish_send(core, slot, result, out)
}

/// Puts `buf` in the ledger, in a free slot where the last settled record is; charged to
/// `auto`'s load when `auto` chose zero-copy for it. The destination is boxed first: unboxed,
/// its 128-byte `sockaddr_storage` was copied into the call even when absent.
#[inline]
fn insert<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    buf: B,
    dest: Option<SockAddr>,
    probe: bool,
) -> SlotId {
    let started = core.latency.next();
    let dest = dest.map(Box::new);
    let slot = match core.ledger.free_item() {
        Some((free, rec)) => {
            rec.refill(buf, dest, started);
            core.ledger.insert_refilled(free)
        }
        None => core.ledger.insert(Record::new(buf, dest, started)),
    };
    core.charge(slot, probe);
    slot
}

/// Sends from the record's offset until it is fully queued or the socket pushes back: zero-copy
/// calls, or by copy once the record says so.
#[inline(always)]
pub(crate) fn write<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    rule: IdRule,
    sock: &Socket,
    slot: SlotId,
    out: &mut Vec<Released<B>>,
) -> io::Result<Wait> {
    loop {
        let rec = core.ledger.item(slot);
        let left = rec.left();
        if left == 0 {
            return Ok(Wait::Nothing);
        }
        let frag = &core.frag;
        let next = rules::zc_next(rule, rec.copy.is_some(), || {
            frag.may_zerocopy(left, rec.dest.as_deref())
        });
        if next == ZcNext::CopyUnfragmented {
            // It tells `auto` nothing of the route.
            let rec = core.ledger.item_mut(slot);
            rec.kernel_copied = true;
            rec.auto_zc = false;
        }
        if next != ZcNext::ZeroCopy {
            let rec = core.ledger.item_mut(slot);
            let all = send_copied(
                &mut core.stats,
                &mut core.frag,
                &mut core.splits,
                core.stream,
                sock,
                rec,
            )?;
            return Ok(if all { Wait::Nothing } else { Wait::Writable });
        }
        let rec = core.ledger.item(slot);
        let rest = &rec.bufs[0].as_bytes()[rec.sent..];
        let len = rules::zc_call_len(rule, rest.len());
        core.stats.syscalls += 1;
        match sys::send_to(
            sock.fd(),
            &rest[..len],
            rec.dest.as_deref(),
            sys::MSG_ZEROCOPY,
        ) {
            Ok(n) => accepted(core, rule, slot, len, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Wait::Writable),
            Err(e) => {
                if let Some(wait) = refused(core, rule, sock, slot, e, out)? {
                    return Ok(wait);
                }
            }
        }
    }
}

/// A zero-copy call for `slot` took `n` of the `asked` bytes: the id it took, and the bytes.
#[inline]
fn accepted<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    rule: IdRule,
    slot: SlotId,
    asked: usize,
    n: usize,
) {
    let call_id = rules::call_id(rule, asked, n);
    match call_id {
        CallId::Owned => core.ledger.record_id(slot),
        CallId::Unowned => core.ledger.record_unowned_id(),
    };
    core.stats.zerocopy_ids += 1;
    if let Some(auto) = &mut core.settle.auto {
        auto.on_accepted();
    }
    core.stats.bytes += n as u64;
    let rec = core.ledger.item_mut(slot);
    rec.sent += n;
    // An unowned id: the call went by copy.
    rec.kernel_copied |= call_id == CallId::Unowned;
    if !core.stream {
        // Datagrams go whole or not at all.
        rec.sent = rec.total;
    }
}

/// A zero-copy call for `slot` failed with `e` (not `EAGAIN`): an error of the buffer (`Err`), a
/// wait for completions (`Ok(Some)`), or go on sending it (`Ok(None)`: retry, or by copy from now
/// on, as the record now says).
pub(crate) fn refused<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    rule: IdRule,
    sock: &Socket,
    slot: SlotId,
    e: io::Error,
    out: &mut Vec<Released<B>>,
) -> io::Result<Option<Wait>> {
    let (took_id, reaped) = if rules::failure_may_take_id(rule) {
        core.learn_failed_id(sock, out)
    } else {
        (false, 0)
    };
    match rules::zc_failure(rule, e.raw_os_error(), took_id) {
        ZcFailure::Fail => Err(e),
        ZcFailure::CopyUnfragmented => {
            let rec = core.ledger.item_mut(slot);
            core.frag.refused(rec.left(), rec.dest.as_deref());
            rec.copy_for(CopyReason::Kernel);
            rec.kernel_copied = true;
            rec.auto_zc = false;
            Ok(None)
        }
        ZcFailure::Budget => Ok(on_budget(core, sock, slot, reaped, out)),
    }
}

/// The zero-copy budget refused `slot` (`reaped` owned ids completed since): `auto` at its cap
/// copies; otherwise read completions, then retry, wait or copy (a fallback).
pub(crate) fn on_budget<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    sock: &Socket,
    slot: SlotId,
    reaped: u64,
    out: &mut Vec<Released<B>>,
) -> Option<Wait> {
    core.stats.enobufs += 1;
    if let Some(auto) = &mut core.settle.auto {
        auto.on_refusal();
        if auto.at_cap() == AtCap::Copy {
            // `auto` copies for a while rather than wait on the budget.
            core.ledger.item_mut(slot).copy_for(CopyReason::Budget);
            return None;
        }
    }
    let reaped = reaped + core.reap(sock, out);
    match policy::on_budget_refusal(Refusal {
        freed: reaped > 0,
        may_free: core.ledger.ids_in_flight() > 0,
    }) {
        BudgetAction::Retry => None,
        BudgetAction::Copy => {
            core.ledger.item_mut(slot).copy_for(CopyReason::Fallback);
            None
        }
        BudgetAction::Wait => Some(Wait::Completions),
    }
}

/// How a zero-copy send of the record in `slot` ended, `write`'s `result`, as the caller sees
/// it: accepted (sealed, released once its ids complete; or the head, if a stream took part and
/// is full), handed back (nothing went: the buffer leaves the ledger), or failed.
#[inline(always)]
pub(crate) fn finish_send<B: SendBuf>(
    core: &mut SendmsgCore<B>,
    slot: SlotId,
    result: io::Result<Wait>,
    out: &mut Vec<Released<B>>,
) -> Result<(), SendError<B>> {
    let sent = core.ledger.item(slot).sent;
    match result {
        Ok(Wait::Nothing) => {
            core.waiting = Wait::Nothing;
            core.stats.sends += 1;
            core.seal(slot, out);
            Ok(())
        }
        Ok(wait) => {
            core.waiting = wait;
            if sent == 0 {
                if let Some(buf) = core.abandon(slot) {
                    core.stats.would_block += 1;
                    return Err(SendError::WouldBlock(buf));
                }
            }
            core.stats.sends += 1;
            core.head = Some(slot);
            Ok(())
        }
        Err(error) => {
            if sent == 0 {
                if let Some(buf) = core.abandon(slot) {
                    return Err(SendError::Io { buf, error });
                }
            }
            // Part of it is in the kernel: report the error with the release.
            core.stats.sends += 1;
            core.fail_partly_sent(slot, error, out);
            Ok(())
        }
    }
}
