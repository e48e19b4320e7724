//! Every UDP fault class of the hardening issues, for trains (UDP GSO, `Sender::send_train`), on
//! the running kernel, through each engine: `copy`, `msg-zc`, `auto` (on `sendmsg(2)`), and the
//! io_uring engines and `auto` free to pick them, which may refuse trains (`SendError::Invalid`:
//! printed as "not built", never a failure). The kernel's rules behind each class:
//! docs/kernel.md, "UDP GSO trains".
//!
//! Each buffer is overwritten the instant it comes back, each train's report is counted by the
//! train number in its first bytes, and a receiver checks every datagram the path delivers (its
//! bytes, its count, its order). The classes, each in namespaces of its own:
//! - `veth`: trains to a receiver on a veth peer in another namespace arrive whole and in order;
//! - `nft-drop`: an nftables output rule drops every 50th packet: those trains come back with
//!   `EPERM` and their buffer, the others arrive, and the ledger stays in step;
//! - `qdisc-drop`: a `tbf` qdisc far slower than any sender, with `IP_RECVERR`: trains it drops
//!   come back with `ENOBUFS`, the ones it takes arrive whole, none twice;
//! - `refusals`: a segment above the MTU comes back with `EMSGSIZE` (nothing of it sent), too many
//!   segments are refused before any call, 128 go wherever the kernel takes them (asked, not
//!   guessed from its version), and the next train arrives;
//! - `udplite-eio`: UDP-Lite cannot checksum a GSO packet (`EIO`): the train goes one datagram per
//!   call, each delivered once, in order;
//! - `local`: a train to a local socket comes back copied, and `auto` learns it.
//!
//! Prints `VMTEST: pass|FAIL train-faults <class> <engine>: ...` per check (the lines
//! `scripts/vm-test.sh` counts) and exits 1 on any failure. Runs as root; needs `ip`, `nft` and
//! `tc`. Two more modes make the virtio-net path of the Debian guests: `--to ADDR` sends trains
//! through every engine to a receiver at ADDR and prints each engine's zero-copy share;
//! `--receive ADDR` is that receiver (run on the far side), checking every datagram that arrives
//! until the sender says it is done.
//!
//! ```sh
//! cargo run --release -p zerotx-cli --example train_faults
//! ```

#[path = "train_faults/classes.rs"]
mod classes;
#[path = "train_faults/datagrams.rs"]
mod datagrams;
#[path = "train_faults/trains.rs"]
mod trains;
#[path = "train_faults/veth.rs"]
mod veth;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use zerotx::{EngineKind, SendError, SenderConfig};

use classes::CLASSES;
use datagrams::{check_datagram, connected, receiver, say_done, train, DONE, SEG};
use trains::{takes_trains, NotBuilt, Trains};

/// Every engine, by the name the CLI gives it. `auto` stays on `sendmsg(2)`; `auto-uring` may
/// pick io_uring.
pub fn engines() -> Vec<(&'static str, SenderConfig)> {
    vec![
        ("copy", SenderConfig::new(EngineKind::Copy)),
        ("msg-zc", SenderConfig::new(EngineKind::MsgZerocopy)),
        (
            "auto",
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ),
        ("uring", SenderConfig::new(EngineKind::Uring)),
        ("uring-zc", SenderConfig::new(EngineKind::UringZc)),
        ("auto-uring", SenderConfig::new(EngineKind::Auto)),
    ]
}

/// Whether an engine may refuse trains as not built yet (the io_uring ones).
fn may_lack_trains(name: &str) -> bool {
    name.contains("uring")
}

/// Runs `f`, turning a panic into its message.
fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".into())
    })
}

/// Runs every class through every engine, printing one `VMTEST:` line per check; returns how
/// many failed.
pub fn run_all() -> usize {
    let mut failed = 0;
    for (name, cfg) in engines() {
        match caught(|| takes_trains(cfg.clone())) {
            Ok(Ok(())) => {}
            Ok(Err(NotBuilt(reason))) if may_lack_trains(name) => {
                println!("VMTEST: pass train-faults {name}: trains not built yet ({reason})");
                continue;
            }
            Ok(Err(NotBuilt(reason))) => {
                println!("VMTEST: FAIL train-faults {name}: refuses trains: {reason}");
                failed += 1;
                continue;
            }
            Err(e) => {
                println!("VMTEST: FAIL train-faults {name}: a first train: {e}");
                failed += 1;
                continue;
            }
        }
        for (class, f) in CLASSES {
            let t0 = Instant::now();
            match caught(|| f(name, cfg.clone())) {
                Ok(said) => println!(
                    "VMTEST: pass train-faults {class} {name}: {said} ({} ms)",
                    t0.elapsed().as_millis()
                ),
                Err(e) => {
                    println!("VMTEST: FAIL train-faults {class} {name}: {e}");
                    failed += 1;
                }
            }
        }
    }
    failed
}

