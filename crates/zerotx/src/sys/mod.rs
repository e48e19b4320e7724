//! The thin layer where every system call lives.
//!
//! Nothing outside this module (and the buffer pool's allocation) says `unsafe`. Each function here
//! names the syscall it stands on and retries `EINTR` in one place ([`retry`]). Most go through
//! libc, turning `-1` into [`io::Error::last_os_error`] through one [`syscall!`] macro; the
//! per-send calls ([`send_to`], [`send_gather`]) and `io_uring_enter` (`uring::Ring`) go through
//! rustix's inline system calls instead, for the reason `send_to`'s docs give, and the engines
//! fill the return stack after them ([`refill_return_stack`]).
#![allow(unsafe_code)]

use std::io;
use std::mem::{self, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use socket2::SockAddr;

pub(crate) mod train;
pub(crate) mod uring;

/// `SO_ZEROCOPY` (asm-generic/socket.h); libc has it, spelled here so the number is visible.
pub(crate) const SO_ZEROCOPY: libc::c_int = 60;
/// `MSG_ZEROCOPY` (linux/socket.h).
pub(crate) const MSG_ZEROCOPY: libc::c_int = 0x400_0000;
/// The kernel-internal `ENOTSUPP`, which some protocols leak to userspace.
pub(crate) const ENOTSUPP: i32 = 524;

/// Calls a libc function and turns a `-1` return into `io::Error::last_os_error()`.
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        // SAFETY: the caller of the macro upholds the function's contract; every call site
        // below passes pointers to live, correctly sized values.
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 {
            Err(::std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

pub(crate) mod egress;

/// Runs `f` again while it fails with `EINTR`: the one place that retries interrupted calls.
/// Always inlined, so that a call it wraps stays in its caller's frame (see [`send_to`]).
#[inline(always)]
pub(crate) fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut val: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    syscall!(getsockopt(
        fd.as_raw_fd(),
        level,
        name,
        (&mut val as *mut libc::c_int).cast(),
        &mut len
    ))?;
    Ok(val)
}

/// `setsockopt(fd, level, name, &int)`.
pub(crate) fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    val: i32,
) -> io::Result<()> {
    syscall!(setsockopt(
        fd.as_raw_fd(),
        level,
        name,
        (&val as *const libc::c_int).cast(),
        mem::size_of::<libc::c_int>() as libc::socklen_t
    ))?;
    Ok(())
}

/// `getsockopt(fd, IPPROTO_TCP, TCP_INFO)`: the kernel's `struct tcp_info` and how many of its
/// bytes the kernel wrote (older kernels write fewer fields; the rest stay zero).
pub(crate) fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<(libc::tcp_info, usize)> {
    // SAFETY: `tcp_info` is a plain C struct of integers, for which zeroes are valid.
    let mut info: libc::tcp_info = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    syscall!(getsockopt(
        fd.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_INFO,
        (&mut info as *mut libc::tcp_info).cast(),
        &mut len
    ))?;
    Ok((info, len as usize))
}

/// What `getsockopt(SO_DOMAIN/SO_TYPE/SO_PROTOCOL/SO_ACCEPTCONN)` and `getpeername` say of a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawSockInfo {
    /// `AF_*`.
    pub domain: i32,
    /// `SOCK_*`.
    pub ty: i32,
    /// `IPPROTO_*` or the packet socket's ethertype.
    pub protocol: i32,
    /// `SO_ACCEPTCONN`: a listening socket.
    pub listening: bool,
    /// `getpeername` succeeded.
    pub connected: bool,
}

/// Reads the socket's domain, type, protocol and state. `EBADF` and `ENOTSOCK` pass through.
pub(crate) fn sock_info(fd: BorrowedFd<'_>) -> io::Result<RawSockInfo> {
    let domain = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let ty = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)?;
    let protocol = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    let listening = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN)? != 0;
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let connected = syscall!(getpeername(
        fd.as_raw_fd(),
        storage.as_mut_ptr().cast(),
        &mut len
    ))
    .is_ok();
    Ok(RawSockInfo {
        domain,
        ty,
        protocol,
        listening,
        connected,
    })
}

