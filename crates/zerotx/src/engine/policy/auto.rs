//! The `auto` engine's choice, per send: zero-copy or copy, and why. Pure and cheap: a few
//! integer compares and counters per send, no system call and no clock read; everything it
//! learns comes from what the kernel already reports (completions that say COPIED, budget
//! refusals) and from limits read once when the sender is made.
//!
//! The rules, in the order a send meets them:
//! 1. **Size.** Below [`Thresholds`] for the sender's family and socket kind a send is copied
//!    ([`CopyReason::Small`]): pinning pages, an extra fragment and a notification cost more than
//!    a memcpy of a small buffer.
//! 2. **Budget hold.** After the kernel refused a zero-copy send for lack of budget (`ENOBUFS`:
//!    option memory or locked memory; `ENOMEM` from io_uring), with [`AtCap::Copy`] the next
//!    [`HOLD_MIN`] sends are copied, then zero-copy is tried again; a refusal right after a hold
//!    doubles the next hold (up to [`HOLD_MAX`]) ([`CopyReason::Budget`]). With [`AtCap::Wait`]
//!    the engine waits for its completions instead (the rule every zero-copy engine follows).
//! 3. **In-flight caps.** Zero-copy sends and bytes in flight are capped ([`Caps`], derived from
//!    `optmem_max` and `RLIMIT_MEMLOCK`); at a cap the caller's [`AtCap`] choice applies: copy,
//!    or wait for completions. A wait is chosen only with something in flight that can end it.
//! 4. **Threshold, refined online** ([`Tuner`]). The size threshold for the caller's memory
//!    starts from the measured default and moves by halves and doubles: now and then the sends
//!    near it (from half to twice the threshold) are sent zero-copy for one epoch of [`EPOCH`]
//!    sends and by copy for the next, [`PAIRS`] pairs in a row, and the sender thread's CPU time
//!    per byte of each arm is compared (the engine reads `CLOCK_THREAD_CPUTIME_ID` at the end of
//!    an experiment's epochs and of the epoch before one, never per send and never while no
//!    experiment can use the reading). Zero-copy cheaper by more than [`MARGIN`]: the threshold halves;
//!    dearer: it doubles; then [`IDLE_EPOCHS`] epochs without experiments.
//! 5. **Copied window.** Every released zero-copy send says whether the kernel copied it after all
//!    (loopback, a local container, a device without scatter-gather). When at least three in four
//!    of a window of [`WINDOW`] come back copied, the sender copies
//!    ([`CopyReason::RouteCopies`]) and sends one *probe* zero-copy now and then: first after
//!    [`PROBE_MIN`] sends, doubling after each probe that comes back copied, up to
//!    [`PROBE_MAX`] (a peer on loopback starts here: the kernel copies every zero-copy send
//!    delivered locally). A probe that comes back not copied returns the sender to zero-copy; a clean
//!    window (nothing copied) resets the backoff. So a route that always copies costs one probe in
//!    [`PROBE_MAX`] sends, and a route that starts paying gets zero-copy back within
//!    [`PROBE_MAX`] sends (plus what was in flight).

use crate::config::AtCap;
use crate::report::CopyReason;

/// Zero-copy completions per window of the copied-window rule.
pub(crate) const WINDOW: u32 = 32;
/// Sends (of a size that would go zero-copy) before the first probe.
pub(crate) const PROBE_MIN: u64 = 256;
/// The longest gap between two probes.
pub(crate) const PROBE_MAX: u64 = 1 << 16;
/// Sends copied after a budget refusal.
pub(crate) const HOLD_MIN: u32 = 16;
/// The longest hold after refusals in a row.
pub(crate) const HOLD_MAX: u32 = 4096;

