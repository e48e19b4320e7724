//! iperf3's habits where they fit a plain-bytes tool (issue 39): its short flags, JSON in its key
//! order, `--logfile`, and iperf3's control protocol recognised and named at either end.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bound, free_port, have, require, run, scratch, zerotx_bin, Proc};

const T: Duration = Duration::from_secs(20);

fn zerotx(args: &[&str]) -> Command {
    let mut c = Command::new(zerotx_bin());
    c.args(args);
    c
}

/// `zerotx recv -1` on a fresh loopback port, listening.
fn receiver(extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["recv", "-1", "-i", "0", "--listen", listen.as_str()];
    args.extend(extra);
    let p = Proc::spawn(&mut zerotx(&args));
    wait_bound(&p, port, extra.contains(&"-u"));
    (p, port)
}

fn wait_bound(p: &Proc, port: u16, udp: bool) {
    let t0 = std::time::Instant::now();
    while !bound(p.0.id(), port, udp) {
        assert!(t0.elapsed() < T, "nothing bound port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The top-level keys of a JSON document, in the order they are written.
fn top_keys(doc: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for line in doc.lines() {
        // serde_json's pretty printer puts top-level keys two spaces in.
        if let Some(rest) = line.strip_prefix("  \"") {
            keys.push(rest.split('"').next().unwrap().to_string());
        }
    }
    keys
}

#[test]
fn short_flags_mean_what_they_mean_in_iperf3() {
    let (r, port) = receiver(&["-J"]);
    let to = format!("127.0.0.1:{port}");
    let out = run(
        &mut zerotx(&["send", &to, "-n", "1M", "-l", "64K", "-J", "-4"]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    let v: serde_json::Value = serde_json::from_str(&o).expect("-J prints JSON");
    assert_eq!(v["start"]["test_start"]["blksize"], 65536, "{o}");
    assert_eq!(v["end"]["sum_sent"]["bytes"], 1 << 20, "{o}");
    let got = r.wait(T);
    let (ro, re) = text(&got);
    assert!(got.status.success(), "{ro}\n{re}");
    let rv: serde_json::Value = serde_json::from_str(&ro).expect("recv -J prints JSON");
    assert_eq!(rv["end"]["sum_received"]["bytes"], 1 << 20, "{ro}");

    // -u with -t: UDP for a time.
    let (r, port) = receiver(&["-u", "--idle", "0.5"]);
    let to = format!("127.0.0.1:{port}");
    let out = run(
        &mut zerotx(&["send", &to, "-u", "-t", "0.3", "-b", "10M", "-i", "0"]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    let got = r.wait(T);
    assert!(got.status.success(), "{:?}", text(&got));

    // -6 to an IPv4 address, -4 to an IPv6 one: refused, saying why.
    let out = run(&mut zerotx(&["send", "127.0.0.1:9", "-6"]), T);
    let (_, e) = text(&out);
    assert!(e.contains("has no IPv6 address"), "{e}");
    let out = run(&mut zerotx(&["send", "[::1]:9", "-4"]), T);
    let (_, e) = text(&out);
    assert!(e.contains("has no IPv4 address"), "{e}");
}

#[test]
fn json_keys_come_in_iperf3s_order() {
    let (r, port) = receiver(&["--json"]);
    let to = format!("127.0.0.1:{port}");
    let out = run(&mut zerotx(&["send", &to, "--bytes", "256K", "--json"]), T);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    assert_eq!(top_keys(&o), ["start", "intervals", "end"], "{o}");
    let (ro, _) = text(&r.wait(T));
    assert_eq!(top_keys(&ro), ["start", "intervals", "end"], "{ro}");
}

#[test]
fn logfile_takes_the_output() {
    let (r, port) = receiver(&[]);
    let to = format!("127.0.0.1:{port}");
    let log = scratch("logfile").join("send.log");
    let out = run(
        &mut zerotx(&[
            "send",
            &to,
            "--bytes",
            "256K",
            "--logfile",
            log.to_str().unwrap(),
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.is_empty(), "stdout should be empty with --logfile: {o}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("sender"), "{logged}");
    r.wait(T);
}

#[test]
fn an_iperf3_client_reaching_recv_is_named() {
    if !require(have("iperf3"), "iperf3 is not installed") {
        return;
    }
    let (r, port) = receiver(&[]);
    let client = run(
        Command::new("iperf3").args(["-c", "127.0.0.1", "-p", &port.to_string(), "-t", "1"]),
        T,
    );
    let got = r.wait(T);
    let (ro, re) = text(&got);
    assert!(
        re.contains("this is iperf3's control protocol"),
        "recv did not name iperf3:\nstdout: {ro}\nstderr: {re}\niperf3: {:?}",
        text(&client)
    );
    assert!(re.contains("zerotx speaks plain bytes"), "{re}");
    // No throughput summary for the 37 bytes of iperf3's cookie.
    assert!(!ro.contains("receiver"), "{ro}");
}

#[test]
fn send_reaching_an_iperf3_server_is_named() {
    if !require(have("iperf3"), "iperf3 is not installed") {
        return;
    }
    let port = free_port();
    let server = Proc::spawn(Command::new("iperf3").args(["-s", "-1", "-p", &port.to_string()]));
    wait_bound(&server, port, false);
    let out = run(
        &mut zerotx(&[
            "send",
            &format!("127.0.0.1:{port}"),
            "--bytes",
            "4M",
            "-i",
            "0",
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{o}\n{e}");
    assert!(e.contains("this is iperf3's control protocol"), "{o}\n{e}");
    assert!(e.contains("zerotx speaks plain bytes"), "{e}");
    drop(server);
}

#[test]
fn bind_window_and_verbose() {
    let (r, port) = receiver(&["-w", "256K", "-V"]);
    let to = format!("127.0.0.1:{port}");
    let out = run(
        &mut zerotx(&[
            "send",
            &to,
            "-n",
            "256K",
            "-B",
            "127.0.0.2",
            "-w",
            "256K",
            "-V",
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.contains("local 127.0.0.2 port"), "-B not used:\n{o}");
    assert!(
        o.starts_with("zerotx ") && o.contains("\nLinux ") && o.contains("\nTime: "),
        "{o}"
    );
    let (ro, _) = text(&r.wait(T));
    assert!(ro.starts_with("zerotx ") && ro.contains("\nTime: "), "{ro}");
    assert!(ro.contains("127.0.0.2"), "{ro}");
    let out = run(&mut zerotx(&["send", &to, "-B", "nonsense"]), T);
    assert!(
        text(&out).1.contains("invalid -B \"nonsense\""),
        "{:?}",
        text(&out)
    );
    let out = run(&mut zerotx(&["send", &to, "-w", "0"]), T);
    assert!(
        text(&out).1.contains("invalid --window \"0\""),
        "{:?}",
        text(&out)
    );
}

#[test]
fn udp_without_a_rate_warns_that_it_is_unpaced() {
    let (r, port) = receiver(&["-u", "--idle", "0.5"]);
    let to = format!("127.0.0.1:{port}");
    let out = run(&mut zerotx(&["send", &to, "-u", "-n", "1M", "-i", "0"]), T);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    assert!(e.contains("warning: UDP without -b is not paced"), "{e}");
    r.wait(T);
    // With a rate: no warning.
    let (r, port) = receiver(&["-u", "--idle", "0.5"]);
    let to = format!("127.0.0.1:{port}");
    let out = run(
        &mut zerotx(&["send", &to, "-u", "-n", "64K", "-b", "100M", "-i", "0"]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    assert!(!e.contains("warning"), "{e}");
    r.wait(T);
}

#[test]
fn json_stream_prints_one_line_per_event() {
    let (r, port) = receiver(&[]);
    let to = format!("127.0.0.1:{port}");
    let out = run(
        &mut zerotx(&[
            "send",
            &to,
            "-t",
            "0.5",
            "-i",
            "0.1",
            "-b",
            "100M",
            "--json-stream",
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    let events: Vec<serde_json::Value> = o
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not one JSON line: {l}")))
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|v| v["event"].as_str().unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"start"), "{o}");
    assert_eq!(names.last(), Some(&"end"), "{o}");
    assert!(
        names.iter().filter(|n| **n == "interval").count() >= 2,
        "{o}"
    );
    assert!(events[1]["data"]["sum"]["bytes"].is_u64(), "{o}");
    assert!(
        events.last().unwrap()["data"]["sum_sent"]["bytes"].is_u64(),
        "{o}"
    );
    r.wait(T);
}

#[test]
fn recv_json_stream_prints_one_line_per_event() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let r = Proc::spawn(&mut zerotx(&[
        "recv",
        "-1",
        "-i",
        "0.1",
        "--listen",
        &listen,
        "--json-stream",
    ]));
    wait_bound(&r, port, false);
    let out = run(
        &mut zerotx(&["send", &listen, "-t", "0.5", "-b", "100M", "-i", "0"]),
        T,
    );
    assert!(out.status.success(), "{:?}", text(&out));
    let got = r.wait(T);
    let (o, e) = text(&got);
    assert!(got.status.success(), "{o}\n{e}");
    let names: Vec<String> = o
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|_| panic!("not one JSON line: {l}"));
            v["event"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(names.first().map(String::as_str), Some("start"), "{o}");
    assert_eq!(names.last().map(String::as_str), Some("end"), "{o}");
    assert!(
        names.iter().filter(|n| *n == "interval").count() >= 2,
        "{o}"
    );
}
