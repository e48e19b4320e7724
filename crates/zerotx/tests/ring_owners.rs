//! The ring itself, shared by owners, with real requests on UDP sockets on loopback: a request
//! comes back with its last CQE only, an owner's other requests come as `Other`, requests of an
//! owner that left are freed after their last CQE, completions routed to inboxes name their
//! owners and call the inbox hook, a file slot outlives the SQEs that name it, a full SQ hands
//! the request back.

use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use socket2::SockAddr;

use zerotx::internals::uring::{
    self, Completion, InboxHook, Payload, Ring, SendKind, SendOp, CANCEL,
};
use zerotx::internals::uring_faults::{inject, Faults};
use zerotx::SendBuf;

/// A buffer that counts its drops.
struct Counted(Vec<u8>, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: the Vec's heap bytes do not move with the value, and nothing changes them.
unsafe impl SendBuf for Counted {
    fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A request of one whole buffer to the connected peer.
impl Payload for Counted {
    type Buf = Self;

    fn bufs(&self) -> &[Self] {
        std::slice::from_ref(self)
    }

    fn sent(&self) -> usize {
        0
    }

    fn dest(&self) -> Option<&SockAddr> {
        None
    }
}

/// A UDP socket connected to itself on 127.0.0.1, and a `SENDMSG_ZC` of 1000 bytes on it.
fn setup(drops: &Arc<AtomicUsize>) -> Option<(UdpSocket, Box<SendOp<Counted>>)> {
    if !zerotx_testbed::require(
        uring::probe().is_ok_and(|p| p.sendmsg_zc),
        "no IORING_OP_SENDMSG_ZC",
    ) {
        return None;
    }
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    sock.connect(sock.local_addr().unwrap()).unwrap();
    let mut op = SendOp::new(Counted(vec![7; 1000], drops.clone()));
    op.set(
        sock.as_raw_fd(),
        SendKind::ZeroCopy { zc_flags: 0 },
        libc::MSG_NOSIGNAL,
    );
    Some((sock, op))
}

/// Reaps for `owner` until the ring has nothing in flight.
fn reap_all(ring: &mut Ring, owner: u16) -> Vec<Completion<SendOp<Counted>>> {
    let mut out = Vec::new();
    for _ in 0..100 {
        ring.reap_for(owner, &mut out);
        if ring.in_flight() == 0 {
            return out;
        }
        uring::poll_one(ring.fd(), libc::POLLIN, Some(Duration::from_millis(50))).unwrap();
    }
    panic!("requests still in flight after 5 s");
}

#[test]
fn a_request_comes_back_with_its_last_cqe_only() {
    let drops = Arc::new(AtomicUsize::new(0));
    let Some((_sock, op)) = setup(&drops) else {
        return;
    };
    let mut ring = Ring::new(8, 4, 4).unwrap();
    let owner = ring.join(None).unwrap();
    assert!(ring.push(owner, 5, op).is_ok());
    ring.submit().unwrap();
    let got = reap_all(&mut ring, owner);
    let (last, before) = got.split_last().unwrap();
    assert!(last.cqe.last && last.op.is_some(), "{:?}", last.cqe);
    for c in before {
        assert!(!c.cqe.last && c.op.is_none(), "{:?}", c.cqe);
    }
    // A zero-copy send posts its result and a notification, in either order.
    assert_eq!(got.len(), 2);
    assert!(got.iter().any(|c| c.cqe.is_notif()));
    let first = got.iter().find(|c| !c.cqe.is_notif()).unwrap().cqe;
    assert_eq!((first.owner, first.req, first.res), (owner, 5, 1000));
    assert!(first.more());
    let op = got.into_iter().find_map(|c| c.op).unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    assert_eq!(op.payload().0, vec![7; 1000]);
    drop(op);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

/// An owner's requests of another type than the one it reaps (its cancel) come as
/// `Lent::Other` with their tag, never handed back as one of its sends.
#[test]
fn a_request_of_another_type_comes_as_other_with_its_tag() {
    let drops = Arc::new(AtomicUsize::new(0));
    let Some((sock, op)) = setup(&drops) else {
        return;
    };
    let mut ring = Ring::new(8, 4, 4).unwrap();
    let owner = ring.join(None).unwrap();
    assert!(ring.push(owner, 0, op).is_ok());
    ring.submit().unwrap();
    assert!(ring.push_cancel(owner, sock.as_raw_fd()).unwrap());
    ring.submit().unwrap();
    let got = reap_all(&mut ring, owner);
    let cancel: Vec<_> = got.iter().filter(|c| c.cqe.req == CANCEL).collect();
    assert_eq!(cancel.len(), 1);
    assert!(cancel[0].cqe.last && cancel[0].op.is_none());
    let sends: Vec<_> = got.iter().filter(|c| c.cqe.req == 0).collect();
    assert_eq!(sends.iter().filter(|c| c.op.is_some()).count(), 1);
}

#[test]
fn requests_of_an_owner_that_left_are_freed_after_their_last_cqe_and_a_dropped_rings_leaked() {
    let drops = Arc::new(AtomicUsize::new(0));
    let Some((_sock, op)) = setup(&drops) else {
        return;
    };
    let mut ring = Ring::new(8, 4, 4).unwrap();
    let owner = ring.join(None).unwrap();
    let other = ring.join(None).unwrap();
    assert!(ring.push(owner, 0, op).is_ok());
    ring.submit().unwrap();
    ring.leave(owner);
    // Another owner reaps the request's CQEs: the request departs, and the id comes free.
    assert!(reap_all(&mut ring, other).is_empty());
    assert_eq!(drops.load(Ordering::SeqCst), 0, "dropped under the ring");
    let departed = ring.take_departed();
    assert_eq!(departed.len(), 1);
    drop(departed);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "freed after its last CQE");
    assert_eq!(ring.join(None), Ok(owner));
    // A request still in the ring when it is dropped (here never even submitted).
    let (_sock, op) = setup(&drops).unwrap();
    assert!(ring.push(other, 0, op).is_ok());
    drop(ring);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

/// Waits until a CQE is posted (the ring's fd turns readable), up to 1 s.
fn wait_cqe(ring: &Ring) {
    uring::poll_one(ring.fd(), libc::POLLIN, Some(Duration::from_secs(1))).unwrap();
}

#[test]
fn route_names_only_the_owners_whose_inbox_got_cqes() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, _rx) = udp_pair();
    let mut ring = Ring::new(8, 4, 4).unwrap();
    let (a, b, idle) = (
        ring.join(None).unwrap(),
        ring.join(None).unwrap(),
        ring.join(None).unwrap(),
    );
    let mut woken = Vec::new();
    // A CQE in the CQ: moved into its owner's inbox, and its owner named, once.
    assert!(ring.push(a, 0, copy_op(&tx, 1, &drops)).is_ok());
    ring.submit().unwrap();
    wait_cqe(&ring);
    ring.route(&mut woken);
    assert_eq!(woken, [a]);
    woken.clear();
    ring.route(&mut woken);
    assert!(woken.is_empty(), "named again: {woken:?}");
    let got = reap_all(&mut ring, a);
    assert_eq!(got.len(), 1);
    assert!(got[0].cqe.last && got[0].op.is_some());
    // A CQE another owner's reap moved into an inbox: its owner is named all the same.
    assert!(ring.push(b, 0, copy_op(&tx, 2, &drops)).is_ok());
    ring.submit().unwrap();
    wait_cqe(&ring);
    assert!(reap_all(&mut ring, a).is_empty());
    ring.route(&mut woken);
    assert_eq!(woken, [b]);
    woken.clear();
    // One that claimed its inbox before the route looked is not named.
    assert!(ring.push(b, 0, copy_op(&tx, 3, &drops)).is_ok());
    ring.submit().unwrap();
    wait_cqe(&ring);
    assert!(reap_all(&mut ring, a).is_empty());
    assert_eq!(reap_all(&mut ring, b).len(), 2);
    ring.route(&mut woken);
    assert!(woken.is_empty(), "named with an empty inbox: {woken:?}");
    // An owner that left is never named: its request departs at its last CQE.
    assert!(ring.push(a, 0, copy_op(&tx, 4, &drops)).is_ok());
    ring.submit().unwrap();
    ring.leave(a);
    wait_cqe(&ring);
    ring.route(&mut woken);
    assert!(woken.is_empty(), "a departed owner named: {woken:?}");
    assert_eq!(ring.take_departed().len(), 1);
    assert!(!woken.contains(&idle));
    assert_eq!(ring.in_flight(), 0);
}

/// A reap that moves CQEs into another owner's inbox calls the inbox hook, once until
/// `route` looks; `route`'s own moves do not (it names those owners itself); a cleared hook,
/// or one replaced since, is not called.
#[test]
fn a_reap_for_another_owner_calls_the_inbox_hook() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, _rx) = udp_pair();
    let mut ring = Ring::new(8, 4, 4).unwrap();
    let (a, b) = (ring.join(None).unwrap(), ring.join(None).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let hook: InboxHook = Arc::new(move || {
        counter.fetch_add(1, Ordering::Relaxed);
    });
    ring.on_inbox(Some(hook.clone()));
    let mut woken = Vec::new();
    let send = |ring: &mut Ring, owner, byte| {
        assert!(ring.push(owner, 0, copy_op(&tx, byte, &drops)).is_ok());
        ring.submit().unwrap();
        wait_cqe(ring);
    };
    send(&mut ring, b, 1);
    assert!(reap_all(&mut ring, a).is_empty());
    assert_eq!(
        calls.load(Ordering::Relaxed),
        1,
        "b's CQE moved by a's reap"
    );
    send(&mut ring, b, 2);
    assert!(reap_all(&mut ring, a).is_empty());
    assert_eq!(
        calls.load(Ordering::Relaxed),
        1,
        "b not yet named: told once"
    );
    ring.route(&mut woken);
    assert_eq!(woken, [b]);
    assert_eq!(reap_all(&mut ring, b).len(), 2);
    send(&mut ring, b, 3);
    ring.route(&mut woken);
    assert_eq!(
        calls.load(Ordering::Relaxed),
        1,
        "route names what it moves itself"
    );
    assert_eq!(reap_all(&mut ring, b).len(), 1);
    // A hook replaced since is not cleared by its predecessor's owner.
    let other: InboxHook = Arc::new(|| {});
    ring.clear_on_inbox(&other);
    send(&mut ring, b, 4);
    assert!(reap_all(&mut ring, a).is_empty());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    ring.clear_on_inbox(&hook);
    ring.route(&mut woken);
    assert_eq!(reap_all(&mut ring, b).len(), 1);
    send(&mut ring, b, 5);
    assert!(reap_all(&mut ring, a).is_empty());
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "a cleared hook was called"
    );
    assert_eq!(reap_all(&mut ring, b).len(), 1);
}

