//! `MemBackend`: the built-in ramdisk, the analog of Linux's brd.
//!
//! The device is one private anonymous mapping (`mmap(MAP_PRIVATE |
//! MAP_ANONYMOUS | MAP_NORESERVE)`), so it is page aligned, costs no memory
//! until written, and untouched pages read as the kernel's zero page.
//!
//! # Concurrency
//!
//! There is no global lock. Memory is divided into 4 KiB pages and each page
//! has its own `RwLock<()>` (8 bytes per page, 0.2 % of the device). An
//! operation walks its range page by page: lock the page (shared to read,
//! exclusive to write), copy the part of the request that falls in it,
//! unlock. An uncontended lock is one atomic compare-and-swap and one atomic
//! subtract, small next to copying up to 4 KiB, and requests on different
//! pages never touch the same lock. Overlapping requests therefore never race
//! on a byte (no data race in the Rust memory model: every access to a page's
//! bytes happens while its lock is held in the matching mode), and each page
//! is updated atomically, which is more than a disk promises (sector
//! atomicity); a multi-page request is not atomic as a whole, exactly as with
//! a disk.
//!
//! Discard and write-zeroes take the exclusive locks of a batch of pages in
//! ascending order (at most [`BATCH_PAGES`] at once), release whole pages with
//! `madvise(MADV_DONTNEED)` (they then read as zero and free their memory)
//! and `memset` the partial pages at either end. Ordinary reads and writes
//! hold one lock at a time and batches are taken in ascending order, so no
//! cycle of waiters, hence no deadlock, can form.
//!
//! [`Direct`] access (the data path's fused crypto) takes a batch's locks
//! the same way, shared to read and exclusive to write, in ascending order,
//! and lends the batch's bytes as one slice; one page needs no batch
//! (`lend.rs`, shared with a mapped file on tmpfs).
//!
//! FUA and flush are no-ops: memory is as durable as this device gets.
// FFI: the ramdisk's anonymous mapping. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::io;
use std::ptr::NonNull;

use crate::lend::{PageLocks, BATCH_PAGES, PAGE};
use crate::{check_range, Backend, Caps, Direct, Error, ErrorKind};

/// The built-in ramdisk: page-aligned anonymous memory with per-page locks.
pub struct MemBackend {
    /// Start of the mapping; dangling (and never dereferenced) when size is 0.
    base: NonNull<u8>,
    /// Device size in bytes (the mapping is rounded up to whole pages).
    size: u64,
    /// Length of the mapping in bytes, 0 when nothing is mapped.
    map_len: usize,
    /// One lock per page of the mapping, guarding that page's bytes.
    pages: PageLocks,
}

// SAFETY: `base` points to a mapping owned exclusively by this value (created
// in `new`, unmapped only in `drop`), so moving the value to another thread
// moves sole ownership of the memory with it.
unsafe impl Send for MemBackend {}
// SAFETY: shared access from several threads only reads or writes the mapped
// bytes through raw pointers while holding the lock of the page those bytes
// belong to, shared for reads and exclusive for writes/madvise (see
// `for_each_page` and `zero_range`); so no two threads race on a byte.
unsafe impl Sync for MemBackend {}

