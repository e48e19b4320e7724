//! The one in-flight record every engine keeps, and the one path that turns it into
//! [`Released`] values.
//!
//! A record is one send as the kernel sees it: a buffer (or, on an io_uring byte stream, several
//! buffers carried by one request's iovec), where it goes, how many bytes the kernel took, and
//! what the release will report. Every engine releases through [`Record::release`], so a buffer's
//! [`Report`] means the same whichever engine sent it.

use std::io;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use socket2::SockAddr;

use crate::buf::SendBuf;
use crate::engine::policy;
use crate::engine::policy::train::Train;
use crate::report::{CopyReason, Released, Report, SendPath, Stats};
use crate::sys::uring::{Cut, Payload};

/// One send in flight: see the module docs.
pub(crate) struct Record<B> {
    /// The buffers, in stream order. One, except in an io_uring byte-stream batch.
    pub(crate) bufs: SmallVec<[B; 1]>,
    /// Boxed: most sends have none, and the record stays small where it moves.
    pub(crate) dest: Option<Box<SockAddr>>,
    /// Bytes of all buffers together.
    pub(crate) total: usize,
    /// Bytes the kernel took so far.
    pub(crate) sent: usize,
    /// zerotx sent (part of) it by copy, for this reason: after the zero-copy budget refused it
    /// ([`CopyReason::Fallback`]), or by `auto`'s choice. The first reason stays.
    pub(crate) copy: Option<CopyReason>,
    /// `auto` chose zero-copy for it: its release tells the policy how that went.
    pub(crate) auto_zc: bool,
    /// ... to probe a route that copied.
    pub(crate) probe: bool,
    /// Bytes it counts toward its sender's zero-copy load (`auto`'s caps) until released.
    pub(crate) charge: usize,
    /// The kernel copied (part of) it: a COPIED completion, a short vsock call, a datagram too
    /// large for the path's MTU.
    pub(crate) kernel_copied: bool,
    /// Set when the send ended before every byte went.
    pub(crate) error: Option<io::Error>,
    /// When it was accepted, for a sampled one (see [`LatencySampler`]).
    pub(crate) started: Option<Instant>,
    /// A datagram socket's train: one buffer the kernel cuts into datagrams (UDP GSO).
    pub(crate) train: Option<Train>,
}

impl<B: SendBuf> Record<B> {
    /// A record of one buffer (`dest` boxed or not: an engine that queues buffers boxes the
    /// destination when it accepts one, so the queue's entries stay small where they move).
    pub(crate) fn new(
        buf: B,
        dest: Option<impl Into<Box<SockAddr>>>,
        started: Option<Instant>,
    ) -> Self {
        let total = buf.as_bytes().len();
        Self::of_len(buf, total, dest, started)
    }

    /// As [`new`](Self::new), for a buffer of `total` bytes, without asking `buf` again: for a
    /// record made after the kernel took (or may have taken) an id for it, where a panicking
    /// `as_bytes` would leave the id unrecorded.
    pub(crate) fn of_len(
        buf: B,
        total: usize,
        dest: Option<impl Into<Box<SockAddr>>>,
        started: Option<Instant>,
    ) -> Self {
        let mut bufs = SmallVec::new();
        bufs.push(buf);
        Self {
            bufs,
            dest: dest.map(Into::into),
            total,
            sent: 0,
            copy: None,
            auto_zc: false,
            probe: false,
            charge: 0,
            kernel_copied: false,
            error: None,
            started,
            train: None,
        }
    }

    /// Makes this record, whose buffers were all released ([`release_in_place`]), a new record of
    /// `buf`, as [`new`](Self::new) would, in place: an io_uring request's record stays in its
    /// box from one send to the next instead of being built elsewhere and moved in.
    ///
    /// [`release_in_place`]: Self::release_in_place
    #[inline(always)]
    pub(crate) fn refill(&mut self, buf: B, dest: Option<Box<SockAddr>>, started: Option<Instant>) {
        let total = buf.as_bytes().len();
        self.refill_len(buf, total, dest, started);
    }

