//! `zerotx send`: generated data or a file to a receiver, iperf3-style, through the engines.
//!
//! `plan` checks the flags and opens the connections, `stream` runs each stream on its own
//! thread, `output` prints the interval lines, the totals and the JSON document. The main thread
//! only watches the streams' counters.

mod output;
mod plan;
mod stream;
mod tcp_info;
mod train;

use std::fs::File;
use std::io::IsTerminal;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;

use crate::options::SendArgs;
use crate::transfer::pattern::Window;
use plan::{Plan, Source, Via};
use stream::{Body, Control, Counters, Job};

/// How often the main thread looks at the counters (progress bar, interval boundaries).
const TICK: Duration = Duration::from_millis(100);

/// Runs `zerotx send`.
pub fn run(args: SendArgs) -> anyhow::Result<()> {
    let plan = Plan::check(args)?;
    let conns = plan.connect()?;
    let mut out = output::Output::new(&plan, &conns);
    let counters: Vec<Arc<Counters>> = conns.iter().map(|_| Arc::default()).collect();
    let abort = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    // A first Ctrl-C (or SIGTERM) ends every stream as its deadline would, so the totals print;
    // a second one exits at once.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, interrupted.clone())
            .context("installing the Ctrl-C handler")?;
        signal_hook::flag::register(sig, interrupted.clone())
            .context("installing the Ctrl-C handler")?;
    }
    let cpu0 = zerotx_testbed::process_cpu_split();
    let start = Instant::now();
    let deadline = plan.time.map(|t| start + t);
    let window = match plan.source {
        Source::Generated { .. } => Some(Window::new(plan.size * plan.train)),
        Source::File { .. } => None,
    };
    let n = conns.len() as u64;
    let mut jobs = Vec::new();
    for (i, conn) in conns.into_iter().enumerate() {
        let (body, bytes) = match &plan.source {
            Source::Generated { bytes } => (
                Body::Window(window.clone().expect("a window for generated data")),
                bytes.map(|b| b / n + u64::from((i as u64) < b % n)),
            ),
            Source::File {
                path,
                file,
                len,
                via,
            } => {
                let file = file
                    .try_clone()
                    .with_context(|| format!("dup(2) of --file {}", path.display()))?;
                let (body, len) = match via {
                    Via::Mmap => {
                        // The length is the mapping's: the stream never reads past it.
                        let map = map_file(&file, path, *len)?;
                        let len = map.len() as u64;
                        (Body::Mapped(map), len)
                    }
                    Via::Sendfile => {
                        let (f2, p2, l2) = (file.try_clone()?, path.clone(), *len);
                        let map = Box::new(move || map_file(&f2, &p2, l2));
                        (
                            Body::Sendfile {
                                file,
                                len: *len,
                                map,
                            },
                            *len,
                        )
                    }
                };
                // A file goes once, unless --time repeats it.
                (body, plan.time.is_none().then_some(len))
            }
        };
        jobs.push(Job {
            conn,
            engine: plan.engine,
            size: plan.size,
            train: plan.train,
            body,
            ctl: Control {
                bytes,
                deadline,
                rate: plan.rate.map(|r| r / n as f64),
                linger: plan.linger,
                counters: counters[i].clone(),
                abort: abort.clone(),
                interrupted: interrupted.clone(),
                start,
            },
        });
    }
    let total = match &plan.source {
        Source::Generated { bytes: Some(b) } => output::Goal::Bytes(*b),
        Source::File { len, .. } if plan.time.is_none() => output::Goal::Bytes(*len),
        _ => output::Goal::Time(plan.time.unwrap_or_default()),
    };
    let bar = (!plan.json && std::io::stderr().is_terminal()).then(|| output::bar(total));
    let ends = std::thread::scope(|s| {
        let handles: Vec<_> = jobs.into_iter().map(|j| s.spawn(move || j.run())).collect();
        let mut next = plan.interval.map(|i| start + i);
        while !handles.iter().all(|h| h.is_finished()) {
            let now = Instant::now();
            let wake = next.map_or(now + TICK, |t| t.min(now + TICK));
            std::thread::sleep(wake.saturating_duration_since(now));
            let now = Instant::now();
            if crate::stdout::closed() {
                // Nobody reads the lines any more (`zerotx send ... | head`): every stream
                // ends in order, as at its deadline.
                interrupted.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(b) = &bar {
                output::tick(b, total, &counters, now - start);
            }
            if let (Some(t), Some(i)) = (next, plan.interval) {
                if now >= t {
                    out.interval(&counters, now - start, bar.as_ref());
                    next = Some(t + i);
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("a stream thread panicked"))
            .collect::<Vec<_>>()
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if plan.interval.is_some() {
        out.last_interval(start, &ends);
    }
    let mut ends = ends;
    if let Source::File {
        path, file, len, ..
    } = &plan.source
    {
        if let Err(e) = same_size(file, path, *len, "while it was sent") {
            // The change is the cause; what the stream saw (EFAULT past a truncation) follows.
            let first = &mut ends[0];
            first.error = Some(match first.error.take() {
                Some(seen) => anyhow::anyhow!("{e} (the stream: {seen:#})"),
                None => e,
            });
        }
    }
    let cpu1 = zerotx_testbed::process_cpu_split();
    let cpu = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    let result = out.finish(start, &ends, cpu);
    if interrupted.load(std::sync::atomic::Ordering::Relaxed) && !crate::stdout::closed() {
        return result.and(Err(anyhow::anyhow!(
            "interrupted: the totals above cover what was sent until then"
        )));
    }
    result
}

/// Fails when `file` is no longer `len` bytes long: it changed size `when`.
fn same_size(file: &File, path: &std::path::Path, len: u64, when: &str) -> anyhow::Result<()> {
    let now = file
        .metadata()
        .with_context(|| format!("cannot stat --file {}", path.display()))?
        .len();
    if now != len {
        anyhow::bail!(
            "--file {} changed size {when} ({len} bytes when opened, {now} now): something is \
             writing it; send it when nothing is",
            path.display()
        );
    }
    Ok(())
}

/// The file mapped read-only, as one [`Bytes`] to slice sends from (empty for an empty file).
/// Fails when the file is no longer the `len` bytes it had when opened (the mapping would be
/// shorter or longer than the transfer announced).
#[allow(unsafe_code)]
fn map_file(file: &File, path: &std::path::Path, len: u64) -> anyhow::Result<Bytes> {
    same_size(file, path, len, "before it was mapped")?;
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: `Mmap::map` is unsafe because another process may change or truncate the file
    // while it is mapped, and Rust code reading the map would see the change (or fault). This
    // program never reads the mapped bytes: only the kernel does, when it sends them. A change
    // then changes what is sent, and a truncation fails the send (EFAULT) or is found when the
    // transfer ends (`same_size`): the caller's problem, as `zerotx send --help` says.
    let map = unsafe { memmap2::Mmap::map(file) }
        .with_context(|| format!("cannot map --file {} into memory", path.display()))?;
    if map.len() as u64 != len {
        anyhow::bail!(
            "--file {} changed size before it was mapped ({len} bytes when opened, {} mapped): \
             something is writing it; send it when nothing is",
            path.display(),
            map.len()
        );
    }
    let _ = map.advise(memmap2::Advice::Sequential);
    Ok(Bytes::from_owner(map))
}
