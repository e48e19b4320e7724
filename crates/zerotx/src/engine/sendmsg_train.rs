//! Trains (UDP GSO) in the `sendmsg(2)` engines, and their downgrade: a train sent by copy, one
//! GSO call or, where the path refused GSO (`EIO`), one datagram per call; the kernel's segment
//! limit. A refused train comes back with the kernel's own error (its errno kept; what to do:
//! `error::advice`). The decisions are
//! [`policy::train`](trains)'s; the zero-copy train is `msg-zc`'s (`msg_zc/datagram.rs`).
//!
//! [`BatchRuns`]: whether a batch's runs of equal-size datagrams go as trains on a socket, and
//! within what (they are sent by `sendmsg_runs.rs`).

use std::collections::VecDeque;
use std::io;
use std::sync::OnceLock;

use crate::buf::SendBuf;
use crate::engine::policy::train::{self as trains, RunLimits, SplitPaths, Train, TrainFailure};
use crate::engine::record::Record;
use crate::engine::unfragmented::Unfragmented;
use crate::error::SendError;
use crate::report::Stats;
use crate::socket::Socket;
use crate::sys;

/// [`send_copied`](crate::engine::sendmsg_core::send_copied) of a train: one GSO call without
/// `MSG_ZEROCOPY`; where the path refused GSO (`EIO`, [`trains::on_failure`]: nothing of the
/// train went), the path is remembered in `splits` and the train goes one datagram per call from
/// its first, each whole or not at all, so a full socket leaves the rest for later and no
/// datagram goes twice.
///
/// Out of line (a train's branch of an inlined loop), so it fills the return stack before its
/// own return (docs/fast-path.md, "The return-stack fill").
#[inline(never)]
pub(crate) fn send_train_copied<B: SendBuf>(
    stats: &mut Stats,
    frag: &mut Unfragmented,
    splits: &mut SplitPaths,
    sock: &Socket,
    rec: &mut Record<B>,
    mut train: Train,
) -> io::Result<bool> {
    sys::fenced!('sent: {
        if !train.split {
            stats.syscalls += 1;
            let bytes = rec.bufs[0].as_bytes();
            let dest = rec.dest.as_deref();
            let sent = if sock.segment.train(sock.fd(), train.segment) {
                sys::send_to(sock.fd(), bytes, dest, 0)
            } else {
                sys::train::send_train(sock.fd(), bytes, train.segment, dest, 0)
            };
            match sent {
                Ok(n) => {
                    stats.bytes += n as u64;
                    rec.sent = rec.total;
                    break 'sent Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 'sent Ok(false),
                Err(e) if trains::on_failure(e.raw_os_error(), false) == TrainFailure::Split => {
                    split_train(stats, splits, rec, &mut train);
                }
                Err(e) => break 'sent Err(e),
            }
        }
        let segment = usize::from(train.segment);
        if let Err(e) = sock.segment.plain(sock.fd()) {
            break 'sent Err(e);
        }
        while rec.left() > 0 {
            let rest = &rec.bufs[0].as_bytes()[rec.sent..];
            let len = rest.len().min(segment);
            let dest = rec.dest.as_deref();
            match frag.send_copy(sock.fd(), &rest[..len], dest, &mut stats.syscalls) {
                Ok(n) => {
                    stats.bytes += n as u64;
                    rec.sent += len;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 'sent Ok(false),
                Err(e) => break 'sent Err(e),
            }
        }
        Ok(true)
    })
}

/// Before a lone send that is not a train: the socket's `UDP_SEGMENT` option back at 0
/// ([`SegmentOption::plain`](crate::socket::SegmentOption::plain)), or `buf` back with the
/// kernel's refusal.
pub(crate) fn plain_send<B>(sock: &Socket, buf: B) -> Result<B, SendError<B>> {
    match sock.segment.plain(sock.fd()) {
        Ok(()) => Ok(buf),
        Err(error) => Err(SendError::Io { buf, error }),
    }
}

/// [`plain_send`] before a batch (never empty: the sender answers an empty one itself): a
/// refusal fails the batch's first buffer, the rest staying in `bufs`.
pub(crate) fn plain_batch<B>(sock: &Socket, bufs: &mut VecDeque<B>) -> Result<(), SendError<B>> {
    if let Err(error) = sock.segment.plain(sock.fd()) {
        if let Some(buf) = bufs.pop_front() {
            return Err(SendError::Io { buf, error });
        }
    }
    Ok(())
}

/// The path of `rec`, a train, refused GSO: it goes one datagram per call, and so do later
/// trains to the same destination (`splits`).
pub(crate) fn split_train<B>(
    stats: &mut Stats,
    splits: &mut SplitPaths,
    rec: &mut Record<B>,
    train: &mut Train,
) {
    train.split = true;
    rec.train = Some(*train);
    splits.refused(rec.dest.as_deref());
    stats.train_splits += 1;
}

/// The segments one train call may carry here by the version rule ([`trains::max_segments`] of
/// this kernel), read once. A train above it may still go: [`check_train`].
pub(crate) fn kernel_train_segments() -> u16 {
    static SEGMENTS: OnceLock<u16> = OnceLock::new();
    *SEGMENTS.get_or_init(|| trains::max_segments(&sys::kernel_release().unwrap_or_default()))
}

/// Whether a train of `len` bytes in `segment`-byte datagrams may go on a socket of IPv6 (`v6`)
/// or IPv4 ([`trains::check`]), under the version rule's limit `rule`
/// ([`kernel_train_segments`]), or for a train above it that a backport may take, under what the
/// kernel answered the probe ([`segment_limit`]).
#[inline]
pub(crate) fn check_train(
    len: usize,
    segment: u16,
    v6: bool,
    rule: u16,
) -> Result<(), &'static str> {
    trains::check(len, segment, v6, |count| segment_limit(count, rule))
}

