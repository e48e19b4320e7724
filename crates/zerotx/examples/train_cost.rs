//! What a train costs against per-datagram sends: CPU time per GB and throughput, for
//! per-datagram sends and for trains of 1 to 44 datagrams, by copy and zero-copy, into a black
//! hole with carrier (docs/kernel.md, "This machine (what a test can rely on)"): the veth peer is
//! up and an nftables ingress chain on it drops everything, so the sender's queue, the GSO
//! segmentation and the device's transmit all run. The figures behind `auto`'s train rules
//! (`engine/policy/train.rs`).
//!
//! ```sh
//! sudo cargo run --release -p zerotx --example train_cost [-- --soft] [-- --size 1200]
//! ```
//! `--soft`: `ethtool -K zc0 tx-udp-segmentation off`, the kernel segments trains in software.
//! `--count N --engine copy|msg-zc`: sends N trains of 44 datagrams and prints nothing, a fixed
//! amount of work for timing whole runs A/B.
//! Runs in a network namespace of its own; sends only to 192.0.2.2 inside it.

use std::process::Command;
use std::time::{Duration, Instant};

use zerotx::{EngineKind, Released, Sender};
use zerotx_testbed::{in_new_netns, thread_cpu_time};

const RUN: Duration = Duration::from_millis(250);
const REPEAT: usize = 5;

fn sh(cmd: &str, stdin: Option<&str>) {
    use std::io::Write;
    let mut child = Command::new("sh")
        .args(["-c", cmd])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "`{cmd}` failed");
}

/// One way of sending: the engine, and the datagrams per call (0: per-datagram `send_batch`).
#[derive(Clone, Copy)]
struct Mode {
    engine: EngineKind,
    train: usize,
}

/// Sends for [`RUN`] in `mode`; returns (CPU seconds per GB, GB/s).
fn run(mode: Mode, size: usize) -> (f64, f64) {
    let sock = std::net::UdpSocket::bind("192.0.2.1:0").unwrap();
    sock.connect("192.0.2.2:9").unwrap();
    let mut tx: Sender<Vec<u8>> = Sender::new(sock, mode.engine).unwrap();
    let len = size * mode.train.max(1);
    let mut spare: Vec<Vec<u8>> = (0..256).map(|_| vec![7u8; len]).collect();
    let mut out: Vec<Released<Vec<u8>>> = Vec::new();
    let mut batch = std::collections::VecDeque::new();
    let (mut bytes, start, cpu) = (0u64, Instant::now(), thread_cpu_time());
    while start.elapsed() < RUN {
        for _ in 0..16 {
            if mode.train == 0 {
                batch.extend((0..44).map(|_| spare.pop().unwrap_or_else(|| vec![7u8; size])));
                tx.send_batch(&mut batch).unwrap();
                bytes += (44 * size) as u64;
            } else {
                let buf = spare.pop().unwrap_or_else(|| vec![7u8; len]);
                tx.send_train(buf, size as u16).unwrap();
                bytes += len as u64;
            }
        }
        tx.reap(&mut out).unwrap();
        spare.extend(out.drain(..).map(|r| r.buf));
    }
    tx.flush(Duration::from_secs(5)).unwrap();
    let (cpu, wall) = (thread_cpu_time() - cpu, start.elapsed());
    let gb = bytes as f64 / 1e9;
    (cpu.as_secs_f64() / gb, gb / wall.as_secs_f64())
}

/// Sends `count` trains of 44 datagrams of `size` bytes through `engine`.
fn fixed(engine: EngineKind, size: usize, count: u64) {
    let sock = std::net::UdpSocket::bind("192.0.2.1:0").unwrap();
    sock.connect("192.0.2.2:9").unwrap();
    let mut tx: Sender<Vec<u8>> = Sender::new(sock, engine).unwrap();
    let mut spare: Vec<Vec<u8>> = (0..256).map(|_| vec![7u8; 44 * size]).collect();
    let mut out = Vec::new();
    for _ in 0..count {
        let buf = spare.pop().unwrap_or_else(|| vec![7u8; 44 * size]);
        tx.send_train(buf, size as u16).unwrap();
        tx.reap(&mut out).unwrap();
        spare.extend(out.drain(..).map(|r: Released<Vec<u8>>| r.buf));
    }
    tx.flush(Duration::from_secs(5)).unwrap();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let soft = args.iter().any(|a| a == "--soft");
    let size = args
        .iter()
        .position(|a| a == "--size")
        .map_or(1472, |i| args[i + 1].parse().unwrap());
    in_new_netns(|| {
        sh(
            "ip link add zc0 type veth peer name zc1 && ip addr add 192.0.2.1/24 dev zc0 \
             && ip link set zc0 up && ip link set zc1 up \
             && ip neigh add 192.0.2.2 lladdr 02:00:00:00:00:02 dev zc0",
            None,
        );
        sh(
            "nft -f -",
            Some("table netdev bh {\n  chain in {\n    type filter hook ingress device zc1 priority 0; policy drop;\n  }\n}\n"),
        );
        if soft {
            sh("ethtool -K zc0 tx-udp-segmentation off", None);
        }
        // Until the carrier is up the queue drops without a word: let it come up.
        std::thread::sleep(Duration::from_millis(500));
        if let Some(i) = args.iter().position(|a| a == "--count") {
            let engine = args
                .iter()
                .position(|a| a == "--engine")
                .map_or(EngineKind::Copy, |e| args[e + 1].parse().unwrap());
            fixed(engine, size, args[i + 1].parse().unwrap());
            return;
        }
        let mut modes = vec![
            Mode { engine: EngineKind::Copy, train: 0 },
            Mode { engine: EngineKind::MsgZerocopy, train: 0 },
        ];
        for train in [1, 2, 4, 8, 16, 24, 32, 44] {
            modes.push(Mode { engine: EngineKind::Copy, train });
            modes.push(Mode { engine: EngineKind::MsgZerocopy, train });
        }
        let mut cpu = vec![Vec::new(); modes.len()];
        let mut rate = vec![Vec::new(); modes.len()];
        for _ in 0..REPEAT {
            for (i, &m) in modes.iter().enumerate() {
                let (c, r) = run(m, size);
                cpu[i].push(c);
                rate[i].push(r);
            }
        }
        println!("{size} B datagrams, {} segmentation", if soft { "software" } else { "offloaded" });
        println!("{:<24} {:>12} {:>8}", "mode", "CPU s/GB", "GB/s");
        for (i, m) in modes.iter().enumerate() {
            let name = match m.train {
                0 => format!("{} per datagram", m.engine),
                k => format!("{} train of {k}", m.engine),
            };
            let (c, r) = (median(cpu[i].clone()), median(rate[i].clone()));
            println!("{name:<24} {c:>12.3} {r:>8.2}");
        }
    })
    .expect("a network namespace (run as root)");
}
