//! The task behind every [`AsyncSender`](super::AsyncSender): waits on the sender's readiness
//! through tokio's reactor and makes progress (pushes queued bytes, reads completions), so
//! buffers go out and come back while the sender's owner awaits something else entirely.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ::tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use ::tokio::io::Interest;
use ::tokio::sync::Notify;
use ::tokio::time::Instant;

use super::ring::Watch;
use crate::buf::SendBuf;
use crate::report::Released;
use crate::sender::Sender;

/// What the sender's owner and the driver share. The lock is never held across an await.
pub(super) struct Shared<B: SendBuf> {
    state: Mutex<State<B>>,
    /// Wakes the driver: work appeared, a send was handed back, the owner left, or (a shared
    /// ring's watcher) completions came for the sender.
    pub(super) driver: Arc<Notify>,
    /// Wakes the owner's waits (`send`, `released`, `flush`): the driver made progress, or
    /// readiness that may let a handed-back send go came.
    pub(super) owner: Notify,
    /// Turns of the driver's loop (each a wake-up that looks at the sender): a test hook.
    pub(super) turns: AtomicU64,
}

pub(super) struct State<B: SendBuf> {
    /// `None` once closed.
    pub(super) tx: Option<Sender<B>>,
    pub(super) released: VecDeque<Released<B>>,
    scratch: Vec<Released<B>>,
    /// The driver found nothing to wait for and sleeps until woken.
    pub(super) idle: bool,
    /// Owner calls waiting to retry a handed-back send.
    pub(super) blocked: usize,
    /// The socket reported it can no longer be written (`EPOLLHUP`, an error): tokio keeps that
    /// state set, so the driver stops waiting for writability (which would be ready for ever).
    write_closed: bool,
    /// An error from making progress, for the owner's next wait.
    pub(super) error: Option<io::Error>,
    /// The last reap failed (whether or not the owner took its error since).
    reap_failed: bool,
    /// The owner is gone (closed, or dropped): after `deadline` (dropped with buffers held), or
    /// at once (closed), the driver ends.
    pub(super) leaving: Option<Leave>,
}

#[derive(Clone, Copy)]
pub(super) enum Leave {
    /// `close`: stop now; the owner closes the sender.
    Now,
    /// Dropped with buffers in the kernel: keep collecting until none is held or the deadline,
    /// then close, keeping (leaking) what is still held.
    Drain(Instant),
}

impl<B: SendBuf> Shared<B> {
    pub(super) fn new(tx: Sender<B>, driver: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                tx: Some(tx),
                released: VecDeque::new(),
                scratch: Vec::new(),
                idle: false,
                blocked: 0,
                write_closed: false,
                error: None,
                reap_failed: false,
                leaving: None,
            }),
            driver,
            owner: Notify::new(),
            turns: AtomicU64::new(0),
        })
    }

    /// Locks, recovering from a poisoned lock (every update is whole under one lock).
    pub(super) fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The last of the owner and the driver is gone and neither closed the sender: the runtime shut
/// down (dropping the driver task before it ended), or a `close` was cancelled. Waiting here for
/// completions would block the thread dropping it, once per sender (a runtime's shutdown drops
/// its tasks one after another: 1 s each in the blocking [`Sender`]'s own drop). So it closes at
/// once: what the kernel released is collected and freed, and what it may still read is kept
/// (leaked, counted in [`leaked_buffers`](crate::leaked_buffers)), never freed.
impl<B: SendBuf> Drop for State<B> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            drop(tx.close(Duration::ZERO));
        }
    }
}

impl<B: SendBuf> State<B> {
    pub(super) fn tx(&mut self) -> &mut Sender<B> {
        self.tx.as_mut().expect("present until close")
    }

    /// Reaps into the queue of released buffers; returns how many came. An error is kept for
    /// the owner, and what the reap collected before it fails goes to the queue all the same: a
    /// reap that fails part way has released buffers (`Sender::reap` appends them before it
    /// reports), and counting them keeps `released` from answering `Ok(None)` while they wait.
    pub(super) fn reap(&mut self) -> usize {
        let Some(tx) = self.tx.as_mut() else {
            return 0;
        };
        let res = tx.reap(&mut self.scratch);
        self.reap_failed = res.is_err();
        if let Err(e) = res {
            self.error = Some(e);
        }
        let n = self.scratch.len();
        self.released.extend(self.scratch.drain(..));
        n
    }

