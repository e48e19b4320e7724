//! The io_uring engine's small writes: `auto` copying small buffers on a byte stream writes them
//! in gathered `sendmsg(2)` calls, not as requests (`write_now`). Real sockets on loopback; the
//! engine is driven without a `Sender` to see what one call releases.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{TcpListener, TcpStream};

use zerotx::internals::engine::Bare;
use zerotx::SenderConfig;

/// `auto` copies small buffers over loopback. With nothing of the stream in the kernel's
/// hands, a batch of them goes in gathered `sendmsg(2)` calls, released before the call
/// returns, not as io_uring requests released only when a later progress reaps their CQEs.
/// Every byte arrives in order.
#[test]
fn auto_writes_a_batch_of_small_copies_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    // Room for the whole batch, so no write is cut (a cut buffer's rest goes as a request).
    socket2::SockRef::from(&client)
        .set_send_buffer_size(4 << 20)
        .unwrap();
    let built = Bare::<Vec<u8>>::build(client.into(), &SenderConfig::default()).unwrap();
    if !zerotx_testbed::require(
        built.path == "io_uring",
        &format!("auto chose {}: {:?}", built.path, built.notes),
    ) {
        return;
    }
    let mut engine = built;
    let sizes: Vec<usize> = (0..64).map(|i| 1000 + 37 * i).collect();
    let mut bufs: VecDeque<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| vec![i as u8; n])
        .collect();
    let mut out = Vec::new();
    engine.batch(true);
    let accepted = engine.try_send_batch(&mut bufs, &mut out).unwrap();
    engine.batch(false);
    assert_eq!(accepted, 64);
    let stats = engine.stats();
    assert_eq!(out.len(), 64, "released before any progress: {stats:?}");
    assert_eq!(stats.syscalls, 2, "32 buffers per call: {stats:?}");
    assert_eq!(engine.held(), 0);
    for (r, &n) in out.iter().zip(&sizes) {
        assert!(
            r.report.error.is_none() && r.report.bytes == n,
            "{:?}",
            r.report
        );
    }
    let mut got = vec![0u8; sizes.iter().sum()];
    server.read_exact(&mut got).unwrap();
    let mut at = 0;
    for (i, &n) in sizes.iter().enumerate() {
        assert!(got[at..at + n].iter().all(|&b| b == i as u8), "buffer {i}");
        at += n;
    }
}
