//! Decoding the socket error queue's control messages: a pure function over bytes.
//!
//! `recvmsg(MSG_ERRQUEUE)` fills a control buffer with `cmsghdr`s. A zero-copy completion is a
//! `struct sock_extended_err` with `ee_origin == SO_EE_ORIGIN_ZEROCOPY`, carried at one of four
//! (level, type) pairs depending on the socket family. Everything else that can share the queue
//! (timestamps, ICMP errors, local errors) is reported as [`ErrQueueMsg::Other`] so the caller can
//! skip it.
//!
//! Unlike most decoders, this one trusts none of the kernel's lengths: every header and payload
//! length is checked against the slice, the function is fuzzed (`fuzz/`), and a property test
//! (`tests/cmsg_props.rs`) decodes control buffers built independently of it. It needs no
//! `unsafe`: fields are read with `from_ne_bytes` from an arbitrary byte slice.

use std::mem;

/// `SO_EE_ORIGIN_ZEROCOPY`.
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data after all.
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// `SOL_IP`, `IP_RECVERR`: IPv4 sockets (and IPv4-mapped traffic on IPv6 sockets).
pub const IP_RECVERR: (i32, i32) = (0, 11);
/// `SOL_IPV6`, `IPV6_RECVERR`.
pub const IPV6_RECVERR: (i32, i32) = (41, 25);
/// `SOL_VSOCK`, `VSOCK_RECVERR` (6.7).
pub const VSOCK_RECVERR: (i32, i32) = (287, 1);
/// `SOL_PACKET`, `PACKET_TX_TIMESTAMP`: packet sockets report zero-copy completions here.
pub const PACKET_TX_TIMESTAMP: (i32, i32) = (263, 16);

/// Size of `struct sock_extended_err`.
pub const EXTENDED_ERR_LEN: usize = 16;

const HDR_LEN: usize = mem::size_of::<libc::cmsghdr>();
const ALIGN: usize = mem::size_of::<usize>();

const fn align(len: usize) -> usize {
    (len + ALIGN - 1) & !(ALIGN - 1)
}

/// `struct sock_extended_err`, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedErr {
    /// `ee_errno`.
    pub errno: u32,
    /// `ee_origin`.
    pub origin: u8,
    /// `ee_type`.
    pub ty: u8,
    /// `ee_code`.
    pub code: u8,
    /// `ee_info`: for zero-copy, the first id of the range.
    pub info: u32,
    /// `ee_data`: for zero-copy, the last id of the range (inclusive).
    pub data: u32,
}

/// An inclusive range of zero-copy ids the kernel has released, `[lo, hi]` in wrapping u32 order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZcRange {
    /// First id.
    pub lo: u32,
    /// Last id (inclusive); may be below `lo` when the range crosses 2^32.
    pub hi: u32,
    /// `SO_EE_CODE_ZEROCOPY_COPIED` was set: the kernel copied (see the ledger on coalescing).
    pub copied: bool,
}

impl ZcRange {
    /// How many ids the range covers: `hi - lo + 1` in wrapping arithmetic, 1 ..= 2^32.
    pub fn count(&self) -> u64 {
        u64::from(self.hi.wrapping_sub(self.lo)) + 1
    }
}

/// One control message from the error queue, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrQueueMsg {
    /// A zero-copy completion.
    Zerocopy(ZcRange),
    /// Anything else (timestamps, ICMP and local errors, unknown levels): skip it.
    Other {
        /// `cmsg_level`.
        level: i32,
        /// `cmsg_type`.
        ty: i32,
        /// The extended error, when the message carried one.
        err: Option<ExtendedErr>,
    },
}

/// Why a control buffer could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes remain than a `cmsghdr` needs, but more than zero.
    #[error("control buffer ends inside a cmsghdr ({remaining} bytes left, {HDR_LEN} needed)")]
    TruncatedHeader {
        /// Bytes left.
        remaining: usize,
    },
    /// `cmsg_len` is smaller than the header or runs past the buffer.
    #[error("cmsg_len {len} is invalid for {remaining} remaining bytes")]
    BadLength {
        /// The header's `cmsg_len`.
        len: usize,
        /// Bytes left from this header on.
        remaining: usize,
    },
    /// A recognised error-queue message whose payload is shorter than `sock_extended_err`.
    #[error("extended error payload is {len} bytes, {EXTENDED_ERR_LEN} needed")]
    ShortExtendedErr {
        /// Payload length.
        len: usize,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    u32_at(b, at) as i32
}

