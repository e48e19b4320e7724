//! `liburing-zc-fixed`: liburing's own `examples/send-zerocopy.c` (vendored in
//! `benches/liburing/`, built by `scripts/compare-raw.sh`), run as a child inside the topology,
//! sending UDP with zero-copy (`-z 1`) from its registered buffer (`-b 1`), and read back from
//! the line it prints.
//!
//! What the example does differs from the harness, and the column should be read with that in
//! mind: it sends one hot buffer over and over (never waiting for its notification before
//! reusing it, which is fine for data nobody checks), keeps `-n 8` requests per submit, uses a
//! registered ring fd and file, and times itself from its first submit to its last send CQE
//! (notifications still in flight are not waited for). Its `-t` takes whole seconds (and adds
//! 0.2 s): the run lasts the harness duration rounded up. CPU is the child's, from
//! `getrusage(RUSAGE_CHILDREN)`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use zerotx_testbed as testbed;

use super::result::Run;

/// The figures of the example's last line:
/// `packets=N (MB=M), rps=R (MB/s=X)`: datagrams sent, and datagrams per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Datagrams sent.
    pub packets: u64,
    /// Datagrams per second (over its own timing, truncated to an integer).
    pub rps: u64,
}

/// Reads the example's output.
pub fn parse(stdout: &str) -> anyhow::Result<Figures> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("packets="))
        .with_context(|| format!("no `packets=` line in its output: {:?}", stdout.trim()))?;
    let field = |key: &str| -> anyhow::Result<u64> {
        let start = line
            .find(key)
            .with_context(|| format!("no {key} in {line:?}"))?
            + key.len();
        let digits: String = line[start..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits
            .parse()
            .with_context(|| format!("{key} is not a number in {line:?}"))
    };
    Ok(Figures {
        packets: field("packets=")?,
        rps: field("rps=")?,
    })
}

/// The example's arguments for a run to `target` of `size`-byte datagrams for `duration`.
pub fn args(
    target: SocketAddr,
    size: usize,
    duration: Duration,
    cpu: Option<usize>,
) -> Vec<String> {
    let secs = duration.as_secs_f64().ceil().max(1.0) as u64;
    let mut a: Vec<String> = vec![
        if target.is_ipv4() { "-4" } else { "-6" }.into(),
        "-D".into(),
        target.ip().to_string(),
        "-p".into(),
        target.port().to_string(),
        "-s".into(),
        size.to_string(),
        "-t".into(),
        secs.to_string(),
        "-z".into(),
        "1".into(),
        "-b".into(),
        "1".into(),
    ];
    if let Some(cpu) = cpu {
        a.extend(["-C".into(), cpu.to_string()]);
    }
    a.push("udp".into());
    a
}

/// Runs the example at `path` once and reads its throughput.
pub fn run(
    path: &Path,
    target: SocketAddr,
    size: usize,
    duration: Duration,
    cpu: Option<usize>,
) -> anyhow::Result<Run> {
    let cpu0 = testbed::children_cpu_time();
    let out = Command::new(path)
        .args(args(target, size, duration, cpu))
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    let cpu_seconds = (testbed::children_cpu_time() - cpu0).as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let f = parse(&stdout).with_context(|| format!("reading {}", path.display()))?;
    if f.rps == 0 {
        bail!("{} sent nothing: {}", path.display(), stdout.trim());
    }
    Ok(Run {
        bytes: f.packets * size as u64,
        sends: f.packets,
        seconds: f.packets as f64 / f.rps as f64,
        cpu_seconds,
        ..Run::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_examples_summary_line() {
        let out = "packets=550400 (MB=34118), rps=458666 (MB/s=28431)\n";
        assert_eq!(
            parse(out).unwrap(),
            Figures {
                packets: 550400,
                rps: 458666
            }
        );
        let e = parse("The run is too short, can't gather stats\n").unwrap_err();
        assert!(e.to_string().contains("no `packets=` line"), "{e}");
    }

    #[test]
    fn asks_for_zero_copy_fixed_buffers_udp_and_whole_seconds() {
        let a = args(
            "192.0.2.2:9".parse().unwrap(),
            65000,
            Duration::from_millis(600),
            Some(0),
        );
        assert_eq!(
            a.join(" "),
            "-4 -D 192.0.2.2 -p 9 -s 65000 -t 1 -z 1 -b 1 -C 0 udp"
        );
        let a = args(
            "[2001:db8::2]:9".parse().unwrap(),
            1472,
            Duration::from_millis(1500),
            None,
        );
        assert!(a.join(" ").starts_with("-6 -D 2001:db8::2"));
        assert!(a.join(" ").contains("-t 2 "));
    }
}
