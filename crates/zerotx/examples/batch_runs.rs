//! A fixed amount of `send_batch` work into a black hole with carrier (docs/kernel.md, "This
//! machine (what a test can rely on)"), for timing whole runs A/B: `--count N` batches of 44
//! datagrams of 1472 B (or, with `--alternate`, of 1000 and 1001 B in turn, which make no runs)
//! through a sender of `--engine` (default `auto`, as `Sender::new` builds it), with a batch's
//! runs as trains unless `--no-trains`. Prints the sender's counts (requests or calls, trains,
//! buffers in trains) and the sending thread's CPU time on stderr.
//!
//! ```sh
//! sudo cargo run --release -p zerotx --example batch_runs -- --count 20000 [--no-trains]
//! ```
//! Runs in a network namespace of its own; sends only to 192.0.2.2 inside it.

use std::collections::VecDeque;
use std::time::Duration;

use zerotx::{EngineKind, Released, Sender, SenderConfig};
use zerotx_testbed::{carrier_black_hole, in_new_netns, thread_cpu_time, Segmentation};

/// Datagrams per batch: one full GSO packet of 1472 B datagrams.
const PER_BATCH: usize = 44;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        let i = args.iter().position(|a| a == name)?;
        args.get(i + 1).cloned()
    };
    let count: u64 = value("--count").map_or(10_000, |c| c.parse().expect("--count N"));
    let engine: EngineKind = value("--engine").map_or(EngineKind::Auto, |e| {
        e.parse().expect("--engine auto|uring|uring-zc|copy|msg-zc")
    });
    let trains = !args.iter().any(|a| a == "--no-trains");
    let alternate = args.iter().any(|a| a == "--alternate");
    let sizes: Vec<usize> = (0..PER_BATCH)
        .map(|i| match (alternate, i % 2) {
            (false, _) => 1472,
            (true, 0) => 1000,
            (true, _) => 1001,
        })
        .collect();
    in_new_netns(|| {
        let bh = carrier_black_hole(1500, Segmentation::Offload).expect("the carrier black hole");
        // Until the carrier is up the queue drops without a word: let it come up.
        std::thread::sleep(Duration::from_millis(300));
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.connect(bh.v4).unwrap();
        let cfg = SenderConfig::new(engine).with_batch_trains(trains);
        let mut tx: Sender<Vec<u8>> = Sender::with_config(sock, cfg).unwrap();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut out: Vec<Released<Vec<u8>>> = Vec::new();
        let mut batch = VecDeque::with_capacity(PER_BATCH);
        let cpu = thread_cpu_time();
        for _ in 0..count {
            for &len in &sizes {
                let mut buf = spare.pop().unwrap_or_default();
                buf.resize(len, 7);
                batch.push_back(buf);
            }
            tx.send_batch(&mut batch).unwrap();
            tx.reap(&mut out).unwrap();
            spare.extend(out.drain(..).map(|r| r.buf));
        }
        tx.flush(Duration::from_secs(10)).unwrap();
        let cpu = thread_cpu_time() - cpu;
        let s = tx.stats();
        eprintln!(
            "{} {engine} trains={trains}: {} sends, {} requests/calls, {} trains, {} buffers in \
             trains, {} zero-copy, {:.3} s CPU ({:.2} us per batch)",
            tx.explain().path,
            s.sends,
            s.syscalls,
            s.trains,
            s.batch_train_buffers,
            s.zerocopy,
            cpu.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / count as f64,
        );
    })
    .expect("a network namespace (run as root)");
}
