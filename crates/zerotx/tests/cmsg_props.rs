//! Property test of the error-queue decoder: arbitrary control buffers (zero-copy ranges at every
//! level the kernel uses, ranges across 2^32, other origins, unknown messages, short payloads,
//! buffers cut anywhere) are built here byte by byte, independently of the decoder and of its
//! `CmsgBuilder`, from libc's `CMSG_LEN`/`CMSG_SPACE` and `struct sock_extended_err`'s layout;
//! the decoder's answer must equal what was built.

use std::mem::{offset_of, size_of};

use proptest::prelude::*;
use zerotx::internals::cmsg::{decode, DecodeError, ErrQueueMsg, ExtendedErr, ZcRange};

/// `(level, type)` pairs that carry a `sock_extended_err` (docs/kernel.md, "MSG_ZEROCOPY
/// (sendmsg + socket error queue)").
const RECVERR: [(i32, i32); 4] = [
    (libc::SOL_IP, libc::IP_RECVERR),
    (libc::SOL_IPV6, libc::IPV6_RECVERR),
    (287, 1),  // SOL_VSOCK, VSOCK_RECVERR
    (263, 16), // SOL_PACKET, PACKET_TX_TIMESTAMP
];
const ORIGIN_ZEROCOPY: u8 = 5;
const CODE_COPIED: u8 = 1;
const EE_LEN: usize = size_of::<libc::sock_extended_err>();

/// One control message to build, and what the decoder must make of it.
#[derive(Debug, Clone)]
enum Msg {
    /// A `sock_extended_err` at `at` followed by `trailer` bytes (IPv4/IPv6 put the offender's
    /// address there).
    Err {
        at: usize,
        err: ExtendedErr,
        trailer: Vec<u8>,
    },
    /// A message at a level and type that carry no extended error (timestamps, unknown).
    Unknown { level: i32, ty: i32, data: Vec<u8> },
    /// An extended-error place whose payload is shorter than `sock_extended_err`.
    Short { at: usize, len: usize },
}

impl Msg {
    fn level_type(&self) -> (i32, i32) {
        match *self {
            Msg::Err { at, .. } | Msg::Short { at, .. } => RECVERR[at],
            Msg::Unknown { level, ty, .. } => (level, ty),
        }
    }

    fn payload(&self) -> Vec<u8> {
        match self {
            Msg::Err { err, trailer, .. } => {
                let mut d = vec![0u8; EE_LEN];
                let put =
                    |d: &mut [u8], at: usize, v: &[u8]| d[at..at + v.len()].copy_from_slice(v);
                put(
                    &mut d,
                    offset_of!(libc::sock_extended_err, ee_errno),
                    &err.errno.to_ne_bytes(),
                );
                d[offset_of!(libc::sock_extended_err, ee_origin)] = err.origin;
                d[offset_of!(libc::sock_extended_err, ee_type)] = err.ty;
                d[offset_of!(libc::sock_extended_err, ee_code)] = err.code;
                d[offset_of!(libc::sock_extended_err, ee_pad)] = 0xA5; // padding: ignored
                put(
                    &mut d,
                    offset_of!(libc::sock_extended_err, ee_info),
                    &err.info.to_ne_bytes(),
                );
                put(
                    &mut d,
                    offset_of!(libc::sock_extended_err, ee_data),
                    &err.data.to_ne_bytes(),
                );
                d.extend_from_slice(trailer);
                d
            }
            Msg::Unknown { data, .. } => data.clone(),
            Msg::Short { len, .. } => vec![0x5A; *len],
        }
    }

    /// What the decoder must return for this message when all of it is in the buffer.
    fn expected(&self) -> Result<ErrQueueMsg, DecodeError> {
        let (level, ty) = self.level_type();
        match *self {
            Msg::Err { err, .. } if err.origin == ORIGIN_ZEROCOPY && err.errno == 0 => {
                Ok(ErrQueueMsg::Zerocopy(ZcRange {
                    lo: err.info,
                    hi: err.data,
                    copied: err.code & CODE_COPIED != 0,
                }))
            }
            Msg::Err { err, .. } => Ok(ErrQueueMsg::Other {
                level,
                ty,
                err: Some(err),
            }),
            Msg::Unknown { .. } => Ok(ErrQueueMsg::Other {
                level,
                ty,
                err: None,
            }),
            Msg::Short { len, .. } => Err(DecodeError::ShortExtendedErr { len }),
        }
    }
}

/// Lays `msgs` out as the kernel does (`CMSG_LEN` in the header, each message padded to
/// `CMSG_SPACE`); returns the bytes and, per message, where it starts and its `cmsg_len`.
fn build(msgs: &[Msg]) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut buf = Vec::new();
    let mut at = Vec::new();
    for m in msgs {
        let data = m.payload();
        let (level, ty) = m.level_type();
        let n = u32::try_from(data.len()).unwrap();
        // SAFETY: CMSG_LEN and CMSG_SPACE are arithmetic on their argument.
        let (len, space) = unsafe { (libc::CMSG_LEN(n) as usize, libc::CMSG_SPACE(n) as usize) };
        let mut hdr = vec![0u8; size_of::<libc::cmsghdr>()];
        let len_at = offset_of!(libc::cmsghdr, cmsg_len);
        hdr[len_at..len_at + size_of::<usize>()].copy_from_slice(&len.to_ne_bytes());
        let level_at = offset_of!(libc::cmsghdr, cmsg_level);
        hdr[level_at..level_at + 4].copy_from_slice(&level.to_ne_bytes());
        let type_at = offset_of!(libc::cmsghdr, cmsg_type);
        hdr[type_at..type_at + 4].copy_from_slice(&ty.to_ne_bytes());
        at.push((buf.len(), len));
        buf.extend_from_slice(&hdr);
        buf.extend_from_slice(&data);
        buf.resize(at.last().unwrap().0 + space, 0);
    }
    (buf, at)
}

