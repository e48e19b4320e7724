//! One grammar for sizes, rates and times across `bench`, `send` and `recv` (issue 39): the same
//! suffixes everywhere, and negative or zero values refused with a message that says what to
//! give, never clap's tip about `--`.

use assert_cmd::Command;

fn refused(args: &[&str], needle: &str) {
    let out = Command::cargo_bin("zerotx")
        .unwrap()
        .args(args)
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.starts_with("Error: "), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: wanted {needle:?} in:\n{err}"
    );
    assert!(!err.contains("tip:"), "{args:?}: clap's tip:\n{err}");
}

/// Checks happen before any connection: the address is never reached.
const TO: &str = "127.0.0.1:1";

#[test]
fn sizes_take_the_same_suffixes_everywhere() {
    // --size 10G parses as --bytes 10G does, then meets the bound of a send.
    refused(
        &["send", TO, "--size", "10G"],
        "invalid --size \"10G\": a send carries at most 64M",
    );
    refused(
        &["bench", "--sizes", "10G"],
        "invalid --sizes \"10G\": a send carries at most 64M",
    );
    refused(
        &["send", TO, "--size", "12Q"],
        "give a number of bytes with an optional K, M, G or T",
    );
    refused(
        &["bench", "--sizes", "12Q"],
        "give a number of bytes with an optional K, M, G or T",
    );
    refused(
        &["send", TO, "--bytes", "12Q"],
        "give a number of bytes with an optional K, M, G or T",
    );
}

#[test]
fn negative_and_zero_values_get_a_message_that_helps() {
    let cases: [(&[&str], &str); 12] = [
        (
            &["send", TO, "--time", "-1"],
            "invalid --time -1: a time cannot be negative",
        ),
        (
            &["send", TO, "--time", "0"],
            "invalid --time 0: give seconds above 0",
        ),
        (
            &["send", TO, "--bytes", "-5M"],
            "invalid --bytes \"-5M\": a byte count cannot be negative",
        ),
        (
            &["send", TO, "--bytes", "0"],
            "invalid --bytes \"0\": that is nothing",
        ),
        (
            &["send", TO, "--size", "-1"],
            "invalid --size \"-1\": a byte count cannot be negative",
        ),
        (
            &["send", TO, "-b", "-1M"],
            "invalid --bitrate \"-1M\": a rate cannot be negative",
        ),
        (
            &["send", TO, "-b", "0"],
            "invalid --bitrate \"0\": that is nothing",
        ),
        (
            &["send", TO, "-i", "-1"],
            "invalid --interval -1: a time cannot be negative",
        ),
        (
            &["bench", "--duration", "-1"],
            "invalid --duration -1: a time cannot be negative",
        ),
        (
            &["bench", "--sizes", "0"],
            "invalid --sizes \"0\": that is nothing",
        ),
        (
            &["recv", "--idle", "-2"],
            "invalid --idle -2: a time cannot be negative",
        ),
        (
            &["recv", "--interval", "-1"],
            "invalid --interval -1: a time cannot be negative",
        ),
    ];
    for (args, needle) in cases {
        refused(args, needle);
    }
}
