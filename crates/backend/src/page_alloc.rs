//! A global allocator that page-aligns request-sized allocations, so
//! request buffers (`Vec<u8>` from `datapath::bufpool`, the engine's read
//! results, frontends' write payloads) meet O_DIRECT's memory alignment
//! and the file backend transfers them directly instead of through its
//! bounce buffer or ring arena (one memcpy of the whole request less:
//! ~7-10% of a 1 MiB NBD read's CPU, profiled).
//!
//! Which blocks: every one of at least [`LARGE`] bytes, and from [`PAGE`]
//! up every one whose size is a multiple of [`SECTOR`] (a request's
//! length always is; a `String` or a hash table rarely). The small ones
//! matter on a virtio disk: a 4 KiB buffer that starts mid-page spans two
//! pages, so each IO carries two segments, and fio's own io_uring engine
//! with its buffers 512 bytes off a page (`--iomem_align=512`) did 4k
//! QD32 random reads at ~0.88x of page-aligned in one interleaved run.
//!
//! `malloc` returns large blocks 16 bytes past a page boundary (its chunk
//! header) and 4 KiB ones wherever its heap has room, so without this a
//! request's `Vec` is aligned only by chance. A binary opts in with
//! `#[global_allocator] static A: backend::PageAlignLarge = backend::PageAlignLarge;`
//! (the `ucrypt` binary does). Everything else is the system allocator.
//!
//! How: a large block is a plain `malloc` of `size + PAGE + 8` bytes, the
//! returned pointer the first page boundary at least 8 bytes in, and the
//! `malloc` pointer stored in the 8 bytes before it for `dealloc`. Not
//! `posix_memalign`: glibc serves large aligned requests from a fresh
//! `mmap` every time (its dynamic mmap threshold never covers them), so
//! every request buffer the pool did not keep was faulted and zeroed anew
//! (measured: 1M QD8 NBD writes at 0.4x). Plain `malloc` blocks go back to
//! the heap and are reused.
//!
//! Huge blocks: every one of at least [`HUGE`] bytes comes from
//! 2 MiB-aligned anonymous mappings marked `MADV_HUGEPAGE`, so with
//! transparent huge pages at `madvise` (or `always`) it is physically
//! contiguous: a 1 MiB block is one half of a 2 MiB page, a larger one
//! whole 2 MiB pages. Why: a virtio disk takes at most `max_segments`
//! (254 on /dev/vda) segments per request, so a 1 MiB O_DIRECT read into
//! 256 scattered 4 KiB pages goes out as two 512 KiB requests, into one
//! huge page as one 1 MiB request. Freed huge blocks are kept per size
//! (up to [`HUGE_CACHED`] bytes, the rest unmapped), so a request buffer
//! the pool (`datapath::bufpool`) did not keep is not faulted and zeroed
//! anew, which is what made `mmap` per request slow (above).
//!
//! Soundness: whether a block is large depends only on its layout, and
//! Rust passes `dealloc` and `realloc` the layout the block was allocated
//! with, so every block is freed the way it was allocated; `realloc` of a
//! large block (or into one) allocates anew, copies and frees.
// GlobalAlloc is an unsafe trait, the header is raw memory, and huge
// blocks are mapped with mmap/madvise/munmap (libc).
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};

/// Smallest allocation always aligned to [`PAGE`] (`datapath::bufpool`'s
/// smallest pooled buffer).
pub const LARGE: usize = 64 << 10;
/// Blocks of [`PAGE`] to [`LARGE`] bytes are page-aligned when their size
/// is a multiple of this (a sector: every request length is).
pub const SECTOR: usize = 512;
/// The alignment given to large allocations (covers every O_DIRECT
/// memory alignment `statx` reports and the 4096 fallback).
pub const PAGE: usize = 4096;
/// The header before a large block: the address `malloc` returned.
const HDR: usize = std::mem::size_of::<usize>();
/// Smallest allocation backed by transparent huge pages (see the module
/// doc): the request size at which scattered 4 KiB pages exceed a virtio
/// disk's 254 segments, rounded to the pool's class.
pub const HUGE: usize = 1 << 20;
/// A transparent huge page.
const THP: usize = 2 << 20;
/// Most bytes of freed huge blocks kept mapped for reuse.
pub const HUGE_CACHED: usize = 32 << 20;

/// The system allocator, with allocations of at least [`LARGE`] bytes,
/// and sector multiples of at least [`PAGE`], aligned to [`PAGE`].
#[derive(Debug, Default, Clone, Copy)]
pub struct PageAlignLarge;

