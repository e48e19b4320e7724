//! zerotx's engines as a [`Driver`]: the one place the benchmark calls the library's sender API.
//! Buffers go to [`zerotx::Sender`] as pooled buffers and come back from its reap; the harness
//! only moves them between the sender and a FIFO free list.
//!
//! They go a batch at a time ([`DEFAULT_BATCH`](super::settings::DEFAULT_BATCH), `--batch`)
//! through [`Sender::send_batch`], the library's call for throughput: the io_uring engines then
//! enter the kernel once per batch, as the raw io_uring loop does (`raw-uring-zc-fixed` enters
//! once per batch too) and liburing's example does (8 per submit). A plain `send` loop would also
//! enter for the first send after each reap, which finds nothing in flight where completions come
//! back at once (the black hole). `copy` sends a batch in one `sendmsg` on a stream (the buffers'
//! bytes in order); datagrams, and `msg-zc`, go one call per buffer (the library's batch trains
//! are off here: trains are columns of their own).

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::time::Duration;

use anyhow::{bail, Context};
use zerotx::{
    BufPool, CopyReason, EngineKind, PooledBuf, Released, SendError, SendPath, Sender, SenderConfig,
};

use super::runner::{ring_blocks, Counters, Driver, Latencies, FLUSH_TIMEOUT, WAIT_SLICE};
use super::Engine;

/// The library engine behind a column, and whether it sends from the registered ring.
fn kind(engine: Engine) -> Option<(EngineKind, bool)> {
    Some(match engine {
        Engine::Auto => (EngineKind::Auto, true),
        Engine::Copy => (EngineKind::Copy, false),
        Engine::MsgZc => (EngineKind::MsgZerocopy, false),
        Engine::Uring => (EngineKind::Uring, false),
        Engine::UringZc => (EngineKind::UringZc, false),
        Engine::UringZcFixed => (EngineKind::UringZc, true),
        Engine::TrainAuto => (EngineKind::Auto, true),
        Engine::TrainCopy => (EngineKind::Copy, false),
        Engine::TrainMsgZc => (EngineKind::MsgZerocopy, false),
        Engine::TrainUring => (EngineKind::Uring, false),
        Engine::TrainUringZc => (EngineKind::UringZc, false),
        Engine::TrainUringZcFixed => (EngineKind::UringZc, true),
        _ => return None,
    })
}

/// The ways a release can say `auto` sent it: zero-copy (or tried), copied for the route, small,
/// for the budget, or by a sender that has no zero-copy at all (`SO_ZEROCOPY` refused: `auto`
/// then copies every buffer).
const WAYS: usize = 5;

/// Which of the [`WAYS`] `path` is.
fn way(path: SendPath) -> usize {
    match path {
        SendPath::Copied(CopyReason::RouteCopies) => 1,
        SendPath::Copied(CopyReason::Small) => 2,
        SendPath::Copied(CopyReason::Budget | CopyReason::Fallback) => 3,
        SendPath::Copied(CopyReason::Engine) => 4,
        _ => 0,
    }
}

/// What `auto` settled on, in a few words: the system calls (io_uring or not), and how most of the
/// buffers released by the final flush went (the steady state; the whole run's counts if the
/// flush found none).
fn chosen(uring: bool, s: &zerotx::Stats, tail: &[u64; WAYS]) -> &'static str {
    let ways = if tail.iter().sum::<u64>() > 0 {
        *tail
    } else {
        [
            s.zerocopy + s.kernel_copied,
            s.copied_route,
            s.copied_small,
            s.copied_budget + s.fallbacks,
            s.engine_copied,
        ]
    };
    let most = (0..WAYS).max_by_key(|&i| (ways[i], WAYS - i)).unwrap_or(0);
    match (uring, most) {
        (true, 0) => "uring-zc",
        (true, 1) => "uring (route copies)",
        (true, 2) => "uring (small)",
        (true, 3) => "uring (budget)",
        (true, _) => "uring (no zero-copy)",
        (false, 0) => "msg-zc",
        (false, 1) => "copy (route copies)",
        (false, 2) => "copy (small)",
        (false, 3) => "copy (budget)",
        (false, _) => "copy (no zero-copy)",
    }
}

