//! The kernel side of io_uring: everything the uring engines hand the kernel or read back.
//!
//! - [`Ring`] (`ring.rs`): the io_uring instance. It owns every request from its push until its
//!   last CQE, routes completions to the senders (*owners*) sharing it, submits (retrying `EINTR`,
//!   tolerating `EBUSY`, flushing overflowed completions) and registers buffers.
//! - [`SendOp`] and the other requests (`op.rs`): each owns the memory its SQE points at and
//!   builds that SQE itself, so pushing one is safe.
//! - Rings whose senders all left with requests in flight (`orphans.rs`): kept and reaped until
//!   those finish, so their buffers are freed after the kernel's last CQE rather than leaked.
//! - The completion queue's room (`places.rs`): a reserve per owner and a pool bounded per owner,
//!   so the CQ never overflows and owners whose requests are parked never starve the others.
//! - [`UringConfig`] (`config.rs`): the ring's size and the batching every sender on it uses;
//!   [`UringShared`] (`shared.rs`): a ring with those settings, one sender's or shared by
//!   several.
//! - The probes (below): which opcodes and flags this kernel has, asked once per process; what
//!   io_uring charges against `RLIMIT_MEMLOCK`; the fault hooks the tests inject.
//!
//! `send_zc_once` pushes through the `io-uring` crate directly (an `unsafe` push, because the
//! kernel reads the buffer after the push) and waits for its request's last CQE before returning,
//! through signals.

mod config;
mod op;
mod orphans;
mod places;
mod ring;
mod shared;

pub use config::UringConfig;
pub(crate) use shared::SharedRing;
pub use shared::UringShared;

pub use op::{Cut, Op, Payload, SendKind, SendOp};
pub(crate) use orphans::{adopt, new_ring};
pub use ring::{Completion, Cqe, InboxHook, JoinRefused, Refused, Ring, CANCEL};
pub(crate) use ring::{Lent, MAX_CQ_ENTRIES, MAX_REGISTERED};

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use io_uring::{cqueue, opcode, types, IoUring, Probe};

