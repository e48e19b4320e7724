//! Real-kernel tests of how the io_uring engines answer a request the kernel failed for a reason
//! that a resubmission cannot cure.

mod util;

use std::net::UdpSocket;
use std::time::Duration;

use util::{tcp_pair, Peer};
use zerotx::{EngineKind, SendBuf, Sender};

const LEN: usize = 16 * 1024;

/// A shared file mapping whose file was truncated to nothing after the mapping was made: every
/// byte of it is gone (a user read would get `SIGBUS`; the kernel's copy or pinning answers
/// `EFAULT`). Only the kernel ever reads it.
struct Truncated {
    addr: usize,
}

impl Truncated {
    fn new() -> Self {
        // SAFETY: plain system calls on a descriptor made here; the mapping is owned by the value
        // and unmapped in `Drop`.
        unsafe {
            let fd = libc::memfd_create(c"zerotx-truncated".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            assert_eq!(libc::ftruncate(fd, LEN as libc::off_t), 0);
            let addr = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(addr, libc::MAP_FAILED);
            assert_eq!(libc::ftruncate(fd, 0), 0);
            libc::close(fd);
            Self {
                addr: addr as usize,
            }
        }
    }
}

impl Drop for Truncated {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, which nothing references any more.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, LEN) };
    }
}

// SAFETY: the mapping stays at its address until the value is dropped; nothing changes it (its
// pages do not exist).
unsafe impl SendBuf for Truncated {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: a mapping of LEN bytes that lives as long as `self`; only the kernel reads it.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, LEN) }
    }
}

/// Issue 34 item 7: a request whose memory is gone fails with `EFAULT`; resubmitting it cannot
/// cure that. It fails after at most one more try (the one that rules out a submitting thread
/// that exited), with `EFAULT`, on a datagram and on a stream socket.
#[test]
fn a_request_whose_memory_is_gone_fails_without_eight_resubmissions() {
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        for stream in [false, true] {
            let (mut tx, _keep): (Sender<Truncated>, Box<dyn std::any::Any>) = if stream {
                let (sock, peer) = tcp_pair(false, Peer::default());
                (Sender::new(sock, kind).unwrap(), Box::new(peer))
            } else {
                let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
                let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
                sock.connect(rx.local_addr().unwrap()).unwrap();
                (Sender::new(sock, kind).unwrap(), Box::new(rx))
            };
            tx.send(Truncated::new()).unwrap();
            let what = if stream { "TCP" } else { "UDP" };
            // The buffer's failure reaches flush (Sender's failure rule) as well as its Report.
            match tx.flush(Duration::from_secs(5)) {
                Err(zerotx::Error::Failed { failed: 1, source }) => {
                    assert_eq!(source.raw_os_error(), Some(libc::EFAULT), "{kind} {what}")
                }
                other => panic!("{kind} {what}: flush returned {other:?}"),
            }
            let mut out = Vec::new();
            tx.reap(&mut out).unwrap();
            let errno = out[0].report.error.as_ref().and_then(|e| e.raw_os_error());
            assert_eq!(
                errno,
                Some(libc::EFAULT),
                "{kind} {what}: {:?}",
                out[0].report
            );
            let requests = tx.stats().syscalls;
            assert!(
                requests <= 2,
                "{kind} {what}: {requests} requests for one buffer whose memory is gone"
            );
        }
    }
}
