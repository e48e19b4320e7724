//! [`Explanation`]: why zero-copy is or is not engaged on a sender, in plain words. The engine
//! factory and the sender hand over what they decided ([`Note`]s) and what `auto`'s policy holds
//! ([`AutoFacts`]); every sentence a user reads is written here.

use std::fmt;

use super::copiers::PathFacts;
use super::Stats;
use crate::kind::EngineKind;

/// [`Explanation::path`] of the io_uring engines.
pub(crate) const URING: &str = "io_uring";
/// [`Explanation::path`] of the `sendmsg(2)` engines that may send zero-copy.
pub(crate) const SENDMSG: &str = "sendmsg";
/// [`Explanation::path`] of `auto` on a socket without zero-copy.
pub(crate) const COPY_ONLY: &str = "sendmsg (copy only)";

/// Why zero-copy is or is not engaged on a sender's socket: [`Sender::explain`](crate::Sender::explain).
/// `Display` prints it as plain sentences.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Explanation {
    /// The engine asked for.
    pub engine: EngineKind,
    /// The system calls in use: `io_uring`, `sendmsg`, or `sendmsg (copy only)`.
    pub path: &'static str,
    /// Whether sends large enough go zero-copy now.
    pub zerocopy: bool,
    /// The reasons, one sentence each.
    pub lines: Vec<String>,
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "engine {} over {}: zero-copy {}",
            self.engine,
            self.path,
            if self.zerocopy {
                "engaged"
            } else {
                "not engaged"
            }
        )?;
        for l in &self.lines {
            writeln!(f, "  - {l}")?;
        }
        Ok(())
    }
}

/// One decision the engine factory or the sender made about how this sender sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// The caller named this engine.
    Asked(EngineKind),
    /// `auto`: the configuration ruled io_uring out (`auto_uring: false`).
    UringRuledOut,
    /// `auto` chose io_uring.
    UringChosen,
    /// `auto` chose io_uring on a kernel whose zero-copy requests do not report copies (a shared
    /// ring was asked for).
    UringBlind,
    /// `auto`: io_uring could not be set up (the error, in words); `sendmsg(2)` instead.
    UringRefused(String),
    /// `auto`: io_uring's zero-copy requests do not report copies; `sendmsg(MSG_ZEROCOPY)` does.
    UringCannotLearn,
    /// `auto`: io_uring has no zero-copy requests.
    UringWithoutZerocopy,
    /// `auto`: io_uring is not available (the error, in words).
    UringUnavailable(String),
    /// `auto` chose `sendmsg(2)` with `MSG_ZEROCOPY`.
    SendmsgZerocopy,
    /// `auto`: the socket has no zero-copy (the error, in words).
    NoZerocopy(String),
    /// `auto`: the peer is on loopback, so it copies from the first send.
    Loopback,
    /// `auto`: a pool on huge pages was offered for registration and not registered.
    HugePoolNotRegistered,
    /// `auto` on `sendmsg(2)`: a pool was offered for registration, which it has no use for.
    PoolWithoutRegisteredSends,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Asked(kind) if kind.is_zerocopy() => write!(
                f,
                "the {kind} engine was asked for: every send asks for zero-copy"
            ),
            Note::Asked(kind) => write!(f, "the {kind} engine was asked for"),
            Note::UringRuledOut => {
                f.write_str("io_uring was ruled out by the configuration (auto_uring: false)")
            }
            Note::UringChosen => f.write_str(
                "io_uring: the kernel has zero-copy requests and reports whether it copied them, \
                 and io_uring sends many buffers per system call",
            ),
            Note::UringBlind => f.write_str(
                "this kernel's io_uring does not say whether it copied \
                 (IORING_SEND_ZC_REPORT_USAGE, 6.2): zero-copy stays on for sends above the size \
                 threshold",
            ),
            Note::UringRefused(e) => write!(f, "io_uring refused ({e}): using sendmsg(2)"),
            Note::UringCannotLearn => f.write_str(
                "this kernel's io_uring does not say whether it copied a zero-copy send \
                 (IORING_SEND_ZC_REPORT_USAGE, 6.2): using sendmsg(MSG_ZEROCOPY), whose \
                 completions do",
            ),
            Note::UringWithoutZerocopy => f.write_str(
                "this kernel's io_uring lacks SEND_ZC/SENDMSG_ZC (6.1): using sendmsg(2)",
            ),
            Note::UringUnavailable(e) => write!(f, "io_uring unavailable ({e}): using sendmsg(2)"),
            Note::SendmsgZerocopy => f.write_str("sendmsg(2) with MSG_ZEROCOPY where it pays"),
            Note::NoZerocopy(e) => write!(f, "no zero-copy on this socket: {e}"),
            Note::Loopback => f.write_str(
                "the peer is on loopback, where the kernel copies every zero-copy send on \
                 delivery: copying from the first send",
            ),
            Note::HugePoolNotRegistered => f.write_str(
                "a pool on huge pages (BufPool::huge) was offered for registration: it is not \
                 registered, and its buffers go as any other",
            ),
            Note::PoolWithoutRegisteredSends => f.write_str(
                "a pool was registered, but sendmsg(2) has no registered sends: its buffers go \
                 as any other",
            ),
        }
    }
}