/// What decoding the first `cut` bytes of a buffer laid out as `at` must give: the messages
/// wholly inside (a message may lack its trailing padding), in order, up to the first error.
fn expected(
    msgs: &[Msg],
    at: &[(usize, usize)],
    cut: usize,
) -> (Vec<ErrQueueMsg>, Option<DecodeError>) {
    let hdr = size_of::<libc::cmsghdr>();
    let mut out = Vec::new();
    for (m, &(start, len)) in msgs.iter().zip(at) {
        if cut <= start {
            break;
        }
        let remaining = cut - start;
        if remaining < hdr {
            return (out, Some(DecodeError::TruncatedHeader { remaining }));
        }
        if remaining < len {
            return (out, Some(DecodeError::BadLength { len, remaining }));
        }
        match m.expected() {
            Ok(v) => out.push(v),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

fn extended_err() -> impl Strategy<Value = ExtendedErr> {
    // Zero-copy ranges: ids anywhere, near the wrap, and ranges that cross 2^32.
    let lo = prop_oneof![any::<u32>(), (u32::MAX - 64)..=u32::MAX, 0u32..64];
    let span = prop_oneof![0u32..128, any::<u32>()];
    let zerocopy =
        (lo, span, any::<u8>(), any::<u8>()).prop_map(|(lo, span, code, ty)| ExtendedErr {
            errno: 0,
            origin: ORIGIN_ZEROCOPY,
            ty,
            code,
            info: lo,
            data: lo.wrapping_add(span),
        });
    // Anything else: ICMP errors, local errors, timestamps, and a zero-copy origin with an errno.
    let other = (
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(errno, origin, ty, code, info, data)| ExtendedErr {
            errno,
            origin,
            ty,
            code,
            info,
            data,
        });
    prop_oneof![3 => zerocopy, 2 => other]
}

fn msg() -> impl Strategy<Value = Msg> {
    let trailer = prop_oneof![
        Just(Vec::new()),
        proptest::collection::vec(any::<u8>(), size_of::<libc::sockaddr_in>()),
        proptest::collection::vec(any::<u8>(), size_of::<libc::sockaddr_in6>()),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    let unknown = (
        any::<i32>(),
        any::<i32>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_filter("not an extended-error place", |(l, t, _)| {
            !RECVERR.contains(&(*l, *t))
        })
        .prop_map(|(level, ty, data)| Msg::Unknown { level, ty, data });
    let timestamp = proptest::collection::vec(any::<u8>(), 0..64).prop_map(|data| Msg::Unknown {
        level: libc::SOL_SOCKET,
        ty: libc::SCM_TIMESTAMPING,
        data,
    });
    prop_oneof![
        8 => (0..RECVERR.len(), extended_err(), trailer)
            .prop_map(|(at, err, trailer)| Msg::Err { at, err, trailer }),
        2 => unknown,
        1 => timestamp,
        1 => (0..RECVERR.len(), 0..EE_LEN).prop_map(|(at, len)| Msg::Short { at, len }),
    ]
}

/// The control buffer and a cut: whole (`None`), or its first `n` bytes, at any point.
fn buffer() -> impl Strategy<Value = (Vec<Msg>, Option<prop::sample::Index>)> {
    (
        proptest::collection::vec(msg(), 0..8),
        proptest::option::weighted(0.3, any::<prop::sample::Index>()),
    )
}

#[test]
fn the_hand_built_layout_matches_the_kernels_structs() {
    assert_eq!(EE_LEN, 16);
    assert_eq!(EE_LEN, zerotx::internals::cmsg::EXTENDED_ERR_LEN);
    assert_eq!(
        RECVERR[2..],
        [
            zerotx::internals::cmsg::VSOCK_RECVERR,
            zerotx::internals::cmsg::PACKET_TX_TIMESTAMP
        ]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Decoding a built buffer gives back what was built, in order: every zero-copy range with
    /// its ids and copied flag, everything else as skippable, and at a short payload or a cut
    /// the right error with the messages before it kept.
    #[test]
    fn decode_gives_back_what_was_built((msgs, cut) in buffer()) {
        let (buf, at) = build(&msgs);
        let cut = cut.map_or(buf.len(), |i| i.index(buf.len() + 1));
        let (want, want_err) = expected(&msgs, &at, cut);
        let mut got = Vec::new();
        let res = decode(&buf[..cut], &mut got);
        prop_assert_eq!(&got, &want, "{} bytes of {}", cut, buf.len());
        prop_assert_eq!(res.err(), want_err);
        for (m, g) in msgs.iter().zip(&got) {
            if let (Msg::Err { err, .. }, ErrQueueMsg::Zerocopy(r)) = (m, g) {
                // Ranges across 2^32 count in wrapping arithmetic: hi - lo + 1.
                prop_assert_eq!(r.count(), u64::from(err.data.wrapping_sub(err.info)) + 1);
            }
        }
    }
}
