//! The benchmark method: how one run of one cell is timed, the same for every engine.
//!
//! - Buffers come from a ring of pooled, page-aligned blocks much larger than the L2 cache
//!   ([`buffer_ring`]), taken in FIFO order, so every send reads memory that is not hot (a single
//!   hot buffer flatters the copy path). Blocks are filled once; their content does not matter.
//! - Every run walks the ring in address order ([`ring_blocks`]), whatever order the run before
//!   it gave the blocks back in: how a run touched memory must not depend on its neighbour.
//! - One loop ([`measure`]) drives every engine through the [`Driver`] trait, zerotx's and the raw
//!   baselines alike, so the harness does the same work per send for each: a send, and every
//!   batch of sends ([`DEFAULT_BATCH`](super::settings::DEFAULT_BATCH), `--batch`) a
//!   non-blocking reap (the way a real zero-copy sender amortises `recvmsg(MSG_ERRQUEUE)`) and a
//!   clock read; when no buffer is free, a wait for a release (and a clock read).
//! - A buffer is reused only after its engine released it (the kernel is done with it).
//! - Time runs from the first send to the release of the last buffer (a flush), so a zero-copy
//!   engine cannot look fast by leaving work in flight.
//! - Release latency is sampled, one release in [`SAMPLE_EVERY`], into a vector sized up front:
//!   the harness keeps no per-send record of its own.
//! - Sender CPU is the process's CPU (`getrusage`, which counts io_uring's worker threads); the
//!   caller subtracts a local sink's.

use std::time::{Duration, Instant};

use anyhow::Context;
use zerotx::{BufPool, PoolBufMut};
use zerotx_testbed as testbed;

use super::result::Run;

/// One release in this many has its latency recorded: a prime, so the samples do not alias with
/// the reap period (a stride of 64 over reaps every 32 sends always picks the same place in a
/// batch: the freshest release, or the stalest).
pub const SAMPLE_EVERY: u32 = 61;

/// How long one wait for a release may block before the loop looks at the clock again.
pub const WAIT_SLICE: Duration = Duration::from_millis(200);

/// How long the final flush may take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// A ring of at least `ring_bytes` (and 64 blocks) of `size`-byte buffers, filled once; on huge
/// pages if `huge` ([`BufPool::huge`]).
pub fn buffer_ring(size: usize, ring_bytes: usize, huge: bool) -> anyhow::Result<BufPool> {
    let block = size.next_multiple_of(4096);
    let count = (ring_bytes / block).max(64);
    let pool = if huge {
        BufPool::huge(size, count)
    } else {
        BufPool::new(size, count)
    }
    .context("allocating the buffer ring")?;
    let mut all: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
    for (i, b) in all.iter_mut().enumerate() {
        b.fill(i as u8 | 1);
    }
    Ok(pool)
}

/// Every free block of `pool`, in address order: the order each driver cycles through them.
///
/// The pool's free list is a stack, so a plain `take` loop hands the blocks out in the reverse
/// of the order the last run dropped them in: ascending after one driver, descending or rotated
/// after another. Per run that made throughput bimodal at 4096 B (2100 or 2400 MB/s for the same
/// engine, each mode about as likely), and the first run of a size after the previous one
/// measured 7% below the second, whichever engine it was; both went away with a fixed order.
pub fn ring_blocks(pool: &BufPool) -> Vec<PoolBufMut> {
    let mut blocks: Vec<PoolBufMut> = std::iter::from_fn(|| pool.take()).collect();
    blocks.sort_unstable_by_key(|b| b.as_ptr());
    blocks
}

/// Counts down to the next sample: true once every [`SAMPLE_EVERY`] calls (no division).
#[derive(Debug, Clone, Copy)]
pub struct Every(u32);

impl Default for Every {
    fn default() -> Self {
        Self(SAMPLE_EVERY)
    }
}

impl Every {
    /// Counts one; true when this one is sampled.
    #[inline]
    pub fn tick(&mut self) -> bool {
        self.0 -= 1;
        if self.0 == 0 {
            self.0 = SAMPLE_EVERY;
            true
        } else {
            false
        }
    }
}

/// Release latencies, sampled.
#[derive(Debug, Default)]
pub struct Latencies {
    ns: Vec<u32>,
}

impl Latencies {
    /// Room for a run's samples, so recording never allocates.
    pub fn new() -> Self {
        Self {
            ns: Vec::with_capacity(1 << 16),
        }
    }