/// What `auto`'s policy holds now, as [`explain`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AutoFacts {
    /// The size from which a send from the caller's memory goes zero-copy.
    pub(crate) threshold: usize,
    /// The same, from a registered pool.
    pub(crate) registered_threshold: usize,
    /// How often the online tuner moved the threshold, and the default it started from.
    pub(crate) tuned: (u32, usize),
    /// The cap on zero-copy sends in flight, if any.
    pub(crate) cap_sends: Option<usize>,
    /// The cap on bytes pinned by zero-copy sends, if any.
    pub(crate) cap_bytes: Option<usize>,
    /// At a cap, sends wait for completions (`true`) or are copied (`false`).
    pub(crate) waits_at_cap: bool,
    /// The kernel says whether it copied a zero-copy send.
    pub(crate) reports_copies: bool,
    /// The route copies: the next zero-copy probe goes in this many sends.
    pub(crate) next_probe_in: Option<u64>,
}

/// The explanation of a sender of `engine` over `path`, from the decisions made when it was built
/// and since (`notes`), `auto`'s policy (`auto`), what lies on the socket's way out (`way`) and
/// the counters.
pub(crate) fn explain(
    engine: EngineKind,
    path: &'static str,
    notes: &[Note],
    auto: Option<AutoFacts>,
    way: &PathFacts,
    stats: &Stats,
) -> Explanation {
    let mut lines: Vec<String> = notes.iter().map(Note::to_string).collect();
    let copies_all = way.copies_all();
    let mut zerocopy = engine.is_zerocopy() && path != COPY_ONLY && !copies_all;
    if let Some(a) = auto {
        auto_lines(&a, &mut lines);
        if a.next_probe_in.is_some() {
            zerocopy = false;
        } else if stats.zerocopy > 0 && !copies_all {
            lines.push("zero-copy is ON: the kernel sends from your buffers".into());
        }
    }
    lines.extend(way.lines(notes.contains(&Note::Loopback)));
    if let Some(line) = released_line(stats) {
        lines.push(line);
    }
    lines.extend(trains_line(stats));
    Explanation {
        engine,
        path,
        zerocopy,
        lines,
    }
}

/// `auto`'s threshold, caps and route, one sentence each.
fn auto_lines(a: &AutoFacts, lines: &mut Vec<String>) {
    let (moves, start) = a.tuned;
    let tuned = if moves > 0 {
        format!("; tuned online {moves} times from the default {start}")
    } else {
        String::new()
    };
    lines.push(if a.threshold == a.registered_threshold {
        format!(
            "sends of {} bytes and more go zero-copy{tuned}",
            a.threshold
        )
    } else {
        format!(
            "sends of {} bytes and more go zero-copy ({} from a registered pool){tuned}",
            a.threshold, a.registered_threshold
        )
    });
    if let Some(c) = a.cap_sends {
        lines.push(format!(
            "at most {c} zero-copy sends in flight (half of optmem_max in completions)"
        ));
    }
    if let Some(c) = a.cap_bytes {
        lines.push(format!(
            "at most {c} bytes pinned by zero-copy sends (half of RLIMIT_MEMLOCK)"
        ));
    }
    if a.cap_sends.is_some() || a.cap_bytes.is_some() {
        lines.push(format!(
            "at a cap, or after the kernel refused the budget, sends {}",
            if a.waits_at_cap {
                "wait for completions"
            } else {
                "are copied for a while"
            }
        ));
    }
    if !a.reports_copies {
        lines.push("the kernel does not report copied sends here".into());
    }
    if let Some(n) = a.next_probe_in {
        lines.push(format!(
            "zero-copy is OFF: most zero-copy sends came back copied by the kernel (the peer is \
             local, or the device cannot send from user pages); a probe goes zero-copy in {n} \
             sends, and zero-copy comes back when one is not copied"
        ));
    }
}

