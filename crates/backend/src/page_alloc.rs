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
//! Soundness: whether a block is large depends only on its layout, and
//! Rust passes `dealloc` and `realloc` the layout the block was allocated
//! with, so every block is freed the way it was allocated; `realloc` of a
//! large block (or into one) allocates anew, copies and frees.
// No FFI, but GlobalAlloc is an unsafe trait and the header is raw memory.
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

// SAFETY: small (or over-aligned) layouts go to `System` unchanged; large
// ones always through `alloc_large` / `dealloc_large` with the same size,
// since `large` is a pure function of the layout Rust hands back to
// `dealloc` and `realloc`. Large blocks are aligned to PAGE ≥ the layout's
// alignment and hold `size` bytes.
unsafe impl GlobalAlloc for PageAlignLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's non-zero size.
        unsafe {
            if large(layout) {
                alloc_large(layout.size(), false)
            } else {
                System.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if large(layout) {
                alloc_large(layout.size(), true)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc*` with this `layout`.
        unsafe {
            if large(layout) {
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
}
