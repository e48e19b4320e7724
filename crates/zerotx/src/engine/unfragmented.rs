//! Zero-copy datagrams the kernel never fragments.
//!
//! A UDP socket's default path-MTU mode (`IP_PMTUDISC_WANT`) makes the kernel fragment a datagram
//! larger than its path rather than refuse it. Fragmented, a `MSG_ZEROCOPY` datagram is never
//! safe: every fragment holds the id's pages, so a qdisc that drops a later fragment fails the
//! call (`ENOBUFS` with `IP_RECVERR`) while an earlier one still waits to be sent, and the id's
//! completion comes whenever that fragment is freed (31 s after, when the peer's reassembly timed
//! out: docs/kernel.md, "UDP and the path MTU"). No MTU asked in advance can tell which datagrams the
//! kernel will fragment: the path MTU drops, IP options and IPv6 extension headers lengthen the
//! header, `SO_BINDTODEVICE`, `SO_MARK` and policy routing pick another route.
//!
//! So the kernel decides, before it takes an id: a `msg-zc` (or `auto` on `sendmsg`) sender
//! puts its UDP socket under a path-MTU mode that refuses such a datagram with `EMSGSIZE`
//! ([`policy::unfragmented_mode`]; `__ip_append_data` and `__ip6_append_data` check the length
//! before `msg_zerocopy_realloc`). A datagram the kernel refused goes by copy, under the caller's
//! own mode for that one call, and fragments as it did before; one the caller's own mode refuses
//! (`IP_PMTUDISC_DO`, `PROBE`, `INTERFACE`) fails with `EMSGSIZE`, as it would without zerotx.
//! The smallest size the kernel refused is remembered per destination, only to skip calls bound
//! to fail: a datagram that large goes by copy under the caller's mode at once (two
//! `setsockopt` calls around its send), and one such copy in [`WIDEN_PROBE_EVERY`] is tried
//! under the guard's mode first; if it leaves unfragmented, the path widened and the size is
//! forgotten.
//!
//! An IPv6 socket gets both levels changed: its IPv4-mapped destinations follow the IPv4 mode.
//! Where a mode cannot be read or set, no datagram goes zero-copy. The caller's modes come back
//! when the sender closes ([`Sender::close`](crate::Sender::close)). A descriptor the caller kept
//! and changes the mode through is outside what zerotx can see.

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;

use smallvec::SmallVec;
use socket2::SockAddr;

use crate::engine::policy;
use crate::socket::{Family, Socket};
use crate::sys;

/// Destinations whose refused size is remembered before the memory is cleared.
const REFUSED_CACHE: usize = 1024;

/// A copy of a datagram the kernel refused before on its path goes straight under the caller's
/// mode (three calls: mode, send, mode), except one in this many, which is tried under the
/// guard's mode first (a fourth call), to learn that the path widened: a learnt path MTU expires
/// (`net.ipv4.route.mtu_expires`, 10 minutes by default), and routes change.
const WIDEN_PROBE_EVERY: u32 = 64;

/// One level whose mode the sender changed.
#[derive(Debug, Clone, Copy)]
struct Changed {
    v6: bool,
    /// The caller's mode, under which a datagram that needs fragmenting goes by copy.
    caller: i32,
    /// The mode zero-copy datagrams go under.
    ours: i32,
}

/// The path-MTU guard of one datagram socket's zero-copy sends (see the module docs).
pub(crate) struct Unfragmented {
    /// The socket sends zero-copy datagrams on IP: the guard acts.
    active: bool,
    /// The kernel refuses what it would fragment, so datagrams may go zero-copy.
    guarded: bool,
    changed: SmallVec<[Changed; 2]>,
    /// The smallest payload the kernel refused as too large for the connected peer's path.
    connected: usize,
    /// The same per destination.
    by_dest: HashMap<SockAddr, usize>,
    /// Copies sent straight under the caller's mode since the last probe of a wider path.
    unprobed: u32,
}

impl Unfragmented {
    /// The guard for `sock`, which sends zero-copy datagrams if `zerocopy_datagrams`: sets the
    /// socket's modes (see the module docs). Inert for every other socket.
    pub(crate) fn new(sock: &Socket, zerocopy_datagrams: bool) -> Self {
        let mut guard = Self {
            active: false,
            guarded: true,
            changed: SmallVec::new(),
            connected: usize::MAX,
            by_dest: HashMap::new(),
            unprobed: 0,
        };
        let levels: &[bool] = match sock.kind.family {
            Family::Inet4 => &[false],
            Family::Inet6 => &[true, false],
            _ => &[],
        };
        if !zerocopy_datagrams || levels.is_empty() {
            return guard;
        }
        guard.active = true;
        for &v6 in levels {
            if guard.impose(sock.fd(), v6).is_err() {
                // The kernel could not be kept from fragmenting: every datagram goes by copy.
                let _ = guard.set_modes(sock.fd(), |c| c.caller);
                guard.changed.clear();
                guard.guarded = false;
                break;
            }
        }
        guard
    }

