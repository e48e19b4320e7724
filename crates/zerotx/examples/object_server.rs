//! An HTTP/1.1 object server on tokio: `GET /<size>` (`/4096`, `/64K`, `/1M`) answers with the
//! first `size` bytes of one shared in-memory object (a fixed pattern, so a client can check
//! it), headers written by copy and bodies sent zero-copy through `zerotx::tokio::AsyncSender`:
//! each body chunk is a `Bytes::slice` of the shared object, never a copy. `GET /stats` prints
//! the server's counters (buffers sent and released, ...); `GET /metrics` (built with the
//! `metrics` feature) answers the library's metrics in Prometheus text, from a
//! `metrics-exporter-prometheus` recorder the server installs.
//!
//! ```sh
//! cargo run --release -p zerotx --features tokio --example object_server -- --listen 127.0.0.1:8080
//! curl -s http://127.0.0.1:8080/1M | sha256sum
//! # With /metrics:
//! cargo run --release -p zerotx --features tokio,metrics --example object_server -- --listen 127.0.0.1:8080
//! curl -s http://127.0.0.1:8080/metrics | grep ^zerotx_
//! # The same server with tokio's write_all (the kernel copies), for comparison:
//! cargo run --release -p zerotx --features tokio --example object_server -- --listen 127.0.0.1:8080 --engine copy
//! # Both side by side: N keep-alive clients for T seconds per engine, server CPU per GB:
//! cargo run --release -p zerotx --features tokio --example object_server -- --bench
//! ```
//!
//! Flags (`--help` lists them): `--listen ADDR`, `--engine auto|copy|msg-zc|uring|uring-zc`
//! (default `auto`), `--threads N` (runtime workers; 0 = current-thread), `--max-size SIZE` (64M),
//! `--chunk SIZE` (256K), `--write-timeout-ms MS`, `--drain-seconds S` (30). `HEAD` answers with
//! the head alone. SIGTERM (or SIGINT) drains: no new connections, responses in progress finish,
//! then it exits. Bench: `--bench`, `--engines LIST`, `--clients N`, `--seconds S`,
//! `--size SIZE`, `--repeat R`. `--bench-black-hole` (root): HTTP cannot reach the black hole (it
//! drops every packet, so no TCP handshake completes), so this measures the same async send path
//! with UDP datagrams into it instead: tokio's `UdpSocket::send` against `AsyncSender`.

#[path = "object_server/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use server::{Config, Mode};

fn main() {
    if let Err(e) = run() {
        eprintln!("Error: {e}");
        std::process::exit(1);
    }
}

/// An HTTP/1.1 object server: `GET /<size>` answers with the first `size` bytes of one shared
/// object, bodies sent zero-copy by zerotx's async sender; `HEAD` answers with the head alone.
/// SIGTERM or SIGINT stops it gracefully: no new connections, responses being sent are
/// finished.
#[derive(clap::Parser)]
#[command(name = "object_server")]
struct Args {
    /// Address to serve on (e.g. 127.0.0.1:8080; port 0 picks one and prints it).
    #[arg(long, value_name = "ADDR", required_unless_present_any = ["bench", "bench_black_hole"])]
    listen: Option<SocketAddr>,
    /// How bodies leave: copy (tokio's write_all), auto, msg-zc, uring, uring-zc.
    #[arg(long, default_value = server::DEFAULT_ENGINE, value_parser = Mode::parse)]
    engine: Mode,
    /// Runtime worker threads (0: one current-thread runtime).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// The largest object served (the shared object is this big): 4096, 64K, 1M...
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = size)]
    max_size: usize,
    /// Bytes per buffer handed to the sender.
    #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = size)]
    chunk: usize,
    /// A body write that makes no progress this long ends the connection.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    write_timeout_ms: u64,
    /// On SIGTERM, how long open connections may take to finish their responses.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    drain_seconds: u64,
    /// Compare engines: keep-alive clients on loopback, server CPU per GB.
    #[arg(long)]
    bench: bool,
    /// Compare engines with UDP datagrams into the black hole (root).
    #[arg(long)]
    bench_black_hole: bool,
    /// Bench: engines to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "copy,auto,msg-zc,uring-zc"
    )]
    engines: Vec<String>,
    /// Bench: keep-alive clients.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    clients: u64,
    /// Bench: seconds per cell.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Bench: bytes per request.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = size)]
    size: usize,
    /// Bench: repetitions per cell.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    repeat: u64,
    #[arg(skip = Config::new(Mode::WriteAll))]
    cfg: Config,
}

