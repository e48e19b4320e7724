//! [`SenderConfig`]: what a sender is built from, plain data below the engines. The engine
//! factory reads it once, when the sender is made; the engines read the settings it hands them
//! ([`UringConfig`], [`AtCap`]).

use crate::kind::EngineKind;
use crate::sys::uring::{UringConfig, UringShared};

/// How to build a [`Sender`](crate::Sender): [`SenderConfig::new`], then the `with_` methods.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SenderConfig {
    /// The engine.
    pub engine: EngineKind,
    /// Ring and batching settings for the io_uring engines (of the sender's own ring; a shared
    /// ring keeps the settings it was made with).
    pub uring: UringConfig,
    /// Submit through this shared ring instead of one of the sender's own, so one
    /// `io_uring_enter` carries requests for many sockets (io_uring engines only).
    pub ring: Option<UringShared>,
    /// For `msg-zc` on a socket that already has `SO_ZEROCOPY` set: the id its next
    /// `MSG_ZEROCOPY` send takes (the kernel counts from 0 per socket). `None` (the default)
    /// refuses such a socket, since a wrong count releases buffers early. Set `Some(0)` for a
    /// socket accepted from a listener that had `SO_ZEROCOPY` set (it inherits the flag, with a
    /// fresh counter). `auto` sends such a socket by copy unless this is set.
    pub zerocopy_first_id: Option<u32>,
    /// `auto`: what a send does when the sender is at its zero-copy in-flight cap (derived from
    /// `optmem_max` and `RLIMIT_MEMLOCK`) or the kernel just refused the budget: copy (the
    /// default) or wait for completions.
    pub at_cap: AtCap,
    /// `auto`: may it use io_uring (the default where the kernel offers zero-copy requests that
    /// report copies)? `false` keeps it on `sendmsg(2)`, e.g. where policy forbids io_uring.
    pub auto_uring: bool,
    /// Every engine: a batch's runs of equal-size datagrams (the last of a run may be shorter)
    /// go as UDP GSO trains, one call or io_uring request (and under `MSG_ZEROCOPY` one id) per
    /// run, where the socket is connected UDP and the kernel has GSO (the default).
    /// `false`: one datagram per call, e.g. where netfilter rules must see each datagram (an
    /// output-hook rule sees a train as one packet: docs/kernel.md, "UDP GSO trains").
    pub batch_trains: bool,
}

impl Default for SenderConfig {
    /// The `auto` engine with default settings.
    fn default() -> Self {
        Self::new(EngineKind::Auto)
    }
}

impl SenderConfig {
    /// `engine` with default settings.
    pub fn new(engine: EngineKind) -> Self {
        Self {
            engine,
            uring: UringConfig::default(),
            ring: None,
            zerocopy_first_id: None,
            at_cap: AtCap::default(),
            auto_uring: true,
            batch_trains: true,
        }
    }

    /// Whether a batch's runs of equal-size datagrams go as trains (see
    /// [`batch_trains`](Self::batch_trains)).
    pub fn with_batch_trains(mut self, on: bool) -> Self {
        self.batch_trains = on;
        self
    }

    /// `auto`: whether it may use io_uring (see [`auto_uring`](Self::auto_uring)).
    pub fn with_auto_uring(mut self, allow: bool) -> Self {
        self.auto_uring = allow;
        self
    }

    /// `auto`: what a send does at the zero-copy in-flight cap (see [`AtCap`]).
    pub fn with_at_cap(mut self, at_cap: AtCap) -> Self {
        self.at_cap = at_cap;
        self
    }

    /// `engine` on the shared `ring`.
    pub fn shared(engine: EngineKind, ring: &UringShared) -> Self {
        Self::new(engine).with_ring(ring)
    }

    /// Submits through the shared `ring` (io_uring engines only).
    pub fn with_ring(mut self, ring: &UringShared) -> Self {
        self.ring = Some(ring.clone());
        self
    }

    /// Ring and batching settings for the sender's own ring.
    pub fn with_uring(mut self, uring: UringConfig) -> Self {
        self.uring = uring;
        self
    }

    /// See [`zerocopy_first_id`](Self::zerocopy_first_id).
    pub fn with_zerocopy_first_id(mut self, id: u32) -> Self {
        self.zerocopy_first_id = Some(id);
        self
    }
}

/// What a send does at a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AtCap {
    /// Send it by copy now (reported as [`CopyReason::Budget`](crate::CopyReason::Budget)): the default, never slower than
    /// the copy engine and never blocks.
    #[default]
    Copy,
    /// Wait for zero-copy completions: `try_send` hands the buffer back
    /// ([`SendError::WouldBlock`](crate::SendError::WouldBlock)) and `send` waits. With nothing of
    /// the sender's in flight that could end the wait, the send is copied instead.
    Wait,
}
