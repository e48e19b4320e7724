//! `raw-copy`: a blocking `send(2)` loop. The kernel copies, so a buffer is free again as soon as
//! the call returns.
//!
//! Differs from zerotx's `copy` on purpose: the socket stays blocking (the kernel sleeps in the
//! call when the socket is full, where zerotx gets `EAGAIN` and polls), and nothing reads the
//! error queue.

use std::io;
use std::os::fd::OwnedFd;

use anyhow::Context;
use zerotx::BufPool;

use super::{send_bytes, BufRing};
use crate::bench::runner::{Counters, Driver, Latencies};

/// A plain `send` loop.
pub struct RawCopy {
    fd: OwnedFd,
    ring: BufRing,
    c: Counters,
}

impl RawCopy {
    /// Over `fd` (any connected socket), sending `size` bytes from `pool`.
    pub fn new(fd: OwnedFd, pool: &BufPool, size: usize) -> anyhow::Result<Self> {
        Ok(Self {
            fd,
            ring: BufRing::new(pool, size)?,
            c: Counters::default(),
        })
    }
}

impl Driver for RawCopy {
    #[inline]
    fn send(&mut self, lat: &mut Latencies) -> anyhow::Result<bool> {
        let p = self.ring.next();
        let len = self.ring.len;
        let mut off = 0;
        while off < len {
            // SAFETY: p..p+len lies in a block this ring holds for the run; send only reads it.
            let n = match unsafe { send_bytes(&self.fd, p.add(off), len - off, libc::MSG_NOSIGNAL) }
            {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("send(2)"),
            };
            off += n;
        }
        self.ring.commit();
        self.ring.release(lat);
        self.c.bytes += len as u64;
        self.c.engine_copied += 1;
        Ok(true)
    }

    fn reap(&mut self, _lat: &mut Latencies) -> anyhow::Result<()> {
        Ok(())
    }

    fn wait(&mut self, _lat: &mut Latencies) -> anyhow::Result<()> {
        Ok(())
    }

    fn flush(&mut self, _lat: &mut Latencies) -> anyhow::Result<()> {
        Ok(())
    }

    fn counters(&self) -> Counters {
        self.c
    }

    fn close(self) -> anyhow::Result<()> {
        Ok(())
    }
}
