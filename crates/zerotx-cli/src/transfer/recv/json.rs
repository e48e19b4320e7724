//! `zerotx recv --json`: one document per transfer in iperf3's shape (`start`, `intervals`,
//! `end`) as far as it applies to a receiver without a control connection, plus an
//! `end.zerotx` object with what iperf3 has no field for (the verdict of `--verify`, UDP
//! out-of-order and corrupt counts, the output file, CPU per GB).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::sample::{cpu_per_gb, cpu_secs, lost_percent, Cpu, Sample, Stream, Verdict};
use super::{HostPort, Opts};
use crate::transfer::{bitrate, http_date, Proto};

/// What a document reports of a transfer, borrowed from its meter.
pub(super) struct Facts<'a> {
    pub opts: &'a Opts,
    /// When the transfer started.
    pub wall0: SystemTime,
    pub accepted: &'a HostPort,
    pub streams: &'a [Stream],
    /// The intervals kept, oldest first.
    pub intervals: &'a VecDeque<Vec<Sample>>,
    pub intervals_dropped: u64,
    pub ignored: u64,
}

/// The whole document for a finished transfer.
pub(super) fn document(
    m: &Facts<'_>,
    totals: &[Sample],
    sum: &Sample,
    cpu: Cpu,
    verdict: &Verdict,
) -> Value {
    let udp = m.opts.proto == Proto::Udp;
    let udp_verify = udp && m.opts.verify;
    let secs = m
        .wall0
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let connected: Vec<Value> = m
        .streams
        .iter()
        .map(|s| {
            json!({
                "socket": s.id,
                "local_host": s.local.host,
                "local_port": s.local.port,
                "remote_host": s.remote.host,
                "remote_port": s.remote.port,
            })
        })
        .collect();
    let intervals: Vec<Value> = m
        .intervals
        .iter()
        .map(|group| interval(group, udp_verify))
        .collect();
    let streams: Vec<Value> = totals
        .iter()
        .zip(m.streams)
        .map(|(t, s)| {
            let mut receiver = sample(t, udp_verify);
            if udp_verify {
                receiver["out_of_order"] = json!(t.datagrams.out_of_order);
                receiver["corrupt"] = json!(t.datagrams.corrupt);
            }
            json!({
                "receiver": receiver,
                "zerotx": { "ended": s.note, "mismatch_offset": s.mismatch },
            })
        })
        .collect();
    let wall = sum.end.as_secs_f64();
    let pct = |d: Duration| {
        if wall > 0.0 {
            d.as_secs_f64() / wall * 100.0
        } else {
            0.0
        }
    };
    let d = sum.datagrams;
    let verified = m.opts.verify.then_some(
        verdict.mismatch.is_none() && verdict.corrupt == 0 && verdict.cut_short.is_none(),
    );
    let count = |v: u64| if udp_verify { json!(v) } else { Value::Null };
    let mut sum_received = sample(sum, udp_verify);
    if let Value::Object(o) = &mut sum_received {
        o.remove("socket");
        o.remove("sender");
    }
    json!({
        "start": {
            "connected": connected,
            "version": format!("zerotx {}", env!("CARGO_PKG_VERSION")),
            "timestamp": { "time": http_date(secs), "timesecs": secs },
            "accepted_connection": { "host": m.accepted.host, "port": m.accepted.port },
            "test_start": {
                "protocol": m.opts.proto.name(),
                "num_streams": m.streams.len(),
            },
        },
        "intervals": intervals,
        "end": {
            "streams": streams,
            "sum_received": sum_received,
            "cpu_utilization_percent": {
                "host_total": pct(cpu.user + cpu.system),
                "host_user": pct(cpu.user),
                "host_system": pct(cpu.system),
            },
            "zerotx": {
                "verified": verified,
                "mismatch_socket": verdict.mismatch.map(|(id, _)| id),
                "mismatch_offset": verdict.mismatch.map(|(_, at)| at),
                "cut_short_socket": verdict.cut_short.as_ref().map(|(id, _)| id),
                "datagrams_ignored": if udp { json!(m.ignored) } else { Value::Null },
                "intervals_dropped": m.intervals_dropped,
                "packets": if udp { json!(d.packets) } else { Value::Null },
                "lost_packets": count(d.lost),
                "out_of_order": count(d.out_of_order),
                "corrupt": count(d.corrupt),
                "output": m.opts.output.as_ref().map(|o| o.path().display().to_string()),
                "cpu_seconds": cpu_secs(cpu),
                "cpu_seconds_per_gb": cpu_per_gb(cpu, sum.bytes),
            },
        },
    })
}

/// One interval: its streams' samples, then their sum (the last of `group`).
pub(super) fn interval(group: &[Sample], udp_verify: bool) -> Value {
    let (sum, streams) = group.split_last().expect("an interval has its sum");
    json!({
        "streams": streams.iter().map(|s| sample(s, udp_verify)).collect::<Vec<_>>(),
        "sum": sample(sum, udp_verify),
    })
}

/// One `--json-stream` line: `{"event": NAME, "data": DATA}`, as iperf3 writes them.
pub(super) fn event(name: &str, data: Value) {
    crate::stdout::outln!("{}", json!({ "event": name, "data": data }));
}

/// One interval or total as iperf3 reports it (a receiver's: `"sender": false`).
fn sample(s: &Sample, udp_verify: bool) -> Value {
    let secs = s.end.saturating_sub(s.start).as_secs_f64();
    let mut o = Map::new();
    if let Some(id) = s.id {
        o.insert("socket".into(), json!(id));
    }
    o.insert("start".into(), json!(s.start.as_secs_f64()));
    o.insert("end".into(), json!(s.end.as_secs_f64()));
    o.insert("seconds".into(), json!(secs));
    o.insert("bytes".into(), json!(s.bytes));
    o.insert("bits_per_second".into(), json!(bitrate(s.bytes, secs)));
    if udp_verify {
        let d = s.datagrams;
        o.insert("lost_packets".into(), json!(d.lost));
        o.insert("packets".into(), json!(d.packets + d.lost));
        o.insert("lost_percent".into(), json!(lost_percent(d)));
    }
    o.insert("sender".into(), json!(false));
    Value::Object(o)
}