/// Sends between two readings of the sender thread's CPU clock.
pub(crate) const EPOCH: u32 = 64;
/// Epochs between two experiments of the threshold tuner.
pub(crate) const IDLE_EPOCHS: u32 = 16;
/// Pairs of epochs (one zero-copy, one copy) per experiment.
pub(crate) const PAIRS: u32 = 4;
/// How much cheaper per byte one arm must be before the threshold moves.
pub(crate) const MARGIN: f64 = 0.10;
/// Bounds of a tuned threshold.
pub(crate) const TUNED_MIN: usize = 512;
/// See [`TUNED_MIN`].
pub(crate) const TUNED_MAX: usize = 256 * 1024;

/// Which way an experiment epoch sends the sends near the threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    ZeroCopy = 0,
    Copy = 1,
}

/// The online refinement of the threshold (see the module docs, rule 4).
#[derive(Debug, Clone)]
pub(crate) struct Tuner {
    /// Experimenting: the arm of this epoch and its index.
    arm: Option<(Arm, u32)>,
    /// Epochs until the next experiment.
    idle: u32,
    sends: u32,
    bytes: u64,
    /// Sends near the threshold in this epoch.
    near: u32,
    last_ns: Option<u64>,
    /// Per arm: CPU nanoseconds and bytes measured.
    acc: [(u64, u64); 2],
    /// Times the threshold moved, and where it started.
    moves: u32,
    start: usize,
}

impl Tuner {
    fn new(start: usize) -> Self {
        Self {
            arm: None,
            idle: IDLE_EPOCHS,
            sends: 0,
            bytes: 0,
            near: 0,
            last_ns: None,
            acc: [(0, 0); 2],
            moves: 0,
            start,
        }
    }
}

/// Smallest send that goes zero-copy, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Thresholds {
    /// From the caller's memory: pages pinned per send.
    pub(crate) user: usize,
    /// From memory registered with io_uring: pinned once, at registration.
    pub(crate) registered: usize,
}

/// Which family of system calls an `auto` sender uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// `sendmsg(2)`, `MSG_ZEROCOPY` and the error queue.
    Syscall,
    /// io_uring `SENDMSG`/`SEND_ZC`/`SENDMSG_ZC`.
    Uring,
}

impl Thresholds {
    /// The defaults: datagrams from where zero-copy starts to pay into the black hole (from
    /// registered memory, from the smallest size; benches/HISTORY.md, "`auto`'s thresholds");
    /// streams from the kernel documentation's figure for `MSG_ZEROCOPY` ("generally only
    /// effective at writes over around 10 KB"): a TCP zero-copy send through a real device cannot
    /// be measured on one machine, where local delivery always copies.
    pub(crate) fn new(family: Family, byte_stream: bool) -> Self {
        const STREAM: usize = 16 * 1024;
        const DATAGRAM: usize = 2 * 1024;
        match (family, byte_stream) {
            (_, true) => Self {
                user: STREAM,
                registered: STREAM,
            },
            (Family::Syscall, false) => Self {
                user: DATAGRAM,
                registered: DATAGRAM,
            },
            (Family::Uring, false) => Self {
                user: DATAGRAM,
                registered: 0,
            },
        }
    }
}

/// Caps on what one sender has in flight zero-copy: `None` is no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Caps {
    /// Zero-copy sends awaiting their completion (each holds an skb of the socket's option
    /// memory until its completion is read).
    pub(crate) sends: Option<usize>,
    /// Bytes of the caller's memory pinned by zero-copy sends (charged to `RLIMIT_MEMLOCK`).
    pub(crate) bytes: Option<usize>,
}

/// What a `MSG_ZEROCOPY` completion costs in option memory: one `sk_buff` with its shared info
/// (`SKB_TRUESIZE(0)`, 768 bytes on x86-64 6.x, rounded up).
const NOTIFICATION_TRUESIZE: usize = 1024;

