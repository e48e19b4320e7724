//! Taking buffers back in tokio programs (feature `tokio`): a release stream a consumer runs
//! beside the sender, which waits through gaps and ends only when the sender is closed, and
//! `write_all`, which sends one `Bytes` in slices and fails on the first release that failed.

mod util;

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::runtime::{Builder, Runtime};
use zerotx::internals::tokio::WRITE_SLICE;
use zerotx::tokio::AsyncSender;
use zerotx::Error;

use util::{fill, tcp_pair, Peer};

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A pattern `Bytes` of `len` bytes at stream offset `at`.
fn pattern(at: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    fill(&mut v, at);
    v.into()
}

/// A consumer task started before the first send takes every buffer, through two bursts with
/// nothing in flight between them (where `released()` answers `None`), and ends once the sender
/// is closed, not before. On every engine, on both runtimes.
#[test]
fn the_release_stream_ends_only_at_close() {
    const BURST: u64 = 16;
    const LEN: usize = 32 << 10;
    for (name, rt) in [("current", current_thread()), ("multi", multi_thread())] {
        for &kind in util::engines() {
            let (client, reader) = tcp_pair(false, Peer::checking());
            rt.block_on(async {
                client.set_nonblocking(true).unwrap();
                let stream = tokio::net::TcpStream::from_std(client).unwrap();
                let tx = AsyncSender::<Bytes>::from_tcp(stream, kind).expect("sender");
                let mut releases = tx.releases();
                let consumer = tokio::spawn(async move {
                    let (mut n, mut bytes) = (0u64, 0u64);
                    while let Some(r) = releases.next().await {
                        let r = r.expect("release");
                        assert!(r.report.error.is_none(), "{:?}", r.report.error);
                        n += 1;
                        bytes += r.report.bytes as u64;
                    }
                    (n, bytes)
                });
                let mut at = 0;
                for burst in 0..2 {
                    for _ in 0..BURST {
                        tx.send(pattern(at, LEN)).await.expect("send");
                        at += LEN as u64;
                    }
                    tx.flush(Duration::from_secs(10)).await.expect("flush");
                    if burst == 0 {
                        // Nothing in flight: the consumer waits here, it does not end.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        assert!(
                            !consumer.is_finished(),
                            "{name} {kind}: ended between bursts"
                        );
                    }
                }
                // Every buffer was released before the close, so the consumer takes them all.
                while tx.outstanding() > 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                assert!(
                    !consumer.is_finished(),
                    "{name} {kind}: ended before the close"
                );
                let closed = tx.close(Duration::from_secs(5)).await;
                assert_eq!(closed.kept, 0, "{name} {kind}");
                assert!(closed.released.is_empty(), "{name} {kind}");
                let (n, bytes) = tokio::time::timeout(Duration::from_secs(5), consumer)
                    .await
                    .unwrap_or_else(|_| panic!("{name} {kind}: the stream did not end at close"))
                    .unwrap();
                assert_eq!(n, 2 * BURST, "{name} {kind}: buffers released");
                assert_eq!(bytes, 2 * BURST * LEN as u64, "{name} {kind}: bytes");
            });
            let got = reader.join().unwrap();
            assert_eq!(got.bytes, 2 * BURST * LEN as u64, "{name} {kind}");
            assert_eq!(got.mismatches, 0, "{name} {kind}: {:?}", got.first_mismatch);
        }
    }
}

/// A dropped sender (not closed) ends its stream once its driver handed back the last buffer;
/// the stream read as a `futures` `Stream` here.
#[test]
fn the_release_stream_ends_after_a_drop() {
    let rt = current_thread();
    for &kind in util::engines() {
        let (client, reader) = tcp_pair(false, Peer::checking());
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::<Bytes>::from_tcp(stream, kind).expect("sender");
            let mut releases = tx.releases();
            tx.send(pattern(0, 256 << 10)).await.expect("send");
            drop(tx);
            let mut n = 0;
            let end = tokio::time::timeout(Duration::from_secs(10), async {
                while let Some(r) = StreamExt::next(&mut releases).await {
                    r.expect("release");
                    n += 1;
                }
            })
            .await;
            assert!(end.is_ok(), "{kind}: the stream did not end after the drop");
            assert!(n <= 1, "{kind}: {n} releases of one buffer");
        });
        assert_eq!(reader.join().unwrap().bytes, 256 << 10, "{kind}");
    }
}

/// `write_all` of one `Bytes` larger than many slices, to a slow reader: every byte arrives in
/// order, the call returns only after the kernel released every slice (nothing is left held or
/// waiting to be taken, and the `Bytes` is unique again), on every engine.
#[test]
fn write_all_sends_every_slice_and_takes_them_back() {
    let len = 12 * WRITE_SLICE + 1234;
    let rt = current_thread();
    for &kind in util::engines() {
        let (client, reader) = tcp_pair(false, Peer::slow(Duration::from_micros(200), 64 << 10));
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::<Bytes>::from_tcp(stream, kind).expect("sender");
            let data = pattern(0, len);
            tx.write_all(data.clone())
                .await
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(tx.outstanding(), 0, "{kind}: slices left with the sender");
            assert!(data.is_unique(), "{kind}: a slice is still referenced");
            // Another buffer's release is left for the caller.
            tx.send(pattern(len as u64, 100)).await.expect("send");
            tx.write_all(Bytes::new()).await.expect("nothing to write");
            tx.flush(Duration::from_secs(5)).await.expect("flush");
            let other = tx.released().await.unwrap().expect("the other buffer");
            assert_eq!(other.buf.len(), 100, "{kind}");
            assert_eq!(tx.close(Duration::from_secs(5)).await.kept, 0, "{kind}");
        });
        let got = reader.join().unwrap();
        assert_eq!(got.bytes, len as u64 + 100, "{kind}");
        assert_eq!(got.mismatches, 0, "{kind}: {:?}", got.first_mismatch);
    }
}

/// `write_all` to a peer that resets part way fails, with the reset, on every engine; no slice is
/// kept or lost.
#[test]
fn write_all_fails_on_the_first_failed_release() {
    let rt = current_thread();
    for &kind in util::engines() {
        let peer = Peer {
            reset_after: Some(300 << 10),
            rcvbuf: Some(64 << 10),
            pause: Duration::from_millis(1),
            ..Peer::default()
        };
        let (client, reader) = tcp_pair(false, peer);
        socket2::SockRef::from(&client)
            .set_send_buffer_size(64 << 10)
            .unwrap();
        rt.block_on(async {
            client.set_nonblocking(true).unwrap();
            let stream = tokio::net::TcpStream::from_std(client).unwrap();
            let tx = AsyncSender::<Bytes>::from_tcp(stream, kind).expect("sender");
            let data = Bytes::from(vec![5u8; 64 * WRITE_SLICE]);
            let res = tokio::time::timeout(Duration::from_secs(20), tx.write_all(data.clone()))
                .await
                .unwrap_or_else(|_| panic!("{kind}: write_all hung on a reset peer"));
            let error = match res {
                Err(Error::Failed { source, .. }) => source,
                Err(Error::Io { source, .. }) => source,
                other => panic!("{kind}: write_all to a reset peer returned {other:?}"),
            };
            assert!(
                matches!(error.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)),
                "{kind}: {error}"
            );
            let _ = tx.flush(Duration::from_secs(10)).await;
            let closed = tx.close(Duration::from_secs(5)).await;
            assert_eq!(closed.kept, 0, "{kind}");
            drop(closed);
            assert!(data.is_unique(), "{kind}: a slice was never handed back");
        });
        reader.join().unwrap();
    }
}
