//! The sender thread's CPU clock for `auto`'s threshold tuner.

use super::policy::auto::AutoPolicy;

/// Reads the sender thread's CPU clock for `auto`'s threshold tuner once per epoch (the policy
/// says when), never per send.
#[derive(Debug, Default)]
pub(crate) struct EpochClock {
    last: Option<std::thread::ThreadId>,
}

impl EpochClock {
    #[inline]
    pub(crate) fn tick(&mut self, policy: &mut AutoPolicy) {
        if policy.clock_due() {
            let id = std::thread::current().id();
            let same = self.last == Some(id);
            self.last = Some(id);
            let ns = crate::sys::thread_cpu_ns();
            policy.on_clock(ns, same && ns > 0);
        }
    }
}