/// Whether a block of layout `l` is a page-aligned one ("large" below).
fn large(l: Layout) -> bool {
    let n = l.size();
    (n >= LARGE || (n >= PAGE && n % SECTOR == 0)) && l.align() <= PAGE
}

/// The `malloc` layout behind a large block of `size` bytes (`None`: too
/// large to exist).
fn outer(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(PAGE + HDR)?, 1).ok()
}

/// Allocates a large block of `size` bytes (null on failure).
///
/// # Safety
/// `size` is non-zero.
unsafe fn alloc_large(size: usize, zeroed: bool) -> *mut u8 {
    let Some(o) = outer(size) else {
        return std::ptr::null_mut();
    };
    // Below LARGE the block comes from the heap, where `calloc` would
    // clear all PAGE + HDR extra bytes too: clear just `size` after.
    let calloc = zeroed && size >= LARGE;
    // SAFETY: `o` has a non-zero size.
    let raw = unsafe {
        if calloc {
            System.alloc_zeroed(o)
        } else {
            System.alloc(o)
        }
    };
    if raw.is_null() {
        return raw;
    }
    // The first page boundary with room for the header before it; at most
    // PAGE + HDR - 1 bytes in, so `size` bytes fit after it.
    let skip = (raw as usize + HDR).next_multiple_of(PAGE) - raw as usize;
    // SAFETY: `skip` ≤ PAGE + HDR - 1 stays inside the `o.size()` bytes of
    // `raw`'s block; the header's 8 bytes lie between `raw` and `p` and
    // are aligned (p is page-aligned); `size` bytes from `p` are inside
    // the block too, so clearing them is in bounds.
    unsafe {
        let p = raw.add(skip);
        p.sub(HDR).cast::<usize>().write(raw as usize);
        if zeroed && !calloc {
            std::ptr::write_bytes(p, 0, size);
        }
        p
    }
}

/// Frees a block from [`alloc_large`] of `size` bytes.
///
/// # Safety
/// `p` came from `alloc_large(size, _)` and is not used again.
unsafe fn dealloc_large(p: *mut u8, size: usize) {
    // SAFETY: `alloc_large` stored the block's start in the header before
    // `p`; `p` lies `skip` bytes into that block, so stepping back keeps
    // the provenance of the `malloc` allocation.
    unsafe {
        let raw_addr = p.sub(HDR).cast::<usize>().read();
        let raw = p.sub(p as usize - raw_addr);
        if let Some(o) = outer(size) {
            System.dealloc(raw, o);
        }
    }
}

/// A fresh private anonymous read-write mapping of `len` (> 0) bytes at an
/// address the kernel picks, not reserved against swap (`MAP_NORESERVE`);
/// None on failure (errno says why). The huge blocks here and
/// `MemBackend`'s ramdisk both map through it.
pub(crate) fn map_anon(len: usize) -> Option<std::ptr::NonNull<u8>> {
    // SAFETY: a new mapping at an address the kernel picks aliases no
    // existing memory; the arguments are all valid.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    std::ptr::NonNull::new(p.cast::<u8>())
}