impl Caps {
    /// Caps from `optmem_max` (the sender's namespace; `MSG_ZEROCOPY` only: io_uring's
    /// notifications are not charged there) and the locked-memory limit (`None`: unlimited or
    /// `CAP_IPC_LOCK`), each at half, so the caps are met before the kernel refuses and leave room
    /// for the socket's other option memory and other senders' pins.
    pub(crate) fn derive(optmem_max: Option<usize>, memlock: Option<usize>) -> Self {
        Self {
            sends: optmem_max.map(|m| (m / 2 / NOTIFICATION_TRUESIZE).max(1)),
            bytes: memlock.map(|m| m / 2),
        }
    }
}

/// What is in flight zero-copy now, as the engine counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Load {
    pub(crate) sends: usize,
    pub(crate) bytes: usize,
}

/// The choice for one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Zero-copy; `probe`: a probe of a route that copied (its release must say
    /// [`AutoPolicy::observe`] `probe: true`).
    ZeroCopy { probe: bool },
    /// By copy, for this reason.
    Copy(CopyReason),
    /// At a cap with [`AtCap::Wait`]: wait for completions, then ask again.
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    ZeroCopy,
    /// The route copies: copy, and probe when `countdown` reaches 0.
    Copying {
        countdown: u64,
    },
}

/// Counters of the policy's decisions (surfaced in [`Stats`](crate::Stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AutoCounts {
    pub(crate) probes: u64,
    pub(crate) probes_paid: u64,
    pub(crate) switches_to_copy: u64,
    pub(crate) cap_waits: u64,
}

impl AutoCounts {
    /// Adds the counters to a sender's [`Stats`](crate::Stats).
    pub(crate) fn add_to(&self, s: &mut crate::report::Stats) {
        s.probes += self.probes;
        s.probes_paid += self.probes_paid;
        s.switches_to_copy += self.switches_to_copy;
        s.cap_waits += self.cap_waits;
    }
}

/// The `auto` decision state of one sender: see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct AutoPolicy {
    thresholds: Thresholds,
    caps: Caps,
    at_cap: AtCap,
    mode: Mode,
    /// Zero-copy releases in the current window, and how many of them the kernel copied.
    seen: u32,
    copied: u32,
    /// Probe gap = `PROBE_MIN << backoff`.
    backoff: u32,
    probe_out: bool,
    /// Sends still to copy after a budget refusal, and the next hold's length.
    hold: u32,
    next_hold: u32,
    /// Whether the kernel says when it copied a zero-copy send (io_uring before 6.2 does not):
    /// without it the copied-window rule has nothing to go on and stays off.
    reports_copies: bool,
    tuner: Tuner,
    counts: AutoCounts,
}

impl AutoPolicy {
    pub(crate) fn new(thresholds: Thresholds, caps: Caps, at_cap: AtCap, reports: bool) -> Self {
        Self {
            thresholds,
            caps,
            at_cap,
            mode: Mode::ZeroCopy,
            seen: 0,
            copied: 0,
            backoff: 0,
            probe_out: false,
            hold: 0,
            next_hold: HOLD_MIN,
            reports_copies: reports,
            tuner: Tuner::new(thresholds.user),
            counts: AutoCounts::default(),
        }
    }

