//! Discards and zeroed ranges on a file or block device: the kernel's own
//! (`fallocate` punch/zero range, `BLKDISCARD`, `BLKZEROOUT`) while it
//! takes them, remembered per backend when it refuses, then written
//! zeroes.

use std::io;
use std::sync::atomic::Ordering;

use super::blockdev::{BLKDISCARD, BLKZEROOUT};
use super::FileBackend;
use crate::{check_range, emulate_write_zeroes, Backend};

impl FileBackend {
    /// [`Backend::discard`]: a hole punched or the device's discard, falling
    /// back to zeroes where the kernel refuses either.
    pub(super) fn discard_range(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.check_writable()?;
        if len == 0 {
            return Ok(());
        }
        if self.discard_ok.load(Ordering::Relaxed) {
            let r = if self.is_blockdev {
                let inner = self.split_blk(offset, len);
                if inner.0 == inner.1 {
                    // Less than one logical block: nothing to discard; the
                    // trait promises zeroes, so zero it.
                    return self.zero_range(offset, len);
                }
                self.blk_ioctl(BLKDISCARD, inner.0, inner.1 - inner.0)
                    .and_then(|()| self.zero_edges(offset, len, inner))
            } else {
                self.fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
            };
            match r {
                Ok(()) => {
                    self.stats.discards.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if is_unsupported(&e) => self.discard_ok.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        self.zero_range(offset, len)
    }

    /// [`Backend::write_zeroes`]: `BLKZEROOUT` or a zeroed range (falling
    /// back to a punched hole, then to written zeroes).
    pub(super) fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.check_writable()?;
        if len == 0 {
            return Ok(());
        }
        if self.is_blockdev {
            let inner = self.split_blk(offset, len);
            if inner.0 != inner.1 && self.zero_range_ok.load(Ordering::Relaxed) {
                match self.blk_ioctl(BLKZEROOUT, inner.0, inner.1 - inner.0) {
                    Ok(()) => {
                        self.stats.zeroes.fetch_add(1, Ordering::Relaxed);
                        return self.zero_edges(offset, len, inner);
                    }
                    Err(e) if is_unsupported(&e) => {
                        self.zero_range_ok.store(false, Ordering::Relaxed)
                    }
                    Err(e) => return Err(e),
                }
            }
            return emulate_write_zeroes(self, offset, len);
        }
        for (flag, ok) in [
            (libc::FALLOC_FL_ZERO_RANGE, &self.zero_range_ok),
            (libc::FALLOC_FL_PUNCH_HOLE, &self.punch_ok),
        ] {
            if !ok.load(Ordering::Relaxed) {
                continue;
            }
            match self.fallocate(flag | libc::FALLOC_FL_KEEP_SIZE, offset, len) {
                Ok(()) => {
                    self.stats.zeroes.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if is_unsupported(&e) => ok.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        emulate_write_zeroes(self, offset, len)
    }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS | libc::EINVAL)
    )
}
