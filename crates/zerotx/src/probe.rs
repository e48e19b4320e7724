//! What this host supports for zero-copy transmit, and what to tune: measured, not assumed.
//!
//! [`probe()`] asks the kernel directly: `setsockopt(SO_ZEROCOPY)` on each socket kind, an
//! io_uring opcode probe and one real `SEND_ZC` with `REPORT_USAGE`, the limits that answer
//! `ENOBUFS`, and one real `MSG_ZEROCOPY` send over TCP loopback to see whether the kernel copies.

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

use crate::kind::EngineKind;
use crate::sender::Sender;
use crate::sys::{self, uring};

/// Whether one socket kind takes `SO_ZEROCOPY`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SocketSupport {
    /// `tcp4`, `udp6`, `unix`, `vsock`...
    pub kind: String,
    /// `setsockopt(SO_ZEROCOPY)` succeeded.
    pub zerocopy: bool,
    /// The kernel's answer, or why the socket could not be made.
    pub detail: String,
}

/// What io_uring offers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct UringSupport {
    /// A ring could be created.
    pub available: bool,
    /// The kernel's answer when it could not (`ENOSYS`, `EPERM`...).
    pub detail: String,
    /// `IORING_OP_SEND_ZC`.
    pub send_zc: bool,
    /// `IORING_OP_SENDMSG_ZC`.
    pub sendmsg_zc: bool,
    /// `IORING_SEND_ZC_REPORT_USAGE`, checked with one real send; `None` if not checked.
    pub report_usage: Option<bool>,
}

/// What one real zero-copy send over loopback showed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LoopbackCheck {
    /// `MSG_ZEROCOPY` over TCP loopback: the completion said COPIED. `None` if the check failed.
    pub msg_zerocopy_copied: Option<bool>,
    /// `SEND_ZC` over UDP loopback with `REPORT_USAGE`: the notification said copied.
    pub uring_copied: Option<bool>,
    /// What went wrong, if anything.
    pub detail: String,
}

/// Everything [`probe()`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ProbeReport {
    /// `uname -r`.
    pub kernel: String,
    /// `SO_ZEROCOPY` per socket kind.
    pub sockets: Vec<SocketSupport>,
    /// vsock has a transport (`/dev/vsock` answers `IOCTL_VM_SOCKETS_GET_LOCAL_CID`).
    pub vsock_transport: bool,
    /// io_uring.
    pub io_uring: UringSupport,
    /// `net.core.optmem_max` of this network namespace, bytes.
    pub optmem_max: Option<u64>,
    /// `RLIMIT_MEMLOCK` soft limit, bytes; `None` = unlimited.
    pub memlock_soft: Option<u64>,
    /// The process has `CAP_IPC_LOCK`, which lifts the locked-memory limit.
    pub cap_ipc_lock: bool,
    /// Transparent huge pages: `always`, `madvise` or `never` (the mode in
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, or the 2 MiB size's own where it does not
    /// say `inherit`); `None` without them. Under `always` or
    /// `madvise` a [`BufPool::huge`](crate::buf::BufPool::huge) pool gets huge pages.
    pub huge_pages: Option<String>,
    /// Loopback behaviour, measured.
    pub loopback: LoopbackCheck,
    /// Plain-words advice.
    pub advice: Vec<String>,
}

const KINDS: &[(&str, i32, i32, i32)] = &[
    ("tcp4", libc::AF_INET, libc::SOCK_STREAM, 0),
    ("tcp6", libc::AF_INET6, libc::SOCK_STREAM, 0),
    ("udp4", libc::AF_INET, libc::SOCK_DGRAM, 0),
    ("udp6", libc::AF_INET6, libc::SOCK_DGRAM, 0),
    ("unix", libc::AF_UNIX, libc::SOCK_STREAM, 0),
    ("vsock", libc::AF_VSOCK, libc::SOCK_STREAM, 0),
    ("raw4", libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_UDP),
    ("packet", libc::AF_PACKET, libc::SOCK_DGRAM, 0),
];