    /// Reaps for one of the owner's own calls (`released`, `drain_released`, `flush`). Such a reap
    /// may take the completions whose readiness the driver waits for; the driver then cleared
    /// that readiness or never sees it, and a send handed back for lack of those completions
    /// waited for ever (seen twice under load: one task blocked in `send` with nothing in flight
    /// while another took the releases, `send_and_release_from_two_tasks`). So a reap here that
    /// made progress wakes the owner's waits whenever a send is blocked, as the driver's own reap
    /// does. The completion count is read only then: `released` reaps once per buffer.
    ///
    /// On a shared ring (`watched`: its driver is woken by the ring's watcher, not by the ring's
    /// readiness) the reap may also push a stream's next request into the SQ, and the driver
    /// would not wake to enter it; so the reap is followed by [`Sender::readiness`], which enters
    /// what waits in the SQ (no system call when nothing does), and wakes the driver if that
    /// failed, for it to retry.
    pub(super) fn reap_for_owner(&mut self, owner: &Notify, watched: Option<&Notify>) -> usize {
        let completions = |st: &Self| st.tx.as_ref().map(|t| t.stats().completions);
        let before = (self.blocked > 0).then(|| completions(self));
        let n = self.reap();
        // Released buffers also wake a release stream's consumer (`Releases`), which the
        // driver, idle once nothing is held, would not wake.
        if n > 0 || before.is_some_and(|before| completions(self) != before) {
            owner.notify_waiters();
        }
        if let (Some(driver), Some(tx)) = (watched, self.tx.as_mut()) {
            if tx.readiness().events & libc::POLLOUT != 0 {
                driver.notify_one();
            }
        }
        n
    }
}

/// The first pause before a progress that failed is tried again, doubled after each failure in a
/// row up to [`RETRY_MAX`]: an `io_uring_enter` that keeps failing (`EAGAIN`, `ENOMEM`: the
/// kernel is short of memory) is retried without keeping the executor busy, and soon after it
/// works again.
const RETRY_FIRST: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(64);

/// What to wait for next.
enum Wait {
    /// Nothing held, nothing handed back: sleep until woken.
    Idle,
    /// Look again at once (after a yield): a ring could not submit everything.
    Now,
    /// Readiness on the registered descriptor, looking again after the slice if there is one.
    Ready(Interest, Option<Duration>),
}

fn what_to_wait_for<B: SendBuf>(st: &mut State<B>, ring: bool) -> Wait {
    let (blocked, write_closed) = (st.blocked, st.write_closed);
    let tx = st.tx();
    let r = tx.readiness();
    let room = r.events & libc::POLLOUT != 0 && !write_closed;
    let slice = tx.wait_slice();
    if tx.in_flight() == 0 && blocked == 0 {
        return Wait::Idle;
    }
    if slice.is_some_and(|s| s.is_zero()) {
        return Wait::Now;
    }
    let interest = match (ring, room) {
        // A ring asks for POLLOUT only when something could not be submitted: try again now.
        (true, true) => return Wait::Now,
        (true, false) => Interest::READABLE,
        // The error queue (EPOLLERR) always; writability only while a send waits for room, so
        // that waiting for completions does not wake on a writable socket.
        (false, true) => Interest::WRITABLE | Interest::ERROR,
        (false, false) => Interest::ERROR,
    };
    Wait::Ready(interest, slice)
}

/// What wakes the driver besides its [`Shared::driver`].
pub(super) enum Waker {
    /// Readiness of its own duplicate of the descriptor the sender names (a socket, or a ring of
    /// the sender's own).
    Fd(AsyncFd<OwnedFd>),
    /// A shared ring's watcher, which wakes the driver when the sender got completions.
    Ring(Watch),
}

/// Waits for `interest` on `io`, at most `until`. `None`: the time ran out.
async fn ready(
    io: &AsyncFd<OwnedFd>,
    interest: Interest,
    until: Option<Instant>,
) -> io::Result<Option<AsyncFdReadyGuard<'_, OwnedFd>>> {
    match until {
        Some(t) => match ::tokio::time::timeout_at(t, io.ready(interest)).await {
            Ok(guard) => guard.map(Some),
            Err(_) => Ok(None),
        },
        None => io.ready(interest).await.map(Some),
    }
}

