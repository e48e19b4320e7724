//! Trains by the socket's `UDP_SEGMENT` option (docs/fast-path.md, "Trains by the socket
//! option"): the sendmsg family sends a train as a plain `send(2)` once the option holds its
//! segment size, and every other send finds the option back at 0, so a datagram sent after a
//! train arrives whole. A receiver on loopback, in a namespace of the test's own, reads every
//! datagram's length; a clone of the sender's descriptor reads the option.

mod util;

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use util::trains::train;
use util::veth::{receive_all, receiver};
use util::{require, set_int_opt};
use zerotx::{EngineKind, Sender, SenderConfig};

/// `UDP_SEGMENT` (linux/udp.h), at level `SOL_UDP`.
const UDP_SEGMENT: i32 = 103;

/// The sendmsg family's engines (`auto` kept on `sendmsg(2)`).
fn engines() -> [(&'static str, SenderConfig); 3] {
    [
        ("copy", SenderConfig::new(EngineKind::Copy)),
        ("msg-zc", SenderConfig::new(EngineKind::MsgZerocopy)),
        (
            "auto",
            SenderConfig::new(EngineKind::Auto).with_auto_uring(false),
        ),
    ]
}

/// The socket's `UDP_SEGMENT` option.
fn segment_option(fd: BorrowedFd<'_>) -> i32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are live locals of the sizes getsockopt is told.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_UDP,
            UDP_SEGMENT,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "getsockopt(UDP_SEGMENT)");
    v
}

/// A sender of `cfg` connected to `rx`, and a clone of its descriptor to read the option from.
fn sender_to(rx: &UdpSocket, cfg: SenderConfig) -> (Sender<Vec<u8>>, UdpSocket) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(rx.local_addr().unwrap()).unwrap();
    let probe = sock.try_clone().unwrap();
    (Sender::with_config(sock, cfg).unwrap(), probe)
}

/// Lengths of what `rx` received.
fn lengths(rx: &UdpSocket) -> Vec<usize> {
    receive_all(rx, Duration::from_millis(200))
        .iter()
        .map(Vec::len)
        .collect()
}

/// Trains of one size in a row: the option is set at the eighth (the library's streak), not
/// before, so a train between other sends keeps its control message and costs no `setsockopt`.
const STREAK: u32 = 8;

/// Sends a streak of trains of 1000 B (to `dest` on an unconnected socket) and checks that the
/// option now holds their size.
fn set_by_streak(
    tx: &mut Sender<Vec<u8>>,
    probe: &UdpSocket,
    dest: Option<SocketAddr>,
    name: &str,
) {
    for t in 0..STREAK {
        let buf = train(t, 1000, 2, 1000);
        match dest {
            Some(dest) => tx.send_train_to(buf, 1000, dest),
            None => tx.send_train(buf, 1000),
        }
        .unwrap();
    }
    assert_eq!(segment_option(probe.as_fd()), 1000, "{name}: set");
}

/// What the receiver gets after [`set_by_streak`] and then `rest`.
fn after_streak(rest: &[usize]) -> Vec<usize> {
    [&[1000; 2 * STREAK as usize][..], rest].concat()
}

/// After trains, a lone send, a batch and trains of another size go as the caller asked: the
/// datagram of 2500 B after trains of 1000 B arrives as one datagram, not cut into 1000-byte
/// segments. The option is set at the eighth train of one size in a row, is 0 again after a
/// plain send, stays 0 for a lone train between other sends, and is 0 when the sender gives the
/// socket back.
#[test]
fn datagrams_after_trains_arrive_whole() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        for (name, cfg) in engines() {
            let rx = receiver("127.0.0.1:0");
            let (mut tx, probe) = sender_to(&rx, cfg);
            let mut options = Vec::new();
            for t in 0..STREAK {
                if t + 1 == STREAK {
                    options.push(segment_option(probe.as_fd()));
                }
                tx.send_train(train(t, 1000, 2, 1000), 1000).unwrap();
            }
            options.push(segment_option(probe.as_fd()));
            tx.send(vec![1u8; 2500]).unwrap();
            options.push(segment_option(probe.as_fd()));
            tx.send_train(train(9, 1000, 2, 1000), 1000).unwrap();
            options.push(segment_option(probe.as_fd()));
            let mut batch = vec![vec![2u8; 2500], vec![3u8; 2500], vec![4u8; 1800]].into();
            tx.send_batch(&mut batch).unwrap();
            options.push(segment_option(probe.as_fd()));
            for t in 0..STREAK {
                tx.send_train(train(10 + t, 500, 2, 500), 500).unwrap();
            }
            options.push(segment_option(probe.as_fd()));
            let (released, _) = util::finish(tx);
            assert_eq!(
                released.len(),
                2 * STREAK as usize + 5,
                "{name}: every buffer back"
            );
            options.push(segment_option(probe.as_fd()));
            let want = [
                &[1000; 2 * STREAK as usize][..],
                &[2500, 1000, 1000, 2500, 2500, 1800],
                &[500; 2 * STREAK as usize],
            ]
            .concat();
            assert_eq!(lengths(&rx), want, "{name}: datagrams received");
            assert_eq!(
                options,
                [0, 1000, 0, 0, 0, 500, 0],
                "{name}: the option before and after the eighth train, after a send, a lone \
                 train, a batch, eight trains of 500 B, the close"
            );
        }
    })
    .unwrap();
}

