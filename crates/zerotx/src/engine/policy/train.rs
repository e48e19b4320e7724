//! Trains, pure: what a train of datagrams (one buffer cut by the kernel into `segment`-byte
//! datagrams, UDP GSO) may be, what a refused train becomes, and which paths send a train one
//! datagram per call. The kernel's rules behind them: docs/kernel.md, "UDP GSO trains".
//!
//! - [`check`]: refused before any call (the buffer handed back with a reason): a segment of 0,
//!   more segments than the kernel takes in one call ([`max_segments`], the version rule, and
//!   where it says 64, [`segment_limit`]: a probe train, the first time a train needs more),
//!   more bytes than one GSO packet carries ([`max_train_bytes`]).
//! - [`on_failure`]: a train call that failed. `EIO` (the device or the route cannot checksum
//!   a GSO packet, as before 6.11 without checksum offload, or an IPsec route) sends the train
//!   one datagram per call, by copy, and the path is remembered ([`SplitPaths`]); the budget's
//!   `ENOBUFS` (no id taken) is answered as for any datagram; anything else is the buffer's
//!   error: the kernel refused the train after building it (the segment does not fit the path
//!   MTU, a netfilter or qdisc drop), so nothing of it went and nothing is sent twice.
//! - [`auto_copies`]: `auto` copies a train below [`AUTO_ZEROCOPY_MIN`] bytes without asking its
//!   per-send rules, which then decide for the larger ones (budget, a route that copies, probes).

use std::collections::HashSet;

use socket2::SockAddr;

use crate::kind::{Family, SockKind, SockType};

/// A record that is a train: its segment size, and whether it goes one datagram per call (its
/// path refused GSO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Train {
    /// Bytes per datagram; the last may be shorter.
    pub(crate) segment: u16,
    /// One datagram per call, by copy ([`on_failure`]'s [`TrainFailure::Split`]).
    pub(crate) split: bool,
}

impl Train {
    pub(crate) fn new(segment: u16) -> Self {
        Self {
            segment,
            split: false,
        }
    }

    /// How many datagrams `len` bytes make.
    pub(crate) fn count(self, len: usize) -> usize {
        len.div_ceil(usize::from(self.segment.max(1)))
    }
}

/// Whether a socket of `kind` sends trains: UDP on IPv4 or IPv6, the protocol of `UDP_SEGMENT`,
/// and UDP-Lite, which takes the option but refuses every train with `EIO` (it never checksums a
/// GSO packet), so its trains go one datagram per call ([`TrainFailure::Split`]).
pub(crate) fn carries_trains(kind: SockKind) -> bool {
    matches!(kind.family, Family::Inet4 | Family::Inet6)
        && kind.ty == SockType::Dgram
        && matches!(kind.protocol, libc::IPPROTO_UDP | libc::IPPROTO_UDPLITE)
}

/// `UDP_MAX_SEGMENTS` before Linux 6.9: the segments one call may carry.
pub(crate) const MAX_SEGMENTS_OLD: u16 = 64;
/// `UDP_MAX_SEGMENTS` from Linux 6.9 (commit 1382e3b6a350), and on the stable kernels that took
/// the change (Debian's 6.1 and 6.12: docs/kernel.md, "UDP GSO trains: the kernel's limits,
/// measured"), which [`segment_limit`]'s probe finds.
pub(crate) const MAX_SEGMENTS_NEW: u16 = 128;

/// The version rule: the segments one train call may carry on the kernel whose release string is
/// `release` (`uname -r`): [`MAX_SEGMENTS_NEW`] from 6.9, [`MAX_SEGMENTS_OLD`] before and when the
/// string cannot be read. A kernel before 6.9 may take more (a backport): [`segment_limit`].
pub(crate) fn max_segments(release: &str) -> u16 {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if (major, minor) >= (6, 9) => MAX_SEGMENTS_NEW,
        _ => MAX_SEGMENTS_OLD,
    }
}

