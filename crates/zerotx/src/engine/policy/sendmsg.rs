//! The `sendmsg(2)` engines' decisions, pure: which engine a socket gets, which calls take a
//! zero-copy id, what a refused zero-copy call becomes, and when `copy` reads its error queue.
//! The engines ([`copy`](crate::engine::copy), [`msg_zc`](crate::engine::msg_zc)) make the
//! system calls and only ask here; the kernel's answers come in as arguments.
//!
//! # Which calls take an id ([`IdRule`])
//! The kernel's per-socket counter moves differently per protocol (docs/kernel.md,
//! "MSG_ZEROCOPY (sendmsg + socket error queue)"), and the ledger must follow it exactly: one id
//! too few releases a buffer on its predecessor's completion.
//! - **Stream** (TCP, and every other stream but vsock): a call that returns bytes took exactly
//!   one id; a call that failed took none (`tcp_sendmsg_locked` hands it back on its error path).
//! - **Datagram** (UDP): `__ip_append_data` takes the id when it builds the skb and hands it back
//!   on its own errors (`EAGAIN`, `EFAULT`, ...); a later failure keeps it (`udp_send_skb`: a
//!   `UDP_SEGMENT` size check answers `EMSGSIZE`; `ip_send_skb`: a netfilter drop answers
//!   `EPERM`, a qdisc drop `ENOBUFS` when `IP_RECVERR` is set), and the skb, freed before the
//!   call returns, has already posted that id's completion. So after any failure but `EAGAIN`
//!   the engine records an unowned id, reads the error queue at once, and takes the id back if
//!   no completion covered it ([`failure_may_take_id`]). The answer also tells the two `ENOBUFS`
//!   apart: no id taken is the budget (retry or fall back); an id taken is a dropped datagram (an
//!   error for the caller, never retried into a drop that repeats). That holds for a datagram
//!   that leaves as one packet, whose skb is freed before the call returns. A fragmented one
//!   does not: fragments already queued keep the id's pages referenced after a later
//!   fragment's drop failed the call, so its completion comes late, the id would be taken back
//!   on a wrong answer, and every later buffer would be released on its predecessor's
//!   completion. So the kernel is kept from fragmenting zero-copy datagrams at all
//!   ([`Unfragmented`](crate::engine::unfragmented::Unfragmented)): a datagram too large for its
//!   path is refused with `EMSGSIZE` before the id is taken, and goes by copy, fragmented under
//!   the caller's mode. What the answer cannot see is a clone of the skb that outlives the
//!   failed call (an nftables `dup` or `TEE` before the drop): then the completion comes late
//!   and the id is taken back wrongly.
//! - **Vsock** (6.7+): one zero-copy call of at most [`VSOCK_ZC_MAX`](super::VSOCK_ZC_MAX) bytes is one packet and
//!   takes one id, or fails whole with `ENOMEM` (the budget) and takes none. Larger calls are
//!   split into packets and only the last one carries the id: when its completion cannot be
//!   allocated, 6.7-6.12 return the bytes already sent having taken no id, and the earlier
//!   packets still pin the caller's pages with nothing to say when they are free. So zero-copy
//!   calls are capped at one packet ([`zc_call_len`]). A call that returns
//!   fewer bytes than asked (the peer's credit was short) went by copy and took one id, or none
//!   if the completion could not be allocated: it gets an unowned id, the safe guess (a wrong
//!   guess releases later buffers late, never early).

use crate::socket::{Family, SockKind};

/// How a socket's zero-copy id counter moves (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdRule {
    /// A failed call took no id.
    Stream,
    /// A failed call may have taken an id, whose completion is already queued.
    Datagram,
    /// Calls capped at one packet; a short call may have taken an id.
    Vsock,
}

/// The rule a socket of `kind` follows.
pub(crate) fn id_rule(kind: SockKind) -> IdRule {
    if kind.family == Family::Vsock {
        IdRule::Vsock
    } else if kind.is_stream() {
        IdRule::Stream
    } else {
        IdRule::Datagram
    }
}

/// Which `sendmsg(2)` engine type a socket gets: chosen once, when the sender is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `copy`, whatever the socket.
    Copy,
    /// `MSG_ZEROCOPY` on a stream: a partly sent buffer becomes the head.
    ZcStream,
    /// `MSG_ZEROCOPY` on datagrams: each goes whole or not at all, under at most one id.
    ZcDatagram,
}

