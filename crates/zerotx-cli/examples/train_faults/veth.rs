//! A veth pair across two namespaces of our own, a receiver on the far side, and the tools
//! (`ip`, `nft`, `tc`) that build it and its faults.

use std::io;
use std::net::UdpSocket;
use std::panic;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::datagrams::receiver;

/// The far side of every veth here.
pub(crate) const FAR: &str = "192.0.2.2:9";

/// Runs a tool; its failure is an error that names it and says what it printed.
pub(crate) fn tool(name: &str, args: &[&str], stdin: Option<&str>) -> io::Result<()> {
    use std::io::Write;
    let mut cmd = Command::new(name);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{name}: {e} (is it installed?)")))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{name} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

pub(crate) fn ip(args: &[&str]) -> io::Result<()> {
    tool("ip", args, None)
}

/// The thread's kernel id, for `ip link set ... netns`.
pub(crate) fn tid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// A veth pair across two fresh namespaces: the sender's `zc0` (192.0.2.1/24) and the
/// receiver's `zc1` (192.0.2.2/24), MTU 1500. `prep` sets up the sender's namespace; `recv`
/// runs in the receiver's with a socket of `protocol` bound to [`FAR`]; `send` runs in the
/// sender's once a probe came through (until the carrier is up the device drops without an
/// error). Both results come back.
pub(crate) fn over_veth<R: Send, S: Send>(
    protocol: i32,
    prep: impl FnOnce() -> io::Result<()> + Send,
    recv: impl FnOnce(UdpSocket) -> R + Send,
    send: impl FnOnce() -> S + Send,
) -> io::Result<(R, S)> {
    zerotx_testbed::in_new_netns(|| -> io::Result<(R, S)> {
        ip(&["link", "add", "zc0", "type", "veth", "peer", "name", "zc1"])?;
        ip(&["addr", "add", "192.0.2.1/24", "dev", "zc0"])?;
        ip(&["link", "set", "zc0", "mtu", "1500", "up"])?;
        prep()?;
        let (tid_tx, tid_rx) = mpsc::channel();
        let (moved_tx, moved_rx) = mpsc::channel::<()>();
        let (bound_tx, bound_rx) = mpsc::channel();
        let (through_tx, through_rx) = mpsc::channel();
        std::thread::scope(|s| {
            let far = s.spawn(move || {
                zerotx_testbed::in_new_netns(move || -> io::Result<R> {
                    tid_tx.send(tid()).expect("the sender waits");
                    moved_rx.recv().map_err(io::Error::other)?;
                    ip(&["addr", "add", "192.0.2.2/24", "dev", "zc1"])?;
                    ip(&["link", "set", "zc1", "mtu", "1500", "up"])?;
                    let sock = receiver(FAR.parse().expect("an address"), protocol)?;
                    let probes = UdpSocket::bind("192.0.2.2:8")?;
                    bound_tx.send(()).expect("the sender waits");
                    probes.set_read_timeout(Some(Duration::from_secs(10)))?;
                    probes.recv(&mut [0u8; 8])?;
                    through_tx.send(()).expect("the sender waits");
                    Ok(recv(sock))
                })?
            });
            let far_tid = tid_rx.recv().map_err(io::Error::other)?.to_string();
            ip(&["link", "set", "zc1", "netns", &far_tid])?;
            moved_tx.send(()).map_err(io::Error::other)?;
            bound_rx
                .recv()
                .map_err(|_| io::Error::other("the receiver's namespace failed"))?;
            let probe = UdpSocket::bind("192.0.2.1:0")?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while through_rx.try_recv().is_err() && Instant::now() < deadline {
                let _ = probe.send_to(b"probe", "192.0.2.2:8");
                std::thread::sleep(Duration::from_millis(10));
            }
            let sent = send();
            let got = far.join().unwrap_or_else(|p| panic::resume_unwind(p))?;
            Ok((got, sent))
        })
    })?
}
