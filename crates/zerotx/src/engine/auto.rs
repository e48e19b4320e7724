//! The `auto` engine: which family of system calls a socket uses, chosen once from what the
//! kernel offers, and the per-send policy ([`policy::auto`](super::policy::auto)) inside it.
//!
//! - **io_uring** (`SEND_ZC`/`SENDMSG_ZC` and `SENDMSG`) for TCP and UDP when the kernel has
//!   zero-copy requests *and* says in their notifications whether it copied
//!   (`IORING_SEND_ZC_REPORT_USAGE`, 6.2): many sends per `io_uring_enter`, registered buffers
//!   when a pool is registered, and it beats the `sendmsg(2)` engines at every size measured here
//!   (see `zerotx bench`). One exception inside it: buffers under 16 KiB that it copies on a
//!   byte stream go by one gathered `sendmsg(2)` when none of the stream's requests is out
//!   ([`policy::write_now`](super::policy::write_now)): for them a request costs more than the
//!   call it replaces.
//! - **`sendmsg(2)`** with `MSG_ZEROCOPY` otherwise: vsock, a kernel whose io_uring cannot tell
//!   a copied send from a zero-copy one (no `IORING_SEND_ZC_REPORT_USAGE`: mainline 6.1; checked
//!   with one real send, since distributions backport it: Debian's 6.1.0-56 has it), so `auto`
//!   could not learn; io_uring disabled or refused (`kernel.io_uring_disabled`, seccomp, a small
//!   `RLIMIT_MEMLOCK`).
//! - **plain copy** where the socket has no zero-copy at all (AF_UNIX, RAW, packet; vsock before
//!   6.7).
//!
//! Every choice and the reason for it is kept for [`Explanation`](crate::Explanation).

use super::policy::auto::{AutoPolicy, Caps, Family, Thresholds};
use super::sendmsg;
use super::uring::UringEngine;
use super::Engine;
use crate::buf::SendBuf;
use crate::error::{Error, Feature};
use crate::sender::SenderConfig;
use crate::socket::{Family as SockFamily, SockType, Socket};
use crate::sys::uring as sysu;

/// What [`build`] chose.
pub(crate) struct Built<B> {
    pub(crate) engine: Box<dyn Engine<B>>,
    /// The family in plain words.
    pub(crate) path: &'static str,
    /// Why: one sentence per decision.
    pub(crate) notes: Vec<String>,
}

/// Reads the sender thread's CPU clock for `auto`'s threshold tuner once per epoch (the policy
/// says when), never per send.
#[derive(Debug, Default)]
pub(crate) struct EpochClock {
    last: Option<std::thread::ThreadId>,
}

impl EpochClock {
    #[inline]
    pub(crate) fn tick(&mut self, policy: &mut AutoPolicy) {
        if policy.clock_due() {
            let id = std::thread::current().id();
            let same = self.last == Some(id);
            self.last = Some(id);
            let ns = crate::sys::thread_cpu_ns();
            policy.on_clock(ns, same && ns > 0);
        }
    }
}

