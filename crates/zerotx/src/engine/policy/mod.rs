//! Every decision about *how* a buffer goes, in one place, pure: no system calls, no clocks.
//! The engines ask; the kernel's answers come in as arguments. Property tests (below) hold the
//! rules every engine relies on: a budget refusal never spins and never waits with nothing in
//! flight that could free room.
//!
//! - [`release_path`]: what a released buffer reports (zero-copy, or copied and by whom).
//! - [`on_budget_refusal`]: after `ENOBUFS` (`MSG_ZEROCOPY`: option memory, locked memory) or
//!   `ENOMEM` (io_uring: locked memory; vsock: its completion allocation): retry, wait for
//!   completions, or send this one by copy.
//! - [`unfragmented_mode`]: the path-MTU discovery mode that makes the kernel refuse, rather than
//!   fragment, a zero-copy datagram too large for its path.
//! - [`zerocopy_call_len`]: how many bytes one zero-copy call may carry (vsock: one packet).
//! - [`fixed_buffer`] and [`batch_fits`]: when io_uring sends from registered memory, and how
//!   many buffers one request may pin.
//! - [`write_now`]: when `auto` on io_uring writes a copy with `sendmsg(2)` instead of a request.
//! - [`auto`]: the `auto` engine's per-send choice between zero-copy and copy, from what the
//!   kernel reports.

pub(crate) mod auto;
pub(crate) mod sendmsg;
pub(crate) mod train;

use crate::report::{CopyReason, SendPath};

/// What a released buffer reports: a copy engine copies; a zero-copy engine's buffer was copied by
/// zerotx's choice (`chosen`: after the budget refused it, or `auto`'s rules), or by the kernel
/// (`kernel_copied`), or went zero-copy.
pub(crate) fn release_path(
    zerocopy_engine: bool,
    chosen: Option<CopyReason>,
    kernel_copied: bool,
) -> SendPath {
    if !zerocopy_engine {
        SendPath::Copied(CopyReason::Engine)
    } else if let Some(reason) = chosen {
        SendPath::Copied(reason)
    } else if kernel_copied {
        SendPath::Copied(CopyReason::Kernel)
    } else {
        SendPath::ZeroCopy
    }
}

/// What the engine knows right after the zero-copy budget refused a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Room came back since the refusal (the error queue read right after it completed some of
    /// this sender's ids): trying again can succeed.
    pub(crate) freed: bool,
    /// Something of this sender's is in flight whose completion would free enough room.
    pub(crate) may_free: bool,
}

/// The answer to a [`Refusal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BudgetAction {
    /// Send again zero-copy now.
    Retry,
    /// Wait for this sender's completions, then send again.
    Wait,
    /// Send this buffer by copy (a fallback).
    Copy,
}

/// Retry only after room came back (so a retry is paid for by a completion: no spin), wait only
/// for something in flight that can free room (no wait that nothing ends), copy otherwise.
pub(crate) fn on_budget_refusal(r: Refusal) -> BudgetAction {
    if r.freed {
        BudgetAction::Retry
    } else if r.may_free {
        BudgetAction::Wait
    } else {
        BudgetAction::Copy
    }
}

/// The `IP_MTU_DISCOVER` / `IPV6_MTU_DISCOVER` mode a zero-copy datagram socket sends under, given
/// the caller's `mode`, or `None` to keep it: one under which the kernel refuses a datagram too
/// large for its path with `EMSGSIZE` before it takes a zero-copy id, instead of fragmenting it.
///
/// A fragmented zero-copy datagram is never safe: every fragment holds the id's pages, so a qdisc
/// that drops a later fragment fails the call while an earlier one still waits to be sent, and
/// its completion comes whenever that fragment is freed (docs/kernel.md, "UDP and the path MTU"). The
/// kernel fragments under `DONT`, `WANT` (the default) and `OMIT` (`ip_sk_ignore_df`,
/// `ip6_sk_ignore_df`) and refuses under `DO`, `PROBE` and `INTERFACE`; IPv4 and IPv6 number
/// their modes alike. `WANT` becomes `DO`, which sets DF as `WANT` does on a datagram that fits;
/// `DONT` and `OMIT`, which never set DF, become `INTERFACE`, which does not either. A datagram
/// that needs fragmenting then goes by copy under the caller's own mode.
pub(crate) fn unfragmented_mode(mode: i32) -> Option<i32> {
    match mode {
        libc::IP_PMTUDISC_WANT => Some(libc::IP_PMTUDISC_DO),
        libc::IP_PMTUDISC_DONT | libc::IP_PMTUDISC_OMIT => Some(libc::IP_PMTUDISC_INTERFACE),
        _ => None,
    }
}