    /// The choice for a send of `len` bytes (`registered`: from memory registered with the
    /// ring) with `load` in flight zero-copy.
    #[inline]
    pub(crate) fn choose(&mut self, len: usize, registered: bool, load: Load) -> Choice {
        if self.tuner.sends >= EPOCH && !self.clock_wanted() {
            self.end_idle_epoch();
        }
        self.tuner.sends += 1;
        self.tuner.bytes += len as u64;
        let threshold = if registered {
            self.thresholds.registered
        } else {
            self.thresholds.user
        };
        let near = !registered && len >= threshold / 2 && len < threshold.saturating_mul(2);
        let forced = if near {
            self.tuner.near += 1;
            self.tuner.arm.map(|(arm, _)| arm)
        } else {
            None
        };
        match forced {
            Some(Arm::Copy) => return Choice::Copy(CopyReason::Small),
            Some(Arm::ZeroCopy) => {}
            None if len < threshold => return Choice::Copy(CopyReason::Small),
            None => {}
        }
        if self.hold > 0 {
            self.hold -= 1;
            return Choice::Copy(CopyReason::Budget);
        }
        let probe = match &mut self.mode {
            Mode::ZeroCopy => false,
            Mode::Copying { .. } if self.probe_out => return Choice::Copy(CopyReason::RouteCopies),
            Mode::Copying { countdown } => {
                *countdown = countdown.saturating_sub(1);
                if *countdown > 0 {
                    return Choice::Copy(CopyReason::RouteCopies);
                }
                true
            }
        };
        let pins = !registered;
        let over = self.caps.sends.is_some_and(|c| load.sends >= c)
            || (pins && self.caps.bytes.is_some_and(|c| load.bytes + len > c));
        if over {
            if self.at_cap == AtCap::Wait && load.sends > 0 {
                self.counts.cap_waits += 1;
                return Choice::Wait;
            }
            return Choice::Copy(CopyReason::Budget);
        }
        if probe {
            self.probe_out = true;
            self.counts.probes += 1;
        }
        Choice::ZeroCopy { probe }
    }

    /// A zero-copy send of `bufs` buffers (an io_uring byte-stream request carries several) was
    /// released: `copied` is what its completion said (a sample for a coalesced range, see
    /// docs/kernel.md, "MSG_ZEROCOPY (sendmsg + socket error queue)"); `probe` as its [`Choice`]
    /// said.
    #[inline]
    pub(crate) fn observe(&mut self, copied: bool, probe: bool, bufs: u32) {
        if !self.reports_copies {
            return;
        }
        if probe {
            self.probe_out = false;
            if copied {
                self.backoff = (self.backoff + 1).min(PROBE_MAX.trailing_zeros());
                self.mode = Mode::Copying {
                    countdown: self.probe_gap(),
                };
            } else {
                self.counts.probes_paid += 1;
                self.mode = Mode::ZeroCopy;
                self.seen = 0;
                self.copied = 0;
            }
            return;
        }
        if self.mode != Mode::ZeroCopy {
            return; // sent before the switch: the window that switched already counted its kind
        }
        self.seen += bufs;
        self.copied += if copied { bufs } else { 0 };
        if self.seen < WINDOW {
            return;
        }
        if self.copied * 4 >= self.seen * 3 {
            self.counts.switches_to_copy += 1;
            self.mode = Mode::Copying {
                countdown: self.probe_gap(),
            };
        } else if self.copied == 0 {
            self.backoff = 0;
        }
        self.seen = 0;
        self.copied = 0;
    }

    /// Whether the engine should read the sender thread's CPU clock now and call
    /// [`on_clock`](Self::on_clock): at the end of an epoch of [`EPOCH`] sends, and only of one
    /// whose reading the tuner uses ([`clock_wanted`](Self::clock_wanted)). Other epochs end in
    /// [`choose`](Self::choose) without a system call.
    #[inline]
    pub(crate) fn clock_due(&self) -> bool {
        self.tuner.sends >= EPOCH && self.clock_wanted()
    }

    /// Whether the epoch ending now needs the CPU clock: an experiment's epoch (its CPU time is
    /// what the experiment compares), or the idle epoch an experiment starts after (its reading
    /// is where the first experiment epoch's time starts). Every other reading would be thrown
    /// away: on a sender whose sends are never near the threshold, that is all of them, and
    /// each is a system call (`CLOCK_THREAD_CPUTIME_ID` has no vDSO path).
    fn clock_wanted(&self) -> bool {
        let t = &self.tuner;
        t.arm.is_some() || (t.idle <= 1 && self.experiment_may_start())
    }

    /// Whether an experiment may start at the end of the current epoch: sends near the threshold
    /// are at least a quarter of it, and zero-copy is on (no copied route, no budget hold).
    fn experiment_may_start(&self) -> bool {
        let t = &self.tuner;
        t.near * 4 >= t.sends && self.mode == Mode::ZeroCopy && self.hold == 0
    }

