//! Owned, immutable buffers the kernel may read after the send call returned.
//!
//! # The rule
//! A buffer handed to a [`Sender`](crate::Sender) belongs to zerotx until the kernel released it.
//! Every path gives it back: a send that could not start returns it in the error
//! ([`SendError`](crate::SendError)); a send that started returns it, with its
//! [`Report`](crate::Report), only from [`Sender::reap`](crate::Sender::reap) after the kernel's
//! completion (or at once for a copy send). Closing a sender with buffers in flight waits for them
//! up to a deadline, and past it *keeps* them (leaks them deliberately, and counts them in
//! [`leaked_buffers`](crate::leaked_buffers)) rather than hand back memory the kernel still reads.
//!
//! [`SendBuf`] is an `unsafe trait`: an implementation promises the bytes neither move nor change
//! while the value lives, whatever happens to the value itself (it may be moved around freely).
#![allow(unsafe_code)]

mod pool;

pub use pool::{BufPool, PoolBufMut, PooledBuf};

use std::sync::Arc;

/// A buffer whose bytes stay at one address, unchanged, for as long as the value lives.
///
/// # Safety
/// [`as_bytes`](SendBuf::as_bytes) must return the same pointer and length every time it is
/// called on a value, even after the value moved, and nothing may write to those bytes while the
/// value lives. Heap-backed owned types (`Vec<u8>`, `Box<[u8]>`) qualify because only the owner
/// could change them and the sender owns them; shared immutable ones (`Bytes`, `Arc<[u8]>`) do
/// because nobody can change them.
pub unsafe trait SendBuf: Send + 'static {
    /// The bytes to send.
    fn as_bytes(&self) -> &[u8];

    /// Where the bytes lie inside a registered region: `(region id, offset)`. Only the pool's
    /// buffers answer; io_uring engines use it to send from registered memory.
    fn registered(&self) -> Option<(u64, usize)> {
        None
    }
}

// SAFETY: a Vec's heap allocation does not move when the Vec moves, and only its owner, the
// sender, could change it (the sender never does).
unsafe impl SendBuf for Vec<u8> {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: as for Vec: a uniquely owned heap allocation that the sender never changes.
unsafe impl SendBuf for Box<[u8]> {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: Bytes is immutable and reference counted; its storage never moves or changes.
unsafe impl SendBuf for bytes::Bytes {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: Arc<[u8]> gives only shared access; the slice lives on the heap until the last owner.
unsafe impl SendBuf for Arc<[u8]> {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: static bytes live forever and `&'static [u8]` cannot be used to change them.
unsafe impl SendBuf for &'static [u8] {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}
