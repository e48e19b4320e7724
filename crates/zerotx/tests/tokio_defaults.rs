//! What a tokio program gets without configuration (feature `tokio`): senders made from tokio's
//! sockets share the runtime thread's io_uring, a connection splits into a read half and a
//! sender with one call, and where the thread has no ring the sender is made without one.

mod util;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::runtime::{Builder, Runtime};
use zerotx::tokio::{thread_ring, AsyncSender};
use zerotx::{EngineKind, SenderConfig};

use util::{fill, require, tcp_pair, Peer};

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

/// A pattern buffer of `len` bytes at stream offset `at`.
fn pattern(at: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    fill(&mut v, at);
    v.into()
}

/// Four clients of one thread, each `from_tcp` with the io_uring engines and `auto`, with no
/// configuration: every one submits through the thread's ring (one ring for the thread, not
/// one per connection), and every byte arrives in order. `msg-zc` and `copy` have no ring.
#[test]
fn from_tcp_shares_the_thread_ring() {
    const CLIENTS: usize = 4;
    const BUFS: u64 = 32;
    const LEN: usize = 64 << 10;
    let rt = current_thread();
    if !require(
        rt.block_on(async { thread_ring() }).is_ok(),
        "io_uring (io_uring_setup) for the thread's shared ring",
    ) {
        return;
    }
    for &kind in util::engines() {
        let mut readers = Vec::new();
        rt.block_on(async {
            let mut senders = Vec::new();
            for _ in 0..CLIENTS {
                let (client, reader) = tcp_pair(false, Peer::checking());
                readers.push(reader);
                client.set_nonblocking(true).unwrap();
                let stream = tokio::net::TcpStream::from_std(client).unwrap();
                let tx = AsyncSender::<Bytes>::from_tcp(stream, kind).expect("sender");
                let ring = matches!(
                    kind,
                    EngineKind::Uring | EngineKind::UringZc | EngineKind::Auto
                );
                assert_eq!(tx.shares_ring(), ring, "{kind}: {}", tx.explain());
                senders.push(tx);
            }
            for tx in &senders {
                for i in 0..BUFS {
                    tx.send(pattern(i * LEN as u64, LEN)).await.expect("send");
                }
            }
            for tx in senders {
                tx.flush(Duration::from_secs(10)).await.expect("flush");
                let closed = tx.close(Duration::from_secs(5)).await;
                assert_eq!(closed.kept, 0, "{kind}");
                assert_eq!(closed.released.len() as u64, BUFS, "{kind}");
            }
        });
        for reader in readers {
            let got = reader.join().unwrap();
            assert_eq!(got.bytes, BUFS * LEN as u64, "{kind}: bytes received");
            assert_eq!(got.mismatches, 0, "{kind}: {:?}", got.first_mismatch);
        }
    }
}

/// Told otherwise (`from_tcp_with` a plain `SenderConfig`), an io_uring engine keeps a ring of
/// its own.
#[test]
fn told_otherwise_keeps_a_ring_of_its_own() {
    let rt = current_thread();
    if !require(
        rt.block_on(async { thread_ring() }).is_ok(),
        "io_uring (io_uring_setup)",
    ) {
        return;
    }
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let (client, reader) = tcp_pair(false, Peer::checking());
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::<Bytes>::from_tcp_with(stream, SenderConfig::new(kind))
                .expect("sender");
            assert!(!tx.shares_ring(), "{kind}");
            tx.send(pattern(0, 4096)).await.expect("send");
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0, "{kind}");
        });
        assert_eq!(reader.join().unwrap().bytes, 4096, "{kind}");
    }
}