/// The engine for a socket of `kind`; `zerocopy` once `SO_ZEROCOPY` was accepted.
pub(crate) fn shape(kind: SockKind, zerocopy: bool) -> Shape {
    match (zerocopy, id_rule(kind)) {
        (false, _) => Shape::Copy,
        (true, IdRule::Datagram) => Shape::ZcDatagram,
        (true, IdRule::Stream | IdRule::Vsock) => Shape::ZcStream,
    }
}

/// How `copy` sends a batch ([`Engine::try_send_batch`](crate::engine::Engine::try_send_batch)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyBatch {
    /// A byte stream: a run of buffers in one gathered write.
    Gather,
    /// Datagrams: one call each, released when it returns (see [`copy`](crate::engine::copy)).
    Datagrams,
    /// A stream with message boundaries (SCTP, seqpacket): one lone send per buffer.
    EachAlone,
}

/// How `copy` sends a batch on a socket of `kind`.
pub(crate) fn copy_batch(kind: SockKind) -> CopyBatch {
    if kind.is_byte_stream() {
        CopyBatch::Gather
    } else if kind.is_stream() {
        CopyBatch::EachAlone
    } else {
        CopyBatch::Datagrams
    }
}

/// Whether a failed zero-copy call (not `EAGAIN`) may have taken an id that the engine must
/// learn from the error queue before it answers the failure.
pub(crate) fn failure_may_take_id(rule: IdRule) -> bool {
    rule == IdRule::Datagram
}

/// Who owns the id a zero-copy call that returned `sent` of `asked` bytes took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallId {
    /// The record the call sent from: released when it completes.
    Owned,
    /// Nobody (the call went by copy and may have taken one id or none): the ledger keeps the
    /// window right either way.
    Unowned,
}

/// The id a zero-copy call that returned `sent` of `asked` bytes took (see the module docs).
pub(crate) fn call_id(rule: IdRule, asked: usize, sent: usize) -> CallId {
    if rule == IdRule::Vsock && sent < asked {
        CallId::Unowned
    } else {
        CallId::Owned
    }
}

/// What a zero-copy call that failed with `errno` (not `EAGAIN`) becomes, once the engine knows
/// whether it took an id (`took_id`: only a datagram's can, [`failure_may_take_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZcFailure {
    /// A datagram too large for its path, refused before the kernel took an id: it goes by copy
    /// (fragmented, under the caller's path-MTU mode), and tells `auto` nothing.
    CopyUnfragmented,
    /// The zero-copy budget refused it (option memory, locked memory; vsock's `ENOMEM`): read
    /// completions, then retry, wait or copy ([`on_budget_refusal`](super::on_budget_refusal)).
    Budget,
    /// A datagram the stack built and then dropped (it took an id), or a real error: the
    /// buffer's error, never retried.
    Fail,
}

/// The answer to a zero-copy call that failed with `errno` (see [`ZcFailure`]).
pub(crate) fn zc_failure(rule: IdRule, errno: Option<i32>, took_id: bool) -> ZcFailure {
    if took_id {
        return ZcFailure::Fail;
    }
    match errno {
        Some(libc::EMSGSIZE) if rule == IdRule::Datagram => ZcFailure::CopyUnfragmented,
        Some(libc::ENOBUFS) => ZcFailure::Budget,
        Some(libc::ENOMEM) if rule == IdRule::Vsock => ZcFailure::Budget,
        _ => ZcFailure::Fail,
    }
}

/// How many of `left` bytes one zero-copy call carries under `rule` (vsock: one packet).
pub(crate) fn zc_call_len(rule: IdRule, left: usize) -> usize {
    super::zerocopy_call_len(rule == IdRule::Vsock, left)
}

/// Whether the next part of a record goes zero-copy: not once zerotx chose to copy it (`copied`:
/// a fallback or `auto`'s choice), and a datagram only if its path takes it whole (`fits_path`,
/// from [`Unfragmented::may_zerocopy`](crate::engine::unfragmented::Unfragmented::may_zerocopy)).
pub(crate) fn zc_next(rule: IdRule, copied: bool, fits_path: impl FnOnce() -> bool) -> ZcNext {
    if copied {
        ZcNext::Copy
    } else if rule == IdRule::Datagram && !fits_path() {
        ZcNext::CopyUnfragmented
    } else {
        ZcNext::ZeroCopy
    }
}