/// A `UDP_SEGMENT` option the caller set is the caller's: trains carry their own segment size
/// in a control message, a plain send is cut by the caller's option as the kernel cuts it without
/// zerotx, and the option is still the caller's after the sender closes.
#[test]
fn an_option_the_caller_set_stays() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        for (name, cfg) in engines() {
            let rx = receiver("127.0.0.1:0");
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.connect(rx.local_addr().unwrap()).unwrap();
            set_int_opt(sock.as_fd(), libc::SOL_UDP, UDP_SEGMENT, 700);
            let probe = sock.try_clone().unwrap();
            let mut tx = Sender::with_config(sock, cfg).unwrap();
            for t in 0..STREAK {
                tx.send_train(train(t, 1000, 2, 1000), 1000).unwrap();
            }
            tx.send(vec![1u8; 1400]).unwrap();
            assert_eq!(segment_option(probe.as_fd()), 700, "{name}: while sending");
            let (released, _) = util::finish(tx);
            assert_eq!(
                released.len(),
                STREAK as usize + 1,
                "{name}: every buffer back"
            );
            assert_eq!(segment_option(probe.as_fd()), 700, "{name}: given back");
            let want = [&[1000; 2 * STREAK as usize][..], &[700, 700]].concat();
            assert_eq!(lengths(&rx), want, "{name}: datagrams received");
        }
    })
    .unwrap();
}

/// Every way a plain datagram leaves right after the option was set finds it back at 0: a batch
/// of datagrams longer than the segment (the batch's own entry, not a lone send before it), and
/// a lone send to a destination on an unconnected socket; each arrives whole.
#[test]
fn a_batch_or_a_send_to_right_after_trains_arrives_whole() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        for (name, cfg) in engines() {
            let rx = receiver("127.0.0.1:0");
            let (mut tx, probe) = sender_to(&rx, cfg.clone());
            set_by_streak(&mut tx, &probe, None, name);
            // Sizes that make no run, so each goes as a plain datagram.
            let mut batch = vec![vec![2u8; 1800], vec![3u8; 2500], vec![4u8; 2600]].into();
            tx.send_batch(&mut batch).unwrap();
            util::finish(tx);
            let want = after_streak(&[1800, 2500, 2600]);
            assert_eq!(lengths(&rx), want, "{name}: a batch after trains");

            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let probe = sock.try_clone().unwrap();
            let dest = rx.local_addr().unwrap();
            let mut tx = Sender::with_config(sock, cfg).unwrap();
            set_by_streak(&mut tx, &probe, Some(dest), name);
            tx.send_to(vec![5u8; 2500], dest).unwrap();
            util::finish(tx);
            assert_eq!(
                lengths(&rx),
                after_streak(&[2500]),
                "{name}: a send_to after trains"
            );
        }
    })
    .unwrap();
}

/// A sender dropped without `close` gives the socket back as `close` does: a descriptor the
/// caller kept sends whole datagrams again.
#[test]
fn a_dropped_sender_gives_the_option_back() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        for (name, cfg) in engines() {
            let rx = receiver("127.0.0.1:0");
            let (mut tx, probe) = sender_to(&rx, cfg);
            set_by_streak(&mut tx, &probe, None, name);
            drop(tx);
            assert_eq!(segment_option(probe.as_fd()), 0, "{name}: after drop");
            probe.send(&[6u8; 2500]).unwrap();
            let want = after_streak(&[2500]);
            assert_eq!(lengths(&rx), want, "{name}: the kept descriptor's datagram");
        }
    })
    .unwrap();
}

/// Trains alternating with other sends never make a streak: the option is never set, so the
/// sender pays no `setsockopt` pair per switch.
#[test]
fn sends_between_trains_end_the_streak() {
    require!(util::is_root(), "needs root for a network namespace");
    zerotx_testbed::in_new_netns(|| {
        for (name, cfg) in engines() {
            let rx = receiver("127.0.0.1:0");
            let (mut tx, probe) = sender_to(&rx, cfg);
            let mut options = Vec::new();
            for t in 0..2 * STREAK {
                tx.send_train(train(t, 1000, 2, 1000), 1000).unwrap();
                options.push(segment_option(probe.as_fd()));
                tx.send(vec![7u8; 300]).unwrap();
            }
            util::finish(tx);
            assert!(options.iter().all(|&o| o == 0), "{name}: {options:?}");
            assert_eq!(lengths(&rx).len(), 2 * STREAK as usize * 3, "{name}");
        }
    })
    .unwrap();
}