/// The largest vsock zero-copy call: one virtio-vsock packet (`VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`),
/// which the kernel sends whole with one id or refuses whole.
pub(crate) const VSOCK_ZC_MAX: usize = 64 * 1024;

/// How many of `left` bytes one zero-copy call carries: all of them, but one packet on vsock (a
/// larger call that fails part way took no id for the packets it sent).
pub(crate) fn zerocopy_call_len(vsock: bool, left: usize) -> usize {
    if vsock {
        left.min(VSOCK_ZC_MAX)
    } else {
        left
    }
}

/// Smallest buffer a byte stream sends alone from registered memory.
pub(crate) const FIXED_STREAM_MIN: usize = 64 * 1024;

/// Whether a buffer of `len` bytes that lies in registered memory goes as its own `SEND_ZC` with
/// `IORING_RECVSEND_FIXED_BUF`. Datagrams always do. On a byte stream only large buffers: one
/// request carries one registered buffer, and with one request in flight small ones are faster
/// batched into a `SENDMSG_ZC` iovec (benches/HISTORY.md, "io_uring stream requests").
pub(crate) fn fixed_buffer(len: usize, byte_stream: bool) -> bool {
    !byte_stream || len >= FIXED_STREAM_MIN
}

/// The most bytes one io_uring byte-stream request gathers from queued buffers (one buffer larger
/// than this still goes whole). Its buffers come back only when the whole request went, so a
/// larger request holds them longer than the socket needs them (benches/HISTORY.md, "io_uring
/// stream requests").
pub(crate) const MAX_STREAM_REQUEST: usize = 2 << 20;

/// Buffers smaller than this, when `auto` copies them on a byte stream with nothing of the stream
/// in the kernel's hands, go by one gathered `sendmsg(2)` rather than an io_uring request.
pub(crate) const WRITE_NOW_BELOW: usize = 16 * 1024;

/// Whether `auto` on io_uring copies a byte stream's front run of buffers, the first `len` bytes
/// long, with `sendmsg(2)` at once (the `copy` engine's gathered write) rather than a request.
/// Small sends pay a request's fixed cost per few bytes (io_uring copies in the msghdr and iovec,
/// allocates, posts a CQE; the engine keeps a record). From 16 KiB the request wins: it waits for
/// room in the kernel (`MSG_WAITALL`), where a write returns short and the rest needs a request
/// anyway (docs/fast-path.md; benches/HISTORY.md, "`auto` at small stream sends").
pub(crate) fn write_now(len: usize) -> bool {
    len < WRITE_NOW_BELOW
}

/// Whether a request that would pin `charge` bytes may grow to it: as much as half the
/// locked-memory `limit` lets two requests pin at once (`None`: no limit).
pub(crate) fn batch_fits(charge: usize, limit: Option<usize>) -> bool {
    limit.map_or(true, |l| charge <= l / 2)
}

