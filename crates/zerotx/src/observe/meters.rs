//! One sender's share of the process-wide metrics (feature `metrics`, on the `metrics` crate's
//! facade: whatever recorder the program installed gets them). Every name starts `zerotx_`, and
//! every series has the label `engine` (the engine asked for: `auto`, `msg-zc`, ...):
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `zerotx_sends_total` | counter | buffers accepted ([`Stats::sends`]) |
//! | `zerotx_bytes_total` | counter | bytes the kernel accepted ([`Stats::bytes`]) |
//! | `zerotx_released_buffers_total{path}` | counter | buffers released, by path (below) |
//! | `zerotx_released_bytes_total{path}` | counter | their bytes ([`Report::bytes`](crate::Report::bytes)) |
//! | `zerotx_budget_refusals_total` | counter | [`Stats::enobufs`] |
//! | `zerotx_probes_total`, `zerotx_probes_paid_total` | counter | [`Stats::probes`], [`Stats::probes_paid`] |
//! | `zerotx_switches_to_copy_total` | counter | [`Stats::switches_to_copy`] |
//! | `zerotx_cap_waits_total` | counter | [`Stats::cap_waits`] |
//! | `zerotx_bad_completions_total` | counter | [`Stats::bad_completions`] |
//! | `zerotx_failed_buffers_total` | counter | [`Stats::errors`] |
//! | `zerotx_kept_buffers_total` | counter | buffers kept at a close ([`Closed::kept`](crate::Closed::kept)) |
//! | `zerotx_zerocopy_in_flight`, `zerotx_pinned_bytes` | gauge | the budget gauges of [`Stats`], summed over live senders |
//! | `zerotx_cap_sends`, `zerotx_cap_bytes` | gauge | `auto`'s caps, summed over live senders that have them |
//! | `zerotx_release_latency_seconds` | histogram | [`Report::latency`](crate::Report::latency) (one release in 61 carries it) |
//!
//! `path` is `zerocopy`, or `copied_` and the [`CopyReason`]: `copied_kernel`, `copied_engine`,
//! `copied_fallback`, `copied_small`, `copied_route`, `copied_budget`.

use std::sync::Once;

use metrics::{Counter, Gauge, Histogram};

use super::delta;
use crate::kind::EngineKind;
use crate::report::{CopyReason, Released, SendPath, Stats};

/// The `path` labels, in [`path_index`] order.
const PATHS: [&str; 7] = [
    "zerocopy",
    "copied_kernel",
    "copied_engine",
    "copied_fallback",
    "copied_small",
    "copied_route",
    "copied_budget",
];

/// Where `path` is in [`PATHS`].
fn path_index(path: SendPath) -> usize {
    match path {
        SendPath::ZeroCopy => 0,
        SendPath::Copied(CopyReason::Kernel) => 1,
        SendPath::Copied(CopyReason::Engine) => 2,
        SendPath::Copied(CopyReason::Fallback) => 3,
        SendPath::Copied(CopyReason::Small) => 4,
        SendPath::Copied(CopyReason::RouteCopies) => 5,
        SendPath::Copied(CopyReason::Budget) => 6,
    }
}

/// The released-buffer counters of `s`, in [`PATHS`] order.
fn released_by_path(s: &Stats) -> [u64; 7] {
    [
        s.zerocopy,
        s.kernel_copied,
        s.engine_copied,
        s.fallbacks,
        s.copied_small,
        s.copied_route,
        s.copied_budget,
    ]
}

/// A counter of `Stats` and the metric it feeds.
type Fed = (fn(&Stats) -> u64, Counter);

/// One sender's handles, made once with its labels, so a reap adds without looking a name up.
pub(super) struct Meters {
    /// Counters fed by one field of `Stats` each.
    fed: Vec<Fed>,
    released: [Counter; 7],
    released_bytes: [Counter; 7],
    kept: Counter,
    in_flight: Gauge,
    pinned: Gauge,
    cap_sends: Gauge,
    cap_bytes: Gauge,
    latency: Histogram,
}

impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meters")
            .field("counters", &(self.fed.len() + 15))
            .finish_non_exhaustive()
    }
}

/// Says once per process what each metric means.
fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!("zerotx_sends_total", "Buffers accepted by zerotx senders");
        describe_counter!(
            "zerotx_bytes_total",
            Unit::Bytes,
            "Bytes the kernel accepted"
        );
        describe_counter!(
            "zerotx_released_buffers_total",
            "Buffers released, by path: zero-copy or copied and why"
        );
        describe_counter!(
            "zerotx_released_bytes_total",
            Unit::Bytes,
            "Bytes of released buffers, by path"
        );
        describe_counter!(
            "zerotx_budget_refusals_total",
            "Zero-copy budget refusals (ENOBUFS, ENOMEM)"
        );
        describe_counter!(
            "zerotx_probes_total",
            "auto's zero-copy probes of a copying route"
        );
        describe_counter!(
            "zerotx_probes_paid_total",
            "Probes that came back not copied"
        );
        describe_counter!(
            "zerotx_switches_to_copy_total",
            "Times auto switched to copying"
        );
        describe_counter!(
            "zerotx_cap_waits_total",
            "Sends that waited at auto's in-flight cap"
        );
        describe_counter!(
            "zerotx_bad_completions_total",
            "Completions the ledger refused"
        );
        describe_counter!(
            "zerotx_failed_buffers_total",
            "Buffers released with an error"
        );
        describe_counter!(
            "zerotx_kept_buffers_total",
            "Buffers kept at a close, never freed early"
        );
        describe_gauge!(
            "zerotx_zerocopy_in_flight",
            "Zero-copy sends the kernel still holds"
        );
        describe_gauge!(
            "zerotx_pinned_bytes",
            Unit::Bytes,
            "Bytes pinned by zero-copy sends"
        );
        describe_gauge!(
            "zerotx_cap_sends",
            "auto's caps on zero-copy sends in flight, summed"
        );
        describe_gauge!(
            "zerotx_cap_bytes",
            Unit::Bytes,
            "auto's caps on pinned bytes, summed"
        );
        describe_histogram!(
            "zerotx_release_latency_seconds",
            Unit::Seconds,
            "From a send to its release, sampled"
        );
    });
}

