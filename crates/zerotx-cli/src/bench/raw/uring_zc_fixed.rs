//! `raw-uring-zc-fixed`: `IORING_OP_SEND_ZC` from registered buffers, straight on the `io-uring`
//! crate, datagram sockets only.
//!
//! - The whole buffer ring is registered once as fixed buffer 0; each request names its block
//!   inside it (`IORING_RECVSEND_FIXED_BUF`), so no page is pinned per send.
//! - Requests are queued in the SQ and entered a batch at a time (`--batch`, 32 by default, as
//!   zerotx's), and whenever the loop waits.
//! - A buffer is reused only after its notification CQE (`IORING_CQE_F_NOTIF`), or after its
//!   first CQE when that says no notification follows (no `IORING_CQE_F_MORE`).
//! - `IORING_SEND_ZC_REPORT_USAGE` makes notifications say whether the kernel copied.
//!
//! Differs from zerotx's `uring-zc-fixed` on purpose, as a careful C program (and liburing's
//! `examples/send-zerocopy.c`) would: the ring is set up with `IORING_SETUP_COOP_TASKRUN` and
//! `IORING_SETUP_SINGLE_ISSUER`, which a zerotx sender cannot use: it may move between threads,
//! and another thread's `io_uring_enter` fails with `EEXIST` under `SINGLE_ISSUER`.
//! `COOP_TASKRUN` only drops the IPI that interrupts a submitting thread busy in user space (the
//! task work is still flagged, and a sleeping thread still woken: `__set_notify_signal`); a
//! zerotx build with it measured the same here (4 alternating rounds, 16 KiB and 65000 B, within
//! the runs' noise), so zerotx leaves its completions prompt. This loop enters the kernel only with
//! a full batch; zerotx does so inside [`Sender::send_batch`](zerotx::Sender::send_batch), and
//! otherwise also enters at once when nothing it submitted is in flight, so a lone send never
//! waits. Both name the socket as a registered file (`IOSQE_FIXED_FILE`; zerotx for datagram
//! sockets, while its ring has a slot free: `sys::uring::ring::FILE_SLOTS`). A stream socket is
//! refused: several requests in flight reorder a stream (docs/kernel.md, "io_uring SEND_ZC /
//! SENDMSG_ZC"), and zerotx keeps one in flight there, which is another program.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use io_uring::{cqueue, opcode, types, IoUring};
use zerotx::BufPool;

use super::{sock_type, BufRing};
use crate::bench::runner::{Counters, Driver, Latencies, FLUSH_TIMEOUT, WAIT_SLICE};
use crate::bench::settings::MAX_BATCH;

/// Submission queue entries (zerotx's default, twice the largest `--batch`); the CQ has twice as
/// many.
const ENTRIES: u32 = 2 * MAX_BATCH as u32;

const IORING_SEND_ZC_REPORT_USAGE: u16 = 8;
const IORING_NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// Slot state bits: the first CQE came; the notification came (or none will).
const FIRST: u8 = 1;
const NOTIF: u8 = 2;

/// SEND_ZC from registered buffers, by hand.
pub struct RawUringZcFixed {
    ring: IoUring,
    bufs: BufRing,
    /// The socket, registered as fixed file 0; kept open while requests may name it.
    _fd: OwnedFd,
    state: Vec<u8>,
    /// Pushed to the SQ and not yet entered.
    queued: u32,
    /// Requests per `io_uring_enter`.
    batch: u32,
    c: Counters,
}

