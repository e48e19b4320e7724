//! The black hole with carrier is what it says: a UDP GSO train reaches the peer's ingress whole
//! with segmentation offload, and as one packet per datagram without it (the kernel segmented it
//! in software); a zero-copy train's completion comes back NOT copied either way.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use zerotx_testbed::{carrier_black_hole, in_new_netns, is_root, require, Segmentation};

const SEGMENT: usize = 1472;
const TRAIN: usize = 44;

fn set_int(s: &UdpSocket, level: i32, name: i32, v: i32) {
    // SAFETY: v is a live local of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

/// Whether the one zero-copy completion on `s` says COPIED (waits up to 2 s).
fn copied(s: &UdpSocket) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut control = [0u64; 16];
    loop {
        // SAFETY: msghdr is a plain C struct; all-zeroes is "no name, no iovec".
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: msg points at the live control buffer of the length given.
        let r = unsafe {
            libc::recvmsg(
                s.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            // SAFETY: the kernel filled the control buffer; CMSG_FIRSTHDR stays within it.
            let cm = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            assert!(!cm.is_null(), "an error-queue message without a cmsg");
            // SAFETY: an IP_RECVERR payload is a sock_extended_err; read unaligned.
            let ee: libc::sock_extended_err =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast()) };
            assert_eq!(ee.ee_origin, 5, "a zero-copy completion");
            assert_eq!((ee.ee_info, ee.ee_data), (0, 0), "the train took one id");
            return ee.ee_code & 1 != 0;
        }
        assert!(Instant::now() < deadline, "no completion within 2 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn trains_reach_the_peer_whole_with_offload_and_segmented_without() {
    if !require(
        is_root(),
        "the black hole with carrier needs root (network namespaces)",
    ) {
        return;
    }
    for (segmentation, packets) in [(Segmentation::Offload, 1), (Segmentation::Software, TRAIN)] {
        in_new_netns(|| {
            let bh = carrier_black_hole(1500, segmentation).expect("building the black hole");
            assert_eq!(
                bh.dropped().unwrap(),
                0,
                "{segmentation:?}: nothing sent yet"
            );
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.connect(bh.v4).unwrap();
            set_int(&s, libc::SOL_UDP, libc::UDP_SEGMENT, SEGMENT as i32);
            set_int(&s, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1);
            // Leaked: the kernel may read it until the completion, which the test waits for.
            let train: &'static [u8] = vec![7u8; SEGMENT * TRAIN].leak();
            // SAFETY: train is live (leaked) and its length is given.
            let n = unsafe {
                libc::send(
                    s.as_raw_fd(),
                    train.as_ptr().cast(),
                    train.len(),
                    libc::MSG_ZEROCOPY,
                )
            };
            assert_eq!(
                n,
                train.len() as isize,
                "{}",
                std::io::Error::last_os_error()
            );
            assert!(
                !copied(&s),
                "{segmentation:?}: the train's completion is NOT copied"
            );
            assert_eq!(
                bh.dropped().unwrap(),
                packets as u64,
                "{segmentation:?}: packets at the peer's ingress for one train of {TRAIN}"
            );
        })
        .expect("a network namespace");
    }
}
