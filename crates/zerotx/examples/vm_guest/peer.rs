//! Receiving peers: a TCP or vsock connection whose accepted side runs on a thread, optionally
//! slow (small receive buffer, a pause between reads) and verifying every byte.

use std::io::{self, Read};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};

const VMADDR_CID_ANY: u32 = u32::MAX;
/// `VMADDR_CID_LOCAL`: the `vsock_loopback` transport.
pub const VMADDR_CID_LOCAL: u32 = 1;
/// `SO_VM_SOCKETS_BUFFER_SIZE` at level `AF_VSOCK`: the receive buffer a peer offers as credit.
const SO_VM_SOCKETS_BUFFER_SIZE: libc::c_int = 0;

/// Bytes the latest reader has read so far (for the watchdog's message).
pub static READ: AtomicU64 = AtomicU64::new(0);

/// Every vsock check listens on its own port, so a check that hung and still holds its listener
/// cannot disturb the next one.
static NEXT_PORT: AtomicU32 = AtomicU32::new(5201);

/// A fresh vsock port.
pub fn vsock_port() -> u32 {
    NEXT_PORT.fetch_add(1, Ordering::Relaxed)
}

pub use crate::wire::{fill, pattern};

/// How the receiving side behaves.
#[derive(Clone, Copy, Default)]
pub struct Peer {
    /// Check every byte against [`pattern`].
    pub verify: bool,
    /// Sleep this long after each read (a slow reader keeps the sender's buffer full).
    pub pause: Duration,
    /// Receive buffer (`SO_RCVBUF` on TCP, `SO_VM_SOCKETS_BUFFER_SIZE` on vsock), if set.
    pub rcvbuf: Option<usize>,
    /// Bytes per read (default 64 KiB).
    pub chunk: usize,
}

/// What a receiving thread saw.
#[derive(Debug, Default)]
pub struct Received {
    pub bytes: u64,
    pub mismatches: u64,
    pub first_mismatch: Option<(u64, u8)>,
    pub error: Option<String>,
}

impl Received {
    /// `Ok` if exactly `want` bytes arrived, all as the pattern says.
    pub fn check(&self, want: u64) -> Result<(), String> {
        if let Some(e) = &self.error {
            return Err(format!("reader failed after {} bytes: {e}", self.bytes));
        }
        if self.bytes != want {
            return Err(format!("reader got {} bytes, sent {want}", self.bytes));
        }
        if let Some((at, got)) = self.first_mismatch {
            return Err(format!(
                "{} wrong bytes; first at offset {at}: {got:#04x}, expected {:#04x}",
                self.mismatches,
                pattern(at)
            ));
        }
        Ok(())
    }
}

/// A connected TCP client on the guest's loopback; the accepted side runs `peer`.
pub fn tcp_pair(peer: Peer) -> io::Result<(TcpStream, JoinHandle<Received>)> {
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    if let Some(n) = peer.rcvbuf {
        // On the listener, so the accepted socket starts with it and the window is scaled for it.
        listener.set_recv_buffer_size(n)?;
    }
    listener.bind(&SockAddr::from(std::net::SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        0,
    ))))?;
    listener.listen(1)?;
    let listener = TcpListener::from(listener);
    let addr = listener.local_addr()?;
    let reader = std::thread::spawn(move || match listener.accept() {
        Ok((s, _)) => receive(s, peer),
        Err(e) => Received {
            error: Some(format!("accept: {e}")),
            ..Received::default()
        },
    });
    Ok((TcpStream::connect(addr)?, reader))
}

/// A vsock stream connected over `vsock_loopback` (CID 1); the accepted side runs `peer`.
pub fn vsock_pair(peer: Peer) -> io::Result<(Socket, JoinHandle<Received>)> {
    let port = vsock_port();
    let listener = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
    if let Some(n) = peer.rcvbuf {
        // Inherited by the accepted socket, which offers it to the sender as credit.
        set_vsock_buffer(&listener, n as u64)?;
    }
    listener.bind(&SockAddr::vsock(VMADDR_CID_ANY, port))?;
    listener.listen(1)?;
    let reader = std::thread::spawn(move || match listener.accept() {
        Ok((s, _)) => receive(std::fs::File::from(OwnedFd::from(s)), peer),
        Err(e) => Received {
            error: Some(format!("accept: {e}")),
            ..Received::default()
        },
    });
    let sock = Socket::new(Domain::VSOCK, Type::STREAM, None)?;
    sock.connect(&SockAddr::vsock(VMADDR_CID_LOCAL, port))?;
    Ok((sock, reader))
}

/// `setsockopt(AF_VSOCK, SO_VM_SOCKETS_BUFFER_SIZE)`.
fn set_vsock_buffer(sock: &Socket, bytes: u64) -> io::Result<()> {
    // SAFETY: the option value is a live u64 of the size passed; the fd is open (borrowed from
    // `sock` for the call).
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::AF_VSOCK,
            SO_VM_SOCKETS_BUFFER_SIZE,
            (&bytes as *const u64).cast(),
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn receive(mut s: impl Read, peer: Peer) -> Received {
    let mut r = Received::default();
    let mut buf = vec![0u8; if peer.chunk == 0 { 1 << 16 } else { peer.chunk }];
    READ.store(0, Ordering::Relaxed);
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                READ.store(r.bytes | 1 << 63, Ordering::Relaxed);
                return r;
            }
            Ok(n) => {
                if peer.verify {
                    for (i, &b) in buf[..n].iter().enumerate() {
                        let o = r.bytes + i as u64;
                        if b != pattern(o) {
                            r.mismatches += 1;
                            r.first_mismatch.get_or_insert((o, b));
                        }
                    }
                }
                r.bytes += n as u64;
                READ.store(r.bytes, Ordering::Relaxed);
                if !peer.pause.is_zero() {
                    std::thread::sleep(peer.pause);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                r.error = Some(e.to_string());
                return r;
            }
        }
    }
}