/// The answer of [`zc_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZcNext {
    /// One zero-copy call.
    ZeroCopy,
    /// By copy, as the record says (a fallback, or `auto`'s choice).
    Copy,
    /// By copy: a datagram too large for its path when last tried (it would be refused), or one
    /// the kernel could not be kept from fragmenting. The kernel's copy, not `auto`'s concern.
    CopyUnfragmented,
}

/// `copy` reads the error queue in one progress call in this many, and whenever the caller asks
/// for readiness (right before it sleeps, as the API asks). With nothing to complete, the queue
/// holds only what the caller's own options put there (ICMP errors with `IP_RECVERR`, TX
/// timestamps), and draining it serves only a waiter, which POLLERR would wake in a loop; an
/// empty read costs a system call (docs/fast-path.md). A caller that polls without asking for
/// readiness spins at most this many times before the queue is read.
pub(crate) const COPY_ERRQUEUE_EVERY: u32 = 16;

/// Whether `copy`'s progress call reads the error queue, `quiet` calls after the last read
/// (counting this one).
pub(crate) fn copy_reaps(quiet: u32) -> bool {
    quiet >= COPY_ERRQUEUE_EVERY
}

/// Whether reading `MSG_ERRQUEUE` on a socket of `family` reads its error queue. AF_UNIX has none
/// (its `recvmsg` ignores the flag and reads the data queue), nor has vsock before 6.7; a socket
/// that took `SO_ZEROCOPY` has one, and so do IP and packet sockets (ICMP errors, timestamps).
pub(crate) fn has_error_queue(family: Family, zerocopy: bool) -> bool {
    zerocopy || matches!(family, Family::Inet4 | Family::Inet6 | Family::Packet)
}

#[cfg(test)]
mod tests {
    use super::super::VSOCK_ZC_MAX;
    use super::*;
    use libc::{EAGAIN, EMSGSIZE, ENOBUFS, ENOMEM, EPERM};

    #[test]
    fn failures_by_rule_errno_and_id() {
        use IdRule::*;
        use ZcFailure::*;
        let table = [
            // rule, errno, took id, answer
            (Stream, ENOBUFS, false, Budget),
            (Stream, ENOMEM, false, Fail),
            (Stream, EMSGSIZE, false, Fail),
            (Stream, EPERM, false, Fail),
            (Vsock, ENOMEM, false, Budget),
            (Vsock, ENOBUFS, false, Budget),
            (Vsock, EMSGSIZE, false, Fail),
            (Datagram, ENOBUFS, false, Budget),
            // A qdisc drop with IP_RECVERR: the same errno, but the datagram took its id.
            (Datagram, ENOBUFS, true, Fail),
            (Datagram, EMSGSIZE, false, CopyUnfragmented),
            // UDP_SEGMENT's size check: refused after the id was taken.
            (Datagram, EMSGSIZE, true, Fail),
            (Datagram, EPERM, true, Fail),
            (Datagram, EPERM, false, Fail),
            (Datagram, ENOMEM, false, Fail),
        ];
        for (rule, errno, took, want) in table {
            assert_eq!(
                zc_failure(rule, Some(errno), took),
                want,
                "{rule:?} errno {errno} took {took}"
            );
        }
        assert_eq!(zc_failure(Datagram, None, false), Fail);
        assert_eq!(zc_failure(Stream, Some(EAGAIN), false), Fail);
    }

