//! What the guest (`vm_guest`) and the host-side receiver (`vm_host`) agree on: the byte pattern
//! every check sends, the addresses of the guest network that `scripts/vm-test.sh` builds, and
//! the lines the two exchange around a transfer.
//!
//! A transfer starts with a TCP connection to [`PORT`] on the host and one hello line:
//! - `zxnet tcp <total> <stall_ms>`: the pattern from offset 0 follows on the same connection,
//!   then the guest shuts its side down for writing; the host checks every byte (pausing
//!   `stall_ms` once after the first MiB, a zero window when it is long) and answers one
//!   [`TcpVerdict`] line;
//! - `zxnet udp <count> <len>`: the host answers `port <p>`, the guest sends `count` datagrams of
//!   `len` bytes (stream offsets `i * len`) to that UDP port, then writes `done`; the host checks
//!   every datagram that arrived and answers one [`UdpVerdict`] line;
//! - `zxnet data reset <n>` and `zxnet data stall <ms>` (the fault checks): the host answers
//!   `port <p>`, a listener of its own with a 64 KiB receive buffer; the guest sends the pattern
//!   on a connection to that port, which the host resets after `n` bytes, or reads only after
//!   `ms` and then to EOF, checking every byte; it answers one [`TcpVerdict`] line on the first
//!   connection, which outlives the second.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The host's TCP port for every transfer's hello.
pub const PORT: u16 = 7000;
/// The host's port where socat hands each connection to `sha256sum` and sends the hash back:
/// a receiver nobody here wrote.
pub const SHA256_PORT: u16 = 7001;
/// How long `vm_host` stops reading when a hello asks for a stall.
pub const STALL_MS: u64 = 3000;
/// The host's end of the tap (198.18.0.0/15: the benchmarking range, never routed).
pub const HOST4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The host's end of the tap (a unique local address).
pub const HOST6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x7a, 0, 0, 0, 0, 0, 1);
/// The host's end of the second tap, whose NIC has no vnet header: no scatter-gather, no
/// checksum offload, so the guest's kernel copies every zero-copy send to it.
pub const HOST4_COPYING: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
/// The guest's NIC on that tap.
pub const NIC_COPYING: &str = "eth1";
/// The hello's first word.
pub const HELLO: &str = "zxnet";

/// The host's address in the family of `v6`.
pub fn host(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(HOST6)
    } else {
        IpAddr::V4(HOST4)
    }
}

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
const XOR: u64 = 0xA5A5_A5A5_A5A5_A5A5;

/// The byte at stream offset `o`: a word counter, so a stale, shifted or scribbled byte shows.
pub fn pattern(o: u64) -> u8 {
    let w = (o >> 3).wrapping_mul(MUL) ^ XOR;
    (w >> ((o & 7) * 8)) as u8
}

/// Writes the stream pattern for offsets `offset..offset + buf.len()`.
pub fn fill(buf: &mut [u8], offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(offset + i as u64);
    }
}

/// The stream offset whose 8-byte pattern word (little-endian, at an offset divisible by 8) is
/// `word`: how the receiver places a datagram without a header. The pattern's multiplier is
/// odd, so it has an inverse modulo 2^64 (five Newton steps double the correct bits 3 -> 96).
pub fn offset_of_word(word: u64) -> u64 {
    let mut inv = MUL;
    for _ in 0..5 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(MUL.wrapping_mul(inv)));
    }
    ((word ^ XOR).wrapping_mul(inv)) << 3
}

/// The host's answer after a TCP transfer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TcpVerdict {
    /// Bytes read before EOF.
    pub bytes: u64,
    /// Bytes that differ from the pattern.
    pub wrong: u64,
    /// The first wrong byte: offset and value.
    pub first: Option<(u64, u8)>,
    /// A read error that ended the transfer early.
    pub error: Option<String>,
    /// Times the host's stack advertised a zero window during the transfer (its namespace's
    /// `TCPToZeroWindowAdv`; the checks run one at a time, so the difference is this stream's).
    pub zero_windows: u64,
}

impl fmt::Display for TcpVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bytes={} wrong={} zero_windows={}",
            self.bytes, self.wrong, self.zero_windows
        )?;
        if let Some((at, got)) = self.first {
            write!(f, " first={at}:{got}")?;
        }
        if let Some(e) = &self.error {
            write!(f, " error={}", e.replace(char::is_whitespace, "_"))?;
        }
        Ok(())
    }
}

impl TcpVerdict {
    /// Parses a line written by `Display`.
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut v = Self::default();
        for field in line.split_whitespace() {
            let (k, val) = field
                .split_once('=')
                .ok_or_else(|| format!("not a verdict: {line:?}"))?;
            let num = |s: &str| s.parse::<u64>().map_err(|_| format!("bad {k} in {line:?}"));
            match k {
                "bytes" => v.bytes = num(val)?,
                "wrong" => v.wrong = num(val)?,
                "zero_windows" => v.zero_windows = num(val)?,
                "first" => {
                    let (at, got) = val.split_once(':').ok_or("bad first")?;
                    v.first = Some((num(at)?, num(got)? as u8));
                }
                "error" => v.error = Some(val.to_string()),
                _ => return Err(format!("unknown field {k} in {line:?}")),
            }
        }
        Ok(v)
    }

    /// `Ok` if exactly `want` bytes arrived, every one as the pattern says.
    pub fn check(&self, want: u64) -> Result<(), String> {
        if let Some(e) = &self.error {
            return Err(format!(
                "host reader failed after {} bytes: {e}",
                self.bytes
            ));
        }
        if let Some((at, got)) = self.first {
            return Err(format!(
                "host saw {} wrong bytes; first at offset {at}: {got:#04x}, expected {:#04x}",
                self.wrong,
                pattern(at)
            ));
        }
        if self.bytes != want {
            return Err(format!("host got {} bytes, sent {want}", self.bytes));
        }
        Ok(())
    }
}

/// The host's answer after a UDP transfer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UdpVerdict {
    /// Distinct datagrams that arrived intact.
    pub intact: u64,
    /// Datagrams with a wrong length, an offset outside the transfer, or a byte off the pattern.
    pub wrong: u64,
    /// Datagrams that arrived twice.
    pub duplicate: u64,
}

impl fmt::Display for UdpVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "intact={} wrong={} duplicate={}",
            self.intact, self.wrong, self.duplicate
        )
    }
}

impl UdpVerdict {
    /// Parses a line written by `Display`.
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut v = Self::default();
        for field in line.split_whitespace() {
            let (k, val) = field
                .split_once('=')
                .ok_or_else(|| format!("not a verdict: {line:?}"))?;
            let n = val
                .parse::<u64>()
                .map_err(|_| format!("bad {k} in {line:?}"))?;
            match k {
                "intact" => v.intact = n,
                "wrong" => v.wrong = n,
                "duplicate" => v.duplicate = n,
                _ => return Err(format!("unknown field {k} in {line:?}")),
            }
        }
        Ok(v)
    }

    /// Checks one datagram of a transfer of `count` datagrams of `len` bytes: returns its index
    /// if it is whole and every byte matches the pattern at its offset.
    pub fn place(data: &[u8], count: u64, len: usize) -> Option<u64> {
        if data.len() != len || len < 8 || len % 8 != 0 {
            return None;
        }
        let word = u64::from_le_bytes(data[..8].try_into().ok()?);
        let offset = offset_of_word(word);
        let index = offset / len as u64;
        if offset % len as u64 != 0 || index >= count {
            return None;
        }
        let intact = data
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(offset + i as u64));
        intact.then_some(index)
    }
}
