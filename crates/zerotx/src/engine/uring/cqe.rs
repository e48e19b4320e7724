//! What follows a request's CQEs, as pure functions: the CQE's `res` and the request's record
//! ([`Req`]) in, the next step ([`Then`]) and the record's new account out. The engine applies
//! their answers (releases, pushes, the budget's bookkeeping); nothing here touches a ring.

use crate::config::AtCap;
use crate::engine::policy::{self, BudgetAction, Refusal};
use crate::report::CopyReason;

/// Resubmissions of a cancelled request that sent nothing before its record fails (an `EFAULT`
/// is resubmitted once: see [`after_first`]).
pub(super) const MAX_RESUBMITS: u32 = 8;

/// What follows a request, decided at its first CQE ([`after_first`]) and carried out when its
/// last CQE hands the record back ([`at_last`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// The record went whole: release it.
    Done,
    /// `MSG_WAITALL` stopped short (its thread exited, measured on 6.18): go on from there.
    Continue,
    /// The zero-copy budget refused it (`ENOMEM`): wait for pinned pages, or copy.
    Budget,
    /// The thread that submitted it exited and the kernel cancelled it: submit it again.
    Resubmit,
    /// It failed with this errno: release the record with the error.
    Fail(i32),
}

/// What the engine knows of one request in the ring, kept in the request's own box
/// ([`SendOp::meta`](crate::sys::uring::SendOp)), which the ring lends the engine with each CQE.
/// Invariant: `pinned > 0` only if `charged` and the first CQE said bytes went, and then the
/// engine's [`Budget`](super::engine) counts it until the last CQE.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Req {
    /// Sent zero-copy (`SENDMSG_ZC`/`SEND_ZC`).
    pub(super) zc: bool,
    /// Zero-copy from user memory: io_uring charges its pages to `RLIMIT_MEMLOCK` (a registered
    /// buffer's pages were charged once, at registration).
    pub(super) charged: bool,
    /// Bytes it carries: the record's unsent bytes when it was pushed.
    pub(super) len: usize,
    /// What io_uring charged for the pages it pinned, once its first CQE said it sent; they come
    /// back with its notification.
    pub(super) pinned: usize,
    /// The first CQE's `res` and what follows, once it came.
    pub(super) first: Option<(i32, Then)>,
    /// The notification said the kernel copied.
    pub(super) copied: bool,
    /// Resubmissions of its record after a cancel that sent nothing, in a row.
    pub(super) resubmits: u32,
}

/// What follows a request whose first CQE carries `res` (bytes, or `-errno`), on a byte stream
/// (`merge`: short results are continued) or not, while the sender is `closing` or not.
pub(super) fn after_first(req: &Req, res: i32, merge: bool, closing: bool) -> Then {
    if res >= 0 {
        let n = res as usize;
        return if !merge || n >= req.len {
            Then::Done // a datagram or a message goes whole
        } else if n == 0 || closing {
            Then::Fail(libc::EPIPE)
        } else {
            Then::Continue
        };
    }
    let errno = -res;
    if closing {
        Then::Fail(errno)
    } else if req.zc && errno == libc::ENOMEM {
        // The zero-copy budget is full: io_uring charges pinned pages to RLIMIT_MEMLOCK and
        // answers ENOMEM (not ENOBUFS: see the module docs).
        Then::Budget
    } else if errno == libc::ECANCELED && req.resubmits < MAX_RESUBMITS {
        // The thread that submitted a parked request exited: the kernel cancelled it having
        // sent nothing. The socket is fine; submit it again, from this thread.
        Then::Resubmit
    } else if errno == libc::EFAULT && req.resubmits == 0 {
        // Some kernels report that cancel as EFAULT, which also means memory the kernel could
        // not read (a truncated file mapping): submitted again once, from this thread, which is
        // alive; a second EFAULT is the memory's, and final.
        Then::Resubmit
    } else {
        Then::Fail(errno)
    }
}

/// The step the last CQE carries out, and the first CQE's `res`: the first CQE's decision,
/// except that a closing sender ends what would go on. The ring hands a request back only after
/// its first CQE; a request without one fails with `EIO`.
pub(super) fn at_last(first: Option<(i32, Then)>, closing: bool) -> (i32, Then) {
    let (res, then) = first.unwrap_or((-libc::EIO, Then::Fail(libc::EIO)));
    let then = match then {
        Then::Continue | Then::Budget | Then::Resubmit if closing => {
            Then::Fail(if res >= 0 { libc::EPIPE } else { -res })
        }
        then => then,
    };
    (res, then)
}

/// The record's bytes sent after a request that answered `res`, of `total`: a datagram or a
/// message goes whole or not at all, a byte stream's request may stop short.
pub(super) fn sent_after(sent: usize, total: usize, res: i32, merge: bool) -> usize {
    match (res >= 0, merge) {
        (false, _) => sent,
        (true, false) => total,
        (true, true) => sent + res as usize,
    }
}

/// What a record the zero-copy budget refused does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnBudget {
    /// Wait for this sender's pinned pages to come back, then try zero-copy again.
    Wait,
    /// Go by copy now, for this reason.
    Copy(CopyReason),
}

