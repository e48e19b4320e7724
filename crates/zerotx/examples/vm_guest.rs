//! Runs inside a QEMU guest booted by `scripts/vm-test.sh` (a Debian 6.12 kernel with the
//! `vsock_loopback` and `dummy` modules this host kernel lacks). Checks, on a real kernel:
//! - AF_VSOCK zero-copy over the loopback transport (CID 1): every buffer comes back, the stream
//!   is intact, and a lone send too large for the peer's credit (which the kernel sends by copy
//!   under several ids in one call) is absorbed by the ledger's resynchronisation;
//! - UDP into a `dummy` device: `msg-zc` and `uring-zc` completions are true zero-copy.
//!
//! Prints `VMTEST: ok` on success; any failure prints `VMTEST: FAIL ...` (the script greps).
//! Not useful on a host: it expects to be PID 1's only job in a throwaway guest.

use std::io::Read;
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};
use zerotx::{EngineKind, Path, Sender};

const PORT: u32 = 5201;
const VMADDR_CID_ANY: u32 = u32::MAX;
const VMADDR_CID_LOCAL: u32 = 1;

fn pattern(o: u64) -> u8 {
    (o.wrapping_mul(0x9E37_79B9) >> 7) as u8
}

fn vsock_engine(kind: EngineKind) -> Result<String, String> {
    let listener = Socket::new(Domain::VSOCK, Type::STREAM, None).map_err(|e| e.to_string())?;
    listener
        .bind(&SockAddr::vsock(VMADDR_CID_ANY, PORT))
        .map_err(|e| format!("bind: {e}"))?;
    listener.listen(1).map_err(|e| e.to_string())?;
    let reader = std::thread::spawn(move || -> Result<(u64, u64), String> {
        let (s, _) = listener.accept().map_err(|e| e.to_string())?;
        let mut s: std::net::TcpStream = std::net::TcpStream::from(std::os::fd::OwnedFd::from(s));
        let (mut at, mut bad) = (0u64, 0u64);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                return Ok((at, bad));
            }
            for &b in &buf[..n] {
                bad += u64::from(b != pattern(at));
                at += 1;
            }
        }
    });
    let sock = Socket::new(Domain::VSOCK, Type::STREAM, None).map_err(|e| e.to_string())?;
    sock.connect(&SockAddr::vsock(VMADDR_CID_LOCAL, PORT))
        .map_err(|e| format!("connect: {e}"))?;
    let mut tx = Sender::new(sock, kind).map_err(|e| e.to_string())?;
    let mut offset = 0u64;
    let mut out = Vec::new();
    let mut send = |tx: &mut Sender<Vec<u8>>, len: usize| -> Result<(), String> {
        let buf: Vec<u8> = (0..len as u64).map(|i| pattern(offset + i)).collect();
        offset += len as u64;
        tx.send(buf).map_err(|e| e.to_string())
    };
    // Sends within the peer's credit: one id each.
    for _ in 0..64 {
        send(&mut tx, 16 * 1024)?;
    }
    tx.flush(Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    // One send larger than the peer's credit, alone in flight: the kernel may give it several
    // ids; then more sends, which must still be matched to the right completions.
    send(&mut tx, 1 << 20)?;
    tx.flush(Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    for _ in 0..16 {
        send(&mut tx, 4096)?;
    }
    tx.flush(Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    tx.reap(&mut out).map_err(|e| e.to_string())?;
    let stats = tx.stats();
    let closed = tx.close(Duration::from_secs(5));
    out.extend(closed.released);
    drop(closed.fd);
    let (bytes, bad) = reader.join().map_err(|_| "reader panicked")??;
    let zc = out.iter().filter(|r| r.report.path.is_zerocopy()).count();
    let line = format!(
        "vsock {kind}: {} buffers back, {zc} zero-copy, {bytes} bytes, {bad} bad, stats {stats:?}",
        out.len()
    );
    if out.len() != 81 || bytes != offset || bad != 0 || stats.bad_completions != 0 {
        return Err(line);
    }
    if kind == EngineKind::MsgZerocopy && zc == 0 {
        return Err(format!("no zero-copy completion at all: {line}"));
    }
    Ok(line)
}

fn dummy_engine(kind: EngineKind) -> Result<String, String> {
    let dest = "192.0.2.2:9".parse().expect("literal");
    let mut tx = Sender::connect_udp(dest, kind).map_err(|e| e.to_string())?;
    for _ in 0..200 {
        tx.send(vec![0x42u8; 65000]).map_err(|e| e.to_string())?;
    }
    tx.flush(Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tx.reap(&mut out).map_err(|e| e.to_string())?;
    let zc = out
        .iter()
        .filter(|r| r.report.path == Path::ZeroCopy)
        .count();
    let line = format!("dummy {kind}: {} back, {zc} zero-copy", out.len());
    if out.len() != 200 || zc != 200 {
        return Err(line);
    }
    Ok(line)
}

type Check = fn(EngineKind) -> Result<String, String>;

fn main() {
    std::panic::set_hook(Box::new(|p| println!("VMTEST: FAIL panic: {p}")));
    println!("VMTEST: kernel {}", zerotx::probe::kernel_release());
    let mut failed = false;
    let checks: [(&str, Check, EngineKind); 4] = [
        ("vsock", vsock_engine, EngineKind::MsgZerocopy),
        ("vsock", vsock_engine, EngineKind::Copy),
        ("dummy", dummy_engine, EngineKind::MsgZerocopy),
        ("dummy", dummy_engine, EngineKind::UringZc),
    ];
    for (name, check, kind) in checks {
        match check(kind) {
            Ok(line) => println!("VMTEST: pass {line}"),
            Err(e) => {
                failed = true;
                println!("VMTEST: FAIL {name} {kind}: {e}");
            }
        }
    }
    if !failed {
        println!("VMTEST: ok");
    }
}
