//! Topologies the tests and `zerotx bench` build for themselves, on one machine.
//!
//! - Loopback: the kernel copies every zero-copy send delivered to a local socket, and says so.
//! - The *black hole* (KERNEL.md): inside a fresh network namespace, a veth whose peer is down and
//!   a static neighbour entry. UDP to [`BlackHole::v4`] or [`BlackHole::v6`] leaves through the
//!   device, which drops it after the send: true zero-copy completions on one machine, the role
//!   the `dummy` device plays in the kernel's io_uring benchmarks. Nothing leaves the namespace.
//!
//! Namespaces are per thread: [`in_new_netns`] runs a closure on a thread that called
//! `unshare(CLONE_NEWNET)`; sockets it makes and commands it spawns (`ip`) live in that namespace.
//! Needs `CAP_SYS_ADMIN` (root) and `ip` from iproute2.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::process::Command;

use crate::sys;

/// The black hole's addresses, valid inside the namespace that built it.
#[derive(Debug, Clone, Copy)]
pub struct BlackHole {
    /// An IPv4 destination (192.0.2.2, TEST-NET-1) the device drops after sending.
    pub v4: SocketAddr,
    /// An IPv6 destination (2001:db8::2, documentation prefix) the device drops after sending.
    pub v6: SocketAddr,
    /// The device MTU; datagrams above it are fragmented, and fragments are copied.
    pub mtu: u32,
}

/// Device name of the black hole's sending side.
pub const DEVICE: &str = "zc0";

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("running `ip` (iproute2) failed: {e}; install iproute2"),
        )
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Runs `f` on a new thread inside a new, empty network namespace (loopback up). The namespace
/// goes away when the thread ends and nothing else uses it.
pub fn in_new_netns<T, F>(f: F) -> io::Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::unshare_netns().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("unshare(CLONE_NEWNET) failed: {e} (needs root / CAP_SYS_ADMIN)"),
                )
            })?;
            ip(&["link", "set", "lo", "up"])?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Builds the black hole in the calling thread's network namespace, which must be one of ours
/// (see [`in_new_netns`]): it adds a device and addresses. `mtu` 65535 keeps 64 KiB datagrams
/// whole.
pub fn black_hole(mtu: u32) -> io::Result<BlackHole> {
    let mtu_s = mtu.to_string();
    ip(&["link", "add", DEVICE, "type", "veth", "peer", "name", "zc1"])?;
    ip(&["addr", "add", "192.0.2.1/24", "dev", DEVICE])?;
    ip(&[
        "-6",
        "addr",
        "add",
        "2001:db8::1/64",
        "dev",
        DEVICE,
        "nodad",
    ])?;
    // zc1 stays down: the device drops what it is given, after the send completed.
    ip(&["link", "set", DEVICE, "mtu", &mtu_s, "up"])?;
    let mac = "02:00:00:00:00:02";
    ip(&["neigh", "add", "192.0.2.2", "lladdr", mac, "dev", DEVICE])?;
    ip(&[
        "-6",
        "neigh",
        "add",
        "2001:db8::2",
        "lladdr",
        mac,
        "dev",
        DEVICE,
    ])?;
    Ok(BlackHole {
        v4: SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 2), 9).into(),
        v6: SocketAddrV6::new(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2), 9, 0, 0).into(),
        mtu,
    })
}

const OPTMEM: &str = "/proc/sys/net/core/optmem_max";

/// `net.core.optmem_max` of the calling thread's network namespace.
pub fn optmem_max() -> io::Result<u64> {
    std::fs::read_to_string(OPTMEM)?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{OPTMEM}: {e}")))
}

/// Sets `net.core.optmem_max` in the calling thread's network namespace (per namespace on recent
/// kernels: do this only inside one of ours).
pub fn set_optmem_max(bytes: u64) -> io::Result<()> {
    std::fs::write(OPTMEM, bytes.to_string())
}

/// Pins the calling thread to one CPU (`sched_setaffinity`), as the benchmark does to keep sender
/// and sink apart.
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    sys::pin_to_cpu(cpu)
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); hardware counters are not
/// needed.
pub fn thread_cpu_time() -> std::time::Duration {
    sys::thread_cpu_time()
}

/// CPU time of the whole process (`getrusage(RUSAGE_SELF)`), io_uring workers included.
pub fn process_cpu_time() -> std::time::Duration {
    sys::process_cpu_time()
}

/// CPU 0's L2 cache size, from sysfs, if the kernel tells.
pub fn l2_cache_bytes() -> Option<usize> {
    sys::l2_cache_bytes()
}

/// Test hooks that inject io_uring faults the kernel cannot produce on demand (a failed
/// `io_uring_enter`, an SQE whose preparation fails), for the calling thread only.
#[doc(hidden)]
pub mod uring_faults {
    pub use crate::sys::uring::{inject, Faults};
}
