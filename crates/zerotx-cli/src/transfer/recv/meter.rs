//! What one transfer measured: bytes per stream, sampled every `--interval` into iperf3's
//! interval lines, and at the end the totals, the verdict of `--verify` and the receiver's CPU
//! time, printed as text or handed to [`super::json`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::json::{self, Facts};
use super::sample::{
    cpu_per_gb, cpu_secs, minus, percent, sum_of, Cpu, Datagrams, Sample, Stream, Verdict,
};
use super::{HostPort, Opts, MAX_SOURCES};
use crate::stdout::outln;
use crate::transfer::{fmt_bitrate, interval_line, Proto};

/// The id iperf3 gives its first data stream; the others follow.
const FIRST_ID: u32 = 5;

/// Interval samples a transfer keeps for `--json` (one per stream and one sum per interval):
/// about 8 MB. Past it the oldest intervals go, and the document counts them
/// (`intervals_dropped`). Text output prints each interval as it closes and keeps none.
pub(super) const MAX_KEPT_SAMPLES: usize = 100_000;

/// A transfer in progress.
pub(super) struct Meter {
    pub opts: Opts,
    t0: Instant,
    pub wall0: SystemTime,
    cpu0: Cpu,
    pub accepted: HostPort,
    pub streams: Vec<Stream>,
    /// The intervals kept for `--json`, oldest first (none for text).
    pub intervals: VecDeque<Vec<Sample>>,
    /// Samples in [`Meter::intervals`], and the most it may hold.
    kept: usize,
    keep: usize,
    /// Intervals dropped from the front to stay within `keep`.
    pub intervals_dropped: u64,
    /// UDP datagrams from sources past the most a transfer meters, not counted in any stream.
    pub ignored: u64,
    last_tick: Duration,
    headed: bool,
    /// The last line printed was [`SEPARATOR`].
    separated: bool,
    /// `--json-stream`: the `start` event is out.
    streamed_start: bool,
}

impl Meter {
    /// Starts a transfer now; `accepted` is its first peer.
    pub fn new(opts: &Opts, accepted: HostPort) -> Self {
        if !opts.json {
            outln!(
                "Accepted connection from {}, port {}",
                accepted.host,
                accepted.port
            );
        }
        Self {
            opts: opts.clone(),
            t0: Instant::now(),
            wall0: SystemTime::now(),
            cpu0: Cpu::now(),
            accepted,
            streams: Vec::new(),
            intervals: VecDeque::new(),
            kept: 0,
            keep: MAX_KEPT_SAMPLES,
            intervals_dropped: 0,
            ignored: 0,
            last_tick: Duration::ZERO,
            headed: false,
            separated: false,
            streamed_start: false,
        }
    }