fn socket_support(kind: &str, domain: i32, ty: i32, proto: i32) -> SocketSupport {
    let (zerocopy, detail) = match sys::socket(domain, ty, proto) {
        Err(e) => (false, format!("socket(): {e}")),
        Ok(fd) => match sys::enable_zerocopy(fd.as_fd()) {
            Ok(()) => (true, "SO_ZEROCOPY accepted".to_string()),
            Err(e) => (false, format!("SO_ZEROCOPY: {e}")),
        },
    };
    SocketSupport {
        kind: kind.to_string(),
        zerocopy,
        detail,
    }
}

fn uring_support() -> UringSupport {
    match uring::probe() {
        Err(e) => UringSupport {
            available: false,
            detail: format!("io_uring_setup: {e}"),
            send_zc: false,
            sendmsg_zc: false,
            report_usage: None,
        },
        Ok(p) => UringSupport {
            available: true,
            detail: "io_uring available".into(),
            send_zc: p.send_zc,
            sendmsg_zc: p.sendmsg_zc,
            report_usage: None,
        },
    }
}

/// One `MSG_ZEROCOPY` send of 64 KiB over TCP loopback through a [`Sender`]: was it copied?
fn loopback_msg_zerocopy() -> Result<bool, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let reader = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n,
            }
        }
    });
    let stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let mut tx = Sender::new(stream, EngineKind::MsgZerocopy).map_err(|e| e.to_string())?;
    tx.send(vec![0x5a; 1 << 16]).map_err(|e| e.to_string())?;
    tx.flush(Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tx.reap(&mut out).map_err(|e| e.to_string())?;
    drop(tx.close(Duration::from_secs(1)));
    let _ = reader.join();
    let released = out.first().ok_or("no buffer came back")?;
    Ok(!released.report.path.is_zerocopy())
}

/// One `SEND_ZC` with `REPORT_USAGE` over UDP loopback. `Ok(None)` if `REPORT_USAGE` is refused.
fn loopback_uring() -> Result<Option<bool>, String> {
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    tx.connect(rx.local_addr().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let buf = vec![0x5au8; 4096];
    let (res, notif) = uring::send_zc_once(tx.as_fd(), &buf).map_err(|e| e.to_string())?;
    if res == -libc::EINVAL {
        return Ok(None);
    }
    if res < 0 {
        return Err(std::io::Error::from_raw_os_error(-res).to_string());
    }
    Ok(notif.map(|n| n & uring::NOTIF_USAGE_ZC_COPIED != 0))
}

fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The running kernel's release (`uname -r`).
#[doc(hidden)]
pub fn kernel_release() -> String {
    sys::kernel_release().unwrap_or_else(|e| format!("unknown ({e})"))
}

/// Probes the host. Takes well under a second; sends only over loopback.
pub fn probe() -> ProbeReport {
    let sockets: Vec<_> = KINDS
        .iter()
        .map(|&(k, d, t, p)| socket_support(k, d, t, p))
        .collect();
    let mut io_uring = uring_support();
    let mut detail = Vec::new();
    let msg_zerocopy_copied = loopback_msg_zerocopy()
        .map_err(|e| detail.push(format!("msg-zc loopback check: {e}")))
        .ok();
    let uring_copied = if io_uring.send_zc {
        match loopback_uring() {
            Ok(r) => {
                io_uring.report_usage = Some(r.is_some());
                r
            }
            Err(e) => {
                detail.push(format!("io_uring loopback check: {e}"));
                None
            }
        }
    } else {
        None
    };
    let (memlock_soft, _) = sys::memlock_limit().unwrap_or((None, None));
    let mut report = ProbeReport {
        kernel: kernel_release(),
        sockets,
        vsock_transport: sys::vsock_local_cid().is_ok(),
        io_uring,
        optmem_max: sys::optmem_max(),
        memlock_soft,
        cap_ipc_lock: has_cap_ipc_lock(),
        huge_pages: huge_page_mode(),
        loopback: LoopbackCheck {
            msg_zerocopy_copied,
            uring_copied,
            detail: detail.join("; "),
        },
        advice: Vec::new(),
    };
    report.advice = advise(&report);
    report
}

/// Where the kernel says its transparent huge page mode.
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// The mode of 2 MiB pages alone (6.8+), which may override it.
const THP_PMD_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled";

/// The transparent huge page mode that governs 2 MiB pages (what [`BufPool::huge`] asks for):
/// `always`, `madvise` or `never`, from the 2 MiB size's own setting where the kernel has one
/// (6.8+) and it does not say `inherit`, else the machine's; `None` without transparent huge
/// pages.
///
/// [`BufPool::huge`]: crate::buf::BufPool::huge
#[doc(hidden)]
pub fn huge_page_mode() -> Option<String> {
    let read = |path| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| thp_mode(&t))
    };
    let top = read(THP_ENABLED)?;
    Some(
        read(THP_PMD_ENABLED)
            .filter(|m| m != "inherit")
            .unwrap_or(top),
    )
}

