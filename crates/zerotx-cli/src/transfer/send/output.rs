//! What `zerotx send` prints: iperf3's lines with a zero-copy column, its totals with what the
//! engine did and why, and with `--json` one document in iperf3's shape (start, intervals, end)
//! with `zerotx` objects added.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use super::plan::{Conn, Plan, Source};
use super::stream::{ByPath, Counters, End};
use super::tcp_info::TcpSample;
use crate::stdout::outln;
use crate::transfer::{
    bitrate, fmt_bytes, host_port, http_date, interval_line, system_info, Endpoint, Proto,
};

/// What the progress bar counts to.
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    /// Bytes in all.
    Bytes(u64),
    /// A duration.
    Time(Duration),
}

/// A progress bar on standard error.
pub fn bar(goal: Goal) -> ProgressBar {
    let (len, template) = match goal {
        Goal::Bytes(b) => (
            b,
            "{spinner} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {msg}",
        ),
        Goal::Time(t) => (
            t.as_millis() as u64,
            "{spinner} [{elapsed_precise}] [{wide_bar}] {msg}",
        ),
    };
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    b
}

/// Moves the bar.
pub fn tick(bar: &ProgressBar, goal: Goal, counters: &[Arc<Counters>], elapsed: Duration) {
    let bytes: u64 = counters
        .iter()
        .map(|c| c.bytes.load(Ordering::Relaxed))
        .sum();
    match goal {
        Goal::Bytes(_) => bar.set_position(bytes),
        Goal::Time(_) => bar.set_position(elapsed.as_millis() as u64),
    }
    bar.set_message(format!(
        "{} sent, {}",
        fmt_bytes(bytes),
        crate::transfer::fmt_bitrate(bitrate(bytes, elapsed.as_secs_f64()))
    ));
}

const HEADER: &str = "[ ID] Interval           Transfer     Bitrate         Zero-copy";
/// Over TCP, iperf3's retransmits and congestion window before the zero-copy share.
const HEADER_TCP: &str =
    "[ ID] Interval           Transfer     Bitrate         Retr         Cwnd  Zero-copy";

/// One stream's counters at an interval's end.
#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    bytes: u64,
    zerocopy: u64,
    sendfile: u64,
    tcp: Option<TcpSample>,
}

/// The columns after the bitrate: over TCP the interval's retransmits and the window, then the
/// zero-copy share.
fn tail(retr_cwnd: Option<(u64, Option<u64>)>, zc: &str) -> String {
    match retr_cwnd {
        None => format!("  {zc}"),
        Some((retr, cwnd)) => format!(
            "  {retr:>4}  {:>11}  {zc}",
            cwnd.map_or(String::new(), fmt_bytes)
        ),
    }
}
const RULE: &str = "- - - - - - - - - - - - - - - - - - - - - - - - -";

