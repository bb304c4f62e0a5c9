//! A regular file on tmpfs lent through a shared mapping, so the data
//! path's fused crypto ([`crate::Direct`]) works on it as on the ramdisk.
//!
//! On tmpfs the page cache is the file: a `pwrite` is a copy into it
//! (done on an io-wq worker thread for io_uring, since tmpfs takes no
//! nowait IO), a `pread` a copy out of it. Mapped, the adaptive mode
//! encrypts a write straight into the file's pages and decrypts a read
//! straight out of them: one pass instead of a copy plus a pass (NBD 1M
//! QD8 on 2 CPUs, the server's CPU per GiB fell by a third in a scratch
//! build that served the ramdisk instead of the file). Inline and classic
//! keep `pread`/`pwrite` on purpose, as dm-crypt over a loop device does.
//!
//! Only tmpfs (checked with `fstatfs` at open), only with the automatic IO
//! engine (an explicit `--io-engine` keeps its syscalls), and only the
//! size at open: a range past it (the file grew) is read and written with
//! syscalls. There is nothing to write back: `fdatasync` on tmpfs is what
//! it always was, and FUA needs nothing more than the store itself.
//!
//! A read through the mapping of a hole in a sparse file would allocate
//! the page (tmpfs fills a hole on a fault, where `pread` returns zeroes
//! and allocates nothing): reading a large sparse image would fill the
//! memory, and fail once tmpfs is full. So a read is lent only over pages
//! known to hold data: one bit per page, set by lent writes and by a
//! `SEEK_DATA`/`SEEK_HOLE` probe of a range not yet known, cleared for the
//! whole pages of a discard or write-zeroes. A range with a hole is read
//! with `pread`, as before.
//!
//! The mapping is `memmap2`'s; lending takes the per-page locks of
//! `lend.rs`, as the ramdisk does. What a `pread` or `pwrite` would report
//! as an error (the file truncated under us, a hole that a full tmpfs
//! cannot fill) is a SIGBUS on a mapping: `sigbus.rs` turns it into an IO
//! error of the request that faulted, and the backend stops lending
//! (every later request takes the syscalls, which report the real error).
// FFI: fstatfs, and slices over the mapping (through `lend`). Every unsafe
// block has a SAFETY note.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::sigbus::Guard;
use crate::lend::{PageLocks, PAGE};

/// The lent mapping of a file on tmpfs.
pub(super) struct Mapped {
    // Unregistered before the mapping is unmapped (fields drop in order).
    guard: Guard,
    map: memmap2::MmapRaw,
    /// Bytes mapped: the file's size at open.
    len: u64,
    pages: PageLocks,
    /// One bit per page: known to hold data, so a lent read allocates
    /// nothing.
    known: Box<[AtomicU64]>,
    writable: bool,
    /// Requests lent (for `status`).
    pub(super) lent: AtomicU64,
}

/// Whether a request was served from the mapping, or must take syscalls.
pub(super) enum Lent {
    Done,
    NotMapped,
}

impl Mapped {
    /// Maps `file` (of `len` bytes) when it lives on tmpfs; `None`
    /// otherwise, or when the mapping or its guard cannot be had.
    pub(super) fn new(file: &File, len: u64, writable: bool) -> Option<Self> {
        if len == 0 || !on_tmpfs(file) {
            return None;
        }
        let n = usize::try_from(len).ok()?;
        let mut o = memmap2::MmapOptions::new();
        o.len(n);
        let map = if writable {
            o.map_raw(file)
        } else {
            o.map_raw_read_only(file)
        }
        .ok()?;
        let pages = n.div_ceil(PAGE);
        let words = pages.div_ceil(64);
        let mut known = Vec::new();
        known.try_reserve_exact(words).ok()?;
        known.extend((0..words).map(|_| AtomicU64::new(0)));
        let pages = PageLocks::new(pages)?;
        let guard = Guard::register(map.as_ptr() as usize, n.next_multiple_of(PAGE))?;
        Some(Self {
            guard,
            map,
            len,
            pages,
            known: known.into_boxed_slice(),
            writable,
            lent: AtomicU64::new(0),
        })
    }

    /// Whether `offset..offset+len` (inside the device) can be lent now.
    fn covers(&self, offset: u64, len: u64) -> bool {
        !self.guard.broken() && offset.checked_add(len).is_some_and(|e| e <= self.len)
    }

    /// Whether every page of `first..=last` is known to hold data.
    fn all_known(&self, first: usize, last: usize) -> bool {
        (first..=last).all(|p| self.known[p / 64].load(Ordering::Relaxed) & (1 << (p % 64)) != 0)
    }