/// `--to ADDR`: trains through every engine that takes them to the receiver at ADDR (a real
/// path: the guests' virtio-net), each engine's trains numbered from its own thousand; prints
/// each engine's zero-copy share of its trains' completions. Returns how many failed.
fn send_to(dest: SocketAddr) -> usize {
    const TRAINS: u32 = 32;
    const COUNT: usize = 44;
    let mut failed = 0;
    for (i, (name, cfg)) in engines().into_iter().enumerate() {
        let first = 1000 * i as u32;
        let run = caught(|| {
            let sock = connected(dest, libc::IPPROTO_UDP).expect("a socket");
            let mut tx = Trains::new(sock, cfg);
            for t in first..first + TRAINS {
                match tx.send(t, train(t, SEG, COUNT, 1000), SEG, None) {
                    Ok(()) => {}
                    Err(SendError::Invalid { reason, .. }) if may_lack_trains(name) => {
                        return Err(reason);
                    }
                    Err(e) => panic!("train {t}: {e}"),
                }
            }
            Ok(tx.finish())
        });
        match run {
            Ok(Ok(tally)) => {
                let back = tally.reports.len();
                // Through virtio-net with the tap's vnet header (scatter-gather) `msg-zc`'s
                // trains came back NOT copied on 6.1 and 6.12, each time: asserted.
                let zero_copy_held = name != "msg-zc" || tally.zero_copy() == back;
                if back == TRAINS as usize && tally.refused.is_empty() && zero_copy_held {
                    println!(
                        "VMTEST: pass train-faults net {name}: {back} of {TRAINS} trains back \
                         once, {} of {back} trains zero-copy (paths {:?})",
                        tally.zero_copy(),
                        tally.paths().collect::<HashSet<_>>()
                    );
                } else {
                    println!(
                        "VMTEST: FAIL train-faults net {name}: {back} of {TRAINS} trains back, \
                         {} zero-copy, refused {:?}",
                        tally.zero_copy(),
                        tally.refused
                    );
                    failed += 1;
                }
            }
            Ok(Err(reason)) => {
                println!("VMTEST: pass train-faults net {name}: trains not built yet ({reason})")
            }
            Err(e) => {
                println!("VMTEST: FAIL train-faults net {name}: {e}");
                failed += 1;
            }
        }
    }
    for _ in 0..5 {
        say_done(dest, libc::IPPROTO_UDP);
        std::thread::sleep(Duration::from_millis(100));
    }
    failed
}

/// Per train: the datagrams that arrived, and how many it had.
type Arrivals = BTreeMap<u32, (u32, u32)>;

/// `--receive ADDR`: checks every datagram that arrives until the sender is done (or 10 min
/// pass before the first datagram, 20 s without one after it: the path may drop the sender's
/// last word); prints, per engine, the datagrams checked and the trains that arrived whole (the path
/// may drop datagrams; it must not change or repeat them). Returns how many failed.
fn receive(addr: SocketAddr) -> usize {
    let sock = receiver(addr, libc::IPPROTO_UDP).unwrap_or_else(|e| {
        println!("VMTEST: FAIL train-faults receiver on {addr}: {e}");
        std::process::exit(1)
    });
    println!("train-faults: listening on {addr}");
    sock.set_read_timeout(Some(Duration::from_secs(600)))
        .expect("a timeout");
    let mut seen = HashSet::new();
    let mut per_engine: BTreeMap<u32, (usize, Arrivals)> = BTreeMap::new();
    let mut bad = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = sock.recv(&mut buf) {
        let data = &buf[..n];
        if data == DONE {
            break;
        }
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("a timeout");
        match check_datagram(data) {
            Ok((t, d, count)) => {
                if !seen.insert((t, d)) {
                    bad.push(format!("train {t} datagram {d} arrived twice"));
                }
                let e = per_engine.entry(t / 1000).or_default();
                e.0 += 1;
                e.1.entry(t).or_insert((0, count)).0 += 1;
            }
            Err(e) => bad.push(e),
        }
    }
    let names = engines();
    for (i, (datagrams, trains)) in &per_engine {
        let name = names.get(*i as usize).map_or("?", |(n, _)| n);
        let whole = trains.iter().filter(|(_, (got, sent))| got == sent).count();
        println!(
            "VMTEST: pass train-faults net {name} received: {datagrams} datagrams checked, {whole} \
             of {} trains whole",
            trains.len()
        );
    }
    for b in &bad {
        println!("VMTEST: FAIL train-faults net received: {b}");
    }
    if per_engine.is_empty() {
        println!("VMTEST: FAIL train-faults net received: no datagram arrived");
        return 1;
    }
    bad.len()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |i: usize| -> SocketAddr {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{} ADDR: give an address such as 198.18.0.1:7300", args[0]))
    };
    let failed = match args.first().map(String::as_str) {
        None => run_all(),
        Some("--to") => send_to(addr(1)),
        Some("--receive") => receive(addr(1)),
        Some(other) => {
            eprintln!("usage: train_faults [--to ADDR | --receive ADDR] (not {other})");
            2
        }
    };
    if failed > 0 {
        std::process::exit(1);
    }
}
