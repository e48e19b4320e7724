//! The generated stream `zerotx send` writes without `--file`, and `zerotx recv --verify`
//! checks: plain bytes, no header, so any receiver can take it and any corruption, loss, gap or
//! reordering shows.
//!
//! Byte `i` of the stream is byte `i % 8` (little-endian) of `word((i / 8) % WORDS)`, where `word`
//! is a bijection on `u64`: every 8-byte word of one period is different, and a word alone says
//! where in the period it sits ([`locate`]), which is how a datagram receiver finds each
//! datagram's place without a sequence header. The period ([`PERIOD`], 1 MiB) lets the sender
//! keep the whole stream in one immutable [`Window`] and send slices of it: the same memory over
//! and over, as iperf3 does with its one buffer, and safe for zero-copy because nobody writes it.

use bytes::Bytes;

/// Bytes in one period of the stream.
pub const PERIOD: usize = 1 << 20;
const WORDS: u64 = (PERIOD / 8) as u64;
const KEY: u64 = 0x6a09_e667_f3bc_c908;
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
const MUL_INV: u64 = inverse(MUL);

/// The inverse of an odd `a` modulo 2^64 (Newton's iteration doubles the correct bits).
const fn inverse(a: u64) -> u64 {
    let mut x = a; // correct to 3 bits for any odd a
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

fn word(w: u64) -> u64 {
    (w ^ KEY).wrapping_mul(MUL)
}

fn word_index(x: u64) -> u64 {
    x.wrapping_mul(MUL_INV) ^ KEY
}

/// The stream's bytes from offset 0 for `PERIOD + extra` bytes: every slice of up to `extra`
/// bytes starting anywhere in the period is one slice of this memory.
#[derive(Clone)]
pub struct Window {
    bytes: Bytes,
    extra: usize,
}

impl Window {
    /// A window from which slices of up to `extra` bytes can be taken at any offset.
    pub fn new(extra: usize) -> Self {
        let len = PERIOD + extra;
        let mut v = Vec::with_capacity(len + 8);
        let mut w = 0u64;
        while v.len() < len {
            v.extend_from_slice(&word(w % WORDS).to_le_bytes());
            w += 1;
        }
        v.truncate(len);
        Self {
            bytes: Bytes::from(v),
            extra,
        }
    }

    /// The stream's `len` bytes starting at stream offset `offset`, sharing the window's memory.
    ///
    /// # Panics
    /// If `len` is more than the `extra` the window was made with.
    pub fn at(&self, offset: u64, len: usize) -> Bytes {
        assert!(
            len <= self.extra,
            "slice of {len} from a window of {}",
            self.extra
        );
        let o = (offset % PERIOD as u64) as usize;
        self.bytes.slice(o..o + len)
    }

    /// Where `data`, claimed to sit at stream offset `offset`, first differs from the stream:
    /// `None` when it matches.
    pub fn mismatch(&self, offset: u64, data: &[u8]) -> Option<u64> {
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(self.extra.max(1)).min(PERIOD);
            let want = self.at(offset + done as u64, n);
            let got = &data[done..done + n];
            if want[..] != got[..] {
                let i = want.iter().zip(got).position(|(a, b)| a != b).unwrap_or(0);
                return Some(offset + (done + i) as u64);
            }
            done += n;
        }
        None
    }
}

/// Where in the period a piece of the stream starts (a datagram, read alone): `None` when no
/// 8-byte word in its first 15 bytes is a word of the stream, i.e. it is not the stream. The
/// caller checks the rest with [`Window::mismatch`].
pub fn locate(data: &[u8]) -> Option<u64> {
    for shift in 0..8usize {
        let b = data.get(shift..shift + 8)?;
        let w = word_index(u64::from_le_bytes(b.try_into().expect("8 bytes")));
        if w < WORDS {
            let pos = (w * 8 + PERIOD as u64 - shift as u64) % PERIOD as u64;
            return Some(pos);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_map_is_a_bijection_that_can_be_undone() {
        assert_eq!(MUL.wrapping_mul(MUL_INV), 1);
        for w in [0, 1, 7, WORDS - 1, 12345] {
            assert_eq!(word_index(word(w)), w);
        }
    }

    #[test]
    fn slices_anywhere_are_the_stream_and_wrap_at_the_period() {
        let win = Window::new(4096);
        let a = win.at(PERIOD as u64 - 10, 100);
        let b = win.at(2 * PERIOD as u64 - 10, 100);
        assert_eq!(a, b);
        assert_eq!(win.at(0, 20)[..], win.at(PERIOD as u64, 20)[..]);
        assert_eq!(win.mismatch(PERIOD as u64 - 10, &a), None);
        let mut bad = a.to_vec();
        bad[57] ^= 1;
        assert_eq!(
            win.mismatch(PERIOD as u64 - 10, &bad),
            Some(PERIOD as u64 - 10 + 57)
        );
        // The same bytes one place off are not the stream.
        assert!(win.mismatch(PERIOD as u64 - 9, &a).is_some());
    }

    #[test]
    fn a_datagram_says_where_it_sits_at_any_alignment() {
        let win = Window::new(65536);
        for pos in [0u64, 1, 7, 8, 1472 * 3, PERIOD as u64 - 3, 999_999] {
            let d = win.at(pos, 1472);
            assert_eq!(locate(&d), Some(pos), "at {pos}");
        }
        assert_eq!(locate(&[0u8; 64]), None);
        assert_eq!(locate(b"hello, world, this is not it"), None);
        assert_eq!(locate(&[1, 2, 3]), None);
    }

    #[test]
    fn long_checks_cross_the_window_in_pieces() {
        let win = Window::new(1000);
        let mut stream = Vec::new();
        for o in (0..3 * PERIOD as u64).step_by(1000) {
            stream.extend_from_slice(&win.at(o, 1000));
        }
        assert_eq!(win.mismatch(0, &stream), None);
        stream[2 * PERIOD + 5] ^= 0x80;
        assert_eq!(win.mismatch(0, &stream), Some(2 * PERIOD as u64 + 5));
    }
}