impl Meters {
    /// The handles of a sender of engine `kind`.
    pub(super) fn new(kind: EngineKind) -> Self {
        describe();
        let engine = kind.to_string();
        let counter = |name: &'static str| metrics::counter!(name, "engine" => engine.clone());
        let gauge = |name: &'static str| metrics::gauge!(name, "engine" => engine.clone());
        let by_path = |name: &'static str| {
            PATHS.map(|p| metrics::counter!(name, "engine" => engine.clone(), "path" => p))
        };
        let fed: Vec<Fed> = vec![
            (|s| s.sends, counter("zerotx_sends_total")),
            (|s| s.bytes, counter("zerotx_bytes_total")),
            (|s| s.enobufs, counter("zerotx_budget_refusals_total")),
            (|s| s.probes, counter("zerotx_probes_total")),
            (|s| s.probes_paid, counter("zerotx_probes_paid_total")),
            (
                |s| s.switches_to_copy,
                counter("zerotx_switches_to_copy_total"),
            ),
            (|s| s.cap_waits, counter("zerotx_cap_waits_total")),
            (
                |s| s.bad_completions,
                counter("zerotx_bad_completions_total"),
            ),
            (|s| s.errors, counter("zerotx_failed_buffers_total")),
        ];
        Self {
            fed,
            released: by_path("zerotx_released_buffers_total"),
            released_bytes: by_path("zerotx_released_bytes_total"),
            kept: counter("zerotx_kept_buffers_total"),
            in_flight: gauge("zerotx_zerocopy_in_flight"),
            pinned: gauge("zerotx_pinned_bytes"),
            cap_sends: gauge("zerotx_cap_sends"),
            cap_bytes: gauge("zerotx_cap_bytes"),
            latency: metrics::histogram!("zerotx_release_latency_seconds", "engine" => engine),
        }
    }

    /// Adds what moved between `last` and `now`, and the bytes and latencies of `released`.
    pub(super) fn changed<B>(&self, last: &Stats, now: &Stats, released: &[Released<B>]) {
        for (field, counter) in &self.fed {
            let n = delta(field(last), field(now));
            if n > 0 {
                counter.increment(n);
            }
        }
        let (was, is) = (released_by_path(last), released_by_path(now));
        for (i, counter) in self.released.iter().enumerate() {
            let n = delta(was[i], is[i]);
            if n > 0 {
                counter.increment(n);
            }
        }
        let mut bytes = [0u64; 7];
        for r in released {
            bytes[path_index(r.report.path)] += r.report.bytes as u64;
            if let Some(l) = r.report.latency {
                self.latency.record(l.as_secs_f64());
            }
        }
        for (counter, n) in self.released_bytes.iter().zip(bytes) {
            if n > 0 {
                counter.increment(n);
            }
        }
        move_gauge(
            &self.in_flight,
            last.zerocopy_in_flight,
            now.zerocopy_in_flight,
        );
        move_gauge(&self.pinned, last.pinned_bytes, now.pinned_bytes);
        let cap = |c: Option<u64>| c.unwrap_or(0);
        move_gauge(&self.cap_sends, cap(last.cap_sends), cap(now.cap_sends));
        move_gauge(&self.cap_bytes, cap(last.cap_bytes), cap(now.cap_bytes));
    }

    /// The sender is gone: `kept` buffers were kept, and its gauges (`last`) come off the sums.
    pub(super) fn closed(&self, last: &Stats, kept: usize) {
        if kept > 0 {
            self.kept.increment(kept as u64);
        }
        move_gauge(&self.in_flight, last.zerocopy_in_flight, 0);
        move_gauge(&self.pinned, last.pinned_bytes, 0);
        move_gauge(&self.cap_sends, last.cap_sends.unwrap_or(0), 0);
        move_gauge(&self.cap_bytes, last.cap_bytes.unwrap_or(0), 0);
    }
}

/// Moves a process-wide gauge by this sender's change from `was` to `is`.
fn move_gauge(g: &Gauge, was: u64, is: u64) {
    if is > was {
        g.increment((is - was) as f64);
    } else if was > is {
        g.decrement((was - is) as f64);
    }
}
