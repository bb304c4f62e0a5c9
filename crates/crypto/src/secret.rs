//! Key material in locked, non-dumpable memory: [`Secret`], a byte buffer
//! on pages of its own.
//!
//! ```text
//!  Secret::with_capacity(n)
//!    mmap(round_up(n, page), anonymous, private)   pages nobody else shares
//!    madvise(MADV_DONTDUMP)                        left out of core dumps ("dd" in smaps)
//!    madvise(MADV_WIPEONFORK)                      a forked child sees zeros
//!    mlock                                         never written to swap (VmLck)
//!  drop: zeroize every mapped byte, munlock, munmap
//! ```
//!
//! Every copy of a key ucrypt keeps — master keys, derived keys,
//! passphrases, and each hex-formatted table line — lives in a [`Secret`].
//! Growing one maps a larger region, copies, and wipes and unmaps the old
//! one, so no stale copy is left behind in freed heap memory the way a
//! reallocating `Vec` or `String` leaves one.
//!
//! Why a small allocator of our own rather than a crate: `secrets` links
//! libsodium (a C library the build would have to find), `region` has no
//! `MADV_DONTDUMP`, and `memsec`'s `mlock` is meant for arbitrary heap
//! addresses, where a page is shared with unrelated allocations (locks do
//! not nest: unlocking one secret unlocks its neighbours) while its guarded
//! `malloc` is a raw-pointer API that needs the same wrapper as this one
//! and spends three extra pages per secret against `RLIMIT_MEMLOCK`. One
//! mapping per secret keeps every page owned by exactly one buffer, and the
//! unsafe code is the four system calls below.
//!
//! `mlock` may fail (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`): the buffer is
//! then still private, non-dumpable and wiped on drop, and the process
//! prints one warning on stderr and goes on, as cryptsetup does.
//!
//! What stays outside: the expanded AES key schedules inside OpenSSL's
//! cipher contexts and the pure-Rust cipher structs (wiped on drop by their
//! owners, but on the ordinary heap), and the transient
//! [`CryptConfig`](crate::CryptConfig) key copy a cipher is built from.
#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use zeroize::{Zeroize, Zeroizing};

/// A growable byte buffer on locked (`mlock`), non-dumpable
/// (`MADV_DONTDUMP`) pages of its own, zeroized before they are unmapped.
///
/// It dereferences to `[u8]`; [`io::Write`] and [`fmt::Write`] append to
/// it, so a key can be formatted straight into it (`write!(secret, …)`
/// allocates nothing on the heap). `Debug` never shows the bytes.
pub struct Secret {
    /// Start of the mapping (dangling while `cap == 0`).
    ptr: NonNull<u8>,
    /// Bytes in use.
    len: usize,
    /// Bytes mapped (a multiple of the page size; 0 = nothing mapped).
    cap: usize,
    /// Whether `mlock` succeeded on the mapping.
    locked: bool,
}

// SAFETY: a `Secret` owns its mapping exclusively, like a `Box<[u8]>`:
// nothing else holds the pointer, and `&Secret` only gives out `&[u8]`.
unsafe impl Send for Secret {}
// SAFETY: as above; shared references allow reads only.
unsafe impl Sync for Secret {}

