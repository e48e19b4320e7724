//! The smaller edges of issue 39: `probe --json --explain`, `recv --listen` naming recv's own
//! address forms, `bench --help` listing `auto`, and no "zero-copy engaged" when the kernel
//! copied every send.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bound, free_port, run, zerotx_bin, Proc};

const T: Duration = Duration::from_secs(30);

fn zerotx(args: &[&str]) -> Command {
    let mut c = Command::new(zerotx_bin());
    c.args(args);
    c
}

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn probe_json_explain_is_one_document_with_the_explanations() {
    let out = run(&mut zerotx(&["probe", "--json", "--explain"]), T);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    let v: serde_json::Value = serde_json::from_str(&o).expect("one JSON document");
    let cases = v["explain"]
        .as_array()
        .unwrap_or_else(|| panic!("no explain array: {o}"));
    assert_eq!(cases.len(), 2, "{o}");
    let tcp = &cases[0];
    assert!(tcp["case"].as_str().unwrap().contains("loopback"), "{tcp}");
    // Measured: either the engine's words or why it could not be measured.
    assert!(
        tcp["engine"].is_string() || tcp["error"].is_string(),
        "{tcp}"
    );
    assert!(
        v["sockets"].is_array(),
        "the probe itself is still there: {o}"
    );
}

#[test]
fn recv_listen_nonsense_lists_recvs_forms() {
    let out = run(&mut zerotx(&["recv", "--listen", "nonsense.invalid"]), T);
    let (_, e) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains("PORT, HOST:PORT"), "{e}");
    assert!(e.contains("vsock:PORT"), "{e}");
    assert!(
        !e.contains("vsock:CID:PORT\n") || e.contains("vsock:PORT"),
        "{e}"
    );
}

#[test]
fn bench_help_lists_auto_among_the_engines() {
    let out = run(&mut zerotx(&["bench", "--help"]), T);
    let (o, _) = text(&out);
    let engines = o
        .lines()
        .find(|l| l.contains("--engines <ENGINES>"))
        .unwrap_or_else(|| panic!("no --engines in help:\n{o}"));
    assert!(engines.contains(": auto, copy"), "{engines}");
}

#[test]
fn zero_copy_is_not_called_engaged_when_the_kernel_copied_everything() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let r = Proc::spawn(&mut zerotx(&["recv", "-1", "-i", "0", "--listen", &listen]));
    while !bound(r.0.id(), port, false) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Loopback: the kernel copies every zero-copy send it delivers locally.
    let out = run(
        &mut zerotx(&[
            "send", &listen, "--engine", "msg-zc", "--bytes", "8M", "-i", "0",
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.contains("0 Bytes sent zero-copy"), "{o}");
    assert!(!o.contains("zero-copy engaged"), "{o}");
    assert!(o.contains("the kernel copied every send"), "{o}");
    r.wait(T);
}

#[test]
fn sendfile_is_marked_as_such_not_counted_as_zero_copy() {
    let dir = common::scratch("sendfile-mark");
    let file = dir.join("f.bin");
    std::fs::write(&file, common::noise(4 << 20, 7)).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let r = Proc::spawn(&mut zerotx(&["recv", "-1", "-i", "0", "--listen", &listen]));
    while !bound(r.0.id(), port, false) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = run(
        &mut zerotx(&[
            "send",
            &listen,
            "--file",
            file.to_str().unwrap(),
            "--file-via",
            "sendfile",
            "-i",
            "0",
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}\n{e}");
    let sender = o
        .lines()
        .find(|l| l.ends_with("sender"))
        .unwrap_or_else(|| panic!("no sender line:\n{o}"));
    assert!(sender.contains("sendfile"), "{sender}");
    assert!(
        !sender.contains('%'),
        "sendfile counted as a zero-copy share: {sender}"
    );
    r.wait(T);
}

/// `--plot` to a directory that does not exist fails at once, before measuring: no table, no
/// progress, and the message names the flag and the path.
#[test]
fn an_unwritable_plot_path_fails_before_measuring() {
    let out = run(
        &mut zerotx(&[
            "bench",
            "--topology",
            "tcp-loopback",
            "--engines",
            "copy",
            "--sizes",
            "4K",
            "--duration",
            "0.05",
            "--repeat",
            "1",
            "--plot",
            "/nonexistent-zerotx-dir/plot.svg",
        ]),
        T,
    );
    let (o, e) = text(&out);
    assert!(!out.status.success(), "{o}\n{e}");
    assert!(o.is_empty(), "nothing measured, nothing printed: {o}");
    assert!(
        e.contains("--plot /nonexistent-zerotx-dir/plot.svg"),
        "the message names the flag and the path: {e}"
    );
}