/// Huge blocks: 2 MiB-aligned `MADV_HUGEPAGE` mappings, cached by span.
mod huge {
    use super::{Layout, HUGE, HUGE_CACHED, PAGE, THP};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, PoisonError};

    /// Spans cached: slot 0 holds 1 MiB halves of huge pages, slot `n`
    /// blocks of `n` huge pages (up to the engine's 32 MiB request).
    const SLOTS: usize = 17;
    /// Most blocks one slot holds (all of [`HUGE_CACHED`] in halves).
    const DEPTH: usize = HUGE_CACHED / HUGE;
    /// Set in a cached entry whose block is still all zero (never used).
    const ZEROED: usize = 1;

    /// Free blocks of one span, without allocating (this is the
    /// allocator): addresses, [`ZEROED`] or-ed in.
    struct Stack {
        len: usize,
        at: [usize; DEPTH],
    }

    static FREE: [Mutex<Stack>; SLOTS] = [const {
        Mutex::new(Stack {
            len: 0,
            at: [0; DEPTH],
        })
    }; SLOTS];
    /// Bytes held over all slots.
    static CACHED: AtomicUsize = AtomicUsize::new(0);

    /// Whether a block of layout `l` is a huge one.
    pub(super) fn is(l: Layout) -> bool {
        l.size() >= HUGE && l.align() <= PAGE
    }

    /// The bytes a huge block of `size` takes: half a huge page when it
    /// fits, else whole ones (`None`: too large to exist).
    pub(super) fn span(size: usize) -> Option<usize> {
        if size <= HUGE {
            Some(HUGE)
        } else {
            size.checked_next_multiple_of(THP)
        }
    }

    /// The cache slot of blocks of `span` bytes (`None`: not cached).
    fn slot(span: usize) -> Option<usize> {
        let n = if span == HUGE { 0 } else { span / THP };
        (n < SLOTS).then_some(n)
    }

    fn pop(s: usize) -> Option<usize> {
        let mut st = FREE[s].lock().unwrap_or_else(PoisonError::into_inner);
        st.len = st.len.checked_sub(1)?;
        Some(st.at[st.len])
    }

    /// Caches a free block (false: the cache is full, unmap it).
    fn push(s: usize, entry: usize, span: usize) -> bool {
        if CACHED.fetch_add(span, Ordering::Relaxed) + span > HUGE_CACHED {
            CACHED.fetch_sub(span, Ordering::Relaxed);
            return false;
        }
        let mut st = FREE[s].lock().unwrap_or_else(PoisonError::into_inner);
        if st.len == DEPTH {
            drop(st);
            CACHED.fetch_sub(span, Ordering::Relaxed);
            return false;
        }
        let n = st.len;
        st.at[n] = entry;
        st.len += 1;
        true
    }

    /// A new zero-filled mapping of `len` bytes (a multiple of [`THP`])
    /// at a [`THP`] boundary, huge pages asked for (null on failure).
    fn map(len: usize) -> *mut u8 {
        let Some(over) = len.checked_add(THP) else {
            return std::ptr::null_mut();
        };
        let Some(raw) = super::map_anon(over) else {
            return std::ptr::null_mut();
        };
        let raw = raw.as_ptr();
        let head = (raw as usize).next_multiple_of(THP) - raw as usize;
        // SAFETY: `head` < THP, so `p` and its `len` bytes lie inside the
        // `over` bytes just mapped; the head and tail cut off are parts of
        // that mapping nothing refers to. madvise only changes how the
        // range is backed (it fails harmlessly without THP support).
        unsafe {
            let p = raw.add(head);
            if head > 0 {
                libc::munmap(raw.cast(), head);
            }
            if THP - head > 0 {
                libc::munmap(p.add(len).cast(), THP - head);
            }
            libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE);
            p
        }
    }

    /// Allocates a huge block of `size` bytes (null on failure).
    ///
    /// # Safety
    /// `size` ≥ [`HUGE`].
    pub(super) unsafe fn alloc(size: usize, zeroed: bool) -> *mut u8 {
        let Some(span) = span(size) else {
            return std::ptr::null_mut();
        };
        if let Some(s) = slot(span) {
            if let Some(e) = pop(s) {
                CACHED.fetch_sub(span, Ordering::Relaxed);
                let p = (e & !ZEROED) as *mut u8;
                if zeroed && e & ZEROED == 0 {
                    // SAFETY: the cached block holds `span` ≥ `size` bytes.
                    unsafe { std::ptr::write_bytes(p, 0, size) };
                }
                return p;
            }
        }
        if span != HUGE {
            return map(span);
        }
        // A new huge page: its first half now, its second cached (zero).
        let p = map(THP);
        if !p.is_null() {
            // SAFETY: the second half of the THP bytes just mapped.
            let half = unsafe { p.add(HUGE) };
            if !push(0, half as usize | ZEROED, HUGE) {
                // SAFETY: as above; nothing refers to it.
                unsafe { libc::munmap(half.cast(), HUGE) };
            }
        }
        p
    }

    /// Frees a huge block of `size` bytes: cached, or unmapped when the
    /// cache is full (unmapping half a huge page splits it; its other
    /// half stays mapped).
    ///
    /// # Safety
    /// `p` came from `alloc(size, _)` and is not used again.
    pub(super) unsafe fn dealloc(p: *mut u8, size: usize) {
        let Some(span) = span(size) else { return };
        if slot(span).is_some_and(|s| push(s, p as usize, span)) {
            return;
        }
        // SAFETY: `p` is the start of `span` bytes mapped by `alloc`.
        unsafe { libc::munmap(p.cast(), span) };
    }

    /// Bytes of freed huge blocks held for reuse (for tests).
    #[cfg(test)]
    pub(super) fn cached() -> usize {
        CACHED.load(Ordering::Relaxed)
    }
}

