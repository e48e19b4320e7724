//! Issue 34, the command's part: a file that shrinks before it is mapped, bad numbers, failed
//! sends' summaries, closed pipes, out-of-range ports, streams cut short, and the resources a
//! receiver lets the network take. Every case runs the real binary on loopback (or, for the
//! black hole, in a namespace the benchmark makes) and checks what a user would see.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use socket2::{Domain, Socket, Type};

const T: Duration = Duration::from_secs(30);

fn zerotx(args: &[&str]) -> Command {
    let mut c = Command::new(zerotx_bin());
    c.args(args);
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Exit status 1 and `needle` in the error, never a panic.
fn refused(o: &Output, needle: &str) -> String {
    let (out, err) = text(o);
    assert!(!err.contains("panicked"), "a panic:\n{err}");
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
    err
}

/// A TCP receiver that reads every connection to its end and throws the bytes away.
fn drain() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    port
}

/// Whether process `pid` has a TCP connection to `port` in SYN_SENT (its connect is waiting).
fn syn_sent(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            c.len() > 3 && c[2].ends_with(&want) && c[3] == "02"
        })
}

/// Item 8: the file shrinks after `send` took its length and before it maps it (while its
/// connect waits: the receiver's accept queue is full, so the first SYN is dropped and the
/// retry comes a second later). The sender must fail and say so; the receiver must never get
/// the file's head in place of its tail.
#[test]
fn a_file_that_shrinks_before_it_is_mapped_fails_and_is_never_wrapped() {
    let dir = scratch("shrink");
    let len = (4 << 20) + 12_345;
    let short = (1 << 20) + 777;
    for engine in ["auto", "copy", "msg-zc"] {
        let data = noise(len, 0x5eed);
        let path = dir.join("in.bin");
        std::fs::write(&path, &data).unwrap();
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        // Backlog 0 holds one connection: the filler below fills it.
        l.listen(0).unwrap();
        let port = l.local_addr().unwrap().as_socket().unwrap().port();
        let filler = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let p = port.to_string();
        let sender = Proc::spawn(&mut zerotx(&[
            "send",
            &format!("127.0.0.1:{p}"),
            "--file",
            path.to_str().unwrap(),
            "--engine",
            engine,
            "-i",
            "0",
        ]));
        let t0 = Instant::now();
        while !syn_sent(sender.0.id(), port) {
            assert!(
                t0.elapsed() < T,
                "{engine}: the sender never tried to connect"
            );
            thread::sleep(Duration::from_millis(5));
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(short as u64)
            .unwrap();
        // Make room: the sender's retried SYN gets in.
        let (first, _) = l.accept().unwrap();
        drop((first, filler));
        let (c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        let mut got = Vec::new();
        let _ = (&c).read_to_end(&mut got);
        let out = sender.wait(T);
        let (stdout, stderr) = text(&out);
        assert!(
            data.starts_with(&got),
            "{engine}: the receiver got {} bytes that are not the file's first bytes (exit \
             {:?})\n{stdout}\n{stderr}",
            got.len(),
            out.status.code()
        );
        assert!(got.len() <= short, "{engine}: {} bytes", got.len());
        refused(&out, "changed size");
    }
}

/// Item 8, the other window: the file shrinks while it is sent (paced, so the truncation comes
/// mid-stream). The sender fails and names the change; the receiver never gets more than the
/// file's first bytes and the zeros of the page the file now ends in.
#[test]
fn a_file_that_shrinks_while_it_is_sent_fails_and_says_so() {
    let dir = scratch("shrink-mid");
    let len = 8 << 20;
    let short = (1 << 20) + 777;
    for engine in ["copy", "msg-zc", "uring-zc"] {
        let data = noise(len, 0x5eed);
        let path = dir.join("in.bin");
        std::fs::write(&path, &data).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let sender = Proc::spawn(&mut zerotx(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "--file",
            path.to_str().unwrap(),
            "--engine",
            engine,
            "--size",
            "64K",
            "-b",
            "80M",
            "-i",
            "0",
        ]));
        let (mut c, _) = l.accept().unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        // Read past the new end first, so the truncation lands mid-stream.
        while got.len() < 2 << 20 {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(short as u64)
            .unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        let _ = c.read_to_end(&mut got);
        let out = sender.wait(T);
        assert!(got.len() < len, "{engine}: the whole length arrived");
        refused(&out, "changed size while it was sent");
    }
}

/// Item 9: a bitrate below one bit per second is refused, not a panic.
#[test]
fn a_bitrate_below_one_bit_per_second_is_refused() {
    let port = drain().to_string();
    let out = run(
        &mut zerotx(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "-b",
            "0.4",
            "--bytes",
            "1M",
            "-i",
            "0",
        ]),
        T,
    );
    refused(&out, "invalid --bitrate");
}

/// Item 9: `--bytes 0.4` is refused, not a transfer of nothing that exits 0.
#[test]
fn a_byte_count_below_one_is_refused() {
    let port = drain().to_string();
    let out = run(
        &mut zerotx(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "--bytes",
            "0.4",
            "-i",
            "0",
        ]),
        T,
    );
    refused(&out, "invalid --bytes");
}