impl Secret {
    /// An empty buffer; maps nothing until bytes are added.
    pub const fn new() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
            locked: false,
        }
    }

    /// An empty buffer with room for at least `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        let mut s = Self::new();
        s.reserve(n);
        s
    }

    /// `n` zero bytes (e.g. a buffer a KDF or a decryption fills in).
    pub fn zeroed(n: usize) -> Self {
        let mut s = Self::with_capacity(n);
        // Fresh anonymous pages are zero-filled.
        s.len = n;
        s
    }

    /// A copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut s = Self::with_capacity(bytes.len());
        s.extend_from_slice(bytes);
        s
    }

    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no bytes are in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes that fit without mapping a larger region.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Whether the pages are locked in memory (false while nothing is
    /// mapped, or when `mlock` was refused).
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Address of the first byte (for tests that look the page up in
    /// `/proc/self/smaps`).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The bytes as UTF-8 text, if they are.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(self).ok()
    }

    /// Makes room for `additional` more bytes. Moving to a larger mapping
    /// copies the bytes and wipes the old one.
    pub fn reserve(&mut self, additional: usize) {
        let need = self
            .len
            .checked_add(additional)
            .expect("secret buffer size overflows usize");
        if need <= self.cap {
            return;
        }
        let want = need.max(self.cap.saturating_mul(2));
        let mut bigger = Region::map(want);
        let len = self.len;
        bigger.bytes_mut()[..len].copy_from_slice(self);
        // The old mapping is wiped and unmapped as it drops here.
        *self = bigger.into_secret(len);
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        let len = self.len;
        // Capacity reserved above; `spare` covers `len..cap`.
        self.spare()[..bytes.len()].copy_from_slice(bytes);
        self.len = len + bytes.len();
    }

    /// Appends one byte.
    pub fn push(&mut self, b: u8) {
        self.extend_from_slice(&[b]);
    }

    /// Appends `bytes` as lowercase hex (two digits per byte).
    pub fn push_hex(&mut self, bytes: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        self.reserve(bytes.len() * 2);
        for &b in bytes {
            self.push(DIGITS[usize::from(b >> 4)]);
            self.push(DIGITS[usize::from(b & 15)]);
        }
    }

    /// Decodes `hex` (even length, hex digits) into a new secret; `None`
    /// if it is not hex. Nothing is copied outside the result.
    pub fn from_hex(hex: &[u8]) -> Option<Self> {
        if hex.len() % 2 != 0 {
            return None;
        }
        let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut out = Self::zeroed(hex.len() / 2);
        for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *o = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Some(out)
    }

    /// Shortens to `len` bytes, wiping the rest.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            let old = self.len;
            self.len = len;
            self.spare()[..old - len].zeroize();
        }
    }

    /// Empties the buffer, wiping its bytes (the pages stay mapped).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Reads `input` to its end (at most `max` bytes; more is an
    /// [`io::ErrorKind::InvalidData`] error) straight into locked pages.
    pub fn read_from(mut input: impl io::Read, max: usize) -> io::Result<Self> {
        let mut s = Self::with_capacity(4096.min(max.saturating_add(1)));
        loop {
            if s.len == s.cap {
                s.reserve(1);
            }
            let n = match input.read(s.spare()) {
                Ok(0) => return Ok(s),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            s.len += n;
            if s.len > max {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("more than {max} bytes"),
                ));
            }
        }
    }

    /// Reads standard input to its end (at most `max` bytes) into locked
    /// pages, through a duplicate of fd 0: `std::io::Stdin`'s own buffer
    /// is heap memory that would keep a copy.
    pub fn read_stdin(max: usize) -> io::Result<Self> {
        use std::os::fd::AsFd;
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        Self::read_from(std::fs::File::from(fd), max)
    }

    /// The mapped bytes past `len` (zero or wiped).
    fn spare(&mut self) -> &mut [u8] {
        if self.cap == 0 {
            return &mut [];
        }
        // SAFETY: `ptr..ptr+cap` is our own read-write mapping (Region::map)
        // and `len <= cap`; `&mut self` makes this the only reference.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.len), self.cap - self.len)
        }
    }
}

impl Default for Secret {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        if self.cap == 0 {
            return;
        }
        let region = Region {
            ptr: self.ptr,
            cap: self.cap,
            locked: self.locked,
        };
        self.cap = 0;
        self.len = 0;
        drop(region);
    }
}

