//! A pool of page-aligned blocks carved from one allocation.
//!
//! Why this is ours: io_uring registered buffers want one region pinned once, and zero-copy sends
//! want page-aligned memory so a block pins as few pages as possible. A block is written through
//! a [`PoolBufMut`], frozen into an immutable [`PooledBuf`] to be sent, and goes back to the pool
//! when the last handle drops, or is reopened for writing with [`PooledBuf::into_mut`] once the
//! sender returned it.
//!
//! **Never on huge pages.** The region is its own anonymous mapping, marked `MADV_NOHUGEPAGE`
//! before any page of it is touched. io_uring merges a registered buffer that lies on
//! transparent huge pages into multi-page segments, and the kernel then charges each zero-copy
//! send from it as if it held everything from the start of the huge page
//! (`PAGE_ALIGN(bv_len + bv_offset)` in `io_sg_from_iter`): measured 44 times the bytes on this
//! project's 6.18 host (3.3 MB of receive memory for 74 KB of data on loopback), 24 times on
//! Debian's 6.12 (1.85 MB of `sk_wmem_queued` for 79 KB unsent). On TCP that shrinks the peer's
//! window to about 1 KB and the stream crawls at the zero-window probe timer; on UDP the
//! datagrams in flight fill `SO_SNDBUF` at once. With transparent huge pages `always` (Debian's
//! and RHEL's default) any large enough allocation lands on them, so the pool opts out.
//!
//! **Unless asked: [`BufPool::huge`].** A pool that is never registered loses nothing on huge
//! pages and gains much: `MSG_ZEROCOPY` and io_uring's `SEND_ZC` from user memory take a
//! reference on every page of every send (`gup_fast_fallback`: 30% of the samples of a 65000-byte
//! `msg-zc` send into the black hole), and on a huge page that is one atomic reference update per
//! huge page instead of one per 4 KiB page; a copy reads it with fewer TLB misses. Measured with
//! `zerotx bench --huge-pages` (see the README). The kernel's charge for such a send is
//! `PAGE_ALIGN(len + offset)` of the 4 KiB page the send starts in (`__zerocopy_sg_from_iter`),
//! so only io_uring's registration, which merges the huge pages into one segment, overcharges: a
//! huge pool is never registered ([`Sender::register_pool`](crate::Sender::register_pool) answers
//! [`Error::Config`](crate::Error::Config) for `uring-zc`, and `auto` takes it unregistered).
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::SendBuf;

const PAGE: usize = 4096;
static NEXT_REGION: AtomicU64 = AtomicU64::new(1);

struct Inner {
    base: NonNull<u8>,
    layout: Layout,
    /// Bytes mapped from `base` (the blocks, rounded up to whole huge pages for a huge pool).
    mapped: usize,
    /// Made by [`BufPool::huge`].
    huge: bool,
    block: usize,
    count: usize,
    region: u64,
    free: Mutex<Vec<u32>>,
}

// SAFETY: the region is plain memory; each block is reachable through exactly one handle at a
// time (the free list hands an index out once), so sharing `Inner` across threads is sound.
unsafe impl Send for Inner {}
// SAFETY: see Send; the free list is behind a Mutex.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: base and the layout's size are the mapping `map_region` made; every handle holds
        // an Arc<Inner>, so no block is reachable any more. (A registered region is kept alive by
        // the ring's own BufPool clone until the ring is gone.)
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