/// A receiver that reads for `secs`, then resets the connection.
fn reset_after(secs: f64) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let until = Instant::now() + Duration::from_secs_f64(secs);
        let mut buf = vec![0u8; 1 << 16];
        while Instant::now() < until && matches!(c.read(&mut buf), Ok(n) if n > 0) {}
        let s = Socket::from(c);
        s.set_linger(Some(Duration::ZERO)).unwrap();
        drop(s);
    });
    port
}

/// Item 9: a send that fails after a while reports the time it ran, not `0.00-0.00` and a
/// rate of terabits; the JSON too.
#[test]
fn a_failed_send_reports_the_time_it_ran() {
    let port = reset_after(0.6).to_string();
    let out = run(
        &mut zerotx(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "--time",
            "5",
            "-i",
            "0",
        ]),
        T,
    );
    let err = refused(&out, "after");
    let (stdout, _) = text(&out);
    let line = stdout
        .lines()
        .find(|l| l.ends_with("sender") || l.contains("  sender"))
        .unwrap_or_else(|| panic!("no sender line:\n{stdout}\n{err}"));
    let end: f64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("0.00-"))
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no interval in {line:?}"));
    assert!(
        end >= 0.4,
        "the summary says the stream ran {end} s: {line}"
    );

    let port = reset_after(0.6).to_string();
    let out = run(
        &mut zerotx(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "--time",
            "5",
            "-i",
            "0",
            "--json",
        ]),
        T,
    );
    refused(&out, "after");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &doc["end"]["streams"][0]["sender"];
    let secs = s["seconds"].as_f64().unwrap();
    assert!(secs >= 0.4, "JSON seconds {secs}: {s}");
    let sum = doc["end"]["sum_sent"]["seconds"].as_f64().unwrap();
    assert!(sum >= 0.4, "JSON sum_sent seconds {sum}");
    assert!(doc["error"].is_string(), "{doc}");
}

fn bench(args: &[&str]) -> Output {
    let mut all = vec![
        "bench",
        "--engines",
        "copy",
        "--duration",
        "0.05",
        "--repeat",
        "1",
    ];
    all.extend_from_slice(args);
    run(&mut zerotx(&all), T)
}

/// Item 9: a size no datagram carries, alone: refused with the limit (it panicked, and `--csv`
/// printed nothing with exit 0).
#[test]
fn bench_refuses_sizes_no_datagram_carries() {
    for extra in [&[][..], &["--csv"][..]] {
        let mut args = vec!["--sizes", "64K", "--topology", "udp-blackhole"];
        args.extend_from_slice(extra);
        let err = refused(&bench(&args), "65507");
        assert!(err.contains("udp-blackhole"), "{err}");
    }
}

/// Item 9: among sizes that fit, one that does not is said in the table and the CSV, not lost.
#[test]
fn bench_says_which_sizes_a_topology_left_out() {
    if !require(is_root(), "the UDP black hole needs root") {
        return;
    }
    let args = ["--sizes", "1400,64K", "--topology", "udp-blackhole"];
    let out = bench(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("left out: 64K"),
        "the table does not say 64K was left out:\n{stdout}"
    );
    let mut csv_args = args.to_vec();
    csv_args.push("--csv");
    let out = bench(&csv_args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("topology,engine,size"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("udp-blackhole,copy,1400,")),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("udp-blackhole,copy,65536,"))
        .unwrap_or_else(|| panic!("no row for 65536:\n{stdout}"));
    assert!(row.contains("65507"), "{row}");
}