/// A zerotx sender over one socket, cycling through the buffer ring.
pub struct ZerotxDriver {
    tx: Sender<PooledBuf>,
    /// The free buffers, oldest release first. The first `queued` are taken: the next batch.
    free: VecDeque<PooledBuf>,
    /// Buffers taken from the front of `free` and not yet handed to the sender: at most
    /// `per_batch`. They move to `batch` together, right before the call.
    queued: usize,
    /// The buffers of the `send_batch` call (empty between calls; trains go straight from
    /// `free`).
    batch: VecDeque<PooledBuf>,
    /// Buffers per `send_batch` call.
    per_batch: usize,
    /// A train column's datagram size: each buffer goes as one train of `segment`-byte datagrams
    /// through [`Sender::send_train`].
    segment: Option<u16>,
    out: Vec<Released<PooledBuf>>,
    /// How the buffers released by the final flush went, by [`way`] (for `auto`).
    tail: [u64; WAYS],
    flushing: bool,
}

impl ZerotxDriver {
    /// A sender for `engine` (one of zerotx's) over `sock`, sending `size` bytes from `pool`,
    /// `batch` buffers per call (and per `io_uring_enter`); with `segment`, each buffer as one
    /// train of datagrams of that size, one `send_train` each.
    pub fn new(
        sock: OwnedFd,
        engine: Engine,
        pool: &BufPool,
        size: usize,
        segment: Option<u16>,
        batch: usize,
    ) -> anyhow::Result<Self> {
        let (kind, fixed) = kind(engine).context("not a zerotx engine")?;
        // A column measures one shape: its datagrams one call each, as the raw loops send them,
        // or (with `segment`) trains through `send_train`. `send_batch` would otherwise send a
        // batch of equal-size datagrams as trains, on every engine (io_uring's too).
        let cfg = SenderConfig::new(kind).with_batch_trains(false);
        let uring = cfg.uring.with_batch(batch);
        let cfg = cfg.with_uring(uring);
        let mut tx: Sender<PooledBuf> = Sender::with_config(sock, cfg)
            .with_context(|| format!("creating the {} engine", engine.name()))?;
        if fixed {
            tx.register_pool(pool)
                .context("registering the buffer ring with io_uring")?;
        }
        Ok(Self {
            tx,
            // Frozen once: the harness never writes a buffer, and a released one goes back as
            // it came.
            free: ring_blocks(pool)
                .into_iter()
                .map(|b| b.freeze(size))
                .collect(),
            queued: 0,
            batch: VecDeque::with_capacity(batch),
            per_batch: batch,
            segment,
            out: Vec::with_capacity(1024),
            tail: [0; WAYS],
            flushing: false,
        })
    }

    /// Hands the queued buffers to the sender, in one call. Inlined into the timed loop, as the
    /// raw drivers' sends are: the harness adds no call of its own around the library's (on the
    /// machines this runs on, returns after a system call can cost 0.5-0.8 us each,
    /// benches/syscall-return.c; the library fills the return stack against that, the harness
    /// would have to as well).
    #[inline(always)]
    fn send_batch(&mut self) -> anyhow::Result<()> {
        if self.queued > 0 {
            let queued = std::mem::take(&mut self.queued);
            if let Some(segment) = self.segment {
                return self.send_trains(segment, queued);
            }
            for _ in 0..queued {
                let buf = self.free.pop_front().expect("queued from the free buffers");
                self.batch.push_back(buf);
            }
            self.tx
                .send_batch(&mut self.batch)
                .map_err(std::io::Error::from)?;
        }
        Ok(())
    }

    /// Sends the first `queued` free buffers as trains, one [`Sender::send_train`] each, taken
    /// straight from the free list (as the raw train loop takes the next buffer of its ring). A
    /// refusal ([`SendError::Invalid`]: this engine sends no trains) fails the run with the
    /// library's reason, which the table shows as the cell's error (its figures n/a).
    fn send_trains(&mut self, segment: u16, queued: usize) -> anyhow::Result<()> {
        for _ in 0..queued {
            let buf = self.free.pop_front().expect("queued from the free buffers");
            let Err(e) = self.tx.send_train(buf, segment) else {
                continue;
            };
            let why = match &e {
                SendError::Invalid { reason, .. } => format!("refuses trains: {reason}"),
                SendError::Io { error, .. } => format!("a train failed: {error}"),
                _ => "a blocking train came back unsent".into(),
            };
            // Nothing is lost: the buffer goes back to the front of the free list, where the
            // rest of the batch still is.
            self.free.push_front(e.into_inner());
            bail!("the engine {why}");
        }
        Ok(())
    }

