//! `zerotx send` end to end, against receivers zerotx did not write (Python, socat, nc), on
//! loopback, across a network namespace pair the test makes, and into the black hole; and every
//! kind of bad input, each ending with a message and a non-zero exit, never a hang.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(60);

fn send(prefix: &[&str], args: &[&str]) -> Output {
    let bin = zerotx_bin();
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.push(bin.display().to_string());
    argv.push("send".into());
    argv.extend(args.iter().map(|s| s.to_string()));
    run(Command::new(&argv[0]).args(&argv[1..]), T)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(o: &Output) -> String {
    let (out, err) = text(o);
    assert!(
        o.status.success(),
        "zerotx send failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

fn fails(o: &Output, needle: &str) -> String {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains(needle),
        "stderr lacks {needle:?}:\n{err}\nstdout:\n{out}"
    );
    err
}

/// A file of an odd length (not a multiple of any send size or page).
fn a_file(dir: &Path, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let data = noise(len, 0x5eed);
    let p = dir.join("in.bin");
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

/// What [`PY_SINK`] wrote for connection `i`.
fn conn_file(out: &Path, i: usize) -> std::path::PathBuf {
    format!("{}.{i}", out.display()).into()
}

fn same(got: &Path, want: &[u8], what: &str) {
    let g = std::fs::read(got).unwrap_or_else(|e| panic!("{what}: reading {}: {e}", got.display()));
    assert_eq!(g.len(), want.len(), "{what}: length");
    assert!(g == want, "{what}: the bytes differ");
}

#[test]
fn a_file_arrives_intact_at_a_python_receiver_by_every_path_and_engine() {
    let dir = scratch("py");
    let (file, data) = a_file(&dir, (12 << 20) + 12_345);
    let f = file.to_str().unwrap();
    for (via, engine) in [
        ("sendfile", "auto"),
        ("mmap", "auto"),
        ("mmap", "copy"),
        ("mmap", "msg-zc"),
        ("mmap", "uring"),
        ("mmap", "uring-zc"),
    ] {
        let out = dir.join(format!("out-{via}-{engine}"));
        let (sink, port) = py_sink(&[], "127.0.0.1", &out, 1);
        let o = send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--file",
                f,
                "--file-via",
                via,
                "--engine",
                engine,
                "--size",
                "100000",
            ],
        );
        let s = ok(&o);
        sink.wait(T);
        same(&conn_file(&out, 0), &data, &format!("{via}/{engine}"));
        let says = if via == "sendfile" {
            "with sendfile(2)"
        } else {
            "mapped (mmap)"
        };
        assert!(s.contains(says), "{s}");
        assert!(s.contains("receiver (read to the end, then closed)"), "{s}");
    }
}

#[test]
fn a_file_arrives_intact_at_socat_and_nc() {
    let have_all = have("socat") && have("nc");
    if !require(have_all, "socat and nc (netcat-openbsd) are needed") {
        return;
    }
    let dir = scratch("tools");
    let (file, data) = a_file(&dir, (8 << 20) + 7);
    let f = file.to_str().unwrap();
    for (tool, via) in [("socat", "sendfile"), ("nc", "mmap")] {
        let port = free_port();
        let out = dir.join(format!("out-{tool}"));
        let mut cmd = match tool {
            "socat" => {
                let mut c = Command::new("socat");
                c.args([
                    "-u",
                    &format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr"),
                    &format!("CREATE:{}", out.display()),
                ]);
                c
            }
            _ => {
                let mut c = Command::new("sh");
                c.args([
                    "-c",
                    &format!("exec nc -d -l 127.0.0.1 {port} > {}", out.display()),
                ]);
                c
            }
        };
        let rx = Proc::spawn(&mut cmd);
        // Until the tool listens, connecting is refused: try again for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        let o = loop {
            let o = send(
                &[],
                &[&format!("127.0.0.1:{port}"), "--file", f, "--file-via", via],
            );
            if o.status.success() || Instant::now() > deadline {
                break o;
            }
            assert!(text(&o).1.contains("refused"), "{}", text(&o).1);
            std::thread::sleep(Duration::from_millis(100));
        };
        ok(&o);
        rx.wait(T);
        same(&out, &data, tool);
    }
}

