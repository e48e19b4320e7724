//! A file the kernel will not let anyone change, mapped and sent as `Bytes` without `unsafe` in
//! the caller.
//!
//! Mapping an ordinary file is `unsafe` (memmap2's `Mmap::map`): another process may write or
//! truncate it while it is mapped, and the bytes behind a `&[u8]` change or vanish. A file sealed
//! with `F_SEAL_WRITE` and `F_SEAL_SHRINK` (`fcntl(2)`, on a `memfd_create(2)` file or a tmpfs or
//! hugetlbfs one) cannot be written or shrunk by anyone while the seals hold, and seals cannot be
//! removed, so its mapping is immutable for as long as it lives: that is what makes this safe.

use std::fs::File;

use bytes::Bytes;
use rustix::fs::SealFlags;

use crate::error::Error;

/// Maps the whole of `file`, which must be sealed against writes and shrinking, read-only
/// (`mmap(2)`), as a `Bytes` that shares the mapping without copying (`Bytes::from_owner`):
/// send it, or slices of it, from any [`Sender<Bytes>`](crate::Sender); the mapping goes when the
/// last clone is dropped (after the kernel released the last send from it).
///
/// Fails with [`Error::Config`] for a file without both seals (`fcntl(F_GET_SEALS)`; a file on
/// an ordinary file system cannot be sealed), and with [`Error::Io`] if the kernel refuses the
/// mapping. For an ordinary file, map it with `memmap2::Mmap::map` under its own rule (nobody
/// changes the file while it is mapped) and send `Bytes::from_owner(map)`: see
/// [`SendBuf`](crate::SendBuf).
///
/// ```
/// use std::io::Write;
/// use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
///
/// let fd = memfd_create("object", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
/// let mut file = std::fs::File::from(fd);
/// file.write_all(b"an object served many times")?;
/// fcntl_add_seals(&file, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW)?;
/// let body = zerotx::map_sealed(&file)?;
/// assert_eq!(&body[..9], b"an object");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn map_sealed(file: &File) -> Result<Bytes, Error> {
    let seals = rustix::fs::fcntl_get_seals(file).map_err(|e| Error::Io {
        context: "fcntl(F_GET_SEALS) of the file to map",
        source: e.into(),
    })?;
    let needed = SealFlags::WRITE | SealFlags::SHRINK;
    if !seals.contains(needed) {
        return Err(Error::Config {
            problem: format!(
                "the file to map is sealed with {seals:?}, not against writes and shrinking"
            ),
            fix:
                "seal it with fcntl(F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK) (a memfd made with \
                  MFD_ALLOW_SEALING), or map an ordinary file with memmap2 under its own rule and \
                  send Bytes::from_owner(map)"
                    .into(),
        });
    }
    // SAFETY: memmap2's rule is that nothing changes or truncates the file while it is mapped.
    // The file carries F_SEAL_WRITE and F_SEAL_SHRINK: the kernel refuses every write (write(2),
    // a writable shared mapping) and every truncation, for everyone, and seals are never removed.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|source| Error::Io {
        context: "mmap(2) of the sealed file",
        source,
    })?;
    Ok(Bytes::from_owner(map))
}
