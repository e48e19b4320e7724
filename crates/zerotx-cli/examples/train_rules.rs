//! The kernel's rules for UDP GSO trains, measured on the running kernel (docs/kernel.md, "UDP
//! GSO trains: the kernel's limits, measured"): the segments one call may carry, the largest
//! train, a segment above the MTU, and a zero-copy train through a device with segmentation
//! offload and through one without (the kernel segments in software).
//!
//! Runs as root in network namespaces of its own, into a device that drops what it is given after
//! the send: the `dummy` device where the kernel has it (the Debian guests of
//! `scripts/vm-test.sh`), else the black hole with carrier (this host; needs `nft`). Software
//! segmentation needs `ethtool`. Prints one `train-rules:` line per fact; with
//! `--expect-segments N` (and `--expect-above-mtu EINVAL|EMSGSIZE`, EINVAL if not given) it also
//! checks every fact and prints `VMTEST: pass ...` or `VMTEST: FAIL ...` per rule, as the guests'
//! checks do, and exits 1 on a failure.
//!
//! ```sh
//! cargo run --release -p zerotx-cli --example train_rules -- \
//!     --expect-segments 128 --expect-above-mtu EMSGSIZE
//! ```
#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use zerotx_testbed::{self as testbed, Segmentation};

/// The device MTU: a NIC's.
const MTU: u32 = 1500;
/// The largest UDP payload over IPv4 at that MTU.
const SEGMENT: usize = 1472;
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A dummy device at `MTU` in the calling thread's namespace (one of ours), offload on or off.
fn dummy(segmentation: Segmentation) -> io::Result<()> {
    ip(&["link", "add", "zc0", "type", "dummy"])?;
    ip(&["addr", "add", "192.0.2.1/24", "dev", "zc0"])?;
    ip(&["link", "set", "zc0", "mtu", &MTU.to_string(), "up"])?;
    if segmentation == Segmentation::Software {
        let out = Command::new("ethtool")
            .args(["-K", "zc0", "tx-udp-segmentation", "off"])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ethtool: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// The errno of a failed call, or 0.
fn errno(r: io::Result<usize>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn errno_name(e: i32) -> String {
    match e {
        0 => "sent".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EMSGSIZE => "EMSGSIZE".into(),
        libc::EIO => "EIO".into(),
        libc::ENOBUFS => "ENOBUFS".into(),
        e => io::Error::from_raw_os_error(e).to_string(),
    }
}

/// A UDP socket connected to the device's far address, its `UDP_SEGMENT` at `segment`.
fn socket(segment: usize) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind("0.0.0.0:0")?;
    s.connect("192.0.2.2:9")?;
    set_int(&s, libc::SOL_UDP, libc::UDP_SEGMENT, segment as i32)?;
    Ok(s)
}

fn set_int(s: &UdpSocket, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: v is a live local of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
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

/// `send(2)` of `len` bytes with `flags`. A zero-copy send's buffer is leaked: the kernel may
/// read it until its completion, and the probe makes two.
fn send(s: &UdpSocket, len: usize, flags: i32) -> io::Result<usize> {
    let buf = vec![0x5a_u8; len];
    // SAFETY: buf is live and len bytes long for the call.
    let r = unsafe { libc::send(s.as_raw_fd(), buf.as_ptr().cast(), len, flags) };
    if flags & libc::MSG_ZEROCOPY != 0 {
        mem::forget(buf);
    }
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Waits up to 2 s for one zero-copy completion: `(ids, copied)`.
fn completion(s: &UdpSocket) -> io::Result<Option<(u32, bool)>> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut control = [0u64; 16];
    loop {
        // SAFETY: msghdr is a plain C struct; all-zeroes is "no name, no iovec".
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = mem::size_of_val(&control);
        // SAFETY: msg points at the live control buffer of the length given.
        let r = unsafe {
            libc::recvmsg(
                s.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            // SAFETY: the kernel filled msg's control buffer; the macros stay within it.
            let cm = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            if cm.is_null() {
                continue;
            }
            // SAFETY: cm is the first header inside the control buffer; its payload is a
            // sock_extended_err for IP_RECVERR (read unaligned: no alignment is promised).
            let ee: libc::sock_extended_err =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast()) };
            if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                let ids = ee.ee_data.wrapping_sub(ee.ee_info).wrapping_add(1);
                return Ok(Some((ids, ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0)));
            }
            continue;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock {
            return Err(e);
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What one device mode showed.
#[derive(Debug, Default)]
struct Facts {
    /// Most segments one call carried (64 B segments), and the errno one more got.
    max_segments: usize,
    over_segments: i32,
    /// Errno of the largest train (65507 B) and of one byte more, 1472 B segments.
    largest: i32,
    over_largest: i32,
    /// Errno of a two-segment train of 1473 B segments at MTU 1500.
    above_mtu: i32,
    /// A zero-copy train of 44 x 1472 B: errno, and its completion `(ids, copied)`.
    zc_train: i32,
    zc_completion: Option<(u32, bool)>,
}

/// Measures every rule in the calling thread's namespace, its device already built.
fn measure(limits: bool) -> io::Result<Facts> {
    let mut f = Facts::default();
    if limits {
        let s = socket(64)?;
        for n in 1..=1024 {
            match errno(send(&s, n * 64, 0)) {
                0 => f.max_segments = n,
                e => {
                    f.over_segments = e;
                    break;
                }
            }
        }
        let s = socket(SEGMENT)?;
        f.largest = errno(send(&s, 65507, 0));
        f.over_largest = errno(send(&s, 65508, 0));
        let s = socket(SEGMENT + 1)?;
        f.above_mtu = errno(send(&s, 2 * (SEGMENT + 1), 0));
    }
    let s = socket(SEGMENT)?;
    set_int(&s, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1)?;
    f.zc_train = errno(send(&s, 44 * SEGMENT, libc::MSG_ZEROCOPY));
    if f.zc_train == 0 {
        f.zc_completion = completion(&s)?;
    }
    Ok(f)
}

/// Builds a device in a namespace of its own and measures there.
fn in_device(segmentation: Segmentation, limits: bool) -> io::Result<(&'static str, Facts)> {
    testbed::in_new_netns(|| -> io::Result<(&'static str, Facts)> {
        if dummy(segmentation).is_ok() {
            return Ok(("dummy", measure(limits)?));
        }
        let _bh = testbed::carrier_black_hole(MTU, segmentation)?;
        Ok(("veth with carrier", measure(limits)?))
    })?
}

fn completion_text(c: Option<(u32, bool)>) -> String {
    match c {
        None => "no completion within 2 s".into(),
        Some((ids, copied)) => {
            format!("{ids} id, {}", if copied { "COPIED" } else { "NOT copied" })
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let expect: Option<usize> = args
        .iter()
        .position(|a| a == "--expect-segments")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("--expect-segments N"));
    let above_mtu: Option<i32> = args
        .iter()
        .position(|a| a == "--expect-above-mtu")
        .and_then(|i| args.get(i + 1))
        .map(|v| match v.as_str() {
            "EINVAL" => libc::EINVAL,
            "EMSGSIZE" => libc::EMSGSIZE,
            other => panic!("--expect-above-mtu {other}: give EINVAL or EMSGSIZE"),
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = kernel.trim();
    let (device, on) = in_device(Segmentation::Offload, true).unwrap_or_else(|e| {
        println!("VMTEST: FAIL train rules: building the device: {e}");
        std::process::exit(1)
    });
    let sw = in_device(Segmentation::Software, false);
    let p = |fact: &str| println!("train-rules: {kernel} {device}: {fact}");
    p(&format!(
        "segments per call: {} (one more: {})",
        on.max_segments,
        errno_name(on.over_segments)
    ));
    p(&format!(
        "largest train, {SEGMENT} B segments: 65507 B {}, 65508 B {}",
        errno_name(on.largest),
        errno_name(on.over_largest)
    ));
    p(&format!(
        "segment above the MTU ({} B at MTU {MTU}): {}",
        SEGMENT + 1,
        errno_name(on.above_mtu)
    ));
    p(&format!(
        "zero-copy train 44 x {SEGMENT} B, offload on: {}, {}",
        errno_name(on.zc_train),
        completion_text(on.zc_completion)
    ));
    match &sw {
        Ok((_, f)) => p(&format!(
            "zero-copy train 44 x {SEGMENT} B, software segmentation: {}, {}",
            errno_name(f.zc_train),
            completion_text(f.zc_completion)
        )),
        Err(e) => p(&format!("software segmentation: not measured: {e}")),
    }
    let Some(expect) = expect else { return };
    let mut failed = false;
    let mut check = |ok: bool, what: String| {
        failed |= !ok;
        println!(
            "VMTEST: {} train rule: {what}",
            if ok { "pass" } else { "FAIL" }
        );
    };
    check(
        on.max_segments == expect && on.over_segments == libc::EINVAL,
        format!(
            "{} segments per call, EINVAL above (measured {}, {})",
            expect,
            on.max_segments,
            errno_name(on.over_segments)
        ),
    );
    check(
        on.largest == 0 && on.over_largest == libc::EMSGSIZE,
        format!(
            "largest train 65507 B, EMSGSIZE above (measured {}, {})",
            errno_name(on.largest),
            errno_name(on.over_largest)
        ),
    );
    let above_mtu = above_mtu.unwrap_or(libc::EINVAL);
    check(
        on.above_mtu == above_mtu,
        format!(
            "segment above the MTU refused with {} (measured {})",
            errno_name(above_mtu),
            errno_name(on.above_mtu)
        ),
    );
    check(
        on.zc_train == 0 && on.zc_completion == Some((1, false)),
        format!(
            "zero-copy train with offload: one id, NOT copied (measured {}, {})",
            errno_name(on.zc_train),
            completion_text(on.zc_completion)
        ),
    );
    let sw = sw.map(|(_, f)| (f.zc_train, f.zc_completion));
    check(
        matches!(sw, Ok((0, Some((1, _))))),
        format!(
            "zero-copy train segmented in software: sent, one id (measured {})",
            match &sw {
                Ok((e, c)) => format!("{}, {}", errno_name(*e), completion_text(*c)),
                Err(e) => e.to_string(),
            }
        ),
    );
    if failed {
        std::process::exit(1);
    }
}
