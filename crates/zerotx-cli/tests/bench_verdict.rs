//! `zerotx bench` as a user reads it (issue 39): a verdict per topology in plain words, every
//! table with its spread, an `auto/copy` column, the plot and export options named once, and no
//! progress lines off a terminal unless asked.

use assert_cmd::Command;

fn zerotx() -> Command {
    Command::cargo_bin("zerotx").unwrap()
}

/// One tiny run on TCP loopback: one size, two short repetitions.
fn tiny(extra: &[&str]) -> (String, String) {
    let out = zerotx()
        .args([
            "bench",
            "--quick",
            "--topology",
            "tcp-loopback",
            "--sizes",
            "64K",
            "--duration",
            "0.05",
            "--repeat",
            "2",
        ])
        .args(extra)
        .assert()
        .success();
    let o = out.get_output();
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bench_ends_with_a_verdict_and_shows_spreads() {
    let (out, err) = tiny(&[]);
    let verdict = out
        .split_once("\nverdict")
        .unwrap_or_else(|| panic!("no verdict section:\n{out}"))
        .1;
    assert!(verdict.contains("tcp-loopback: use "), "{verdict}");
    assert!(verdict.contains("zero-copy"), "{verdict}");
    assert!(verdict.contains("the kernel copied"), "{verdict}");
    // Spreads: every figure of two runs is `median [min-max]`.
    assert!(
        out.contains("throughput, MB/s (median [min-max]"),
        "no spread in the throughput table:\n{out}"
    );
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("64K") && l.contains('['))
        .unwrap_or_else(|| panic!("no row with a range:\n{out}"));
    assert!(row.contains('-') && row.contains(']'), "{row}");
    assert!(out.contains("auto/copy"), "no auto/copy column:\n{out}");
    // No issue numbers or internal words.
    assert!(!out.contains("issue"), "{out}");
    assert!(!out.contains("releases"), "{out}");
    // The other outputs, named once at the end.
    assert_eq!(out.matches("--plot").count(), 1, "{out}");
    assert!(
        out.trim_end()
            .lines()
            .last()
            .unwrap()
            .contains("--export-json"),
        "{out}"
    );
    // Off a terminal: no progress lines unless asked.
    assert!(err.is_empty(), "progress off a terminal:\n{err}");
}

#[test]
fn progress_off_a_terminal_only_when_asked() {
    let (_, err) = tiny(&["--progress"]);
    assert!(err.contains("tcp-loopback"), "{err}");
}

#[test]
fn machine_formats_have_no_verdict_or_hints() {
    let (out, _) = tiny(&["--markdown"]);
    assert!(!out.contains("--plot"), "{out}");
}
