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
    // The kernel's own word, read from sysfs (the 2 MiB size's, unless it inherits).
    let mode = |p: &str| {
        let t = std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{p}")).ok()?;
        t.split(['[', ']']).nth(1).map(String::from)
    };
    let want = match mode("hugepages-2048kB/enabled") {
        Some(m) if m != "inherit" => Some(m),
        _ => mode("enabled"),
    };
    assert_eq!(v["huge_pages"].as_str(), want.as_deref());
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

use zerotx_testbed::{is_root, require, skip, strict};

fn cells<'a>(v: &'a serde_json::Value, topology: &str) -> Option<&'a Vec<serde_json::Value>> {
    let t = v["topologies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == topology)
        .unwrap_or_else(|| panic!("{topology} missing"));
    if let Some(why) = t["skipped"].as_str() {
        skip(&format!("{topology} was skipped: {why}"));
        return None;
    }
    t["cells"].as_array()
}

/// Under `ZEROTX_STRICT=1` a bench test needs root (the black hole is a network namespace);
/// without root it checks what runs (the black hole's topology says it was skipped).
fn bench_needs_root() {
    if !is_root() {
        assert!(!strict(), "ZEROTX_STRICT=1 and the bench test needs root");
    }
}

/// `zerotx bench ARGS --json`, which must succeed, and the report it printed.
fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = zerotx()
        .arg("bench")
        .args(args)
        .arg("--json")
        .assert()
        .success();
    serde_json::from_slice(&out.get_output().stdout).unwrap()
}

#[test]
fn bench_quick_json_shows_loopback_copied_and_black_hole_zerocopy() {
    bench_needs_root();
    let v = bench_json(&[
        "--quick",
        "--duration",
        "0.05",
        "--repeat",
        "1",
        "--sizes",
        "4K,16K",
    ]);
    for key in [
        "version",
        "kernel",
        "cpus",
        "run_seconds",
        "repeat",
        "ring_bytes",
    ] {
        assert!(!v[key].is_null(), "{key} missing");
    }
    let zc_engines = ["msg-zc", "uring-zc", "uring-zc-fixed"];
    let check = |cells: &Vec<serde_json::Value>, kernel_copies: bool| {
        assert_eq!(cells.len(), 2 * 6, "two sizes, six engines (auto first)");
        for c in cells {
            let engine = c["engine"].as_str().unwrap();
            assert!(c["error"].is_null(), "{engine}: {}", c["error"]);
            assert!(c["mb_s"]["median"].as_f64().unwrap() > 0.0, "{engine}");
            assert_eq!(c["runs"].as_array().unwrap().len(), 1);
            let zc = c["zerocopy"].as_u64().unwrap();
            let copied = c["kernel_copied"].as_u64().unwrap();
            if engine == "auto" {
                // It says what it chose; on loopback that is copying (from the first window
                // on), into the black hole zero-copy from the registered ring.
                let chose = c["chosen"].as_str().unwrap_or_default();
                if kernel_copies {
                    assert!(chose.ends_with(')'), "auto on loopback chose {chose}");
                    assert_eq!(zc, 0, "auto: loopback never skips the copy");
                } else {
                    assert!(
                        chose.ends_with("zc"),
                        "auto into the black hole chose {chose}"
                    );
                    assert!(zc > 0 && copied == 0, "auto: {c}");
                }
            } else if zc_engines.contains(&engine) {
                if kernel_copies {
                    assert_eq!(zc, 0, "{engine}: loopback never skips the copy");
                    assert!(copied > 0, "{engine}");
                } else {
                    assert!(zc > 0, "{engine}");
                    assert_eq!(copied, 0, "{engine}: the black hole never copies");
                }
            } else {
                assert!(c["engine_copied"].as_u64().unwrap() > 0, "{engine}");
            }
        }
    };
    check(cells(&v, "tcp-loopback").unwrap(), true);
    if let Some(c) = cells(&v, "udp-blackhole") {
        check(c, false);
    }
}

