//! One io_uring per runtime thread, shared by the senders made on it, and one watcher per shared
//! ring that wakes only the drivers whose sender got completions.
//!
//! The senders on a shared ring wait on one registration of the ring's descriptor with tokio's
//! reactor, not one each: with one each, every completion woke every driver on the ring, each to
//! find nothing of its own, so a stream's cost grew with the idle senders beside it. The watcher
//! is a task that waits for the ring's descriptor to turn readable, moves the completions into
//! their senders' inboxes (`UringShared::route`) and wakes just the drivers of those senders. A
//! driver or an owner's call that reaps the ring itself moves the other senders' completions into
//! their inboxes the same way, and the ring then wakes a watcher through its inbox hook
//! (`UringShared::on_inbox`). The completions' readiness cannot be relied on for that: epoll
//! reports the ring readable only if CQEs are still in the CQ when the event loop asks, and the
//! reap took them first.
//!
//! There is one watcher per ring and runtime with async senders on it (a ring's senders may be
//! made on several runtimes), and one map of the ring's drivers that every watcher of the ring
//! wakes from: a completion is named once, to whichever watcher routes it first.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;
use ::tokio::runtime::{Handle, Id};
use ::tokio::sync::Notify;

use crate::error::Error;
use crate::sys::uring::InboxHook;
use crate::sys::uring::{UringConfig, UringShared};

thread_local! {
    static RING: RefCell<Option<UringShared>> = const { RefCell::new(None) };
}

/// The watchers of the shared rings with async senders, one per ring and runtime.
static WATCHERS: Mutex<Vec<Weak<Watcher>>> = Mutex::new(Vec::new());

/// The calling thread's shared io_uring, made on first use with [`UringConfig::default`]
/// (`io_uring_setup`). Give it to the `uring` and `uring-zc` senders made on this thread
/// ([`SenderConfig::shared`](crate::SenderConfig::shared)), so one `io_uring_enter` submits for
/// all of them; on a multi-thread runtime each worker thread gets its own ring.
///
/// The ring lives as long as the thread, or the last sender on it. A sender may move to another
/// thread afterwards and keep using the ring it was made with (the ring is locked per
/// operation); a request parked by a thread that exited is submitted again (see
/// [`UringShared`]).
pub fn thread_ring() -> Result<UringShared, Error> {
    RING.with(|slot| {
        let mut slot = slot.borrow_mut();
        if let Some(ring) = slot.as_ref() {
            return Ok(ring.clone());
        }
        let ring = UringShared::new(UringConfig::default())?;
        *slot = Some(ring.clone());
        Ok(ring)
    })
}

/// The drivers of one shared ring's senders, by owner id. Every watcher of the ring (one per
/// runtime with senders on it) wakes drivers from this one map: `Ring::route` names an owner
/// once, to whichever watcher routes first, and that one must be able to wake it.
struct RingDrivers {
    ring: UringShared,
    map: Mutex<HashMap<u16, Arc<Notify>>>,
    /// The wake-ups of the ring's watchers (one per runtime), which the ring's inbox hook calls
    /// when a reap outside the watchers (a driver, an owner's call) moved completions into another
    /// sender's inbox: the ring's readiness may never tell (see the module docs). Every watcher is
    /// woken, not one: one whose runtime is not being driven must not take the only wake-up.
    routed: Arc<Mutex<Vec<Weak<Notify>>>>,
    /// The hook set on the ring that wakes `routed`.
    hook: InboxHook,
}

impl Drop for RingDrivers {
    fn drop(&mut self) {
        // No async sender is left on the ring: nobody to tell (a newer map's hook stays).
        self.ring.clear_on_inbox(&self.hook);
    }
}

/// The driver maps of the shared rings that have async senders.
static RINGS: Mutex<Vec<Weak<RingDrivers>>> = Mutex::new(Vec::new());