/// The driver: runs until the owner leaves (and, after a drop, until the kernel released
/// everything or the drop deadline passed). Owns the registration of the readiness descriptor,
/// or its place with the shared ring's watcher.
pub(super) async fn drive<B: SendBuf>(shared: Arc<Shared<B>>, mut waker: Waker, ring: bool) {
    // The pause before the next try when progress fails again and again; `None` while it works.
    let mut retry: Option<Duration> = None;
    loop {
        shared.turns.fetch_add(1, Ordering::Relaxed);
        let (wait, failed) = {
            let mut st = shared.lock();
            let n = st.reap();
            if n > 0 || st.error.is_some() {
                shared.owner.notify_waiters();
            }
            let Some(tx) = st.tx.as_mut() else {
                return;
            };
            let held = tx.in_flight();
            match st.leaving {
                Some(Leave::Now) => return,
                Some(Leave::Drain(deadline)) if held == 0 || Instant::now() >= deadline => {
                    let tx = st.tx.take().expect("checked above");
                    drop(st);
                    // Deregister before the socket goes; what the kernel still holds is kept.
                    drop(waker);
                    let _ = tx.close(Duration::ZERO);
                    // A release stream ends now.
                    shared.owner.notify_waiters();
                    return;
                }
                _ => {}
            }
            let wait = what_to_wait_for(&mut st, ring);
            st.idle = matches!(wait, Wait::Idle);
            (wait, st.reap_failed)
        };
        retry = failed.then(|| retry.map_or(RETRY_FIRST, |r| (r * 2).min(RETRY_MAX)));
        let drain_deadline = match shared.lock().leaving {
            Some(Leave::Drain(d)) => Some(d),
            _ => None,
        };
        // A wait that ends at once without progress must not starve the runtime's other tasks.
        ::tokio::task::consume_budget().await;
        match wait {
            Wait::Idle => match drain_deadline {
                Some(_) => {} // nothing held: the next turn closes
                None => shared.driver.notified().await,
            },
            Wait::Now => match retry {
                // Progress failed, and would fail again at once: pause, unless the owner wakes
                // the driver (a new send, a close).
                Some(pause) => {
                    let until = Instant::now() + pause;
                    let until = drain_deadline.map_or(until, |d| d.min(until));
                    ::tokio::select! {
                        () = shared.driver.notified() => {}
                        () = ::tokio::time::sleep_until(until) => {}
                    }
                }
                None => ::tokio::task::yield_now().await,
            },
            Wait::Ready(_, slice) if matches!(waker, Waker::Ring(_)) => {
                let Waker::Ring(watch) = &mut waker else {
                    unreachable!("matched above")
                };
                // The watcher wakes the driver when the sender's completions come, whoever reaped
                // them, so the slice that stands in for that wake-up is needed only if the watcher
                // ended (its runtime shut down) and no new one could start.
                let slice = match watch.alive() || watch.renew().is_ok() {
                    true => None,
                    false => slice,
                };
                let until = match (slice.map(|s| Instant::now() + s), drain_deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                match until {
                    Some(t) => {
                        ::tokio::select! {
                            () = shared.driver.notified() => {}
                            () = ::tokio::time::sleep_until(t) => {}
                        }
                    }
                    None => shared.driver.notified().await,
                }
                shared.lock().reap();
                // Completions may have made room for a handed-back send, which only its retry
                // can tell.
                shared.owner.notify_waiters();
            }
            Wait::Ready(interest, slice) => {
                let Waker::Fd(io) = &waker else {
                    unreachable!("a ring's watcher is matched above")
                };
                let until = match (slice.map(|s| Instant::now() + s), drain_deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let guard = ::tokio::select! {
                    biased;
                    () = shared.driver.notified() => continue,
                    g = ready(io, interest, until) => g,
                };
                let guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        shared.lock().error = Some(e);
                        shared.owner.notify_waiters();
                        continue;
                    }
                };
                let n = {
                    let mut st = shared.lock();
                    let n = st.reap();
                    if n == 0 && guard.as_ref().is_some_and(|g| g.ready().is_write_closed()) {
                        st.write_closed = true;
                    }
                    n
                };
                // Wake the owner either way: readiness may have made room for a handed-back
                // send, which only its retry can tell.
                shared.owner.notify_waiters();
                if n == 0 {
                    // Nothing came: clear the readiness seen (tokio keeps any that came since, by
                    // its tick), so the next wait needs a new edge. A handed-back send retries
                    // after this clear, and wakes the driver again if it is still blocked.
                    if let Some(mut g) = guard {
                        g.clear_ready();
                    }
                }
            }
        }
    }
}
