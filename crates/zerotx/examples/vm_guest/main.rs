//! Runs inside a QEMU guest booted by `scripts/vm-test.sh` (Debian's 6.1 and 6.12 cloud kernels,
//! with the `vsock_loopback` and `dummy` modules this host kernel lacks). Checks, on a real kernel:
//! - vsock over the loopback transport (CID 1): `msg-zc` refused with [`zerotx::Error::Unsupported`]
//!   where the kernel has no vsock zero-copy (before 6.7) and `probe()` saying so; from 6.7 every
//!   buffer back and the stream intact, also after a send larger than the peer's credit; the
//!   `copy` engine everywhere;
//! - UDP into a `dummy` device: `msg-zc` and `uring-zc` (also from a registered pool) complete
//!   NOT copied;
//! - every io_uring engine over TCP, the dummy device and vsock either works or is refused with
//!   `Error::Unsupported`;
//! - integrity with immediate overwrite on every engine over TCP (and the engines vsock takes
//!   over vsock): a slow verifying reader, a small pool scribbled with 0xEE the moment a buffer
//!   comes back.
//!
//! Each check runs on its own thread under a deadline: a hang becomes a `VMTEST: FAIL ...
//! (timed out ...)` line, not a QEMU timeout. One `VMTEST: pass|FAIL <check>: ...` line per check,
//! then `VMTEST: ok` only if all passed (the script greps). Where vsock has zero-copy, raw
//! measurements of its ids follow as `VMTEST: measure ...` lines (facts, not checks).
//! Functional results only: figures from a TCG guest mean nothing.
//!
//! Not useful on a host: it expects to be PID 1's only job in a throwaway guest (it changes
//! `net.core.optmem_max` while measuring).

mod checks;
mod measure;
mod peer;

use std::any::Any;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use checks::{Transport, Variant};
use zerotx::EngineKind;

/// A check that should take a second or two.
const SHORT: Duration = Duration::from_secs(20);
/// The integrity checks (a slow reader on purpose).
const LONG: Duration = Duration::from_secs(40);

fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs `f` on its own thread and waits up to `deadline`. A thread still running at the deadline
/// is left behind (it cannot be stopped); later checks use their own sockets and ports.
fn within<T: Send + 'static>(
    name: &str,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.chars().take(15).collect())
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(f)));
        })
        .map_err(|e| format!("spawning the check's thread: {e}"))?;
    match rx.recv_timeout(deadline) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(p)) => Err(format!("panicked: {}", panic_message(&*p))),
        Err(RecvTimeoutError::Timeout) => {
            Err(format!("(timed out after {} s)", deadline.as_secs()))
        }
        Err(RecvTimeoutError::Disconnected) => Err("the check's thread vanished".into()),
    }
}

#[derive(Default)]
struct Run {
    passed: usize,
    failed: usize,
}

impl Run {
    fn check(
        &mut self,
        name: &str,
        deadline: Duration,
        f: impl FnOnce() -> Result<String, String> + Send + 'static,
    ) {
        match within(name, deadline, f).and_then(|r| r) {
            Ok(line) => {
                self.passed += 1;
                println!("VMTEST: pass {name}: {line}");
            }
            Err(e) => {
                self.failed += 1;
                println!("VMTEST: FAIL {name}: {e}");
            }
        }
        let _ = std::io::stdout().flush();
    }
}

fn main() {
    println!("VMTEST: kernel {}", zerotx::probe::kernel_release());
    let vsock_zc = checks::vsock_zerocopy_expected();
    let mut run = Run::default();

    run.check("probe vsock", SHORT, checks::probe_vsock);
    run.check("vsock msg-zc", SHORT, checks::vsock_msg_zc);
    run.check("vsock copy", SHORT, || {
        checks::vsock_stream(EngineKind::Copy)
    });

    let dummy = [
        Variant::plain(EngineKind::Auto),
        Variant::AUTO_POOL,
        Variant::plain(EngineKind::MsgZerocopy),
        Variant::plain(EngineKind::UringZc),
        Variant::ZC_POOL,
    ];
    for v in dummy {
        run.check(&format!("dummy {v}"), SHORT, move || checks::dummy(v));
    }

    for t in [Transport::Tcp, Transport::Dummy, Transport::Vsock] {
        for v in Variant::URING {
            run.check(&format!("uring {v} {t}"), SHORT, move || {
                checks::uring_engine(t, v)
            });
        }
    }

    for v in Variant::ALL {
        run.check(&format!("integrity {v} tcp"), LONG, move || {
            checks::integrity(Transport::Tcp, v)
        });
    }
    // The engines vsock takes: uring-zc needs TCP or UDP (the library refuses it, checked above).
    let mut vsock = vec![
        Variant::plain(EngineKind::Auto),
        Variant::plain(EngineKind::Copy),
        Variant::plain(EngineKind::Uring),
    ];
    if vsock_zc {
        vsock.insert(2, Variant::plain(EngineKind::MsgZerocopy));
    }
    for v in vsock {
        run.check(&format!("integrity {v} vsock"), LONG, move || {
            checks::integrity(Transport::Vsock, v)
        });
    }

    if vsock_zc {
        match within("measure", LONG, measure::vsock_ids).and_then(|r| r) {
            Ok(lines) => lines.iter().for_each(|l| println!("VMTEST: measure {l}")),
            Err(e) => println!("VMTEST: measure vsock ids: not measured: {e}"),
        }
    }

    println!("VMTEST: {} passed, {} failed", run.passed, run.failed);
    if run.failed == 0 {
        println!("VMTEST: ok");
    }
    let _ = std::io::stdout().flush();
    // Threads of checks that timed out may still be blocked: do not wait for them.
    std::process::exit(0);
}