/// Locks, recovering from a poisoned lock (every update is whole under one lock).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The driver map of `ring`, made on first use.
fn ring_drivers(ring: &UringShared) -> Arc<RingDrivers> {
    let mut list = lock(&RINGS);
    list.retain(|d| d.strong_count() > 0);
    if let Some(d) = list
        .iter()
        .filter_map(Weak::upgrade)
        .find(|d| d.ring.same(ring))
    {
        return d;
    }
    let routed: Arc<Mutex<Vec<Weak<Notify>>>> = Arc::default();
    let watchers = routed.clone();
    let hook: InboxHook = Arc::new(move || {
        for w in lock(&watchers).iter().filter_map(Weak::upgrade) {
            w.notify_one();
        }
    });
    ring.on_inbox(hook.clone());
    let d = Arc::new(RingDrivers {
        ring: ring.clone(),
        map: Mutex::new(HashMap::new()),
        routed,
        hook,
    });
    list.push(Arc::downgrade(&d));
    d
}

/// The watcher of one shared ring on one runtime: see the module docs.
pub(super) struct Watcher {
    drivers: Arc<RingDrivers>,
    /// The runtime its task runs on.
    runtime: Id,
    state: Mutex<WatchState>,
    /// Wakes the watcher's task to see whether any driver is left.
    stop: Notify,
    /// Wakes the watcher's task to route: the ring's inbox hook calls it.
    routed: Arc<Notify>,
}

struct WatchState {
    /// Drivers that came through this watcher and are still there.
    users: usize,
    /// The task runs: false once it ended (no driver left, or its runtime shut down).
    alive: bool,
}

/// The live watcher of `drivers`' ring on the current runtime, or a new one, with one more
/// user.
fn join_watcher(drivers: &Arc<RingDrivers>) -> Result<Arc<Watcher>, Error> {
    let Ok(runtime) = Handle::try_current().map(|h| h.id()) else {
        return Err(Error::Config {
            problem: "an AsyncSender's driver outside a tokio runtime".into(),
            fix: "make the sender from a task, or inside Runtime::enter".into(),
        });
    };
    let mut list = lock(&WATCHERS);
    list.retain(|w| w.strong_count() > 0);
    let mine = |w: &Watcher| w.runtime == runtime && Arc::ptr_eq(&w.drivers, drivers);
    if let Some(w) = list.iter().filter_map(Weak::upgrade).find(|w| mine(w)) {
        let mut st = lock(&w.state);
        if st.alive {
            st.users += 1;
            drop(st);
            return Ok(w);
        }
    }
    let w = start(drivers.clone(), runtime)?;
    list.retain(|old| !old.upgrade().is_some_and(|old| mine(&old)));
    list.push(Arc::downgrade(&w));
    Ok(w)
}

/// One user of `w` is gone; the last one stops its task.
fn leave_watcher(w: &Watcher) {
    let mut st = lock(&w.state);
    st.users -= 1;
    let last = st.users == 0;
    drop(st);
    if last {
        w.stop.notify_one();
    }
}

/// A driver's place with its ring's watcher, given up when dropped.
pub(super) struct Watch {
    watcher: Arc<Watcher>,
    owner: u16,
    driver: Arc<Notify>,
}

impl Watch {
    /// Wakes `driver` whenever owner `owner` of `ring` gets completions, through the ring's
    /// watcher on the current runtime, started if it has none (which registers a
    /// duplicate of the ring's descriptor with the reactor: `fcntl(F_DUPFD_CLOEXEC)`,
    /// `epoll_ctl`).
    pub(super) fn new(ring: UringShared, owner: u16, driver: Arc<Notify>) -> Result<Self, Error> {
        let drivers = ring_drivers(&ring);
        lock(&drivers.map).insert(owner, driver.clone());
        let watch = Self {
            watcher: join_watcher(&drivers).inspect_err(|_| {
                lock(&drivers.map).remove(&owner);
            })?,
            owner,
            driver,
        };
        Ok(watch)
    }