/// The size of a transparent huge page on x86-64 and arm64 with 4 KiB pages (a PMD).
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// A fresh private anonymous mapping of `len` bytes (zeroed by the kernel), marked before any page
/// is touched: `MADV_NOHUGEPAGE` (see the module docs), or for `huge` `MADV_HUGEPAGE` and aligned
/// to [`HUGE_PAGE`], `len` rounded up to whole huge pages. Returns the mapping and its length.
fn map_region(len: usize, huge: bool) -> std::io::Result<(NonNull<u8>, usize)> {
    let (len, slack) = if huge {
        let len = len
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        (len, HUGE_PAGE)
    } else {
        (len, 0)
    };
    let total = len
        .checked_add(slack)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a new anonymous mapping: no existing memory is named or changed.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let mut base = ptr.cast::<u8>();
    if huge {
        // Keep the aligned `len` bytes and give the slack around them back, so the kernel can map
        // every 2 MiB of the region with one huge page.
        let head = (HUGE_PAGE - (ptr as usize & (HUGE_PAGE - 1))) & (HUGE_PAGE - 1);
        let tail = slack - head;
        // SAFETY: both ranges lie in the mapping just made, which nothing else references; what
        // stays is `[ptr + head, ptr + head + len)`.
        unsafe {
            base = base.add(head);
            if head > 0 {
                libc::munmap(ptr, head);
            }
            if tail > 0 {
                libc::munmap(base.add(len).cast(), tail);
            }
        }
    }
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: the range is exactly the mapping kept, which nothing else references.
    if unsafe { libc::madvise(base.cast(), len, advice) } != 0 {
        let error = std::io::Error::last_os_error();
        // A kernel built without transparent huge pages knows neither advice (`EINVAL`): its pages
        // are small anyway.
        if error.raw_os_error() != Some(libc::EINVAL) {
            // SAFETY: as above; the mapping is dropped unused.
            unsafe { libc::munmap(base.cast(), len) };
            return Err(error);
        }
    }
    if huge {
        // A write fault on each huge page now, so the pool holds huge pages from the start. A
        // read first would map the huge zero page, and before 6.13 the first write to that splits
        // it into small pages (`do_huge_pmd_wp_page`; until khugepaged collapses them again, if
        // it ever does): a block read before it is written (a zero-copy send of a fresh block, or
        // `PoolBufMut`'s deref) would cost the pool its huge pages. It also pays the huge pages'
        // allocation (and compaction, with `defrag` `madvise`) here, not at a send.
        for at in (0..len).step_by(HUGE_PAGE) {
            // SAFETY: `at` < `len`: inside the mapping kept, which nothing else references yet;
            // it is zero, and stays zero.
            unsafe { base.add(at).write_volatile(0) };
        }
    }
    NonNull::new(base)
        .map(|b| (b, len))
        .ok_or_else(|| std::io::Error::other("mmap returned address 0"))
}

/// A pool of `count` page-aligned blocks of `block_size` bytes each (rounded up to whole pages).
///
/// ```
/// use zerotx::BufPool;
///
/// let pool = BufPool::new(64 * 1024, 8)?;
/// let mut block = pool.take().expect("8 blocks free");
/// block[..5].copy_from_slice(b"hello");
/// let buf = block.freeze(5); // immutable: what a Sender takes
/// assert_eq!(&*buf, b"hello");
/// assert_eq!(buf.as_ptr() as usize % 4096, 0);
/// let block = buf.into_mut(); // after the sender gave it back: write again
/// drop(block); // back to the pool
/// assert_eq!(pool.available(), 8);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<Inner>,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("block_size", &self.inner.block)
            .field("count", &self.inner.count)
            .field("available", &self.available())
            .finish()
    }
}

impl BufPool {
    /// Maps the region, zeroed, on small pages (see the module docs). Fails with `InvalidInput`
    /// for a zero size or count, or a region larger than the address space allows, and with the
    /// kernel's answer if `mmap` refuses (`ENOMEM`: address space or overcommit limits).
    pub fn new(block_size: usize, count: usize) -> std::io::Result<Self> {
        Self::map(block_size, count, false)
    }