#[test]
fn bench_csv_and_plot_outputs() {
    let plot = std::env::temp_dir().join(format!("zerotx-bench-{}.svg", std::process::id()));
    let out = zerotx()
        .args([
            "bench",
            "--duration",
            "0.02",
            "--repeat",
            "1",
            "--sizes",
            "4K",
            "--engines",
            "copy,msg-zc",
            "--topology",
            "tcp-loopback",
            "--csv",
            "--plot",
        ])
        .arg(&plot)
        .assert()
        .success();
    let csv = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(csv
        .lines()
        .nth(1)
        .unwrap()
        .starts_with("tcp-loopback,copy,4096,"));
    assert!(std::fs::read_to_string(&plot).unwrap().contains("<svg"));
    std::fs::remove_file(&plot).unwrap();
}

#[test]
fn bench_huge_pages_runs_every_engine_and_says_so() {
    bench_needs_root();
    // uring-zc-fixed registers the ring: it must get one on small pages (io_uring refuses a huge
    // pool); the others, auto included (which takes a huge ring unregistered), the huge one.
    let v = bench_json(&[
        "--huge-pages",
        "--duration",
        "0.05",
        "--repeat",
        "1",
        "--sizes",
        "16K",
        "--engines",
        "copy,msg-zc,uring-zc,uring-zc-fixed,auto",
        "--topology",
        "tcp-loopback,udp-blackhole",
    ]);
    assert_eq!(v["huge_pages"], true);
    for topology in ["tcp-loopback", "udp-blackhole"] {
        let Some(cells) = cells(&v, topology) else {
            continue;
        };
        assert_eq!(cells.len(), 5, "{topology}");
        for c in cells {
            let engine = c["engine"].as_str().unwrap();
            assert!(c["error"].is_null(), "{topology} {engine}: {}", c["error"]);
            assert!(c["mb_s"]["median"].as_f64().unwrap() > 0.0, "{engine}");
        }
    }
}

#[test]
fn bench_bad_flags_name_the_problem() {
    for (args, msg) in [
        (&["--sizes", "0"][..], "invalid --sizes \"0\""),
        (&["--engines", "turbo"][..], "unknown engine \"turbo\""),
        (
            &["--topology", "vsock"][..],
            "needs a peer: give --vsock CID:PORT",
        ),
        (&["--duration=-1"][..], "invalid --duration"),
        (&["--vsock", "nope"][..], "expected CID:PORT"),
        (
            &["--engines", "liburing-zc-fixed"][..],
            "needs --liburing PATH",
        ),
    ] {
        zerotx()
            .arg("bench")
            .args(args)
            .assert()
            .code(1)
            .stderr(predicate::str::starts_with("Error: "))
            .stderr(predicate::str::contains(msg));
    }
}