    /// Records one sampled latency.
    #[inline]
    pub fn record(&mut self, latency: Duration) {
        self.ns
            .push(latency.as_nanos().min(u32::MAX as u128) as u32);
    }

    /// p50 and p99 in microseconds, if anything was sampled.
    pub fn percentiles(mut self) -> (Option<f64>, Option<f64>) {
        if self.ns.is_empty() {
            return (None, None);
        }
        self.ns.sort_unstable();
        let at = |p: usize| {
            let i = (self.ns.len() * p / 100).min(self.ns.len() - 1);
            Some(f64::from(self.ns[i]) / 1000.0)
        };
        (at(50), at(99))
    }
}

/// What an engine counted over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `auto`: buffers its policy sent by copy (small, route copies, budget).
    pub policy_copied: u64,
    /// `auto`: how it sent, in a few words (`uring-zc`, `uring (route copies)`...).
    pub chosen: Option<&'static str>,
    /// Bytes the kernel accepted.
    pub bytes: u64,
    /// Buffers released as sent zero-copy.
    pub zerocopy: u64,
    /// Buffers released as copied by the kernel.
    pub kernel_copied: u64,
    /// Buffers sent by a copy engine.
    pub engine_copied: u64,
    /// Buffers sent by copy after the zero-copy budget ran out.
    pub fallbacks: u64,
    /// `ENOBUFS` answers.
    pub enobufs: u64,
}

/// One engine over one socket and one buffer ring, as [`measure`] drives it.
pub trait Driver {
    /// Sends the next free buffer; `false` when every buffer waits for its release.
    fn send(&mut self, lat: &mut Latencies) -> anyhow::Result<bool>;
    /// Without blocking: collects released buffers, which are free again.
    fn reap(&mut self, lat: &mut Latencies) -> anyhow::Result<()>;
    /// Blocks until a buffer is released or [`WAIT_SLICE`] passes, and collects releases.
    fn wait(&mut self, lat: &mut Latencies) -> anyhow::Result<()>;
    /// Blocks until every buffer is released (at most [`FLUSH_TIMEOUT`]).
    fn flush(&mut self, lat: &mut Latencies) -> anyhow::Result<()>;
    /// Counters so far.
    fn counters(&self) -> Counters;
    /// Ends the run: fails if the kernel still holds a buffer.
    fn close(self) -> anyhow::Result<()>;
}

