//! `zerotx send` into `zerotx recv`, end to end: the generated stream verified byte for byte over
//! TCP (v4, v6, parallel streams) and UDP, files written intact, on loopback and across a network
//! namespace pair the test makes. Each side's JSON must agree with the other's.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// Starts `zerotx recv ARGS --once --json` (through `prefix`), waits until it listens on `port`.
fn recv(prefix: &[&str], port: u16, udp: bool, args: &[&str]) -> Proc {
    let bin = zerotx_bin().display().to_string();
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.extend([bin, "recv".into(), "--once".into(), "--json".into()]);
    argv.extend(args.iter().map(|s| s.to_string()));
    let mut p = Proc::spawn(Command::new(&argv[0]).args(&argv[1..]));
    wait_bound(&mut p, port, udp);
    p
}

/// Until `p` listens (or is bound) on `port` in its namespace.
fn wait_bound(p: &mut Proc, port: u16, udp: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !bound(p.0.id(), port, udp) {
        if let Ok(Some(status)) = p.0.try_wait() {
            panic!("zerotx recv exited early ({status}) before binding port {port}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing bound to port {port} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn send(prefix: &[&str], args: &[&str]) -> Value {
    let bin = zerotx_bin().display().to_string();
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.extend([bin, "send".into(), "--json".into()]);
    argv.extend(args.iter().map(|s| s.to_string()));
    let o = run(Command::new(&argv[0]).args(&argv[1..]), T);
    assert!(
        o.status.success(),
        "zerotx send {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("send's JSON")
}

fn done(rx: Proc) -> Value {
    let o = rx.wait(T);
    assert!(
        o.status.success(),
        "zerotx recv failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    serde_json::from_slice(&o.stdout).expect("recv's JSON")
}

fn bytes(v: &Value, side: &str) -> u64 {
    v["end"][side]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no end.{side}.bytes in {v}"))
}

#[test]
fn the_generated_stream_verifies_over_tcp_v4_v6_and_parallel_streams() {
    for (host, listen, extra) in [
        ("127.0.0.1", "127.0.0.1", vec![]),
        ("[::1]", "[::1]", vec![]),
        ("127.0.0.1", "", vec!["-P", "3"]),
        (
            "127.0.0.1",
            "127.0.0.1",
            vec!["--engine", "msg-zc", "--size", "64K"],
        ),
        ("127.0.0.1", "127.0.0.1", vec!["--engine", "copy"]),
    ] {
        let port = free_port();
        let l = if listen.is_empty() {
            port.to_string()
        } else {
            format!("{listen}:{port}")
        };
        let rx = recv(&[], port, false, &["-l", &l, "--verify"]);
        let mut args = vec![format!("{host}:{port}"), "--bytes".into(), "48M".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = send(&[], &args);
        let r = done(rx);
        assert_eq!(bytes(&s, "sum_sent"), 48 << 20, "{extra:?}");
        assert_eq!(bytes(&s, "sum_received"), 48 << 20, "{extra:?}");
        assert_eq!(bytes(&r, "sum_received"), 48 << 20, "{extra:?}");
        assert_eq!(r["end"]["zerotx"]["verified"], true, "{extra:?}");
        let streams = r["end"]["streams"].as_array().unwrap().len();
        assert_eq!(streams, if extra.contains(&"-P") { 3 } else { 1 });
    }
}

#[test]
fn udp_datagrams_verify_and_every_one_is_accounted_for() {
    let port = free_port();
    let rx = recv(
        &[],
        port,
        true,
        &[
            "-l",
            &format!("127.0.0.1:{port}"),
            "--udp",
            "--verify",
            "--idle",
            "1",
        ],
    );
    // Paced, so the receiver keeps up: loss is allowed by UDP, but it would blur the check.
    let s = send(
        &[],
        &[
            &format!("127.0.0.1:{port}"),
            "--udp",
            "--bytes",
            "8M",
            "--size",
            "1400",
            "-b",
            "300M",
        ],
    );
    let r = done(rx);
    let z = &r["end"]["zerotx"];
    let sent = bytes(&s, "sum_sent");
    assert_eq!(sent, 8 << 20);
    assert_eq!(z["verified"], true, "{z}");
    assert_eq!(z["corrupt"], 0, "{z}");
    let (got, lost) = (
        z["packets"].as_u64().unwrap(),
        z["lost_packets"].as_u64().unwrap(),
    );
    let datagrams = sent.div_ceil(1400);
    assert!(
        got + lost >= datagrams - 1 && got <= datagrams,
        "{got} + {lost} of {datagrams}"
    );
    let rb = bytes(&r, "sum_received");
    assert!(
        rb <= sent && rb + 1400 >= got * 1400,
        "{rb} bytes in {got} datagrams"
    );
}

#[test]
fn files_arrive_intact_by_either_path() {
    let dir = scratch("xfer");
    let data = noise((5 << 20) + 333, 7);
    let f = dir.join("f");
    std::fs::write(&f, &data).unwrap();
    for via in ["sendfile", "mmap"] {
        let port = free_port();
        let out = dir.join(format!("out-{via}"));
        let rx = recv(
            &[],
            port,
            false,
            &[
                "-l",
                &format!("127.0.0.1:{port}"),
                "-o",
                out.to_str().unwrap(),
            ],
        );
        let s = send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--file",
                f.to_str().unwrap(),
                "--file-via",
                via,
            ],
        );
        done(rx);
        assert_eq!(s["start"]["zerotx"]["file_via"], via);
        assert!(
            std::fs::read(&out).unwrap() == data,
            "{via}: the file differs"
        );
    }
}

#[test]
fn across_a_namespace_pair_tcp_and_udp_verify() {
    if !require(is_root(), "network namespaces need root") {
        return;
    }
    let ns = Netns::pair();
    let port = 5201;
    let rx = recv(&ns.exec(1), port, false, &["-l", "5201", "--verify"]);
    let s = send(&ns.exec(0), &["10.77.0.2", "--bytes", "64M", "-P", "2"]);
    let r = done(rx);
    assert_eq!(bytes(&r, "sum_received"), 64 << 20);
    assert_eq!(bytes(&s, "sum_received"), 64 << 20);
    assert_eq!(r["end"]["zerotx"]["verified"], true);
    let rx = recv(
        &ns.exec(1),
        port,
        true,
        &["-l", "5201", "--udp", "--verify", "--idle", "1"],
    );
    let s = send(
        &ns.exec(0),
        &[
            "[fd77::2]:5201",
            "--udp",
            "--bytes",
            "4M",
            "--size",
            "8K",
            "-b",
            "200M",
        ],
    );
    let r = done(rx);
    assert_eq!(r["end"]["zerotx"]["corrupt"], 0);
    assert_eq!(r["end"]["zerotx"]["verified"], true);
    assert!(bytes(&r, "sum_received") > 0 && bytes(&s, "sum_sent") == 4 << 20);
}

/// The receiver's counts from its JSON: (datagrams, lost, out of order, corrupt).
fn counts(r: &Value) -> (u64, u64, u64, u64) {
    let z = &r["end"]["zerotx"];
    let n = |k: &str| z[k].as_u64().unwrap_or_else(|| panic!("no {k} in {z}"));
    (
        n("packets"),
        n("lost_packets"),
        n("out_of_order"),
        n("corrupt"),
    )
}

/// `zerotx recv --udp --verify` on loopback at `port`, ending 1 s after the last datagram.
fn udp_recv(port: u16) -> Proc {
    recv(
        &[],
        port,
        true,
        &[
            "-l",
            &format!("127.0.0.1:{port}"),
            "--udp",
            "--verify",
            "--idle",
            "1",
        ],
    )
}

#[test]
fn udp_trains_arrive_datagram_by_datagram_with_exact_counts_with_and_without_trains() {
    // 8 MiB of 1400 B datagrams: 5992, the last one shorter. Paced, so the receiver keeps up
    // with a train's burst (its queue is 8 MiB where root may set it): loss would blur counts
    // that must be exact. Loopback delivers locally, so the kernel copies: correctness only.
    let datagrams = (8u64 << 20).div_ceil(1400);
    for (engine, train) in [
        ("copy", "44"),
        ("msg-zc", "44"),
        ("copy", "1"),
        ("copy", "7"),
    ] {
        let port = free_port();
        let rx = udp_recv(port);
        let s = send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--udp",
                "--bytes",
                "8M",
                "--size",
                "1400",
                "-b",
                "300M",
                "--engine",
                engine,
                "--train",
                train,
            ],
        );
        let r = done(rx);
        let what = format!("{engine} --train {train}");
        assert_eq!(bytes(&s, "sum_sent"), 8 << 20, "{what}");
        assert_eq!(r["end"]["zerotx"]["verified"], true, "{what}");
        assert_eq!(counts(&r), (datagrams, 0, 0, 0), "{what}: {}", r["end"]);
        assert_eq!(bytes(&r, "sum_received"), 8 << 20, "{what}");
        let trains = &s["end"]["zerotx"]["trains"];
        match train.parse::<u64>().unwrap() {
            1 => assert!(trains.is_null(), "{what}: {trains}"),
            n => {
                assert_eq!(trains["datagrams_per_train"], n, "{what}");
                assert_eq!(trains["sent"], datagrams.div_ceil(n), "{what}");
                assert!(trains["off"].is_null(), "{what}: {trains}");
            }
        }
        // The pacing holds with trains: a train is its datagrams' share of the rate. (One-sided:
        // a slow host only sends slower.)
        let bps = s["end"]["sum_sent"]["bits_per_second"].as_f64().unwrap();
        assert!(bps <= 300e6 * 1.05, "{what}: {bps} bit/s over -b 300M");
    }
}

#[test]
fn the_receivers_sequence_check_catches_datagrams_sent_twice() {
    // The same 10 datagrams (two trains of 5) twice from one source port within --idle: the
    // second ten are behind the first, out of order, and none is lost.
    let port = free_port();
    let src = free_port();
    let rx = udp_recv(port);
    for _ in 0..2 {
        send(
            &[],
            &[
                &format!("127.0.0.1:{port}"),
                "--udp",
                "--bytes",
                "14000",
                "--size",
                "1400",
                "--train",
                "5",
                "--engine",
                "copy",
                "-B",
                &format!("127.0.0.1:{src}"),
                "-b",
                "100M",
            ],
        );
    }
    let r = done(rx);
    assert_eq!(counts(&r), (20, 0, 10, 0), "{}", r["end"]);
}

/// `zerotx send ARGS --json` inside the namespace `prefix` runs in; its JSON and its standard
/// error.
fn send_in(prefix: &[&str], args: &[&str]) -> (Value, String) {
    let bin = zerotx_bin().display().to_string();
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    argv.extend([bin, "send".into(), "--json".into()]);
    argv.extend(args.iter().map(|s| s.to_string()));
    let o = run(Command::new(&argv[0]).args(&argv[1..]), T);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "zerotx send {args:?} failed: {err}");
    (serde_json::from_slice(&o.stdout).expect("send's JSON"), err)
}

#[test]
fn the_receivers_sequence_check_counts_every_datagram_lost_on_the_way() {
    if !require(is_root(), "network namespaces need root")
        || !require(have("nft"), "the drop needs nft (apt-get install nftables)")
    {
        return;
    }
    // The receiver's namespace drops one UDP packet in 7 at its input hook (the 4th, 11th...):
    // 70 datagrams one per call lose exactly 10, none of them the last.
    let ns = Netns::pair();
    let nft = |rule: &str| {
        let mut argv = ns.exec(1);
        argv.extend(["nft", rule]);
        let o = run(Command::new(argv[0]).args(&argv[1..]), T);
        assert!(o.status.success(), "nft {rule}: {o:?}");
    };
    nft("add table ip t");
    nft("add chain ip t in { type filter hook input priority 0; }");
    nft("add rule ip t in udp dport 5201 numgen inc mod 7 == 3 drop");
    for train in ["1", "7"] {
        let rx = recv(
            &ns.exec(1),
            5201,
            true,
            &["-l", "5201", "--udp", "--verify", "--idle", "1"],
        );
        send_in(
            &ns.exec(0),
            &[
                "10.77.0.2",
                "--udp",
                "--bytes",
                "98000",
                "--size",
                "1400",
                "--train",
                train,
                "--engine",
                "copy",
                "-b",
                "50M",
            ],
        );
        let r = done(rx);
        let (got, lost, late, corrupt) = counts(&r);
        assert_eq!((late, corrupt), (0, 0), "--train {train}: {}", r["end"]);
        if train == "1" {
            assert_eq!((got, lost), (60, 10), "{}", r["end"]);
        } else {
            // Whether the hook sees a train whole or its datagrams, every datagram is either
            // received or counted lost.
            assert_eq!(got + lost, 70, "--train 7: {}", r["end"]);
            assert!(lost > 0, "--train 7: {}", r["end"]);
        }
    }
}

#[test]
fn a_path_that_refuses_trains_gets_one_datagram_per_call_and_loses_none() {
    if !require(is_root(), "network namespaces need root") {
        return;
    }
    // The pair's veth has MTU 1500: a 2000 B segment is above it, and the kernel would refuse
    // the train (EMSGSIZE) before sending any of it. The sender sees it from the path MTU before
    // the first train (an io_uring engine would hear of a refused train only in its release,
    // after later trains went), and the datagrams go one per call (the kernel fragments each):
    // every one arrives once, on the sendmsg engines and on io_uring alike.
    let ns = Netns::pair();
    for (i, engine) in ["copy", "uring", "auto"].into_iter().enumerate() {
        let port = (5201 + i).to_string();
        let rx = recv(
            &ns.exec(1),
            5201 + i as u16,
            true,
            &["-l", &port, "--udp", "--verify", "--idle", "1"],
        );
        let (s, err) = send_in(
            &ns.exec(0),
            &[
                &format!("10.77.0.2:{port}"),
                "--udp",
                "--bytes",
                "400000",
                "--size",
                "2000",
                "--engine",
                engine,
                "-b",
                "100M",
            ],
        );
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("trains off")).collect();
        assert_eq!(lines.len(), 1, "{engine}: one line says why: {err}");
        assert!(
            lines[0].contains("the path refuses them"),
            "{engine}: {err}"
        );
        let trains = &s["end"]["zerotx"]["trains"];
        assert_eq!(trains["sent"], 0, "{engine}: {trains}");
        assert!(
            trains["off"].as_str().unwrap().contains("MTU"),
            "{engine}: {trains}"
        );
        let r = done(rx);
        assert_eq!(counts(&r), (200, 0, 0, 0), "{engine}: {}", r["end"]);
    }
}