    /// As [`refill`](Self::refill), for a buffer of `total` bytes (see [`of_len`](Self::of_len)).
    #[inline(always)]
    pub(crate) fn refill_len(
        &mut self,
        buf: B,
        total: usize,
        dest: Option<Box<SockAddr>>,
        started: Option<Instant>,
    ) {
        debug_assert!(
            self.bufs.is_empty(),
            "refill of a record that holds buffers"
        );
        self.total = total;
        self.bufs.clear();
        self.bufs.push(buf);
        self.dest = dest;
        self.sent = 0;
        self.copy = None;
        self.auto_zc = false;
        self.probe = false;
        self.charge = 0;
        self.kernel_copied = false;
        self.error = None;
        self.started = started;
        self.train = None;
    }

    /// The buffer of a one-buffer record that never entered the ledger and of which nothing
    /// went, handed back.
    pub(crate) fn take_buf(mut self) -> B {
        self.bufs
            .pop()
            .expect("a one-buffer record holds its buffer")
    }

    /// Appends `buf` to a byte-stream batch (no destination).
    pub(crate) fn push(&mut self, buf: B) {
        self.total += buf.as_bytes().len();
        self.bufs.push(buf);
    }

    /// Sends the rest by copy for `reason` (the first reason given stays).
    pub(crate) fn copy_for(&mut self, reason: CopyReason) {
        self.copy.get_or_insert(reason);
    }

    /// What `auto` learns from this record's release, if it chose zero-copy for it: whether the
    /// kernel copied it after all, and whether it was a probe. A record that zerotx copied after a
    /// refusal, or that failed, says nothing of the route (a probe's counts as copied, so the probe
    /// ends).
    pub(crate) fn outcome(&self) -> Option<(bool, bool)> {
        let clean = self.auto_zc && self.copy.is_none() && self.error.is_none();
        if self.probe {
            // A probe always ends, or `auto` would wait for it forever.
            return Some((!clean || self.kernel_copied, true));
        }
        clean.then_some((self.kernel_copied, false))
    }

    /// Bytes not yet taken by the kernel.
    pub(crate) fn left(&self) -> usize {
        self.total - self.sent
    }

    /// Gives every buffer back with its report, counted in `stats`: see
    /// [`release_in_place`](Self::release_in_place).
    pub(crate) fn release(
        mut self,
        zerocopy_engine: bool,
        stats: &mut Stats,
        out: &mut Vec<Released<B>>,
    ) {
        self.release_in_place(zerocopy_engine, stats, out);
    }

    /// Gives every buffer back with its report, counted in `stats` (through [`give`], the only
    /// place a [`Released`] is made). A batch's bytes are assigned in order; every buffer that did
    /// not go whole carries the error. Leaves the record without buffers, error or destination,
    /// ready for [`refill`](Self::refill).
    ///
    /// Inlined into the engines' completion paths for the common case, one buffer that went whole
    /// with no destination to drop; the rest is out of line ([`release_rest`](Self::release_rest)),
    /// so its batch loop's stack frame is not set up per release (docs/fast-path.md).
    #[inline(always)]
    pub(crate) fn release_in_place(
        &mut self,
        zerocopy_engine: bool,
        stats: &mut Stats,
        out: &mut Vec<Released<B>>,
    ) {
        if self.bufs.len() == 1
            && self.sent >= self.total
            && self.dest.is_none()
            && self.error.is_none()
        {
            let path = policy::release_path(zerocopy_engine, self.copy, self.kernel_copied);
            let latency = self.started.map(|t| t.elapsed());
            if let Some(buf) = self.bufs.pop() {
                let bytes = buf.as_bytes().len();
                give(out, stats, buf, bytes, path, latency, None);
            }
            return;
        }
        self.release_rest(zerocopy_engine, stats, out);
    }

    /// [`release_in_place`](Self::release_in_place) for every other record: a batch, a buffer
    /// that did not go whole, one with a destination or an error.
    #[inline(never)]
    fn release_rest(
        &mut self,
        zerocopy_engine: bool,
        stats: &mut Stats,
        out: &mut Vec<Released<B>>,
    ) {
        let path = policy::release_path(zerocopy_engine, self.copy, self.kernel_copied);
        let latency = self.started.map(|t| t.elapsed());
        self.dest = None;
        let mut sent = self.sent;
        let mut error = self.error.take();
        let n = self.bufs.len();
        if n == 1 && sent >= self.total {
            // One buffer that went whole (with a destination, or an error that came after).
            if let Some(buf) = self.bufs.pop() {
                let bytes = buf.as_bytes().len();
                give(out, stats, buf, bytes, path, latency, None);
            }
            return;
        }
        for (i, buf) in self.bufs.drain(..).enumerate() {
            let len = buf.as_bytes().len();
            let bytes = len.min(sent);
            sent -= bytes;
            // The buffers that did not go whole are a suffix: the last one takes the error itself,
            // the others a copy.
            let error = (bytes < len).then(|| match (&mut error, i + 1 == n) {
                (e @ Some(_), true) => e.take().expect("checked"),
                (Some(e), false) => copy_error(e),
                (None, _) => io::Error::from(io::ErrorKind::BrokenPipe),
            });
            give(out, stats, buf, bytes, path, latency, error);
        }
    }