/// Whether `sock` is connected to a loopback address, where the kernel copies every zero-copy
/// send on delivery (KERNEL.md).
fn peer_on_loopback(sock: &Socket) -> bool {
    socket2::SockRef::from(&sock.fd())
        .peer_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .is_some_and(|a| match a.ip() {
            std::net::IpAddr::V4(ip) => ip.is_loopback(),
            std::net::IpAddr::V6(ip) => {
                ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        })
}

/// The note and the start for a policy whose peer is on loopback.
fn local_start(sock: &Socket, policy: &mut AutoPolicy, notes: &mut Vec<String>) {
    if peer_on_loopback(sock) {
        policy.start_copying();
        notes.push(
            "the peer is on loopback, where the kernel copies every zero-copy send on delivery: \
             copying from the first send"
                .into(),
        );
    }
}

/// The `auto` engine for `sock`.
pub(crate) fn build<B: SendBuf>(sock: &Socket, cfg: &SenderConfig) -> Result<Built<B>, Error> {
    let k = sock.kind;
    let byte_stream = k.is_byte_stream();
    let inet = matches!(k.family, SockFamily::Inet4 | SockFamily::Inet6);
    let tcp = k.ty == SockType::Stream && k.protocol == libc::IPPROTO_TCP;
    let udp = k.ty == SockType::Dgram && k.protocol == libc::IPPROTO_UDP;
    let memlock = sysu::pin_limit();
    let mut notes = Vec::new();
    if !cfg.auto_uring {
        notes.push("io_uring was ruled out by the configuration (auto_uring: false)".into());
    } else if inet && (tcp || udp) {
        match sysu::probe() {
            Ok(p) if p.send_zc && p.sendmsg_zc => {
                let reports = sysu::report_usage();
                if reports || cfg.ring.is_some() {
                    let mut policy = AutoPolicy::new(
                        Thresholds::new(Family::Uring, byte_stream),
                        Caps::derive(None, memlock),
                        cfg.at_cap,
                        reports,
                    );
                    let mut local = Vec::new();
                    local_start(sock, &mut policy, &mut local);
                    match UringEngine::with_policy(
                        sock,
                        true,
                        cfg.uring,
                        cfg.ring.as_ref(),
                        Some(policy),
                    ) {
                        Ok(e) => {
                            notes.push(
                                "io_uring: the kernel has zero-copy requests and reports whether \
                                 it copied them, and io_uring sends many buffers per system call"
                                    .into(),
                            );
                            notes.append(&mut local);
                            if !reports {
                                notes.push(
                                    "this kernel's io_uring does not say whether it copied \
                                     (IORING_SEND_ZC_REPORT_USAGE, 6.2): zero-copy stays on for \
                                     sends above the size threshold"
                                        .into(),
                                );
                            }
                            return Ok(Built {
                                engine: Box::new(e),
                                path: "io_uring",
                                notes,
                            });
                        }
                        Err(e) if cfg.ring.is_some() => return Err(e),
                        Err(e) => notes.push(format!("io_uring refused ({e}): using sendmsg(2)")),
                    }
                } else {
                    notes.push(
                        "this kernel's io_uring does not say whether it copied a zero-copy send \
                         (IORING_SEND_ZC_REPORT_USAGE, 6.2): using sendmsg(MSG_ZEROCOPY), whose \
                         completions do"
                            .into(),
                    );
                }
            }
            Ok(_) => notes.push(
                "this kernel's io_uring lacks SEND_ZC/SENDMSG_ZC (6.1): using sendmsg(2)".into(),
            ),
            Err(e) => notes.push(format!("io_uring unavailable ({e}): using sendmsg(2)")),
        }
    }
    if cfg.ring.is_some() {
        return Err(Error::Unsupported {
            feature: Feature::SharedRing(super::EngineKind::Auto),
            reason: format!(
                "auto submits through a ring only for TCP and UDP on a kernel with io_uring \
                 zero-copy sends ({})",
                notes.join("; ")
            ),
        });
    }
    match sock.enable_zerocopy(cfg.zerocopy_first_id) {
        Ok(first_id) => {
            let mut policy = AutoPolicy::new(
                Thresholds::new(Family::Syscall, byte_stream),
                Caps::derive(crate::sys::optmem_max().map(|m| m as usize), memlock),
                cfg.at_cap,
                true,
            );
            notes.push("sendmsg(2) with MSG_ZEROCOPY where it pays".into());
            local_start(sock, &mut policy, &mut notes);
            Ok(Built {
                engine: sendmsg::build(sock, true, first_id, Some(policy)),
                path: "sendmsg",
                notes,
            })
        }
        Err(e) => {
            notes.push(format!("no zero-copy on this socket: {e}"));
            Ok(Built {
                engine: sendmsg::build(sock, false, 0, None),
                path: "sendmsg (copy only)",
                notes,
            })
        }
    }
}