    /// As [`new`](Self::new), on transparent huge pages: the region is aligned to 2 MiB, rounded
    /// up to whole huge pages and marked `MADV_HUGEPAGE`, so the kernel backs it with huge pages
    /// where it can (unless `/sys/kernel/mm/transparent_hugepage/enabled` says `never`, or memory
    /// is too fragmented; then it has small pages, and works the same).
    ///
    /// For the buffers of `copy`, `msg-zc`, `uring-zc` and `auto` without registration: zero-copy
    /// sends take one page reference per huge page instead of one per 4 KiB (see the module
    /// docs). Each huge page is written once here (the memory stays zero), so the pool holds its
    /// huge pages from the start, whatever is read first: unlike [`new`](Self::new)'s, the whole
    /// pool is resident once made (under memory overcommit, a pool too large for the machine may
    /// meet the OOM killer here rather than an error). Not for
    /// [`Sender::register_pool`](crate::Sender::register_pool): `uring-zc` refuses it (io_uring
    /// would charge each send from it for a whole huge page), and `auto` takes it as unregistered.
    ///
    /// The region is aligned to 2 MiB, the size of a huge page over 4 KiB pages (x86-64, and
    /// arm64 with 4 KiB pages); with larger base pages it works the same on whatever pages the
    /// kernel gives it.
    ///
    /// ```
    /// use zerotx::BufPool;
    ///
    /// let pool = BufPool::huge(64 * 1024, 64)?;
    /// assert!(pool.is_huge());
    /// assert_eq!(pool.region().0 as usize % (2 << 20), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn huge(block_size: usize, count: usize) -> std::io::Result<Self> {
        Self::map(block_size, count, true)
    }

    fn map(block_size: usize, count: usize, huge: bool) -> std::io::Result<Self> {
        let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
        if block_size == 0 || count == 0 || count > u32::MAX as usize {
            return Err(invalid(
                "BufPool needs a block size and a count of at least 1",
            ));
        }
        let block = block_size
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| invalid("BufPool block size too large"))?;
        let total = block
            .checked_mul(count)
            .ok_or_else(|| invalid("BufPool region too large"))?;
        let layout = Layout::from_size_align(total, PAGE)
            .map_err(|_| invalid("BufPool region too large"))?;
        let (base, mapped) = map_region(total, huge).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("BufPool: mmap of {total} bytes failed: {e}"),
            )
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                base,
                layout,
                mapped,
                huge,
                block,
                count,
                region: NEXT_REGION.fetch_add(1, Ordering::Relaxed),
                free: Mutex::new((0..count as u32).rev().collect()),
            }),
        })
    }

    /// A free block to write into, or `None` when all are out.
    pub fn take(&self) -> Option<PoolBufMut> {
        let idx = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()?;
        Some(PoolBufMut {
            block: Block {
                pool: self.inner.clone(),
                idx,
            },
        })
    }

    /// Bytes per block (a multiple of the page size).
    pub fn block_size(&self) -> usize {
        self.inner.block
    }

    /// Blocks in the pool.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Blocks not handed out.
    pub fn available(&self) -> usize {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The whole region: `(address, length)`, for registering it with io_uring once.
    pub fn region(&self) -> (*mut u8, usize) {
        (self.inner.base.as_ptr(), self.inner.layout.size())
    }

    /// Made by [`huge`](Self::huge): asked for huge pages (whether the kernel gave them or not),
    /// and never registered with io_uring.
    pub fn is_huge(&self) -> bool {
        self.inner.huge
    }

    /// A process-unique id for the region, as [`SendBuf::registered`] reports it.
    pub fn region_id(&self) -> u64 {
        self.inner.region
    }
}

struct Block {
    pool: Arc<Inner>,
    idx: u32,
}

impl Block {
    #[inline]
    fn offset(&self) -> usize {
        self.idx as usize * self.pool.block
    }

    #[inline]
    fn ptr(&self) -> *mut u8 {
        // SAFETY: idx < count, so the offset stays inside the allocation.
        unsafe { self.pool.base.as_ptr().add(self.offset()) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.idx);
    }
}

/// A block being written. Derefs to the whole block; [`freeze`](Self::freeze) it to send.
pub struct PoolBufMut {
    block: Block,
}

impl fmt::Debug for PoolBufMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolBufMut(block {})", self.block.idx)
    }
}

impl PoolBufMut {
    /// Makes the first `len` bytes an immutable, sendable buffer. Panics if `len` exceeds the
    /// block size.
    #[inline]
    pub fn freeze(self, len: usize) -> PooledBuf {
        assert!(
            len <= self.block.pool.block,
            "freeze({len}) beyond the pool's block size {}",
            self.block.pool.block
        );
        PooledBuf {
            block: self.block,
            len,
        }
    }
}

