//! One run of one cell, for real: the [`CellRunner`] the scheduler drives inside a topology. It
//! keeps the buffer ring of the current size, opens a fresh socket per run, picks the driver for
//! the engine column, and charges the run only for the sender's CPU.

use anyhow::Context;
use zerotx::BufPool;

use super::engine::Engine;
use super::result::Run;
use super::runner::{buffer_ring, measure};
use super::scheduler::{CellRunner, Slot};
use super::settings::Settings;
use super::topology::{Cpus, Site};
use super::zerotx_engine::ZerotxDriver;
use super::{liburing, raw};

/// Runs cells of one topology.
pub struct Cells<'a> {
    opts: &'a Settings,
    site: &'a mut dyn Site,
    sizes: &'a [usize],
    cpus: Cpus,
    /// The ring for the size being measured, by whether it is on huge pages: every engine at that
    /// size cycles through one of them.
    pool: [Option<(usize, BufPool)>; 2],
}

impl<'a> Cells<'a> {
    /// Cells over `sizes` and `opts.engines`, sending into `site`.
    pub fn new(opts: &'a Settings, site: &'a mut dyn Site, sizes: &'a [usize], cpus: Cpus) -> Self {
        Self {
            opts,
            site,
            sizes,
            cpus,
            pool: [None, None],
        }
    }

    /// The ring of `len`-byte buffers `engine` cycles through: on huge pages under
    /// `--huge-pages`, unless the engine registers it with io_uring (which refuses a huge pool:
    /// see `BufPool::huge`).
    fn pool(&mut self, engine: Engine, len: usize) -> anyhow::Result<BufPool> {
        let huge = self.opts.huge_pages && !engine.registers_ring();
        let slot = &mut self.pool[usize::from(huge)];
        match slot {
            Some((s, p)) if *s == len => Ok(p.clone()),
            _ => {
                *slot = None; // free the last ring before allocating the next
                let p = buffer_ring(len, self.opts.ring_bytes, huge)?;
                *slot = Some((len, p.clone()));
                Ok(p)
            }
        }
    }

    fn measure_on_socket(&mut self, engine: Engine, size: usize) -> anyhow::Result<Run> {
        // A train column sends `datagrams` datagrams of `size` bytes per call, from one buffer.
        let datagrams = self.opts.datagrams(engine, size);
        let pool = self.pool(engine, size * datagrams)?;
        let fd = self.site.open()?;
        let (d, b) = (self.opts.run, self.opts.batch);
        let run = match engine {
            Engine::RawTrainCopy => {
                raw::train_copy(fd, &pool, size, datagrams).and_then(|r| measure(r, d, b))
            }
            Engine::RawTrainMsgZc => {
                raw::train_msg_zc(fd, &pool, size, datagrams).and_then(|r| measure(r, d, b))
            }
            Engine::RawCopy => raw::RawCopy::new(fd, &pool, size).and_then(|r| measure(r, d, b)),
            Engine::RawMsgZc => raw::RawMsgZc::new(fd, &pool, size).and_then(|r| measure(r, d, b)),
            Engine::RawUringZcFixed => {
                raw::RawUringZcFixed::new(fd, &pool, size, b).and_then(|r| measure(r, d, b))
            }
            _ => {
                // zerotx's train columns send each buffer as one train of `size`-byte datagrams.
                let segment = engine
                    .is_train()
                    .then(|| u16::try_from(size))
                    .transpose()
                    .with_context(|| format!("a {size} B datagram does not fit a train segment"))?;
                ZerotxDriver::new(fd, engine, &pool, size * datagrams, segment, b)
                    .and_then(|z| measure(z, d, b))
            }
        };
        // The run closed its socket either way: take the sink's report now, or the next run
        // would read this one's.
        let sink = self.site.sink_cpu()?;
        let mut run = run?;
        run.cpu_seconds = (run.cpu_seconds - sink.as_secs_f64()).max(0.0);
        Ok(run)
    }
}

impl CellRunner for Cells<'_> {
    type Run = Run;

    fn run(&mut self, slot: Slot) -> anyhow::Result<Run> {
        let size = self.sizes[slot.size];
        let engine = self.opts.engines[slot.engine];
        if engine == Engine::LiburingZcFixed {
            let path = self
                .opts
                .liburing
                .as_deref()
                .context("no --liburing PATH")?;
            let target = self.site.udp_target().context(
                "liburing's send-zerocopy is measured in udp-blackhole only (on a stream it \
                 keeps several requests in flight, which reorders the stream)",
            )?;
            return liburing::run(path, target, size, self.opts.run, self.cpus.sender);
        }
        self.measure_on_socket(engine, size)
    }
}