fn usize_at(b: &[u8], at: usize) -> usize {
    let mut raw = [0u8; ALIGN];
    raw.copy_from_slice(&b[at..at + ALIGN]);
    usize::from_ne_bytes(raw)
}

/// Parses a `sock_extended_err` from the start of `data`.
pub fn parse_extended_err(data: &[u8]) -> Result<ExtendedErr, DecodeError> {
    if data.len() < EXTENDED_ERR_LEN {
        return Err(DecodeError::ShortExtendedErr { len: data.len() });
    }
    Ok(ExtendedErr {
        errno: u32_at(data, 0),
        origin: data[4],
        ty: data[5],
        code: data[6],
        info: u32_at(data, 8),
        data: u32_at(data, 12),
    })
}

/// Whether `(level, ty)` is one of the four places the kernel puts a `sock_extended_err`.
pub fn is_recverr(level: i32, ty: i32) -> bool {
    [IP_RECVERR, IPV6_RECVERR, VSOCK_RECVERR, PACKET_TX_TIMESTAMP].contains(&(level, ty))
}

/// Classifies one control message's payload.
pub fn classify(level: i32, ty: i32, data: &[u8]) -> Result<ErrQueueMsg, DecodeError> {
    if !is_recverr(level, ty) {
        return Ok(ErrQueueMsg::Other {
            level,
            ty,
            err: None,
        });
    }
    let err = parse_extended_err(data)?;
    if err.origin == SO_EE_ORIGIN_ZEROCOPY && err.errno == 0 {
        Ok(ErrQueueMsg::Zerocopy(ZcRange {
            lo: err.info,
            hi: err.data,
            copied: err.code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
        }))
    } else {
        Ok(ErrQueueMsg::Other {
            level,
            ty,
            err: Some(err),
        })
    }
}

/// Iterates over the control messages in `control` (the first `msg_controllen` bytes the kernel
/// wrote), yielding `(level, type, payload)`; stops at the first malformed header.
pub fn messages(control: &[u8]) -> impl Iterator<Item = Result<(i32, i32, &[u8]), DecodeError>> {
    let mut rest = control;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || rest.is_empty() {
            return None;
        }
        if rest.len() < HDR_LEN {
            failed = true;
            return Some(Err(DecodeError::TruncatedHeader {
                remaining: rest.len(),
            }));
        }
        let len = usize_at(rest, 0);
        if len < HDR_LEN || len > rest.len() {
            failed = true;
            return Some(Err(DecodeError::BadLength {
                len,
                remaining: rest.len(),
            }));
        }
        let level = i32_at(rest, ALIGN);
        let ty = i32_at(rest, ALIGN + 4);
        let data = &rest[HDR_LEN..len];
        // The last message may lack its trailing padding.
        rest = &rest[align(len).min(rest.len())..];
        Some(Ok((level, ty, data)))
    })
}

/// Decodes every control message in `control` into `out`. On error, the messages decoded before
/// it are kept in `out`.
pub fn decode(control: &[u8], out: &mut Vec<ErrQueueMsg>) -> Result<(), DecodeError> {
    for msg in messages(control) {
        let (level, ty, data) = msg?;
        out.push(classify(level, ty, data)?);
    }
    Ok(())
}

/// Builds control buffers the way the kernel lays them out. For tests, benchmarks and fuzz seeds:
/// the kernel never writes some messages one needs to test against (a range across 2^32, a short
/// payload).
#[derive(Debug, Default)]
pub struct CmsgBuilder {
    buf: Vec<u8>,
}

impl CmsgBuilder {
    /// An empty control buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a message with an arbitrary payload.
    pub fn raw(mut self, level: i32, ty: i32, data: &[u8]) -> Self {
        let len = HDR_LEN + data.len();
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&level.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(self.buf.len() + align(len) - len, 0);
        self
    }

    /// Appends a `sock_extended_err`.
    pub fn extended_err(self, (level, ty): (i32, i32), e: ExtendedErr) -> Self {
        let mut d = Vec::with_capacity(EXTENDED_ERR_LEN);
        d.extend_from_slice(&e.errno.to_ne_bytes());
        d.extend_from_slice(&[e.origin, e.ty, e.code, 0]);
        d.extend_from_slice(&e.info.to_ne_bytes());
        d.extend_from_slice(&e.data.to_ne_bytes());
        self.raw(level, ty, &d)
    }