    /// Ends an idle epoch whose clock reading nobody would use (see
    /// [`clock_wanted`](Self::clock_wanted)): one epoch nearer the next experiment.
    fn end_idle_epoch(&mut self) {
        let t = &mut self.tuner;
        debug_assert!(t.arm.is_none(), "an experiment's epoch is always measured");
        t.idle = t.idle.saturating_sub(1);
        (t.sends, t.bytes, t.near) = (0, 0, 0);
    }

    /// The sender thread's CPU time now (`same_thread`: the same thread as at the last reading;
    /// an epoch across two threads is not measured). Ends an epoch of the tuner.
    pub(crate) fn on_clock(&mut self, cpu_ns: u64, same_thread: bool) {
        let zero_copy_mode = self.mode == Mode::ZeroCopy && self.hold == 0;
        let may_start = self.experiment_may_start();
        let t = &mut self.tuner;
        let delta = t
            .last_ns
            .filter(|_| same_thread)
            .and_then(|l| cpu_ns.checked_sub(l));
        t.last_ns = Some(cpu_ns);
        let bytes = t.bytes;
        (t.sends, t.bytes, t.near) = (0, 0, 0);
        match t.arm {
            None => {
                t.idle = t.idle.saturating_sub(1);
                // Experiment only where sends near the threshold happen and zero-copy is on.
                if t.idle == 0 && may_start {
                    t.arm = Some((Arm::ZeroCopy, 0));
                    t.acc = [(0, 0); 2];
                }
            }
            Some((arm, i)) => {
                if let Some(d) = delta {
                    let a = &mut t.acc[arm as usize];
                    a.0 += d;
                    a.1 += bytes;
                }
                let i = i + 1;
                if i < 2 * PAIRS && zero_copy_mode {
                    // ZC, C, C, ZC, ZC, C, ...: each arm sees both orders, so drift cancels.
                    let next = if i % 2 == 1 {
                        match arm {
                            Arm::ZeroCopy => Arm::Copy,
                            Arm::Copy => Arm::ZeroCopy,
                        }
                    } else {
                        arm
                    };
                    t.arm = Some((next, i));
                } else {
                    t.arm = None;
                    t.idle = IDLE_EPOCHS;
                    if i == 2 * PAIRS {
                        self.decide();
                    }
                }
            }
        }
    }

    /// The end of an experiment: move the threshold toward the cheaper arm.
    fn decide(&mut self) {
        let [(zn, zb), (cn, cb)] = self.tuner.acc;
        if zb == 0 || cb == 0 {
            return;
        }
        let (zc, copy) = (zn as f64 / zb as f64, cn as f64 / cb as f64);
        let t = &mut self.thresholds.user;
        let before = *t;
        if zc < copy * (1.0 - MARGIN) {
            *t = (*t / 2).max(TUNED_MIN);
        } else if zc > copy * (1.0 + MARGIN) {
            *t = (*t * 2).min(TUNED_MAX);
        }
        if *t != before {
            self.tuner.moves += 1;
        }
    }

    /// How many times the tuner moved the threshold, and the default it started from.
    pub(crate) fn tuned(&self) -> (u32, usize) {
        (self.tuner.moves, self.tuner.start)
    }

    /// The route is known to copy before any send (the peer is on loopback, where the kernel
    /// copies every zero-copy send on delivery): start as if a window had said so, probing after
    /// [`PROBE_MIN`] sends like any route that copies.
    pub(crate) fn start_copying(&mut self) {
        if self.reports_copies {
            self.mode = Mode::Copying {
                countdown: self.probe_gap(),
            };
        }
    }

    /// A probe ended without a release that says how it went (its send failed): probe again
    /// after the usual gap.
    pub(crate) fn probe_lost(&mut self) {
        if self.probe_out {
            self.probe_out = false;
            self.mode = Mode::Copying {
                countdown: self.probe_gap(),
            };
        }
    }

