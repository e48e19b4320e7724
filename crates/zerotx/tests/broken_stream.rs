//! A broken stream is reported where the caller looks, through the blocking [`Sender`]: once a
//! buffer came back with the error of a peer's reset, `send` and `send_batch` fail at once, and
//! `flush` fails when a buffer released since the last flush carried an error. The async sender
//! follows the same rule (`tests/tokio_broken.rs`).

mod util;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use zerotx::{Error, SendError, Sender};

use util::resetting_client;

/// What went wrong for `tx` after its first buffer came back with the reset.
fn after_a_reset(tx: &mut Sender<Arc<[u8]>>, object: &Arc<[u8]>) -> Vec<String> {
    let mut wrong = Vec::new();
    tx.send(object.clone()).expect("the first send");
    let mut out = Vec::new();
    // The reset may come as the error of the wait itself: the buffer is then in the next reap.
    let _ = tx.wait_released(&mut out, Some(Duration::from_secs(10)));
    tx.reap(&mut out).unwrap_or(0);
    let first = out
        .pop()
        .expect("the buffer cut off by the reset never came back");
    assert!(
        first.report.error.is_some(),
        "the reset did not cut the 1 MiB send short: {:?}",
        first.report
    );
    match tx.send(object.clone()) {
        Err(SendError::Io { error, .. })
            if matches!(error.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)) => {}
        other => wrong.push(format!(
            "a send after a buffer came back with the reset returned {other:?}"
        )),
    }
    let flushed = tx.flush(Duration::from_secs(10));
    if !matches!(flushed, Err(Error::Failed { failed: 1.., .. })) {
        wrong.push(format!("flush after the reset returned {flushed:?}"));
    }
    let mut queue: VecDeque<_> = (0..4).map(|_| object.clone()).collect();
    let batch = tx.send_batch(&mut queue);
    if !matches!(batch, Err(SendError::Io { .. })) || queue.len() != 3 {
        wrong.push(format!(
            "send_batch on the broken stream returned {batch:?}, {} left of 4",
            queue.len()
        ));
    }
    let again = tx.flush(Duration::from_secs(10));
    if again.is_err() {
        wrong.push(format!("a flush with no new failure returned {again:?}"));
    }
    wrong
}

#[test]
fn sends_and_flush_fail_after_a_reset_on_every_engine() {
    let mut wrong = Vec::new();
    for &kind in util::engines() {
        let object: Arc<[u8]> = vec![0x44u8; 1 << 20].into();
        let (client, reader) = resetting_client();
        let mut tx = Sender::new(client, kind).expect("sender");
        for w in after_a_reset(&mut tx, &object) {
            wrong.push(format!("{kind}: {w}"));
        }
        let closed = tx.close(Duration::from_secs(10));
        assert_eq!(closed.kept, 0, "{kind}: kept after the reset");
        drop(closed);
        reader.join().unwrap();
        assert_eq!(
            Arc::strong_count(&object),
            1,
            "{kind}: a clone of the object never came back"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
