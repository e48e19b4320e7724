//! A runtime that shuts down with senders whose peers do not read (feature `tokio`): the shutdown
//! returns at once, and what the kernel may still read is kept (leaked), never freed.

mod util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Builder;
use util::stalled_peer;
use zerotx::tokio::AsyncSender;
use zerotx::{leaked_buffers, EngineKind};

/// Senders per runtime: the 8 took 8.0 s to shut down.
const SENDERS: usize = 8;

/// Each sender lives in a task of its own that filled its stalled peer and then waits for ever:
/// the runtime's shutdown drops the tasks (the owners and the drivers) with buffers in the kernel.
/// One test for every engine, so the process-wide leak count belongs to it alone.
#[test]
fn shutdown_with_stalled_senders_is_quick_and_keeps_their_buffers() {
    let mut slow = Vec::new();
    for kind in [
        EngineKind::MsgZerocopy,
        EngineKind::Uring,
        EngineKind::UringZc,
    ] {
        let leaked_before = leaked_buffers();
        let object: Arc<[u8]> = vec![6u8; 256 << 10].into();
        let rt = Builder::new_current_thread().enable_all().build().unwrap();
        let mut servers = Vec::new();
        rt.block_on(async {
            let mut filled = Vec::new();
            for _ in 0..SENDERS {
                let (client, server) = stalled_peer();
                servers.push(server);
                let object = object.clone();
                let (done, wait) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    let tx = AsyncSender::new(client, kind).expect("sender");
                    while let Ok(Ok(())) =
                        tokio::time::timeout(Duration::from_millis(100), tx.send(object.clone()))
                            .await
                    {}
                    let _ = done.send(tx.in_flight());
                    std::future::pending::<()>().await;
                });
                filled.push(wait);
            }
            for w in filled {
                assert!(w.await.unwrap() > 0, "{kind}: a sender holds nothing");
            }
        });
        let t = Instant::now();
        drop(rt);
        let took = t.elapsed();
        if took >= Duration::from_secs(2) {
            slow.push(format!(
                "{kind}: the shutdown of a runtime with {SENDERS} stalled senders took {took:?}"
            ));
        }
        let kept = leaked_buffers() - leaked_before;
        // A zero-copy send holds its pages until the peer's ACK; a cancelled `uring` copy send
        // is done with its buffer.
        if kind != EngineKind::Uring {
            assert!(kept > 0, "{kind}: nothing was kept");
        }
        assert_eq!(
            Arc::strong_count(&object) as u64 - 1,
            kept,
            "{kind}: buffers still referenced are not the ones kept (one was freed or lost)"
        );
        drop(servers);
    }
    assert!(slow.is_empty(), "{}", slow.join("\n"));
}
