//! `zerotx probe`: the library's probe report as a table or JSON.

use std::fmt::Write as _;

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use zerotx::probe::ProbeReport;
use zerotx::{EngineKind, Explanation, Sender};

use crate::stdout::{out, outln};

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn opt_bytes(v: Option<u64>) -> String {
    match v {
        None => "unlimited".into(),
        Some(b) if b >= 1 << 20 => format!("{} MiB ({b} bytes)", b >> 20),
        Some(b) if b >= 1 << 10 => format!("{} KiB ({b} bytes)", b >> 10),
        Some(b) => format!("{b} bytes"),
    }
}

/// The report for people.
pub fn render_table(r: &ProbeReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "kernel            {}", r.kernel);
    let _ = writeln!(s, "\nMSG_ZEROCOPY (SO_ZEROCOPY) per socket kind:");
    for k in &r.sockets {
        let _ = writeln!(s, "  {:<8} {:<4} {}", k.kind, yes_no(k.zerocopy), k.detail);
    }
    let _ = writeln!(s, "  vsock transport: {}", yes_no(r.vsock_transport));
    let u = &r.io_uring;
    let _ = writeln!(
        s,
        "\nio_uring          {}",
        if u.available { "available" } else { &u.detail }
    );
    let _ = writeln!(s, "  SEND_ZC         {}", yes_no(u.send_zc));
    let _ = writeln!(s, "  SENDMSG_ZC      {}", yes_no(u.sendmsg_zc));
    let usage = u.report_usage.map_or("not checked", yes_no);
    let _ = writeln!(s, "  REPORT_USAGE    {usage}");
    let _ = writeln!(s, "\nlimits");
    let _ = writeln!(s, "  net.core.optmem_max  {}", opt_bytes(r.optmem_max));
    let _ = writeln!(s, "  RLIMIT_MEMLOCK       {}", opt_bytes(r.memlock_soft));
    let _ = writeln!(s, "  CAP_IPC_LOCK         {}", yes_no(r.cap_ipc_lock));
    let thp = match r.huge_pages.as_deref() {
        Some("never") => "never (BufPool::huge gets small pages)".to_string(),
        Some(mode) => format!("{mode} (BufPool::huge gets them)"),
        None => "none in this kernel".to_string(),
    };
    let _ = writeln!(s, "  huge pages (THP)     {thp}");
    let lo = |v: Option<bool>| match v {
        Some(true) => "copied",
        Some(false) => "zero-copy",
        None => "not measured",
    };
    let _ = writeln!(s, "\nloopback (one real send each)");
    let _ = writeln!(
        s,
        "  msg-zc over TCP      {}",
        lo(r.loopback.msg_zerocopy_copied)
    );
    let _ = writeln!(s, "  uring-zc over UDP    {}", lo(r.loopback.uring_copied));
    if !r.loopback.detail.is_empty() {
        let _ = writeln!(s, "  ({})", r.loopback.detail);
    }
    let _ = writeln!(s, "\nadvice");
    if r.advice.is_empty() {
        let _ = writeln!(s, "  nothing to tune");
    }
    for a in &r.advice {
        let _ = writeln!(s, "  - {a}");
    }
    s
}

/// Sends `count` buffers of `size` bytes through an `auto` sender and returns what it says.
fn live<F: Into<OwnedFd>>(fd: F, size: usize, count: usize) -> anyhow::Result<Explanation> {
    let mut tx: Sender<Vec<u8>> = Sender::new(fd, EngineKind::Auto)?;
    let mut out = Vec::new();
    for i in 0..count {
        tx.send(vec![i as u8; size])?;
        // Reap as a sender would, so the policy hears the kernel's reports as they come.
        tx.reap(&mut out)?;
        out.clear();
    }
    tx.flush(Duration::from_secs(5))?;
    let explanation = tx.explain();
    let _ = tx.close(Duration::from_secs(1));
    Ok(explanation)
}

