//! `zerotx probe`: the library's probe report as a table or JSON.

use std::fmt::Write as _;

use zerotx::probe::ProbeReport;

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

/// Runs the probe and prints it.
pub fn run(json: bool) -> anyhow::Result<()> {
    let report = zerotx::probe();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_table(&report));
    }
    Ok(())
}