impl Deref for PoolBufMut {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the block is in bounds, initialised (zeroed at allocation) and owned by this
        // handle alone.
        unsafe { std::slice::from_raw_parts(self.block.ptr(), self.block.pool.block) }
    }
}

impl DerefMut for PoolBufMut {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; &mut self makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.block.ptr(), self.block.pool.block) }
    }
}

/// An immutable pooled buffer: what a sender takes. Its block returns to the pool on drop.
pub struct PooledBuf {
    block: Block,
    len: usize,
}

impl fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PooledBuf(block {}, {} bytes)", self.block.idx, self.len)
    }
}

impl PooledBuf {
    /// Reopens the block for writing, keeping it out of the pool. Only possible because the
    /// sender gave this value back, which it does only after the kernel released the bytes.
    #[inline]
    pub fn into_mut(self) -> PoolBufMut {
        PoolBufMut { block: self.block }
    }
}

impl AsRef<[u8]> for PooledBuf {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// A pooled buffer as `Bytes`, for code built on the `bytes` crate (hyper bodies, tonic and
/// quinn message builders): `Bytes::from_owner`, no copy. Clones and slices share the block, and
/// the block returns to the pool when the last of them is dropped. Such a `Bytes` is sent like any
/// other (a [`Sender<Bytes>`](crate::Sender)), from user memory: the io_uring engines no longer
/// see that it lies in a registered region, so it goes without `IORING_RECVSEND_FIXED_BUF`.
///
/// ```
/// use bytes::Bytes;
/// use zerotx::BufPool;
///
/// let pool = BufPool::new(4096, 2)?;
/// let mut block = pool.take().expect("a free block");
/// block[..5].copy_from_slice(b"hello");
/// let bytes = Bytes::from(block.freeze(5));
/// let hel = bytes.slice(..3);
/// drop(bytes);
/// assert_eq!(pool.available(), 1, "the slice still holds the block");
/// assert_eq!(&hel[..], b"hel");
/// drop(hel);
/// assert_eq!(pool.available(), 2);
/// # Ok::<(), std::io::Error>(())
/// ```
impl From<PooledBuf> for bytes::Bytes {
    fn from(buf: PooledBuf) -> Self {
        bytes::Bytes::from_owner(buf)
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: len <= block size (checked in freeze); the block is owned by this handle.
        unsafe { std::slice::from_raw_parts(self.block.ptr(), self.len) }
    }
}

// SAFETY: the block lies in a region that lives as long as any handle (Arc) and no other handle
// can reach it; PooledBuf gives out only shared access.
unsafe impl SendBuf for PooledBuf {
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        self
    }

    #[inline]
    fn registered(&self) -> Option<(u64, usize)> {
        Some((self.block.pool.region, self.block.offset()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_page_aligned_distinct_and_return_on_drop() {
        let pool = BufPool::new(5000, 3).unwrap();
        assert_eq!(pool.block_size(), 8192);
        let mut a = pool.take().unwrap();
        let b = pool.take().unwrap();
        let c = pool.take().unwrap();
        assert!(pool.take().is_none());
        a[..4].copy_from_slice(b"abcd");
        let fa = a.freeze(4);
        assert_eq!(&*fa, b"abcd");
        assert_eq!(fa.as_ptr() as usize % PAGE, 0);
        assert_ne!(fa.as_ptr(), b.as_ptr());
        assert_ne!(b.as_ptr(), c.as_ptr());
        drop(b);
        assert_eq!(pool.available(), 1);
        let again = fa.into_mut();
        assert_eq!(pool.available(), 1, "into_mut keeps the block out");
        drop((again, c));
        assert_eq!(pool.available(), 3);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(BufPool::new(0, 1).is_err());
        assert!(BufPool::new(1, 0).is_err());
        assert!(BufPool::new(usize::MAX, 2).is_err());
    }
}