/// Where an `AF_PACKET` socket is bound, from `getsockname(2)`'s `sockaddr_ll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PacketBinding {
    /// `sll_ifindex`: the interface a send without a name goes out on; 0 for none.
    pub ifindex: i32,
    /// `sll_halen`: the length of that interface's link-layer address (0: it has none, and a
    /// `SOCK_DGRAM` send builds no link-layer header from a destination).
    pub halen: u8,
}

/// `getsockname(2)` of an `AF_PACKET` socket: the interface it is bound to.
pub(crate) fn packet_binding(fd: BorrowedFd<'_>) -> io::Result<PacketBinding> {
    let mut sll = MaybeUninit::<libc::sockaddr_ll>::zeroed();
    let mut len = mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    syscall!(getsockname(
        fd.as_raw_fd(),
        sll.as_mut_ptr().cast(),
        &mut len
    ))?;
    // SAFETY: zeroed is a valid sockaddr_ll, and getsockname wrote at most `len` bytes of one.
    let sll = unsafe { sll.assume_init() };
    Ok(PacketBinding {
        ifindex: sll.sll_ifindex,
        halen: sll.sll_halen,
    })
}

/// `setsockopt(SOL_SOCKET, SO_ZEROCOPY, 1)`.
pub(crate) fn enable_zerocopy(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_SOCKET, SO_ZEROCOPY, 1)
}

/// The level and option of the path-MTU discovery mode: `IPPROTO_IP`/`IP_MTU_DISCOVER`, or with
/// `v6` `IPPROTO_IPV6`/`IPV6_MTU_DISCOVER`.
fn pmtu_option(v6: bool) -> (libc::c_int, libc::c_int) {
    if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER)
    }
}

/// `getsockopt(IP_MTU_DISCOVER)` (`IPV6_MTU_DISCOVER` with `v6`): the socket's path-MTU discovery
/// mode (`IP_PMTUDISC_*`; IPv6 numbers its modes alike). An IPv6 socket answers the IPv4 option
/// too: its mode for IPv4-mapped destinations.
pub(crate) fn pmtu_mode(fd: BorrowedFd<'_>, v6: bool) -> io::Result<i32> {
    let (level, name) = pmtu_option(v6);
    getsockopt_int(fd, level, name)
}

/// `getsockopt(IP_MTU)` (`IPV6_MTU` with `v6`): the path MTU the kernel holds for a connected
/// socket's peer (`ENOTCONN` on an unconnected one).
pub(crate) fn path_mtu(fd: BorrowedFd<'_>, v6: bool) -> io::Result<i32> {
    if v6 {
        getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        getsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU)
    }
}

/// `setsockopt(IP_MTU_DISCOVER)` (`IPV6_MTU_DISCOVER` with `v6`) to `mode`.
pub(crate) fn set_pmtu_mode(fd: BorrowedFd<'_>, v6: bool, mode: i32) -> io::Result<()> {
    let (level, name) = pmtu_option(v6);
    setsockopt_int(fd, level, name, mode)
}

/// `getsockopt(SOL_SOCKET, SO_ZEROCOPY)`: whether the socket already opted in.
pub(crate) fn zerocopy_enabled(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(getsockopt_int(fd, libc::SOL_SOCKET, SO_ZEROCOPY)? != 0)
}

/// `sendto(2)` of one buffer (to `dest`, or the connected peer), non-blocking, without
/// `SIGPIPE`. Preferred to `sendmsg(2)` for one buffer: the kernel imports one user buffer
/// (`ITER_UBUF`) instead of copying a `msghdr` and an iovec array, which a raw loop does not pay
/// either.
///
/// Entered through rustix's raw system call (an inline `syscall` instruction, inlined with
/// [`retry`] into the engine's send loop), not glibc's `sendto`: the rule that a per-send system
/// call stays inline in the loop that makes it, and why (docs/fast-path.md, "Inline system
/// calls"). glibc's wrapper is also a cancellation point, which a non-blocking send has no use
/// for.
///
/// So sends do not go through the `sendto` symbol: a library preloaded to intercept it (Onload,
/// VMA, socket_wrapper) does not see them, and `pthread_cancel` does not act on them.
#[inline(always)]
pub(crate) fn send_to(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    dest: Option<&SockAddr>,
    extra_flags: libc::c_int,
) -> io::Result<usize> {
    let flags = rustix::net::SendFlags::from_bits_retain(
        (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | extra_flags) as u32,
    );
    retry(|| {
        match dest {
            None => rustix::net::send(fd, buf, flags),
            Some(a) => rustix::net::sendto(fd, buf, flags, &Dest(a)),
        }
        .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
    })
}