/// Runs `args` with standard output a pipe whose reading end is already closed.
fn closed_stdout(args: &[&str]) -> Output {
    let mut child = zerotx(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    Proc(child).wait(T)
}

fn quiet(o: &Output, what: &str) {
    let (_, err) = text(o);
    assert_ne!(o.status.code(), Some(101), "{what}: a panic:\n{err}");
    assert!(!err.contains("panicked"), "{what}:\n{err}");
    assert!(!err.contains("Broken pipe"), "{what}:\n{err}");
    assert_eq!(o.status.code(), Some(141), "{what}:\n{err}");
}

/// Item 9: `zerotx probe --explain | head -2` and `zerotx send ... | head` end quietly.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    quiet(&closed_stdout(&["probe", "--explain"]), "probe --explain");
    quiet(&closed_stdout(&["probe"]), "probe");
    let port = drain().to_string();
    quiet(
        &closed_stdout(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "--time",
            "3",
            "-i",
            "0.1",
        ]),
        "send",
    );
}

/// Item 9: a port over 65535 is refused (it was read as an IPv4 address, 0.1.17.112).
#[test]
fn recv_refuses_a_port_out_of_range() {
    for l in ["70000", ":70000"] {
        let out = run(&mut zerotx(&["recv", "--listen", l, "--once"]), T);
        let err = refused(&out, "70000");
        assert!(err.contains("port"), "{err}");
        assert!(!err.contains("0.1.17.112"), "{err}");
    }
}

/// A `zerotx recv` child whose stdout and stderr are collected as they come.
struct Recv {
    proc: Proc,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Recv {
    fn start(args: &[&str], port: u16, udp: bool) -> Self {
        let mut proc = Proc::spawn(&mut zerotx(&[&["recv"], args].concat()));
        let stdout = collect(Box::new(proc.0.stdout.take().unwrap()));
        let stderr = collect(Box::new(proc.0.stderr.take().unwrap()));
        let t0 = Instant::now();
        while !bound(proc.0.id(), port, udp) {
            if let Ok(Some(_)) = proc.0.try_wait() {
                panic!(
                    "recv ended early:\n{}\n{}",
                    stdout.lock().unwrap(),
                    stderr.lock().unwrap()
                );
            }
            assert!(t0.elapsed() < T, "recv never bound {port}");
            thread::sleep(Duration::from_millis(10));
        }
        Self {
            proc,
            stdout,
            stderr,
        }
    }

    fn wait_for(&self, what: &str) {
        let t0 = Instant::now();
        while !self.stdout.lock().unwrap().contains(what) {
            assert!(
                t0.elapsed() < T,
                "no {what:?} in:\n{}\n{}",
                self.stdout.lock().unwrap(),
                self.stderr.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit; (status, stdout, stderr).
    fn wait(mut self) -> (Option<i32>, String, String) {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.proc.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < T,
                "recv still running:\n{}\n{}",
                self.stdout.lock().unwrap(),
                self.stderr.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(10));
        };
        thread::sleep(Duration::from_millis(100));
        let out = self.stdout.lock().unwrap().clone();
        let err = self.stderr.lock().unwrap().clone();
        (status.code(), out, err)
    }
}

/// Item 9: a sender killed mid-stream: `--verify` says the stream was cut short and fails,
/// instead of "all N bytes are the generated stream".
#[test]
fn verify_fails_a_stream_cut_short_by_a_killed_sender() {
    let port = free_port();
    let r = Recv::start(
        &["-l", &port.to_string(), "--once", "--verify", "-i", "0"],
        port,
        false,
    );
    let sender = Proc::spawn(&mut zerotx(&[
        "send",
        &format!("127.0.0.1:{port}"),
        "-b",
        "400M",
        "--time",
        "20",
        "-i",
        "0",
    ]));
    r.wait_for("connected to");
    thread::sleep(Duration::from_millis(500));
    drop(sender); // SIGKILL
    let (code, out, err) = r.wait();
    assert!(out.contains("cut short"), "{out}\n{err}");
    assert!(!out.contains("verify: all"), "{out}");
    assert_eq!(code, Some(1), "{out}\n{err}");
}

/// Item 10: more connections than the receiver serves at once are refused at once and said.
#[test]
fn recv_caps_its_tcp_connections() {
    let port = free_port();
    let r = Recv::start(&["-l", &port.to_string(), "-i", "0"], port, false);
    let held: Vec<TcpStream> = (0..128)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // Ids start at 5: the 128th stream is [132].
    r.wait_for("[132] local");
    let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 1];
    let got = extra.read(&mut b);
    assert!(
        matches!(got, Ok(0))
            || got
                .as_ref()
                .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock),
        "the 129th connection was kept open: {got:?}"
    );
    let t0 = Instant::now();
    while !r.stderr.lock().unwrap().contains("refused") {
        assert!(t0.elapsed() < T, "{}", r.stderr.lock().unwrap());
        thread::sleep(Duration::from_millis(10));
    }
    assert!(r.stderr.lock().unwrap().contains("128"));
    // The held ones still work.
    let mut w = &held[0];
    w.write_all(b"still here").unwrap();
    drop(held);
}

