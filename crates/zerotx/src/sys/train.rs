//! UDP GSO: one `sendmsg(2)` that carries a buffer as a train of datagrams, cut by the kernel
//! into segments of the size a `UDP_SEGMENT` control message names (Linux 4.18; docs/kernel.md,
//! "UDP GSO trains").

use std::io::{self, IoSlice};
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use socket2::SockAddr;

use super::{retry, send_msghdr};

/// `UDP_SEGMENT` (linux/udp.h), at level `SOL_UDP`: as a socket option or, here, per call.
pub(crate) const UDP_SEGMENT: libc::c_int = 103;

/// The control data of one train: a `cmsghdr` of level `SOL_UDP`, type [`UDP_SEGMENT`], and the
/// segment size as a `u16`, padded to `CMSG_SPACE(sizeof(u16))`. Built whole by
/// [`SegmentCmsg::new`], so `msg_controllen` is its size and never a guess; it owns the bytes the
/// `msghdr` points into, so whoever hands that header to the kernel keeps it alive and in place
/// until the kernel has read it (the call's end for `sendmsg`, the last CQE for an io_uring
/// `SENDMSG_ZC` request).
#[repr(C)]
pub(crate) struct SegmentCmsg {
    hdr: libc::cmsghdr,
    segment: u16,
    _pad: [u8; 6],
}

// The layout is `CMSG_SPACE(2)`: the header, then the data at `CMSG_DATA`'s offset (the header is
// already aligned to `cmsghdr`'s alignment), padded to that alignment.
const _: () = assert!(mem::size_of::<SegmentCmsg>() % mem::align_of::<libc::cmsghdr>() == 0);
const _: () = assert!(mem::offset_of!(SegmentCmsg, segment) == mem::size_of::<libc::cmsghdr>());

impl SegmentCmsg {
    /// The control data for a train of `segment`-byte datagrams.
    pub(crate) fn new(segment: u16) -> Self {
        // SAFETY: cmsghdr is a plain C struct for which all-zeroes is a valid value (some libcs
        // give it private padding fields, so it is not built field by field).
        let mut hdr: libc::cmsghdr = unsafe { mem::zeroed() };
        hdr.cmsg_len = (mem::size_of::<libc::cmsghdr>() + mem::size_of::<u16>()) as _;
        hdr.cmsg_level = libc::SOL_UDP;
        hdr.cmsg_type = UDP_SEGMENT;
        Self {
            hdr,
            segment,
            _pad: [0; 6],
        }
    }

    /// Points `msg`'s control data at `self`.
    pub(crate) fn attach(&mut self, msg: &mut libc::msghdr) {
        msg.msg_control = (self as *mut Self).cast();
        msg.msg_controllen = mem::size_of::<Self>() as _;
    }
}

/// `sendmsg(2)` of `buf` as one train of `segment`-byte datagrams (the last may be shorter), to
/// `dest` or the connected peer, non-blocking, without `SIGPIPE`, with `extra_flags`
/// (`MSG_ZEROCOPY`). Returns the bytes the kernel took: all of them, a train goes whole or not
/// at all.
///
/// Entered inline ([`sendmsg_inline`]), as [`send_to`](super::send_to) is: a per-send system call
/// stays in the frame of the loop that makes it (docs/fast-path.md, "Inline system calls").
#[inline]
pub(crate) fn send_train(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    segment: u16,
    dest: Option<&SockAddr>,
    extra_flags: libc::c_int,
) -> io::Result<usize> {
    send_train_gather(fd, &[IoSlice::new(buf)], segment, dest, extra_flags)
}

/// As [`send_train`], of the bytes of `bufs` in order, one iovec each: the kernel cuts the
/// whole message every `segment` bytes across the iovecs (`udp_sendmsg` appends them into one
/// GSO skb), so buffers of `segment` bytes, the last possibly shorter, are one datagram each.
#[inline]
pub(crate) fn send_train_gather(
    fd: BorrowedFd<'_>,
    bufs: &[IoSlice<'_>],
    segment: u16,
    dest: Option<&SockAddr>,
    extra_flags: libc::c_int,
) -> io::Result<usize> {
    // SAFETY: `IoSlice` is guaranteed ABI-compatible with `iovec` on Unix (its documentation),
    // so the slice is `bufs.len()` valid iovecs, borrowed for as long as `bufs`.
    let iov =
        unsafe { std::slice::from_raw_parts(bufs.as_ptr().cast::<libc::iovec>(), bufs.len()) };
    let mut cmsg = SegmentCmsg::new(segment);
    let mut msg = send_msghdr(iov, dest);
    cmsg.attach(&mut msg);
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | extra_flags;
    retry(|| {
        // SAFETY: `msg` points at `iov` (slices of the live `bufs`), `dest`'s address and
        // `cmsg`, all alive and unmoved until the call returns; the kernel only reads them.
        let n = unsafe { sendmsg_inline(fd.as_raw_fd(), &msg, flags) };
        if n < 0 {
            Err(io::Error::from_raw_os_error(-n as i32))
        } else {
            Ok(n as usize)
        }
    })
}

/// Whether the kernel has UDP GSO: `getsockopt(SOL_UDP, UDP_SEGMENT)` answers on a UDP socket
/// (4.18); older kernels answer `ENOPROTOOPT`.
pub(crate) fn gso_available(fd: BorrowedFd<'_>) -> bool {
    super::getsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT).is_ok()
}

