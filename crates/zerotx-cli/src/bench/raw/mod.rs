//! Minimal senders written for the comparison (issue 8): what a careful C program would do with
//! `libc` and the `io-uring` crate directly, with no abstraction between the loop and the kernel.
//! zerotx's engines are judged against them in the same run and topology.
//!
//! They follow the same rules as zerotx's engines, so the comparison measures the library's own
//! costs and nothing else:
//! - the same buffer ring ([`buffer_ring`](super::runner::buffer_ring)), in FIFO order
//!   ([`BufRing`]);
//! - a buffer is reused only after the kernel released it (its completion id, or its
//!   notification CQE, came back);
//! - the same timed loop ([`measure`](super::runner::measure)), reaping every
//!   batch of sends ([`DEFAULT_BATCH`](super::settings::DEFAULT_BATCH), `--batch`) and waiting
//!   only when no buffer is free;
//! - the same entry into the kernel for a send: an inline `syscall` ([`send_bytes`]), as zerotx's
//!   `copy` and `msg-zc` make it, not glibc's wrapper (on the machines this was measured on the
//!   wrapper cost 11-18% of a `MSG_ZEROCOPY` send; see [`send_bytes`]). Both io_uring loops,
//!   zerotx's and this one, enter through the `io-uring` crate (glibc's `syscall()`).
//!
//! What they leave out is what the library adds: per-send bookkeeping of owned buffers, id rules
//! per protocol, path-MTU checks, a generic engine trait, error recovery. Where they differ from
//! zerotx on purpose, each file says so.
#![allow(unsafe_code)]

mod copy;
mod msg_zc;
mod train;
mod uring_zc_fixed;

pub use copy::RawCopy;
pub use msg_zc::RawMsgZc;
pub use train::{train_copy, train_msg_zc};
pub use uring_zc_fixed::RawUringZcFixed;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use anyhow::Context;
use zerotx::{BufPool, PoolBufMut};

use super::runner::{ring_blocks, Every, Latencies};

/// Turns a libc `-1` into the OS error.
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `send(2)` of `len` bytes at `p`, entered as the library enters it: an inline `syscall`
/// instruction (rustix), not glibc's wrapper. On the machines this was measured on (AMD EPYC
/// VMs with the SRSO "Safe RET" mitigation) a function return into a frame older than the
/// system call is costly (benches/syscall-return.c): the same loop through glibc's `send` made
/// 11-18% fewer `MSG_ZEROCOPY` sends per second at 65000 B (benches/compare-raw-results.md).
/// The baselines enter the kernel the way zerotx does, so the comparison measures the library's
/// own work, not this. (`recvmsg(MSG_ERRQUEUE)`, once per reap, goes through glibc in both.)
///
/// # Safety
/// `p..p + len` must be initialised memory, readable and not written for the call (it is made a
/// `&[u8]`).
#[inline(always)]
unsafe fn send_bytes(
    fd: &OwnedFd,
    p: *const u8,
    len: usize,
    flags: libc::c_int,
) -> io::Result<usize> {
    // SAFETY: the caller's promise.
    let bytes = unsafe { std::slice::from_raw_parts(p, len) };
    let flags = rustix::net::SendFlags::from_bits_retain(flags as u32);
    rustix::net::send(fd, bytes, flags).map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
}

/// `getsockopt(fd, level, name)` of an int option.
fn sockopt(fd: &OwnedFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are live locals of the sizes getsockopt is told.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

/// `setsockopt(fd, level, name, v)` of an int option.
fn set_sockopt(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: v is a live local of the size setsockopt is told.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// `poll(2)` on one descriptor for up to `ms` milliseconds (`POLLERR` is always reported).
fn poll_one(fd: &OwnedFd, events: libc::c_short, ms: libc::c_int) -> io::Result<()> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one live pollfd, count 1.
    match cvt(unsafe { libc::poll(&mut p, 1, ms) }) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        r => r.map(drop),
    }
}

/// The buffer ring as raw pointers, sent and released in FIFO order, one sequence number per
/// buffer. It holds every block of the pool for the run, so nothing else hands them out; if the
/// kernel may still read some when it is dropped, it leaks them instead of giving them back.
struct BufRing {
    blocks: Vec<PoolBufMut>,
    ptrs: Vec<*const u8>,
    len: usize,
    /// Sequence number of the next buffer to send, and its index.
    head: u64,
    head_idx: usize,
    /// Sequence number of the oldest buffer not yet released, and its index.
    tail: u64,
    tail_idx: usize,
    /// Send times of the sampled buffers (one in [`SAMPLE_EVERY`](super::runner::SAMPLE_EVERY)), by sequence number.
    stamps: VecDeque<(u64, Instant)>,
    every: Every,
}

impl BufRing {
    fn new(pool: &BufPool, len: usize) -> anyhow::Result<Self> {
        let blocks = ring_blocks(pool);
        anyhow::ensure!(!blocks.is_empty(), "the buffer ring is empty");
        anyhow::ensure!(
            len <= blocks[0].len(),
            "{len} B does not fit the ring's blocks"
        );
        let ptrs = blocks.iter().map(|b| b.as_ptr()).collect();
        Ok(Self {
            blocks,
            ptrs,
            len,
            head: 0,
            head_idx: 0,
            tail: 0,
            tail_idx: 0,
            stamps: VecDeque::with_capacity(64),
            every: Every::default(),
        })
    }

    fn size(&self) -> usize {
        self.ptrs.len()
    }

    #[inline]
    fn in_flight(&self) -> u64 {
        self.head - self.tail
    }

    #[inline]
    fn is_full(&self) -> bool {
        self.in_flight() == self.ptrs.len() as u64
    }

    /// The next buffer to send; stamps its send time if it is one of the sampled ones. Call
    /// right before the send, then [`commit`](Self::commit) once it went.
    #[inline]
    fn next(&mut self) -> *const u8 {
        if self.every.tick() {
            self.stamps.push_back((self.head, Instant::now()));
        }
        self.ptrs[self.head_idx]
    }

    /// The buffer from [`next`](Self::next) was sent.
    #[inline]
    fn commit(&mut self) {
        self.head += 1;
        self.head_idx += 1;
        if self.head_idx == self.ptrs.len() {
            self.head_idx = 0;
        }
    }

    /// The oldest buffer in flight was released.
    #[inline]
    fn release(&mut self, lat: &mut Latencies) {
        debug_assert!(self.tail < self.head);
        if let Some(&(seq, t)) = self.stamps.front() {
            if seq == self.tail {
                lat.record(t.elapsed());
                self.stamps.pop_front();
            }
        }
        self.tail += 1;
        self.tail_idx += 1;
        if self.tail_idx == self.ptrs.len() {
            self.tail_idx = 0;
        }
    }

    /// The whole pool region, for registering it with io_uring.
    fn region(pool: &BufPool) -> libc::iovec {
        let (base, len) = pool.region();
        libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            // The kernel may still read them: never hand them out again.
            std::mem::forget(std::mem::take(&mut self.blocks));
        }
    }
}

/// The socket's `SO_TYPE`.
fn sock_type(fd: &OwnedFd) -> anyhow::Result<libc::c_int> {
    sockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE).context("getsockopt(SO_TYPE)")
}