/// A size flag: `4096`, `64K`, `1M`, `1G`.
fn size(s: &str) -> Result<usize, String> {
    server::parse_size(s).ok_or(format!("{s:?} is not a size: give bytes, or K, M, G"))
}

fn parse_args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    a.cfg.mode = a.engine;
    a.cfg.threads = a.threads;
    a.cfg.max_size = a.max_size;
    a.cfg.chunk = a.chunk.max(1);
    a.cfg.write_timeout = Duration::from_millis(a.write_timeout_ms);
    a.cfg.drain_timeout = Duration::from_secs(a.drain_seconds);
    a
}

fn run() -> Result<(), String> {
    let a = parse_args();
    if a.bench_black_hole {
        return bench_black_hole(&a);
    }
    if a.bench {
        return bench(&a);
    }
    let listen = a.listen.ok_or("--listen ADDR is required (or --bench)")?;
    let mode = a.cfg.mode;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| format!("installing the SIGTERM handler: {e}"))?;
    let running =
        server::spawn(listen, a.cfg).map_err(|e| format!("listening on {listen}: {e}"))?;
    println!("listening on {} engine {}", running.addr, mode.name());
    std::io::stdout().flush().ok();
    let signal = signals
        .forever()
        .next()
        .unwrap_or(signal_hook::consts::SIGTERM);
    let name = if signal == signal_hook::consts::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    println!("{name}: draining (no new connections; responses in progress finish)");
    std::io::stdout().flush().ok();
    let drained = running.stop();
    if drained.left_open > 0 {
        return Err(format!(
            "{} connections were still open after the drain time (--drain-seconds)",
            drained.left_open
        ));
    }
    println!("drained: every connection finished");
    Ok(())
}

