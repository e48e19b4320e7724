//! The socket error queue reader of the `sendmsg(2)` engines: `recvmsg(MSG_ERRQUEUE)` without
//! blocking, each message decoded ([`cmsg::decode`]) and each zero-copy completion range handed
//! to the ledger, which settles every record whose last id it completes (docs/kernel.md,
//! "MSG_ZEROCOPY (sendmsg + socket error queue)").

use std::os::fd::BorrowedFd;

use crate::buf::SendBuf;
use crate::cmsg::{self, ErrQueueMsg};
use crate::engine::policy::sendmsg::has_error_queue;
use crate::engine::record::Record;
use crate::ledger::{Done, Ledger};
use crate::report::Stats;
use crate::socket::Socket;
use crate::sys;

/// Room for several messages' worth of control data; a completion needs 48 bytes.
const CONTROL_LEN: usize = 512;

/// Reads one socket's error queue. Invariant: `control` is [`CONTROL_LEN`] bytes and `msgs` is
/// empty between reads; `enabled` is false only on a socket whose `MSG_ERRQUEUE` read would read
/// something else (AF_UNIX reads its data queue), which is never read.
pub(crate) struct ErrQueue {
    enabled: bool,
    control: Vec<u8>,
    msgs: Vec<ErrQueueMsg>,
}

impl ErrQueue {
    /// The reader of `sock`'s queue; `zerocopy` once `SO_ZEROCOPY` was accepted on it.
    pub(crate) fn new(sock: &Socket, zerocopy: bool) -> Self {
        Self {
            enabled: has_error_queue(sock.kind.family, zerocopy),
            control: vec![0; CONTROL_LEN],
            msgs: Vec::new(),
        }
    }

    /// Reads the queue dry, or until a completion leaves no id in the ledger's window (owned or
    /// not: a failed datagram's id is learnt from its completion) in flight; returns how many
    /// owned ids completed. `settle` gets each record whose last id completed. A message the
    /// decoder or the ledger refuses is counted in `bad_completions` and skipped, never an error
    /// of a send.
    ///
    /// The early stop saves the read that would answer `EAGAIN`, one system call per reap when
    /// the kernel completed everything sent (the usual case, one coalesced range per reap): no
    /// completion of this sender can be queued behind that one. Whatever else is (TX timestamps,
    /// ICMP errors) keeps POLLERR up and is read by the next reap, which reads on past anything
    /// that is not such a completion, so a poll loop wakes for it at most once.
    pub(crate) fn reap<B: SendBuf>(
        &mut self,
        fd: BorrowedFd<'_>,
        ledger: &mut Ledger<Record<B>>,
        stats: &mut Stats,
        mut settle: impl FnMut(&mut Record<B>, Done, &mut Stats),
    ) -> u64 {
        let mut ids = 0;
        let mut emptied = false;
        while self.enabled && !emptied {
            stats.errqueue_reads += 1;
            if !self.read(fd, stats) {
                break;
            }
            for msg in self.msgs.drain(..) {
                let ErrQueueMsg::Zerocopy(range) = msg else {
                    stats.skipped_messages += 1;
                    continue;
                };
                stats.completions += 1;
                let owned_before = ledger.ids_in_flight();
                match ledger.complete_with(range, |rec, done| settle(rec, done, stats)) {
                    Ok(n) => {
                        stats.zerocopy_ids_completed += n;
                        let owned = ledger.ids_in_flight();
                        ids += (owned_before - owned) as u64;
                        emptied = owned == 0 && ledger.unowned_in_flight() == 0;
                    }
                    Err(_) => stats.bad_completions += 1,
                }
            }
        }
        ids
    }

    /// Reads one message and decodes it into `msgs`; `false` when there is nothing (more) to
    /// read.
    fn read(&mut self, fd: BorrowedFd<'_>, stats: &mut Stats) -> bool {
        let read = match sys::recv_errqueue(fd, &mut self.control) {
            Ok(Some(read)) => read,
            Ok(None) => return false,
            Err(_) => {
                // MSG_CTRUNC (cannot happen with CONTROL_LEN) or a socket error: the message is
                // gone; its ids, if any, stay in flight and the sender times out on them rather
                // than releasing anything early.
                stats.bad_completions += 1;
                return false;
            }
        };
        if read.control_len == 0 {
            // Not an error-queue message (everything the kernel queues there carries one): stop
            // rather than loop on whatever this socket returns instead.
            stats.bad_completions += 1;
            return false;
        }
        if cmsg::decode(&self.control[..read.control_len], &mut self.msgs).is_err() {
            // What decoded before the bad message is still handed on.
            stats.bad_completions += 1;
        }
        true
    }
}
