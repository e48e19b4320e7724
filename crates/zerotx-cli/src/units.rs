//! One grammar for sizes, rates and times, for every subcommand (`bench --sizes`, `send --size`,
//! `--bytes`, `--bitrate`, and every flag in seconds), so a value that works in one place works
//! in all. Sizes and rates are parsed by `parse-size`: bytes 1024-based (`64K`, `1.5M`, `10GiB`,
//! `4KB`), rates 1000-based in bits per second (`100M`, `2.5G`), as iperf3 reads `-n` and `-b`.
//! A negative, zero or unreadable value gets a message that names the flag and says what to give.

use std::time::Duration;

use anyhow::bail;
use parse_size::{ByteSuffix, Config, Error};

/// The largest single send (`send --size`, `bench --sizes`).
pub const MAX_SEND: usize = 64 << 20;

/// What a byte count looks like, for messages.
const BYTES: &str = "give a number of bytes with an optional K, M, G or T suffix (1024-based: \
                     1400, 64K, 1.5M, 10G)";
/// What a rate looks like, for messages.
const RATE: &str = "give bits per second with an optional K, M, G or T suffix (1000-based: \
                    800K, 100M, 2.5G)";

/// Why `s` is no value of a `kind` ("a byte count", "a rate"): negative, nothing, unreadable or
/// too large.
fn why(s: &str, kind: &str, parsed: Result<u64, Error>) -> Result<u64, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!("{kind} cannot be negative"));
    }
    match parsed {
        Ok(0) => Err("that is nothing".into()),
        Ok(n) => Ok(n),
        Err(Error::PosOverflow) => Err("too large".into()),
        Err(_) => Err("not a number with a known suffix".into()),
    }
}

/// Bytes: `1400`, `64K`, `1.5M`, `10G`, `16KiB`, `4kb` (1024-based). At least 1 (a value that
/// rounds to 0 is refused).
pub fn bytes(flag: &str, s: &str) -> anyhow::Result<u64> {
    let parsed = Config::new().with_binary().parse_size(s.trim());
    match why(s, "a byte count", parsed) {
        Ok(n) => Ok(n),
        Err(w) => bail!("invalid {flag} {s:?}: {w}; {BYTES}"),
    }
}

/// Bytes per send, at most `max` (named in the message as `max_label`).
pub fn send_size(flag: &str, s: &str, max: usize, max_label: &str) -> anyhow::Result<usize> {
    let n = bytes(flag, s)?;
    match usize::try_from(n) {
        Ok(n) if n <= max => Ok(n),
        _ => bail!("invalid {flag} {s:?}: a send carries at most {max_label}; give a smaller size"),
    }
}

/// Bits per second: `800K`, `100M`, `2.5G` (1000-based; no `B`, which would read as bytes).
pub fn bitrate(flag: &str, s: &str) -> anyhow::Result<u64> {
    let parsed = Config::new()
        .with_decimal()
        .with_byte_suffix(ByteSuffix::Deny)
        .parse_size(s.trim());
    match why(s, "a rate", parsed) {
        Ok(n) => Ok(n),
        Err(w) => bail!("invalid {flag} {s:?}: {w}; {RATE}"),
    }
}

/// Seconds above 0 (at most about 11 days, which no run needs).
pub fn seconds(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if v.is_finite() && v < 0.0 {
        bail!("invalid {flag} {v}: a time cannot be negative; give seconds above 0 (10, 0.5)");
    }
    if !(v.is_finite() && v > 0.0 && v <= 1e6) {
        bail!("invalid {flag} {v}: give seconds above 0 and at most 1000000 (10, 0.5)");
    }
    Ok(Duration::from_secs_f64(v))
}

/// Seconds, where 0 means none (`--interval`).
pub fn seconds_or_none(flag: &str, v: f64) -> anyhow::Result<Option<Duration>> {
    if v.is_finite() && v < 0.0 {
        bail!("invalid {flag} {v}: a time cannot be negative; give seconds, or 0 for none");
    }
    if v == 0.0 {
        return Ok(None);
    }
    if !(v.is_finite() && v <= 1e6) {
        bail!("invalid {flag} {v}: give seconds up to 1000000, or 0 for none");
    }
    Ok(Some(Duration::from_secs_f64(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_1024_based_with_or_without_b() {
        for (s, n) in [
            ("1400", 1400),
            ("4K", 4096),
            ("4k", 4096),
            ("64KiB", 65536),
            ("4KB", 4096),
            ("1.5k", 1536),
            ("1M", 1 << 20),
            ("10G", 10 << 30),
            ("2T", 2 << 40),
            (" 8K ", 8192),
        ] {
            assert_eq!(bytes("--bytes", s).unwrap(), n, "{s}");
        }
    }

    #[test]
    fn rates_are_1000_based_bits() {
        assert_eq!(bitrate("-b", "100M").unwrap(), 100_000_000);
        assert_eq!(bitrate("-b", "2.5G").unwrap(), 2_500_000_000);
        assert_eq!(bitrate("-b", "800k").unwrap(), 800_000);
        assert_eq!(bitrate("-b", "1").unwrap(), 1);
        let e = bitrate("-b", "10MB").unwrap_err().to_string();
        assert!(e.contains("not a number with a known suffix"), "{e}");
    }

    #[test]
    fn bad_values_say_why_and_what_to_give() {
        let cases = [
            ("-1", "a byte count cannot be negative"),
            ("0", "that is nothing"),
            ("0.0001", "that is nothing"),
            ("x", "not a number with a known suffix"),
            ("", "not a number with a known suffix"),
            ("4Q", "not a number with a known suffix"),
            ("99999999E", "too large"),
        ];
        for (s, why) in cases {
            let e = bytes("--size", s).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("invalid --size {s:?}: {why}")),
                "{s}: {e}"
            );
            assert!(e.contains("1.5M, 10G"), "{e}");
        }
        let e = send_size("--sizes", "1G", 64 << 20, "64M").unwrap_err();
        assert!(e.to_string().contains("a send carries at most 64M"), "{e}");
        assert_eq!(
            send_size("--sizes", "64M", 64 << 20, "64M").unwrap(),
            64 << 20
        );
    }

    #[test]
    fn times_are_positive_seconds_and_intervals_may_be_none() {
        assert_eq!(seconds("--time", 0.5).unwrap(), Duration::from_millis(500));
        for (v, why) in [
            (-1.0, "a time cannot be negative"),
            (0.0, "give seconds above 0"),
            (f64::NAN, "give seconds above 0"),
            (1e7, "give seconds above 0"),
        ] {
            let e = seconds("--time", v).unwrap_err().to_string();
            assert!(e.contains(why), "{v}: {e}");
        }
        assert_eq!(seconds_or_none("-i", 0.0).unwrap(), None);
        assert_eq!(
            seconds_or_none("-i", 2.0).unwrap(),
            Some(Duration::from_secs(2))
        );
        assert!(seconds_or_none("-i", -1.0).is_err());
    }
}
