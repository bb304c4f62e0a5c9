//! Storage backends: where ciphertext lives.
//!
//! SKELETON: the data-path owner replaces this with mem (page-aligned
//! anonymous memory), file (io_uring) and fault backends.

use std::io;
use std::sync::Mutex;

/// What a backend can do natively; the data path emulates the rest.
#[derive(Debug, Clone, Copy, Default)]
pub struct Caps {
    /// Discard (TRIM / punch hole) is supported.
    pub can_discard: bool,
    /// Forced unit access writes are supported natively.
    pub can_fua: bool,
    /// Efficient zeroing is supported natively.
    pub can_write_zeroes: bool,
}

/// A byte-addressed storage device.
pub trait Backend: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Native capabilities.
    fn caps(&self) -> Caps;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`; durable on return when `fua`.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
}

/// The built-in ramdisk (skeleton: a mutex-protected Vec).
pub struct MemBackend {
    data: Mutex<Vec<u8>>,
}

impl MemBackend {
    /// A zero-filled ramdisk of `size` bytes.
    pub fn new(size: u64) -> io::Result<Self> {
        Ok(Self { data: Mutex::new(vec![0; size as usize]) })
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn caps(&self) -> Caps {
        Caps { can_discard: true, can_fua: true, can_write_zeroes: true }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.data.lock().unwrap();
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        let mut d = self.data.lock().unwrap();
        let o = offset as usize;
        d[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}