    /// Puts the `v6` level under a mode that refuses to fragment, remembering the caller's.
    fn impose(&mut self, fd: BorrowedFd<'_>, v6: bool) -> io::Result<()> {
        let caller = sys::pmtu_mode(fd, v6)?;
        if let Some(ours) = policy::unfragmented_mode(caller) {
            sys::set_pmtu_mode(fd, v6, ours)?;
            self.changed.push(Changed { v6, caller, ours });
        }
        Ok(())
    }

    /// Puts the caller's modes back, for the caller to have its socket as it gave it: no
    /// zero-copy datagram goes after this.
    pub(crate) fn give_back(&mut self, fd: BorrowedFd<'_>) {
        self.guarded = false;
        for c in self.changed.drain(..) {
            // Nothing to do if it fails: the socket then refuses what it would fragment.
            let _ = sys::set_pmtu_mode(fd, c.v6, c.caller);
        }
    }

    /// Sets every changed level to `mode(level)`; stops at the first failure.
    fn set_modes(&self, fd: BorrowedFd<'_>, mode: impl Fn(&Changed) -> i32) -> io::Result<()> {
        for c in &self.changed {
            sys::set_pmtu_mode(fd, c.v6, mode(c))?;
        }
        Ok(())
    }

    /// Whether a datagram of `len` payload bytes to `dest` (the connected peer if `None`) may go
    /// zero-copy: the kernel refuses it if it would fragment, and it is smaller than what the
    /// kernel last refused on that path.
    #[inline]
    pub(crate) fn may_zerocopy(&self, len: usize, dest: Option<&SockAddr>) -> bool {
        self.guarded && self.below_refused(len, dest)
    }

    /// Whether `len` is below the smallest size the kernel refused on the way to `dest`.
    #[inline]
    fn below_refused(&self, len: usize, dest: Option<&SockAddr>) -> bool {
        match dest {
            None => len < self.connected,
            Some(d) => self.by_dest.get(d).map_or(true, |&refused| len < refused),
        }
    }

    /// The kernel refused a datagram of `len` bytes to `dest` as too large for its path
    /// (`EMSGSIZE`, no id taken).
    pub(crate) fn refused(&mut self, len: usize, dest: Option<&SockAddr>) {
        match dest {
            None => self.connected = self.connected.min(len),
            Some(d) => {
                if self.by_dest.len() >= REFUSED_CACHE && !self.by_dest.contains_key(d) {
                    self.by_dest.clear();
                }
                let refused = self.by_dest.entry(d.clone()).or_insert(len);
                *refused = (*refused).min(len);
            }
        }
    }

    /// A datagram of `len` bytes to `dest` left whole under our mode: the path takes it.
    fn fits(&mut self, len: usize, dest: Option<&SockAddr>) {
        match dest {
            None if len >= self.connected => self.connected = usize::MAX,
            None => {}
            Some(d) if self.by_dest.get(d).is_some_and(|&refused| len >= refused) => {
                self.by_dest.remove(d);
            }
            Some(_) => {}
        }
    }