/// What a record the budget refused does: under `auto` (`at_cap`, read after the refusal was
/// told to the policy) it copies for a while rather than wait, unless pages this sender pinned
/// will come back; otherwise it waits only if this sender's `pinned` pages could make room for
/// the `charge` it needs ([`policy::on_budget_refusal`]).
pub(super) fn on_budget(at_cap: Option<AtCap>, pinned: usize, charge: usize) -> OnBudget {
    match at_cap {
        Some(at_cap) if at_cap == AtCap::Copy || pinned == 0 => OnBudget::Copy(CopyReason::Budget),
        Some(_) => OnBudget::Wait,
        None => {
            let refusal = Refusal {
                freed: false,
                may_free: charge <= pinned,
            };
            match policy::on_budget_refusal(refusal) {
                BudgetAction::Wait => OnBudget::Wait,
                BudgetAction::Copy | BudgetAction::Retry => OnBudget::Copy(CopyReason::Fallback),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(zc: bool, len: usize, resubmits: u32) -> Req {
        Req {
            zc,
            len,
            resubmits,
            ..Req::default()
        }
    }

    /// A first CQE's `res` and the request's record in, what follows out.
    #[test]
    fn the_first_cqe_decides_what_follows() {
        use libc::{ECANCELED, EFAULT, ENOBUFS, ENOMEM, EPIPE};
        // (zc, len, resubmits, res, merge, closing) -> then
        let table = [
            // Whole, on any socket.
            ((false, 100, 0, 100, true, false), Then::Done),
            ((true, 100, 0, 100, false, false), Then::Done),
            // A datagram or message goes whole whatever `res` says.
            ((true, 100, 0, 40, false, false), Then::Done),
            // A byte stream's short result goes on, unless nothing went or the sender closes.
            ((false, 100, 0, 40, true, false), Then::Continue),
            ((false, 100, 0, 0, true, false), Then::Fail(EPIPE)),
            ((false, 100, 0, 40, true, true), Then::Fail(EPIPE)),
            // ENOMEM is the budget only for a zero-copy request.
            ((true, 100, 0, -ENOMEM, true, false), Then::Budget),
            ((false, 100, 0, -ENOMEM, true, false), Then::Fail(ENOMEM)),
            ((true, 100, 0, -ENOMEM, true, true), Then::Fail(ENOMEM)),
            // ENOBUFS is a dropped datagram's error, never the budget.
            ((true, 100, 0, -ENOBUFS, false, false), Then::Fail(ENOBUFS)),
            // A cancel that sent nothing is resubmitted up to MAX_RESUBMITS times in a row.
            ((true, 100, 0, -ECANCELED, true, false), Then::Resubmit),
            ((true, 100, 7, -ECANCELED, true, false), Then::Resubmit),
            (
                (true, 100, 8, -ECANCELED, true, false),
                Then::Fail(ECANCELED),
            ),
            (
                (true, 100, 0, -ECANCELED, true, true),
                Then::Fail(ECANCELED),
            ),
            // EFAULT once only.
            ((false, 100, 0, -EFAULT, false, false), Then::Resubmit),
            ((false, 100, 1, -EFAULT, false, false), Then::Fail(EFAULT)),
        ];
        for ((zc, len, resubmits, res, merge, closing), want) in table {
            let got = after_first(&req(zc, len, resubmits), res, merge, closing);
            assert_eq!(
                got, want,
                "zc {zc} len {len} resubmits {resubmits} res {res} merge {merge} closing {closing}"
            );
        }
    }

    /// The last CQE carries out the first's decision; a closing sender fails what would go on
    /// with the first CQE's errno (or EPIPE after bytes went); a request with no first CQE fails.
    #[test]
    fn the_last_cqe_carries_out_the_first_unless_closing() {
        use libc::{ECANCELED, EIO, ENOMEM, EPIPE};
        let table = [
            ((Some((100, Then::Done)), true), (100, Then::Done)),
            ((Some((40, Then::Continue)), false), (40, Then::Continue)),
            ((Some((40, Then::Continue)), true), (40, Then::Fail(EPIPE))),
            (
                (Some((-ENOMEM, Then::Budget)), false),
                (-ENOMEM, Then::Budget),
            ),
            (
                (Some((-ENOMEM, Then::Budget)), true),
                (-ENOMEM, Then::Fail(ENOMEM)),
            ),
            (
                (Some((-ECANCELED, Then::Resubmit)), true),
                (-ECANCELED, Then::Fail(ECANCELED)),
            ),
            (
                (Some((-EPIPE, Then::Fail(EPIPE))), false),
                (-EPIPE, Then::Fail(EPIPE)),
            ),
            ((None, false), (-EIO, Then::Fail(EIO))),
        ];
        for ((first, closing), want) in table {
            assert_eq!(at_last(first, closing), want, "{first:?} closing {closing}");
        }
    }

    /// Bytes sent: a byte stream counts `res`, a datagram or message goes whole, an error sends
    /// nothing.
    #[test]
    fn a_result_adds_to_what_the_record_sent() {
        assert_eq!(sent_after(10, 100, 40, true), 50);
        assert_eq!(sent_after(0, 100, 40, false), 100);
        assert_eq!(sent_after(10, 100, -libc::ENOMEM, true), 10);
        assert_eq!(sent_after(0, 100, -libc::EIO, false), 0);
    }

    /// A refused record waits only for pages that will come back; `auto` copies when it is at
    /// its cap's copy side or nothing of this sender is pinned.
    #[test]
    fn the_budget_refusal_waits_or_copies() {
        let copy = |r| OnBudget::Copy(r);
        let table = [
            ((None, 0, 4096), copy(CopyReason::Fallback)),
            ((None, 4096, 8192), copy(CopyReason::Fallback)),
            ((None, 8192, 4096), OnBudget::Wait),
            ((None, 4096, 4096), OnBudget::Wait),
            ((Some(AtCap::Copy), 8192, 4096), copy(CopyReason::Budget)),
            ((Some(AtCap::Wait), 0, 4096), copy(CopyReason::Budget)),
            ((Some(AtCap::Wait), 8192, 4096), OnBudget::Wait),
        ];
        for ((at_cap, pinned, charge), want) in table {
            assert_eq!(
                on_budget(at_cap, pinned, charge),
                want,
                "{at_cap:?} pinned {pinned} charge {charge}"
            );
        }
    }
}
