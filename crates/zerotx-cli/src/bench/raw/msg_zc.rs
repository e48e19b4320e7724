//! `raw-msg-zc`: `send(MSG_ZEROCOPY)` on a blocking IP socket, completions read from the socket
//! error queue (`recvmsg(MSG_ERRQUEUE)`) only when the loop asks for them: every
//! batch of sends ([`DEFAULT_BATCH`](crate::bench::settings::DEFAULT_BATCH), `--batch`), or when
//! every buffer is in flight.
//!
//! - Each successful call takes the next completion id (docs/kernel.md, "MSG_ZEROCOPY (sendmsg +
//!   socket error queue)"); a buffer records the id count after its last call, and is released
//!   once every id below that completed (ids may complete out of order: they are marked, and the
//!   watermark moves over the completed prefix).
//! - `ENOBUFS` is the zero-copy budget (no `IP_RECVERR` here, so no qdisc drop answers it): read
//!   completions and retry; with no id in flight, send that buffer by copy (a fallback).
//! - Anything else fails the run: in the black hole nothing else is expected.
//!
//! Differs from zerotx's `msg-zc` on purpose: a blocking socket, no per-protocol id rules (a UDP
//! send that fails after taking an id ends the run instead), no path-MTU check (the black hole's
//! MTU fits every size), IPv4/IPv6 only.

use std::collections::VecDeque;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use zerotx::BufPool;

use super::{poll_one, send_bytes, set_sockopt, sock_type, sockopt, BufRing};
use crate::bench::runner::{Counters, Driver, Latencies, FLUSH_TIMEOUT, WAIT_SLICE};

const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// `send(MSG_ZEROCOPY)` and the error queue, by hand.
pub struct RawMsgZc {
    fd: OwnedFd,
    ring: BufRing,
    stream: bool,
    /// Per ring slot: the id count once that buffer's calls were made.
    ends: Vec<u64>,
    ids: Ids,
    /// Control buffer for one error-queue message (a completion needs 48 bytes).
    control: [u64; 64],
    c: Counters,
}

impl RawMsgZc {
    /// Over `fd` (a connected IPv4/IPv6 TCP or UDP socket), sending `size` bytes from `pool`.
    pub fn new(fd: OwnedFd, pool: &BufPool, size: usize) -> anyhow::Result<Self> {
        let domain = sockopt(&fd, libc::SOL_SOCKET, libc::SO_DOMAIN).context("SO_DOMAIN")?;
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            bail!("raw-msg-zc sends on IPv4 and IPv6 sockets only");
        }
        let stream = sock_type(&fd)? == libc::SOCK_STREAM;
        set_sockopt(&fd, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1)
            .context("setsockopt(SO_ZEROCOPY)")?;
        let ring = BufRing::new(pool, size)?;
        Ok(Self {
            fd,
            ends: vec![0; ring.size()],
            ring,
            stream,
            ids: Ids::new(0),
            control: [0; 64],
            c: Counters::default(),
        })
    }

    /// Reads the error queue dry and releases every buffer whose ids all completed. Returns the
    /// number of ids that completed.
    fn drain(&mut self, lat: &mut Latencies) -> anyhow::Result<u64> {
        let mut ids = 0;
        loop {
            // SAFETY: msghdr is a plain C struct; all-zeroes is "no name, no iovec".
            let mut msg: libc::msghdr = unsafe { mem::zeroed() };
            msg.msg_control = self.control.as_mut_ptr().cast();
            msg.msg_controllen = mem::size_of_val(&self.control);
            // SAFETY: msg points at the live control buffer of the length given; no iovec.
            let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_ERRQUEUE) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e).context("recvmsg(MSG_ERRQUEUE)"),
                }
            }
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                bail!("recvmsg(MSG_ERRQUEUE): control data truncated");
            }
            // SAFETY: msg describes the control buffer the kernel just filled; the CMSG macros
            // walk it within msg_controllen.
            let mut cm = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            while !cm.is_null() {
                // SAFETY: cm is a header inside the control buffer (CMSG_FIRSTHDR/NXTHDR).
                let h = unsafe { &*cm };
                let recverr = (h.cmsg_level == libc::SOL_IP && h.cmsg_type == libc::IP_RECVERR)
                    || (h.cmsg_level == libc::SOL_IPV6 && h.cmsg_type == libc::IPV6_RECVERR);
                let need = mem::size_of::<libc::sock_extended_err>();
                // SAFETY: CMSG_LEN only computes a length.
                if recverr && h.cmsg_len as usize >= unsafe { libc::CMSG_LEN(need as u32) } as usize
                {
                    // SAFETY: the payload holds a sock_extended_err (length checked above);
                    // read_unaligned because the control buffer promises no alignment for it.
                    let ee: libc::sock_extended_err =
                        unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast()) };
                    if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY && ee.ee_errno == 0 {
                        let n = self.ids.complete(ee.ee_info, ee.ee_data);
                        if ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0 {
                            self.c.kernel_copied += n;
                        } else {
                            self.c.zerocopy += n;
                        }
                        ids += n;
                    }
                }
                // SAFETY: as for CMSG_FIRSTHDR.
                cm = unsafe { libc::CMSG_NXTHDR(&msg, cm) };
            }
        }
        while self.ring.in_flight() > 0 && self.ends[self.ring.tail_idx] <= self.ids.watermark {
            self.ring.release(lat);
        }
        Ok(ids)
    }
}

