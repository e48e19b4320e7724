//! `zerotx bench` over the black hole with carrier (offload on and off) with zerotx's train
//! columns and the raw UDP GSO train loops beside the per-datagram engines: the topology builds
//! itself, prints its rows, trains go as trains, zero-copy and NOT copied, each zerotx train
//! column is paired with its raw loop, and an engine that refuses trains is an n/a cell naming
//! the refusal, never a zero.

mod common;

use assert_cmd::Command;
use common::{have, is_root, require};

/// The columns: the two per-datagram engines asked for, then every train column `--trains` adds.
const ENGINES: [&str; 10] = [
    "copy",
    "msg-zc",
    "train-auto",
    "train-copy",
    "train-msg-zc",
    "train-uring",
    "train-uring-zc",
    "train-uring-zc-fixed",
    "raw-train-copy",
    "raw-train-msg-zc",
];

/// The columns that may refuse trains (the io_uring engines, until they send them).
const REFUSING: [&str; 4] = [
    "train-auto",
    "train-uring",
    "train-uring-zc",
    "train-uring-zc-fixed",
];

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
        for ratio in [
            "raw-train-msg-zc/copy",
            "train-copy/copy",
            "train-msg-zc/copy",
            "train-copy/raw-train-copy",
            "train-msg-zc/raw-train-msg-zc",
            "train-uring-zc-fixed/raw-train-msg-zc",
            "train-auto/raw-train-msg-zc",
        ] {
            assert!(table.contains(ratio), "no {ratio}: {table}");
        }
        let t = report["topologies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == topology)
            .unwrap_or_else(|| panic!("{topology} missing"));
        assert!(t["skipped"].is_null(), "{topology}: {}", t["skipped"]);
        assert_eq!(t["sizes"], serde_json::json!([1200, 1472]), "{topology}");
        let engines: Vec<&str> = t["engines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert_eq!(engines, ENGINES, "{topology}");
        let cells = t["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 2 * ENGINES.len(), "{topology}: two sizes");
        for c in cells {
            let (engine, size) = (c["engine"].as_str().unwrap(), c["size"].as_u64().unwrap());
            if let Some(e) = c["error"].as_str() {
                // Until the io_uring engines send trains, they (and auto, which runs on
                // io_uring here) refuse them: the cell has no figures, and says why.
                assert!(
                    REFUSING.contains(&engine) && e.contains("refuses trains"),
                    "{topology} {engine}: {e}"
                );
                assert!(
                    c["runs"].as_array().unwrap().is_empty(),
                    "{topology} {engine}"
                );
                assert_eq!(
                    throughput(&table, topology, engine, size),
                    "n/a",
                    "{topology} {engine} {size}: {table}"
                );
                assert!(
                    table.contains(&format!(
                        "error: {engine} {size}: the engine refuses trains"
                    )),
                    "{table}"
                );
                continue;
            }
            let run = &c["runs"][0];
            let (bytes, sends) = (
                run["bytes"].as_u64().unwrap(),
                run["sends"].as_u64().unwrap(),
            );
            assert!(sends > 0, "{topology} {engine} {size}: nothing sent");
            // A train is one call of 44 datagrams (as many as fit 64 KiB at both sizes).
            let per_send = if engine.contains("train") {
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

/// The figure the table's throughput block gives `engine` at `size` in `topology`.
fn throughput(table: &str, topology: &str, engine: &str, size: u64) -> String {
    let section = table
        .split(&format!("\n{topology}: "))
        .nth(1)
        .unwrap_or_else(|| panic!("no {topology} in {table}"));
    let mut lines = section
        .lines()
        .skip_while(|l| !l.contains("throughput, MB/s"));
    lines.next();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    let col = header
        .iter()
        .position(|h| *h == engine)
        .unwrap_or_else(|| panic!("no {engine} column in {header:?}"));
    let row: Vec<&str> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|r| r.first() == Some(&size.to_string().as_str()))
        .unwrap_or_else(|| panic!("no {size} row"));
    row[col].to_string()
}
