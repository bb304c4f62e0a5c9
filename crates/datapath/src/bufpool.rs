//! Reusable request buffers: large read results and write payloads go
//! back to a pool once their reply has left, instead of back to `malloc`.
//!
//! ```text
//!  frontend: write payload ── take(len) ──► recv into it ──► Op::Write
//!  engine:   read result   ── take(len) ──► backend read + decrypt
//!            write done    ── give(data)
//!  frontend: reply sent    ── give(data)  (NBD, vhost-user-blk)
//! ```
//!
//! Why: a fresh 1 MiB `Vec` comes from `mmap` or a trimmed heap, so every
//! request paid page faults plus the kernel's (or `calloc`'s) zeroing of
//! memory the backend read or the socket receive overwrites whole right
//! after (~15% of a 1M QD8 NBD read, profiled). A pooled buffer is already
//! mapped and already initialised, so [`take`] returns it without writing a
//! byte when it was that long before.
//! Under the `ucrypt` binary's allocator (`backend::PageAlignLarge`) the
//! buffers of 1 MiB and up are transparent huge pages, physically
//! contiguous, so an O_DIRECT read of 1 MiB is one request to a virtio
//! disk, not two (`tests/bufpool_huge.rs`).
//!
//! # Stale bytes
//!
//! [`take`] returns `len` initialised bytes whose contents are unspecified:
//! they may be an earlier request's plaintext. The caller must overwrite
//! every byte before anything is read back from it, and drop (or [`give`])
//! the buffer on any failure instead of returning it. The engine's reads
//! and the frontends' receives already fill all or fail (a backend's
//! `read_at` fails on a short read, `read_exact` on a short receive), which
//! is the only thing that makes stale bytes unreachable; tests pin that
//! (`tests/bufpool.rs`). [`take_empty`] is for code that appends.
//!
//! # Cost
//!
//! Buffers under [`MIN_POOLED`] never enter the pool (`malloc`'s thread
//! caches already serve them without a fault), so small requests touch no
//! shared state. Large ones take one uncontended `try_lock` per class; a
//! contended lock or an empty class falls back to a fresh allocation, so a
//! submitter never waits on another. The pool holds at most
//! [`MAX_POOLED_BYTES`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Smallest buffer the pool keeps (smaller ones are cheap from `malloc`).
pub const MIN_POOLED: usize = 64 << 10;

/// Most bytes of capacity the pool holds at once (whatever it holds past
/// that is freed): 32 MiB buffers of 1 MiB, enough for a few clients at
/// queue depth 8 both ways.
pub const MAX_POOLED_BYTES: usize = 32 << 20;

/// Size classes: class `k` holds buffers of capacity in `[2^k, 2^(k+1))`,
/// from [`MIN_POOLED`] to the engine's largest request.
const FIRST_CLASS: u32 = MIN_POOLED.trailing_zeros();
const LAST_CLASS: u32 = (crate::MAX_REQUEST_BYTES as usize).trailing_zeros();
const CLASSES: usize = (LAST_CLASS - FIRST_CLASS + 1) as usize;

struct Pool {
    classes: [Mutex<Vec<Vec<u8>>>; CLASSES],
    /// Capacity held over all classes.
    held: AtomicUsize,
}

static POOL: Pool = Pool {
    classes: [const { Mutex::new(Vec::new()) }; CLASSES],
    held: AtomicUsize::new(0),
};

/// The class a buffer of capacity `cap` is kept in (`None`: not pooled).
fn class_of_capacity(cap: usize) -> Option<usize> {
    if cap < MIN_POOLED {
        return None;
    }
    let k = cap.ilog2().min(LAST_CLASS);
    Some((k - FIRST_CLASS) as usize)
}

/// The class whose every buffer holds `len` bytes (`None`: not pooled).
fn class_for_len(len: usize) -> Option<usize> {
    if len < MIN_POOLED {
        return None;
    }
    let k = len.checked_next_power_of_two()?.ilog2();
    (k <= LAST_CLASS).then(|| (k - FIRST_CLASS) as usize)
}