    /// One send of `bytes` without `MSG_ZEROCOPY` (`sendto(2)`, [`sys::send_to`]). A datagram the
    /// guard's mode refuses as too large goes again under the caller's mode, which fragments it,
    /// and the guard's mode is put back; one the kernel refused before on its path goes under the
    /// caller's mode at once, but for a probe now and then ([`WIDEN_PROBE_EVERY`]). If the
    /// guard's mode cannot be put back, no datagram goes zero-copy any more. Adds the send calls
    /// it made to `sends`.
    #[inline]
    pub(crate) fn send_copy(
        &mut self,
        fd: BorrowedFd<'_>,
        bytes: &[u8],
        dest: Option<&SockAddr>,
        sends: &mut u64,
    ) -> io::Result<usize> {
        if self.active
            && !self.changed.is_empty()
            && !self.below_refused(bytes.len(), dest)
            && !self.probe_due()
        {
            return self.send_fragmenting(fd, bytes, dest, None, sends);
        }
        *sends += 1;
        let sent = sys::send_to(fd, bytes, dest, 0);
        if !self.active {
            return sent;
        }
        match sent {
            Ok(n) => {
                self.fits(bytes.len(), dest);
                Ok(n)
            }
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) && !self.changed.is_empty() => {
                self.refused(bytes.len(), dest);
                self.send_fragmenting(fd, bytes, dest, Some(e), sends)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the next copy the kernel refused before goes under the guard's mode first.
    fn probe_due(&mut self) -> bool {
        self.unprobed += 1;
        if self.unprobed >= WIDEN_PROBE_EVERY {
            self.unprobed = 0;
            return true;
        }
        false
    }

    /// [`send_copy`](Self::send_copy) of a datagram too large for its path, under the caller's
    /// mode; `refusal` is the guard's mode's answer (`EMSGSIZE`), the error if the caller's mode
    /// cannot be set.
    #[cold]
    #[inline(never)]
    fn send_fragmenting(
        &mut self,
        fd: BorrowedFd<'_>,
        bytes: &[u8],
        dest: Option<&SockAddr>,
        refusal: Option<io::Error>,
        sends: &mut u64,
    ) -> io::Result<usize> {
        let refusal = refusal.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EMSGSIZE));
        if self.set_modes(fd, |c| c.caller).is_err() {
            return match self.set_modes(fd, |c| c.ours) {
                Ok(()) => Err(refusal),
                Err(_) => {
                    self.guarded = false;
                    Err(refusal)
                }
            };
        }
        *sends += 1;
        let sent = sys::send_to(fd, bytes, dest, 0);
        if self.set_modes(fd, |c| c.ours).is_err() {
            // The socket may fragment again: zero-copy datagrams stop for good.
            self.guarded = false;
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guard that acts, on a socket whose modes it never touches.
    fn guard() -> Unfragmented {
        Unfragmented {
            active: true,
            guarded: true,
            changed: SmallVec::new(),
            connected: usize::MAX,
            by_dest: HashMap::new(),
            unprobed: 0,
        }
    }

    fn addr(port: u16) -> SockAddr {
        std::net::SocketAddr::from(([192, 0, 2, 2], port)).into()
    }

    #[test]
    fn a_refused_size_and_larger_skip_zero_copy_until_one_fits() {
        for dest in [None, Some(addr(9))] {
            let d = dest.as_ref();
            let mut g = guard();
            assert!(
                g.may_zerocopy(65_000, d),
                "nothing refused yet: the kernel decides"
            );
            g.refused(2500, d);
            assert!(!g.may_zerocopy(2500, d));
            assert!(!g.may_zerocopy(4000, d));
            assert!(g.may_zerocopy(2499, d));
            // A smaller refusal lowers the bound; a larger one does not raise it.
            g.refused(2000, d);
            g.refused(3000, d);
            assert!(!g.may_zerocopy(2000, d));
            // What went unfragmented below the bound says nothing; at or above it, the path
            // widened.
            g.fits(1500, d);
            assert!(!g.may_zerocopy(2000, d));
            g.fits(2000, d);
            assert!(g.may_zerocopy(4000, d));
        }
    }

    #[test]
    fn destinations_are_apart_and_the_memory_is_bounded() {
        let mut g = guard();
        g.refused(2500, Some(&addr(1)));
        assert!(g.may_zerocopy(3000, Some(&addr(2))));
        assert!(g.may_zerocopy(3000, None));
        for port in 0..(2 * REFUSED_CACHE as u16) {
            g.refused(2500, Some(&addr(port)));
            assert!(g.by_dest.len() <= REFUSED_CACHE);
        }
        // Forgotten or not, the kernel still refuses what would fragment.
        assert!(!g.may_zerocopy(2500, Some(&addr(2 * REFUSED_CACHE as u16 - 1))));
    }

    #[test]
    fn one_copy_in_so_many_probes_for_a_wider_path() {
        let mut g = guard();
        let due: Vec<bool> = (0..3 * WIDEN_PROBE_EVERY).map(|_| g.probe_due()).collect();
        assert_eq!(due.iter().filter(|&&d| d).count(), 3);
        assert!(due[WIDEN_PROBE_EVERY as usize - 1]);
    }

    #[test]
    fn an_unguarded_socket_sends_no_datagram_zero_copy() {
        let mut g = guard();
        g.guarded = false;
        assert!(!g.may_zerocopy(1, None));
        assert!(!g.may_zerocopy(1, Some(&addr(9))));
    }
}