// SAFETY: small (or over-aligned) layouts go to `System` unchanged; huge
// ones through `huge::alloc` / `huge::dealloc`, other large ones through
// `alloc_large` / `dealloc_large`, always with the same size, since `huge`
// and `large` are pure functions of the layout Rust hands back to
// `dealloc` and `realloc`. Large blocks are aligned to PAGE ≥ the layout's
// alignment and hold `size` bytes.
unsafe impl GlobalAlloc for PageAlignLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's non-zero size.
        unsafe {
            if huge::is(layout) {
                huge::alloc(layout.size(), false)
            } else if large(layout) {
                alloc_large(layout.size(), false)
            } else {
                System.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if huge::is(layout) {
                huge::alloc(layout.size(), true)
            } else if large(layout) {
                alloc_large(layout.size(), true)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc*` with this `layout`.
        unsafe {
            if huge::is(layout) {
                huge::dealloc(ptr, layout.size())
            } else if large(layout) {
                dealloc_large(ptr, layout.size())
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is
        // a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !large(layout) && !large(new) {
            // SAFETY: `ptr` is System's block of `layout`.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if huge::is(layout) && huge::is(new) && huge::span(layout.size()) == huge::span(new_size) {
            // Same mapping size: the block already holds `new_size` bytes,
            // and `dealloc` with `new` frees it the same way.
            return ptr;
        }
        // SAFETY: `new` has a non-zero size; both blocks are live and
        // distinct, at least min(old, new) bytes long; the old one is then
        // freed with its own layout.
        unsafe {
            let p = self.alloc(new);
            if !p.is_null() {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_page_aligned_and_survive_resizing() {
        let a = PageAlignLarge;
        let paged = |n: usize| n >= LARGE || (n >= PAGE && n % SECTOR == 0);
        for (from, to) in [
            (100, LARGE),
            (LARGE, 1 << 20),
            (1 << 20, 100),
            (3, 7),
            (PAGE, 2 * PAGE),
            (PAGE + 1, PAGE),
            (PAGE, 100),
        ] {
            let l = Layout::from_size_align(from, 1).unwrap();
            // SAFETY: non-zero sizes; each block is written within its
            // size, resized and freed with the layouts it was given.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                if paged(from) {
                    assert_eq!(p as usize % PAGE, 0, "{from}");
                }
                std::ptr::write_bytes(p, 0x5a, from);
                let q = a.realloc(p, l, to);
                assert!(!q.is_null());
                if paged(to) {
                    assert_eq!(q as usize % PAGE, 0, "{from} -> {to}");
                }
                let kept = std::slice::from_raw_parts(q, from.min(to));
                assert!(kept.iter().all(|&b| b == 0x5a), "{from} -> {to}");
                a.dealloc(q, Layout::from_size_align(to, 1).unwrap());
            }
        }
        // Zeroed blocks, large (calloc) and request-sized (cleared here),
        // over a heap that just held non-zero bytes.
        for n in [LARGE, PAGE, 8 * SECTOR + PAGE] {
            let l = Layout::from_size_align(n, 1).unwrap();
            // SAFETY: as above.
            unsafe {
                let dirty = a.alloc(l);
                std::ptr::write_bytes(dirty, 0xee, n);
                a.dealloc(dirty, l);
                let z = a.alloc_zeroed(l);
                assert_eq!(z as usize % PAGE, 0, "{n}");
                assert!(std::slice::from_raw_parts(z, n).iter().all(|&b| b == 0));
                a.dealloc(z, l);
            }
        }
    }
    #[test]
    fn huge_blocks_sit_in_huge_pages_and_are_reused() {
        let a = PageAlignLarge;
        for (n, align) in [
            (HUGE, HUGE),
            (HUGE + 1, THP),
            (3 * THP, THP),
            (40 << 20, THP),
        ] {
            let l = Layout::from_size_align(n, 1).unwrap();
            // SAFETY: non-zero sizes; every block is written within its
            // size and freed with its layout.
            unsafe {
                let p = a.alloc_zeroed(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "{n}");
                let s = std::slice::from_raw_parts_mut(p, n);
                assert!(s.iter().all(|&b| b == 0), "{n}");
                s.fill(0x77);
                a.dealloc(p, l);
                // Reused dirty, cleared again when asked zeroed.
                let q = a.alloc_zeroed(l);
                assert!(std::slice::from_raw_parts(q, n).iter().all(|&b| b == 0));
                // Growing within the same span keeps the block.
                let big = Layout::from_size_align(huge::span(n).unwrap(), 1).unwrap();
                let r = a.realloc(q, l, big.size());
                assert_eq!(r, q, "{n}");
                a.dealloc(r, big);
            }
        }
        assert!(huge::cached() <= HUGE_CACHED);
    }
}