/// `auto` over TCP to a sink on loopback.
fn tcp_loopback() -> anyhow::Result<Explanation> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let sink = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        std::io::copy(&mut s, &mut std::io::sink())
    });
    let e = live(TcpStream::connect(addr)?, 64 * 1024, 400);
    let _ = sink.join();
    e
}

/// `auto` over UDP into the black hole: a private network namespace (root only).
fn udp_black_hole() -> anyhow::Result<Explanation> {
    zerotx_testbed::in_new_netns(|| -> anyhow::Result<Explanation> {
        let bh = zerotx_testbed::black_hole(65535)?;
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.connect(bh.v4)?;
        live(sock, 64 * 1024 - 1024, 400)
    })?
}

/// What an `auto` sender on a UDP socket connected to `to` says before sending anything: the
/// way out to that address (its route, device, captures), looked up without a packet sent.
fn the_way_to(to: &str) -> anyhow::Result<Explanation> {
    let mut last = None;
    for endpoint in crate::transfer::resolve(to)? {
        let crate::transfer::Endpoint::Ip(addr) = endpoint else {
            anyhow::bail!("--to {to:?}: give an IP address or host name; vsock has no route");
        };
        let any: std::net::SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let sock = UdpSocket::bind(any)?;
        match sock.connect(addr) {
            Ok(()) => {
                let tx: Sender<Vec<u8>> = Sender::new(sock, EngineKind::Auto)?;
                return Ok(tx.explain());
            }
            Err(e) => last = Some(anyhow::anyhow!("no route to {addr}: {e}")),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("--to {to:?} resolved to no address")))
}

/// What `auto` decided on real sockets here, per case: its title and the explanation (or why
/// it could not be measured); with `to`, the way to that address last.
fn explanations(to: Option<&str>) -> Vec<(String, anyhow::Result<Explanation>)> {
    let mut cases: Vec<(String, anyhow::Result<Explanation>)> = vec![
        (
            "TCP to a local peer (loopback), 64 KiB sends".into(),
            tcp_loopback(),
        ),
        // Without root the namespace cannot be made, and the case says so.
        (
            "UDP leaving through a device (a veth in a private network namespace), 63 KiB sends"
                .into(),
            udp_black_hole(),
        ),
    ];
    if let Some(to) = to {
        cases.push((
            format!("the way to {to} (nothing sent: the route and what lies on it)"),
            the_way_to(to),
        ));
    }
    cases
}

/// Why zero-copy is or is not engaged, in plain words: what `auto` decided on real sockets here.
pub fn render_explain(to: Option<&str>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nwhy zero-copy is or is not engaged (the auto engine, 400 real sends each)"
    );
    for (title, e) in explanations(to) {
        let _ = writeln!(s, "\n{title}");
        match e {
            Ok(e) => {
                for line in e.to_string().lines() {
                    let _ = writeln!(s, "  {line}");
                }
            }
            Err(e) => {
                let _ = writeln!(s, "  could not measure: {e:#}");
            }
        }
    }
    s
}

/// The explanations as JSON: one object per case.
fn explain_json(to: Option<&str>) -> serde_json::Value {
    let cases = explanations(to)
        .into_iter()
        .map(|(title, e)| match e {
            Ok(e) => serde_json::json!({
                "case": title,
                "engine": e.engine.name(),
                "path": e.path,
                "zerocopy_engaged": e.zerocopy,
                "lines": e.lines,
            }),
            Err(e) => serde_json::json!({ "case": title, "error": format!("{e:#}") }),
        })
        .collect();
    serde_json::Value::Array(cases)
}

/// Runs the probe and prints it; with `explain`, also what `auto` decides on real sockets (and
/// on the way to `to`).
pub fn run(json: bool, explain: bool, to: Option<&str>) -> anyhow::Result<()> {
    let report = zerotx::probe();
    if json {
        let mut doc = serde_json::to_value(&report)?;
        if explain {
            doc["explain"] = explain_json(to);
        }
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        out!("{}", render_table(&report));
        // No reader left (`zerotx probe --explain | head -2`): no need to measure more.
        if explain && !crate::stdout::closed() {
            out!("{}", render_explain(to));
        }
    }
    Ok(())
}
