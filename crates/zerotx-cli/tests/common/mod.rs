//! What the CLI's end-to-end tests share: skips that fail under `ZEROTX_STRICT=1`, child
//! processes that never outlive a test, receivers zerotx did not write, network namespaces.
#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test file uses its own part
pub use zerotx_testbed::{is_root, require, strict};

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The `zerotx` binary under test.
pub fn zerotx_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("zerotx")
}

/// A child process killed when the test lets go of it, so no test leaves one behind.
pub struct Proc(pub Child);

impl Proc {
    /// Starts `cmd` with piped stdout/stderr.
    pub fn spawn(cmd: &mut Command) -> Self {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Proc(child)
    }

    /// The first line the child prints (a port, "ready"), within `timeout`.
    pub fn first_line(&mut self, timeout: Duration) -> String {
        let out = self.0.stdout.take().expect("stdout piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut l = String::new();
            let _ = r.read_line(&mut l);
            let _ = tx.send(l);
        });
        rx.recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("the child printed nothing within {timeout:?}"))
            .trim()
            .to_string()
    }

    /// Waits for the exit, up to `timeout` (then kills it and fails the test).
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        loop {
            match self.0.try_wait().expect("try_wait") {
                Some(_) => break,
                None if Instant::now() > deadline => {
                    let _ = self.0.kill();
                    let out = self.take_output();
                    panic!(
                        "the child did not exit within {timeout:?}; stdout: {}; stderr: {}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        self.take_output()
    }

    fn take_output(&mut self) -> Output {
        use std::io::Read;
        let status = self.0.wait().expect("wait");
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        if let Some(mut o) = self.0.stdout.take() {
            let _ = o.read_to_end(&mut stdout);
        }
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_end(&mut stderr);
        }
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end within `timeout`.
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    Proc::spawn(cmd).wait(timeout)
}

/// A TCP receiver in Python (not zerotx): binds `host` port 0, prints the port, takes `conns`
/// connections at once and writes each to `out.N`, closing each at its end of file.
pub const PY_SINK: &str = r#"
import socket, sys, threading
host, out, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
l = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
l.bind((host, 0)); l.listen(16)
print(l.getsockname()[1], flush=True)
def take(c, i):
    with open(f"{out}.{i}", "wb") as f:
        while True:
            d = c.recv(1 << 20)
            if not d: break
            f.write(d)
    c.close()
ts = []
for i in range(conns):
    c, _ = l.accept()
    t = threading.Thread(target=take, args=(c, i)); t.start(); ts.append(t)
for t in ts: t.join()
"#;

/// Starts [`PY_SINK`] (through `prefix`, e.g. `ip netns exec NS`) and returns it with its port.
pub fn py_sink(prefix: &[&str], host: &str, out: &Path, conns: usize) -> (Proc, u16) {
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.extend(["python3", "-c", PY_SINK, host].map(String::from));
    argv.push(out.display().to_string());
    argv.push(conns.to_string());
    let mut p = Proc::spawn(Command::new(&argv[0]).args(&argv[1..]));
    let port = p
        .first_line(Duration::from_secs(10))
        .parse()
        .expect("a port");
    (p, port)
}

/// Whether a socket listens (TCP) or is bound (UDP) on `port` in the network namespace of process
/// `pid`, from its `/proc/PID/net` (which, unlike a connect, does not disturb the listener; and
/// works for a process inside `ip netns exec`, which keeps its pid).
pub fn bound(pid: u32, port: u16, udp: bool) -> bool {
    let (files, state) = if udp {
        (["udp", "udp6"], "07")
    } else {
        (["tcp", "tcp6"], "0A")
    };
    let want = format!(":{port:04X}");
    files.iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}"))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == state
            })
    })
}

/// A port nothing listens on at the moment (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Deterministic bytes that are not the generated stream (xorshift), `len` of them.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A directory under the target dir for one test's files, emptied first.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("zerotx-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Named network namespaces (`ip netns`), deleted when dropped.
pub struct Netns(pub Vec<String>);

impl Netns {
    /// Makes `names` with loopback up, unique to this process and this call: tests of one binary
    /// run in parallel, and two that both asked for "bh" once shared (and deleted) one namespace.
    pub fn new(names: &[&str]) -> Self {
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ns: Vec<String> = names
            .iter()
            .map(|n| format!("zt{}.{call}{n}", std::process::id()))
            .collect();
        let me = Netns(ns.clone());
        for n in &ns {
            ip(&["netns", "add", n]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        me
    }

    /// `ip netns exec NAME` as a command prefix.
    pub fn exec(&self, i: usize) -> Vec<&str> {
        vec!["ip", "netns", "exec", &self.0[i]]
    }

    /// Two namespaces joined by a veth pair: 10.77.0.1 and fd77::1 in the first, 10.77.0.2 and
    /// fd77::2 in the second.
    pub fn pair() -> Self {
        let me = Self::new(&["a", "b"]);
        let (a, b) = (&me.0[0], &me.0[1]);
        ip(&[
            "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b,
        ]);
        ip(&["-n", a, "addr", "add", "10.77.0.1/24", "dev", "va"]);
        ip(&["-n", b, "addr", "add", "10.77.0.2/24", "dev", "vb"]);
        ip(&["-n", a, "addr", "add", "fd77::1/64", "dev", "va", "nodad"]);
        ip(&["-n", b, "addr", "add", "fd77::2/64", "dev", "vb", "nodad"]);
        ip(&["-n", a, "link", "set", "va", "up"]);
        ip(&["-n", b, "link", "set", "vb", "up"]);
        me
    }

    /// One namespace with the black hole of docs/kernel.md ("This machine (what a test can rely
    /// on)"): UDP to 192.0.2.2 leaves through a device that drops it, with true zero-copy
    /// completions.
    pub fn black_hole() -> Self {
        let me = Self::new(&["bh"]);
        let n = &me.0[0];
        ip(&[
            "-n", n, "link", "add", "zc0", "type", "veth", "peer", "name", "zc1",
        ]);
        ip(&["-n", n, "addr", "add", "192.0.2.1/24", "dev", "zc0"]);
        ip(&["-n", n, "link", "set", "zc0", "mtu", "65535", "up"]);
        ip(&[
            "-n",
            n,
            "neigh",
            "add",
            "192.0.2.2",
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "zc0",
        ]);
        me
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Collects what `r` (a child's stdout or stderr) writes, as text, on a thread of its own, so a
/// test can read it while the child runs.
pub fn collect(mut r: Box<dyn std::io::Read + Send>) -> std::sync::Arc<std::sync::Mutex<String>> {
    let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let o = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            o.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    out
}