/// One timed cell: the server as a child process (so its CPU time is its own), `clients`
/// keep-alive clients fetching `size` bytes in a loop.
fn cell(a: &Args, engine: &str) -> Result<(f64, f64, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["--listen", "127.0.0.1:0", "--engine", engine, "--threads"])
        .arg(a.cfg.threads.to_string())
        .args(["--max-size", &a.size.max(1).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let addr: SocketAddr = line
        .split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("server said {line:?}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let cpu0 = zerotx_testbed::children_cpu_time();
    let t0 = Instant::now();
    let clients: Vec<_> = (0..a.clients)
        .map(|_| {
            let (stop, bytes, size) = (stop.clone(), bytes.clone(), a.size);
            std::thread::spawn(move || client(addr, size, &stop, &bytes))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    stop.store(true, Ordering::Relaxed);
    let chosen = chosen_engines(addr);
    // Each client finishes the response it is reading, so every byte counted was served.
    let joined: Vec<_> = clients.into_iter().map(|c| c.join()).collect();
    let elapsed = t0.elapsed().as_secs_f64();
    let moved = bytes.load(Ordering::Relaxed) as f64;
    // The server's CPU: killed and reaped, its rusage lands in RUSAGE_CHILDREN.
    child.kill().ok();
    child.wait().ok();
    let cpu = (zerotx_testbed::children_cpu_time() - cpu0).as_secs_f64();
    for j in joined {
        j.map_err(|_| "a client panicked")??;
    }
    Ok((moved / elapsed / 1e6, cpu / (moved / 1e9), chosen))
}

/// The engines the server's senders report (`engine.NAME=COUNT` lines of `GET /stats`): what
/// `auto` chose.
fn chosen_engines(addr: SocketAddr) -> String {
    let fetch = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(addr)?;
        s.write_all(b"GET /stats HTTP/1.1\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    };
    let text = fetch().unwrap_or_default();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("engine."))
        .filter_map(|l| l.split('=').next())
        .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join("+")
    }
}

fn client(
    addr: SocketAddr,
    size: usize,
    stop: &AtomicBool,
    bytes: &AtomicU64,
) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let req = format!("GET /{size} HTTP/1.1\r\nHost: bench\r\n\r\n");
    let mut buf = vec![0u8; 256 << 10];
    while !stop.load(Ordering::Relaxed) {
        if s.write_all(req.as_bytes()).is_err() {
            break;
        }
        // The head ends with \r\n\r\n; the body is `size` bytes after it.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).map_err(|e| e.to_string())? == 0 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        let mut left = size;
        while left > 0 {
            let n = s
                .read(&mut buf[..left.min(256 << 10)])
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Ok(());
            }
            left -= n;
            bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn bench(a: &Args) -> Result<(), String> {
    for e in &a.engines {
        Mode::parse(e)?;
    }
    println!(
        "object_server bench: {} keep-alive clients, GET /{} for {} s, {} repetition(s), \
         server threads {} (loopback TCP; the kernel copies zero-copy sends delivered locally)",
        a.clients, a.size, a.seconds, a.repeat, a.cfg.threads
    );
    let mut results: Vec<Vec<(f64, f64, String)>> = vec![Vec::new(); a.engines.len()];
    for _ in 0..a.repeat {
        for (i, e) in a.engines.iter().enumerate() {
            results[i].push(cell(a, e)?);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rows: Vec<(f64, f64, String)> = results
        .iter()
        .map(|r| {
            (
                median(r.iter().map(|x| x.0).collect()),
                median(r.iter().map(|x| x.1).collect()),
                r[0].2.clone(),
            )
        })
        .collect();
    let base = a
        .engines
        .iter()
        .position(|e| e == "copy")
        .map(|i| (rows[i].0, rows[i].1));
    println!(
        "{:<18} {:>10} {:>14} {:>12} {:>12}  sender engine",
        "engine", "MB/s", "server CPU-s/GB", "MB/s ratio", "CPU/GB ratio"
    );
    for (e, (mbs, cpu, chosen)) in a.engines.iter().zip(&rows) {
        let (r1, r2) = match base {
            Some((bm, bc)) => (format!("{:.2}", mbs / bm), format!("{:.2}", cpu / bc)),
            None => ("-".into(), "-".into()),
        };
        let name = Mode::parse(e)?.name();
        println!("{name:<18} {mbs:>10.0} {cpu:>14.3} {r1:>12} {r2:>12}  {chosen}");
    }
    Ok(())
}

/// The async send path where zero-copy pays: UDP into the black hole (a veth whose peer is down,
/// in a private network namespace; MTU 65535), datagrams of `--size` bytes (at most 65507) cut
/// from a 32 MiB object in turn, one current-thread runtime, `--seconds` per cell, interleaved
/// `--repeat` times. CPU is the runtime thread's (the driver task runs on it).
fn bench_black_hole(a: &Args) -> Result<(), String> {
    let size = a.size.min(65507);
    let engines: Vec<Mode> = a
        .engines
        .iter()
        .map(|e| Mode::parse(e))
        .collect::<Result<_, _>>()?;
    let rows = zerotx_testbed::in_new_netns(|| -> Result<Vec<(f64, f64, f64)>, String> {
        let bh = zerotx_testbed::black_hole(65535).map_err(|e| e.to_string())?;
        let object = server::make_object(32 << 20);
        let rt = server::runtime(0).map_err(|e| e.to_string())?;
        let mut cells: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); engines.len()];
        for _ in 0..a.repeat {
            for (i, &mode) in engines.iter().enumerate() {
                let cell = rt.block_on(udp_cell(mode, bh.v4, &object, size, a.seconds))?;
                cells[i].push(cell);
            }
        }
        Ok(cells
            .into_iter()
            .map(|c| {
                let med = |f: fn(&(f64, f64, f64)) -> f64| {
                    let mut v: Vec<f64> = c.iter().map(f).collect();
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                };
                (med(|x| x.0), med(|x| x.1), med(|x| x.2))
            })
            .collect())
    })
    .map_err(|e| format!("the black hole needs root: {e}"))??;
    println!(
        "black hole: UDP datagrams of {size} bytes, {} s per cell, {} repetition(s), one \
         current-thread runtime",
        a.seconds, a.repeat
    );
    println!(
        "{:<18} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "engine", "MB/s", "CPU-s/GB", "MB/s ratio", "CPU/GB ratio", "zero-copy"
    );
    let base = engines
        .iter()
        .position(|m| *m == Mode::WriteAll)
        .map(|i| rows[i]);
    for (m, (mbs, cpu, zc)) in engines.iter().zip(&rows) {
        let (r1, r2) = match base {
            Some((bm, bc, _)) => (format!("{:.2}", mbs / bm), format!("{:.2}", cpu / bc)),
            None => ("-".into(), "-".into()),
        };
        let name = match m {
            Mode::WriteAll => "copy (tokio send)".to_string(),
            Mode::ZeroTx(k) => k.to_string(),
        };
        println!(
            "{name:<18} {mbs:>10.0} {cpu:>10.3} {r1:>12} {r2:>12} {:>9.0}%",
            zc * 100.0
        );
    }
    Ok(())
}

/// One cell: (MB/s, CPU-s/GB, share of releases that were zero-copy).
async fn udp_cell(
    mode: Mode,
    dest: SocketAddr,
    object: &bytes::Bytes,
    size: usize,
    seconds: f64,
) -> Result<(f64, f64, f64), String> {
    let e = |e: std::io::Error| e.to_string();
    let sock = tokio::net::UdpSocket::bind("0.0.0.0:0").await.map_err(e)?;
    sock.connect(dest).await.map_err(e)?;
    let slots = object.len() / size;
    let (mut sent, mut i) = (0u64, 0usize);
    let (mut released, mut zc) = (0u64, 0u64);
    let cpu0 = zerotx_testbed::thread_cpu_time();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(seconds);
    match mode {
        Mode::WriteAll => {
            while Instant::now() < until {
                for _ in 0..64 {
                    let at = (i % slots) * size;
                    sent += sock.send(&object[at..at + size]).await.map_err(e)? as u64;
                    i += 1;
                }
            }
        }
        Mode::ZeroTx(kind) => {
            let tx = zerotx::tokio::AsyncSender::from_udp(sock, kind).map_err(|e| e.to_string())?;
            let mut done = Vec::new();
            while Instant::now() < until {
                for _ in 0..64 {
                    let at = (i % slots) * size;
                    tx.send(object.slice(at..at + size))
                        .await
                        .map_err(|e| e.to_string())?;
                    sent += size as u64;
                    i += 1;
                }
                tx.drain_released(&mut done).map_err(e)?;
                if let Some(err) = done.iter().find_map(|r| r.report.error.as_ref()) {
                    return Err(format!("a datagram failed: {err}"));
                }
                released += done.len() as u64;
                zc += done.iter().filter(|r| r.report.path.is_zerocopy()).count() as u64;
                done.clear();
            }
            tx.flush(Duration::from_secs(5))
                .await
                .map_err(|e| e.to_string())?;
            let closed = tx.close(Duration::from_secs(1)).await;
            if let Some(err) = closed.released.iter().find_map(|r| r.report.error.as_ref()) {
                return Err(format!("a datagram failed: {err}"));
            }
            released += closed.released.len() as u64;
            zc += closed
                .released
                .iter()
                .filter(|r| r.report.path.is_zerocopy())
                .count() as u64;
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (zerotx_testbed::thread_cpu_time() - cpu0).as_secs_f64();
    let share = if released > 0 {
        zc as f64 / released as f64
    } else {
        0.0
    };
    Ok((
        sent as f64 / elapsed / 1e6,
        cpu / (sent as f64 / 1e9),
        share,
    ))
}