    /// Time since the transfer started.
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// The offset of instant `t` from the transfer's start.
    pub fn offset(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.t0)
    }

    /// Adds a stream that starts now; returns its index in [`Meter::streams`].
    pub fn add_stream(&mut self, local: HostPort, remote: HostPort) -> usize {
        let id = FIRST_ID + self.streams.len() as u32;
        if !self.opts.json {
            outln!(
                "[{id:>3}] local {} port {} connected to {} port {}",
                local.host,
                local.port,
                remote.host,
                remote.port
            );
        }
        self.streams.push(Stream {
            id,
            local,
            remote,
            bytes: Arc::new(AtomicU64::new(0)),
            start: self.elapsed(),
            end: None,
            note: None,
            mismatch: None,
            datagrams: Datagrams::default(),
            last_bytes: 0,
            last_datagrams: Datagrams::default(),
        });
        self.streams.len() - 1
    }

    /// When the next interval line is due (`None` without intervals).
    pub fn next_tick(&self) -> Option<Instant> {
        let i = self.opts.interval?;
        Some(self.t0 + self.last_tick + i)
    }

    /// Closes the interval if it is due at `now`.
    pub fn tick(&mut self, now: Instant) {
        if self.next_tick().is_some_and(|t| now >= t) {
            self.close_interval(self.offset(now));
        }
    }

    fn close_interval(&mut self, end: Duration) {
        let start = self.last_tick;
        let mut samples = Vec::new();
        for s in &mut self.streams {
            let live = s.start <= end && s.end.map_or(true, |e| e >= start);
            let bytes = s.bytes.load(Ordering::Relaxed);
            if live {
                samples.push(Sample {
                    id: Some(s.id),
                    start,
                    end,
                    bytes: bytes - s.last_bytes,
                    datagrams: minus(s.datagrams, s.last_datagrams),
                });
            }
            s.last_bytes = bytes;
            s.last_datagrams = s.datagrams;
        }
        self.last_tick = end;
        if samples.is_empty() {
            return;
        }
        let sum = sum_of(&samples, start, end);
        if !self.opts.json {
            if !self.headed {
                outln!("{}", self.column_heads());
                self.headed = true;
            }
            for s in &samples {
                outln!("{}", self.line(s, ""));
            }
            self.separated = samples.len() > 1;
            if self.separated {
                outln!("{}", self.line(&sum, ""));
                outln!("{SEPARATOR}");
            }
        }
        if self.opts.json {
            samples.push(sum);
            if self.opts.json_stream {
                self.stream_start();
                let udp_verify = self.udp_verify();
                json::event("interval", json::interval(&samples, udp_verify));
            } else {
                self.keep_interval(samples);
            }
        }
    }

    /// `--json-stream`: the `start` event, once, with the streams connected so far.
    fn stream_start(&mut self) {
        if !self.streamed_start {
            self.streamed_start = true;
            let cpu = Cpu::now();
            let empty = Sample {
                id: None,
                start: Duration::ZERO,
                end: Duration::ZERO,
                bytes: 0,
                datagrams: Datagrams::default(),
            };
            let verdict = Verdict {
                mismatch: None,
                corrupt: 0,
                cut_short: None,
            };
            let doc = json::document(&self.facts(), &[], &empty, cpu, &verdict);
            json::event("start", doc["start"].clone());
        }
    }

    /// Keeps an interval for the document, dropping the oldest past [`Meter::keep`] samples.
    fn keep_interval(&mut self, samples: Vec<Sample>) {
        self.kept += samples.len();
        self.intervals.push_back(samples);
        while self.kept > self.keep {
            let Some(old) = self.intervals.pop_front() else {
                break;
            };
            self.kept -= old.len();
            self.intervals_dropped += 1;
        }
    }

    /// What a JSON document reports of the transfer.
    fn facts(&self) -> Facts<'_> {
        Facts {
            opts: &self.opts,
            wall0: self.wall0,
            accepted: &self.accepted,
            streams: &self.streams,
            intervals: &self.intervals,
            intervals_dropped: self.intervals_dropped,
            ignored: self.ignored,
        }
    }

    fn udp_verify(&self) -> bool {
        self.opts.proto == Proto::Udp && self.opts.verify
    }

    fn column_heads(&self) -> String {
        let mut h = "[ ID] Interval           Transfer     Bitrate".to_string();
        if self.udp_verify() {
            h.push_str("         Lost/Total Datagrams");
        }
        h
    }

    /// One iperf3 line for a sample, then `tail`.
    fn line(&self, s: &Sample, tail: &str) -> String {
        let id = s.id.map_or("SUM".to_string(), |i| i.to_string());
        let mut t = String::new();
        if self.udp_verify() {
            let d = s.datagrams;
            t = format!("  {}/{} ({})", d.lost, d.packets + d.lost, percent(d));
        }
        t.push_str(tail);
        interval_line(&id, s.start, s.end, s.bytes, &t)
    }

    /// Ends the transfer at `end` (from its start): prints the last interval, the totals and the
    /// verdict (text or JSON).
    pub fn finish(mut self, end: Duration) -> Verdict {
        let cpu1 = Cpu::now();
        if self.opts.interval.is_some()
            && end > self.last_tick + Duration::from_millis(10)
            && self
                .streams
                .iter()
                .any(|s| s.bytes.load(Ordering::Relaxed) > s.last_bytes)
        {
            self.close_interval(end);
        }
        let totals: Vec<Sample> = self
            .streams
            .iter()
            .map(|s| Sample {
                id: Some(s.id),
                start: s.start,
                end: s.end.unwrap_or(end),
                bytes: s.bytes.load(Ordering::Relaxed),
                datagrams: s.datagrams,
            })
            .collect();
        let sum = sum_of(&totals, Duration::ZERO, end);
        let cpu = Cpu {
            user: cpu1.user.saturating_sub(self.cpu0.user),
            system: cpu1.system.saturating_sub(self.cpu0.system),
        };
        let verdict = Verdict {
            mismatch: self
                .streams
                .iter()
                .find_map(|s| s.mismatch.map(|m| (s.id, m))),
            corrupt: sum.datagrams.corrupt,
            cut_short: self
                .streams
                .iter()
                .filter(|_| self.opts.verify)
                .find_map(|s| s.note.clone().map(|n| (s.id, n))),
        };
        if self.opts.json_stream {
            self.stream_start();
            let doc = json::document(&self.facts(), &totals, &sum, cpu, &verdict);
            json::event("end", doc["end"].clone());
        } else if self.opts.json {
            let doc = json::document(&self.facts(), &totals, &sum, cpu, &verdict);
            outln!(
                "{}",
                serde_json::to_string_pretty(&doc).expect("a JSON value prints")
            );
        } else {
            self.print_totals(&totals, &sum, cpu, &verdict);
        }
        verdict
    }

    fn print_totals(&self, totals: &[Sample], sum: &Sample, cpu: Cpu, verdict: &Verdict) {
        if !self.separated {
            outln!("{SEPARATOR}");
        }
        outln!("{}", self.column_heads());
        for (t, s) in totals.iter().zip(&self.streams) {
            let note = s
                .note
                .as_ref()
                .map_or(String::new(), |n| format!("  ({n})"));
            outln!("{}", self.line(t, &format!("  receiver{note}")));
        }
        if totals.len() > 1 {
            outln!("{}", self.line(sum, "  receiver"));
        }
        if self.opts.proto == Proto::Udp {
            let d = sum.datagrams;
            if self.opts.verify {
                outln!(
                    "datagrams: {} received, {} lost, {} out of order, {} corrupt",
                    d.packets,
                    d.lost,
                    d.out_of_order,
                    d.corrupt
                );
            } else {
                outln!("datagrams: {} received", d.packets);
            }
        }
        if self.opts.verify {
            match verdict.mismatch {
                _ if verdict.corrupt > 0 => outln!(
                    "verify: FAILED: {} datagrams are not the generated stream",
                    verdict.corrupt
                ),
                Some((id, at)) => outln!(
                    "verify: FAILED: [{id:>3}] differs from the generated stream at stream offset {at}"
                ),
                None => match &verdict.cut_short {
                    Some((id, why)) => outln!(
                        "verify: FAILED: [{id:>3}] was cut short ({why}): the {} bytes received \
                         are the generated stream, but the sender stopped before its end",
                        sum.bytes
                    ),
                    None => outln!(
                        "verify: all {} bytes are the generated stream",
                        sum.bytes
                    ),
                },
            }
        }
        if self.ignored > 0 {
            outln!(
                "ignored: {} datagrams from sources past the first {}",
                self.ignored,
                MAX_SOURCES
            );
        }
        if let Some(o) = &self.opts.output {
            outln!(
                "output: {} bytes written to {}",
                sum.bytes,
                o.path().display()
            );
        }
        let wall = sum.end.as_secs_f64();
        let secs = cpu_secs(cpu);
        let per_gb = cpu_per_gb(cpu, sum.bytes).map_or("n/a".to_string(), |v| format!("{v:.2}"));
        outln!(
            "CPU: {secs:.2} s ({:.0}% of wall), {per_gb} s/GB (user {:.2} s, system {:.2} s); {}",
            if wall > 0.0 { secs / wall * 100.0 } else { 0.0 },
            cpu.user.as_secs_f64(),
            cpu.system.as_secs_f64(),
            fmt_bitrate(crate::transfer::bitrate(sum.bytes, wall)),
        );
    }
}

