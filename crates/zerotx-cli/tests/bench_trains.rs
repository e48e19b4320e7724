//! `zerotx bench` over the black hole with carrier (offload on and off) with the raw UDP GSO
//! train loops beside the per-datagram engines: the topology builds itself, prints its rows, and
//! trains go as trains, zero-copy and NOT copied.

mod common;

use assert_cmd::Command;
use common::{have, is_root, require};

#[test]
fn carrier_topologies_print_per_datagram_and_train_rows() {
    if !require(
        is_root(),
        "the black hole with carrier needs root (network namespaces)",
    ) || !require(
        have("nft"),
        "the carrier's ingress drop needs nft (apt-get install nftables)",
    ) || !require(
        have("ethtool"),
        "udp-carrier-sw needs ethtool (apt-get install ethtool)",
    ) {
        return;
    }
    let json = std::env::temp_dir().join(format!("zerotx-trains-{}.json", std::process::id()));
    let out = Command::new(common::zerotx_bin())
        .args([
            "bench",
            "--topology",
            "udp-carrier,udp-carrier-sw",
            "--engines",
            "copy,msg-zc",
            "--trains",
            "--duration",
            "0.05",
            "--repeat",
            "1",
            "--export-json",
            json.to_str().unwrap(),
        ])
        .assert()
        .success();
    let table = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();

    for topology in ["udp-carrier", "udp-carrier-sw"] {
        assert!(table.contains(&format!("\n{topology}: UDP")), "{table}");
        assert!(table.contains("raw-train-msg-zc/copy"), "{table}");
        let t = report["topologies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == topology)
            .unwrap_or_else(|| panic!("{topology} missing"));
        assert!(t["skipped"].is_null(), "{topology}: {}", t["skipped"]);
        assert_eq!(t["sizes"], serde_json::json!([1200, 1472]), "{topology}");
        let cells = t["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 2 * 4, "{topology}: two sizes, four engines");
        for c in cells {
            let (engine, size) = (c["engine"].as_str().unwrap(), c["size"].as_u64().unwrap());
            assert!(c["error"].is_null(), "{topology} {engine}: {}", c["error"]);
            let run = &c["runs"][0];
            let (bytes, sends) = (
                run["bytes"].as_u64().unwrap(),
                run["sends"].as_u64().unwrap(),
            );
            assert!(sends > 0, "{topology} {engine} {size}: nothing sent");
            // A train is one call of 44 datagrams (as many as fit 64 KiB at both sizes).
            let per_send = if engine.starts_with("raw-train") {
                44 * size
            } else {
                size
            };
            assert_eq!(bytes, sends * per_send, "{topology} {engine} {size}");
            // The peer drops at ingress, before any protocol handler: nothing is delivered to a
            // local socket, so nothing is copied, segmented in software or not.
            assert_eq!(run["kernel_copied"], 0, "{topology} {engine} {size}");
            if engine.contains("msg-zc") {
                assert_eq!(
                    run["zerocopy"].as_u64().unwrap(),
                    sends,
                    "{topology} {engine} {size}: every send released zero-copy"
                );
            }
        }
    }
}
