//! The trains' datagrams (each names its train and place, the rest a pattern) and the sockets
//! that send and check them.

use std::collections::HashSet;
use std::io;
use std::mem;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// The datagram size of the trains: a 1500-byte MTU less the IPv4 and UDP headers.
pub(crate) const SEG: usize = 1472;
/// Each datagram's header: train, datagram, datagrams in the train, this datagram's length.
pub(crate) const HEADER: usize = 16;
/// What a sender sends when it is done, so its receiver stops without waiting on a timeout.
pub(crate) const DONE: &[u8] = b"train-faults: done";

/// The byte at `i` of datagram `d` of train `t`.
pub(crate) fn pattern(t: u32, d: u32, i: usize) -> u8 {
    (t.wrapping_mul(31) ^ d.wrapping_mul(7)).wrapping_add(i as u32) as u8
}

/// Train `t`: `count` datagrams of `segment` bytes, the last `last`; each starts with its
/// [`HEADER`], then [`pattern`].
pub(crate) fn train(t: u32, segment: usize, count: usize, last: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(segment * (count - 1) + last);
    for d in 0..count as u32 {
        let len = if d as usize + 1 == count {
            last
        } else {
            segment
        };
        for v in [t, d, count as u32, len as u32] {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        buf.extend((HEADER..len).map(|i| pattern(t, d, i)));
    }
    buf
}

pub(crate) fn word(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(data[at..at + 4].try_into().expect("four bytes"))
}

/// Checks one received datagram against its header: `(train, datagram, count)`, or what was
/// wrong with it.
pub(crate) fn check_datagram(data: &[u8]) -> Result<(u32, u32, u32), String> {
    if data.len() < HEADER {
        return Err(format!("a datagram of {} bytes", data.len()));
    }
    let (t, d, n, len) = (word(data, 0), word(data, 4), word(data, 8), word(data, 12));
    if d >= n || data.len() != len as usize {
        return Err(format!(
            "train {t} datagram {d} of {n}: {} bytes, its header says {len}",
            data.len()
        ));
    }
    match (HEADER..data.len()).find(|&i| data[i] != pattern(t, d, i)) {
        Some(i) => Err(format!("train {t} datagram {d}: byte {i} changed")),
        None => Ok((t, d, n)),
    }
}

/// Reads datagrams until [`DONE`] (or 10 s without one): every datagram before it.
pub(crate) fn receive_until_done(sock: &UdpSocket) -> Vec<Vec<u8>> {
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = sock.recv(&mut buf) {
        if &buf[..n] == DONE {
            break;
        }
        got.push(buf[..n].to_vec());
    }
    got
}

/// Checks what a receiver got: every datagram intact, none twice. Returns `(train, datagram)`
/// in arrival order.
pub(crate) fn checked(got: &[Vec<u8>]) -> Vec<(u32, u32)> {
    let mut seen = HashSet::new();
    got.iter()
        .map(|data| {
            let (t, d, _) = check_datagram(data).unwrap_or_else(|e| panic!("{e}"));
            assert!(seen.insert((t, d)), "train {t} datagram {d} arrived twice");
            (t, d)
        })
        .collect()
}

/// Asserts that exactly `trains`, each of `count` datagrams, arrived, in order.
pub(crate) fn assert_arrived_in_order(order: &[(u32, u32)], trains: &[u32], count: u32) {
    let want: Vec<(u32, u32)> = trains
        .iter()
        .flat_map(|&t| (0..count).map(move |d| (t, d)))
        .collect();
    assert_eq!(order.len(), want.len(), "datagrams received");
    if let Some(i) = (0..want.len()).find(|&i| order[i] != want[i]) {
        panic!(
            "datagram {i} was train {} datagram {}, expected {:?}",
            order[i].0, order[i].1, want[i]
        );
    }
}

/// Asserts that exactly `trains`, each of `count` datagrams, arrived, each train's datagrams in
/// order (trains may interleave).
pub(crate) fn assert_each_train_in_order(order: &[(u32, u32)], trains: &[u32], count: u32) {
    assert_eq!(
        order.len(),
        trains.len() * count as usize,
        "datagrams received"
    );
    for &t in trains {
        let got: Vec<u32> = order.iter().filter(|o| o.0 == t).map(|o| o.1).collect();
        assert_eq!(
            got,
            (0..count).collect::<Vec<u32>>(),
            "train {t}'s datagrams"
        );
    }
}

pub(crate) fn set_int(fd: impl AsFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: v is a live local of the size given; the fd is borrowed for the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A datagram socket of `protocol` (UDP or UDP-Lite) bound to `addr`, its receive buffer
/// forced to 8 MiB (root) so a slow reader drops nothing.
pub(crate) fn receiver(addr: SocketAddr, protocol: i32) -> io::Result<UdpSocket> {
    let sock = datagram_socket(protocol)?;
    sock.bind(&addr.into())?;
    rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, 8 << 20)?;
    Ok(sock.into())
}

pub(crate) fn datagram_socket(protocol: i32) -> io::Result<socket2::Socket> {
    let proto = Some(socket2::Protocol::from(protocol));
    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, proto)
}

/// A socket of `protocol` connected to `dest`.
pub(crate) fn connected(dest: SocketAddr, protocol: i32) -> io::Result<UdpSocket> {
    let sock = datagram_socket(protocol)?;
    sock.connect(&dest.into())?;
    Ok(sock.into())
}

/// Tells the receiver of `protocol` at `dest` that the sender is done (retried: a full qdisc
/// refuses it).
pub(crate) fn say_done(dest: SocketAddr, protocol: i32) {
    let sock = connected(dest, protocol).expect("a socket");
    let deadline = Instant::now() + Duration::from_secs(5);
    while sock.send(DONE).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}
