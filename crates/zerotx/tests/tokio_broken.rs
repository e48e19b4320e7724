//! A broken stream is reported where the caller looks, through the async sender (feature
//! `tokio`): once a peer reset the connection, `send` and `send_batch` fail, and `flush` fails
//! when a buffer released since the last flush carried an error. The same rule as the blocking
//! [`Sender`](zerotx::Sender) (`tests/broken_stream.rs`), on every engine.

mod util;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Builder;
use zerotx::tokio::AsyncSender;
use zerotx::{Error, SendError};

use util::{tcp_pair, Peer};

/// Buffers offered to the dead connection.
const BUFFERS: usize = 256;

/// A peer that reads about 110 KB, then resets (SO_LINGER 0 and close).
fn resetting_peer() -> Peer {
    Peer {
        reset_after: Some(110 << 10),
        rcvbuf: Some(64 << 10),
        pause: Duration::from_millis(1),
        ..Peer::default()
    }
}

/// A client of [`resetting_peer`] with a small send buffer, so a 1 MiB send goes part way and
/// the reset cuts the rest off: that buffer comes back with the error on every engine.
fn client() -> (std::net::TcpStream, std::thread::JoinHandle<util::Received>) {
    let (client, reader) = tcp_pair(false, resetting_peer());
    socket2::SockRef::from(&client)
        .set_send_buffer_size(64 << 10)
        .unwrap();
    (client, reader)
}

/// Sends one 1 MiB buffer to a peer that takes part of it and resets; once that buffer came back
/// with the error (the stream is known broken), every send and `send_batch` must fail at once,
/// `flush` must fail (a buffer released since the last flush carried an error), and the next
/// flush, with no new failure, succeeds. Returns what went wrong.
async fn after_a_reset(tx: &AsyncSender<Arc<[u8]>>, object: &Arc<[u8]>) -> Vec<String> {
    let mut wrong = Vec::new();
    tx.send(object.clone()).await.expect("the first send");
    let first = tokio::time::timeout(Duration::from_secs(10), tx.released())
        .await
        .expect("the buffer cut off by the reset never came back")
        .expect("released")
        .expect("one buffer in flight");
    assert!(
        first.report.error.is_some(),
        "the reset did not cut the 1 MiB send short: {:?}",
        first.report
    );
    drop(first);
    let mut accepted = 0;
    for _ in 0..BUFFERS {
        match tx.send(object.clone()).await {
            Ok(()) => accepted += 1,
            Err(SendError::Io { error, .. }) => {
                if !matches!(error.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)) {
                    wrong.push(format!("send failed with {error}, not the reset"));
                }
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    if accepted > 0 {
        wrong.push(format!(
            "{accepted} 1 MiB buffers accepted after a buffer came back with the reset"
        ));
    }
    let flushed = tx.flush(Duration::from_secs(10)).await;
    if !matches!(flushed, Err(Error::Failed { failed: 1.., .. })) {
        wrong.push(format!("flush after the reset returned {flushed:?}"));
    }
    let mut queue: VecDeque<_> = (0..4).map(|_| object.clone()).collect();
    let batch = tx.send_batch(&mut queue).await;
    if !matches!(batch, Err(SendError::Io { .. })) || queue.len() != 3 {
        wrong.push(format!(
            "send_batch on the broken stream returned {batch:?}, {} left of 4",
            queue.len()
        ));
    }
    let again = tx.flush(Duration::from_secs(10)).await;
    if again.is_err() {
        wrong.push(format!("a flush with no new failure returned {again:?}"));
    }
    wrong
}

#[test]
fn sends_and_flush_fail_after_a_reset_on_every_engine() {
    let rt = Builder::new_current_thread().enable_all().build().unwrap();
    let mut wrong = Vec::new();
    for &kind in util::engines() {
        let object: Arc<[u8]> = vec![0x33u8; 1 << 20].into();
        let (client, reader) = client();
        rt.block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            for w in after_a_reset(&tx, &object).await {
                wrong.push(format!("{kind}: {w}"));
            }
            let closed = tx.close(Duration::from_secs(10)).await;
            assert_eq!(closed.kept, 0, "{kind}: kept after the reset");
        });
        reader.join().unwrap();
        assert_eq!(
            Arc::strong_count(&object),
            1,
            "{kind}: a clone of the object never came back"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