impl RawUringZcFixed {
    /// Over `fd` (a connected datagram socket), sending `size` bytes from `pool`.
    pub fn new(fd: OwnedFd, pool: &BufPool, size: usize, batch: usize) -> anyhow::Result<Self> {
        if sock_type(&fd)? != libc::SOCK_DGRAM {
            bail!(
                "raw-uring-zc-fixed sends on datagram sockets only (several requests in flight \
                 reorder a stream)"
            );
        }
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_single_issuer()
            .setup_cqsize(ENTRIES * 2)
            .build(ENTRIES)
            .context("io_uring_setup")?;
        ring.submitter()
            .register_files(&[fd.as_raw_fd()])
            .context("IORING_REGISTER_FILES")?;
        let iov = BufRing::region(pool);
        // SAFETY: the region stays allocated while `bufs` holds the pool's blocks (and so the
        // pool), which outlives the ring: fields drop in order, the ring first.
        unsafe { ring.submitter().register_buffers(&[iov]) }.context("IORING_REGISTER_BUFFERS")?;
        let bufs = BufRing::new(pool, size)?;
        Ok(Self {
            ring,
            state: vec![0; bufs.size()],
            bufs,
            _fd: fd,
            queued: 0,
            batch: batch.clamp(1, MAX_BATCH) as u32,
            c: Counters::default(),
        })
    }

    fn enter(&mut self, want: usize, timeout: Option<Duration>) -> anyhow::Result<()> {
        let r = match timeout {
            None => self.ring.submit_and_wait(want),
            Some(t) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(want, &args)
            }
        };
        match r {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
            Err(e) => return Err(e).context("io_uring_enter"),
        }
        self.queued = 0;
        Ok(())
    }

    /// Applies every CQE, then releases the buffers at the tail that are done.
    fn complete(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        for cqe in self.ring.completion() {
            let slot = cqe.user_data() as usize;
            let flags = cqe.flags();
            if cqueue::notif(flags) {
                if (cqe.result() as u32) & IORING_NOTIF_USAGE_ZC_COPIED != 0 {
                    self.c.kernel_copied += 1;
                } else {
                    self.c.zerocopy += 1;
                }
                self.state[slot] |= NOTIF;
                continue;
            }
            if cqe.result() < 0 {
                return Err(io::Error::from_raw_os_error(-cqe.result())).context("SEND_ZC");
            }
            self.c.bytes += cqe.result() as u64;
            self.state[slot] |= if cqueue::more(flags) {
                FIRST
            } else {
                FIRST | NOTIF
            };
        }
        while self.bufs.in_flight() > 0 && self.state[self.bufs.tail_idx] == FIRST | NOTIF {
            self.state[self.bufs.tail_idx] = 0;
            self.bufs.release(lat);
        }
        Ok(())
    }
}

impl Driver for RawUringZcFixed {
    #[inline]
    fn send(&mut self, _lat: &mut Latencies) -> anyhow::Result<bool> {
        if self.bufs.is_full() {
            return Ok(false);
        }
        let slot = self.bufs.head_idx;
        let p = self.bufs.next();
        let sqe = opcode::SendZc::new(types::Fixed(0), p, self.bufs.len as u32)
            .buf_index(Some(0))
            .zc_flags(IORING_SEND_ZC_REPORT_USAGE)
            .build()
            .user_data(slot as u64);
        // SAFETY: the SQE points into a registered block this ring holds until the request's
        // notification came back, and names fixed file 0, registered for the ring's life.
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            self.enter(0, None)?;
        }
        self.bufs.commit();
        self.queued += 1;
        if self.queued >= self.batch {
            self.enter(0, None)?;
        }
        Ok(true)
    }

    fn reap(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        self.complete(lat)
    }

    fn wait(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        self.enter(1, Some(WAIT_SLICE))?;
        self.complete(lat)
    }

    fn flush(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        while self.bufs.in_flight() > 0 {
            if Instant::now() > deadline {
                bail!("{} buffers not released in time", self.bufs.in_flight());
            }
            self.wait(lat)?;
        }
        Ok(())
    }

    fn counters(&self) -> Counters {
        self.c
    }

    fn close(self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.bufs.in_flight() == 0,
            "{} buffers were still held at close",
            self.bufs.in_flight()
        );
        Ok(())
    }
}