#[test]
fn bench_baselines_run_beside_zerotx_and_export_markdown() {
    bench_needs_root();
    let md = std::env::temp_dir().join(format!("zerotx-bench-{}.md", std::process::id()));
    let v = bench_json(&[
        "--duration",
        "0.05",
        "--repeat",
        "1",
        "--sizes",
        "4K",
        "--engines",
        "copy,msg-zc,uring-zc-fixed",
        "--baselines",
        "--export-markdown",
        md.to_str().unwrap(),
    ]);
    let by_engine = |cells: &Vec<serde_json::Value>, e: &str| {
        cells
            .iter()
            .find(|c| c["engine"] == e)
            .unwrap_or_else(|| panic!("{e} missing"))
            .clone()
    };
    let tcp = cells(&v, "tcp-loopback").unwrap();
    assert_eq!(
        tcp.len(),
        6,
        "one size, three zerotx engines, three baselines"
    );
    let raw_copy = by_engine(tcp, "raw-copy");
    assert!(raw_copy["error"].is_null(), "{}", raw_copy["error"]);
    assert!(raw_copy["engine_copied"].as_u64().unwrap() > 0);
    let raw_zc = by_engine(tcp, "raw-msg-zc");
    assert!(raw_zc["error"].is_null(), "{}", raw_zc["error"]);
    assert!(
        raw_zc["kernel_copied"].as_u64().unwrap() > 0,
        "loopback copies"
    );
    let raw_uring = by_engine(tcp, "raw-uring-zc-fixed");
    assert!(raw_uring["error"]
        .as_str()
        .unwrap()
        .contains("datagram sockets only"));
    if let Some(udp) = cells(&v, "udp-blackhole") {
        for e in ["raw-copy", "raw-msg-zc", "raw-uring-zc-fixed"] {
            let c = by_engine(udp, e);
            assert!(c["error"].is_null(), "{e}: {}", c["error"]);
            assert!(c["mb_s"]["median"].as_f64().unwrap() > 0.0, "{e}");
            assert_eq!(c["kernel_copied"], 0, "{e}: the black hole never copies");
            if e != "raw-copy" {
                assert!(c["zerocopy"].as_u64().unwrap() > 0, "{e}");
            }
        }
    }
    let md_text = std::fs::read_to_string(&md).unwrap();
    std::fs::remove_file(&md).unwrap();
    assert!(md_text.contains("### tcp-loopback"), "{md_text}");
    assert!(md_text.contains("| copy / raw-copy |"), "{md_text}");
}

/// liburing's `examples/send-zerocopy.c` (vendored in `benches/liburing/`), built against
/// liburing-dev the way `scripts/compare-raw.sh` builds it; `None` (a skip, or a failure under
/// `ZEROTX_STRICT=1`) without the header or a C compiler.
fn liburing_example() -> Option<std::path::PathBuf> {
    let skipped = |why: &str| {
        skip(why);
        None
    };
    if !std::path::Path::new("/usr/include/liburing.h").exists() {
        return skipped("liburing-dev is not installed (no /usr/include/liburing.h)");
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../benches/liburing/send-zerocopy.c");
    let bin = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("send-zerocopy-{}", std::process::id()));
    let built = std::process::Command::new("cc")
        .args(["-O2", "-D_GNU_SOURCE", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(["-luring", "-lpthread"])
        .status();
    match built {
        Ok(s) if s.success() => Some(bin),
        Ok(s) => panic!("building {} failed: {s}", src.display()),
        Err(e) => skipped(&format!(
            "no C compiler to build liburing's example: cc: {e}"
        )),
    }
}

#[test]
fn bench_runs_liburings_example_as_a_column_beside_zerotx() {
    if !require(is_root(), "the black hole needs root (a network namespace)") {
        return;
    }
    let Some(example) = liburing_example() else {
        return;
    };
    let md = std::env::temp_dir().join(format!("zerotx-liburing-{}.md", std::process::id()));
    let v = bench_json(&[
        "--topology",
        "udp-blackhole",
        "--engines",
        "uring-zc-fixed",
        "--sizes",
        "4K",
        "--duration",
        "0.05",
        "--repeat",
        "1",
        "--liburing",
        example.to_str().unwrap(),
        "--export-markdown",
        md.to_str().unwrap(),
    ]);
    std::fs::remove_file(&example).unwrap();
    let Some(udp) = cells(&v, "udp-blackhole") else {
        return;
    };
    let cell = |e: &str| {
        udp.iter()
            .find(|c| c["engine"] == e)
            .unwrap_or_else(|| panic!("no {e} cell in {udp:?}"))
    };
    for e in ["uring-zc-fixed", "liburing-zc-fixed"] {
        let c = cell(e);
        assert!(c["error"].is_null(), "{e}: {}", c["error"]);
        assert!(c["mb_s"]["median"].as_f64().unwrap() > 0.0, "{e}: {c}");
    }
    let md_text = std::fs::read_to_string(&md).unwrap();
    std::fs::remove_file(&md).unwrap();
    assert!(
        md_text.contains("uring-zc-fixed / liburing-zc-fixed"),
        "{md_text}"
    );
}