    /// A buffer the kernel took whole at once, given back without ever being a record (the copy
    /// engine's common case): as [`release`](Self::release) would give it.
    #[inline(always)]
    pub(crate) fn release_whole(
        buf: B,
        path: SendPath,
        started: Option<Instant>,
        stats: &mut Stats,
        out: &mut Vec<Released<B>>,
    ) {
        let bytes = buf.as_bytes().len();
        let latency = started.map(|t| t.elapsed());
        give(out, stats, buf, bytes, path, latency, None);
    }
}

/// An io_uring send request carries a record: its buffers from `sent` on, to `dest`.
impl<B: SendBuf> Payload for Record<B> {
    type Buf = B;

    fn bufs(&self) -> &[B] {
        &self.bufs
    }

    fn sent(&self) -> usize {
        self.sent
    }

    fn dest(&self) -> Option<&SockAddr> {
        self.dest.as_deref()
    }

    fn cut(&self) -> Cut {
        match self.train {
            None => Cut::None,
            Some(t) if t.split => Cut::One(t.segment),
            Some(t) => Cut::Train(t.segment),
        }
    }
}

/// The only place a [`Released`] is made: one buffer back with its report, counted in `stats`.
#[inline(always)]
fn give<B>(
    out: &mut Vec<Released<B>>,
    stats: &mut Stats,
    buf: B,
    bytes: usize,
    path: SendPath,
    latency: Option<Duration>,
    error: Option<io::Error>,
) {
    stats.count_release(path, error.is_some());
    let released = Released {
        buf,
        report: Report {
            bytes,
            path,
            latency,
            error,
        },
    };
    // Pushed where the vector has room, so no grow call comes between building the value and
    // writing it: its fields go from registers straight into the vector, with no copy through
    // the stack (docs/fast-path.md).
    if out.len() < out.capacity() {
        out.push(released);
    } else {
        grow_push(out, released);
    }
}

/// [`give`]'s push when the vector must grow first.
#[cold]
#[inline(never)]
fn grow_push<B>(out: &mut Vec<Released<B>>, released: Released<B>) {
    out.push(released);
}

/// `io::Error` is not `Clone`: the same errno, or kind and message.
fn copy_error(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// Which sends carry a timestamp: one in [`LatencySampler::EVERY`]. A clock read per send costs
/// a few percent of a small datagram's send; a sample costs nothing measurable and still tells
/// the release latency's distribution.
#[derive(Debug, Default)]
pub(crate) struct LatencySampler {
    count: u32,
}

impl LatencySampler {
    /// One send in this many is timed: a prime, so the samples do not alias with a caller's
    /// power-of-two reap cadence (a stride of 64 over reaps every 32 sends would time the same
    /// place of every batch).
    pub(crate) const EVERY: u32 = 61;

    /// The start time of the next send, if it is one of the sampled.
    pub(crate) fn next(&mut self) -> Option<Instant> {
        self.next_at(None)
    }

    /// Whether one of the next `n` sends is sampled: a batch's one clock read before its call.
    pub(crate) fn due_within(&self, n: usize) -> bool {
        let r = self.count % Self::EVERY;
        r == 0 || ((Self::EVERY - r) as usize) < n
    }

    /// As [`next`](Self::next), with `now` (read before the call, see
    /// [`due_within`](Self::due_within)) as the start time if there is one.
    pub(crate) fn next_at(&mut self, now: Option<Instant>) -> Option<Instant> {
        let sample = self.count % Self::EVERY == 0;
        self.count = self.count.wrapping_add(1);
        sample.then(|| now.unwrap_or_else(Instant::now))
    }
}
