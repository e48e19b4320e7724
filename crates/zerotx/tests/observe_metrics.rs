//! The metrics (feature `metrics`): the object server (`examples/object_server`, run in-process)
//! serves `/metrics` in Prometheus text, scraped over HTTP and read with a parser nobody here
//! wrote (`prometheus-parse`); each counter equals the sum of the senders' own `Stats`, which the
//! server merges as its connections finish. Metrics are process-wide: this binary holds one test.

mod util;

#[path = "../examples/object_server/server.rs"]
mod server;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value};
use server::{Config, Mode, Running};
use util::{tcp_pair, Peer};
use zerotx::{EngineKind, Sender, Stats};

/// One HTTP/1.1 request on its own connection; the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&all[..end]).to_string();
    let status = head.lines().next().unwrap().to_string();
    (status, all[end + 4..].to_vec())
}

/// Scrapes `/metrics` and parses it.
fn scrape(addr: SocketAddr) -> Scrape {
    let (status, body) = get(addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    let text = String::from_utf8(body).unwrap();
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// The value of `metric` with label `engine` (and `path`, if given): 0 when it has no sample
/// yet (a counter that never moved is not rendered).
fn value(s: &Scrape, metric: &str, engine: &str, path: Option<&str>) -> f64 {
    let found: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.metric == metric && x.labels.get("engine") == Some(engine))
        .filter(|x| path.is_none() || x.labels.get("path") == path)
        .map(|x| match x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{metric}: {other:?}"),
        })
        .collect();
    assert!(found.len() <= 1, "{metric} {engine} {path:?}: {found:?}");
    found.first().copied().unwrap_or(0.0)
}

/// Every counter of `engine` equals the merged `Stats` of its senders; gauges are back at 0.
fn check(s: &Scrape, engine: &str, st: &Stats) {
    let v = |m: &str| value(s, m, engine, None) as u64;
    let p = |path: &str| value(s, "zerotx_released_buffers_total", engine, Some(path)) as u64;
    let what = format!("{engine}: {st:?}");
    assert_eq!(v("zerotx_sends_total"), st.sends, "{what}");
    assert_eq!(v("zerotx_bytes_total"), st.bytes, "{what}");
    assert_eq!(p("zerocopy"), st.zerocopy, "{what}");
    assert_eq!(p("copied_kernel"), st.kernel_copied, "{what}");
    assert_eq!(p("copied_engine"), st.engine_copied, "{what}");
    assert_eq!(p("copied_fallback"), st.fallbacks, "{what}");
    assert_eq!(p("copied_small"), st.copied_small, "{what}");
    assert_eq!(p("copied_route"), st.copied_route, "{what}");
    assert_eq!(p("copied_budget"), st.copied_budget, "{what}");
    assert_eq!(st.released(), st.sends, "{what}");
    let bytes: f64 = [
        "zerocopy",
        "copied_kernel",
        "copied_engine",
        "copied_fallback",
        "copied_small",
        "copied_route",
        "copied_budget",
    ]
    .iter()
    .map(|path| value(s, "zerotx_released_bytes_total", engine, Some(path)))
    .sum();
    assert_eq!(bytes as u64, st.bytes, "{what}");
    assert_eq!(v("zerotx_budget_refusals_total"), st.enobufs, "{what}");
    assert_eq!(v("zerotx_probes_total"), st.probes, "{what}");
    assert_eq!(v("zerotx_probes_paid_total"), st.probes_paid, "{what}");
    assert_eq!(
        v("zerotx_switches_to_copy_total"),
        st.switches_to_copy,
        "{what}"
    );
    assert_eq!(v("zerotx_failed_buffers_total"), st.errors, "{what}");
    assert_eq!(v("zerotx_kept_buffers_total"), 0, "{what}");
    assert_eq!(v("zerotx_zerocopy_in_flight"), 0, "{what}");
    assert_eq!(v("zerotx_pinned_bytes"), 0, "{what}");
}

/// Waits until the server closed every connection it had.
fn settle(s: &Running) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.stats.open.load(Relaxed) > 0 {
        assert!(Instant::now() < deadline, "{}", s.stats.render());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn metrics_scraped_from_the_object_server_match_the_senders_stats() {
    let mut servers = Vec::new();
    for kind in [EngineKind::Auto, EngineKind::MsgZerocopy] {
        let mut cfg = Config::new(Mode::ZeroTx(kind));
        cfg.max_size = 4 << 20;
        let running = server::spawn("127.0.0.1:0".parse().unwrap(), cfg).expect("server");
        for size in ["/4096", "/64K", "/1M", "/4M", "/1M"] {
            let (status, body) = get(running.addr, size);
            assert!(status.contains("200"), "{status}");
            assert_eq!(body.len(), server::parse_size(&size[1..]).unwrap());
        }
        settle(&running);
        servers.push((kind, running));
    }
    let scraped = scrape(servers[0].1.addr);
    for (kind, running) in &servers {
        let merged = *running.stats.senders.lock().unwrap();
        assert!(merged.sends > 10, "{kind}: {merged:?}");
        check(&scraped, &kind.to_string(), &merged);
        // The server's own books agree with the library's.
        assert_eq!(running.stats.buffers_sent.load(Relaxed), merged.sends);
    }

    // A blocking sender in the same process: its counters, and the release latencies its
    // reports carry (one release in 61), land in the same recorder.
    let (client, peer) = tcp_pair(false, Peer::default());
    let mut tx = Sender::new(client, EngineKind::Copy).unwrap();
    let mut out = Vec::new();
    for i in 0..500u32 {
        tx.send(vec![i as u8; 4096]).unwrap();
        tx.reap(&mut out).unwrap();
    }
    tx.flush(Duration::from_secs(5)).unwrap();
    tx.reap(&mut out).unwrap();
    let stats = tx.stats();
    drop(tx.close(Duration::from_secs(5)));
    peer.join().unwrap();
    let sampled = out.iter().filter(|r| r.report.latency.is_some()).count();
    assert!(sampled > 0, "no release latency sampled in 500");
    let scraped = scrape(servers[0].1.addr);
    check(&scraped, "copy", &stats);
    assert_eq!(
        value(
            &scraped,
            "zerotx_release_latency_seconds_count",
            "copy",
            None
        ) as usize,
        sampled
    );

    // A sender dropped without a close, nothing held: what it did since its last reap is
    // published, and its gauges (`auto`'s cap on `sendmsg(2)`) come off the sums.
    let auto_before = *servers[0].1.stats.senders.lock().unwrap();
    let (client, peer) = tcp_pair(false, Peer::default());
    let cfg = zerotx::SenderConfig::new(EngineKind::Auto).with_auto_uring(false);
    let mut tx = Sender::with_config(client, cfg).unwrap();
    tx.send(vec![1u8; 4096]).unwrap();
    tx.reap(&mut Vec::new()).unwrap();
    let cap = tx.stats().cap_sends.expect("auto on sendmsg(2) has a cap") as f64;
    let scraped = scrape(servers[0].1.addr);
    assert_eq!(value(&scraped, "zerotx_cap_sends", "auto", None), cap);
    for _ in 0..9 {
        tx.send(vec![1u8; 4096]).unwrap();
    }
    tx.flush(Duration::from_secs(5)).unwrap();
    let mut all = auto_before;
    all.merge(&tx.stats());
    drop(tx);
    peer.join().unwrap();
    let scraped = scrape(servers[0].1.addr);
    assert_eq!(value(&scraped, "zerotx_cap_sends", "auto", None), 0.0);
    check(&scraped, "auto", &all);
    for (_, running) in servers {
        assert_eq!(running.stop().left_open, 0);
    }
}
