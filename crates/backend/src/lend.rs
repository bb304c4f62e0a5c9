//! Lending memory page by page under per-page locks: the [`crate::Direct`]
//! half that the ramdisk ([`crate::MemBackend`]) and a file on tmpfs
//! mapped into memory (`file/mapped.rs`) share.
//!
//! Memory is divided into 4 KiB pages and each page has its own
//! `RwLock<()>` (8 bytes per page, 0.2 % of the memory). A lent range is
//! walked in batches of at most [`BATCH_PAGES`] pages: the locks of a
//! batch's pages are taken in ascending order (shared to read, exclusive
//! to write), the batch's bytes are lent as one slice, and the locks are
//! released. One page needs no batch. Everything else that touches the
//! bytes takes the same locks in ascending order, so no cycle of waiters,
//! hence no deadlock, can form.
// FFI-adjacent: slices over raw mapped memory. Every unsafe block has a
// SAFETY note.
#![allow(unsafe_code)]

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Size of the unit that is locked.
pub(crate) const PAGE: usize = 4096;

/// Pages locked at once by a lent batch (2 MiB).
pub(crate) const BATCH_PAGES: usize = 512;

// Batches end on page boundaries, which is what `Direct` promises.
const _: () = assert!(crate::DIRECT_ALIGN as usize == PAGE);

/// One lock per page, guarding that page's bytes.
pub(crate) struct PageLocks(Box<[RwLock<()>]>);

impl PageLocks {
    /// Locks for `pages` pages; `None` when they cannot be allocated.
    pub(crate) fn new(pages: usize) -> Option<Self> {
        let mut v = Vec::new();
        v.try_reserve_exact(pages).ok()?;
        v.extend((0..pages).map(|_| RwLock::new(())));
        Some(Self(v.into_boxed_slice()))
    }

    /// The shared lock of the page holding byte `at`.
    pub(crate) fn read(&self, at: usize) -> RwLockReadGuard<'_, ()> {
        // The locks guard no data of their own, so a poisoned lock (a panic
        // while holding it) leaves nothing broken.
        self.0[at / PAGE].read().unwrap_or_else(|e| e.into_inner())
    }

    /// The exclusive lock of the page holding byte `at`.
    pub(crate) fn write(&self, at: usize) -> RwLockWriteGuard<'_, ()> {
        self.0[at / PAGE].write().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `f(at, in_request, n)` for each batch of `offset..offset+len`
    /// while holding the locks `lock` takes on all of the batch's pages,
    /// taken in ascending order.
    fn for_each_batch<G>(
        offset: u64,
        len: u64,
        lock: impl Fn(usize) -> G,
        mut f: impl FnMut(usize, usize, usize),
    ) {
        let start = offset as usize;
        let end = start + len as usize;
        let mut at = start;
        while at < end {
            let first = at / PAGE;
            let last = ((end - 1) / PAGE).min(first + BATCH_PAGES - 1);
            let batch_end = ((last + 1) * PAGE).min(end);
            if first == last {
                let _g = lock(at);
                f(at, at - start, batch_end - at);
            } else {
                let _g: Vec<G> = (first..=last).map(|p| lock(p * PAGE)).collect();
                f(at, at - start, batch_end - at);
            }
            at = batch_end;
        }
    }

    /// Lends `offset..offset+len` of the memory at `base` for reading, in
    /// batches under their pages' shared locks: `f(offset_in_request,
    /// bytes)`.
    ///
    /// # Safety
    ///
    /// `base..base+offset+len` must be mapped, readable memory that stays
    /// mapped for the call, that these locks cover (one per page from
    /// `base`), and whose bytes nothing in this process writes without
    /// holding the matching page's exclusive lock.
    pub(crate) unsafe fn lend_read(
        &self,
        base: *const u8,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(usize, &[u8]),
    ) {
        Self::for_each_batch(
            offset,
            len,
            |at| self.read(at),
            |at, in_req, n| {
                // SAFETY: the caller's contract: `at..at+n` is mapped and we
                // hold the shared lock of every page it covers, so no writer
                // of this process touches it while the slice lives (it does
                // not outlive this call).
                let piece = unsafe { std::slice::from_raw_parts(base.add(at), n) };
                f(in_req, piece);
            },
        );
    }

    /// Lends `offset..offset+len` of the memory at `base` for writing, in
    /// batches under their pages' exclusive locks.
    ///
    /// # Safety
    ///
    /// As [`PageLocks::lend_read`], and the memory must be writable and
    /// nothing in this process may read or write it without holding the
    /// matching page's lock.
    pub(crate) unsafe fn lend_write(
        &self,
        base: *mut u8,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(usize, &mut [u8]),
    ) {
        Self::for_each_batch(
            offset,
            len,
            |at| self.write(at),
            |at, in_req, n| {
                // SAFETY: the caller's contract: `at..at+n` is mapped and we
                // hold the exclusive lock of every page it covers, so nobody
                // else in this process reads or writes it while this only
                // reference lives (it does not outlive this call).
                let piece = unsafe { std::slice::from_raw_parts_mut(base.add(at), n) };
                f(in_req, piece);
            },
        );
    }
}