/// `IORING_SEND_ZC_REPORT_USAGE` (6.2): the notification says whether the data was copied.
pub(crate) const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`: bit 31 of a notification's `res`.
pub(crate) const NOTIF_USAGE_ZC_COPIED: i32 = i32::MIN;

/// What io_uring offers on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringProbe {
    /// `IORING_OP_SEND_ZC` (6.0).
    pub send_zc: bool,
    /// `IORING_OP_SENDMSG_ZC` (6.1).
    pub sendmsg_zc: bool,
}

/// What io_uring offers, asked once per process and cached: every engine creation and
/// `zerotx::probe()` share the answer instead of setting up a throwaway ring each time. A refusal
/// is permanent for the process: `ENOSYS` (not built in), `EPERM` (`kernel.io_uring_disabled` or
/// seccomp).
pub fn probe() -> io::Result<UringProbe> {
    static CACHE: OnceLock<Result<UringProbe, i32>> = OnceLock::new();
    CACHE
        .get_or_init(|| ask().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO)))
        .clone()
        .map_err(io::Error::from_raw_os_error)
}

/// Creates a small ring (`io_uring_setup`) and asks which opcodes exist (`IORING_REGISTER_PROBE`).
fn ask() -> io::Result<UringProbe> {
    let ring = IoUring::new(4)?;
    let mut p = Probe::new();
    ring.submitter().register_probe(&mut p)?;
    Ok(UringProbe {
        send_zc: p.is_supported(opcode::SendZc::CODE),
        sendmsg_zc: p.is_supported(opcode::SendMsgZc::CODE),
    })
}

/// Whether `IORING_SEND_ZC_REPORT_USAGE` (6.2, backported to some 6.1) works here, asked once per
/// process and cached: one real `SEND_ZC` of one byte with the flag on a UDP socket with no peer
/// and no destination, so nothing is sent and no network is needed (a namespace without loopback
/// gives the same answer). A kernel that takes the flag gets as far as the send and answers
/// `EDESTADDRREQ`; `EINVAL` (the request's preparation refused the flag) means absent. Any other
/// failure counts as absent too: without the flag zerotx cannot tell a copied send from a
/// zero-copy one, but with a flag the kernel lacks every request would fail its preparation.
pub fn report_usage() -> bool {
    static CACHE: OnceLock<bool> = OnceLock::new();
    *CACHE.get_or_init(|| {
        let check = || -> io::Result<bool> {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
            let (res, _) = send_zc_once(sock.as_fd(), &[0x5a])?;
            Ok(res >= 0 || res == -libc::EDESTADDRREQ)
        };
        check().unwrap_or(false)
    })
}

/// Whether `IORING_OP_SENDMSG_ZC` sends from a registered buffer (`IORING_RECVSEND_FIXED_BUF` on
/// `SENDMSG_ZC`, Linux 6.15: "io_uring/net: implement vectored reg bufs for zctx"), asked once
/// per process and cached: one real request of one byte from a registered buffer, on a UDP socket
/// with no peer and no destination, so nothing is sent and no network is needed (a namespace
/// without loopback gives the same answer). A kernel that takes the flag gets as far as the send
/// and answers `EDESTADDRREQ` (measured on 6.18); earlier kernels refuse the flag with `EINVAL`
/// while preparing the request. Any other answer or failure (registering the buffer needs a page
/// of `RLIMIT_MEMLOCK`) counts as absent, and trains from a registered pool then go as plain
/// `SENDMSG_ZC` (docs/kernel.md, "UDP GSO trains on io_uring").
pub fn sendmsg_zc_fixed() -> bool {
    static CACHE: OnceLock<bool> = OnceLock::new();
    *CACHE.get_or_init(|| ask_sendmsg_zc_fixed().unwrap_or(false))
}

/// [`sendmsg_zc_fixed`]'s request. The buffer, its iovec and the `msghdr` are declared before the
/// ring, so the ring (which unregisters the buffer) goes first; if the wait fails with the request
/// submitted, the kernel may still read them after the ring is gone: they are leaked.
fn ask_sendmsg_zc_fixed() -> io::Result<bool> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let bytes: Box<[u8; 64]> = Box::new([0x5a; 64]);
    let iov = Box::new([libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    }]);
    let msg = Box::new(crate::sys::send_msghdr(&iov[..], None));
    let ring = IoUring::new(4)?;
    let whole = [libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    }];
    // SAFETY: the registration names `bytes`, which outlives the ring (declared before it, or
    // leaked below).
    unsafe { ring.submitter().register_buffers(&whole) }?;
    let sqe = opcode::SendMsgZc::new(types::Fd(sock.as_raw_fd()), &*msg)
        .buf_index(Some(0))
        .build()
        .user_data(1);
    let mut ring = ring;
    // SAFETY: the SQE points at `msg`, `iov` and `bytes`, which live until the request's last CQE
    // below, or are leaked if that cannot be waited for.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    let (mut first, mut more, mut notif) = (None, false, false);
    while first.is_none() || (more && !notif) {
        if let Err(e) = crate::sys::retry(|| ring.submit_and_wait(1)) {
            if ring.submission().is_empty() {
                std::mem::forget((bytes, iov, msg));
            }
            return Err(e);
        }
        for cqe in ring.completion() {
            if cqueue::notif(cqe.flags()) {
                notif = true;
            } else {
                first = Some(cqe.result());
                more = cqueue::more(cqe.flags());
            }
        }
    }
    drop(ring);
    Ok(first.is_some_and(|res| res >= 0 || res == -libc::EDESTADDRREQ))
}

/// Bytes of pages zero-copy requests may pin at most: io_uring charges them to `RLIMIT_MEMLOCK`
/// (soft limit) when the thread lacks `CAP_IPC_LOCK`, and refuses with `ENOMEM` past it. `None`:
/// no limit (the capability, or an unlimited or unreadable limit).
pub(crate) fn pin_limit() -> Option<usize> {
    const CAP_IPC_LOCK: u32 = 14;
    let caps = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let eff = caps
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    if eff & (1 << CAP_IPC_LOCK) != 0 {
        return None;
    }
    let (soft, _) = crate::sys::memlock_limit().ok()?;
    soft.map(|b| usize::try_from(b).unwrap_or(usize::MAX))
}

/// What io_uring charges for a zero-copy send of `bytes` from user memory: whole pages, plus two
/// for the ends (`io_notif_account_mem`).
pub(crate) fn pin_charge(bytes: usize) -> usize {
    (bytes / 4096 + 2) * 4096
}

/// One `IORING_OP_SEND_ZC` of a copy of `buf` on the connected socket `fd` with `REPORT_USAGE`,
/// waited for. Returns the first CQE's `res` and, when a notification followed, its `res`.
///
/// The request sends from a copy the function owns, and the wait is retried on `EINTR` (a signal
/// interrupts the wait, not the request). If waiting fails otherwise with the request submitted,
/// the kernel may still read the copy after the ring is gone (closing a ring cancels its requests
/// asynchronously): the copy is leaked, never freed, and the error returned.
pub fn send_zc_once(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<(i32, Option<i32>)> {
    let mut ring = IoUring::new(4)?;
    let copy: Box<[u8]> = buf.into();
    let len = u32::try_from(copy.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "send_zc_once: over 4 GiB"))?;
    let sqe = opcode::SendZc::new(types::Fd(fd.as_raw_fd()), copy.as_ptr(), len)
        .zc_flags(SEND_ZC_REPORT_USAGE)
        .build()
        .user_data(1);
    // SAFETY: the SQE points at `copy`, which lives until the request's last CQE below, or is
    // leaked if that cannot be waited for.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    let mut first = None;
    let mut first_more = false;
    let mut notif = None;
    // The notification may come before or after the first CQE: wait until both are accounted for.
    while first.is_none() || (first_more && notif.is_none()) {
        if let Err(e) = crate::sys::retry(|| ring.submit_and_wait(1)) {
            if ring.submission().is_empty() {
                // Submitted: the kernel may read the copy after the ring is gone.
                std::mem::forget(copy);
            }
            return Err(e);
        }
        for cqe in ring.completion() {
            if cqueue::notif(cqe.flags()) {
                notif = Some(cqe.result());
            } else {
                first = Some(cqe.result());
                first_more = cqueue::more(cqe.flags());
            }
        }
    }
    Ok((first.unwrap_or(-libc::EIO), notif))
}

/// Faults the tests inject where the kernel cannot produce them on demand. They apply to io_uring
/// calls made by the calling thread only, so tests running in parallel never see each other's.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// The next this-many SQEs an engine builds carry an invalid flag (bit 15 of `ioprio`): the
    /// kernel fails their preparation with `EINVAL` inside `io_uring_enter` and stops submitting
    /// there, as 6.1 does for `IORING_SEND_ZC_REPORT_USAGE`.
    pub bad_sqes: u32,
    /// The next this-many `io_uring_enter` calls fail with `enter_errno` without entering.
    pub failed_enters: u32,
    /// The error of an injected `io_uring_enter` failure (`EAGAIN` if 0).
    pub enter_errno: i32,
}

thread_local! {
    static FAULTS: Cell<Faults> = const {
        Cell::new(Faults {
            bad_sqes: 0,
            failed_enters: 0,
            enter_errno: 0,
        })
    };
}

/// Whether any thread ever injected a fault: until then the hot path skips the thread-local
/// lookup (a request's SQE and every `io_uring_enter` ask).
static ARMED: AtomicBool = AtomicBool::new(false);

/// Sets the calling thread's injected faults.
#[doc(hidden)]
pub fn inject(faults: Faults) {
    ARMED.store(true, Ordering::Relaxed);
    FAULTS.set(faults);
}

/// An invalid `ioprio` bit, if a bad SQE is due on this thread.
#[inline]
pub(super) fn take_bad_sqe() -> u16 {
    if !ARMED.load(Ordering::Relaxed) {
        return 0;
    }
    let mut f = FAULTS.get();
    if f.bad_sqes == 0 {
        return 0;
    }
    f.bad_sqes -= 1;
    FAULTS.set(f);
    1 << 15
}

pub(super) fn take_failed_enter() -> Option<io::Error> {
    if !ARMED.load(Ordering::Relaxed) {
        return None;
    }
    let mut f = FAULTS.get();
    if f.failed_enters == 0 {
        return None;
    }
    f.failed_enters -= 1;
    FAULTS.set(f);
    let errno = if f.enter_errno == 0 {
        libc::EAGAIN
    } else {
        f.enter_errno
    };
    Some(io::Error::from_raw_os_error(errno))
}
