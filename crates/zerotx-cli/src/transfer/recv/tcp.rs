//! TCP (and vsock) streams: a thread accepts, one thread per connection reads (128 KiB `read`s
//! into one reused buffer, verifying and writing as it goes), and the calling thread owns the
//! [`Meter`]: it starts and ends transfers from those threads' events and prints each interval.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use socket2::{SockAddr, Socket};

use super::meter::Meter;
use super::{banner, HostPort, Opts, TCP_BUF};
use crate::transfer::iperf3;
use crate::transfer::pattern::Window;

/// The most connections one transfer takes (the most `zerotx send --parallel` opens), so the
/// most reading threads at once: past it, a connection is closed at once until the transfer
/// ends.
pub(super) const MAX_STREAMS: usize = 128;

/// What the other threads tell the one that owns the meter.
enum Event {
    /// A new connection.
    Accepted(Socket, SockAddr),
    /// Stream `index` of the current transfer ended at that instant.
    Done(usize, Ending, Instant),
}

/// How a connection ended.
struct Ending {
    /// `None` for an orderly close (EOF), else what happened, for the stream's line.
    note: Option<String>,
    /// The first stream offset that was not the generated stream.
    mismatch: Option<u64>,
    /// Writing `--output` failed (fatal).
    write_error: Option<String>,
    /// The connection opened with an iperf3 client's cookie: closed at once, not data.
    iperf3: bool,
}

/// The transfer in progress.
struct Transfer {
    meter: Meter,
    active: usize,
    /// A stream's bytes go to `--output`: refuse others until the transfer ends.
    writing: bool,
    write_error: Option<String>,
    /// Connections that were iperf3's control protocol.
    iperf3: usize,
}

/// Accepts connections on `listener` and reports each transfer, until one ends with `--once` or
/// a failure (`Err`: verification or `--output`).
pub(super) fn serve(opts: &Opts, listener: Socket, shown: &str) -> anyhow::Result<()> {
    let window = opts.verify.then(|| Window::new(TCP_BUF));
    let (tx, rx) = mpsc::channel();
    let accept_tx = tx.clone();
    thread::Builder::new()
        .name("accept".into())
        .spawn(move || accept_loop(&listener, &accept_tx))
        .context("cannot start the accepting thread")?;
    banner(opts, shown);
    let mut cur: Option<Transfer> = None;
    loop {
        if crate::stdout::closed() {
            // Nobody reads the report: stop. What the reading threads wrote to --output is
            // written (unbuffered); the senders see their connections reset.
            return Ok(());
        }
        let next_tick = cur.as_ref().and_then(|t| t.meter.next_tick());
        let event = match next_tick {
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(t) = &mut cur {
                        t.meter.tick(Instant::now());
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => bail!("the accepting thread ended"),
            },
            None => rx.recv().context("the accepting thread ended")?,
        };
        match event {
            Event::Accepted(sock, peer) => {
                let remote = HostPort::of(&peer);
                if cur.as_ref().is_some_and(|t| t.writing) {
                    eprintln!(
                        "refused connection from {} port {}: --output takes one stream at a time \
                         and one is being written",
                        remote.host, remote.port
                    );
                    drop(sock);
                    continue;
                }
                if cur
                    .as_ref()
                    .is_some_and(|t| t.meter.streams.len() >= MAX_STREAMS)
                {
                    eprintln!(
                        "refused connection from {} port {}: a transfer takes at most \
                         {MAX_STREAMS} connections, and this one has them",
                        remote.host, remote.port
                    );
                    drop(sock);
                    continue;
                }
                let t = match &mut cur {
                    Some(t) => t,
                    None => cur.insert(Transfer {
                        meter: Meter::new(opts, remote.clone()),
                        active: 0,
                        writing: false,
                        write_error: None,
                        iperf3: 0,
                    }),
                };
                let output = match &opts.output {
                    Some(o) => {
                        let path = o.path().display().to_string();
                        let f = o
                            .start()
                            .with_context(|| format!("cannot empty --output {path}"))?;
                        Some((f, path))
                    }
                    None => None,
                };
                t.writing = output.is_some();
                let local = sock
                    .local_addr()
                    .map(|a| HostPort::of(&a))
                    .unwrap_or(HostPort {
                        host: "?".into(),
                        port: 0,
                    });
                let index = t.meter.add_stream(local, remote);
                let bytes = t.meter.streams[index].bytes.clone();
                let id = t.meter.streams[index].id;
                let (window, tx) = (window.clone(), tx.clone());
                t.active += 1;
                thread::Builder::new()
                    .name(format!("recv-{id}"))
                    .spawn(move || {
                        let ending = read_stream(&sock, id, &bytes, window.as_ref(), output);
                        let _ = tx.send(Event::Done(index, ending, Instant::now()));
                    })
                    .context("cannot start a reading thread")?;
            }
            Event::Done(index, mut ending, when) => {
                let Some(t) = &mut cur else { continue };
                if ending.iperf3 {
                    t.iperf3 += 1;
                    if t.active == 1 && t.iperf3 == t.meter.streams.len() {
                        // Nothing but iperf3's control connection: no transfer to report.
                        cur = None;
                        if opts.once {
                            bail!("{}", iperf3::CLIENT);
                        }
                        eprintln!("{}", iperf3::CLIENT);
                        banner(opts, shown);
                        continue;
                    }
                    eprintln!("{}", iperf3::CLIENT);
                    ending.note = Some("iperf3's control protocol, closed".into());
                }
                let at = t.meter.offset(when);
                let s = &mut t.meter.streams[index];
                s.end = Some(at);
                s.note = ending.note;
                s.mismatch = ending.mismatch;
                if ending.write_error.is_some() {
                    t.write_error = ending.write_error;
                }
                t.active -= 1;
                if t.active > 0 {
                    continue;
                }
                let t = cur.take().expect("a transfer is in progress");
                let verdict = t.meter.finish(at);
                if let Some(e) = t.write_error {
                    bail!("{e}");
                }
                if let Some((id, offset)) = verdict.mismatch {
                    bail!(
                        "verification failed: [{id:>3}] differs from the generated stream at \
                         stream offset {offset} (was the sender zerotx send without --file?)"
                    );
                }
                if let Some((id, why)) = verdict.cut_short {
                    bail!(
                        "verification failed: [{id:>3}] was cut short ({why}): the sender \
                         stopped before the end of its stream"
                    );
                }
                if opts.once {
                    return Ok(());
                }
                banner(opts, shown);
            }
        }
    }
}

