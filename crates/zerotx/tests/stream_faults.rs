//! A page fault (EFAULT) in the middle of stream buffers, and a stream that failed part way: the
//! peer sees exactly the bytes the reports name, with no gap, and nothing more is sent.

mod util;

use std::collections::VecDeque;
use std::time::Duration;

use util::{fill, tcp_pair, Peer};
use zerotx::{EngineKind, SendBuf, SendError, Sender};

/// A buffer whose last page cannot be read: the kernel copies or pins up to it and then answers
/// EFAULT, on a connection that stays up. The library never reads the bytes itself (it hands
/// pointers to the kernel), which is what makes this fault injectable.
struct Guarded {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone; nothing writes it after construction.
unsafe impl Send for Guarded {}

// SAFETY: the mapping never moves or changes while the value lives (it is never unmapped: a test
// may leak it to the kernel). The guard page is part of the slice on purpose; only the kernel
// touches it, and answers EFAULT.
unsafe impl SendBuf for Guarded {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is one live mapping (see above).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Guarded {
    /// `data` bytes of the stream pattern from `offset`, followed by one unreadable page when
    /// `guard` is set.
    fn new(data: usize, offset: u64, guard: bool) -> Self {
        let page = 4096;
        let len = data + if guard { page } else { 0 };
        // SAFETY: a fresh anonymous private mapping; arguments are plain integers.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        let ptr = ptr.cast::<u8>();
        // SAFETY: the first `data` bytes are mapped read-write just above.
        fill(unsafe { std::slice::from_raw_parts_mut(ptr, data) }, offset);
        if guard {
            // SAFETY: the last page of the mapping made above.
            let rc = unsafe { libc::mprotect(ptr.add(data).cast(), page, libc::PROT_NONE) };
            assert_eq!(rc, 0);
        }
        Self { ptr, len }
    }
}

/// Four stream buffers in a row, `a`, `b`, `c` and 4096 bytes of the pattern: the third is followed
/// by a page the kernel faults on (`EFAULT`) after its `c` bytes.
fn faulting_batch(a: usize, b: usize, c: usize) -> VecDeque<Guarded> {
    [
        Guarded::new(a, 0, false),
        Guarded::new(b, a as u64, false),
        Guarded::new(c, (a + b) as u64, true),
        Guarded::new(4096, (a + b + c) as u64, false),
    ]
    .into()
}

/// `copy` writes a stream batch as one `sendmsg` of several buffers. A fault in the third (the
/// kernel copies up to its unreadable page and returns what it took of the batch): the two
/// before it come back whole; the faulting one either comes back with EFAULT and the bytes it
/// sent, the stream broken for the one after it, or, if none of its bytes went, is handed back
/// with EFAULT and the one after it stays in the caller's queue. Either way the peer sees exactly
/// the bytes the reports name, in order.
#[test]
fn a_fault_inside_a_gathered_stream_batch_is_that_buffers_alone() {
    let (client, peer) = tcp_pair(false, Peer::checking());
    let mut tx = Sender::new(client, EngineKind::Copy).unwrap();
    let (a, b, c) = (8192, 12288, 256 * 1024);
    let mut batch = faulting_batch(a, b, c);
    let result = tx.send_batch(&mut batch);
    let mut out = Vec::new();
    util::flush_after_faults(&mut tx, Duration::from_secs(10), "the faulting batch");
    tx.reap(&mut out).unwrap();
    let stats = tx.stats();
    drop(tx.close(Duration::from_secs(1)));
    let got = peer.join().unwrap();
    let whole: Vec<usize> = out
        .iter()
        .filter(|r| r.report.error.is_none())
        .map(|r| r.report.bytes)
        .collect();
    assert_eq!(whole, [a, b], "{stats:?}");
    let (Err(SendError::Io { buf, error }), true) = (result, stats.syscalls < 4) else {
        panic!("the batch must fail, gathered: {stats:?}");
    };
    assert_eq!(error.raw_os_error(), Some(libc::EFAULT));
    let faulted = out.iter().find(|r| r.buf.len == c + 4096);
    let sent = match faulted {
        Some(r) => {
            // Part of it went: released with the error, and the stream is broken for the next.
            let e = r
                .report
                .error
                .as_ref()
                .expect("the faulting buffer says so");
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
            assert!(r.report.bytes > 0 && r.report.bytes <= c, "{:?}", r.report);
            assert_eq!(buf.len, 4096, "the next buffer comes back with the error");
            assert!(batch.is_empty());
            r.report.bytes
        }
        None => {
            // None of it went: handed back, the next one still queued.
            assert_eq!(buf.len, c + 4096);
            assert_eq!(batch.len(), 1);
            0
        }
    };
    assert_eq!(
        (got.bytes, got.mismatches),
        ((a + b + sent) as u64, 0),
        "the peer must see exactly what the reports name"
    );
}

/// `auto` writes a run of small copies on a stream with one `sendmsg` (see `policy::write_now`).
/// A fault inside that run: the buffers before it are released whole, the faulting one with
/// `EFAULT` and what of it went, and the stream ends there (the one after it comes back with the
/// error, and so does a later send), as when a request fails; the peer sees exactly what the
/// reports name.
#[test]
fn a_fault_inside_autos_written_run_ends_the_stream_there() {
    let (client, peer) = tcp_pair(false, Peer::checking());
    let mut tx = Sender::new(client, EngineKind::Auto).unwrap();
    let (a, b, c) = (8192, 12288, 256 * 1024);
    let mut batch = faulting_batch(a, b, c);
    tx.send_batch(&mut batch)
        .expect("accepted: a request's failure comes with its release");
    let mut out = Vec::new();
    util::flush_after_faults(&mut tx, Duration::from_secs(10), "the faulting run");
    tx.reap(&mut out).unwrap();
    let stats = tx.stats();
    let after = tx.send(Guarded::new(4096, 0, false));
    assert!(
        matches!(&after, Err(SendError::Io { error, .. }) if error.raw_os_error() == Some(libc::EFAULT)),
        "nothing may follow the gap: {after:?}"
    );
    drop(tx.close(Duration::from_secs(1)));
    let got = peer.join().unwrap();
    // Released in any order (the failed request's record after the queue it ended); the
    // lengths tell the four apart.
    let order = [a, b, c + 4096, 4096];
    out.sort_by_key(|r| order.iter().position(|&n| n == r.buf.len));
    let lens: Vec<usize> = out.iter().map(|r| r.buf.len).collect();
    assert_eq!(
        lens,
        [a, b, c + 4096, 4096],
        "each buffer back once: {stats:?}"
    );
    for r in &out[..2] {
        assert!(
            r.report.error.is_none() && r.report.bytes == r.buf.len,
            "{:?}",
            r.report
        );
    }
    let faulted = &out[2].report;
    let errno = |r: &zerotx::Report| r.error.as_ref().and_then(|e| e.raw_os_error());
    assert_eq!(errno(faulted), Some(libc::EFAULT), "{faulted:?}");
    assert!(faulted.bytes <= c, "{faulted:?}");
    assert_eq!(
        errno(&out[3].report),
        Some(libc::EFAULT),
        "{:?}",
        out[3].report
    );
    assert_eq!(out[3].report.bytes, 0);
    assert_eq!(
        (got.bytes, got.mismatches),
        ((a + b + faulted.bytes) as u64, 0),
        "the peer must see exactly what the reports name"
    );
}

/// Defect 4: an error after part of a stream buffer went out must break the stream. Sending the
/// next buffer after the missing bytes would hand the peer a byte stream with a gap, on a
/// connection that is still up.
#[test]
fn a_stream_that_failed_part_way_sends_nothing_more() {
    let data = 256 * 1024;
    for &kind in util::engines() {
        let (client, peer) = tcp_pair(false, Peer::checking());
        let mut tx = Sender::new(client, kind).unwrap();
        tx.send(Guarded::new(data, 0, true)).unwrap();
        let next = tx.send(Guarded::new(64 * 1024, data as u64, false));
        let mut out = Vec::new();
        util::flush_after_faults(&mut tx, Duration::from_secs(10), kind.name());
        tx.reap(&mut out).unwrap();
        let later = tx.try_send(Guarded::new(4096, 0, false));
        assert!(
            matches!(later, Err(SendError::Io { .. })),
            "{kind}: a broken stream took another buffer"
        );
        drop(tx.close(Duration::from_secs(1)));
        let got = peer.join().unwrap();
        let first = out
            .iter()
            .find(|r| r.buf.len == data + 4096)
            .expect("the guarded buffer came back");
        let err = first
            .report
            .error
            .as_ref()
            .expect("the failed buffer says so");
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{kind}: {err}");
        // The kernel stops copying a little before the guard page; whatever it took is the
        // stream's prefix, and the next buffer (which continues the pattern at `data`) must not
        // follow it: after a gap its bytes would mismatch, or the count would exceed the report.
        assert!(
            first.report.bytes > 0 && first.report.bytes <= data,
            "{kind}: {:?}",
            first.report
        );
        assert_eq!(
            (got.bytes, got.mismatches),
            (first.report.bytes as u64, 0),
            "{kind}: the peer must see exactly the prefix the report names, and nothing after it"
        );
        match next {
            Err(SendError::Io { error, .. }) => {
                assert_eq!(error.raw_os_error(), Some(libc::EFAULT), "{kind}")
            }
            Ok(()) => {
                let r = out
                    .iter()
                    .find(|r| r.buf.len == 64 * 1024)
                    .expect("the next buffer came back");
                assert_eq!(
                    r.report.bytes, 0,
                    "{kind}: queued behind the failure, never sent"
                );
                assert!(r.report.error.is_some(), "{kind}");
            }
            Err(e) => panic!("{kind}: {e}"),
        }
    }
}
