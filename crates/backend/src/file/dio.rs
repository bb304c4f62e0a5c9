//! O_DIRECT support: the alignment a regular file needs (`statx`), and the
//! per-thread aligned bounce buffer for requests whose memory is not
//! aligned.
// FFI: statx and an aligned heap allocation. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;
use std::path::Path;

pub(super) fn aligned_mem(p: *const u8, align: u64) -> bool {
    (p as usize) & (align.max(1) as usize - 1) == 0
}

thread_local! {
    /// This thread's aligned bounce buffer for O_DIRECT with unaligned memory.
    static BOUNCE: RefCell<AlignedBuf> = const { RefCell::new(AlignedBuf::empty()) };
}

/// Bounce buffers kept per thread up to this size; larger ones are freed.
const BOUNCE_KEEP: usize = 4 << 20;

pub(super) fn with_bounce<T>(
    len: usize,
    align: usize,
    f: impl FnOnce(&mut [u8]) -> io::Result<T>,
) -> io::Result<T> {
    BOUNCE.with(|cell| {
        let mut b = cell.borrow_mut();
        if b.len < len || b.align < align {
            *b = AlignedBuf::new(len, align.max(4096))?;
        }
        let r = f(&mut b.as_mut_slice()[..len]);
        if b.len > BOUNCE_KEEP {
            *b = AlignedBuf::empty();
        }
        r
    })
}

/// A heap buffer with a chosen alignment (zero-initialised).
pub(super) struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    align: usize,
}

impl AlignedBuf {
    const fn empty() -> Self {
        Self {
            ptr: std::ptr::null_mut(),
            len: 0,
            align: 1,
        }
    }

    pub(super) fn new(len: usize, align: usize) -> io::Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "Bad bounce buffer layout"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "Cannot allocate a bounce buffer",
            ));
        }
        Ok(Self { ptr, len, align })
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is a live allocation of `len` initialised bytes owned
        // by self, and `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Box<[u8]>);
// the raw pointer is never shared, so moving it to another thread is sound.
unsafe impl Send for AlignedBuf {}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated in `new` with exactly this layout.
            unsafe {
                std::alloc::dealloc(
                    self.ptr,
                    std::alloc::Layout::from_size_align_unchecked(self.len.max(1), self.align),
                )
            };
        }
    }
}

/// The O_DIRECT alignment of a regular file from `statx(STATX_DIOALIGN)`:
/// the larger of the memory and offset alignments, or None when unknown.
pub(super) fn statx_dio_align(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out
    // pointer, both alive for the call.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_DIOALIGN, &mut st) };
    if r != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let a = u64::from(st.stx_dio_mem_align.max(st.stx_dio_offset_align));
    (a > 0 && a.is_power_of_two()).then_some(a)
}