    /// What a send at a cap does.
    pub(crate) fn at_cap(&self) -> AtCap {
        self.at_cap
    }

    /// The kernel refused a zero-copy send for lack of budget: with [`AtCap::Copy`], copy for a
    /// while (with [`AtCap::Wait`] the engine waits for completions instead).
    pub(crate) fn on_refusal(&mut self) {
        if self.at_cap == AtCap::Wait {
            return;
        }
        self.hold = self.next_hold;
        self.next_hold = (self.next_hold * 2).min(HOLD_MAX);
    }

    /// A zero-copy send was accepted: refusals are no longer in a row.
    #[inline]
    pub(crate) fn on_accepted(&mut self) {
        self.next_hold = HOLD_MIN;
    }

    fn probe_gap(&self) -> u64 {
        PROBE_MIN
            << self
                .backoff
                .min(PROBE_MAX.trailing_zeros() - PROBE_MIN.trailing_zeros())
    }

    /// Sends (of a zero-copy size) until the next probe, while the route copies.
    pub(crate) fn next_probe_in(&self) -> Option<u64> {
        match self.mode {
            Mode::Copying { countdown } => Some(countdown),
            Mode::ZeroCopy => None,
        }
    }

    pub(crate) fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    pub(crate) fn caps(&self) -> Caps {
        self.caps
    }

    pub(crate) fn reports_copies(&self) -> bool {
        self.reports_copies
    }

    pub(crate) fn counts(&self) -> AutoCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> AutoPolicy {
        AutoPolicy::new(
            Thresholds {
                user: 4096,
                registered: 0,
            },
            Caps::default(),
            AtCap::Copy,
            true,
        )
    }

    /// A route scripted send by send: `copies(i)` says whether the kernel copies send `i`.
    /// Completions come back `lag` sends later. Returns, per send, whether it went zero-copy.
    fn drive(
        p: &mut AutoPolicy,
        sends: usize,
        lag: usize,
        copies: impl Fn(usize) -> bool,
    ) -> Vec<bool> {
        let mut in_flight: std::collections::VecDeque<(usize, bool)> = Default::default();
        let mut zc = Vec::with_capacity(sends);
        for i in 0..sends {
            match p.choose(65536, false, Load::default()) {
                Choice::ZeroCopy { probe } => {
                    in_flight.push_back((i, probe));
                    zc.push(true);
                }
                Choice::Copy(_) => zc.push(false),
                Choice::Wait => unreachable!("no caps"),
            }
            while in_flight.front().is_some_and(|&(j, _)| j + lag <= i) {
                let (j, probe) = in_flight.pop_front().unwrap();
                p.observe(copies(j), probe, 1);
            }
        }
        zc
    }

