//! The engine factory: every engine a sender runs is built here, once, from its configuration and
//! its socket (above the engines and the configuration, below the [`Sender`](crate::Sender)), with the decisions that chose it kept as [`Note`]s for
//! [`Explanation`](crate::Explanation).
//!
//! `auto` chooses the family of system calls for the socket:
//! - **io_uring** (`SEND_ZC`/`SENDMSG_ZC` and `SENDMSG`) for TCP and UDP when the kernel has
//!   zero-copy requests *and* says in their notifications whether it copied
//!   (`IORING_SEND_ZC_REPORT_USAGE`, 6.2): many sends per `io_uring_enter`, registered buffers
//!   when a pool is registered. One exception inside it: buffers under 16 KiB that it copies on a
//!   byte stream go by one gathered `sendmsg(2)` when none of the stream's requests is out
//!   ([`policy::write_now`](crate::engine::policy::write_now)): for them a request costs more than the
//!   call it replaces.
//! - **`sendmsg(2)`** with `MSG_ZEROCOPY` otherwise: vsock, a kernel whose io_uring cannot tell
//!   a copied send from a zero-copy one (no `IORING_SEND_ZC_REPORT_USAGE`: mainline 6.1; checked
//!   with one real send, since distributions backport it), so `auto` could not learn; io_uring
//!   disabled or refused (`kernel.io_uring_disabled`, seccomp, a small `RLIMIT_MEMLOCK`).
//! - **plain copy** where the socket has no zero-copy at all (AF_UNIX, RAW, packet; vsock before
//!   6.7).
//!
//! Inside the family, [`policy::auto`](crate::engine::policy::auto) chooses per send.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use crate::buf::SendBuf;
use crate::config::SenderConfig;
use crate::engine::policy::auto::{AutoPolicy, Caps, Family, Thresholds};
use crate::engine::sendmsg;
use crate::engine::uring::{UringDatagram, UringStream};
use crate::engine::Engine;
use crate::error::{Error, Feature, SendError};
use crate::kind::EngineKind;
use crate::report::{Note, Released, Stats, COPY_ONLY, SENDMSG, URING};
use crate::socket::{Family as SockFamily, SockType, Socket};
use crate::sys;
use crate::sys::uring as sysu;

/// What [`build`] made.
pub(crate) struct Built<B> {
    pub(crate) engine: Box<dyn Engine<B>>,
    /// The family of system calls, as [`Explanation::path`](crate::Explanation::path) names it.
    pub(crate) path: &'static str,
    /// Why: one note per decision.
    pub(crate) notes: Vec<Note>,
}

impl<B> Built<B> {
    fn new(engine: Box<dyn Engine<B>>, path: &'static str, notes: Vec<Note>) -> Self {
        Self {
            engine,
            path,
            notes,
        }
    }
}

/// The engine `cfg` asks for on `sock`.
pub(crate) fn build<B: SendBuf>(sock: &Socket, cfg: &SenderConfig) -> Result<Built<B>, Error> {
    let kind = cfg.engine;
    if cfg.ring.is_some()
        && !matches!(
            kind,
            EngineKind::Uring | EngineKind::UringZc | EngineKind::Auto
        )
    {
        return Err(Error::Unsupported {
            feature: Feature::SharedRing(kind),
            reason: "only the uring and uring-zc engines submit through a ring".into(),
        });
    }
    let asked = vec![Note::Asked(kind)];
    Ok(match kind {
        EngineKind::Auto => return auto(sock, cfg),
        EngineKind::Copy => Built::new(
            sendmsg::build(sock, false, 0, None, cfg.batch_trains),
            SENDMSG,
            asked,
        ),
        EngineKind::MsgZerocopy => {
            let first_id = sock.enable_zerocopy(cfg.zerocopy_first_id)?;
            Built::new(
                sendmsg::build(sock, true, first_id, None, cfg.batch_trains),
                SENDMSG,
                asked,
            )
        }
        EngineKind::Uring | EngineKind::UringZc => {
            let zc = kind == EngineKind::UringZc;
            let engine = uring::<B>(sock, zc, cfg, None)?;
            Built::new(engine, URING, asked)
        }
    })
}

/// The `auto` engine for `sock`: io_uring where it can learn, else `sendmsg(2)` with
/// `MSG_ZEROCOPY`, else copy.
fn auto<B: SendBuf>(sock: &Socket, cfg: &SenderConfig) -> Result<Built<B>, Error> {
    let k = sock.kind;
    let inet = matches!(k.family, SockFamily::Inet4 | SockFamily::Inet6);
    let tcp = k.ty == SockType::Stream && k.protocol == libc::IPPROTO_TCP;
    let udp = k.ty == SockType::Dgram && k.protocol == libc::IPPROTO_UDP;
    let mut notes = Vec::new();
    if !cfg.auto_uring {
        notes.push(Note::UringRuledOut);
    } else if inet && (tcp || udp) {
        if let Some(built) = auto_uring(sock, cfg, &mut notes)? {
            return Ok(built);
        }
    }
    if cfg.ring.is_some() {
        let why: Vec<String> = notes.iter().map(Note::to_string).collect();
        return Err(Error::Unsupported {
            feature: Feature::SharedRing(EngineKind::Auto),
            reason: format!(
                "auto submits through a ring only for TCP and UDP on a kernel with io_uring \
                 zero-copy sends ({})",
                why.join("; ")
            ),
        });
    }
    Ok(auto_sendmsg(sock, cfg, notes))
}