    /// Marks pages `first..=last` as known (`true`) or not.
    fn set_known(&self, first: usize, last: usize, known: bool) {
        let mut p = first;
        while p <= last {
            let w = p / 64;
            let hi = last.min(w * 64 + 63);
            let bits = (u64::MAX >> (63 - (hi - p))) << (p % 64);
            if known {
                self.known[w].fetch_or(bits, Ordering::Relaxed);
            } else {
                self.known[w].fetch_and(!bits, Ordering::Relaxed);
            }
            p = hi + 1;
        }
    }

    /// The pages `offset..offset+len` (non-empty) touches.
    fn page_span(offset: u64, len: u64) -> (usize, usize) {
        (
            (offset / PAGE as u64) as usize,
            ((offset + len - 1) / PAGE as u64) as usize,
        )
    }

    /// True when every page of `offset..offset+len` holds data: known, or
    /// found by a probe of the file (then remembered, with the rest of
    /// the data extent the probe found).
    fn holds_data(&self, file: &File, offset: u64, len: u64) -> bool {
        let (first, last) = Self::page_span(offset, len);
        if self.all_known(first, last) {
            return true;
        }
        let start = (first * PAGE) as u64;
        let end = (((last + 1) * PAGE) as u64).min(self.len);
        let seek = |whence| {
            // SAFETY: lseek on a descriptor we own; it only moves the file
            // position, which nothing else here uses (all IO is positioned).
            unsafe { libc::lseek(file.as_raw_fd(), start as libc::off_t, whence) }
        };
        if seek(libc::SEEK_DATA) != start as libc::off_t {
            return false;
        }
        // The whole data extent from here is remembered, not just this
        // range: on a filled image the first probe covers it all.
        let hole = seek(libc::SEEK_HOLE);
        if hole <= start as libc::off_t {
            return false;
        }
        let extent_end = (hole as u64).min(self.len);
        self.set_known(first, ((extent_end - 1) / PAGE as u64) as usize, true);
        extent_end >= end
    }

    /// Forgets the whole pages of `offset..offset+len`: a discard or
    /// write-zeroes may have punched them out.
    pub(super) fn forget(&self, offset: u64, len: u64) {
        let first = offset.div_ceil(PAGE as u64) as usize;
        let end = ((offset + len).min(self.len) / PAGE as u64) as usize;
        if first < end {
            self.set_known(first, end - 1, false);
        }
    }

    /// The error of a request whose lent range faulted.
    fn faulted(&self, path: &std::path::Path, offset: u64, len: u64) -> io::Error {
        crate::Error::new(crate::ErrorKind::Io {
            path: path.display().to_string(),
        })
        .with_source(io::Error::from_raw_os_error(libc::EIO))
        .with_context(format!(
            "the mapped file faulted (SIGBUS) at offset {offset} length {len}: \
             truncated under us, or its filesystem is full"
        ))
        .into()
    }

    /// Lends `offset..offset+len` for reading (range already checked
    /// against the device).
    pub(super) fn read_with(
        &self,
        file: &File,
        path: &std::path::Path,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<Lent> {
        if len == 0 || !self.covers(offset, len) || !self.holds_data(file, offset, len) {
            return Ok(Lent::NotMapped);
        }
        // SAFETY: `offset..offset+len` lies inside the mapping (`covers`),
        // which lives as long as `self`; this process touches its bytes
        // only here and in `write_with`, under the page locks. A fault
        // (truncation, a full tmpfs) is caught by the guard and reported
        // below.
        unsafe { self.pages.lend_read(self.map.as_ptr(), offset, len, f) };
        if self.guard.broken() {
            return Err(self.faulted(path, offset, len));
        }
        self.lent.fetch_add(1, Ordering::Relaxed);
        Ok(Lent::Done)
    }

    /// Lends `offset..offset+len` for writing (range checked, backend
    /// writable).
    pub(super) fn write_with(
        &self,
        path: &std::path::Path,
        offset: u64,
        len: u64,
        f: &mut dyn FnMut(usize, &mut [u8]),
    ) -> io::Result<Lent> {
        if len == 0 || !self.writable || !self.covers(offset, len) {
            return Ok(Lent::NotMapped);
        }
        // SAFETY: as in `read_with`; the mapping is shared and writable.
        unsafe { self.pages.lend_write(self.map.as_mut_ptr(), offset, len, f) };
        if self.guard.broken() {
            return Err(self.faulted(path, offset, len));
        }
        let (first, last) = Self::page_span(offset, len);
        self.set_known(first, last, true);
        self.lent.fetch_add(1, Ordering::Relaxed);
        Ok(Lent::Done)
    }
}

/// True when `file` lives on tmpfs.
fn on_tmpfs(file: &File) -> bool {
    // SAFETY: all-zero is a valid statfs, filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a statfs on this stack.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    r == 0 && st.f_type == libc::TMPFS_MAGIC
}