impl MemBackend {
    /// A zero-filled ramdisk of `size` bytes.
    pub fn new(size: u64) -> io::Result<Self> {
        let alloc_err = || Error::new(ErrorKind::Alloc { size });
        let map_len = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(PAGE))
            .ok_or_else(alloc_err)?;
        let base = if map_len == 0 {
            NonNull::dangling()
        } else {
            match crate::page_alloc::map_anon(map_len) {
                Some(p) => p,
                None => return Err(alloc_err().with_source(io::Error::last_os_error()).into()),
            }
        };
        let Some(pages) = PageLocks::new(map_len / PAGE) else {
            if map_len > 0 {
                // SAFETY: mapped just above with this length, never shared.
                unsafe { libc::munmap(base.as_ptr().cast(), map_len) };
            }
            return Err(alloc_err().into());
        };
        Ok(Self {
            base,
            size,
            map_len,
            pages,
        })
    }

    /// Calls `f(page_offset_in_device, offset_in_buf, len)` for each piece of
    /// `offset..offset+len` that falls in one page, in ascending order.
    fn for_each_page(offset: u64, len: usize, mut f: impl FnMut(usize, usize, usize)) {
        // Callers checked the range, so offset + len <= size <= usize::MAX.
        let mut at = offset as usize;
        let end = at + len;
        while at < end {
            let n = (PAGE - at % PAGE).min(end - at);
            f(at, at - offset as usize, n);
            at += n;
        }
    }

    /// Zeroes `offset..offset+len` (range already checked).
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut at = offset as usize;
        let end = at + len as usize;
        while at < end {
            let first_page = at / PAGE;
            let last_page = ((end - 1) / PAGE).min(first_page + BATCH_PAGES - 1);
            let batch_end = ((last_page + 1) * PAGE).min(end);
            let _guards: Vec<_> = (first_page..=last_page)
                .map(|p| self.pages.write(p * PAGE))
                .collect();
            // Whole pages inside [at, batch_end) go back to the kernel.
            let whole_start = at.next_multiple_of(PAGE);
            let whole_end = batch_end - batch_end % PAGE;
            if whole_start < whole_end {
                // SAFETY: [whole_start, whole_end) lies inside the mapping (the
                // range was checked against size and the mapping covers it
                // rounded up to pages), is page aligned, and we hold the
                // exclusive lock of every page in it, so no other thread is
                // reading or writing those bytes while they are dropped.
                let r = unsafe {
                    libc::madvise(
                        self.base.as_ptr().add(whole_start).cast(),
                        whole_end - whole_start,
                        libc::MADV_DONTNEED,
                    )
                };
                if r != 0 {
                    return Err(io::Error::last_os_error());
                }
                self.memset_zero(at, whole_start - at);
                self.memset_zero(whole_end, batch_end - whole_end);
            } else {
                self.memset_zero(at, batch_end - at);
            }
            at = batch_end;
        }
        Ok(())
    }

    /// Writes zeroes to `at..at+n`; the caller holds the pages' write locks.
    fn memset_zero(&self, at: usize, n: usize) {
        if n > 0 {
            // SAFETY: at+n <= size <= map_len (checked range), and the caller
            // holds the exclusive lock of every page in it.
            unsafe { std::ptr::write_bytes(self.base.as_ptr().add(at), 0, n) };
        }
    }
}

impl Drop for MemBackend {
    fn drop(&mut self) {
        if self.map_len > 0 {
            // SAFETY: the mapping was created in `new` with this length; `&mut
            // self` proves no other reference can still use it.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
        }
    }
}

impl std::fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemBackend")
            .field("size", &self.size)
            .finish()
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn io_path(&self) -> crate::IoPath {
        crate::IoPath {
            engine: "memory".into(),
            ..crate::IoPath::default()
        }
    }

    fn caps(&self) -> Caps {
        Caps {
            can_discard: true,
            can_fua: true,
            can_write_zeroes: true,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        let dst = buf.as_mut_ptr();
        Self::for_each_page(offset, buf.len(), |at, in_buf, n| {
            let _g = self.pages.read(at);
            // SAFETY: `at..at+n` is inside one page of the mapping (checked
            // range) whose shared lock we hold, so no writer touches it; the
            // destination is `buf[in_buf..in_buf+n]`, exclusively borrowed
            // for this call, and cannot overlap the mapping because no
            // reference to the mapping ever leaves this type.
            unsafe {
                std::ptr::copy_nonoverlapping(self.base.as_ptr().add(at), dst.add(in_buf), n)
            };
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::for_each_page(offset, buf.len(), |at, in_buf, n| {
            let _g = self.pages.write(at);
            // SAFETY: `at..at+n` is inside one page of the mapping (checked
            // range) whose exclusive lock we hold, so nobody else reads or
            // writes it; the source is `buf[in_buf..in_buf+n]`, borrowed for
            // this call and disjoint from the mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    buf.as_ptr().add(in_buf),
                    self.base.as_ptr().add(at),
                    n,
                )
            };
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn direct(&self) -> Option<&dyn Direct> {
        Some(self)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.zero_range(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.zero_range(offset, len)
    }
}

impl Direct for MemBackend {
    fn read_with(&self, offset: u64, len: u64, f: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        // SAFETY: the range is inside the mapping (checked against size,
        // which the mapping covers), which lives as long as `self`; every
        // access to its bytes holds the page's lock (`pages`, one per page).
        unsafe { self.pages.lend_read(self.base.as_ptr(), offset, len, f) };
        Ok(())
    }

    fn write_with(
        &self,
        offset: u64,
        len: u64,
        _fua: bool,
        f: &mut dyn FnMut(usize, &mut [u8]),
    ) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        // SAFETY: as in `read_with`; the anonymous mapping is writable.
        unsafe { self.pages.lend_write(self.base.as_ptr(), offset, len, f) };
        Ok(())
    }
}