/// A thread where io_uring is refused (a container's seccomp profile: `io_uring_setup` answers
/// `EPERM`): `from_tcp` with `auto` still makes a sender (on `sendmsg(2)`), without a ring, and
/// an io_uring engine answers with the kernel's refusal of `io_uring_setup`.
#[test]
fn without_io_uring_auto_still_sends() {
    std::thread::spawn(|| {
        util::refuse_io_uring(libc::EPERM as u32);
        let rt = current_thread();
        let (client, reader) = tcp_pair(false, Peer::checking());
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::<Bytes>::from_tcp(stream, EngineKind::Auto).expect("auto");
            assert!(!tx.shares_ring());
            tx.send(pattern(0, 64 << 10)).await.expect("send");
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0);
            let (client, _reader) = tcp_pair(false, Peer::default());
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let err = AsyncSender::<Bytes>::from_tcp(stream, EngineKind::UringZc).unwrap_err();
            assert!(
                err.to_string().contains("io_uring_setup"),
                "uring-zc without io_uring: {err}"
            );
        });
        assert_eq!(reader.join().unwrap().bytes, 64 << 10);
    })
    .join()
    .unwrap();
}

/// One call splits a connection: the read half reads the requests through tokio, the sender
/// answers each, on every engine; the connection stays open for the sender after the read half
/// is dropped, and closes when the sender closes.
#[test]
fn split_tcp_reads_and_sends_on_one_connection() {
    const REQUESTS: usize = 8;
    let rt = current_thread();
    for &kind in util::engines() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        // The client: a request, then its answer (the request's bytes, 64 KiB of them).
        let peer = std::thread::spawn(move || {
            let mut client = client;
            client
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            for i in 0..REQUESTS {
                client.write_all(&[i as u8; 16]).unwrap();
                let mut answer = vec![0u8; 64 << 10];
                client.read_exact(&mut answer).unwrap();
                assert!(answer.iter().all(|&b| b == i as u8), "answer {i}");
            }
            // One more answer, sent after the server dropped its read half; then the end.
            let mut last = vec![0u8; 4096];
            client.read_exact(&mut last).unwrap();
            assert!(last.iter().all(|&b| b == 0xAA), "the last answer");
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).unwrap();
            rest.len()
        });
        rt.block_on(async {
            server.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(server).unwrap();
            let (mut rd, tx) = AsyncSender::<Bytes>::split_tcp(stream, kind).expect("split");
            assert_eq!(rd.peer_addr().unwrap().ip(), util::localhost(false));
            for i in 0..REQUESTS {
                let mut request = [0u8; 16];
                rd.read_exact(&mut request).await.expect("request");
                assert_eq!(request, [i as u8; 16], "{kind}: request {i}");
                tx.send(Bytes::from(vec![i as u8; 64 << 10]))
                    .await
                    .expect("answer");
            }
            drop(rd);
            tx.send(Bytes::from(vec![0xAA; 4096])).await.expect("last");
            tx.flush(Duration::from_secs(10)).await.expect("flush");
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0, "{kind}");
        });
        assert_eq!(
            peer.join().unwrap(),
            0,
            "{kind}: bytes after the last answer"
        );
    }
}

/// A client that resets mid-stream shows where a server on the thread's ring looks: `send` or
/// `flush` fails with the reset (the rule of the blocking `Sender`), on every engine.
#[test]
fn a_reset_client_shows_in_send_or_flush_on_the_thread_ring() {
    let rt = current_thread();
    for &kind in util::engines() {
        let peer = Peer {
            reset_after: Some(200 << 10),
            rcvbuf: Some(64 << 10),
            pause: Duration::from_millis(1),
            ..Peer::default()
        };
        let (client, reader) = tcp_pair(false, peer);
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::<Bytes>::from_tcp(stream, kind).expect("sender");
            let object = Bytes::from(vec![9u8; 256 << 10]);
            let seen = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    if let Err(e) = tx.send(object.clone()).await {
                        return std::io::Error::from(e);
                    }
                    match tx.flush(Duration::from_millis(200)).await {
                        Err(zerotx::Error::Failed { source, .. }) => return source,
                        Err(zerotx::Error::Io { source, .. }) => return source,
                        _ => {}
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{kind}: the reset never showed in send or flush"));
            assert!(
                matches!(seen.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)),
                "{kind}: {seen}"
            );
            let _ = tx.flush(Duration::from_secs(5)).await;
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0, "{kind}");
        });
        reader.join().unwrap();
    }
}