/// How many entries [`refill_return_stack`] leaves: the return stack buffer's depth on the CPUs
/// the project runs on (32), so every return up a caller's stack of that depth finds one.
#[cfg(target_arch = "x86_64")]
pub(crate) const RETURN_STACK_FILL: usize = 32;

/// Where the kernel says how it mitigates Speculative Return Stack Overflow.
#[cfg(target_arch = "x86_64")]
const SRSO_STATUS: &str = "/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow";

/// Whether [`refill_return_stack`] fills, from the kernel's SRSO status (`status`): where it
/// mitigates with "Safe RET", the only mitigation the fill is known to pay under
/// (docs/fast-path.md, "The return-stack fill").
#[cfg(target_arch = "x86_64")]
fn fill_pays(status: &str) -> bool {
    status.contains("Safe RET")
}

/// [`fill_pays`] for this machine, read once.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fill_pays_here() -> bool {
    static PAYS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAYS.get_or_init(|| fill_pays(&std::fs::read_to_string(SRSO_STATUS).unwrap_or_default()))
}

/// Fills the CPU's return-address predictor (the return stack buffer) with harmless entries, as
/// the kernel does at a context switch: each return into a frame that was live before the last
/// system call then mispredicts, cheaply, to a trap here, instead of to whatever the kernel left
/// there.
///
/// A return that finds a stale entry after a system call costs far more than the fill on CPUs
/// under the kernel's SRSO "Safe RET" mitigation; filled, as many returns as entries cost nothing.
/// So it fills only where the kernel reports that mitigation ([`fill_pays`], read once), and
/// a library call that entered the kernel fills once before it returns: through [`fenced!`],
/// never by hand (the rule, its cost and its benchmark: docs/fast-path.md, "The return-stack
/// fill").
///
/// Skipped under a user shadow stack (CET: `rdsspq` gives its pointer; on a CPU or a process
/// without one it is a no-op, and the register keeps the 0 the block put there), which would
/// fault at a return after calls that are never returned from. A no-op off x86-64.
#[inline(always)]
pub(crate) fn refill_return_stack() {
    #[cfg(target_arch = "x86_64")]
    if fill_pays_here() {
        fill_return_stack();
    }
}

/// Runs a system call and then fills the return stack ([`refill_return_stack`]): the one idiom
/// for a library call's last entry into the kernel before it returns to its caller. A macro, not
/// a function, so that the call and the fill both sit in the caller's frame, as inline as the call
/// was: a function would put a return into an older frame between the two, the very return the
/// fill is there to make cheap. The expression's value is the macro's.
///
/// ```ignore
/// let result = sys::fenced!(sys::send_gather(fd, &slices));
/// ```
///
/// Where it goes: after the last system call of an engine's `try_send`/`try_send_batch`/progress
/// path, before the returns up to the caller's loop; not inside a loop of calls (one fill after
/// the loop is enough), and not after calls whose caller returns at once anyway to another
/// fenced call (docs/fast-path.md, "The return-stack fill").
macro_rules! fenced {
    ($call:expr) => {{
        let value = $call;
        $crate::sys::refill_return_stack();
        value
    }};
}
pub(crate) use fenced;

/// The fill of [`refill_return_stack`], wherever it runs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fill_return_stack() {
    // SAFETY: the block changes no register but `ssp` and the flags, and no memory but the stack
    // below the 128-byte red zone, which it gives back (`rsp` ends as it began). Its calls are
    // never returned from (each `int3` runs only speculatively, if ever), which is the point, and
    // nothing but a shadow stack tracks calls; with one (a nonzero shadow-stack pointer) the block
    // jumps over them.
    unsafe {
        std::arch::asm!(
            "xor {ssp:e}, {ssp:e}",
            "rdsspq {ssp}",
            "test {ssp}, {ssp}",
            "jnz 3f",
            "lea rsp, [rsp - 128]",
            ".rept {n}",
            "call 2f",
            "int3",
            "2:",
            ".endr",
            "lea rsp, [rsp + 128 + 8 * {n}]",
            "3:",
            ssp = out(reg) _,
            n = const RETURN_STACK_FILL,
            options(nomem),
        );
    }
}