/// The segments of the probe train (one byte each): the newer limit, so a kernel that takes it
/// takes every train up to it, and one that refuses it (`EINVAL`) keeps the older limit, even if
/// some kernel had a limit in between.
pub(crate) const PROBE_SEGMENTS: u16 = MAX_SEGMENTS_NEW;

/// The segment limit that decides a train of `count` segments, under the version rule's `rule`:
/// `rule`, unless the train is above it and within [`MAX_SEGMENTS_NEW`] (a backport may take
/// it). Only then is `probe` asked; where it has no answer (it could not run), `rule`.
pub(crate) fn segment_limit(count: usize, rule: u16, probe: impl FnOnce() -> Option<u16>) -> u16 {
    if count <= usize::from(rule) || count > usize::from(MAX_SEGMENTS_NEW) {
        return rule;
    }
    probe().unwrap_or(rule)
}

/// What the probe train of [`PROBE_SEGMENTS`] one-byte datagrams says about the kernel's limit:
/// `sent` is the call's answer (bytes, or the errno), `first` the length of the first datagram
/// read back. `None` where it says nothing about the kernel (the probe could not run: loopback
/// down, a socket refused, nothing read back), to be asked again later, never kept.
pub(crate) fn probed_limit(sent: Result<usize, Option<i32>>, first: Option<usize>) -> Option<u16> {
    match (sent, first) {
        // Taken, and cut into one-byte datagrams: the kernel takes the newer limit.
        (Ok(n), Some(1)) if n == usize::from(PROBE_SEGMENTS) => Some(MAX_SEGMENTS_NEW),
        // Taken whole as one datagram: the kernel ignored `UDP_SEGMENT` (before 4.18, no GSO),
        // so none of its trains goes as one; the older limit is as safe as any.
        (Ok(_), Some(n)) if n > 1 => Some(MAX_SEGMENTS_OLD),
        // Refused as more segments than one call carries (`udp_send_skb`).
        (Err(Some(libc::EINVAL)), _) => Some(MAX_SEGMENTS_OLD),
        _ => None,
    }
}

/// The payload one GSO packet carries: the IP length field's 65535 less the headers (IPv4: 20 +
/// 8; IPv6, whose length field leaves out its own header: 8).
pub(crate) fn max_train_bytes(v6: bool) -> usize {
    if v6 {
        65_535 - 8
    } else {
        65_535 - 20 - 8
    }
}

/// The train bytes from which `auto` sends a train zero-copy. Below it a GSO copy costs less CPU
/// per byte than the pinning and the completion of a zero-copy train; above it, less than the copy
/// (the figures, per train length and segment size, with and without segmentation offload:
/// `examples/train_cost.rs`, benches/HISTORY.md, "Trains").
pub(crate) const AUTO_ZEROCOPY_MIN: usize = 32 * 1024;

/// Whether `auto` copies a train of `len` bytes whatever its per-send rules say.
pub(crate) fn auto_copies(len: usize) -> bool {
    len < AUTO_ZEROCOPY_MIN
}

/// [`check`]'s reasons.
pub(crate) const ZERO_SEGMENT: &str = "a train's segment size is 0: give the datagram size, \
                                       at least 1 byte";
pub(crate) const TOO_MANY_SEGMENTS: &str =
    "the train has more segments than this kernel takes in one call (UDP_MAX_SEGMENTS: 128 \
     since Linux 6.9 and on older kernels that took the change, as the kernel answered a probe; \
     64 on the others): send it as several trains, or use a larger segment";
pub(crate) const TOO_LONG: &str = "the train is longer than one UDP GSO packet carries (65507 \
                                   bytes on IPv4, 65527 on IPv6): send it as several trains";
pub(crate) const NOT_DATAGRAMS: &str =
    "trains are for UDP sockets: a stream has no datagrams to cut; use send/send_batch";
pub(crate) const NO_GSO_ENGINE: &str =
    "this engine sends no trains (it holds no datagram socket): send trains on a UDP socket";

