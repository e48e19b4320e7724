//! The kernel side of io_uring outside any engine: the one-send check of
//! `IORING_SEND_ZC_REPORT_USAGE`, and `send_zc_once` waiting for its request through signals.
//! Real sockets on loopback.

mod util;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::thread::JoinHandleExt;
use std::sync::mpsc;
use std::time::Duration;

use zerotx::internals::uring;

extern "C" fn ignore(_: libc::c_int) {}

/// A signal that interrupts `send_zc_once` while its request is parked (the peer does not
/// read, the socket is full) must not end the call: the kernel may still read the buffer, so
/// the call returns only after the request's last CQE, once the peer read.
#[test]
fn send_zc_once_waits_for_its_request_through_signals() {
    if !zerotx_testbed::require(
        uring::probe().is_ok_and(|p| p.send_zc),
        "no IORING_OP_SEND_ZC",
    ) {
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut p, _) = l.accept().unwrap();
    socket2::SockRef::from(&c)
        .set_send_buffer_size(4096)
        .unwrap();
    socket2::SockRef::from(&p)
        .set_recv_buffer_size(4096)
        .unwrap();
    c.set_nonblocking(true).unwrap();
    let mut prefill = 0usize;
    while let Ok(n) = (&c).write(&[7u8; 4096]) {
        prefill += n;
    }
    c.set_nonblocking(false).unwrap();
    // SAFETY: a handler that does nothing, installed without SA_RESTART so that a blocking
    // call it interrupts fails with EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let (done_tx, done) = mpsc::channel();
    let sender = std::thread::spawn(move || {
        let r = uring::send_zc_once(c.as_fd(), &[9u8; 4096]);
        done_tx.send(()).unwrap();
        (r, c)
    });
    let thread = sender.as_pthread_t();
    let mut early = false;
    for _ in 0..30 {
        // SAFETY: the thread is joined only below, so its id stays valid.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
        if done.recv_timeout(Duration::from_millis(10)).is_ok() {
            early = true;
            break;
        }
    }
    // The peer reads now, until the call returns.
    p.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut read = 0usize;
    let mut buf = [0u8; 65536];
    while early || done.try_recv().is_err() {
        if let Ok(n) = p.read(&mut buf) {
            read += n;
        }
        if early && read >= prefill {
            break;
        }
    }
    let (r, _c) = sender.join().unwrap();
    assert!(
        !early,
        "send_zc_once returned {r:?} with its request parked (peer had read nothing)"
    );
    let (res, notif) = r.unwrap();
    assert_eq!(res, 4096);
    assert!(notif.is_some());
}

/// The one-send check finds `IORING_SEND_ZC_REPORT_USAGE` on kernels that have it (6.2 on;
/// this machine runs 6.18), and never where `SEND_ZC` itself is missing.
#[test]
fn report_usage_is_found_where_the_kernel_has_it() {
    let release = zerotx::internals::probe::kernel_release();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let (major, minor): (u32, u32) = (
        v.next().unwrap().parse().unwrap(),
        v.next().unwrap().parse().unwrap(),
    );
    let send_zc = uring::probe().is_ok_and(|p| p.send_zc);
    if !send_zc {
        assert!(!uring::report_usage());
    } else if (major, minor) >= (6, 2) {
        assert!(uring::report_usage(), "{release}");
    }
}

const NO_LOOPBACK_CHILD: &str = "ZEROTX_REPORT_USAGE_CHILD";

/// The check sends nothing and needs no network: asked first from a namespace where loopback is
/// down, it still finds the flag. It is cached per process, so a check that needed loopback
/// would have left every zero-copy io_uring request of the process unable to tell a copy.
#[test]
fn report_usage_is_found_without_loopback() {
    util::require!(util::is_root(), "needs root for a network namespace");
    util::run_child_test("report_usage_child", NO_LOOPBACK_CHILD);
}

#[test]
#[ignore = "runs in its own process, started by report_usage_is_found_without_loopback"]
fn report_usage_child() {
    if std::env::var(NO_LOOPBACK_CHILD).is_err() {
        return;
    }
    // SAFETY: unshare has no memory preconditions; it moves this thread to a new network
    // namespace, where only a loopback device exists, down.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
    report_usage_is_found_where_the_kernel_has_it();
    println!("report_usage_child: ok");
}