/// A pooled buffer of capacity at least `len`, if one is free right now.
fn pop(len: usize) -> Option<Vec<u8>> {
    let c = class_for_len(len)?;
    let buf = POOL.classes[c].try_lock().ok()?.pop()?;
    POOL.held.fetch_sub(buf.capacity(), Ordering::Relaxed);
    Some(buf)
}

/// A buffer of `len` initialised bytes with **unspecified contents**
/// (possibly an earlier request's data; see the module doc): overwrite all
/// of it before reading from it. Pooled when `len` is large enough and a
/// buffer is free; bytes already initialised are not written again.
pub fn take(len: usize) -> Vec<u8> {
    match pop(len) {
        Some(mut buf) => {
            // Shrinking keeps the bytes; growing zeroes only the new tail.
            buf.resize(len, 0);
            buf
        }
        None => fresh(len),
    }
}

/// An empty buffer with room for `len` bytes without reallocating, for
/// code that appends (pooled when `len` is large enough and one is free).
pub fn take_empty(len: usize) -> Vec<u8> {
    match pop(len) {
        Some(mut buf) => {
            buf.clear();
            buf
        }
        None => Vec::with_capacity(class_capacity(len)),
    }
}

/// Hands a buffer back for reuse (dropped when it is small, the pool is
/// full or its class is busy).
pub fn give(buf: Vec<u8>) {
    let Some(c) = class_of_capacity(buf.capacity()) else {
        return;
    };
    let cap = buf.capacity();
    if POOL.held.fetch_add(cap, Ordering::Relaxed) + cap > MAX_POOLED_BYTES {
        POOL.held.fetch_sub(cap, Ordering::Relaxed);
        return;
    }
    match POOL.classes[c].try_lock() {
        Ok(mut v) => v.push(buf),
        Err(_) => {
            POOL.held.fetch_sub(cap, Ordering::Relaxed);
        }
    }
}

/// Bytes of capacity the pool holds now (for tests and stats).
pub fn held() -> usize {
    POOL.held.load(Ordering::Relaxed)
}

/// A new buffer of `len` bytes whose capacity fills its class, so it can
/// come back for any request of that class. Zeroed once here (`calloc`:
/// fresh pages, no `memset`); reuse never zeroes again.
fn fresh(len: usize) -> Vec<u8> {
    let cap = class_capacity(len);
    let mut buf = vec![0u8; cap];
    buf.truncate(len);
    buf
}

/// The capacity to allocate for `len` bytes: the class size when pooled.
fn class_capacity(len: usize) -> usize {
    match class_for_len(len) {
        Some(c) => 1usize << (c as u32 + FIRST_CLASS),
        None => len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_pooled_length() {
        assert_eq!(class_for_len(MIN_POOLED - 1), None);
        assert_eq!(class_for_len(MIN_POOLED), Some(0));
        assert_eq!(class_for_len(MIN_POOLED + 1), Some(1));
        assert_eq!(
            class_for_len(crate::MAX_REQUEST_BYTES as usize),
            Some(CLASSES - 1)
        );
        assert_eq!(class_for_len(crate::MAX_REQUEST_BYTES as usize + 1), None);
        // A buffer filed in class c holds every length class c serves.
        for len in [MIN_POOLED, 100_000, 1 << 20, (1 << 20) + 1, 3 << 20] {
            let cap = class_capacity(len);
            assert!(cap >= len);
            assert_eq!(class_of_capacity(cap), class_for_len(len));
        }
    }

    #[test]
    fn a_given_buffer_comes_back_unzeroed() {
        // 16 MiB: no other test of this crate reads that much at once, so
        // nobody takes this class's buffer in between.
        let len = 16 << 20;
        let mut b = take(len);
        b.fill(0xab);
        let ptr = b.as_ptr();
        give(b);
        let again = take(len - 4096);
        assert_eq!(again.as_ptr(), ptr, "the pooled buffer is reused");
        assert!(again.iter().all(|&x| x == 0xab), "and not written again");
        give(again);
        // Small buffers never enter the pool.
        assert_eq!(class_of_capacity(MIN_POOLED - 1), None);
    }
}