/// Whether a train of `len` bytes in `segment`-byte datagrams may go (one call carries at most
/// `max_segments(count)` segments, asked with the train's count: [`segment_limit`]), on an IPv6
/// socket if `v6`.
pub(crate) fn check(
    len: usize,
    segment: u16,
    v6: bool,
    max_segments: impl FnOnce(usize) -> u16,
) -> Result<(), &'static str> {
    if segment == 0 {
        return Err(ZERO_SEGMENT);
    }
    if len > max_train_bytes(v6) {
        return Err(TOO_LONG);
    }
    let count = Train::new(segment).count(len);
    if count > usize::from(max_segments(count)) {
        return Err(TOO_MANY_SEGMENTS);
    }
    Ok(())
}

/// What a train call that failed with `errno` (not `EAGAIN`) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TrainFailure {
    /// The zero-copy budget (no id taken): as for any datagram.
    Budget,
    /// The path cannot send it as one GSO packet (`EIO`): one datagram per call, by copy, and
    /// the path remembered. Nothing of it went.
    Split,
    /// The buffer's error (the kernel's, kept as it gave it), never retried; `Some` with what to
    /// do ([`crate::error::advice`]) where the kernel refused the train as built: its segments
    /// or its size do not fit the path or the kernel's limits.
    Fail(Option<&'static str>),
}

/// The answer to a train call that failed with `errno`, once the engine knows whether it took a
/// zero-copy id (`took_id`; always `false` for a copy).
pub(crate) fn on_failure(errno: Option<i32>, took_id: bool) -> TrainFailure {
    match errno {
        Some(libc::EIO) => TrainFailure::Split,
        Some(libc::ENOBUFS) if !took_id => TrainFailure::Budget,
        Some(e @ (libc::EMSGSIZE | libc::EINVAL)) => TrainFailure::Fail(crate::error::advice(e)),
        _ => TrainFailure::Fail(None),
    }
}

/// What limits a run of a batch's buffers sent as one train ([`batch_run`]): the kernel's
/// segments per call and bytes per GSO packet, and the largest datagram the path carries
/// unfragmented (a segment above it is refused after the skb was built: never a candidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunLimits {
    pub(crate) max_segments: u16,
    pub(crate) max_bytes: usize,
    pub(crate) max_segment: usize,
}

/// How many buffers from the front of a batch (`lens`: their lengths, front first) go as one
/// train, and its segment size: consecutive buffers of the first one's size, the last of the run
/// possibly shorter (it ends the run), within `limits`. `None` when fewer than two would go: a
/// lone datagram is no train. The kernel cuts a train by bytes across its iovecs
/// (`udp_sendmsg` builds one skb of the whole message, `__udp_gso_segment` cuts it every
/// `gso_size` bytes), so buffer `i` of the run is datagram `i`.
pub(crate) fn batch_run(
    mut lens: impl Iterator<Item = usize>,
    limits: RunLimits,
) -> Option<(usize, u16)> {
    let first = lens.next()?;
    if first == 0 || first > limits.max_segment || first > usize::from(u16::MAX) {
        return None;
    }
    let (mut count, mut bytes) = (1usize, first);
    for len in lens {
        if count >= usize::from(limits.max_segments)
            || len == 0
            || len > first
            || bytes + len > limits.max_bytes
        {
            break;
        }
        count += 1;
        bytes += len;
        if len < first {
            break;
        }
    }
    (count >= 2).then_some((count, first as u16))
}

/// The page fragments one zero-copy skb holds (`MAX_SKB_FRAGS`, 17 unless the kernel was built
/// with more): `__zerocopy_sg_from_iter` pins the caller's pages into the skb's fragments, one
/// iovec at a time, and answers `EMSGSIZE` for the whole call (no id taken, measured on 6.18)
/// when they run out, or when an iovec begins once all are taken, even one that would continue
/// the last fragment. A fragment grows only over contiguous bytes of one page, so a train from
/// one buffer of 64 KiB fits, and a run of separate buffers takes at least one fragment each.
pub(crate) const ZEROCOPY_FRAGS: usize = 17;

