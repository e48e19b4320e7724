//! Sends 256 MiB over TCP loopback with every engine, from a pool of page-aligned buffers that are
//! reused the moment the kernel releases them, and prints what the kernel did with them.
//!
//! ```sh
//! cargo run --release -p zerotx --example quickstart
//! ```
//!
//! Loopback always copies (the kernel copies on local delivery, and says so): expect the
//! zero-copy engines to report every buffer as copied here. Point a sender at a peer behind a real
//! device to see zero-copy releases.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use zerotx::{BufPool, EngineKind, SendPath, Sender};

const TOTAL: usize = 256 << 20;
const BLOCK: usize = 256 << 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for &kind in EngineKind::ALL {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let sink = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0;
            while let Ok(k) = s.read(&mut buf) {
                if k == 0 {
                    break;
                }
                n += k;
            }
            n
        });
        let mut tx = match Sender::new(TcpStream::connect(addr)?, kind) {
            Ok(tx) => tx,
            Err(e) => {
                println!("{kind:>8}: unavailable: {e}");
                continue;
            }
        };
        let pool = BufPool::new(BLOCK, 32)?;
        let mut free: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
        let mut done = Vec::new();
        let (mut sent, mut zerocopy, mut copied) = (0, 0, 0);
        let start = Instant::now();
        while sent < TOTAL || tx.outstanding() > 0 {
            match free.pop() {
                Some(mut b) if sent < TOTAL => {
                    b[..8].copy_from_slice(&(sent as u64).to_le_bytes());
                    tx.send(b.freeze(BLOCK)).map_err(std::io::Error::from)?;
                    sent += BLOCK;
                }
                other => {
                    free.extend(other);
                    tx.wait_released(&mut done, Some(Duration::from_secs(10)))?;
                }
            }
            for r in done.drain(..) {
                if let Some(e) = r.report.error {
                    return Err(format!("{kind}: a send failed: {e}").into());
                }
                match r.report.path {
                    SendPath::ZeroCopy => zerocopy += 1,
                    SendPath::Copied(_) => copied += 1,
                }
                free.push(r.buf.into_mut()); // the kernel is done: reuse it
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let closed = tx.close(Duration::from_secs(5));
        if closed.kept > 0 {
            return Err(format!("{kind}: {} buffers still held by the kernel", closed.kept).into());
        }
        let received = sink.join().expect("sink");
        println!(
            "{kind:>8}: {:.0} MB/s, {received} bytes received, {zerocopy} buffers sent zero-copy, \
             {copied} copied",
            TOTAL as f64 / secs / 1e6
        );
    }
    Ok(())
}