impl std::ops::Deref for Secret {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.cap == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr+len` lies in our own mapping (len <= cap) and
        // is initialised (mapped pages are zero-filled); `&self` keeps it
        // alive and unmodified.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Secret {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.cap == 0 {
            return &mut [];
        }
        // SAFETY: as in `Deref`, and `&mut self` makes this the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Clone for Secret {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        // No early exit: the time does not depend on where they differ.
        self.len == other.len
            && self
                .iter()
                .zip(other.iter())
                .fold(0, |d, (a, b)| d | (a ^ b))
                == 0
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes hidden>)", self.len)
    }
}

impl From<&[u8]> for Secret {
    fn from(b: &[u8]) -> Self {
        Self::from_slice(b)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self::from_slice(s.as_bytes())
    }
}

impl From<Zeroizing<Vec<u8>>> for Secret {
    /// Copies the bytes; the heap buffer is wiped when `v` drops here.
    fn from(v: Zeroizing<Vec<u8>>) -> Self {
        Self::from_slice(&v)
    }
}

impl io::Write for Secret {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl fmt::Write for Secret {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Whether the "cannot lock" warning has been printed in this process.
static WARNED: AtomicBool = AtomicBool::new(false);

/// One anonymous private mapping, unmapped (after wiping) on drop.
struct Region {
    ptr: NonNull<u8>,
    cap: usize,
    locked: bool,
}

impl Region {
    /// Maps at least `n` (> 0) bytes: DONTDUMP, WIPEONFORK, then mlock
    /// (a refusal warns once). Aborts like `Vec` does if memory cannot be
    /// mapped at all.
    fn map(n: usize) -> Self {
        let page = page_size();
        let cap = n.max(1).div_ceil(page) * page;
        // SAFETY: a fresh anonymous private mapping; no existing memory is
        // touched, and the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let layout = std::alloc::Layout::from_size_align(cap, page)
                .unwrap_or(std::alloc::Layout::new::<u8>());
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: advice and lock on exactly the region just mapped.
        let (dontdump, locked) = unsafe {
            let dontdump = libc::madvise(p, cap, libc::MADV_DONTDUMP) == 0;
            // Older kernels (< 4.14) lack WIPEONFORK; it is a bonus.
            libc::madvise(p, cap, libc::MADV_WIPEONFORK);
            (dontdump, libc::mlock(p, cap) == 0)
        };
        if !locked || !dontdump {
            warn_once(io::Error::last_os_error());
        }
        Self {
            // mmap never returns null on success (MAP_FIXED is not used).
            ptr: NonNull::new(p.cast()).unwrap_or(NonNull::dangling()),
            cap,
            locked,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the whole mapping is ours, readable and writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Hands the mapping to a [`Secret`] of `len` bytes.
    fn into_secret(self, len: usize) -> Secret {
        let s = Secret {
            ptr: self.ptr,
            len,
            cap: self.cap,
            locked: self.locked,
        };
        std::mem::forget(self);
        s
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Volatile writes: the wipe is not optimised away.
        self.bytes_mut().zeroize();
        let p = self.ptr.as_ptr().cast();
        // SAFETY: unlock and unmap exactly our own mapping; nothing refers
        // to it any more (its owner is being dropped).
        unsafe {
            if self.locked {
                libc::munlock(p, self.cap);
            }
            libc::munmap(p, self.cap);
        }
    }
}

fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    })
}

/// Says once per process that key memory could not be locked.
fn warn_once(e: io::Error) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "ucrypt: warning: cannot lock key memory ({e}; see RLIMIT_MEMLOCK, ulimit -l): \
             keys may be written to swap"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smaps flags (`VmFlags:`) of the mapping holding `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    return f.to_owned();
                }
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn pages_are_locked_and_left_out_of_dumps() {
        let s = Secret::from_slice(b"key");
        let flags = vm_flags(s.addr());
        let words: Vec<&str> = flags.split_whitespace().collect();
        assert!(words.contains(&"dd"), "no dontdump: {flags}");
        if s.is_locked() {
            assert!(words.contains(&"lo"), "not locked: {flags}");
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let vmlck = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
            assert_ne!(vmlck.split_whitespace().nth(1), Some("0"), "{vmlck}");
        }
    }

    #[test]
    fn grows_appends_and_formats_without_losing_bytes() {
        let mut s = Secret::new();
        assert!(s.is_empty() && s.capacity() == 0 && s.as_str() == Some(""));
        fmt::Write::write_fmt(&mut s, format_args!("{} {}", 12, "crypt")).unwrap();
        s.push(b' ');
        s.push_hex(&[0x00, 0xab, 0xff]);
        assert_eq!(s.as_str(), Some("12 crypt 00abff"));
        let first = s.addr();
        let big = vec![7u8; 3 * page_size()];
        io::Write::write_all(&mut s, &big).unwrap();
        assert_ne!(s.addr(), first, "moved to a larger mapping");
        assert_eq!(&s[..15], b"12 crypt 00abff");
        assert_eq!(&s[15..], &big[..]);
        s.truncate(2);
        assert_eq!(&*s, b"12");
        assert_eq!(s.clone(), Secret::from("12"));
        assert_ne!(s, Secret::from("13"));
        assert_eq!(format!("{s:?}"), "Secret(<2 bytes hidden>)");
    }

    #[test]
    fn hex_round_trip_and_refusals() {
        let k = Secret::from_hex(b"00ff10Ab").unwrap();
        assert_eq!(&*k, &[0x00, 0xff, 0x10, 0xab]);
        let mut h = Secret::new();
        h.push_hex(&k);
        assert_eq!(h.as_str(), Some("00ff10ab"));
        assert!(Secret::from_hex(b"0").is_none());
        assert!(Secret::from_hex(b"zz").is_none());
        assert!(Secret::from_hex(b"").unwrap().is_empty());
    }

    #[test]
    fn reads_into_locked_pages_with_a_limit() {
        let data = vec![b'x'; 10_000];
        let s = Secret::read_from(&data[..], 10_000).unwrap();
        assert_eq!(&*s, &data[..]);
        let e = Secret::read_from(&data[..], 9_999).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(Secret::read_from(&b""[..], 10).unwrap().is_empty());
    }
}
