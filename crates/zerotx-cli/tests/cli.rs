//! The `zerotx` binary end to end.

use assert_cmd::Command;
use predicates::prelude::*;

fn zerotx() -> Command {
    Command::cargo_bin("zerotx").unwrap()
}

#[test]
fn probe_json_reports_every_socket_kind_and_measured_loopback() {
    let out = zerotx().args(["probe", "--json"]).assert().success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let kinds: Vec<&str> = v["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    for k in ["tcp4", "tcp6", "udp4", "udp6", "unix", "vsock"] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    let unix = v["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "unix")
        .unwrap();
    assert_eq!(unix["zerocopy"], false, "AF_UNIX has no MSG_ZEROCOPY");
    assert!(v["kernel"]
        .as_str()
        .unwrap()
        .chars()
        .next()
        .unwrap()
        .is_ascii_digit());
    assert!(v["io_uring"]["available"].is_boolean());
    assert!(v["optmem_max"].is_u64());
    // Measured, not assumed: on any kernel with TCP zero-copy, loopback reports COPIED.
    if v["sockets"][0]["zerocopy"] == true {
        assert_eq!(v["loopback"]["msg_zerocopy_copied"], true);
        let advice = v["advice"].as_array().unwrap();
        assert!(advice
            .iter()
            .any(|a| a.as_str().unwrap().contains("Loopback copies")));
    }
}

#[test]
fn probe_table_is_for_people() {
    zerotx()
        .arg("probe")
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "MSG_ZEROCOPY (SO_ZEROCOPY) per socket kind",
        ))
        .stdout(predicate::str::contains("net.core.optmem_max"))
        .stdout(predicate::str::contains("advice"));
}

#[test]
fn unknown_command_is_a_usage_error() {
    zerotx()
        .arg("frobnicate")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unrecognized subcommand"));
}
