//! A bounds-checked cursor over on-disk bytes (rustls `codec::Reader`
//! style): every read either returns the field or an error, never panics.

use crate::error::{corrupt, Result};

/// Reads fixed-size big-endian fields from a byte slice.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(corrupt(format!("{} is truncated", self.what))),
        }
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A NUL-padded C string field of `n` bytes (must contain a NUL or fill
    /// the field) holding printable ASCII.
    pub(crate) fn cstr(&mut self, n: usize, field: &str) -> Result<String> {
        let raw = self.take(n)?;
        let len = raw.iter().position(|&b| b == 0).unwrap_or(n);
        let s = &raw[..len];
        if !s.iter().all(|b| (0x20..0x7f).contains(b)) {
            return Err(corrupt(format!(
                "{} field {field} is not printable ASCII",
                self.what
            )));
        }
        // Invariant: checked ASCII above, so this is valid UTF-8.
        Ok(String::from_utf8(s.to_vec()).unwrap_or_default())
    }
}

/// Appends a string NUL-padded to `n` bytes (truncating is a caller bug,
/// lengths are validated before).
pub(crate) fn put_cstr(out: &mut Vec<u8>, s: &str, n: usize) {
    let b = s.as_bytes();
    let len = b.len().min(n);
    out.extend_from_slice(&b[..len]);
    out.resize(out.len() + (n - len), 0);
}