/// How many buffers [`send_gather`] takes per call, at most.
pub(crate) const GATHER_MAX: usize = 32;

/// How many bytes the engines hand [`send_gather`] per call, at most. Gathering pays for small
/// buffers, whose per-call cost it shares; a write far larger than the socket takes at once only
/// leaves most of the batch waiting (docs/fast-path.md, "Gathered writes").
pub(crate) const GATHER_BYTES: usize = 1 << 20;

/// `sendmsg(2)` of several buffers as one write on a connected stream socket (`MSG_DONTWAIT`,
/// `MSG_NOSIGNAL`): the kernel takes a prefix of their bytes in order, like `writev(2)`. Returns
/// how many bytes it took, never 0: a write that took nothing and said no error (a stream should
/// not answer so) is `WouldBlock`, as a full socket's. At most [`GATHER_MAX`] buffers.
#[inline(always)]
pub(crate) fn send_gather(fd: BorrowedFd<'_>, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
    debug_assert!(bufs.len() <= GATHER_MAX);
    let flags =
        rustix::net::SendFlags::from_bits_retain((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32);
    retry(|| {
        let mut control = rustix::net::SendAncillaryBuffer::default();
        rustix::net::sendmsg(fd, bufs, &mut control, flags)
            .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
    })
    .and_then(|taken| match taken {
        0 => Err(io::ErrorKind::WouldBlock.into()),
        taken => Ok(taken),
    })
}

/// The run of buffers one [`send_gather`] carries: the first, whatever its size, and those after
/// it while the run stays within [`GATHER_MAX`] buffers and [`GATHER_BYTES`] bytes. It ends
/// before an empty buffer (empty if the first is), which the caller refuses on its own.
#[inline(always)]
pub(crate) fn gather_run<'a>(
    bufs: impl Iterator<Item = &'a [u8]>,
) -> smallvec::SmallVec<[std::io::IoSlice<'a>; GATHER_MAX]> {
    let mut total = 0;
    bufs.take(GATHER_MAX)
        .enumerate()
        .take_while(|(i, b)| {
            total += b.len();
            !b.is_empty() && (*i == 0 || total <= GATHER_BYTES)
        })
        .map(|(_, b)| std::io::IoSlice::new(b))
        .collect()
}

/// A socket2 address as rustix takes one.
struct Dest<'a>(&'a SockAddr);

// SAFETY: the pointer and length are socket2's own for a live `SockAddr` (a `sockaddr_storage`
// and the length of the address in it), valid for the closure's call: `self` borrows it.
unsafe impl rustix::net::addr::SocketAddrArg for Dest<'_> {
    unsafe fn with_sockaddr<R>(
        &self,
        f: impl FnOnce(
            *const rustix::net::addr::SocketAddrOpaque,
            rustix::net::addr::SocketAddrLen,
        ) -> R,
    ) -> R {
        f(self.0.as_ptr().cast(), self.0.len())
    }
}

/// The `msghdr` of a send: the iovecs `iov` and, for an unconnected datagram socket, the
/// destination `dest`; no control data. The one builder behind the io_uring
/// `SENDMSG`/`SENDMSG_ZC` requests ([`uring::SendOp`]). The header only holds pointers: whoever
/// hands it to the kernel keeps `iov`, the memory it names and `dest` alive and in place until the
/// kernel is done reading them (the end of the call for `sendmsg`, the request's last CQE for
/// io_uring).
pub(crate) fn send_msghdr(iov: &[libc::iovec], dest: Option<&SockAddr>) -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct for which all-zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    if let Some(addr) = dest {
        msg.msg_name = addr.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = addr.len();
    }
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    msg
}

/// One message read from the socket error queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrQueueRead {
    /// Bytes of control data the kernel wrote into the buffer.
    pub control_len: usize,
}

