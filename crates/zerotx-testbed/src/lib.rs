//! Topologies the tests and `zerotx bench` build for themselves, on one machine.
//!
//! - Loopback: the kernel copies every zero-copy send delivered to a local socket, and says so.
//! - The *black hole* (docs/kernel.md, "This machine (what a test can rely on)"): inside a fresh network namespace, a veth whose peer is down and
//!   a static neighbour entry. UDP to [`BlackHole::v4`] or [`BlackHole::v6`] leaves through the
//!   device, which drops it after the send: true zero-copy completions on one machine, the role
//!   the `dummy` device plays in the kernel's io_uring benchmarks. Nothing leaves the namespace.
//! - The black hole *with carrier* ([`carrier_black_hole`]): the veth peer is up in a second
//!   namespace that drops everything at ingress, so the device's transmit path (and GSO
//!   segmentation, in software or not) runs as on a NIC.
//!
//! Namespaces are per thread: [`in_new_netns`] runs a closure on a thread that called
//! `unshare(CLONE_NEWNET)`; sockets it makes and commands it spawns (`ip`) live in that namespace.
//! Needs `CAP_SYS_ADMIN` (root) and `ip` from iproute2.
//!
//! A crate of its own because none of it is zero-copy sending: the library stays free of process
//! management, and the tests, the benchmark and the examples share one copy of it.
#![deny(missing_docs)]

mod carrier;
mod link;

pub use carrier::{carrier_black_hole, CarrierBlackHole, Segmentation};
use link::ip;

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::time::Duration;

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

/// `ZEROTX_STRICT=1` (set by `.ci/run`): a test that would skip fails instead.
pub fn strict() -> bool {
    std::env::var("ZEROTX_STRICT").is_ok_and(|v| v == "1")
}

/// Returns whether a test may go on; otherwise [`skip`]s with `why`.
pub fn require(ok: bool, why: &str) -> bool {
    if !ok {
        skip(why);
    }
    ok
}

/// The variable naming the file where [`skip`] also records each skip (`scripts/test.sh` sets
/// it and prints the file at the end: libtest shows a skipped test as `ok` and hides its stderr).
pub const SKIP_LOG: &str = "ZEROTX_SKIP_LOG";

/// Says why the calling test skips, or fails under [`strict`]. With [`SKIP_LOG`] set, appends
/// one line `test-binary: test-name: why` to that file.
pub fn skip(why: &str) {
    assert!(
        !strict(),
        "ZEROTX_STRICT=1 and a requirement is missing: {why}"
    );
    eprintln!("SKIPPED: {why}");
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        // libtest names each test's thread after the test.
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        let binary = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            // Cargo's test binaries end in `-<hash>`.
            .map(|s| s.rsplit_once('-').map_or(s.clone(), |(b, _)| b.to_owned()))
            .unwrap_or_default();
        let line = format!("{binary}: {test}: {why}\n");
        // One write on an O_APPEND file: concurrent test binaries' lines do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = written {
            eprintln!("recording the skip in {}: {e}", path.to_string_lossy());
        }
    }
}

/// Whether the process runs as root (network namespaces, sysctls, limits).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
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
            unshare_netns().map_err(|e| {
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
    // zc1 stays down: the device drops what it is given, after the send completed.
    ip(&["link", "set", DEVICE, "mtu", &mtu_s, "up"])?;
    let (v4, v6) = link::addresses(DEVICE)?;
    Ok(BlackHole { v4, v6, mtu })
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

macro_rules! syscall {
    ($fn:ident($($arg:expr),* $(,)?)) => {{
        // SAFETY: a plain libc call whose pointer arguments point at live locals of the caller.
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 {
            Err(io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

/// `pthread_setaffinity`-style pinning of the calling thread to one CPU (`sched_setaffinity(0)`).
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is a plain bitmask for which all-zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: CPU_SET only writes inside the set it is given.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    syscall!(sched_setaffinity(
        0,
        mem::size_of::<libc::cpu_set_t>(),
        &set
    ))?;
    Ok(())
}

/// `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`: CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Cannot fail for this clock id on Linux; a zero reading would only make a figure look small.
    let _ = syscall!(clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts));
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `unshare(CLONE_NEWNET)` for the calling thread: it (and the processes it spawns) enter a new,
/// empty network namespace. Needs `CAP_SYS_ADMIN`.
fn unshare_netns() -> io::Result<()> {
    syscall!(unshare(libc::CLONE_NEWNET))?;
    Ok(())
}

/// `getrusage(who)`: (user, system) CPU time.
fn rusage(who: libc::c_int) -> (Duration, Duration) {
    // SAFETY: rusage is a plain C struct for which all-zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { mem::zeroed() };
    // Cannot fail for RUSAGE_SELF or RUSAGE_CHILDREN with a valid pointer.
    let _ = syscall!(getrusage(who, &mut ru));
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// `getrusage(RUSAGE_SELF)`: user + system CPU time of the whole process, including io_uring's
/// worker threads (they belong to the process).
pub fn process_cpu_time() -> Duration {
    let (user, system) = process_cpu_split();
    user + system
}

/// `getrusage(RUSAGE_SELF)`: user and system CPU time of the whole process, apart.
pub fn process_cpu_split() -> (Duration, Duration) {
    rusage(libc::RUSAGE_SELF)
}

/// `getrusage(RUSAGE_CHILDREN)`: user + system CPU time of the child processes that ended and
/// were waited for (a benchmark's baseline programs run as children).
pub fn children_cpu_time() -> Duration {
    let (user, system) = rusage(libc::RUSAGE_CHILDREN);
    user + system
}

/// The size in bytes of CPU 0's L2 cache, from sysfs (`1024K`: 1024-based, read by
/// `parse-size` as the CLI reads sizes).
pub fn l2_cache_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size").ok()?;
    cache_size(&s)
}

/// A cache size as sysfs writes it (`512K`, `2M`, `48`).
fn cache_size(s: &str) -> Option<usize> {
    let n = parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .ok()?;
    usize::try_from(n).ok()
}

/// What `/proc/self/smaps` says of the mapping of this process that holds `addr`: its
/// `AnonHugePages` in kB and its `VmFlags` (`hg`: `MADV_HUGEPAGE`, `nh`: `MADV_NOHUGEPAGE`).
/// `None` if no mapping holds it.
pub fn mapping_of(addr: usize) -> Option<(u64, String)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    let (mut huge, mut flags) = (None, None);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                if inside {
                    break; // the mapping's lines are over
                }
                inside = (a..b).contains(&addr);
                continue;
            }
        }
        if !inside {
            continue;
        }
        if let Some(kb) = line.strip_prefix("AnonHugePages:") {
            huge = kb.trim().trim_end_matches("kB").trim().parse().ok();
        } else if let Some(f) = line.strip_prefix("VmFlags:") {
            flags = Some(f.trim().to_string());
        }
    }
    Some((huge?, flags.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(super::cache_size("1024K\n"), Some(1 << 20));
        assert_eq!(super::cache_size("2M"), Some(2 << 20));
        assert_eq!(super::cache_size("48"), Some(48));
        assert_eq!(super::cache_size("big"), None);
    }
}