#[test]
fn a_file_crosses_a_namespace_pair_intact_over_v4_and_v6() {
    if !require(is_root(), "network namespaces need root") {
        return;
    }
    let ns = Netns::pair();
    let dir = scratch("netns");
    let (file, data) = a_file(&dir, (6 << 20) + 1);
    let f = file.to_str().unwrap();
    for (host, listen, via) in [
        ("10.77.0.2", "10.77.0.2", "sendfile"),
        ("10.77.0.2", "10.77.0.2", "mmap"),
        ("[fd77::2]", "fd77::2", "mmap"),
    ] {
        let out = dir.join(format!("out-{listen}-{via}"));
        let (sink, port) = py_sink(&ns.exec(1), listen, &out, 1);
        let o = send(
            &ns.exec(0),
            &[&format!("{host}:{port}"), "--file", f, "--file-via", via],
        );
        ok(&o);
        sink.wait(T);
        same(&conn_file(&out, 0), &data, &format!("{host} {via}"));
    }
    // Generated data, three streams at once, each a whole stream of its share.
    let out = dir.join("par");
    let (sink, port) = py_sink(&ns.exec(1), "10.77.0.2", &out, 3);
    let o = send(
        &ns.exec(0),
        &[
            &format!("10.77.0.2:{port}"),
            "--bytes",
            "30M",
            "-P",
            "3",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&ok(&o).into_bytes()).unwrap();
    sink.wait(T);
    assert_eq!(v["end"]["sum_sent"]["bytes"], 30 << 20);
    assert_eq!(v["end"]["sum_received"]["bytes"], 30 << 20);
    for i in 0..3 {
        let n = std::fs::metadata(conn_file(&out, i)).unwrap().len();
        assert_eq!(n, 10 << 20, "stream {i}");
    }
}

/// iperf3's `Retr` and `Cwnd`: over a link that drops one TCP packet in 20 (nftables, in the
/// receiver's namespace; a packet is up to 64 KB of segments, GSO on the veth), the retransmits show per interval and in the totals, and add up; the
/// congestion window shows; UDP has neither.
#[test]
fn tcp_retransmits_and_the_window_show_like_iperf3s() {
    if !require(is_root(), "network namespaces need root")
        || !require(have("nft"), "nft is missing")
    {
        return;
    }
    let ns = Netns::pair();
    // Not the SYN: a lost one would only add a second of connect time.
    let rules = "table inet zerotx_loss {\n  chain in {\n    type filter hook input priority 0; \
                 policy accept;\n    tcp flags & syn == 0 numgen random mod 20 == 0 drop\n  }\n}\n";
    let mut nft = std::process::Command::new("ip");
    nft.args(["netns", "exec", &ns.0[1], "nft", "-f", "-"]);
    nft.stdin(std::process::Stdio::piped());
    let mut child = nft.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), rules.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft refused the loss rule");
    let dir = scratch("retr");
    let (sink, port) = py_sink(&ns.exec(1), "10.77.0.2", &dir.join("out"), 1);
    let o = send(
        &ns.exec(0),
        &[
            &format!("10.77.0.2:{port}"),
            "--bytes",
            "24M",
            "-i",
            "0.1",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&ok(&o).into_bytes()).unwrap();
    sink.wait(T);
    assert_eq!(v["end"]["sum_sent"]["bytes"], 24 << 20);
    let total = v["end"]["sum_sent"]["retransmits"].as_u64().unwrap();
    assert!(total > 0, "5% loss and no retransmit: {}", v["end"]);
    let sender = &v["end"]["streams"][0]["sender"];
    assert_eq!(sender["retransmits"].as_u64(), Some(total));
    assert!(sender["max_snd_cwnd"].as_u64().unwrap() > 0, "{sender}");
    assert!(sender["max_rtt"].as_u64().unwrap() >= sender["min_rtt"].as_u64().unwrap());
    let intervals = v["intervals"].as_array().unwrap();
    assert!(!intervals.is_empty());
    let (mut in_intervals, mut windows) = (0, 0);
    for i in intervals {
        let s = &i["streams"][0];
        // An interval before the stream's first sample (a thread slow to start) has none.
        let Some(cwnd) = s.get("snd_cwnd") else {
            continue;
        };
        assert!(cwnd.as_u64().unwrap() > 0, "{i}");
        windows += 1;
        assert_eq!(s["retransmits"], i["sum"]["retransmits"], "{i}");
        in_intervals += s["retransmits"].as_u64().unwrap();
    }
    assert!(windows > 0, "no interval has a window: {intervals:?}");
    // The intervals cover the run up to the last one's end; the totals, all of it.
    assert!(
        in_intervals <= total && in_intervals > 0,
        "{in_intervals} of {total}"
    );

    // The text: the columns in the header, a count on the sender's total line.
    let (sink, port) = py_sink(&ns.exec(1), "10.77.0.2", &dir.join("out2"), 1);
    let text = ok(&send(
        &ns.exec(0),
        &[&format!("10.77.0.2:{port}"), "--bytes", "24M"],
    ));
    sink.wait(T);
    assert!(
        text.contains("Bitrate         Retr         Cwnd  Zero-copy"),
        "{text}"
    );
    let sender_line = text.lines().find(|l| l.ends_with("sender")).unwrap();
    let retr: u64 = sender_line
        .split_whitespace()
        .rev()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(retr > 0, "{sender_line}");

    // UDP: no such columns.
    let ns_bh = Netns::black_hole();
    let o = send(
        &ns_bh.exec(0),
        &["--udp", "192.0.2.2:9", "--bytes", "4M", "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&ok(&o).into_bytes()).unwrap();
    assert!(
        v["end"]["sum_sent"].get("retransmits").is_none(),
        "{}",
        v["end"]
    );
    let text = ok(&send(
        &ns_bh.exec(0),
        &["--udp", "192.0.2.2:9", "--bytes", "4M"],
    ));
    assert!(!text.contains("Retr"), "{text}");
}

#[test]
fn zero_copy_engages_into_the_black_hole_and_the_json_says_so() {
    if !require(is_root(), "network namespaces need root") {
        return;
    }
    let ns = Netns::black_hole();
    let dir = scratch("bh");
    let (file, _) = a_file(&dir, 16 << 20);
    for extra in [
        vec!["--bytes", "32M"],
        vec!["--bytes", "32M", "--engine", "msg-zc"],
        vec!["--file", file.to_str().unwrap()],
    ] {
        let mut args = vec!["--udp", "192.0.2.2:9", "--size", "60000", "--json"];
        args.extend(&extra);
        let o = send(&ns.exec(0), &args);
        let v: serde_json::Value = serde_json::from_slice(&ok(&o).into_bytes()).unwrap();
        let z = &v["end"]["zerotx"];
        let sent = v["end"]["sum_sent"]["bytes"].as_u64().unwrap();
        assert!(sent >= 16 << 20, "{extra:?}: {sent}");
        assert_eq!(v["start"]["test_start"]["protocol"], "UDP");
        let zc = z["bytes_zerocopy"].as_u64().unwrap();
        assert!(
            zc * 10 >= sent * 9,
            "{extra:?}: only {zc} of {sent} zero-copy: {z}"
        );
        assert_eq!(
            z["bytes_zerocopy"].as_u64().unwrap() + z["bytes_copied"].as_u64().unwrap(),
            sent
        );
        assert!(z["cpu_seconds_per_gb"].as_f64().unwrap() > 0.0);
        assert_eq!(z["zerocopy_engaged"], true, "{z}");
        assert!(!v["intervals"].as_array().unwrap().is_empty() || sent > 0);
    }
}

#[test]
fn the_json_reads_like_iperf3s_with_zero_copy_fields() {
    let dir = scratch("json");
    let out = dir.join("out");
    let (sink, port) = py_sink(&[], "127.0.0.1", &out, 1);
    let o = send(
        &[],
        &[
            &format!("127.0.0.1:{port}"),
            "--bytes",
            "16M",
            "--json",
            "-i",
            "0.05",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&ok(&o).into_bytes()).unwrap();
    sink.wait(T);
    assert_eq!(v["start"]["test_start"]["protocol"], "TCP");
    assert_eq!(v["start"]["test_start"]["num_streams"], 1);
    assert_eq!(v["start"]["connecting_to"]["port"], port);
    assert_eq!(v["start"]["connected"][0]["remote_port"], port);
    assert_eq!(v["start"]["connected"][0]["remote_host"], "127.0.0.1");
    assert!(v["start"]["timestamp"]["time"]
        .as_str()
        .unwrap()
        .ends_with("GMT"));
    assert!(v["intervals"].is_array());
    let end = &v["end"];
    assert_eq!(end["sum_sent"]["bytes"], 16 << 20);
    assert_eq!(end["sum_received"]["bytes"], 16 << 20);
    assert_eq!(end["streams"][0]["sender"]["bytes"], 16 << 20);
    let z = &end["zerotx"];
    assert_eq!(z["engine"], "auto");
    // Loopback: auto copies from the first send, and says why.
    assert_eq!(z["zerocopy_engaged"], false);
    assert!(z["explain"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l.as_str().unwrap().contains("loopback")));
    assert_eq!(
        z["bytes_copied"].as_u64().unwrap() + z["bytes_zerocopy"].as_u64().unwrap(),
        16 << 20
    );
    assert!(
        end["cpu_utilization_percent"]["host_total"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(
        std::fs::metadata(conn_file(&out, 0)).unwrap().len(),
        16 << 20
    );
}

#[test]
fn a_file_with_a_time_goes_again_and_again() {
    let dir = scratch("loop");
    let (file, data) = a_file(&dir, 300_001);
    for via in ["sendfile", "mmap"] {
        let out = dir.join(format!("out-{via}"));
        let (sink, port) = py_sink(&[], "127.0.0.1", &out, 1);
        let o = send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--file",
                file.to_str().unwrap(),
                "--file-via",
                via,
                "--time",
                "0.3",
                "--bitrate",
                "400M",
            ],
        );
        ok(&o);
        sink.wait(T);
        let got = std::fs::read(conn_file(&out, 0)).unwrap();
        assert!(got.len() > data.len(), "{via}: {} bytes", got.len());
        for (i, chunk) in got.chunks(data.len()).enumerate() {
            assert!(chunk == &data[..chunk.len()], "{via}: copy {i} differs");
        }
        // The bitrate caps it: 400 Mbit/s for 0.3 s is 15 MB; allow twice that.
        assert!(got.len() < 30_000_000, "{via}: {} bytes", got.len());
    }
}

#[test]
fn bad_addresses_and_files_fail_with_a_message_at_once() {
    let dir = scratch("bad");
    let port = free_port().to_string();
    let local = format!("127.0.0.1:{port}");
    for (args, needle) in [
        (vec![local.as_str()], "nothing listens there"),
        (vec!["vsock:x:1"], "CID \"x\" is not a number"),
        (vec!["no-such-host.invalid:1"], "cannot resolve"),
        (
            vec![local.as_str(), "--file", "/nonexistent/f"],
            "cannot open --file /nonexistent/f",
        ),
        (
            vec![local.as_str(), "--file", "/tmp"],
            "is not a regular file",
        ),
        (
            vec![local.as_str(), "--engine", "fast"],
            "unknown engine \"fast\"",
        ),
        (
            vec![local.as_str(), "--udp", "--size", "70000"],
            "at most 65507",
        ),
        (
            vec![local.as_str(), "--bitrate", "lots"],
            "invalid --bitrate",
        ),
        (vec![local.as_str(), "-P", "0"], "invalid --parallel 0"),
        (
            vec![local.as_str(), "--file", "/etc/hostname", "-P", "2"],
            "a file goes as one stream",
        ),
        (
            vec![
                local.as_str(),
                "--udp",
                "--file",
                "/etc/hostname",
                "--file-via",
                "sendfile",
            ],
            "sendfile cannot cut datagrams",
        ),
    ] {
        let t0 = Instant::now();
        fails(&send(&[], &args), needle);
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            t0.elapsed()
        );
    }
    let _ = dir;
}

/// Python receivers that misbehave: one resets the connection after 1 MiB, one never reads.
const PY_RESET: &str = r#"
import socket, struct
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
c, _ = l.accept(); n = 0
while n < (1 << 20):
    d = c.recv(65536)
    if not d: break
    n += len(d)
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
"#;
const PY_STALL: &str = r#"
import socket, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
l.bind(("127.0.0.1", 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
c, _ = l.accept(); time.sleep(60)
"#;

#[test]
fn a_receiver_that_vanishes_or_stops_reading_ends_the_send_with_a_message() {
    for engine in ["auto", "copy", "msg-zc", "uring", "uring-zc"] {
        let mut rx = Proc::spawn(Command::new("python3").args(["-c", PY_RESET]));
        let port = rx.first_line(Duration::from_secs(10));
        let o = send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--bytes",
                "2G",
                "--engine",
                engine,
                "-i",
                "0",
            ],
        );
        let e = fails(&o, "the receiver closed the connection");
        assert!(e.contains("after "), "{engine}: {e}");
        rx.wait(T);
    }
    for engine in ["auto", "copy"] {
        let mut rx = Proc::spawn(Command::new("python3").args(["-c", PY_STALL]));
        let port = rx.first_line(Duration::from_secs(10));
        let t0 = Instant::now();
        let o = send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--bytes",
                "2G",
                "--engine",
                engine,
                "--linger",
                "1",
            ],
        );
        fails(&o, "the receiver stopped reading");
        // Not a timing claim: a hang would take until the 60 s guard.
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{engine}: {:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn udp_to_a_port_nobody_listens_on_fails_with_a_message() {
    let port = free_port();
    let o = send(
        &[],
        &[
            "--udp",
            &format!("127.0.0.1:{port}"),
            "--time",
            "3",
            "-i",
            "0",
        ],
    );
    fails(&o, "nothing listens on that port");
}

/// Ctrl-C (SIGINT) in the middle: every stream ends as at its deadline, the totals print, the
/// receiver still gets a whole stream up to that point, and the exit says it was interrupted.
#[test]
fn ctrl_c_ends_the_send_with_its_totals() {
    let dir = scratch("sigint");
    let out = dir.join("out");
    let (sink, port) = py_sink(&[], "127.0.0.1", &out, 2);
    let tx = Proc::spawn(Command::new(zerotx_bin()).args([
        "send",
        &format!("127.0.0.1:{port}"),
        "--time",
        "60",
        "-P",
        "2",
        "-b",
        "200M",
    ]));
    std::thread::sleep(Duration::from_millis(1500));
    let pid = tx.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    let o = tx.wait(Duration::from_secs(30));
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "took {:?} to stop",
        t0.elapsed()
    );
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        stdout.contains("[SUM]") && stdout.contains("sender"),
        "{stdout}"
    );
    sink.wait(T);
    for i in 0..2 {
        let n = std::fs::metadata(conn_file(&out, i)).unwrap().len();
        assert!(n > 0, "stream {i} got nothing");
    }
}

/// An address that never answers (the black hole drops the SYN) fails at --connect-timeout; a
/// network with no route fails at once; both say what to check.
#[test]
fn unreachable_addresses_fail_with_a_message_in_time() {
    if !require(is_root(), "network namespaces need root") {
        return;
    }
    let ns = Netns::black_hole();
    let t0 = Instant::now();
    let o = send(&ns.exec(0), &["192.0.2.2:9", "--connect-timeout", "1"]);
    fails(&o, "no answer");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let o = send(&ns.exec(0), &["198.51.100.1:9"]);
    let e = fails(&o, "cannot connect to 198.51.100.1:9");
    assert!(e.contains("unreachable") && e.contains("no route"), "{e}");
}

/// The issue's promise: `--help` says that a file changing while it is sent is the caller's
/// problem, and names the defaults a user needs.
#[test]
fn help_warns_about_files_that_change_and_names_the_defaults() {
    let o = run(Command::new(zerotx_bin()).args(["send", "--help"]), T);
    let out = ok(&o);
    assert!(
        out.contains("changes while it is being sent is the caller's problem"),
        "{out}"
    );
    for d in ["[default: auto]", "1M for TCP", "port 5201"] {
        assert!(out.contains(d), "{d} missing:\n{out}");
    }
}
