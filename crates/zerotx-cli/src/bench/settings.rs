//! What one `zerotx bench` run measures, checked (`options.rs` builds it from the flags): the
//! bench's own input, so it knows nothing of the command line or of where results go.

use std::path::PathBuf;
use std::time::Duration;

use super::topology::Choice;
use super::Engine;

/// Sends between two non-blocking reaps, and buffers per `send_batch` call for zerotx's engines,
/// unless `--batch` says otherwise.
///
/// The batch is what a library call amortises: the call itself, and the returns after its system
/// calls, which the raw loops (inlined into [`measure`](super::runner::measure)) never make and
/// the library makes cheap with its return-stack fill (docs/fast-path.md, "The return-stack
/// fill"; the figures are in benches/HISTORY.md).
pub const DEFAULT_BATCH: usize = 32;

/// The largest `--batch`: half the io_uring rings' submission queues (256 entries, zerotx's
/// default and the raw loop's), so the completions of one batch of zero-copy sends (a CQE and a
/// notification each) fill at most half of the completion queue (512) between two reaps.
pub const MAX_BATCH: usize = 128;

/// Datagrams per train in the train columns, unless `--train` says otherwise: as many 1472 B
/// datagrams as one GSO skb carries (44 x 1472 B = 64768 B; docs/kernel.md, "UDP GSO trains:
/// the kernel's limits, measured").
pub const DEFAULT_TRAIN: usize = 44;

/// The most datagrams `--train` takes: the kernel's segments-per-call limit (`UDP_MAX_SEGMENTS`,
/// 128 on every kernel measured, 64 on older ones, which refuse more with `EINVAL`;
/// docs/kernel.md, "UDP GSO trains: the kernel's limits, measured").
pub const MAX_TRAIN: usize = 128;

/// The most UDP payload one train carries over IPv4: one skb of at most 64 KiB, IP and UDP
/// headers included.
pub const MAX_TRAIN_BYTES: usize = 65507;

/// The checked settings of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Time per run of one cell.
    pub run: Duration,
    /// Repetitions per cell.
    pub repeat: usize,
    /// Sizes given on the command line (sorted, deduplicated); `None`: each topology's own.
    pub sizes: Option<Vec<usize>>,
    /// Engine columns, in order.
    pub engines: Vec<Engine>,
    /// Topologies, in order.
    pub topologies: Vec<Choice>,
    /// Bytes of the buffer ring each run cycles through.
    pub ring_bytes: usize,
    /// The ring on huge pages for engines that do not register it (`--huge-pages`).
    pub huge_pages: bool,
    /// Seed of the run order (`--seed`).
    pub seed: u64,
    /// Buffers per batch (`--batch`).
    pub batch: usize,
    /// liburing's send-zerocopy example, when its column is wanted.
    pub liburing: Option<PathBuf>,
    /// A line per run on standard error off a terminal (`--progress`).
    pub progress: bool,
    /// Datagrams per train in the train columns (`--train`).
    pub train: usize,
}

impl Settings {
    /// Datagrams per send of `engine` at `size`: a train's, at most as many as fit one GSO skb
    /// ([`MAX_TRAIN_BYTES`]); 1 for the other columns.
    pub fn datagrams(&self, engine: Engine, size: usize) -> usize {
        if engine.is_train() {
            self.train.min(MAX_TRAIN_BYTES / size.max(1)).max(1)
        } else {
            1
        }
    }
}