/// `recvmsg(fd, MSG_ERRQUEUE | MSG_DONTWAIT)` into `control`. `Ok(None)` when the queue is empty.
/// A message whose control data did not fit (`MSG_CTRUNC`) is an error, never a partial decode.
pub(crate) fn recv_errqueue(
    fd: BorrowedFd<'_>,
    control: &mut [u8],
) -> io::Result<Option<ErrQueueRead>> {
    // SAFETY: msghdr is a plain C struct for which all-zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    let res = retry(|| {
        syscall!(recvmsg(
            fd.as_raw_fd(),
            &mut msg,
            libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT
        ))
    });
    match res {
        Ok(_) => {
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "error-queue control message truncated (MSG_CTRUNC)",
                ));
            }
            Ok(Some(ErrQueueRead {
                control_len: msg.msg_controllen as usize,
            }))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// `poll(2)` on one fd; returns `revents` (0 on timeout). `None` waits forever.
/// Takes a raw descriptor: a stale one makes poll report `POLLNVAL`, never touch other memory.
pub fn poll_one(fd: RawFd, events: i16, timeout: Option<Duration>) -> io::Result<i16> {
    let ms = timeout.map_or(-1, poll_millis);
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    retry(|| syscall!(poll(&mut pfd, 1, ms)))?;
    Ok(pfd.revents)
}