    /// Appends a zero-copy completion for `[lo, hi]`.
    pub fn zerocopy(self, at: (i32, i32), lo: u32, hi: u32, copied: bool) -> Self {
        self.extended_err(
            at,
            ExtendedErr {
                errno: 0,
                origin: SO_EE_ORIGIN_ZEROCOPY,
                ty: 0,
                code: if copied {
                    SO_EE_CODE_ZEROCOPY_COPIED
                } else {
                    0
                },
                info: lo,
                data: hi,
            },
        )
    }

    /// The bytes, as `msg_controllen` would delimit them.
    pub fn build(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(b: &[u8]) -> Result<Vec<ErrQueueMsg>, DecodeError> {
        let mut v = Vec::new();
        decode(b, &mut v).map(|()| v)
    }

    #[test]
    fn each_family_level_decodes_a_range() {
        for at in [IP_RECVERR, IPV6_RECVERR, VSOCK_RECVERR, PACKET_TX_TIMESTAMP] {
            let b = CmsgBuilder::new().zerocopy(at, 7, 9, true).build();
            assert_eq!(
                decode_all(&b).unwrap(),
                vec![ErrQueueMsg::Zerocopy(ZcRange {
                    lo: 7,
                    hi: 9,
                    copied: true
                })]
            );
        }
    }

    #[test]
    fn range_across_the_wrap_counts_right() {
        let b = CmsgBuilder::new()
            .zerocopy(IP_RECVERR, u32::MAX - 1, 2, false)
            .build();
        let ErrQueueMsg::Zerocopy(r) = decode_all(&b).unwrap()[0] else {
            panic!("not a completion")
        };
        assert_eq!(r.count(), 5);
        assert!(!r.copied);
    }

    #[test]
    fn other_origins_and_levels_are_skippable() {
        let icmp = ExtendedErr {
            errno: libc::EHOSTUNREACH as u32,
            origin: 2,
            ty: 3,
            code: 1,
            info: 0,
            data: 0,
        };
        let b = CmsgBuilder::new()
            .raw(libc::SOL_SOCKET, libc::SCM_TIMESTAMPING, &[0u8; 48])
            .extended_err(IP_RECVERR, icmp)
            .zerocopy(IPV6_RECVERR, 1, 1, false)
            .build();
        let v = decode_all(&b).unwrap();
        assert_eq!(v.len(), 3);
        assert!(matches!(v[0], ErrQueueMsg::Other { err: None, .. }));
        assert!(matches!(v[1], ErrQueueMsg::Other { err: Some(e), .. } if e.origin == 2));
        assert!(matches!(v[2], ErrQueueMsg::Zerocopy(_)));
    }

    #[test]
    fn lengths_are_checked() {
        assert_eq!(
            decode_all(&[0u8; 5]),
            Err(DecodeError::TruncatedHeader { remaining: 5 })
        );
        let mut b = CmsgBuilder::new().zerocopy(IP_RECVERR, 1, 2, false).build();
        b[0] = 200; // cmsg_len past the end
        assert!(matches!(
            decode_all(&b),
            Err(DecodeError::BadLength { len: 200, .. })
        ));
        let short = CmsgBuilder::new().raw(0, 11, &[0u8; 8]).build();
        assert_eq!(
            decode_all(&short),
            Err(DecodeError::ShortExtendedErr { len: 8 })
        );
        // A zero cmsg_len must not loop forever.
        assert!(decode_all(&[0u8; 32]).is_err());
    }

    #[test]
    fn ipv4_payload_with_trailing_offender_address_decodes() {
        let mut d = vec![0u8; EXTENDED_ERR_LEN + 16];
        d[4] = SO_EE_ORIGIN_ZEROCOPY;
        d[8..12].copy_from_slice(&3u32.to_ne_bytes());
        d[12..16].copy_from_slice(&4u32.to_ne_bytes());
        let b = CmsgBuilder::new().raw(0, 11, &d).build();
        assert_eq!(
            decode_all(&b).unwrap(),
            vec![ErrQueueMsg::Zerocopy(ZcRange {
                lo: 3,
                hi: 4,
                copied: false
            })]
        );
    }
}
