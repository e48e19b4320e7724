//! `zerotx probe --explain --to ADDR` names what on the way to ADDR copies zero-copy sends,
//! each made for real in a namespace of the test's own (the black hole's device): scatter-gather
//! turned off with ethtool, a packet socket capturing on every device, a peer behind a veth.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{have, run, zerotx_bin, Netns, Proc};

const T: Duration = Duration::from_secs(30);

/// Whether the test can build namespaces; under `ZEROTX_STRICT=1` it must.
fn can_run() -> bool {
    zerotx_testbed::require(
        zerotx_testbed::is_root() && have("ip") && have("ethtool") && have("python3"),
        "needs root, ip, ethtool and python3 for a namespace of its own",
    )
}

/// `zerotx probe --explain --to ADDR` inside namespace `ns`: its stdout.
fn explain_to(ns: &Netns, to: &str) -> String {
    let mut cmd = Command::new(ns.exec(0)[0]);
    cmd.args(&ns.exec(0)[1..])
        .arg(zerotx_bin())
        .args(["probe", "--explain", "--to", to]);
    let out = run(&mut cmd, T);
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{o}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The case for ADDR comes last.
    o.rsplit_once(&format!("the way to {to}"))
        .map(|(_, tail)| tail.to_string())
        .unwrap_or_else(|| panic!("no case for {to}: {o}"))
}

#[test]
fn probe_explain_to_names_a_device_without_scatter_gather() {
    if !can_run() {
        return;
    }
    let ns = Netns::black_hole();
    let before = explain_to(&ns, "192.0.2.2");
    assert!(before.contains("through zc0, a veth pair"), "{before}");
    assert!(!before.contains("scatter-gather off"), "{before}");
    let mut off = Command::new(ns.exec(0)[0]);
    off.args(&ns.exec(0)[1..])
        .args(["ethtool", "-K", "zc0", "sg", "off"]);
    assert!(run(&mut off, T).status.success());
    let after = explain_to(&ns, "192.0.2.2");
    assert!(
        after.contains("zero-copy not engaged")
            && after.contains("the egress device zc0 has scatter-gather off")
            && after.contains("ethtool -K zc0 sg on"),
        "{after}"
    );
}

#[test]
fn probe_explain_to_names_a_capture_on_the_egress_device() {
    if !can_run() {
        return;
    }
    let ns = Netns::black_hole();
    assert!(!explain_to(&ns, "192.0.2.2").contains("packet socket"));
    // A capture on zc0 with ETH_P_ALL (3), as `tcpdump -i zc0` opens: no hook until it is
    // bound, so it never taps another test's device.
    let mut tap = Command::new(ns.exec(0)[0]);
    tap.args(&ns.exec(0)[1..]).args([
        "python3",
        "-c",
        "import socket, time\n\
             s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)\n\
             s.bind(('zc0', 3))\n\
             print('ready', flush=True)\n\
             time.sleep(60)",
    ]);
    let mut tap = Proc::spawn(&mut tap);
    assert_eq!(tap.first_line(T).trim(), "ready");
    let with = explain_to(&ns, "192.0.2.2");
    assert!(
        with.contains("1 packet socket captures every frame sent on zc0"),
        "{with}"
    );
}

#[test]
fn probe_explain_to_an_unreachable_address_says_so() {
    if !can_run() {
        return;
    }
    // A namespace with no default route: the address has no way out.
    let ns = Netns::new(&["nr"]);
    let mut cmd = Command::new(ns.exec(0)[0]);
    cmd.args(&ns.exec(0)[1..]).arg(zerotx_bin()).args([
        "probe",
        "--explain",
        "--to",
        "198.51.100.7",
    ]);
    let out = run(&mut cmd, T);
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{o}");
    assert!(o.contains("no route to 198.51.100.7"), "{o}");
}