/// Whether a request that would pin `charge` bytes could ever be accepted under `limit`: io_uring
/// refuses (`ENOMEM`) one larger than `RLIMIT_MEMLOCK` however long one waits.
pub(crate) fn may_pin(charge: usize, limit: Option<usize>) -> bool {
    limit.map_or(true, |l| charge <= l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A zero-copy budget of `room` slots and a sender that follows [`on_budget_refusal`]; each
    /// step the kernel completes some in-flight sends (scripted). Returns the steps each send took
    /// and whether the sender ever waited with nothing in flight.
    fn run(room: usize, sends: usize, completions: &[usize]) -> (Vec<usize>, bool) {
        let mut in_flight = 0usize;
        let mut steps = Vec::new();
        let mut waited_on_nothing = false;
        let mut script = completions.iter().cycle();
        for _ in 0..sends {
            let mut n = 0;
            loop {
                n += 1;
                assert!(
                    n < 10_000,
                    "a send never finished: it spins or waits forever"
                );
                if in_flight < room {
                    in_flight += 1;
                    break;
                }
                // Refused. The error-queue read right after frees what the kernel completed.
                let done = (*script.next().unwrap_or(&0)).min(in_flight);
                in_flight -= done;
                match on_budget_refusal(Refusal {
                    freed: done > 0,
                    may_free: in_flight > 0,
                }) {
                    BudgetAction::Retry => continue,
                    BudgetAction::Wait => {
                        waited_on_nothing |= in_flight == 0;
                        // A wait ends when a completion comes: the kernel finishes at least one.
                        in_flight -= 1;
                    }
                    BudgetAction::Copy => break,
                }
            }
            steps.push(n);
        }
        (steps, waited_on_nothing)
    }

    proptest! {
        /// Whatever the budget and whenever completions come, every send ends within a bounded
        /// number of refusals, and no wait is for nothing.
        #[test]
        fn a_refusal_never_spins_and_never_waits_for_nothing(
            room in 0usize..8,
            sends in 1usize..200,
            completions in proptest::collection::vec(0usize..4, 1..16),
        ) {
            let (steps, waited_on_nothing) = run(room, sends, &completions);
            prop_assert!(!waited_on_nothing);
            // A refusal is followed by a retry only after a completion, and by a wait only when
            // one can come: each send takes at most one attempt per send in flight, plus two.
            for s in steps {
                prop_assert!(s <= room + 2, "{s} attempts with room {room}");
            }
        }

        #[test]
        fn the_decision_is_the_documented_one(freed: bool, may_free: bool) {
            let a = on_budget_refusal(Refusal { freed, may_free });
            prop_assert_eq!(a == BudgetAction::Retry, freed);
            prop_assert!(a != BudgetAction::Wait || may_free);
            prop_assert!(a != BudgetAction::Copy || (!freed && !may_free));
        }

        #[test]
        fn a_vsock_call_is_at_most_one_packet(left in 1usize..(1 << 24), vsock: bool) {
            let n = zerocopy_call_len(vsock, left);
            prop_assert!(n >= 1 && n <= left);
            prop_assert!(!vsock || n <= VSOCK_ZC_MAX);
            prop_assert!(vsock || n == left);
        }

        #[test]
        fn pinning_limits_are_monotonic(charge in 0usize..(1 << 30), limit in proptest::option::of(0usize..(1 << 30))) {
            // A request that may grow to `charge` can always be pinned at all.
            prop_assert!(!batch_fits(charge, limit) || may_pin(charge, limit));
            prop_assert!(limit.is_some() || (batch_fits(charge, limit) && may_pin(charge, limit)));
        }
    }

    /// Every mode the kernel knows ends as one that refuses to fragment; IPv6 numbers them as
    /// IPv4 does.
    #[test]
    fn zero_copy_datagrams_go_under_a_mode_that_never_fragments() {
        let refuses = [
            libc::IP_PMTUDISC_DO,
            libc::IP_PMTUDISC_PROBE,
            libc::IP_PMTUDISC_INTERFACE,
        ];
        for mode in 0..=5 {
            let ours = unfragmented_mode(mode).unwrap_or(mode);
            assert!(refuses.contains(&ours), "mode {mode} -> {ours}");
            assert_eq!(unfragmented_mode(mode).is_none(), refuses.contains(&mode));
        }
        assert_eq!(
            unfragmented_mode(libc::IP_PMTUDISC_WANT),
            Some(libc::IP_PMTUDISC_DO)
        );
        assert_eq!(
            (
                libc::IPV6_PMTUDISC_WANT,
                libc::IPV6_PMTUDISC_DO,
                libc::IPV6_PMTUDISC_INTERFACE
            ),
            (
                libc::IP_PMTUDISC_WANT,
                libc::IP_PMTUDISC_DO,
                libc::IP_PMTUDISC_INTERFACE
            )
        );
    }

    #[test]
    fn release_paths() {
        use CopyReason::*;
        assert_eq!(
            release_path(false, Some(Fallback), true),
            SendPath::Copied(Engine)
        );
        assert_eq!(
            release_path(true, Some(Fallback), true),
            SendPath::Copied(Fallback)
        );
        assert_eq!(
            release_path(true, Some(Small), true),
            SendPath::Copied(Small)
        );
        assert_eq!(release_path(true, None, true), SendPath::Copied(Kernel));
        assert_eq!(release_path(true, None, false), SendPath::ZeroCopy);
    }

    #[test]
    fn only_large_registered_buffers_go_alone_on_a_byte_stream() {
        assert!(fixed_buffer(1472, false));
        assert!(!fixed_buffer(FIXED_STREAM_MIN - 1, true));
        assert!(fixed_buffer(FIXED_STREAM_MIN, true));
    }
}
