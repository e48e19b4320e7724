//! `zerotx recv` end to end on loopback: the binary runs as a child, senders are std sockets in
//! the test or Python (any sender must work: no header, no control connection). Every child is
//! killed after a deadline, so a hang fails the test instead of stalling the suite.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod common;
#[allow(dead_code)]
#[path = "../src/transfer/pattern.rs"]
mod pattern;

use common::{bound, collect};
use pattern::{Window, PERIOD};

const DEADLINE: Duration = Duration::from_secs(30);

/// A running `zerotx recv` whose output is collected as it comes.
struct Recv {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    started: Instant,
}

/// What a finished `zerotx recv` left.
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Recv {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_zerotx"))
            .arg("recv")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("zerotx runs");
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
            started: Instant::now(),
        }
    }

    /// Starts it on `port` and waits until the port is bound (read from /proc, which does not
    /// disturb it).
    fn on(port: u16, udp: bool, args: &[&str]) -> Self {
        let p = port.to_string();
        let mut all = vec!["-l", &p];
        if udp {
            all.push("--udp");
        }
        all.extend_from_slice(args);
        let mut r = Self::start(&all);
        while !bound(r.child.id(), port, udp) {
            if let Ok(Some(_)) = r.child.try_wait() {
                let d = r.wait();
                panic!("zerotx recv exited early: {}{}", d.stdout, d.stderr);
            }
            assert!(r.started.elapsed() < DEADLINE, "recv never bound {port}");
            thread::sleep(Duration::from_millis(10));
        }
        r
    }

    /// Waits until stdout holds `what`.
    fn wait_for(&self, what: &str) {
        while !self.stdout.lock().unwrap().contains(what) {
            assert!(
                self.started.elapsed() < DEADLINE,
                "no {what:?} in {}",
                self.stdout.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit (killing it at the deadline and failing).
    fn wait(mut self) -> Done {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the readers drain the pipes.
                thread::sleep(Duration::from_millis(50));
                return Done {
                    status,
                    stdout: self.stdout.lock().unwrap().clone(),
                    stderr: self.stderr.lock().unwrap().clone(),
                };
            }
            if self.started.elapsed() > DEADLINE {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "zerotx recv still running after {DEADLINE:?}:\n{}\n{}",
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Recv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody holds now (bound then released).
fn free_port(udp: bool) -> u16 {
    if udp {
        UdpSocket::bind("[::]:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    } else {
        TcpListener::bind("[::]:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }
}

/// The generated stream from offset `from`, `len` bytes.
fn stream(from: u64, len: usize) -> Vec<u8> {
    let w = Window::new(PERIOD);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = (len - v.len()).min(PERIOD);
        v.extend_from_slice(&w.at(from + v.len() as u64, n));
    }
    v
}

/// Sends `len` bytes of the generated stream on one connection, then closes it.
fn send_stream(port: u16, len: usize) {
    let w = Window::new(PERIOD);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut off = 0;
    while off < len {
        let n = (len - off).min(PERIOD);
        c.write_all(&w.at(off as u64, n)).unwrap();
        off += n;
    }
}

fn json(d: &Done) -> serde_json::Value {
    serde_json::from_str(&d.stdout).unwrap_or_else(|e| panic!("{e}: {}", d.stdout))
}

/// Runs a Python 3 program with `args`; fails the test when it fails.
fn python(program: &str, args: &[&str]) {
    let mut c = Command::new("python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .spawn()
        .expect("python3 runs");
    let t = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            assert!(s.success(), "python sender failed: {s}");
            return;
        }
        if t.elapsed() > DEADLINE {
            let _ = c.kill();
            panic!("python sender still running after {DEADLINE:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn tcp_stream_of_64_mib_verifies_and_counts_every_byte() {
    let port = free_port(false);
    // The port alone listens on [::]; an IPv4 sender must get in.
    let r = Recv::on(port, false, &["--once", "--verify"]);
    send_stream(port, 64 << 20);
    let d = r.wait();
    assert!(d.status.success(), "{}{}", d.stdout, d.stderr);
    assert!(
        d.stdout
            .contains("verify: all 67108864 bytes are the generated stream"),
        "{}",
        d.stdout
    );
    assert!(d.stdout.contains("Accepted connection from 127.0.0.1"));
    assert!(d.stdout.contains("64.0 MBytes"), "{}", d.stdout);
    assert!(d.stdout.contains("receiver"));
    assert!(d.stdout.contains("CPU: "), "{}", d.stdout);
}

#[test]
fn one_wrong_byte_fails_and_names_its_offset() {
    let port = free_port(false);
    let r = Recv::on(port, false, &["--once", "--verify", "-i", "0"]);
    let mut data = stream(0, 8 << 20);
    data[5_000_003] ^= 0x40;
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(&data).unwrap();
    drop(c);
    let d = r.wait();
    assert!(!d.status.success(), "{}", d.stdout);
    assert!(
        d.stderr.contains("stream offset 5000003"),
        "{}{}",
        d.stdout,
        d.stderr
    );
    assert!(d.stdout.contains("verify: FAILED"), "{}", d.stdout);
}

#[test]
fn output_gets_exactly_what_a_python_sender_sent() {
    let dir = std::env::temp_dir().join(format!("zerotx-recv-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("src");
    let dst = dir.join("dst");
    let data: Vec<u8> = (0..10u64 << 20)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let port = free_port(false);
    let r = Recv::on(port, false, &["--once", "-o", dst.to_str().unwrap()]);
    python(
        "import socket,sys\n\
         s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n\
         s.sendfile(open(sys.argv[2],'rb'))\n\
         s.close()",
        &[&port.to_string(), src.to_str().unwrap()],
    );
    let d = r.wait();
    assert!(d.status.success(), "{}{}", d.stdout, d.stderr);
    assert!(std::fs::read(&dst).unwrap() == data, "output differs");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn output_refuses_a_second_stream_while_one_is_written() {
    let dir = std::env::temp_dir().join(format!("zerotx-recv-two-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join("dst");
    let port = free_port(false);
    let r = Recv::on(port, false, &["--once", "-o", dst.to_str().unwrap()]);
    let mut a = TcpStream::connect(("127.0.0.1", port)).unwrap();
    a.write_all(b"first half, ").unwrap();
    r.wait_for("connected to");
    let mut b = TcpStream::connect(("127.0.0.1", port)).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Refused: closed at once, so the read sees the end (or a reset), never a timeout.
    let mut buf = [0u8; 16];
    match b.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("second connection not closed: {other:?}"),
    }
    a.write_all(b"second half").unwrap();
    a.shutdown(Shutdown::Write).unwrap();
    let d = r.wait();
    assert!(d.status.success(), "{}{}", d.stdout, d.stderr);
    assert!(
        d.stderr.contains("--output takes one stream at a time"),
        "{}",
        d.stderr
    );
    assert_eq!(std::fs::read(&dst).unwrap(), b"first half, second half");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn parallel_connections_are_one_transfer_with_a_sum() {
    let port = free_port(false);
    let r = Recv::on(port, false, &["--once", "--verify", "-i", "0.2"]);
    let all_sent = Arc::new(Barrier::new(4));
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let all_sent = all_sent.clone();
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            thread::spawn(move || {
                c.write_all(&stream(0, 16 << 20)).unwrap();
                // Close only when every stream is through, so all four overlap.
                all_sent.wait();
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let d = r.wait();
    assert!(d.status.success(), "{}{}", d.stdout, d.stderr);
    let totals: Vec<&str> = d
        .stdout
        .lines()
        .filter(|l| l.contains("receiver"))
        .collect();
    assert_eq!(totals.len(), 5, "{}", d.stdout);
    assert!(totals[4].starts_with("[SUM]"), "{}", d.stdout);
    assert!(totals[4].contains("64.0 MBytes"), "{}", d.stdout);
    for id in 5..9 {
        assert!(totals.iter().any(|l| l.starts_with(&format!("[  {id}]"))));
    }
    assert!(d.stdout.contains("verify: all 67108864 bytes"));
    assert_eq!(d.stdout.matches("Accepted connection").count(), 1);
}

#[test]
fn a_port_in_use_fails_at_once_and_says_so() {
    let l = TcpListener::bind("[::]:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = Instant::now();
    let d = Recv::start(&["-l", &port.to_string()]).wait();
    assert!(!d.status.success());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(d.stderr.contains("address already in use"), "{}", d.stderr);
    assert!(d.stderr.contains(&format!(":{port}")), "{}", d.stderr);
    let u = UdpSocket::bind("[::]:0").unwrap();
    let port = u.local_addr().unwrap().port();
    let d = Recv::start(&["--udp", "-l", &port.to_string()]).wait();
    assert!(!d.status.success());
    assert!(d.stderr.contains("address already in use"), "{}", d.stderr);
}

#[test]
fn an_unwritable_output_fails_before_listening() {
    let port = free_port(false);
    let t = Instant::now();
    let d = Recv::start(&["-l", &port.to_string(), "-o", "/nonexistent/dir/file"]).wait();
    assert!(!d.status.success());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        d.stderr
            .contains("cannot write --output /nonexistent/dir/file"),
        "{}",
        d.stderr
    );
    assert!(d.stdout.is_empty(), "{}", d.stdout);
}

/// Sends datagrams `order` (indices of 1472-byte pieces of the stream) to `port`, paced so the
/// loopback queue never overflows.
fn send_datagrams(port: u16, order: &[u64], garbage_after: Option<usize>) {
    let w = Window::new(PERIOD);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(("127.0.0.1", port)).unwrap();
    for (k, &i) in order.iter().enumerate() {
        s.send(&w.at(i * 1472, 1472)).unwrap();
        if garbage_after == Some(k) {
            s.send(&[0x55u8; 1472]).unwrap();
        }
        if k % 8 == 7 {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn udp_counts_skipped_datagrams_as_lost_and_swaps_as_out_of_order() {
    let port = free_port(true);
    let r = Recv::on(
        port,
        true,
        &["--verify", "--once", "--idle", "0.5", "--json"],
    );
    // 2000 datagrams, every 100th left out (20), 500 and 501 swapped.
    let mut order: Vec<u64> = (0..2000).filter(|i| i % 100 != 50).collect();
    let at = order.iter().position(|&i| i == 500).unwrap();
    order.swap(at, at + 1);
    send_datagrams(port, &order, None);
    let d = r.wait();
    assert!(d.status.success(), "{}{}", d.stdout, d.stderr);
    let v = json(&d);
    let z = &v["end"]["zerotx"];
    assert_eq!(z["lost_packets"], 20, "{z}");
    assert!(z["out_of_order"].as_u64().unwrap() >= 1, "{z}");
    assert_eq!(z["corrupt"], 0);
    assert_eq!(z["verified"], true);
    assert_eq!(z["packets"], 1980);
    assert_eq!(v["start"]["test_start"]["protocol"], "UDP");
    assert_eq!(v["end"]["sum_received"]["bytes"], 1980 * 1472);
}

#[test]
fn a_udp_datagram_that_is_not_the_stream_is_corrupt_and_fails() {
    let port = free_port(true);
    let r = Recv::on(port, true, &["--verify", "--once", "--idle", "0.5"]);
    send_datagrams(port, &(0..100).collect::<Vec<_>>(), Some(49));
    let d = r.wait();
    assert!(!d.status.success(), "{}", d.stdout);
    assert!(
        d.stdout.contains("0 lost, 0 out of order, 1 corrupt"),
        "{}",
        d.stdout
    );
    assert!(
        d.stderr.contains("not the generated stream"),
        "{}",
        d.stderr
    );
}

#[test]
fn json_has_iperf3s_shape() {
    let port = free_port(false);
    let r = Recv::on(port, false, &["--once", "--verify", "--json", "-i", "0.05"]);
    let w = Window::new(PERIOD);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // About 0.3 s, so several intervals close.
    for k in 0..6u64 {
        c.write_all(&w.at(k * (1 << 20), 1 << 20)).unwrap();
        thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    let d = r.wait();
    assert!(d.status.success(), "{}{}", d.stdout, d.stderr);
    let v = json(&d);
    let start = &v["start"];
    assert_eq!(start["test_start"]["protocol"], "TCP");
    assert_eq!(start["test_start"]["num_streams"], 1);
    assert_eq!(start["accepted_connection"]["host"], "127.0.0.1");
    let conn = &start["connected"][0];
    for k in [
        "socket",
        "local_host",
        "local_port",
        "remote_host",
        "remote_port",
    ] {
        assert!(!conn[k].is_null(), "connected.{k} missing: {conn}");
    }
    assert_eq!(conn["local_port"], port);
    assert!(start["version"].as_str().unwrap().starts_with("zerotx "));
    assert!(start["timestamp"]["timesecs"].as_u64().unwrap() > 1_600_000_000);
    assert!(start["timestamp"]["time"]
        .as_str()
        .unwrap()
        .ends_with("GMT"));
    let intervals = v["intervals"].as_array().unwrap();
    assert!(intervals.len() >= 3, "{}", v["intervals"]);
    let mut sum = 0;
    for i in intervals {
        let s = &i["streams"][0];
        for k in [
            "socket",
            "start",
            "end",
            "seconds",
            "bytes",
            "bits_per_second",
        ] {
            assert!(s[k].is_number(), "interval {k}: {s}");
        }
        assert_eq!(s["sender"], false);
        sum += i["sum"]["bytes"].as_u64().unwrap();
    }
    assert_eq!(sum, 6 << 20, "intervals add up to the total");
    let end = &v["end"];
    assert_eq!(end["sum_received"]["bytes"], 6 << 20);
    assert!(end["sum_received"]["bits_per_second"].as_f64().unwrap() > 0.0);
    assert_eq!(end["streams"][0]["receiver"]["bytes"], 6 << 20);
    assert_eq!(end["streams"][0]["receiver"]["sender"], false);
    for k in ["host_total", "host_user", "host_system"] {
        assert!(end["cpu_utilization_percent"][k].is_number(), "{k}");
    }
    let z = &end["zerotx"];
    assert_eq!(z["verified"], true);
    assert!(z["mismatch_offset"].is_null());
    assert!(z["output"].is_null());
    assert!(z["cpu_seconds_per_gb"].is_number());
}

#[test]
fn a_peer_that_resets_ends_its_stream_not_the_receiver() {
    let port = free_port(false);
    let r = Recv::on(port, false, &["--once", "--verify"]);
    // 3 MiB of the stream, then SO_LINGER 0: close sends a reset.
    python(
        "import socket,struct,sys,time\n\
         K=0x6a09e667f3bcc908; M=0x9e3779b97f4a7c15; W=(1<<20)//8\n\
         p=b''.join(struct.pack('<Q',((w^K)*M)&(2**64-1)) for w in range(W))\n\
         s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n\
         s.sendall(p*3)\n\
         time.sleep(0.3)\n\
         s.setsockopt(socket.SOL_SOCKET,socket.SO_LINGER,struct.pack('ii',1,0))\n\
         s.close()",
        &[&port.to_string()],
    );
    let d = r.wait();
    assert!(
        d.stdout.contains("connection reset after 3145728 bytes"),
        "{}{}",
        d.stdout,
        d.stderr
    );
    // The receiver reports the transfer; --verify fails it: the stream was cut short.
    assert!(
        d.stdout.contains("verify: FAILED: [  5] was cut short"),
        "{}",
        d.stdout
    );
    assert_eq!(d.status.code(), Some(1), "{}{}", d.stdout, d.stderr);
}
