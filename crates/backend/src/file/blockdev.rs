//! Block-device specifics: size and logical block size ioctls (and
//! `FileBackend::refresh_size`, for files too), whether the
//! device discards, and BLKDISCARD / BLKZEROOUT on logical-block-aligned
//! ranges (the unaligned edges are zeroed with writes).
// FFI: block-device ioctls. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::{sync::cvt_retry, FileBackend};
use crate::emulate_write_zeroes;

// Block-device ioctls (linux/fs.h), not all exported by the libc crate.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
pub(super) const BLKDISCARD: libc::c_ulong = 0x1277;
pub(super) const BLKZEROOUT: libc::c_ulong = 0x127f;

impl FileBackend {
    /// Re-reads the file's (or block device's) size, as `losetup -c` does
    /// for a loop device, and returns it: a live `resize` sees a grown
    /// file without reopening it (a second open would meet our own lock).
    pub fn refresh_size(&self) -> io::Result<u64> {
        let size = if self.is_blockdev {
            blockdev_size(&self.buffered)?
        } else {
            self.buffered.metadata()?.len()
        };
        self.size.store(size, Ordering::Relaxed);
        Ok(size)
    }

    pub(super) fn blk_ioctl(&self, req: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
        let range = [offset, len];
        let fd = self.buffered.as_raw_fd();
        // SAFETY: BLKDISCARD/BLKZEROOUT read a `u64[2]` that lives on this
        // stack frame for the whole (synchronous) call.
        cvt_retry(|| unsafe { libc::ioctl(fd, req as _, range.as_ptr()) as isize }).map(drop)
    }

    /// Block-device ranges must be logical-block aligned; returns the
    /// aligned inner range and the unaligned ends to be zeroed by writes.
    pub(super) fn split_blk(&self, offset: u64, len: u64) -> (u64, u64) {
        let a = blockdev_logical_block(&self.buffered).unwrap_or(512);
        let start = offset.next_multiple_of(a);
        let end = (offset + len) / a * a;
        if start < end {
            (start, end)
        } else {
            (offset, offset)
        }
    }

    /// Zeroes the parts of `offset..offset+len` outside `inner` with writes.
    pub(super) fn zero_edges(&self, offset: u64, len: u64, inner: (u64, u64)) -> io::Result<()> {
        if inner.0 == inner.1 {
            return emulate_write_zeroes(self, offset, len);
        }
        emulate_write_zeroes(self, offset, inner.0 - offset)?;
        emulate_write_zeroes(self, inner.1, offset + len - inner.1)
    }
}

pub(super) fn blockdev_size(f: &File) -> io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer, which is valid.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut size) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

pub(super) fn blockdev_logical_block(f: &File) -> Option<u64> {
    let mut bs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int to the pointer, which is valid.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKSSZGET as _, &mut bs) };
    (r >= 0 && bs > 0).then_some(bs as u64)
}

/// True unless sysfs says the device cannot discard (unknown → try it).
pub(super) fn blockdev_discards(f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = f.metadata() else { return true };
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let p = format!("/sys/dev/block/{major}:{minor}/queue/discard_max_bytes");
    match std::fs::read_to_string(p) {
        Ok(s) => s.trim().parse::<u64>().map_or(true, |n| n > 0),
        Err(_) => true,
    }
}