    proptest! {
        /// On a route that always copies, zero-copy sends become rare: after the first window
        /// (plus what was in flight), at most one send in `PROBE_MIN` goes zero-copy, and the
        /// probes thin out.
        #[test]
        fn never_zero_copy_forever_on_a_route_that_copies(lag in 0usize..200) {
            let mut p = policy();
            let zc = drive(&mut p, 300_000, lag, |_| true);
            let settled = WINDOW as usize + lag + 1;
            let later = zc[settled..].iter().filter(|&&z| z).count();
            prop_assert!(later <= (300_000 / PROBE_MIN as usize) + 1, "{later} zero-copy sends");
            // Backoff: the last 100k sends carry at most 100k / PROBE_MAX + 2 probes.
            let tail = zc[200_000..].iter().filter(|&&z| z).count();
            prop_assert!(tail <= (100_000 / PROBE_MAX as usize) + 2, "{tail} probes in the tail");
        }

        /// Whatever happened before, once the route starts paying, zero-copy is back within
        /// `PROBE_MAX` sends plus the completion lag, and stays.
        #[test]
        fn returns_to_zero_copy_once_the_route_pays(
            lag in 0usize..100,
            change in 0usize..200_000,
        ) {
            let mut p = policy();
            let n = change + PROBE_MAX as usize + 3 * lag + 2 * WINDOW as usize + 10;
            let zc = drive(&mut p, n, lag, |i| i < change);
            let back = change + PROBE_MAX as usize + 2 * lag + 2;
            prop_assert!(zc[back..].iter().all(|&z| z), "still copying after the route paid");
        }

        /// A route that copies some sends but not most keeps zero-copy.
        #[test]
        fn a_route_that_copies_a_few_keeps_zero_copy(lag in 0usize..50, every in 5usize..100) {
            let mut p = policy();
            let zc = drive(&mut p, 20_000, lag, |i| i % every == 0);
            prop_assert!(zc.iter().all(|&z| z));
        }

        /// Budget refusals: every send gets an answer at once (no spin); a hold ends, so zero-copy
        /// is tried again within `HOLD_MAX` sends of the last refusal; a wait is only chosen with
        /// something in flight.
        #[test]
        fn refusals_hold_then_retry_and_never_wait_on_nothing(
            refuse in proptest::collection::vec(any::<bool>(), 1..400),
            sends_in_flight in 0usize..4,
            wait: bool,
        ) {
            let mut p = AutoPolicy::new(
                Thresholds { user: 0, registered: 0 },
                Caps { sends: Some(2), bytes: None },
                if wait { AtCap::Wait } else { AtCap::Copy },
                true,
            );
            let mut since_zc = 0usize;
            for (i, &r) in refuse.iter().enumerate() {
                let load = Load { sends: sends_in_flight, bytes: 0 };
                match p.choose(1 << 16, false, load) {
                    Choice::ZeroCopy { .. } => {
                        since_zc = 0;
                        if r { p.on_refusal() } else { p.on_accepted() }
                    }
                    Choice::Wait => prop_assert!(sends_in_flight > 0 && wait, "send {i} waits on nothing"),
                    Choice::Copy(reason) => {
                        since_zc += 1;
                        prop_assert!(matches!(reason, CopyReason::Budget));
                        if sends_in_flight < 2 {
                            prop_assert!(since_zc <= HOLD_MAX as usize, "hold never ends");
                        }
                    }
                }
            }
        }

        /// The size threshold: below it always copy, whatever the route.
        #[test]
        fn small_sends_copy(len in 0usize..4096, registered: bool) {
            let mut p = policy();
            let c = p.choose(len, registered, Load::default());
            if registered {
                let zc = matches!(c, Choice::ZeroCopy { .. });
                prop_assert!(zc);
            } else {
                prop_assert_eq!(c, Choice::Copy(CopyReason::Small));
            }
        }
    }

    /// A sender whose sends cost `len` ns by copy and `0.8 * breakeven + 0.2 * len` ns zero-copy
    /// (they cross at `breakeven`), with noise, sizes drawn log-uniformly from 512 B to 128 KiB;
    /// returns the tuned threshold.
    fn tune(start: usize, breakeven: usize, seed: u64, sends: usize) -> usize {
        let mut p = AutoPolicy::new(
            Thresholds {
                user: start,
                registered: 0,
            },
            Caps::default(),
            AtCap::Copy,
            true,
        );
        let mut rng = seed | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let fixed = 0.8 * breakeven as f64;
        let mut clock = 0f64;
        for _ in 0..sends {
            let len = (512f64 * 256f64.powf((next() % 10_000) as f64 / 10_000.0)) as usize;
            let noise = 0.8 + 0.4 * (next() % 1000) as f64 / 1000.0;
            clock += noise
                * match p.choose(len, false, Load::default()) {
                    Choice::ZeroCopy { .. } => fixed + 0.2 * len as f64,
                    _ => len as f64,
                };
            if p.clock_due() {
                p.on_clock(clock as u64, true);
            }
        }
        p.thresholds().user
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// From any start, the threshold settles within the band around where zero-copy starts
        /// to pay, and never leaves its bounds.
        #[test]
        fn the_threshold_finds_where_zero_copy_pays(
            start_log in 10u32..17,
            breakeven_log in 11u32..16,
            seed: u64,
        ) {
            let breakeven = 1usize << breakeven_log;
            let t = tune(1 << start_log, breakeven, seed, 400_000);
            prop_assert!(t >= breakeven / 4 && t <= breakeven * 4, "threshold {t} for {breakeven}");
        }
    }

