//! What the library refuses or downgrades, saying why: AF_UNIX (copy only), bad input, a socket
//! that already sent zero-copy (unless told its next id), vsock SEQPACKET.

mod util;

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use util::{fill, finish, tcp_pair, Peer};
use zerotx::{CopyReason, EngineKind, Error, Feature, SendPath, Sender, SenderConfig};

#[test]
fn af_unix_is_copy_only_and_says_so() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut b, &mut v).unwrap();
        v.len()
    });
    let mut tx = Sender::new(a, EngineKind::Copy).unwrap();
    assert_eq!(tx.socket_kind().to_string(), "unix-stream");
    tx.send(vec![1u8; 1 << 20]).unwrap();
    let (released, _) = finish(tx);
    assert_eq!(
        released[0].report.path,
        SendPath::Copied(CopyReason::Engine)
    );
    assert_eq!(reader.join().unwrap(), 1 << 20);

    let (a, _b) = UnixStream::pair().unwrap();
    let err = Sender::<Vec<u8>>::new(a, EngineKind::MsgZerocopy).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("unix-stream"), "{err}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    // A closed descriptor.
    let f = std::fs::File::open("/dev/null").unwrap();
    let raw = f.into_raw_fd();
    // SAFETY: raw came from into_raw_fd and is closed exactly once, here.
    assert_eq!(unsafe { libc::close(raw) }, 0);
    // SAFETY: deliberately wraps a closed number; Sender::new must not close it again.
    let closed = unsafe { OwnedFd::from_raw_fd(raw) };
    let err = Sender::<Vec<u8>>::new(closed, EngineKind::Copy).unwrap_err();
    assert!(matches!(err, Error::BadFd { .. }), "{err}");
    assert!(err.to_string().contains("not an open file descriptor"));

    // Not a socket.
    let f = std::fs::File::open("/dev/null").unwrap();
    let err = Sender::<Vec<u8>>::new(f, EngineKind::Copy).unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");

    // A listening socket, and an unconnected stream socket.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let err = Sender::<Vec<u8>>::new(l, EngineKind::Copy).unwrap_err();
    assert!(err.to_string().contains("listening"), "{err}");
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let err = Sender::<Vec<u8>>::new(s, EngineKind::Copy).unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");

    // Zero-length buffers and stream destinations, handed back.
    for &kind in util::engines() {
        let (client, _peer) = tcp_pair(false, Peer::default());
        let mut tx = Sender::new(client, kind).unwrap();
        let err = tx.try_send(Vec::new()).unwrap_err();
        assert!(err.to_string().contains("zero-length"), "{err}");
        let dest: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let err = tx.try_send_to(vec![1], dest).unwrap_err();
        assert!(err.to_string().contains("stream socket"), "{err}");
        assert_eq!(err.into_inner(), vec![1]);
    }

    // Socket kinds: netlink is unknown to zerotx; raw IP refuses SO_ZEROCOPY on this kernel.
    let nl = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::DGRAM,
        None,
    )
    .unwrap();
    let err = Sender::<Vec<u8>>::new(nl, EngineKind::Copy).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    if util::is_root() {
        let raw = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::RAW,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        match Sender::<Vec<u8>>::new(raw, EngineKind::MsgZerocopy) {
            Err(Error::Unsupported { feature, .. }) => {
                assert!(matches!(feature, Feature::MsgZerocopy(_)), "{feature}");
                assert!(feature.to_string().contains("raw4"), "{feature}");
            }
            Ok(_) => {} // a kernel that grants it is fine too
            Err(e) => panic!("{e}"),
        }
    }
}

/// Defect 11: a socket that already sent with `MSG_ZEROCOPY` has moved the kernel's id counter;
/// a sender counting from 0 would release its buffers on those earlier sends' completions. It is
/// refused unless the caller says where the counter stands, and then every id matches.
#[test]
fn a_socket_that_already_sent_zero_copy_is_refused_unless_told_its_next_id() {
    let (client, peer) = tcp_pair(
        false,
        Peer {
            verify: true,
            pause: Duration::from_millis(1),
            rcvbuf: Some(64 * 1024),
            ..Peer::default()
        },
    );
    let fd = client.as_raw_fd();
    util::set_int_opt(client.as_fd(), libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1);
    // Three zero-copy sends of the stream's first bytes, outside any sender: ids 0, 1, 2.
    let first = 3 * 4096;
    let mut head = vec![0u8; first];
    fill(&mut head, 0);
    for chunk in head.chunks(4096) {
        // SAFETY: `chunk` outlives the wait for its completion below.
        let n = unsafe { libc::send(fd, chunk.as_ptr().cast(), chunk.len(), libc::MSG_ZEROCOPY) };
        assert_eq!(n, 4096);
    }
    let err = Sender::<Vec<u8>>::new(client.try_clone().unwrap(), EngineKind::MsgZerocopy)
        .expect_err("a socket with SO_ZEROCOPY already set must be refused");
    assert!(matches!(err, Error::Config { .. }), "{err}");
    assert!(err.to_string().contains("zerocopy_first_id"), "{err}");

    // Wait for the three completions, so `head` may go; then hand the socket over, telling it.
    let mut control = [0u8; 512];
    let mut done = 0u64;
    while done < 3 {
        let mut p = libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut p, 1, 10_000) };
        assert!(ready > 0, "no completion");
        // SAFETY: msghdr is plain data; all-zeroes is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len();
        // SAFETY: msg points at `control`, alive for the call.
        if unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE) } < 0 {
            continue;
        }
        let mut msgs = Vec::new();
        zerotx::internals::cmsg::decode(&control[..msg.msg_controllen], &mut msgs).unwrap();
        for m in msgs {
            if let zerotx::internals::cmsg::ErrQueueMsg::Zerocopy(r) = m {
                done += r.count();
            }
        }
    }
    drop(head);
    let cfg = SenderConfig::new(EngineKind::MsgZerocopy).with_zerocopy_first_id(3);
    let mut tx = Sender::with_config(client, cfg).unwrap();
    let mut offset = first as u64;
    for _ in 0..64 {
        let mut b = vec![0u8; 256 * 1024];
        fill(&mut b, offset);
        offset += b.len() as u64;
        tx.send(b).unwrap();
    }
    let (released, stats) = util::finish(tx);
    assert_eq!(released.len(), 64);
    assert_eq!(
        stats.zerocopy_ids, stats.zerocopy_ids_completed,
        "{stats:?}"
    );
    let got = peer.join().unwrap();
    assert_eq!((got.bytes, got.mismatches), (offset, 0));
}

/// A vsock SEQPACKET send can answer EAGAIN after queueing part of the message, so a retry would
/// send its start twice: refused with the reason, before anything else is checked.
#[test]
fn vsock_seqpacket_is_refused_with_the_reason() {
    let sock = match socket2::Socket::new(socket2::Domain::VSOCK, socket2::Type::SEQPACKET, None) {
        Ok(s) => s,
        Err(e) => {
            util::require(false, &format!("no AF_VSOCK here: {e}"));
            return;
        }
    };
    let err = Sender::<Vec<u8>>::new(sock, EngineKind::Copy).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("vsock-seqpacket"), "{err}");
}