/// The selected mode of `text`, as the kernel writes it: `always [madvise] never`.
fn thp_mode(text: &str) -> Option<String> {
    let mode = text.split(['[', ']']).nth(1)?.trim();
    (!mode.is_empty()).then(|| mode.to_string())
}

/// Plain-words advice from a report (pure, so it is tested on made-up reports).
#[doc(hidden)]
pub fn advise(r: &ProbeReport) -> Vec<String> {
    let mut a = Vec::new();
    let zc = |k: &str| r.sockets.iter().any(|s| s.kind == k && s.zerocopy);
    if !zc("tcp4") && !zc("udp4") {
        a.push(
            "MSG_ZEROCOPY is not available (kernel before 4.14, or SO_ZEROCOPY refused): every \
             engine but `copy` is off; upgrade the kernel to use zero-copy."
                .into(),
        );
    }
    if zc("vsock") && !r.vsock_transport {
        a.push("vsock accepts SO_ZEROCOPY but has no transport here (no /dev/vsock CID): vsock sends need a VM with virtio-vsock or vhost.".into());
    }
    if let Some(m) = r.optmem_max {
        if m < 128 * 1024 {
            a.push(format!(
                "net.core.optmem_max is {m} bytes: each in-flight zero-copy send holds option \
                 memory until its completion is read, so sends fail with ENOBUFS early; raise it \
                 (sysctl -w net.core.optmem_max=1048576)."
            ));
        }
    }
    if !r.cap_ipc_lock {
        if let Some(lim) = r.memlock_soft {
            a.push(format!(
                "RLIMIT_MEMLOCK is {} KiB and this process lacks CAP_IPC_LOCK: pages pinned by \
                 zero-copy sends count against it, so large or many sends fail with ENOBUFS; raise \
                 it (ulimit -l, limits.conf) or grant CAP_IPC_LOCK.",
                lim / 1024
            ));
        }
    }
    if r.huge_pages.as_deref() == Some("never") {
        a.push(
            "Transparent huge pages are off (`never`): a BufPool::huge pool gets small pages, and \
             zero-copy pins one page reference per 4 KiB instead of one per 2 MiB (with them \
             msg-zc measured 1.28x at 65000 B into a black hole); `echo madvise > \
             /sys/kernel/mm/transparent_hugepage/enabled` (and `echo inherit >` its \
             hugepages-2048kB/enabled, where that says never) lets pools that ask have them."
                .into(),
        );
    }
    if r.loopback.msg_zerocopy_copied == Some(true) {
        a.push(
            "Loopback copies: the kernel copies every zero-copy send delivered to a local socket \
             (and reports COPIED), so expect no gain, usually a loss, on loopback or to a local \
             container; zero-copy pays only for traffic leaving through a real device."
                .into(),
        );
    }
    if !r.io_uring.available {
        a.push(format!(
            "io_uring is unavailable ({}): the uring engines are off (check \
             kernel.io_uring_disabled and seccomp).",
            r.io_uring.detail
        ));
    } else if !r.io_uring.send_zc {
        a.push("io_uring lacks SEND_ZC (needs 6.0): the uring-zc engines are off.".into());
    } else if r.io_uring.report_usage == Some(false) {
        a.push("io_uring SEND_ZC lacks REPORT_USAGE (needs 6.2): zerotx cannot tell zero-copy from copied there.".into());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_huge_page_mode_is_the_bracketed_word() {
        assert_eq!(
            thp_mode("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            thp_mode("[always] madvise never").as_deref(),
            Some("always")
        );
        assert_eq!(thp_mode("always madvise [never]").as_deref(), Some("never"));
        assert_eq!(thp_mode("always madvise never"), None);
        assert_eq!(thp_mode(""), None);
    }
}