/// A `SENDMSG` (copy) of `byte` on `sock`.
fn copy_op(sock: &UdpSocket, byte: u8, drops: &Arc<AtomicUsize>) -> Box<SendOp<Counted>> {
    let mut op = SendOp::new(Counted(vec![byte; 100], drops.clone()));
    op.set(sock.as_raw_fd(), SendKind::Copy, libc::MSG_NOSIGNAL);
    op
}

/// A UDP socket connected to a receiver on 127.0.0.1, and the receiver (non-blocking).
fn udp_pair() -> (UdpSocket, UdpSocket) {
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    rx.set_nonblocking(true).unwrap();
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    (tx, rx)
}

/// The first byte of each datagram waiting on `rx`.
fn received(rx: &UdpSocket) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 200];
    while let Ok(n) = rx.recv(&mut buf) {
        assert_eq!(n, 100);
        got.push(buf[0]);
    }
    got
}

/// An owner's registered file slot is cleared, and its id (and so its slot) given to another
/// socket, only once no SQE can name it: an SQE still unsubmitted when its owner leaves goes to
/// the owner's socket (not `EBADF`, not the newcomer's socket).
#[test]
fn a_file_slot_outlives_the_sqes_that_name_it() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut ring = Ring::new(8, 8, 4).unwrap();
    if !zerotx_testbed::require(
        ring.file_slots() != 0,
        "no sparse registered file table (5.19)",
    ) {
        return;
    }
    let (a, a_rx) = udp_pair();
    let (b, b_rx) = udp_pair();
    let owner = ring.join(Some(a.as_raw_fd())).unwrap();
    assert_eq!(ring.file_slot(owner), Some(0));
    assert!(ring.push(owner, 0, copy_op(&a, 0xAA, &drops)).is_ok());
    // Leaves with its SQE unsubmitted: its slot stays, its id is not free.
    ring.leave(owner);
    let other = ring.join(Some(b.as_raw_fd())).unwrap();
    assert_ne!(other, owner);
    ring.submit().unwrap();
    let mut done: Vec<Completion<SendOp<Counted>>> = Vec::new();
    for _ in 0..100 {
        ring.reap_for(other, &mut done);
        if ring.in_flight() == 0 {
            break;
        }
        uring::poll_one(ring.fd(), libc::POLLIN, Some(Duration::from_millis(50))).unwrap();
    }
    assert_eq!(
        received(&a_rx),
        vec![0xAA],
        "the leaver's SQE reached its own socket"
    );
    // Its request finished: the slot is cleared and the id free for a newcomer on `b`.
    let third = ring.join(Some(b.as_raw_fd())).unwrap();
    assert_eq!(third, owner);
    assert!(ring.push(third, 0, copy_op(&b, 0xBB, &drops)).is_ok());
    ring.submit().unwrap();
    reap_all(&mut ring, third);
    assert_eq!(received(&b_rx), vec![0xBB]);
    assert!(received(&a_rx).is_empty());
}

#[test]
fn a_full_sq_hands_the_request_back() {
    let drops = Arc::new(AtomicUsize::new(0));
    let Some((_sock, op)) = setup(&drops) else {
        return;
    };
    let mut ring = Ring::new(1, 4, 4).unwrap();
    let owner = ring.join(None).unwrap();
    assert!(ring.push_nop().unwrap());
    // The push enters once to make room: inject a failure, then a full SQ.
    inject(Faults {
        failed_enters: 1,
        ..Default::default()
    });
    let refused = ring.push(owner, 0, op).err().unwrap();
    inject(Default::default());
    assert!(refused.error.is_some());
    assert_eq!(ring.in_flight(), 1);
    assert_eq!(refused.op.payload().0.len(), 1000);
}
