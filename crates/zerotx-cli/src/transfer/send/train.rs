//! `zerotx send --udp`'s trains: `--train` datagrams of `--size` cut from one buffer and sent by
//! one [`Sender::send_train`](zerotx::Sender::send_train) (UDP generic segmentation offload: the
//! kernel, or the device, cuts the datagrams), until the engine or the path refuses them; from
//! then on one datagram per call, said once. Each datagram is the same slice of the generated
//! stream either way, so the receiver's count of lost and reordered datagrams reads the same.

use std::io;
use std::os::fd::BorrowedFd;

/// A stream's trains: on while the engine and the path take them.
#[derive(Debug)]
pub struct Trains {
    /// Datagram size: the train's segment.
    segment: u16,
    /// Datagrams per train.
    datagrams: usize,
    /// Why trains stopped, once they did.
    off: Option<String>,
}

impl Trains {
    /// Trains of `datagrams` datagrams of `size` bytes; with one datagram (or a datagram too
    /// large for a segment), none.
    pub fn new(size: usize, datagrams: usize) -> Self {
        match u16::try_from(size) {
            Ok(segment) if datagrams > 1 => Self {
                segment,
                datagrams,
                off: None,
            },
            _ => Self {
                segment: 0,
                datagrams: 1,
                off: None,
            },
        }
    }

    /// Datagrams the next send carries: a train's while trains go, else 1.
    pub fn datagrams(&self) -> usize {
        if self.off.is_some() {
            1
        } else {
            self.datagrams
        }
    }

    /// The segment size for a buffer of `len` bytes, when it goes as a train: trains are on and
    /// it holds more than one datagram.
    pub fn segment_for(&self, len: usize) -> Option<u16> {
        (self.datagrams() > 1 && len > usize::from(self.segment)).then_some(self.segment)
    }

    /// Turns trains off for the rest of the stream and says why, once, on standard error.
    pub fn stop(&mut self, why: String) {
        if self.off.is_none() && self.datagrams > 1 {
            eprintln!("note: trains off ({why}): sending one datagram per call");
            self.off = Some(why);
        }
    }

    /// Datagrams per train, when the stream sends trains at all.
    pub fn per_train(&self) -> Option<usize> {
        (self.datagrams > 1).then_some(self.datagrams)
    }

    /// Why trains stopped, if they did.
    pub fn off(&self) -> Option<&str> {
        self.off.as_deref()
    }
}

/// What the kernel's answer to a train says about trains on this path, when it refuses the
/// train rather than the destination (docs/kernel.md, "UDP GSO trains: the kernel's limits,
/// measured"): nothing of the train was sent (it came back in `SendError::Io`), and one datagram
/// per call may still go. The library hands the kernel's errno back as it gave it, so the errno
/// alone says which.
pub fn refusal(e: &io::Error) -> Option<String> {
    let why = match e.raw_os_error() {
        None => return None,
        Some(libc::EMSGSIZE) => "EMSGSIZE: a datagram and its headers exceed the path's MTU",
        Some(libc::EINVAL) => "EINVAL: the kernel refused the train's segments",
        Some(libc::EIO) => "EIO: the device cannot checksum a UDP GSO packet",
        Some(libc::EOPNOTSUPP | libc::ENOPROTOOPT) => "this kernel or socket has no UDP GSO",
        Some(_) => return None,
    };
    Some(why.into())
}

/// Why trains cannot go on the connected UDP socket `fd` for datagrams of `size` bytes, known
/// before the first train: a datagram and its IP and UDP headers above the path MTU. The kernel
/// never fragments a train's segment (it refuses the train, `EMSGSIZE`), where one datagram per
/// call goes fragmented. Asked up front because an io_uring engine answers a refused train only
/// in its release, after later trains went. `None`: trains may go (or the MTU is unknown, and the
/// kernel's answer to the first train says).
pub fn mtu_refusal(fd: BorrowedFd<'_>, size: usize) -> Option<String> {
    let v6 = socket2::SockRef::from(&fd).local_addr().ok()?.is_ipv6();
    let (mtu, headers) = if v6 {
        (rustix::net::sockopt::ipv6_mtu(fd), 48)
    } else {
        (rustix::net::sockopt::ip_mtu(fd), 28)
    };
    let mtu = usize::try_from(mtu.ok()?).ok()?;
    (size + headers > mtu).then(|| {
        format!(
            "a {size} B datagram with its {headers} B of headers is above the path MTU of {mtu} B, \
             and the kernel does not fragment a train's datagrams"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_train_goes_until_stopped_then_one_datagram_per_call() {
        let mut t = Trains::new(1472, 44);
        assert_eq!((t.datagrams(), t.per_train()), (44, Some(44)));
        assert_eq!(t.segment_for(44 * 1472), Some(1472));
        // The end of a --bytes budget: one datagram alone goes as a plain send.
        assert_eq!(t.segment_for(1472), None);
        assert_eq!(t.segment_for(1473), Some(1472));
        t.stop("EIO: the device cannot checksum a UDP GSO packet".into());
        t.stop("said once".into());
        assert_eq!(t.datagrams(), 1);
        assert_eq!(t.segment_for(44 * 1472), None);
        assert_eq!(
            t.off(),
            Some("EIO: the device cannot checksum a UDP GSO packet")
        );
        assert_eq!(t.per_train(), Some(44));
    }

    #[test]
    fn one_datagram_or_a_datagram_above_a_segment_is_no_train() {
        for t in [Trains::new(1472, 1), Trains::new(70_000, 44)] {
            assert_eq!((t.datagrams(), t.per_train()), (1, None));
            assert_eq!(t.segment_for(65_000), None);
        }
        let mut t = Trains::new(1472, 1);
        t.stop("never said".into());
        assert_eq!(t.off(), None);
    }

    #[test]
    fn refusals_of_the_train_are_told_from_errors_of_the_destination() {
        for errno in [libc::EMSGSIZE, libc::EINVAL, libc::EIO, libc::EOPNOTSUPP] {
            let e = io::Error::from_raw_os_error(errno);
            assert!(refusal(&e).is_some(), "{e}");
        }
        // Only the kernel's errno tells a refusal: an error without one is not.
        assert_eq!(refusal(&io::Error::other("no errno")), None);
        for errno in [libc::ECONNREFUSED, libc::ENETUNREACH, libc::EPERM] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(refusal(&e), None, "{e}");
        }
    }
}