/// How the buffers released so far went, if any was.
fn released_line(stats: &Stats) -> Option<String> {
    let sent = stats.zerocopy
        + stats.kernel_copied
        + stats.engine_copied
        + stats.fallbacks
        + stats.copied_small
        + stats.copied_route
        + stats.copied_budget;
    (sent > 0).then(|| {
        format!(
            "released so far: {} zero-copy, {} copied by the kernel, {} below the size, {} while \
             the route copied, {} for the budget, {} after ENOBUFS, {} by a copy engine",
            stats.zerocopy,
            stats.kernel_copied,
            stats.copied_small,
            stats.copied_route,
            stats.copied_budget,
            stats.fallbacks,
            stats.engine_copied
        )
    })
}

/// How trains (UDP GSO) went, if any was sent.
fn trains_line(stats: &Stats) -> Option<String> {
    (stats.trains > 0).then(|| {
        let mut line = format!("{} trains of datagrams sent as UDP GSO", stats.trains);
        if stats.batch_train_buffers > 0 {
            line += &format!(
                " ({} buffers of batches went in them: runs of one size, one system call or io_uring request each)",
                stats.batch_train_buffers
            );
        }
        if stats.train_splits > 0 {
            line += &format!(
                "; {} destination(s) refused a train as one GSO packet (EIO: the device or the \
                 route cannot checksum it), so their trains go one datagram per call or request, by copy",
                stats.train_splits
            );
        }
        line
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> PathFacts {
        PathFacts::default()
    }

    fn facts() -> AutoFacts {
        AutoFacts {
            threshold: 16384,
            registered_threshold: 16384,
            tuned: (0, 16384),
            cap_sends: None,
            cap_bytes: None,
            waits_at_cap: false,
            reports_copies: true,
            next_probe_in: None,
        }
    }

    #[test]
    fn an_engine_asked_for_by_name_says_whether_every_send_asks_for_zero_copy() {
        assert_eq!(
            Note::Asked(EngineKind::Copy).to_string(),
            "the copy engine was asked for"
        );
        assert_eq!(
            Note::Asked(EngineKind::UringZc).to_string(),
            "the uring-zc engine was asked for: every send asks for zero-copy"
        );
        let x = explain(
            EngineKind::Copy,
            SENDMSG,
            &[Note::Asked(EngineKind::Copy)],
            None,
            &PathFacts::default(),
            &Stats::default(),
        );
        assert!(!x.zerocopy);
        assert_eq!(x.lines, ["the copy engine was asked for"]);
    }

    #[test]
    fn auto_without_zero_copy_on_the_socket_is_not_engaged() {
        let notes = [Note::NoZerocopy("EOPNOTSUPP".into())];
        let x = explain(
            EngineKind::Auto,
            COPY_ONLY,
            &notes,
            None,
            &PathFacts::default(),
            &Stats::default(),
        );
        assert!(!x.zerocopy);
        assert!(x.to_string().contains("zero-copy not engaged"), "{x}");
    }

    #[test]
    fn a_route_that_copies_turns_zero_copy_off_until_a_probe_pays() {
        let stats = Stats {
            zerocopy: 3,
            ..Stats::default()
        };
        let on = explain(EngineKind::Auto, URING, &[], Some(facts()), &none(), &stats);
        assert!(on.zerocopy);
        assert!(on.lines.iter().any(|l| l.starts_with("zero-copy is ON")));
        let probing = AutoFacts {
            next_probe_in: Some(7),
            ..facts()
        };
        let off = explain(EngineKind::Auto, URING, &[], Some(probing), &none(), &stats);
        assert!(!off.zerocopy);
        assert!(off
            .lines
            .iter()
            .any(|l| l.contains("a probe goes zero-copy in 7 sends")));
        assert!(!off.lines.iter().any(|l| l.starts_with("zero-copy is ON")));
    }

    #[test]
    fn caps_and_what_happens_at_them_are_named() {
        let capped = AutoFacts {
            cap_sends: Some(10),
            cap_bytes: Some(1 << 20),
            waits_at_cap: true,
            registered_threshold: 4096,
            tuned: (2, 8192),
            ..facts()
        };
        let x = explain(
            EngineKind::Auto,
            SENDMSG,
            &[],
            Some(capped),
            &PathFacts::default(),
            &Stats::default(),
        );
        let text = x.to_string();
        for want in [
            "sends of 16384 bytes and more go zero-copy (4096 from a registered pool); tuned \
             online 2 times from the default 8192",
            "at most 10 zero-copy sends in flight",
            "at most 1048576 bytes pinned",
            "sends wait for completions",
        ] {
            assert!(text.contains(want), "{want:?} missing from {text}");
        }
        assert!(!text.contains("released so far"), "{text}");
    }
}
