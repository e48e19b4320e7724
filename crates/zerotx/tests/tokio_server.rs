//! The object server (`examples/object_server`) run in-process against clients nobody here
//! wrote (curl) and against a load of slow, vanishing and stalled clients: every response that
//! completes is intact, every buffer the server sent comes back, the server keeps serving, and
//! memory stays bounded.

mod util;

#[path = "../examples/object_server/server.rs"]
mod server;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use zerotx::EngineKind;

use server::{Config, Mode, Running};

/// The tests of this file run one at a time: the load test reads the process's RSS.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn start(mode: Mode, max_size: usize, tune: impl FnOnce(&mut Config)) -> Running {
    let mut cfg = Config::new(mode);
    cfg.max_size = max_size;
    tune(&mut cfg);
    server::spawn("127.0.0.1:0".parse().unwrap(), cfg).expect("server")
}

/// Waits until the server closed every connection, then checks its books: every buffer it sent
/// came back, none was kept.
fn settle(s: &Running, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.stats.open.load(Relaxed) > 0 {
        assert!(
            Instant::now() < deadline,
            "{what}: connections still open:\n{}",
            s.stats.render()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = &s.stats;
    assert_eq!(
        st.buffers_sent.load(Relaxed),
        st.buffers_released.load(Relaxed),
        "{what}: a buffer never came back:\n{}",
        st.render()
    );
    assert_eq!(st.kept.load(Relaxed), 0, "{what}:\n{}", st.render());
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

fn zerotx_modes() -> [Mode; 4] {
    [
        Mode::ZeroTx(EngineKind::Auto),
        Mode::ZeroTx(EngineKind::MsgZerocopy),
        Mode::ZeroTx(EngineKind::Uring),
        Mode::ZeroTx(EngineKind::UringZc),
    ]
}

/// curl fetches objects of several sizes in parallel (separate processes, and one process
/// fetching several over one keep-alive connection); what it wrote is the object, byte for byte.
#[test]
fn curl_fetches_intact_objects_in_parallel() {
    let _serial = serial();
    util::require!(
        Command::new("curl").arg("--version").output().is_ok(),
        "curl is not installed (apt-get install curl)"
    );
    const MAX: usize = 8 << 20;
    let object = server::make_object(MAX);
    let sizes = [1usize, 1000, 4096, 65543, 1 << 20, (3 << 20) + 5, MAX];
    let dir = std::env::temp_dir().join(format!("zerotx-curl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [Mode::WriteAll].into_iter().chain(zerotx_modes()) {
        let s = start(mode, MAX, |_| {});
        let url = |n: usize| format!("http://{}/{n}", s.addr);
        let file = |tag: &str, n: usize| dir.join(format!("{tag}-{n}"));
        let mut children = Vec::new();
        for &n in &sizes {
            children.push(
                Command::new("curl")
                    .args(["-sS", "--fail", "--max-time", "20", "-o"])
                    .arg(file("par", n))
                    .arg(url(n))
                    .spawn()
                    .expect("curl"),
            );
        }
        // One curl, every size over one connection (keep-alive: heads after bodies).
        let mut keep = Command::new("curl");
        keep.args(["-sS", "--fail", "--max-time", "20"]);
        for &n in &sizes {
            keep.arg("-o").arg(file("keep", n)).arg(url(n));
        }
        children.push(keep.spawn().expect("curl"));
        for mut c in children {
            assert!(c.wait().unwrap().success(), "{}: curl failed", mode.name());
        }
        for tag in ["par", "keep"] {
            for &n in &sizes {
                let got = std::fs::read(file(tag, n)).unwrap();
                assert_eq!(got.len(), n, "{} {tag} /{n}: length", mode.name());
                assert!(
                    got[..] == object[..n],
                    "{} {tag} /{n}: body differs from the object (checksum {:#x} != {:#x})",
                    mode.name(),
                    fnv(&got),
                    fnv(&object[..n])
                );
            }
        }
        settle(&s, &mode.name());
        if mode != Mode::WriteAll {
            assert!(s.stats.buffers_sent.load(Relaxed) > 0);
        }
        assert_eq!(
            s.stats.responses.load(Relaxed),
            2 * sizes.len() as u64,
            "{}",
            s.stats.render()
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// How a load client behaves.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// Two requests on one keep-alive connection, read at full speed.
    Normal(usize),
    /// A small receive buffer, 8 KiB reads with pauses.
    Slow(usize),
    /// Reads `n` bytes of the body, then disconnects: with a reset if `rst`, else a FIN.
    Vanish {
        size: usize,
        after: usize,
        rst: bool,
    },
    /// Asks, never reads, holds the connection past the server's write timeout.
    Stalled(usize, Duration),
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Intact,
    Left,
}

async fn connect(addr: SocketAddr, rcvbuf: Option<u32>) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    if let Some(n) = rcvbuf {
        sock.set_recv_buffer_size(n).unwrap();
    }
    sock.connect(addr).await.expect("connect")
}

/// Reads one response head; returns the content length and any body bytes read with it.
async fn read_head(s: &mut TcpStream) -> (usize, Vec<u8>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .expect("content length")
                .parse()
                .unwrap();
            return (len, buf[end + 4..].to_vec());
        }
        let n = s.read(&mut tmp).await.expect("read head");
        assert!(n > 0, "connection closed before the head");
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Reads a body of `len` bytes (`first` already read), checking each piece against the object as
/// it comes (nothing accumulates, so the RSS check measures the server).
async fn read_body(s: &mut TcpStream, object: &Bytes, len: usize, first: Vec<u8>, slow: bool) {
    assert!(
        first[..] == object[..first.len()],
        "body of /{len} corrupted"
    );
    let mut got = first.len();
    let mut tmp = vec![0u8; if slow { 8 << 10 } else { 64 << 10 }];
    while got < len {
        let want = tmp.len().min(len - got);
        let n = s.read(&mut tmp[..want]).await.expect("read body");
        assert!(n > 0, "body cut short at {got} of {len}");
        assert!(
            tmp[..n] == object[got..got + n],
            "body of /{len} corrupted in [{got}, {})",
            got + n
        );
        got += n;
        if slow {
            tokio::time::sleep(Duration::from_millis(8)).await;
        }
    }
}

async fn run_client(addr: SocketAddr, object: Bytes, c: Client) -> Outcome {
    match c {
        Client::Normal(size) => {
            let mut s = connect(addr, None).await;
            for _ in 0..2 {
                s.write_all(format!("GET /{size} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                let (len, first) = read_head(&mut s).await;
                assert_eq!(len, size);
                read_body(&mut s, &object, len, first, false).await;
            }
            Outcome::Intact
        }
        Client::Slow(size) => {
            let mut s = connect(addr, Some(8 << 10)).await;
            s.write_all(format!("GET /{size} HTTP/1.1\r\nConnection: close\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let (len, first) = read_head(&mut s).await;
            read_body(&mut s, &object, len, first, true).await;
            Outcome::Intact
        }
        Client::Vanish { size, after, rst } => {
            let mut s = connect(addr, Some(64 << 10)).await;
            s.write_all(format!("GET /{size} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let (_, first) = read_head(&mut s).await;
            let mut seen = first.len();
            let mut tmp = vec![0u8; 16 << 10];
            while seen < after {
                let n = s.read(&mut tmp).await.unwrap();
                assert!(n > 0);
                seen += n;
            }
            if rst {
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
            }
            Outcome::Left
        }
        Client::Stalled(size, hold) => {
            let mut s = connect(addr, Some(8 << 10)).await;
            s.write_all(format!("GET /{size} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            tokio::time::sleep(hold).await;
            Outcome::Left
        }
    }
}

/// 200+ concurrent connections: full-speed keep-alive clients, slow readers, clients that reset
/// or close mid-body, and clients that stall past the write timeout.
#[test]
fn load_with_slow_vanishing_and_stalled_clients() {
    let _serial = serial();
    const MAX: usize = 4 << 20;
    let object = server::make_object(MAX);
    let clients_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for mode in [
        Mode::ZeroTx(EngineKind::Auto),
        Mode::ZeroTx(EngineKind::MsgZerocopy),
        Mode::ZeroTx(EngineKind::UringZc),
    ] {
        let name = mode.name();
        let s = start(mode, MAX, |c| {
            c.write_timeout = Duration::from_secs(2);
            c.close_timeout = Duration::from_secs(2);
        });
        let sizes = [4096, 100_003, 1 << 20, (2 << 20) + 3];
        let mut plan = Vec::new();
        for i in 0..130 {
            plan.push(Client::Normal(sizes[i % sizes.len()]));
        }
        for i in 0..40 {
            plan.push(Client::Slow(if i % 2 == 0 { 256 << 10 } else { 1 << 20 }));
        }
        for i in 0..30 {
            let rst = i % 2 == 0;
            plan.push(Client::Vanish {
                size: MAX,
                after: 64 << 10,
                rst,
            });
        }
        for _ in 0..5 {
            plan.push(Client::Stalled(MAX, Duration::from_secs(6)));
        }
        let rss_before = rss_bytes();
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss_before));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Relaxed) {
                    peak.fetch_max(rss_bytes(), Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let addr = s.addr;
        let outcomes = clients_rt.block_on(async {
            let tasks: Vec<_> = plan
                .iter()
                .map(|&c| tokio::spawn(run_client(addr, object.clone(), c)))
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                let o = tokio::time::timeout(Duration::from_secs(30), t)
                    .await
                    .unwrap_or_else(|_| panic!("{name}: a client hung"))
                    .unwrap_or_else(|e| panic!("{name}: a client failed: {e}"));
                out.push(o);
            }
            out
        });
        let intact = outcomes.iter().filter(|o| **o == Outcome::Intact).count();
        assert_eq!(intact, 170, "{name}: every full response intact");
        // Everything the server sent came back, including to clients that left or stalled.
        settle(&s, &name);
        done.store(true, Relaxed);
        sampler.join().unwrap();
        let st = &s.stats;
        assert!(st.connections.load(Relaxed) >= 205);
        assert!(
            st.write_timeouts.load(Relaxed) >= 5,
            "{name}: the stalled clients were not timed out:\n{}",
            st.render()
        );
        assert!(
            st.send_errors.load(Relaxed) + st.released_with_error.load(Relaxed) > 0,
            "{name}: no client that left was noticed:\n{}",
            st.render()
        );
        // The server still serves.
        let fresh = clients_rt.block_on(run_client(addr, object.clone(), Client::Normal(MAX)));
        assert_eq!(
            fresh,
            Outcome::Intact,
            "{name}: fresh request after the load"
        );
        settle(&s, &name);
        let grew = peak.load(Relaxed).saturating_sub(rss_before);
        assert!(
            grew < 64 << 20,
            "{name}: RSS grew by {} MiB under load",
            grew >> 20
        );
        eprintln!(
            "{name}: RSS grew {} MiB at peak; server stats:\n{}",
            grew >> 20,
            st.render()
        );
    }
    assert_eq!(zerotx::leaked_buffers(), 0);
}

/// `curl -I`: a `HEAD` request gets the head a `GET` would (status, length), and no body.
#[test]
fn head_requests_get_the_head_alone() {
    let _serial = serial();
    if !util::require(
        Command::new("curl").arg("--version").output().is_ok(),
        "curl is not installed (apt-get install curl)",
    ) {
        return;
    }
    for mode in [Mode::WriteAll, Mode::ZeroTx(EngineKind::Auto)] {
        let s = start(mode, 1 << 20, |_| {});
        let out = Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "20", "-I"])
            .arg(format!("http://{}/65536", s.addr))
            .output()
            .expect("curl");
        let head = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: curl -I failed: {head}",
            mode.name()
        );
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("Content-Length: 65536\r\n"), "{head}");
        settle(&s, &mode.name());
        assert_eq!(s.stats.body_bytes.load(Relaxed), 0, "{}", s.stats.render());
        assert_eq!(
            s.stats.buffers_sent.load(Relaxed),
            0,
            "{}",
            s.stats.render()
        );
    }
}

/// The example's binary, which `scripts/test.sh` builds before the tokio tests (`--test` targets
/// alone do not build examples).
fn object_server_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/object_server");
    assert!(
        bin.exists(),
        "{} is missing: ./scripts/test.sh builds it (cargo build -p zerotx --features tokio --example object_server)",
        bin.display()
    );
    bin
}

#[test]
fn the_binary_answers_help_with_its_flags() {
    let out = Command::new(object_server_bin())
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for flag in ["--listen", "--engine", "--drain-seconds", "--bench"] {
        assert!(text.contains(flag), "{flag} missing from --help:\n{text}");
    }
}

/// SIGTERM while a response is being sent to a slow reader: the response finishes intact, a new
/// connection is refused, and the server exits with status 0 saying it drained.
#[test]
fn sigterm_drains_a_response_in_progress() {
    use std::io::{BufRead, BufReader, Read, Write};

    let _serial = serial();
    let mut child = std::process::Command::new(object_server_bin())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--max-size",
            "16M",
            "--drain-seconds",
            "20",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr: SocketAddr = first
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the server said {first:?}"));
    const SIZE: usize = 16 << 20;
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    socket2::SockRef::from(&c)
        .set_recv_buffer_size(64 << 10)
        .unwrap();
    c.write_all(format!("GET /{SIZE} HTTP/1.1\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    // Some of the body, so the response is under way; then the signal.
    let mut got = vec![0u8; 64 << 10];
    c.read_exact(&mut got).unwrap();
    // SAFETY: kill has no memory preconditions; the pid is our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let draining = lines.next().unwrap().unwrap();
    assert!(draining.contains("draining"), "{draining}");
    // The listener closes once the server thread sees the stop, a moment after the line.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "connections still accepted after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The slow reader reads the rest.
    let mut rest = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        std::thread::sleep(Duration::from_millis(1));
        match c.read(&mut chunk).unwrap() {
            0 => break,
            n => rest.extend_from_slice(&chunk[..n]),
        }
    }
    got.extend_from_slice(&rest);
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let body = &got[head_end..];
    assert_eq!(body.len(), SIZE, "the response was cut short by the stop");
    assert!(
        body == &server::make_object(SIZE)[..],
        "the body differs from the object"
    );
    let status = child.wait().unwrap();
    let tail: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.success(), "{status}: {tail:?}");
    assert!(
        tail.iter()
            .any(|l| l.contains("drained: every connection finished")),
        "{tail:?}"
    );
}
