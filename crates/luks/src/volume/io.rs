//! File helpers shared by the volume operations: open, size, positioned
//! read/write, sync, zeroing, and the crash-safe LUKS2 header write.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::luks2;

pub(super) fn device_size(f: &mut File, path: &Path) -> Result<u64> {
    f.seek(SeekFrom::End(0))
        .map_err(|e| Error::io(format!("Cannot size {}", path.display()), e))
}

pub(super) fn open_ro(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io(format!("Cannot open {}", path.display()), e))
}

pub(super) fn open_rw(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("Cannot open {} for writing", path.display()), e))
}

pub(super) fn write_at(f: &mut File, off: u64, buf: &[u8]) -> Result<()> {
    f.seek(SeekFrom::Start(off))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    f.write_all(buf)
        .map_err(|e| Error::io("Cannot write the header device", e))
}

pub(super) fn read_exact_at(f: &mut File, off: u64, buf: &mut [u8]) -> Result<()> {
    f.seek(SeekFrom::Start(off))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    f.read_exact(buf)
        .map_err(|e| Error::io("Cannot read keyslot material", e))
}

pub(super) fn sync(f: &File) -> Result<()> {
    f.sync_all()
        .map_err(|e| Error::io("Cannot flush the header device", e))
}

/// Overwrites `[off, off+len)` with zeros in 1 MiB chunks.
pub(super) fn zero_range(f: &mut File, off: u64, len: u64) -> Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        write_at(f, off + done, &chunk[..n])?;
        done += n as u64;
    }
    Ok(())
}

/// Writes both LUKS2 copies with seqid + 1: secondary, sync, primary, sync.
pub(super) fn write_luks2(f: &mut File, h: &mut luks2::Header) -> Result<()> {
    h.bin.seqid += 1;
    h.meta.validate(h.bin.hdr_size)?;
    let (p, s) = h.to_copies()?;
    write_at(f, h.bin.hdr_size, &s)?;
    sync(f)?;
    write_at(f, 0, &p)?;
    sync(f)
}