/// iperf3's line between interval groups and before the totals.
const SEPARATOR: &str = "- - - - - - - - - - - - - - - - - - - - - - - - -";

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: bool) -> Opts {
        Opts {
            proto: Proto::Tcp,
            verify: false,
            output: None,
            once: true,
            interval: Some(Duration::from_millis(1)),
            idle: Duration::from_secs(1),
            json,
            json_stream: false,
        }
    }

    fn host() -> HostPort {
        HostPort {
            host: "192.0.2.9".into(),
            port: 9,
        }
    }

    /// A transfer that runs for ever cannot grow its kept intervals for ever.
    #[test]
    fn json_keeps_a_bounded_number_of_interval_samples() {
        let mut m = Meter::new(&opts(true), host());
        m.keep = 10;
        m.add_stream(host(), host());
        for ms in 1..=20 {
            m.streams[0].bytes.fetch_add(1, Ordering::Relaxed);
            m.close_interval(Duration::from_millis(ms));
        }
        // Two samples per interval (the stream's and the sum): the last five intervals.
        assert_eq!(m.intervals.len(), 5);
        assert_eq!(m.intervals_dropped, 15);
        assert_eq!(m.intervals[0][0].end, Duration::from_millis(16));
    }

    #[test]
    fn text_output_keeps_no_intervals() {
        let mut m = Meter::new(&opts(false), host());
        m.add_stream(host(), host());
        m.close_interval(Duration::from_millis(1));
        assert!(m.intervals.is_empty());
    }
}