/// `net.core.optmem_max` of the calling thread's network namespace, bytes; `None` if unreadable.
pub(crate) fn optmem_max() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/net/core/optmem_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`: CPU time the calling thread has used, nanoseconds
/// (0 if the clock cannot be read, which `auto`'s tuner treats as no measurement).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match syscall!(clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts)) {
        Ok(_) => ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        Err(_) => 0,
    }
}

/// A timeout in poll(2)'s milliseconds, rounded up: truncating would turn the last partial
/// millisecond before a deadline into polls that return at once (a busy loop).
fn poll_millis(d: Duration) -> i32 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    ms.min(i32::MAX as u128) as i32
}

/// `fcntl(F_DUPFD_CLOEXEC)` of a raw descriptor: a new descriptor for the same open file. A stale
/// number fails with `EBADF` (or duplicates whatever now has it), never touches memory: the
/// caller must know `fd` is open, as with any descriptor number.
#[cfg(feature = "tokio")]
pub(crate) fn dup_raw(fd: RawFd) -> io::Result<OwnedFd> {
    let new = syscall!(fcntl(fd, libc::F_DUPFD_CLOEXEC, 0))?;
    // SAFETY: fcntl returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Registers `fd` with the current tokio runtime's reactor (`epoll_ctl`), waking on `interest`.
#[cfg(feature = "tokio")]
pub(crate) fn async_fd(
    fd: OwnedFd,
    interest: ::tokio::io::Interest,
) -> io::Result<::tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns `fd`, an open descriptor only it closes (an OwnedFd's number
    // never changes), so it names the same file for the AsyncFd's whole life.
    unsafe { ::tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }.map_err(Into::into)
}

/// `socket(2)` with `SOCK_CLOEXEC`.
pub(crate) fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    let fd = syscall!(socket(domain, ty | libc::SOCK_CLOEXEC, protocol))?;
    // SAFETY: socket(2) returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `uname(2)`: the kernel release string.
pub(crate) fn kernel_release() -> io::Result<String> {
    let mut uts = MaybeUninit::<libc::utsname>::zeroed();
    syscall!(uname(uts.as_mut_ptr()))?;
    // SAFETY: uname succeeded, so the struct is initialised and release is NUL-terminated.
    let uts = unsafe { uts.assume_init() };
    let bytes: Vec<u8> = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `getrlimit(RLIMIT_MEMLOCK)`: (soft, hard) in bytes, `None` for unlimited.
pub(crate) fn memlock_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    syscall!(getrlimit(libc::RLIMIT_MEMLOCK, &mut lim))?;
    let conv = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    Ok((conv(lim.rlim_cur), conv(lim.rlim_max)))
}

/// `ioctl(/dev/vsock, IOCTL_VM_SOCKETS_GET_LOCAL_CID)`: this host's vsock CID, if a transport is
/// loaded.
pub(crate) fn vsock_local_cid() -> io::Result<u32> {
    const IOCTL_VM_SOCKETS_GET_LOCAL_CID: libc::c_ulong = 0x7b9;
    let dev = std::fs::File::open("/dev/vsock")?;
    let mut cid: u32 = u32::MAX;
    syscall!(ioctl(
        dev.as_raw_fd(),
        IOCTL_VM_SOCKETS_GET_LOCAL_CID,
        &mut cid as *mut u32
    ))?;
    if cid == u32::MAX {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no vsock CID"));
    }
    Ok(cid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns through `depth` frames after a fill (if `fill`), each checking the locals it kept
    /// across it.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn fill_then_return(depth: u32, seed: u64, fill: bool) -> u64 {
        // Opaque to the compiler, so it is computed before the fill and kept across it.
        let kept: [u64; 8] =
            std::hint::black_box(std::array::from_fn(|i| seed.wrapping_mul(i as u64 + 3)));
        let below = if depth == 0 {
            if fill {
                fill_return_stack();
            }
            seed
        } else {
            fill_then_return(depth - 1, seed.rotate_left(7) ^ u64::from(depth), fill)
        };
        let again: [u64; 8] = std::array::from_fn(|i| seed.wrapping_mul(i as u64 + 3));
        assert_eq!(kept, again, "a local changed across the fill");
        below.wrapping_mul(31) ^ u64::from(depth)
    }

    /// The address of a local of a fresh frame: moves if the stack pointer does.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    fn stack_probe() -> usize {
        let probe = 0u8;
        std::hint::black_box(std::ptr::addr_of!(probe)) as usize
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_fill_of_the_return_stack_leaves_the_stack_and_every_frame_as_they_were() {
        // Deeper than the fill as well: the returns past its entries find whatever was there
        // before, and must go where they should all the same. The fill runs whatever the kernel's
        // mitigation (`fill_return_stack`, not the gated `refill_return_stack`).
        let seed = 0x9e37_79b9_7f4a_7c15;
        for depth in [
            0,
            1,
            5,
            RETURN_STACK_FILL as u32,
            2 * RETURN_STACK_FILL as u32 + 3,
        ] {
            let before = stack_probe();
            assert_eq!(
                fill_then_return(depth, seed, true),
                fill_then_return(depth, seed, false),
                "depth {depth}"
            );
            fill_return_stack();
            assert_eq!(stack_probe(), before, "the stack pointer moved");
        }
    }

    /// The idiom gives back the call's value, whatever it is, and leaves the stack where it was.
    #[test]
    fn fenced_gives_the_call_its_value_and_leaves_the_stack_as_it_was() {
        let before = stack_probe_any();
        let release = fenced!(kernel_release()).expect("uname(2) answers");
        assert!(!release.is_empty());
        // SAFETY: fcntl(F_GETFD) on -1 touches no memory; it fails with EBADF.
        let refused = fenced!(unsafe { libc::fcntl(-1, libc::F_GETFD) });
        assert_eq!(refused, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EBADF));
        assert_eq!(stack_probe_any(), before, "the stack pointer moved");
    }

    /// [`stack_probe`] on every architecture.
    #[inline(never)]
    fn stack_probe_any() -> usize {
        let probe = 0u8;
        std::hint::black_box(std::ptr::addr_of!(probe)) as usize
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_return_stack_is_filled_only_under_the_mitigation_it_was_measured_under() {
        for (status, fill) in [
            ("Vulnerable: Safe RET, no microcode\n", true),
            ("Mitigation: Safe RET\n", true),
            ("Mitigation: IBPB\n", false),
            ("Not affected\n", false),
            ("", false), // no sysfs (a container without it, an old kernel)
        ] {
            assert_eq!(fill_pays(status), fill, "{status:?}");
        }
    }

    #[test]
    fn poll_timeouts_round_up_so_a_deadline_never_spins() {
        assert_eq!(poll_millis(Duration::ZERO), 0);
        assert_eq!(poll_millis(Duration::from_nanos(1)), 1);
        assert_eq!(poll_millis(Duration::from_micros(999)), 1);
        assert_eq!(poll_millis(Duration::from_millis(5)), 5);
        assert_eq!(poll_millis(Duration::from_micros(5001)), 6);
        assert_eq!(poll_millis(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