/// Item 10: datagrams from more sources than the receiver meters are counted apart, not given a
/// meter each.
#[test]
fn recv_caps_its_udp_sources() {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = Recv::start(
        &[
            "-l",
            &format!("127.0.0.1:{port}"),
            "--udp",
            "--once",
            "--idle",
            "1",
            "--json",
            "-i",
            "0",
        ],
        port,
        true,
    );
    let socks: Vec<UdpSocket> = (0..130)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    for s in &socks {
        s.send_to(&[7u8; 100], ("127.0.0.1", port)).unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    let (code, out, err) = r.wait();
    assert_eq!(code, Some(0), "{out}\n{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let streams = doc["end"]["streams"].as_array().unwrap().len();
    assert_eq!(streams, 128, "one meter per source, uncapped");
    assert_eq!(
        doc["end"]["zerotx"]["datagrams_ignored"], 2,
        "{}",
        doc["end"]
    );
    assert!(err.contains("128"), "{err}");
}

/// Item 10: `--output` is never opened through a symbolic link.
#[test]
fn output_refuses_a_symbolic_link() {
    let dir = scratch("symlink");
    let target = dir.join("precious");
    std::fs::write(&target, b"precious").unwrap();
    let link = dir.join("out");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let port = free_port().to_string();
    let out = run(
        &mut zerotx(&[
            "recv",
            "-l",
            &port,
            "--once",
            "--output",
            link.to_str().unwrap(),
        ]),
        Duration::from_secs(5),
    );
    refused(&out, "symbolic link");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
}

/// Item 10: `--output` is opened once: a symbolic link put in its place after the start does not
/// redirect what arrives.
#[test]
fn output_is_opened_once() {
    let dir = scratch("once");
    let target = dir.join("precious");
    std::fs::write(&target, b"precious").unwrap();
    let path = dir.join("out");
    let port = free_port();
    let r = Recv::start(
        &[
            "-l",
            &port.to_string(),
            "--once",
            "-i",
            "0",
            "--output",
            path.to_str().unwrap(),
        ],
        port,
        false,
    );
    std::fs::rename(&path, dir.join("moved")).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"what arrived").unwrap();
    drop(c);
    let (code, out, err) = r.wait();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    assert_eq!(std::fs::read(dir.join("moved")).unwrap(), b"what arrived");
}

/// Item 10: `recv --help` states each bound.
#[test]
fn recv_help_states_its_bounds() {
    let out = run(&mut zerotx(&["recv", "--help"]), T);
    let (h, _) = text(&out);
    for needle in [
        "128 connections",
        "128 source",
        "intervals",
        "symbolic link",
    ] {
        assert!(h.contains(needle), "--help lacks {needle:?}:\n{h}");
    }
}