/// The socket's `UDP_SEGMENT` option (`getsockopt(SOL_UDP, UDP_SEGMENT)`): the segment size
/// every send on it is cut into, 0 for none.
pub(crate) fn segment_option(fd: BorrowedFd<'_>) -> io::Result<u16> {
    let v = super::getsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT)?;
    u16::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Sets the socket's `UDP_SEGMENT` option to `segment` (`setsockopt(SOL_UDP, UDP_SEGMENT)`; 0:
/// sends are not cut).
pub(crate) fn set_segment_option(fd: BorrowedFd<'_>, segment: u16) -> io::Result<()> {
    super::setsockopt_int(fd, libc::SOL_UDP, UDP_SEGMENT, i32::from(segment))
}

/// `sendmsg(2)` by the `syscall` instruction in the caller's frame; returns the kernel's answer
/// (`-errno` on failure). rustix enters `sendto` so, but has no `UDP_SEGMENT` control message,
/// and glibc's wrapper would return into the caller's frame after the call, the return the
/// fast path avoids.
///
/// # Safety
/// `msg` must point at a valid `msghdr` whose every pointer names live memory of the lengths it
/// gives, until the call returns.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn sendmsg_inline(fd: libc::c_int, msg: *const libc::msghdr, flags: libc::c_int) -> isize {
    let ret: isize;
    // SAFETY: the x86-64 Linux system-call convention: number in rax, arguments in rdi, rsi,
    // rdx; the kernel returns in rax and clobbers rcx and r11 (declared), restores the flags
    // from r11 and touches no stack. The memory it reads is the caller's contract above.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_sendmsg as isize => ret,
            in("rdi") fd as isize,
            in("rsi") msg,
            in("rdx") flags as isize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack, preserves_flags),
        );
    }
    ret
}

/// `sendmsg(2)` through libc where the inline entry is not written: the answer as
/// [`sendmsg_inline`]'s (`-errno` on failure).
///
/// # Safety
/// As the x86-64 version's.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn sendmsg_inline(fd: libc::c_int, msg: *const libc::msghdr, flags: libc::c_int) -> isize {
    // SAFETY: the caller's contract.
    let n = unsafe { libc::sendmsg(fd, msg, flags) };
    if n < 0 {
        -(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO) as isize)
    } else {
        n
    }
}

/// The kernel's answer to a train of `segments` one-byte datagrams from a fresh UDP socket to
/// another bound on 127.0.0.1 (loopback only: nothing leaves the host): the call's result, and
/// the length of the first datagram read back (waited for at most 200 ms; loopback delivers
/// before the call returns). Both sockets are closed on return, with what else was delivered.
/// Fails where loopback is down (a fresh network namespace) or refuses the sockets.
pub(crate) fn probe_segments(segments: u16) -> (io::Result<usize>, Option<usize>) {
    let bind = || std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, 0));
    let (rx, tx) = match (bind(), bind()) {
        (Ok(rx), Ok(tx)) => (rx, tx),
        (Err(e), _) | (_, Err(e)) => return (Err(e), None),
    };
    // The receiver takes only the probe's datagrams: another local sender's cannot answer it.
    let dest = match (rx.local_addr(), tx.local_addr()) {
        (Ok(to), Ok(from)) => match rx.connect(from) {
            Ok(()) => SockAddr::from(to),
            Err(e) => return (Err(e), None),
        },
        (Err(e), _) | (_, Err(e)) => return (Err(e), None),
    };
    let train = vec![0u8; usize::from(segments)];
    let sent = send_train(tx.as_fd(), &train, 1, Some(&dest), 0);
    if sent.is_err() {
        return (sent, None);
    }
    // One byte more than the train: a datagram longer than a segment is the whole train.
    let mut first = vec![0u8; train.len() + 1];
    let read = rx
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .and_then(|()| rx.recv(&mut first));
    (sent, read.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_message_is_cmsg_space_of_a_u16() {
        let c = SegmentCmsg::new(1472);
        // SAFETY: CMSG_SPACE and CMSG_LEN only compute lengths.
        let (space, len) = unsafe { (libc::CMSG_SPACE(2), libc::CMSG_LEN(2)) };
        assert_eq!(mem::size_of::<SegmentCmsg>(), space as usize);
        assert_eq!(c.hdr.cmsg_len, len as usize);
        assert_eq!((c.hdr.cmsg_level, c.hdr.cmsg_type), (libc::SOL_UDP, 103));
        assert_eq!(c.segment, 1472);
    }
}