    #[test]
    fn engines_and_batches_by_socket_kind() {
        use libc::*;
        let kind = |d, t, p| SockKind::from_raw(d, t, p);
        let table = [
            // domain, type, protocol, id rule, msg-zc engine, copy batch
            (
                AF_INET,
                SOCK_STREAM,
                0,
                IdRule::Stream,
                Shape::ZcStream,
                CopyBatch::Gather,
            ),
            (
                AF_INET6,
                SOCK_DGRAM,
                0,
                IdRule::Datagram,
                Shape::ZcDatagram,
                CopyBatch::Datagrams,
            ),
            (
                AF_INET,
                SOCK_STREAM,
                IPPROTO_SCTP,
                IdRule::Stream,
                Shape::ZcStream,
                CopyBatch::EachAlone,
            ),
            (
                AF_INET,
                SOCK_SEQPACKET,
                IPPROTO_SCTP,
                IdRule::Datagram,
                Shape::ZcDatagram,
                CopyBatch::Datagrams,
            ),
            (
                AF_VSOCK,
                SOCK_STREAM,
                0,
                IdRule::Vsock,
                Shape::ZcStream,
                CopyBatch::Gather,
            ),
            // Messages, but vsock's counter: the stream engine, each message whole.
            (
                AF_VSOCK,
                SOCK_SEQPACKET,
                0,
                IdRule::Vsock,
                Shape::ZcStream,
                CopyBatch::Datagrams,
            ),
            (
                AF_UNIX,
                SOCK_DGRAM,
                0,
                IdRule::Datagram,
                Shape::ZcDatagram,
                CopyBatch::Datagrams,
            ),
        ];
        for (d, t, p, rule, zc, batch) in table {
            let k = kind(d, t, p);
            assert_eq!(id_rule(k), rule, "{k:?}");
            assert_eq!(shape(k, true), zc, "{k:?}");
            assert_eq!(shape(k, false), Shape::Copy, "{k:?}");
            assert_eq!(copy_batch(k), batch, "{k:?}");
        }
    }

    #[test]
    fn only_a_datagram_failure_is_asked_for_its_id() {
        assert!(failure_may_take_id(IdRule::Datagram));
        assert!(!failure_may_take_id(IdRule::Stream));
        assert!(!failure_may_take_id(IdRule::Vsock));
    }

    #[test]
    fn a_short_call_owns_its_id_except_on_vsock() {
        use CallId::*;
        let table = [
            (IdRule::Stream, 1000, 1000, Owned),
            (IdRule::Stream, 1000, 10, Owned),
            (IdRule::Datagram, 1472, 1472, Owned),
            (IdRule::Vsock, 4096, 4096, Owned),
            (IdRule::Vsock, 4096, 4095, Unowned),
        ];
        for (rule, asked, sent, want) in table {
            assert_eq!(call_id(rule, asked, sent), want, "{rule:?} {sent}/{asked}");
        }
    }

    #[test]
    fn what_goes_zero_copy() {
        use ZcNext::*;
        let table = [
            // rule, chosen copy, path fits, answer
            (IdRule::Stream, false, false, ZeroCopy),
            (IdRule::Stream, true, true, Copy),
            (IdRule::Vsock, false, false, ZeroCopy),
            (IdRule::Datagram, false, true, ZeroCopy),
            (IdRule::Datagram, false, false, CopyUnfragmented),
            (IdRule::Datagram, true, false, Copy),
        ];
        for (rule, copied, fits, want) in table {
            assert_eq!(
                zc_next(rule, copied, || fits),
                want,
                "{rule:?} {copied} {fits}"
            );
        }
        // The path is asked only of a datagram zerotx did not already copy.
        zc_next(IdRule::Stream, false, || panic!("asked a stream's path"));
        zc_next(IdRule::Datagram, true, || {
            panic!("asked a copied datagram's path")
        });
    }

    #[test]
    fn vsock_calls_are_capped_at_one_packet() {
        assert_eq!(zc_call_len(IdRule::Vsock, 1 << 20), VSOCK_ZC_MAX);
        assert_eq!(zc_call_len(IdRule::Vsock, 100), 100);
        assert_eq!(zc_call_len(IdRule::Stream, 1 << 20), 1 << 20);
        assert_eq!(zc_call_len(IdRule::Datagram, 65000), 65000);
    }

    #[test]
    fn copy_reads_its_error_queue_one_progress_in_sixteen() {
        assert!(!copy_reaps(0));
        assert!(!copy_reaps(COPY_ERRQUEUE_EVERY - 1));
        assert!(copy_reaps(COPY_ERRQUEUE_EVERY));
    }

    #[test]
    fn error_queues_by_family() {
        for family in [Family::Inet4, Family::Inet6, Family::Packet] {
            assert!(has_error_queue(family, false), "{family:?}");
        }
        for family in [Family::Unix, Family::Vsock] {
            assert!(!has_error_queue(family, false), "{family:?}");
            assert!(has_error_queue(family, true), "{family:?}");
        }
    }
}