/// The segment limit that decides a train of `count` segments where the version rule says `rule`
/// (`policy::train::segment_limit`): `rule`, or for a train above it and within 128 segments,
/// the kernel's answer to the probe train, asked once per process (`probed_segments`).
pub fn segment_limit(count: usize, rule: u16) -> u16 {
    trains::segment_limit(count, rule, probed_segments)
}

/// `UDP_MAX_SEGMENTS` as the kernel answers a probe train ([`sys::train::probe_segments`],
/// loopback only, read by [`trains::probed_limit`]), kept for the process once the kernel
/// answered; `None`, and nothing kept, where the probe could not run (loopback down in a fresh
/// network namespace), so a later train asks again.
#[cold]
#[inline(never)]
fn probed_segments() -> Option<u16> {
    static PROBED: OnceLock<u16> = OnceLock::new();
    if let Some(&limit) = PROBED.get() {
        return Some(limit);
    }
    let (sent, first) = sys::train::probe_segments(trains::PROBE_SEGMENTS);
    let limit = trains::probed_limit(sent.map_err(|e| e.raw_os_error()), first)?;
    Some(*PROBED.get_or_init(|| limit))
}

/// Whether the runs of equal-size datagrams in a connected socket's batches go as trains
/// ([`SenderConfig::with_batch_trains`](crate::SenderConfig::with_batch_trains)), and within
/// what. Invariant: `on` only on a connected UDP socket whose kernel has GSO; `limits` is
/// `None` until the path MTU was read (at the first run), and again after a run the kernel
/// refused as too large for the path.
pub(crate) struct BatchRuns {
    on: bool,
    v6: bool,
    limits: Option<RunLimits>,
}

impl BatchRuns {
    /// Runs never go as trains.
    pub(crate) fn off() -> Self {
        Self {
            on: false,
            v6: false,
            limits: None,
        }
    }

    /// Runs go as trains on `sock` if `wanted` and the socket and kernel allow (the probe:
    /// [`sys::train::gso_available`]).
    pub(crate) fn new(sock: &Socket, wanted: bool) -> Self {
        let on = wanted
            && sock.connected
            && trains::carries_trains(sock.kind)
            && sys::train::gso_available(sock.fd());
        Self {
            on,
            v6: sock.kind.family == crate::socket::Family::Inet6,
            limits: None,
        }
    }

    /// Whether a batch looks for runs at all: the loop's one test before its size comparison.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// The run at the front of a batch (`lens`, front first), if it goes as one train: its
    /// length and segment size ([`trains::batch_run`]). Not on a path that refused GSO
    /// (`splits`), nor where the path MTU cannot be read.
    pub(crate) fn run(
        &mut self,
        sock: &Socket,
        splits: &SplitPaths,
        lens: impl Iterator<Item = usize>,
    ) -> Option<(usize, u16)> {
        if splits.splits(None) {
            return None;
        }
        let limits = match self.limits {
            Some(l) => l,
            None => {
                let mtu = sys::path_mtu(sock.fd(), self.v6).ok()?;
                let headers = if self.v6 { 48 } else { 28 };
                let l = RunLimits {
                    max_segments: kernel_train_segments(),
                    // IPv4's, the smaller: an IPv6 socket may send to an IPv4-mapped peer.
                    max_bytes: trains::max_train_bytes(false),
                    max_segment: usize::try_from(mtu).ok()?.saturating_sub(headers),
                };
                *self.limits.insert(l)
            }
        };
        trains::batch_run(lens, limits)
    }

    /// The kernel refused a run as too large for its path: read the path MTU again at the next.
    pub(crate) fn forget_mtu(&mut self) {
        self.limits = None;
    }
}
