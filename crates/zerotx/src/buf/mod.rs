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
//! Other owners of immutable bytes need no `unsafe` of their own: see [`SendBuf`]'s "Other
//! owners".
#![allow(unsafe_code)]

mod pool;
mod sealed;

pub use pool::{BufPool, PoolBufMut, PooledBuf};
pub use sealed::map_sealed;

use std::sync::Arc;

/// A buffer whose bytes stay at one address, unchanged, for as long as the value lives.
///
/// Implemented for `Vec<u8>`, `Box<[u8]>`, `bytes::Bytes`, `Arc<[u8]>`, `&'static [u8]` and the
/// pool's [`PooledBuf`](crate::PooledBuf).
///
/// # Other owners: through `Bytes::from_owner`, without `unsafe`
/// Any other owner of immutable bytes (`Arc<Vec<u8>>`, a `String`, a memory-mapped file, a
/// buffer of another library) becomes a `Bytes` with `bytes::Bytes::from_owner`, which takes
/// any `AsRef<[u8]> + Send + 'static` value without copying, keeps it alive as long as a clone
/// or slice of the `Bytes` lives, and drops it after the last one (so after the kernel released
/// the last send from it). Send that `Bytes`: no `unsafe impl` is needed.
///
/// A memory-mapped file goes the same way. A file sealed against writes and shrinking (a
/// `memfd_create(2)` file) maps safely with [`map_sealed`](crate::map_sealed). An ordinary file
/// maps with `memmap2::Mmap::map`, whose one `unsafe` is memmap2's own rule (nobody writes or
/// truncates the file while it is mapped: a change would show on the wire); zerotx adds none.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use bytes::Bytes;
/// use zerotx::{EngineKind, Sender};
///
/// let file = std::fs::File::open("object.bin")?;
/// // SAFETY: the file is not written or truncated while it is mapped (memmap2's own rule).
/// let map = unsafe { memmap2::Mmap::map(&file)? };
/// let body = Bytes::from_owner(map); // no copy; unmapped after the last send released it
/// let stream = std::net::TcpStream::connect("127.0.0.1:9000")?;
/// let mut tx: Sender<Bytes> = Sender::new(stream, EngineKind::Auto)?;
/// tx.send(body)?;
/// let closed = tx.close(std::time::Duration::from_secs(5));
/// assert_eq!(closed.kept, 0);
/// # Ok(()) }
/// ```
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
