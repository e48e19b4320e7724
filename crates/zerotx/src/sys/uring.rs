//! io_uring calls, through the `io-uring` crate (whose submission `push` is `unsafe` because the
//! kernel reads the buffers it names after the call returns).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::OnceLock;

use io_uring::{cqueue, opcode, types, IoUring, Probe};

/// `IORING_SEND_ZC_REPORT_USAGE` (6.2): the notification says whether the data was copied.
pub const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`: bit 31 of a notification's `res`.
pub const NOTIF_USAGE_ZC_COPIED: i32 = i32::MIN;

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

/// One `IORING_OP_SEND_ZC` of `buf` on the connected socket `fd` with `REPORT_USAGE`, waited for.
/// Returns the first CQE's `res` and, when a notification followed, its `res`.
pub fn send_zc_once(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<(i32, Option<i32>)> {
    let mut ring = IoUring::new(4)?;
    let sqe = opcode::SendZc::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), buf.len() as u32)
        .zc_flags(SEND_ZC_REPORT_USAGE)
        .build()
        .user_data(1);
    // SAFETY: buf outlives the ring: we wait below for the notification (or the absence of
    // F_MORE) before returning, and the ring is dropped at the end of this function.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    let mut first = None;
    let mut first_more = false;
    let mut notif = None;
    // The notification may come before or after the first CQE: wait until both are accounted for.
    while first.is_none() || (first_more && notif.is_none()) {
        ring.submit_and_wait(1)?;
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