/// How many buffers of a run (`spans`: each buffer's address and length, in order) fit one
/// zero-copy skb's [`ZEROCOPY_FRAGS`] fragments, counted as the kernel fills them: a new
/// fragment per page, except where a buffer continues the previous one's bytes in the same page;
/// no buffer begins once every fragment is taken.
pub(crate) fn zerocopy_run_len(spans: impl Iterator<Item = (usize, usize)>) -> usize {
    const PAGE: usize = 4096;
    let (mut frags, mut end, mut count) = (0usize, None::<usize>, 0usize);
    for (addr, len) in spans {
        if frags == ZEROCOPY_FRAGS {
            break;
        }
        let mut at = addr;
        let stop = addr + len;
        let mut need = frags;
        let mut last = end;
        while at < stop {
            let page_end = (at / PAGE + 1) * PAGE;
            if last != Some(at) || at % PAGE == 0 {
                need += 1;
            }
            let upto = page_end.min(stop);
            last = Some(upto);
            at = upto;
        }
        if need > ZEROCOPY_FRAGS {
            break;
        }
        (frags, end, count) = (need, last, count + 1);
    }
    count
}

/// Destinations remembered as refusing GSO before the memory is cleared.
const SPLIT_CACHE: usize = 1024;

/// The paths that refused a train with `EIO` ([`TrainFailure::Split`]): their trains go one
/// datagram per call from then on, without asking the kernel again.
#[derive(Debug, Default)]
pub(crate) struct SplitPaths {
    connected: bool,
    by_dest: HashSet<SockAddr>,
}

impl SplitPaths {
    /// Whether trains to `dest` (the connected peer if `None`) go one datagram per call.
    pub(crate) fn splits(&self, dest: Option<&SockAddr>) -> bool {
        match dest {
            None => self.connected,
            Some(d) => !self.by_dest.is_empty() && self.by_dest.contains(d),
        }
    }