/// The printer, and the JSON document in the making.
pub struct Output {
    json: bool,
    /// `--json-stream`: each event on its own line as it happens, no document at the end.
    stream: bool,
    /// TCP over IP: `TCP_INFO` columns.
    tcp: bool,
    ids: Vec<String>,
    prev: Vec<Snap>,
    prev_t: Duration,
    intervals: Vec<Value>,
    start: Value,
    proto: Proto,
    engine: zerotx::EngineKind,
    file: Option<(String, &'static str)>,
}

/// The `Zero-copy` column: the share of `whole` sent zero-copy, or `sendfile` where the bytes
/// went by `sendfile(2)`, whose completions do not say whether the kernel copied.
fn share(zerocopy: u64, sendfile: u64, whole: u64) -> String {
    if sendfile > 0 && zerocopy == 0 {
        "sendfile".into()
    } else {
        pct(zerocopy, whole)
    }
}

/// One `--json-stream` line: `{"event": NAME, "data": DATA}`, as iperf3 writes them.
fn event(name: &str, data: Value) {
    outln!("{}", json!({ "event": name, "data": data }));
}

fn pct(part: u64, whole: u64) -> String {
    match (part * 100).checked_div(whole) {
        Some(p) => format!("{p:>4}%"),
        None => "    -".into(),
    }
}

impl Output {
    /// Prints the connections (text) or keeps them for the document.
    pub fn new(plan: &Plan, conns: &[Conn]) -> Self {
        let tcp = plan.proto == Proto::Tcp && matches!(plan.endpoints[0], Endpoint::Ip(_));
        let ids: Vec<String> = (0..conns.len()).map(|i| (5 + i).to_string()).collect();
        let (host, port) = match plan.endpoints[0] {
            crate::transfer::Endpoint::Ip(a) => (a.ip().to_string(), u64::from(a.port())),
            crate::transfer::Endpoint::Vsock { cid, port } => {
                (format!("vsock:{cid}"), u64::from(port))
            }
        };
        let file = match &plan.source {
            Source::File { path, via, .. } => Some((path.display().to_string(), via.name())),
            Source::Generated { .. } => None,
        };
        if !plan.json {
            if plan.verbose {
                crate::transfer::verbose_header();
            }
            outln!("Connecting to host {host}, port {port}");
            for (id, c) in ids.iter().zip(conns) {
                let ((lh, lp), (rh, rp)) = (host_port(&c.local), host_port(&c.remote));
                outln!("[{id:>3}] local {lh} port {lp} connected to {rh} port {rp}");
            }
            if let Some((path, via)) = &file {
                outln!("Sending {path} with {}", via_words(via));
            }
            outln!("{}", if tcp { HEADER_TCP } else { HEADER });
        }
        let (secs, bytes) = match (&plan.source, plan.time) {
            (_, Some(t)) => (t.as_secs_f64(), 0),
            (Source::Generated { bytes: Some(b) }, None) => (0.0, *b),
            (Source::File { len, .. }, None) => (0.0, *len),
            _ => (0.0, 0),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let start = json!({
            "connected": ids.iter().zip(conns).map(|(id, c)| {
                let ((lh, lp), (rh, rp)) = (host_port(&c.local), host_port(&c.remote));
                json!({
                    "socket": id.parse::<u64>().unwrap_or(0),
                    "local_host": lh, "local_port": lp, "remote_host": rh, "remote_port": rp,
                })
            }).collect::<Vec<_>>(),
            "version": format!("zerotx {}", env!("CARGO_PKG_VERSION")),
            "system_info": system_info(),
            "timestamp": { "time": http_date(now), "timesecs": now },
            "connecting_to": { "host": host, "port": port },
            "test_start": {
                "protocol": plan.proto.name(),
                "num_streams": conns.len(),
                "blksize": plan.size,
                "omit": 0,
                "duration": secs,
                "bytes": bytes,
                "blocks": 0,
                "reverse": 0,
                "target_bitrate": plan.rate.map_or(0, |r| (r * 8.0) as u64),
            },
            "zerotx": {
                "engine": plan.engine.name(),
                "file": file.as_ref().map(|f| f.0.clone()),
                "file_via": file.as_ref().map(|f| f.1),
            },
        });
        if plan.json_stream {
            event("start", start.clone());
        }
        Self {
            json: plan.json,
            stream: plan.json_stream,
            tcp,
            prev: vec![Snap::default(); ids.len()],
            ids,
            prev_t: Duration::ZERO,
            intervals: Vec::new(),
            start,
            proto: plan.proto,
            engine: plan.engine,
            file,
        }
    }

    /// One interval, from the last one's end to `now` (since the start).
    pub fn interval(
        &mut self,
        counters: &[Arc<Counters>],
        now: Duration,
        bar: Option<&ProgressBar>,
    ) {
        let cur: Vec<Snap> = counters
            .iter()
            .map(|c| Snap {
                bytes: c.bytes.load(Ordering::Relaxed),
                zerocopy: c.zerocopy.load(Ordering::Relaxed),
                sendfile: c.sendfile.load(Ordering::Relaxed),
                tcp: c.tcp.load(),
            })
            .collect();
        self.emit(&cur, now, bar);
    }

    /// The last, partial interval, up to the last stream's end, when it is long enough to say
    /// something (iperf3 drops the ones shorter than a tenth of a second too).
    pub fn last_interval(&mut self, start: Instant, ends: &[End]) {
        let t = ends
            .iter()
            .map(|e| e.finished.saturating_duration_since(start))
            .max()
            .unwrap_or_default();
        if t.saturating_sub(self.prev_t) >= Duration::from_millis(100) {
            let cur: Vec<Snap> = ends
                .iter()
                .map(|e| Snap {
                    bytes: e.bytes,
                    zerocopy: e.by_path.zerocopy,
                    sendfile: e.by_path.sendfile,
                    tcp: e.tcp.map(|t| t.last),
                })
                .collect();
            self.emit(&cur, t, None);
        }
    }

    fn emit(&mut self, cur: &[Snap], now: Duration, bar: Option<&ProgressBar>) {
        let from = self.prev_t;
        let secs = (now - from).as_secs_f64();
        let mut streams = Vec::new();
        let mut lines = Vec::new();
        let (mut sum_b, mut sum_z, mut sum_s, mut sum_r) = (0, 0, 0, 0);
        for (i, (c, p)) in cur.iter().zip(&self.prev).enumerate() {
            let db = c.bytes.saturating_sub(p.bytes);
            let dz = c.zerocopy.saturating_sub(p.zerocopy);
            let ds = c.sendfile.saturating_sub(p.sendfile);
            // Retransmits in this interval; the window as last sampled.
            let retr = c.tcp.map(|t| {
                let before = p.tcp.map_or(0, |p| p.retransmits);
                t.retransmits.saturating_sub(before)
            });
            sum_b += db;
            sum_z += dz;
            sum_s += ds;
            sum_r += retr.unwrap_or(0);
            let cols = self.tcp.then(|| (retr.unwrap_or(0), c.tcp.map(|t| t.cwnd)));
            lines.push(interval_line(
                &self.ids[i],
                from,
                now,
                db,
                &tail(cols, &share(dz, ds, db)),
            ));
            let mut doc = json!({
                "socket": self.ids[i].parse::<u64>().unwrap_or(0),
                "start": from.as_secs_f64(), "end": now.as_secs_f64(), "seconds": secs,
                "bytes": db, "bits_per_second": bitrate(db, secs),
                "omitted": false, "sender": true, "zerocopy_bytes": dz, "sendfile_bytes": ds,
            });
            if let (Some(t), Some(r)) = (c.tcp, retr) {
                doc["retransmits"] = json!(r);
                doc["snd_cwnd"] = json!(t.cwnd);
                doc["rtt"] = json!(t.rtt_us);
                doc["rttvar"] = json!(t.rttvar_us);
            }
            streams.push(doc);
        }
        if cur.len() > 1 {
            lines.push(interval_line(
                "SUM",
                from,
                now,
                sum_b,
                &tail(
                    self.tcp.then_some((sum_r, None)),
                    &share(sum_z, sum_s, sum_b),
                ),
            ));
        }
        let mut sum = json!({
            "start": from.as_secs_f64(), "end": now.as_secs_f64(), "seconds": secs,
            "bytes": sum_b, "bits_per_second": bitrate(sum_b, secs),
            "omitted": false, "sender": true, "zerocopy_bytes": sum_z, "sendfile_bytes": sum_s,
        });
        if self.tcp {
            sum["retransmits"] = json!(sum_r);
        }
        let interval = json!({ "streams": streams, "sum": sum });
        if self.stream {
            event("interval", interval);
        } else {
            self.intervals.push(interval);
        }
        if !self.json {
            let print = || lines.iter().for_each(|l| outln!("{l}"));
            match bar {
                Some(b) => b.suspend(print),
                None => print(),
            }
        }
        self.prev = cur.to_vec();
        self.prev_t = now;
    }

    /// The totals, what the engine did, CPU; the JSON document. Fails with the first stream's
    /// error, after printing everything that is known.
    pub fn finish(
        self,
        start: Instant,
        ends: &[End],
        cpu: (Duration, Duration),
    ) -> anyhow::Result<()> {
        let mut by_path = ByPath::default();
        let mut stream_docs = Vec::new();
        let header = if self.tcp { HEADER_TCP } else { HEADER };
        let mut text = vec![RULE.to_string(), header.to_string()];
        let (mut sum, mut sum_end, mut all_confirmed, mut sum_conf) =
            (0u64, Duration::ZERO, true, Duration::ZERO);
        let mut sum_retr = 0;
        // A receiver line's word sits where the sender line's does: after the TCP columns too.
        let pad = if self.tcp {
            " ".repeat(19)
        } else {
            String::new()
        };
        for (id, e) in self.ids.iter().zip(ends) {
            by_path.merge(&e.by_path);
            sum += e.bytes;
            let t = e.finished.saturating_duration_since(start);
            sum_end = sum_end.max(t);
            let zc = share(e.by_path.zerocopy, e.by_path.sendfile, e.bytes);
            let retr = e.tcp.map_or(0, |m| m.last.retransmits);
            sum_retr += retr;
            text.push(interval_line(
                id,
                Duration::ZERO,
                t,
                e.bytes,
                &format!("{}  sender", tail(self.tcp.then_some((retr, None)), &zc)),
            ));
            let side = |t: Duration, sender: bool| {
                json!({
                    "socket": id.parse::<u64>().unwrap_or(0),
                    "start": 0.0, "end": t.as_secs_f64(), "seconds": t.as_secs_f64(),
                    "bytes": e.bytes, "bits_per_second": bitrate(e.bytes, t.as_secs_f64()),
                    "sender": sender,
                })
            };
            let mut doc = json!({ "sender": side(t, true) });
            if let Some(m) = e.tcp {
                // iperf3's names; round trips in microseconds.
                let d = &mut doc["sender"];
                d["retransmits"] = json!(m.last.retransmits);
                d["max_snd_cwnd"] = json!(m.max_cwnd);
                d["max_rtt"] = json!(m.max_rtt_us);
                d["min_rtt"] = json!(m.min_rtt_us);
                d["mean_rtt"] = json!(m.mean_rtt_us);
            }
            match e.confirmed {
                Some(c) => {
                    let tc = c.saturating_duration_since(start);
                    sum_conf = sum_conf.max(tc);
                    text.push(interval_line(
                        id,
                        Duration::ZERO,
                        tc,
                        e.bytes,
                        &format!("{pad}         receiver (read to the end, then closed)"),
                    ));
                    doc["receiver"] = side(tc, false);
                }
                None => all_confirmed = false,
            }
            doc["zerotx"] = json!({
                "via": e.via,
                "bytes_by_path": e.by_path,
                "unconfirmed": e.unconfirmed,
                "error": e.error.as_ref().map(|x| format!("{x:#}")),
            });
            stream_docs.push(doc);
        }
        if self.ids.len() > 1 {
            let zc = share(by_path.zerocopy, by_path.sendfile, sum);
            text.push(interval_line(
                "SUM",
                Duration::ZERO,
                sum_end,
                sum,
                &format!(
                    "{}  sender",
                    tail(self.tcp.then_some((sum_retr, None)), &zc)
                ),
            ));
            if all_confirmed {
                text.push(interval_line(
                    "SUM",
                    Duration::ZERO,
                    sum_conf,
                    sum,
                    &format!("{pad}         receiver"),
                ));
            }
        }
        // What the engine did, and why.
        let explain = ends.iter().find_map(|e| e.explain.clone());
        let stats = ends.iter().filter_map(|e| e.stats).reduce(|mut a, s| {
            a.merge(&s);
            a
        });
        if let Some((_, via)) = &self.file {
            if *via == "sendfile" && by_path.sendfile == 0 && sum > 0 {
                text.push("file: sendfile(2) was refused by this socket: sent mapped pages through the engine instead".into());
            }
        }
        if by_path.sendfile > 0 {
            text.push(format!(
                "sendfile: {} straight from the page cache (no copy on this side; no completion \
                 to wait for)",
                fmt_bytes(by_path.sendfile)
            ));
        }
        if by_path.zerocopy + by_path.copied() > 0 {
            let mut why = Vec::new();
            for (n, what) in [
                (by_path.copied_kernel, "the kernel copied zero-copy sends"),
                (by_path.copied_route, "auto: the route copies"),
                (by_path.copied_small, "auto: too small to pay"),
                (by_path.copied_budget, "auto: zero-copy budget full"),
                (by_path.copied_fallback, "ENOBUFS fallback"),
                (by_path.copied_engine, "copy engine"),
            ] {
                if n > 0 {
                    why.push(format!("{what}: {}", fmt_bytes(n)));
                }
            }
            text.push(format!(
                "zero-copy: {} sent zero-copy, {} copied{}",
                fmt_bytes(by_path.zerocopy),
                fmt_bytes(by_path.copied()),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", why.join("; "))
                }
            ));
        }
        let per_train = ends.iter().find_map(|e| e.trains);
        let trains_off = ends.iter().find_map(|e| e.trains_off.clone());
        if let Some(n) = per_train {
            let trains = stats.map_or(0, |s| s.trains);
            text.push(format!(
                "trains: {trains} sent, up to {n} datagrams each (one send_train, UDP GSO, per \
                 train){}",
                trains_off.as_ref().map_or(String::new(), |why| format!(
                    "; then one datagram per call: trains off ({why})"
                ))
            ));
        }
        if let Some(x) = &explain {
            // The engine's words, but its first line from what the kernel did: an engine that
            // asks for zero-copy is not "engaged" when the kernel copied every send.
            let state = if by_path.zerocopy == 0 && by_path.copied_kernel > 0 {
                "zero-copy asked for, but the kernel copied every send"
            } else if !x.zerocopy {
                "zero-copy not engaged"
            } else {
                "zero-copy engaged"
            };
            text.push(format!("engine {} over {}: {state}", x.engine, x.path));
            text.extend(x.lines.iter().map(|l| format!("  - {l}")));
        }
        let wall = ends
            .iter()
            .map(|e| e.confirmed.unwrap_or(e.finished))
            .max()
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(start));
        let cpu_total = cpu.0 + cpu.1;
        let gb = sum as f64 / 1e9;
        let per_gb = if gb > 0.0 {
            cpu_total.as_secs_f64() / gb
        } else {
            0.0
        };
        let share = |d: Duration| {
            if wall.is_zero() {
                0.0
            } else {
                d.as_secs_f64() / wall.as_secs_f64() * 100.0
            }
        };
        text.extend((wall >= Duration::from_millis(100)).then(|| format!(
            "CPU (this process): {:.2} s ({:.1}% of {:.2} s; user {:.2} s, system {:.2} s), {:.3} s \
             per GB sent",
            cpu_total.as_secs_f64(),
            share(cpu_total),
            wall.as_secs_f64(),
            cpu.0.as_secs_f64(),
            cpu.1.as_secs_f64(),
            per_gb
        )));
        for (id, e) in self.ids.iter().zip(ends) {
            if let Some(u) = &e.unconfirmed {
                text.push(format!("[{id:>3}] note: {u}"));
            }
        }
        let side_sum = |t: Duration, sender: bool| {
            json!({
                "start": 0.0, "end": t.as_secs_f64(), "seconds": t.as_secs_f64(),
                "bytes": sum, "bits_per_second": bitrate(sum, t.as_secs_f64()), "sender": sender,
            })
        };
        let mut end = json!({
            "streams": stream_docs,
            "sum_sent": side_sum(sum_end, true),
            "cpu_utilization_percent": {
                "host_total": share(cpu_total),
                "host_user": share(cpu.0),
                "host_system": share(cpu.1),
            },
            "zerotx": {
                "engine": self.engine.name(),
                "protocol": self.proto.name(),
                "path": explain.as_ref().map(|x| x.path),
                "zerocopy_engaged": explain
                    .as_ref()
                    .map(|x| x.zerocopy && !(by_path.zerocopy == 0 && by_path.copied_kernel > 0)),
                "explain": explain.as_ref().map(|x| x.lines.clone()),
                "bytes_zerocopy": by_path.zerocopy,
                "bytes_sendfile": by_path.sendfile,
                "bytes_copied": by_path.copied(),
                "bytes_by_path": by_path,
                "fallbacks": stats.map(|s| s.fallbacks),
                "enobufs": stats.map(|s| s.enobufs),
                "probes": stats.map(|s| s.probes),
                "switches_to_copy": stats.map(|s| s.switches_to_copy),
                "sends": stats.map(|s| s.sends),
                "trains": per_train.map(|n| json!({
                    "datagrams_per_train": n,
                    "sent": stats.map_or(0, |s| s.trains),
                    "split": stats.map_or(0, |s| s.train_splits),
                    "off": trains_off,
                })),
                "syscalls": stats.map(|s| s.syscalls),
                "cpu_seconds": cpu_total.as_secs_f64(),
                "cpu_seconds_per_gb": per_gb,
                "receiver_confirmed": all_confirmed,
            },
        });
        if self.tcp {
            end["sum_sent"]["retransmits"] = json!(sum_retr);
        }
        if all_confirmed {
            end["sum_received"] = side_sum(sum_conf, false);
        }
        let error = ends.iter().find_map(|e| e.error.as_ref());
        if self.stream {
            if let Some(e) = error {
                event("error", json!(format!("{e:#}")));
            }
            event("end", end);
        } else if self.json {
            let mut doc = json!({ "start": self.start, "intervals": self.intervals, "end": end });
            if let Some(e) = error {
                doc["error"] = json!(format!("{e:#}"));
            }
            outln!("{}", serde_json::to_string_pretty(&doc)?);
        } else {
            text.iter().for_each(|l| outln!("{l}"));
        }
        match error {
            Some(e) => {
                let (i, _) = ends
                    .iter()
                    .enumerate()
                    .find(|(_, x)| x.error.is_some())
                    .expect("an error");
                Err(anyhow::anyhow!("stream {}: {e:#}", self.ids[i]))
            }
            None => Ok(()),
        }
    }
}

fn via_words(via: &str) -> &'static str {
    match via {
        "sendfile" => "sendfile(2): page cache straight to the socket",
        _ => "its pages mapped (mmap) and sent by the engine",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_nothing_are_a_dash() {
        assert_eq!(pct(0, 0), "    -");
        assert_eq!(pct(50, 100), "  50%");
    }
}
