//! Trains of numbered datagrams (UDP GSO), the receiver's check of each, and a sender that
//! overwrites each train the instant it comes back; the io_uring engines that send trains.
//! Shared by tests/trains.rs, tests/trains_uring.rs and tests/trains_batch.rs; the receiver
//! across a veth pair is `veth.rs`.

use std::net::UdpSocket;

use zerotx::{EngineKind, SendPath, Sender, SenderConfig};

/// The io_uring engines that send trains from plain buffers (`auto` as a default sender builds
/// it); `None`: io_uring is unavailable here (skipped, or failed under `ZEROTX_STRICT=1`).
pub fn uring_engines() -> Option<[(&'static str, SenderConfig); 3]> {
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    if let Err(e) = Sender::<Vec<u8>>::new(probe, EngineKind::UringZc) {
        super::require(false, &format!("io_uring zero-copy unavailable: {e}"));
        return None;
    }
    Some([
        ("uring", SenderConfig::new(EngineKind::Uring)),
        ("uring-zc", SenderConfig::new(EngineKind::UringZc)),
        ("auto", SenderConfig::new(EngineKind::Auto)),
    ])
}

/// Asserts that `tx` (made by the config named `name`) sends through io_uring: `auto` chose it.
pub fn assert_uring<B: zerotx::SendBuf>(tx: &Sender<B>, name: &str) {
    assert_eq!(
        tx.explain().path,
        "io_uring",
        "{name}: the system calls in use"
    );
}

/// A sender made by `cfg` on `sock`; `auto` must have chosen io_uring.
pub fn uring_sender(sock: UdpSocket, cfg: SenderConfig, name: &str) -> Sender<Vec<u8>> {
    let tx = Sender::with_config(sock, cfg).unwrap();
    assert_uring(&tx, name);
    tx
}

/// The datagram size of the trains below: a 1500-byte MTU less the IPv4 and UDP headers.
pub const SEG: usize = 1472;

/// The byte at `i` of datagram `d` of train `t`, past its 8-byte header.
pub fn pattern(t: u32, d: u32, i: usize) -> u8 {
    (t.wrapping_mul(31) ^ d.wrapping_mul(7)).wrapping_add(i as u32) as u8
}

/// Train `t`: `count` datagrams of `segment` bytes, the last `last` bytes; each starts with its
/// train and datagram numbers, then [`pattern`].
pub fn train(t: u32, segment: usize, count: usize, last: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(segment * (count - 1) + last);
    for d in 0..count as u32 {
        let len = if d as usize + 1 == count {
            last
        } else {
            segment
        };
        buf.extend_from_slice(&t.to_be_bytes());
        buf.extend_from_slice(&d.to_be_bytes());
        buf.extend((8..len).map(|i| pattern(t, d, i)));
    }
    buf
}

/// Checks one received datagram; returns its (train, datagram) numbers.
pub fn check_datagram(data: &[u8], segment: usize, count: usize, last: usize) -> (u32, u32) {
    assert!(data.len() >= 8, "a datagram of {} bytes", data.len());
    let t = u32::from_be_bytes(data[..4].try_into().unwrap());
    let d = u32::from_be_bytes(data[4..8].try_into().unwrap());
    assert!((d as usize) < count, "datagram number {d} of train {t}");
    let want = if d as usize + 1 == count {
        last
    } else {
        segment
    };
    assert_eq!(data.len(), want, "train {t} datagram {d}: its length");
    let bad = (8..data.len()).find(|&i| data[i] != pattern(t, d, i));
    assert_eq!(bad, None, "train {t} datagram {d}: a byte changed");
    (t, d)
}

/// Sends trains `0..n` (each `count` datagrams of [`SEG`] bytes, the last `last`) through a
/// sender made by `cfg` on `sock`, overwriting every buffer the instant it comes back; returns
/// the reports' paths and the final counters.
pub fn send_trains(
    sock: UdpSocket,
    cfg: SenderConfig,
    n: u32,
    count: usize,
    last: usize,
) -> (Vec<SendPath>, zerotx::Stats) {
    let mut tx = Sender::with_config(sock, cfg).unwrap();
    let mut out = Vec::new();
    let mut paths = Vec::new();
    let mut take = |out: &mut Vec<zerotx::Released<Vec<u8>>>| {
        for mut r in out.drain(..) {
            r.buf.fill(0xEE);
            assert!(r.report.error.is_none(), "{:?}", r.report.error);
            paths.push(r.report.path);
        }
    };
    for t in 0..n {
        tx.send_train(train(t, SEG, count, last), SEG as u16)
            .unwrap();
        tx.reap(&mut out).unwrap();
        take(&mut out);
    }
    let (mut rest, stats) = super::finish(tx);
    take(&mut rest);
    (paths, stats)
}