fn accept_loop(listener: &Socket, tx: &Sender<Event>) {
    loop {
        match listener.accept() {
            Ok((sock, peer)) => {
                if tx.send(Event::Accepted(sock, peer)).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                // Out of descriptors or memory: say so and try again shortly.
                eprintln!("accept failed: {e}; retrying in 1 s");
                thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Reads one connection to its end: counts into `bytes`, checks against `window` (until the
/// first wrong byte) and writes to `output`.
fn read_stream(
    sock: &Socket,
    id: u32,
    bytes: &AtomicU64,
    window: Option<&Window>,
    mut output: Option<(File, String)>,
) -> Ending {
    let mut buf = vec![0u8; TCP_BUF];
    let mut total = 0u64;
    let mut ending = Ending {
        note: None,
        mismatch: None,
        write_error: None,
        iperf3: false,
    };
    loop {
        let n = match (&*sock).read(&mut buf) {
            Ok(0) => return ending,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                ending.note = Some(match e.kind() {
                    io::ErrorKind::ConnectionReset => {
                        format!("connection reset after {total} bytes")
                    }
                    _ => format!("read failed after {total} bytes: {e}"),
                });
                eprintln!("[{id:>3}] {}", ending.note.as_deref().unwrap_or_default());
                return ending;
            }
        };
        let data = &buf[..n];
        if total == 0 && iperf3::is_client_cookie(data) {
            // Neither verified nor written: closing tells the client at once.
            ending.iperf3 = true;
            return ending;
        }
        if let (Some(w), None) = (window, ending.mismatch) {
            if let Some(at) = w.mismatch(total, data) {
                let got = data[(at - total) as usize];
                let want = w.at(at, 1)[0];
                eprintln!(
                    "[{id:>3}] verify: wrong byte at stream offset {at} (expected {want:#04x}, got \
                     {got:#04x}); reading on, the transfer will fail"
                );
                ending.mismatch = Some(at);
            }
        }
        if let Some((f, path)) = &mut output {
            if let Err(e) = f.write_all(data) {
                ending.write_error = Some(format!(
                    "cannot write --output {path} after {total} bytes: {e}"
                ));
                ending.note = Some(format!("closed: writing {path} failed"));
                return ending;
            }
        }
        total += n as u64;
        bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
}
