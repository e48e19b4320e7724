//! [`UringConfig`]: the ring's size and the batching of the io_uring engines, read by the ring
//! ([`UringShared`](super::UringShared)) and by every io_uring engine.

/// Ring and batching settings for the io_uring engines: `UringConfig::default()`, then the
/// `with_` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UringConfig {
    /// Submission queue entries, and the requests one sender may have in flight (the CQ gets
    /// twice as many, plus room for each sender of a shared ring).
    pub entries: u32,
    /// Buffers per request on a stream socket, and requests queued before an `io_uring_enter`.
    pub batch: usize,
    /// Buffers accepted but not yet in a request before `try_send` answers `WouldBlock`.
    pub queue_limit: usize,
    /// Senders a shared ring ([`UringShared`](crate::UringShared)) takes at once: its completion
    /// queue keeps room for one request of each (three completions), so senders whose requests
    /// are parked never take the room another sender needs. A sender's own ring takes one.
    pub senders: u32,
}

impl UringConfig {
    /// Submission queue entries.
    pub fn with_entries(mut self, entries: u32) -> Self {
        self.entries = entries;
        self
    }

    /// Buffers per stream request, and requests queued before an `io_uring_enter`.
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Buffers accepted but not yet in a request before `try_send` answers `WouldBlock`.
    pub fn with_queue_limit(mut self, queue_limit: usize) -> Self {
        self.queue_limit = queue_limit;
        self
    }

    /// Senders a shared ring takes at once.
    pub fn with_senders(mut self, senders: u32) -> Self {
        self.senders = senders;
        self
    }
}

impl Default for UringConfig {
    fn default() -> Self {
        Self {
            entries: 256,
            batch: 32,
            queue_limit: 256,
            senders: 4096,
        }
    }
}