/// Sends through `driver` for `duration`, reaping after every `batch` sends, then waits for every
/// release. `cpu_seconds` is the whole process's; the caller subtracts a local sink's.
pub fn measure<D: Driver>(mut driver: D, duration: Duration, batch: usize) -> anyhow::Result<Run> {
    let batch = batch.max(1);
    let mut lat = Latencies::new();
    let mut sends = 0u64;
    // Sends left before the next reap: a countdown, not `sends % batch`, whose division by a
    // value known only at run time would cost every send of every engine 10-40 cycles.
    let mut left = batch;
    let cpu0 = testbed::process_cpu_time();
    let start = Instant::now();
    loop {
        let reaped = if driver.send(&mut lat)? {
            sends += 1;
            left -= 1;
            let due = left == 0;
            if due {
                left = batch;
                driver.reap(&mut lat)?;
            }
            due
        } else {
            driver.wait(&mut lat)?;
            true
        };
        // The clock is read after a reap or a wait, not per send: a raw loop (liburing's example
        // reads it every 128 sends) does not pay a clock read per send either, and the run's time
        // is measured at its end whatever the overrun.
        if reaped && start.elapsed() >= duration {
            break;
        }
    }
    driver.flush(&mut lat)?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = (testbed::process_cpu_time() - cpu0).as_secs_f64();
    let c = driver.counters();
    driver.close()?;
    let (p50_us, p99_us) = lat.percentiles();
    Ok(Run {
        bytes: c.bytes,
        sends,
        seconds,
        cpu_seconds,
        zerocopy: c.zerocopy,
        kernel_copied: c.kernel_copied,
        engine_copied: c.engine_copied,
        fallbacks: c.fallbacks,
        enobufs: c.enobufs,
        policy_copied: c.policy_copied,
        chosen: c.chosen.map(String::from),
        p50_us,
        p99_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::settings::DEFAULT_BATCH;

    /// A driver with `slots` buffers that releases everything on each reap or wait.
    struct Fake {
        slots: usize,
        held: usize,
        sent: u64,
        reaps: u64,
        waits: u64,
        size: u64,
        every: Every,
    }

    impl Fake {
        fn release(&mut self, lat: &mut Latencies) {
            for _ in 0..self.held {
                if self.every.tick() {
                    lat.record(Duration::from_micros(5));
                }
            }
            self.held = 0;
        }
    }

    impl Driver for &mut Fake {
        fn send(&mut self, _: &mut Latencies) -> anyhow::Result<bool> {
            if self.held == self.slots {
                return Ok(false);
            }
            self.held += 1;
            self.sent += 1;
            Ok(true)
        }
        fn reap(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
            self.reaps += 1;
            self.release(lat);
            Ok(())
        }
        fn wait(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
            self.waits += 1;
            self.release(lat);
            Ok(())
        }
        fn flush(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
            self.release(lat);
            Ok(())
        }
        fn counters(&self) -> Counters {
            Counters {
                bytes: self.sent * self.size,
                ..Counters::default()
            }
        }
        fn close(self) -> anyhow::Result<()> {
            anyhow::ensure!(self.held == 0, "held at close");
            Ok(())
        }
    }

    #[test]
    fn the_loop_reaps_every_batch_of_sends_and_waits_only_when_the_ring_is_empty() {
        // More slots than a batch: the periodic reap keeps buffers flowing, no wait.
        let mut f = Fake {
            slots: 64,
            held: 0,
            sent: 0,
            reaps: 0,
            waits: 0,
            size: 100,
            every: Every::default(),
        };
        let run = measure(&mut f, Duration::from_millis(20), DEFAULT_BATCH).unwrap();
        assert_eq!(run.sends, f.sent);
        assert_eq!(run.bytes, f.sent * 100);
        assert_eq!(f.reaps, f.sent / DEFAULT_BATCH as u64);
        assert_eq!(f.waits, 0);
        assert_eq!(run.p50_us, Some(5.0));
        // Fewer slots than a batch: the ring runs dry and the loop waits.
        let mut g = Fake { slots: 8, ..f };
        g.sent = 0;
        g.reaps = 0;
        measure(&mut g, Duration::from_millis(20), DEFAULT_BATCH).unwrap();
        // Every 8 sends the ring is dry; one time in four the periodic reap came first.
        assert!(
            g.waits >= g.sent / 16,
            "{} waits, {} sends",
            g.waits,
            g.sent
        );
        assert_eq!(g.reaps, g.sent / DEFAULT_BATCH as u64);
        // Another batch: a reap every 5 sends.
        let mut h = Fake { slots: 64, ..f };
        (h.sent, h.reaps, h.waits) = (0, 0, 0);
        measure(&mut h, Duration::from_millis(20), 5).unwrap();
        assert_eq!((h.reaps, h.waits), (h.sent / 5, 0));
    }

    #[test]
    fn latencies_are_sampled_one_in_61() {
        let mut l = Latencies::new();
        let mut every = Every::default();
        let mut recorded = 0;
        for i in 0..610u64 {
            if every.tick() {
                l.record(Duration::from_micros(i));
                recorded += 1;
            }
        }
        assert_eq!(recorded, 10);
        let (p50, p99) = l.percentiles();
        assert_eq!(p50, Some(365.0));
        assert_eq!(p99, Some(609.0));
        assert_eq!(Latencies::new().percentiles(), (None, None));
    }

    #[test]
    fn every_run_takes_the_ring_in_address_order_whatever_order_it_came_back_in() {
        let pool = buffer_ring(4096, 1 << 20, false).unwrap();
        let first = ring_blocks(&pool);
        let addrs: Vec<_> = first.iter().map(|b| b.as_ptr()).collect();
        assert!(
            addrs.windows(2).all(|w| w[0] < w[1]),
            "the first run's ring is not in address order"
        );
        // Given back in a rotated order, as a FIFO driver stopped part way round leaves it.
        let mut first = std::collections::VecDeque::from(first);
        first.rotate_left(addrs.len() / 3);
        drop(first);
        let again: Vec<_> = ring_blocks(&pool).iter().map(|b| b.as_ptr()).collect();
        assert_eq!(again, addrs, "the next run walks the ring in another order");
    }

    #[test]
    fn the_buffer_ring_is_bigger_than_the_ring_bytes_and_page_aligned() {
        for huge in [false, true] {
            let pool = buffer_ring(1472, 1 << 20, huge).unwrap();
            assert_eq!(pool.block_size(), 4096);
            assert_eq!(pool.count(), 256);
            assert_eq!(pool.is_huge(), huge);
            let pool = buffer_ring(65000, 1 << 20, huge).unwrap();
            assert_eq!(pool.count(), 64, "at least 64 blocks");
        }
    }
}