impl Driver for RawMsgZc {
    #[inline]
    fn send(&mut self, lat: &mut Latencies) -> anyhow::Result<bool> {
        if self.ring.is_full() {
            return Ok(false);
        }
        let p = self.ring.next();
        let len = self.ring.len;
        let mut flags = libc::MSG_ZEROCOPY | libc::MSG_NOSIGNAL;
        let mut off = 0;
        while off < len {
            // SAFETY: p..p+len lies in a block this ring holds until the kernel released it.
            let e = match unsafe { send_bytes(&self.fd, p.add(off), len - off, flags) } {
                Ok(n) => {
                    if flags & libc::MSG_ZEROCOPY != 0 {
                        self.ids.take();
                    }
                    off = if self.stream { off + n } else { len };
                    continue;
                }
                Err(e) => e,
            };
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::ENOBUFS) if flags & libc::MSG_ZEROCOPY != 0 => {
                    self.c.enobufs += 1;
                    if self.drain(lat)? == 0 {
                        if self.ids.in_flight() == 0 {
                            flags &= !libc::MSG_ZEROCOPY;
                            self.c.fallbacks += 1;
                        } else {
                            poll_one(&self.fd, 0, 1)?;
                        }
                    }
                }
                _ => return Err(e).context("send(MSG_ZEROCOPY)"),
            }
        }
        self.ends[self.ring.head_idx] = self.ids.next;
        self.ring.commit();
        self.c.bytes += len as u64;
        Ok(true)
    }

    fn reap(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        self.drain(lat).map(drop)
    }

    fn wait(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        let before = self.ring.tail;
        self.drain(lat)?;
        if self.ring.tail == before && self.ring.in_flight() > 0 {
            poll_one(&self.fd, 0, WAIT_SLICE.as_millis() as i32)?;
            self.drain(lat)?;
        }
        Ok(())
    }

    fn flush(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        while self.ring.in_flight() > 0 {
            if Instant::now() > deadline {
                bail!("{} buffers not released in time", self.ring.in_flight());
            }
            self.wait(lat)?;
        }
        Ok(())
    }

    fn counters(&self) -> Counters {
        self.c
    }

    fn close(mut self) -> anyhow::Result<()> {
        let mut lat = Latencies::default();
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.ring.in_flight() > 0 && Instant::now() < deadline {
            self.wait(&mut lat)?;
        }
        anyhow::ensure!(
            self.ring.in_flight() == 0,
            "{} buffers were still held at close",
            self.ring.in_flight()
        );
        Ok(())
    }
}

/// The socket's completion ids as a window: every id below `watermark` completed; `pending`
/// says which of the later ones did (ranges may come out of order).
struct Ids {
    /// The next id a successful call takes, counted from the first (no wrap).
    next: u64,
    watermark: u64,
    pending: VecDeque<bool>,
}

impl Ids {
    fn new(first: u64) -> Self {
        Self {
            next: first,
            watermark: first,
            pending: VecDeque::with_capacity(4096),
        }
    }

    /// A call took the next id.
    #[inline]
    fn take(&mut self) {
        self.next += 1;
        self.pending.push_back(false);
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Marks the kernel's inclusive range `lo..=hi` (u32, may cross the wrap) completed and moves
    /// the watermark over the completed prefix. Returns how many ids in flight it completed;
    /// ids already completed or never taken are ignored.
    fn complete(&mut self, lo: u32, hi: u32) -> u64 {
        let count = hi.wrapping_sub(lo).wrapping_add(1);
        let base = self.watermark as u32;
        let mut n = 0;
        for k in 0..count {
            let off = lo.wrapping_add(k).wrapping_sub(base) as usize;
            if let Some(done) = self.pending.get_mut(off) {
                n += u64::from(!*done);
                *done = true;
            }
        }
        while self.pending.front() == Some(&true) {
            self.pending.pop_front();
            self.watermark += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_ranges_move_the_watermark() {
        let mut ids = Ids::new(0);
        (0..5).for_each(|_| ids.take());
        assert_eq!(ids.complete(0, 2), 3);
        assert_eq!((ids.watermark, ids.in_flight()), (3, 2));
        assert_eq!(ids.complete(3, 4), 2);
        assert_eq!((ids.watermark, ids.in_flight()), (5, 0));
    }

    #[test]
    fn a_later_range_first_holds_the_watermark_until_the_gap_fills() {
        let mut ids = Ids::new(0);
        (0..4).for_each(|_| ids.take());
        assert_eq!(ids.complete(2, 3), 2);
        assert_eq!(ids.watermark, 0, "ids 0 and 1 are still out");
        assert_eq!(ids.complete(2, 3), 0, "a repeat completes nothing");
        assert_eq!(ids.complete(0, 1), 2);
        assert_eq!(ids.watermark, 4);
    }

    #[test]
    fn ranges_cross_the_u32_wrap_and_unknown_ids_are_ignored() {
        let first = u64::from(u32::MAX) - 1;
        let mut ids = Ids::new(first);
        (0..4).for_each(|_| ids.take()); // u32 ids MAX-1, MAX, 0, 1
        assert_eq!(ids.complete(u32::MAX - 1, 0), 3);
        assert_eq!(ids.watermark, first + 3);
        assert_eq!(ids.complete(5, 9), 0, "never taken");
        assert_eq!(ids.complete(1, 1), 1);
        assert_eq!(ids.in_flight(), 0);
    }
}