    #[test]
    fn the_threshold_moves_only_where_sends_are_near_it() {
        // Every send far above the threshold: no experiment, no move.
        let mut p = policy();
        let mut clock = 0;
        for _ in 0..100_000 {
            assert!(matches!(
                p.choose(1 << 20, false, Load::default()),
                Choice::ZeroCopy { .. }
            ));
            clock += 1000;
            if p.clock_due() {
                p.on_clock(clock, true);
            }
        }
        assert_eq!(p.tuned(), (0, 4096));
        assert_eq!(p.thresholds().user, 4096);
    }

    /// Sends `sends` buffers of `len` bytes, reading the clock whenever the policy says so (one
    /// microsecond of CPU per send), and returns how many readings it asked for.
    fn clock_readings(p: &mut AutoPolicy, len: usize, sends: usize) -> usize {
        let mut readings = 0;
        for i in 0..sends {
            p.choose(len, false, Load::default());
            if p.clock_due() {
                readings += 1;
                p.on_clock(i as u64 * 1000, true);
            }
        }
        readings
    }

    #[test]
    fn the_clock_is_read_only_where_an_experiment_uses_it() {
        let sends = 100_000;
        // Far above the threshold, far below it, and on a route that copies: no experiment can
        // start, so no reading is ever used, and none is asked for.
        assert_eq!(clock_readings(&mut policy(), 1 << 20, sends), 0);
        assert_eq!(clock_readings(&mut policy(), 100, sends), 0);
        let mut copying = policy();
        copying.start_copying();
        assert_eq!(clock_readings(&mut copying, 4096, sends), 0);
        // Near it: experiments run, and each reads the clock once per epoch of its own and once
        // before it starts; idle epochs between experiments are not read.
        let mut near = policy();
        let readings = clock_readings(&mut near, 4096, sends);
        let epochs = sends / EPOCH as usize;
        let cycle = (IDLE_EPOCHS + 2 * PAIRS) as usize;
        let per_cycle = 2 * PAIRS as usize + 1;
        assert!(readings > 0, "no experiment ran");
        assert!(
            readings <= (epochs / cycle + 1) * per_cycle,
            "{readings} readings in {epochs} epochs"
        );
        assert!(
            readings < epochs / 2,
            "{readings} readings in {epochs} epochs"
        );
    }

    #[test]
    fn byte_caps_apply_only_to_pinned_memory() {
        let mut p = AutoPolicy::new(
            Thresholds {
                user: 0,
                registered: 0,
            },
            Caps {
                sends: None,
                bytes: Some(100_000),
            },
            AtCap::Copy,
            true,
        );
        let load = Load {
            sends: 1,
            bytes: 60_000,
        };
        assert_eq!(
            p.choose(65536, false, load),
            Choice::Copy(CopyReason::Budget)
        );
        assert_eq!(
            p.choose(65536, true, load),
            Choice::ZeroCopy { probe: false }
        );
    }

    #[test]
    fn without_copy_reports_the_window_stays_off() {
        let mut p = AutoPolicy::new(
            Thresholds::new(Family::Uring, false),
            Caps::default(),
            AtCap::Copy,
            false,
        );
        let zc = drive(&mut p, 1000, 3, |_| true);
        assert!(zc.iter().all(|&z| z));
    }

    #[test]
    fn caps_are_half_the_limits() {
        let c = Caps::derive(Some(131_072), Some(8 << 20));
        assert_eq!(c.sends, Some(64));
        assert_eq!(c.bytes, Some(4 << 20));
        assert_eq!(Caps::derive(Some(100), None).sends, Some(1));
    }
}