/// `auto` on io_uring, if the kernel offers zero-copy requests that report copies (or the caller
/// gave a shared ring) and the ring can be made; otherwise `None`, with the reason in `notes`.
/// Fails only when a shared ring was asked for and refused the sender.
fn auto_uring<B: SendBuf>(
    sock: &Socket,
    cfg: &SenderConfig,
    notes: &mut Vec<Note>,
) -> Result<Option<Built<B>>, Error> {
    match sysu::probe() {
        Ok(p) if p.send_zc && p.sendmsg_zc => {}
        Ok(_) => {
            notes.push(Note::UringWithoutZerocopy);
            return Ok(None);
        }
        Err(e) => {
            notes.push(Note::UringUnavailable(e.to_string()));
            return Ok(None);
        }
    }
    let reports = sysu::report_usage();
    if !reports && cfg.ring.is_none() {
        notes.push(Note::UringCannotLearn);
        return Ok(None);
    }
    let thresholds = Thresholds::new(Family::Uring, sock.kind.is_byte_stream());
    let caps = Caps::derive(None, sysu::pin_limit());
    let mut policy = AutoPolicy::new(thresholds, caps, cfg.at_cap, reports);
    let local = start_local(sock, &mut policy);
    match uring::<B>(sock, true, cfg, Some(policy)) {
        Ok(engine) => {
            notes.push(Note::UringChosen);
            notes.extend(local);
            if !reports {
                notes.push(Note::UringBlind);
            }
            Ok(Some(Built::new(engine, URING, std::mem::take(notes))))
        }
        Err(e) if cfg.ring.is_some() => Err(e),
        Err(e) => {
            notes.push(Note::UringRefused(e.to_string()));
            Ok(None)
        }
    }
}

/// The io_uring engine for `sock`'s shape, chosen once: [`UringStream`] on a connection (one
/// request in flight), [`UringDatagram`] on a datagram socket. Zero-copy requests when `zc`;
/// `auto`'s policy chooses per record when given (`zc` must be set).
fn uring<B: SendBuf>(
    sock: &Socket,
    zc: bool,
    cfg: &SenderConfig,
    auto: Option<AutoPolicy>,
) -> Result<Box<dyn Engine<B>>, Error> {
    let (uring, ring) = (cfg.uring, cfg.ring.as_ref());
    Ok(if sock.kind.is_ordered() {
        Box::new(UringStream::new(sock, zc, uring, ring, auto)?)
    } else {
        Box::new(UringDatagram::new(
            sock,
            zc,
            uring,
            ring,
            auto,
            cfg.batch_trains,
        )?)
    })
}

/// `auto` on `sendmsg(2)`: with `MSG_ZEROCOPY` where the socket has it, else copy.
fn auto_sendmsg<B: SendBuf>(sock: &Socket, cfg: &SenderConfig, mut notes: Vec<Note>) -> Built<B> {
    match sock.enable_zerocopy(cfg.zerocopy_first_id) {
        Ok(first_id) => {
            let thresholds = Thresholds::new(Family::Syscall, sock.kind.is_byte_stream());
            let optmem = sys::optmem_max().map(|m| m as usize);
            let caps = Caps::derive(optmem, sysu::pin_limit());
            let mut policy = AutoPolicy::new(thresholds, caps, cfg.at_cap, true);
            notes.push(Note::SendmsgZerocopy);
            notes.extend(start_local(sock, &mut policy));
            let engine = sendmsg::build(sock, true, first_id, Some(policy), cfg.batch_trains);
            Built::new(engine, SENDMSG, notes)
        }
        Err(e) => {
            notes.push(Note::NoZerocopy(e.to_string()));
            Built::new(
                sendmsg::build(sock, false, 0, None, cfg.batch_trains),
                COPY_ONLY,
                notes,
            )
        }
    }
}

/// Starts `policy` copying when `sock`'s peer is on loopback, where the kernel copies every
/// zero-copy send on delivery (docs/kernel.md, "MSG_ZEROCOPY"), and says so.
fn start_local(sock: &Socket, policy: &mut AutoPolicy) -> Option<Note> {
    peer_on_loopback(sock).then(|| {
        policy.start_copying();
        Note::Loopback
    })
}

/// Whether `sock` is connected to a loopback address.
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

/// The engine `cfg` asks for on a socket, as `build` makes it, driven without a
/// [`Sender`](crate::Sender): for the tests that look at what one engine call does, before any
/// progress (reached through `internals`).
pub struct Bare<B> {
    /// The family of system calls, as [`Explanation::path`](crate::Explanation::path) names it.
    pub path: &'static str,
    /// Why, one sentence per decision, as [`Explanation`](crate::Explanation) words them.
    pub notes: Vec<String>,
    engine: Box<dyn Engine<B>>,
    sock: Socket,
}

impl<B: SendBuf> Bare<B> {
    /// [`build`] on the socket `fd`.
    pub fn build(fd: OwnedFd, cfg: &SenderConfig) -> Result<Self, Error> {
        let sock = Socket::new(fd)?;
        let built = build(&sock, cfg)?;
        Ok(Self {
            path: built.path,
            notes: built.notes.iter().map(Note::to_string).collect(),
            engine: built.engine,
            sock,
        })
    }

    /// The engine's `batch`: a batch of sends opens (`true`) or ends.
    pub fn batch(&mut self, open: bool) {
        self.engine.batch(open);
    }

    /// The engine's `try_send_batch`, with what it releases appended to `out`.
    pub fn try_send_batch(
        &mut self,
        bufs: &mut VecDeque<B>,
        out: &mut Vec<Released<B>>,
    ) -> Result<usize, SendError<B>> {
        self.engine.try_send_batch(&self.sock, bufs, out)
    }

    /// The engine's counters.
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Buffers the engine holds.
    pub fn held(&self) -> usize {
        self.engine.held()
    }
}