    /// Takes the reports of the released buffers (a sampled latency, an error, how `auto` sent
    /// the last ones), then puts the buffers back at the end of the free list, all at once.
    fn recycle(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        for r in &mut self.out {
            // The library timed one send in 61 (Report::latency).
            if let Some(l) = r.report.latency {
                lat.record(l);
            }
            if let Some(e) = r.report.error.take() {
                return Err(anyhow::Error::new(e).context("a send failed part way"));
            }
        }
        if self.flushing {
            for r in &self.out {
                self.tail[way(r.report.path)] += 1;
            }
        }
        self.free.extend(self.out.drain(..).map(|r| r.buf));
        Ok(())
    }
}

impl Driver for ZerotxDriver {
    #[inline]
    fn send(&mut self, _lat: &mut Latencies) -> anyhow::Result<bool> {
        if self.queued == self.free.len() {
            return Ok(false);
        }
        self.queued += 1;
        if self.queued >= self.per_batch {
            self.send_batch()?;
        }
        Ok(true)
    }

    fn reap(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        self.send_batch()?;
        self.tx.reap(&mut self.out).context("reaping completions")?;
        self.recycle(lat)
    }

    fn wait(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        self.send_batch()?;
        self.tx
            .wait_released(&mut self.out, Some(WAIT_SLICE))
            .context("waiting for completions")?;
        self.recycle(lat)
    }

    fn flush(&mut self, lat: &mut Latencies) -> anyhow::Result<()> {
        self.send_batch()?;
        self.tx
            .flush(FLUSH_TIMEOUT)
            .context("waiting for the last completions")?;
        self.flushing = true;
        self.reap(lat)
    }

    fn counters(&self) -> Counters {
        let s = self.tx.stats();
        let policy_copied = s.copied_small + s.copied_route + s.copied_budget;
        Counters {
            bytes: s.bytes,
            zerocopy: s.zerocopy,
            kernel_copied: s.kernel_copied,
            engine_copied: s.engine_copied,
            fallbacks: s.fallbacks,
            enobufs: s.enobufs,
            policy_copied,
            chosen: (self.tx.engine() == EngineKind::Auto)
                .then(|| chosen(self.tx.explain().path == "io_uring", &s, &self.tail)),
        }
    }

    fn close(self) -> anyhow::Result<()> {
        let closed = self.tx.close(Duration::from_secs(1));
        if closed.kept > 0 {
            bail!("{} buffers were still held at close", closed.kept);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_without_zero_copy_is_reported_as_copying() {
        // `auto` on a socket that refused SO_ZEROCOPY releases every buffer as copied by its
        // engine: that is plain copy, not `msg-zc` (which it was reported as before).
        let tail = [0, 0, 0, 0, 32];
        assert_eq!(
            chosen(false, &zerotx::Stats::default(), &tail),
            "copy (no zero-copy)"
        );
        assert_eq!(
            chosen(true, &zerotx::Stats::default(), &tail),
            "uring (no zero-copy)"
        );
        // The run's counts when the flush released nothing.
        let mut s = zerotx::Stats::default();
        s.engine_copied = 100;
        s.zerocopy = 3;
        assert_eq!(chosen(false, &s, &[0; WAYS]), "copy (no zero-copy)");
    }

    #[test]
    fn auto_reports_the_way_most_buffers_went() {
        assert_eq!(
            chosen(false, &zerotx::Stats::default(), &[20, 1, 0, 0, 0]),
            "msg-zc"
        );
        assert_eq!(
            chosen(true, &zerotx::Stats::default(), &[1, 0, 20, 0, 0]),
            "uring (small)"
        );
        assert_eq!(
            chosen(false, &zerotx::Stats::default(), &[1, 20, 0, 0, 0]),
            "copy (route copies)"
        );
        // Ties go to the first way: zero-copy.
        assert_eq!(
            chosen(false, &zerotx::Stats::default(), &[5, 0, 0, 5, 0]),
            "msg-zc"
        );
        for (i, path) in [
            SendPath::ZeroCopy,
            SendPath::Copied(CopyReason::RouteCopies),
            SendPath::Copied(CopyReason::Small),
            SendPath::Copied(CopyReason::Budget),
            SendPath::Copied(CopyReason::Engine),
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(way(path), i, "{path:?}");
        }
    }
}