    /// Whether the watcher still runs (its runtime may have shut down while this driver's runs
    /// on: see [`renew`](Self::renew)).
    pub(super) fn alive(&self) -> bool {
        lock(&self.watcher.state).alive
    }

    /// Takes the ring's live watcher on the current runtime, or starts one.
    pub(super) fn renew(&mut self) -> Result<(), Error> {
        let new = join_watcher(&self.watcher.drivers)?;
        let old = std::mem::replace(&mut self.watcher, new);
        leave_watcher(&old);
        Ok(())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut map = lock(&self.watcher.drivers.map);
        // The id may already belong to a newer sender's driver: leave that one.
        if map
            .get(&self.owner)
            .is_some_and(|d| Arc::ptr_eq(d, &self.driver))
        {
            map.remove(&self.owner);
        }
        drop(map);
        leave_watcher(&self.watcher);
    }
}

/// Starts a watcher of `drivers`' ring on the current runtime, with one user.
fn start(drivers: Arc<RingDrivers>, runtime: Id) -> Result<Arc<Watcher>, Error> {
    let dup = crate::sys::dup_raw(drivers.ring.fd()).map_err(|source| Error::Io {
        context: "fcntl(F_DUPFD_CLOEXEC) of the shared io_uring's descriptor",
        source,
    })?;
    let io = crate::sys::async_fd(dup, Interest::READABLE).map_err(|source| Error::Io {
        context: "registering the shared io_uring's descriptor with tokio (epoll_ctl)",
        source,
    })?;
    let routed = Arc::new(Notify::new());
    {
        let mut list = lock(&drivers.routed);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&routed));
    }
    let watcher = Arc::new(Watcher {
        drivers,
        runtime,
        state: Mutex::new(WatchState {
            users: 1,
            alive: true,
        }),
        stop: Notify::new(),
        routed,
    });
    let rt = Handle::current();
    super::spawn_named("zerotx ring watcher", watch(watcher.clone(), io), &rt);
    Ok(watcher)
}

/// Marks the watcher ended when its task ends or is dropped (its runtime shut down), and wakes
/// every driver still on it, so each takes a new watcher.
struct Ended(Arc<Watcher>);

impl Drop for Ended {
    fn drop(&mut self) {
        lock(&self.0.state).alive = false;
        // Drivers of other watchers look once, find theirs alive, and wait again.
        for d in lock(&self.0.drivers.map).values() {
            d.notify_one();
        }
    }
}

/// The watcher's task: routes the ring's completions and wakes their owners' drivers, until no
/// driver is left.
async fn watch(watcher: Arc<Watcher>, io: AsyncFd<OwnedFd>) {
    let ended = Ended(watcher);
    let w = &ended.0;
    let mut woken = Vec::new();
    // A new watcher routes once before it waits: completions moved into inboxes while the ring
    // had no hook (before its first async sender) told nobody, and their owners wait to be named.
    w.routed.notify_one();
    loop {
        let guard = ::tokio::select! {
            biased;
            () = w.stop.notified() => {
                let mut st = lock(&w.state);
                if st.users == 0 {
                    // Ended under the lock a new driver looks for a live watcher under.
                    st.alive = false;
                    return;
                }
                continue;
            }
            () = w.routed.notified() => None,
            g = io.readable() => Some(g),
        };
        let guard = match guard {
            None => None,
            Some(Ok(g)) => Some(g),
            // The reactor is gone (the runtime shuts down): the drivers take a new watcher.
            Some(Err(_)) => return,
        };
        w.drivers.ring.route(&mut woken);
        {
            let map = lock(&w.drivers.map);
            for id in woken.drain(..) {
                if let Some(d) = map.get(&id) {
                    d.notify_one();
                }
            }
        }
        // Every CQE posted before the route was moved; one posted since came with a new
        // readiness tick, which this clear keeps (tokio clears only the tick it handed out).
        if let Some(mut guard) = guard {
            guard.clear_ready();
        }
    }
}