    /// The path to `dest` refused a train as one GSO packet.
    pub(crate) fn refused(&mut self, dest: Option<&SockAddr>) {
        match dest {
            None => self.connected = true,
            Some(d) => {
                if self.by_dest.len() >= SPLIT_CACHE {
                    self.by_dest.clear();
                }
                self.by_dest.insert(d.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{EINVAL, EIO, EMSGSIZE, ENOBUFS, EPERM};

    #[test]
    fn segment_limits_by_kernel_release() {
        let table = [
            ("6.18.44-fc-v595", 128),
            ("6.12.57+deb13-cloud-amd64", 128),
            ("6.9.0", 128),
            ("7.0.1", 128),
            ("6.8.12", 64),
            ("6.1.0-41-cloud-amd64", 64),
            ("4.18.0-553.el8_10.x86_64", 64),
            ("", 64),
            ("garbage", 64),
        ];
        for (release, want) in table {
            assert_eq!(max_segments(release), want, "{release}");
        }
    }

    #[test]
    fn what_a_train_may_be() {
        let table = [
            // len, segment, v6, max segments, answer
            (64_768, 1472, false, 64, Ok(())),
            (1472 * 44 + 1, 1472, false, 64, Ok(())),
            (100, 1472, false, 64, Ok(())),
            (6400, 100, false, 64, Ok(())),
            (6401, 100, false, 64, Err(TOO_MANY_SEGMENTS)),
            (12_800, 100, false, 128, Ok(())),
            (12_801, 100, false, 128, Err(TOO_MANY_SEGMENTS)),
            (65_507, 1000, false, 128, Ok(())),
            (65_508, 1000, false, 128, Err(TOO_LONG)),
            (65_527, 1000, true, 128, Ok(())),
            (65_528, 1000, true, 128, Err(TOO_LONG)),
            (1000, 0, false, 128, Err(ZERO_SEGMENT)),
        ];
        for (len, segment, v6, max, want) in table {
            assert_eq!(check(len, segment, v6, |_| max), want, "{len} / {segment}");
        }
    }

    #[test]
    fn the_probe_is_asked_only_for_a_train_the_version_rule_refuses_and_a_backport_may_take() {
        use std::cell::Cell;
        let asked = Cell::new(0);
        let probe = |answer: Option<u16>| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                answer
            }
        };
        let table = [
            // count, version rule, the probe's answer, limit, probe asked
            (44, 64, Some(128), 64, false),
            (64, 64, Some(128), 64, false),
            (65, 64, Some(128), 128, true),
            (128, 64, Some(128), 128, true),
            (129, 64, Some(128), 64, false),
            (100, 64, Some(64), 64, true),
            // The probe could not run: the version rule.
            (100, 64, None, 64, true),
            // 6.9 on: the rule says 128, and nothing above it is asked.
            (128, 128, Some(64), 128, false),
            (129, 128, Some(128), 128, false),
        ];
        for (count, rule, answer, want, ask) in table {
            asked.set(0);
            let got = segment_limit(count, rule, probe(answer));
            assert_eq!(
                (got, asked.get() == 1),
                (want, ask),
                "{count} / {rule} / {answer:?}"
            );
        }
        // Through `check`: 100 x 100 B under the rule of 64, a kernel that took the change.
        asked.set(0);
        let limit = |n| segment_limit(n, 64, probe(Some(128)));
        assert_eq!(check(10_000, 100, false, limit), Ok(()));
        let limit = |n| segment_limit(n, 64, probe(None));
        assert_eq!(check(10_000, 100, false, limit), Err(TOO_MANY_SEGMENTS));
        assert_eq!(asked.get(), 2);
    }

    #[test]
    fn what_the_probe_train_says() {
        let took = Ok(usize::from(PROBE_SEGMENTS));
        let table = [
            (took, Some(1), Some(MAX_SEGMENTS_NEW)),
            // The kernel ignored UDP_SEGMENT: the train arrived as one datagram.
            (took, Some(128), Some(MAX_SEGMENTS_OLD)),
            (Err(Some(EINVAL)), None, Some(MAX_SEGMENTS_OLD)),
            // Says nothing of the kernel: asked again later.
            (took, None, None),
            (Ok(5), Some(1), None),
            (Err(Some(libc::ENETUNREACH)), None, None),
            (Err(Some(libc::EADDRNOTAVAIL)), None, None),
            (Err(Some(EPERM)), None, None),
            (Err(None), None, None),
        ];
        for (sent, first, want) in table {
            assert_eq!(probed_limit(sent, first), want, "{sent:?} {first:?}");
        }
    }

    #[test]
    fn failures_by_errno_and_id() {
        use TrainFailure::*;
        let table = [
            (EIO, false, Split),
            (EIO, true, Split),
            (ENOBUFS, false, Budget),
            // A qdisc drop with IP_RECVERR: the train was built and dropped.
            (ENOBUFS, true, Fail(None)),
            (EPERM, true, Fail(None)),
            (EMSGSIZE, true, Fail(crate::error::advice(EMSGSIZE))),
            (EINVAL, true, Fail(crate::error::advice(EINVAL))),
            (EMSGSIZE, false, Fail(crate::error::advice(EMSGSIZE))),
        ];
        assert!(crate::error::advice(EMSGSIZE).is_some() && crate::error::advice(EINVAL).is_some());
        for (errno, took, want) in table {
            assert_eq!(on_failure(Some(errno), took), want, "{errno} {took}");
        }
        assert_eq!(on_failure(None, false), Fail(None));
    }

    #[test]
    fn split_paths_are_per_destination_and_bounded() {
        let addr =
            |port: u16| -> SockAddr { std::net::SocketAddr::from(([192, 0, 2, 2], port)).into() };
        let mut p = SplitPaths::default();
        assert!(!p.splits(None) && !p.splits(Some(&addr(1))));
        p.refused(Some(&addr(1)));
        assert!(p.splits(Some(&addr(1))));
        assert!(!p.splits(Some(&addr(2))) && !p.splits(None));
        p.refused(None);
        assert!(p.splits(None));
        for port in 0..(2 * SPLIT_CACHE as u16) {
            p.refused(Some(&addr(port)));
            assert!(p.by_dest.len() <= SPLIT_CACHE);
        }
    }

    #[test]
    fn auto_copies_short_trains() {
        let table = [
            // segment, datagrams, copies
            (1472, 1, true),
            (1472, 4, true),
            (1472, 16, true),
            (1472, 22, true),
            (1472, 23, false),
            (1472, 44, false),
            (1200, 27, true),
            (1200, 28, false),
            (1200, 54, false),
        ];
        for (segment, count, copies) in table {
            assert_eq!(auto_copies(segment * count), copies, "{count} x {segment}");
        }
    }

    #[test]
    fn a_train_counts_its_datagrams() {
        assert_eq!(Train::new(1472).count(64_768), 44);
        assert_eq!(Train::new(1472).count(64_769), 45);
        assert_eq!(Train::new(1472).count(1), 1);
    }

    #[test]
    fn a_batch_run_is_equal_sizes_the_last_maybe_shorter_within_the_limits() {
        let lim = RunLimits {
            max_segments: 4,
            max_bytes: 65_507,
            max_segment: 1472,
        };
        let run = |lens: &[usize], lim| batch_run(lens.iter().copied(), lim);
        assert_eq!(run(&[1000, 1000, 1000], lim), Some((3, 1000)));
        assert_eq!(run(&[1000, 1000, 500, 1000], lim), Some((3, 1000)));
        assert_eq!(run(&[1000, 500, 500], lim), Some((2, 1000)));
        assert_eq!(run(&[1000, 1200, 1000], lim), None, "a longer one ends it");
        assert_eq!(run(&[1000, 0, 1000], lim), None, "an empty one ends it");
        assert_eq!(run(&[1000], lim), None, "one datagram is no train");
        assert_eq!(run(&[], lim), None);
        assert_eq!(run(&[1500, 1500], lim), None, "above the path MTU");
        assert_eq!(run(&[100; 9], lim), Some((4, 100)), "the segment limit");
        let bytes = RunLimits {
            max_bytes: 2500,
            ..lim
        };
        assert_eq!(
            run(&[1000, 1000, 1000], bytes),
            Some((2, 1000)),
            "the byte limit"
        );
        let big = RunLimits {
            max_segment: 70_000,
            ..lim
        };
        assert_eq!(run(&[65_536, 65_536], big), None, "a segment is a u16");
    }

    #[test]
    fn a_zero_copy_run_fits_the_skb_fragments() {
        // One contiguous, page-aligned block cut in 1472-byte buffers: 44 take 16 pages.
        let contiguous = (0..44).map(|i| (0x10_0000 + i * 1472, 1472));
        assert_eq!(zerocopy_run_len(contiguous), 44);
        // Separate buffers, each alone in its page: one fragment each.
        let apart = (0..44).map(|i| (0x10_0000 + i * 8192, 1472));
        assert_eq!(zerocopy_run_len(apart), ZEROCOPY_FRAGS);
        // Separate buffers that each cross a page: two fragments each.
        let crossing = (0..44).map(|i| (0x10_0000 + i * 8192 + 4000, 1472));
        assert_eq!(zerocopy_run_len(crossing), ZEROCOPY_FRAGS / 2);
        // A continuation into the next page still takes that page's fragment.
        assert_eq!(zerocopy_run_len([(4000, 96), (4096, 100)].into_iter()), 2);
        // 44 contiguous buffers from 3344 bytes into a page span 17 pages, and the 44th begins
        // once all 17 fragments are taken: the kernel refused that call (EMSGSIZE).
        let late = (0..44).map(|i| (0x10_0000 + 3344 + i * 1472, 1472));
        assert_eq!(zerocopy_run_len(late), 43);
    }
}
