//! From command-line flags to checked [`Options`]: every bad value gets an error naming it.

use std::time::Duration;

use anyhow::{bail, Context};

use super::runner::BenchEngine;
use super::{Format, Options, TopologyKind};
use crate::cli::BenchArgs;

/// `1400`, `4K`, `64k`, `1M`, `16KiB` -> bytes.
pub fn parse_size(s: &str) -> anyhow::Result<usize> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .trim_end_matches("ib")
        .trim_end_matches('b')
        .to_string();
    let (digits, mult) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1024),
        Some('m') => (&body[..body.len() - 1], 1 << 20),
        _ => (&body[..], 1),
    };
    let n: usize = digits.parse().ok().filter(|&n| n > 0).with_context(|| {
        format!("invalid size {t:?}: give bytes with an optional K or M suffix (1400, 4K, 1M)")
    })?;
    Ok(n * mult)
}

fn parse_vsock(s: &str) -> anyhow::Result<TopologyKind> {
    let (cid, port) = s
        .split_once(':')
        .with_context(|| format!("invalid --vsock {s:?}: expected CID:PORT, e.g. 3:5201"))?;
    let num = |v: &str, what: &str| {
        v.parse::<u32>()
            .with_context(|| format!("invalid --vsock {s:?}: {what} {v:?} is not a number"))
    };
    Ok(TopologyKind::Vsock {
        cid: num(cid, "CID")?,
        port: num(port, "port")?,
    })
}

impl BenchArgs {
    /// Checks every flag.
    pub fn check(self) -> anyhow::Result<Options> {
        let (def_run, def_repeat) = if self.quick { (0.15, 2) } else { (0.6, 3) };
        let secs = self.duration.unwrap_or(def_run);
        if !(secs > 0.0 && secs <= 600.0) {
            bail!("invalid --duration {secs}: give seconds per run, above 0 and at most 600");
        }
        let repeat = self.repeat.unwrap_or(def_repeat);
        if !(1..=100).contains(&repeat) {
            bail!("invalid --repeat {repeat}: give 1 to 100 repetitions");
        }
        let sizes = self
            .sizes
            .map(|v| {
                v.iter()
                    .map(|s| parse_size(s))
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .transpose()?
            .map(|mut v| {
                v.sort_unstable();
                v.dedup();
                v
            });
        let engines = match self.engines {
            None => BenchEngine::ALL.to_vec(),
            Some(v) => v
                .iter()
                .map(|e| e.trim().parse::<BenchEngine>().map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<Vec<_>>>()?,
        };
        if engines.is_empty() {
            bail!("--engines is empty: name at least one engine");
        }
        let mut topologies = match self.topology {
            None => vec![TopologyKind::TcpLoopback, TopologyKind::UdpBlackhole],
            Some(v) => v
                .iter()
                .map(|t| match t.trim() {
                    "tcp-loopback" => Ok(TopologyKind::TcpLoopback),
                    "udp-blackhole" => Ok(TopologyKind::UdpBlackhole),
                    "vsock" => bail!("the vsock topology needs a peer: give --vsock CID:PORT"),
                    other => bail!(
                        "unknown topology {other:?}; expected tcp-loopback or udp-blackhole \
                         (and --vsock CID:PORT for vsock)"
                    ),
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        };
        if let Some(v) = &self.vsock {
            topologies.push(parse_vsock(v)?);
        }
        if self.ring_mib == 0 || self.ring_mib > 4096 {
            bail!("invalid --ring-mib {}: give 1 to 4096", self.ring_mib);
        }
        let format = if self.json {
            Format::Json
        } else if self.csv {
            Format::Csv
        } else {
            Format::Table
        };
        Ok(Options {
            run: Duration::from_secs_f64(secs),
            repeat,
            sizes,
            engines,
            topologies,
            ring_bytes: self.ring_mib << 20,
            format,
            plot: self.plot,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_size("1400").unwrap(), 1400);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("64kib").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        for bad in ["", "0", "x", "4G", "-1"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("invalid size"), "{bad}: {e}");
        }
    }

    #[test]
    fn vsock_needs_cid_and_port() {
        assert_eq!(
            parse_vsock("3:5201").unwrap(),
            TopologyKind::Vsock { cid: 3, port: 5201 }
        );
        assert!(parse_vsock("3").is_err());
        assert!(parse_vsock("a:1").unwrap_err().to_string().contains("CID"));
    }
}
