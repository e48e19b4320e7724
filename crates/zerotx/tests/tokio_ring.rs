//! The async sender's driver on io_uring (feature `tokio`): a submission that keeps failing is
//! retried with a growing pause, not in a loop that keeps the executor busy.

mod util;

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Builder;
use zerotx::internals::uring_faults::{inject, Faults};
use zerotx::tokio::AsyncSender;
use zerotx::EngineKind;

use util::{tcp_pair, Peer};

/// Every `io_uring_enter` of the runtime's thread fails (`EAGAIN`, as when the kernel is short of
/// memory for a request) for 500 ms while a buffer waits to be submitted: the driver must not
/// spin on it (the driver runs on this thread, so spinning shows as CPU time here). Once the
/// kernel takes submissions again, the buffer goes and comes back.
#[test]
fn a_submission_that_keeps_failing_does_not_spin() {
    const FAILING: Duration = Duration::from_millis(500);
    for kind in [EngineKind::Uring, EngineKind::UringZc] {
        let (client, reader) = tcp_pair(false, Peer::checking());
        let rt = Builder::new_current_thread().enable_all().build().unwrap();
        let object: Arc<[u8]> = vec![0u8; 64 << 10].into();
        rt.block_on(async {
            let tx = AsyncSender::new(client, kind).expect("sender");
            inject(Faults {
                failed_enters: u32::MAX,
                enter_errno: libc::EAGAIN,
                ..Faults::default()
            });
            tx.send(object.clone()).await.expect("queued");
            let cpu = zerotx_testbed::thread_cpu_time();
            tokio::time::sleep(FAILING).await;
            let spent = zerotx_testbed::thread_cpu_time() - cpu;
            inject(Faults::default());
            assert!(
                spent < FAILING / 5,
                "{kind}: the driver spun on a failing io_uring_enter: {spent:?} CPU in {FAILING:?}"
            );
            // The failure was reported to the owner's next wait, and the buffer went later.
            let mut flushed = tx.flush(Duration::from_secs(5)).await;
            if matches!(&flushed, Err(zerotx::Error::Io { .. })) {
                flushed = tx.flush(Duration::from_secs(5)).await;
            }
            flushed.unwrap_or_else(|e| panic!("{kind}: {e}"));
            let closed = tx.close(Duration::from_secs(5)).await;
            assert_eq!(closed.kept, 0, "{kind}");
        });
        assert_eq!(
            Arc::strong_count(&object),
            1,
            "{kind}: the buffer never came back"
        );
        // The test pattern is not what was sent: only the byte count matters here.
        assert_eq!(reader.join().unwrap().bytes, 64 << 10, "{kind}");
    }
}
