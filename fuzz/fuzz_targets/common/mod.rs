//! What the NBD targets share: one engine over a 64 KiB mem backend (no
//! cipher, so requests complete inline and runs are deterministic; discards
//! allowed, so TRIM is fuzzed too) and a PSK TLS configuration for
//! `--tls=require` sessions; and the targets' allocator ([`Recycle`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::{Arc, Mutex, OnceLock};

use backend::MemBackend;
use datapath::{Engine, EngineConfig, Volume};
use nbd::{TlsConfig, TlsMode};

pub fn setup() -> (&'static Arc<Engine>, &'static TlsConfig) {
    static STATE: OnceLock<(Arc<Engine>, TlsConfig)> = OnceLock::new();
    let (e, t) = STATE.get_or_init(|| {
        // libFuzzer's main does not ignore SIGPIPE as Rust's does; a
        // server writing to a client that already left must get EPIPE.
        // SAFETY: called once, before any thread of ours exists; SIG_IGN
        // is a valid disposition for SIGPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        // Small: a read of all of it is sent, copied and drained whole,
        // and the range checks only need an end to cross.
        let size = 64 << 10;
        let vol = Volume {
            backend: Arc::new(MemBackend::new(size).expect("mem backend")),
            crypt: None,
            data_offset: 0,
            size,
            sector_size: 512,
        };
        // Discards on, so TRIM is advertised and reaches the engine too.
        let mut cfg = EngineConfig::default();
        cfg.allow_discards = true;
        let engine = Arc::new(Engine::new(vol, cfg).expect("engine"));
        let psk = std::env::temp_dir().join(format!("ucrypt-fuzz-{}.psk", std::process::id()));
        std::fs::write(&psk, "fuzz:000102030405060708090a0b0c0d0e0f\n").expect("psk file");
        let tls = TlsConfig::psk(TlsMode::Require, &psk).expect("psk config");
        let _ = std::fs::remove_file(&psk);
        (engine, tls)
    });
    (e, t)
}

/// Recycles large heap blocks (the server's 256 KiB read buffer, one per
/// session; big read payloads) instead of handing them back to the
/// sanitizer's allocator, which maps every block over 128 KiB afresh:
/// its page faults and unmaps were most of a session's cost. A cached
/// block is poisoned for AddressSanitizer until it is handed out again,
/// and only for the exact same layout, so its redzones still fit.
pub struct Recycle;

/// Blocks at least this large are cached...
const RECYCLE_MIN: usize = 128 << 10;
/// ...up to this size (poisoning a larger one costs more than mapping it).
const RECYCLE_MAX: usize = 1 << 20;
/// Cached blocks at most: (address, size, align); address 0 = free slot.
static CACHE: Mutex<[(usize, usize, usize); 8]> = Mutex::new([(0, 0, 0); 8]);

#[cfg(sanitize = "address")]
extern "C" {
    fn __asan_poison_memory_region(p: *const u8, n: usize);
    fn __asan_unpoison_memory_region(p: *const u8, n: usize);
}

/// Marks `n` bytes at `p` as not to be touched (`on`) or usable again.
///
/// # Safety
/// `p..p+n` is a block this allocator owns.
unsafe fn poison(p: *mut u8, n: usize, on: bool) {
    #[cfg(sanitize = "address")]
    // SAFETY: the caller owns the region; poisoning only flips shadow bytes.
    unsafe {
        if on {
            __asan_poison_memory_region(p, n)
        } else {
            __asan_unpoison_memory_region(p, n)
        }
    }
    let _ = (p, n, on);
}

// SAFETY: every block comes from `System` with the layout it is later
// returned with; a cached block is handed out only for that same layout,
// and at most once (taken from its slot under the lock).
unsafe impl GlobalAlloc for Recycle {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if (RECYCLE_MIN..=RECYCLE_MAX).contains(&l.size()) {
            let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = c
                .iter_mut()
                .find(|s| s.0 != 0 && s.1 == l.size() && s.2 == l.align())
            {
                let p = slot.0 as *mut u8;
                *slot = (0, 0, 0);
                // SAFETY: `p` is a cached block of exactly this layout.
                unsafe { poison(p, l.size(), false) };
                return p;
            }
        }
        // SAFETY: forwarded with the caller's (non-zero-size) layout.
        unsafe { System.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded. Never from the cache: calloc's fresh mapping
        // is zero already, so a big buffer the server then barely fills
        // (a write header's length) costs no page faults.
        unsafe { System.alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if (RECYCLE_MIN..=RECYCLE_MAX).contains(&l.size()) {
            let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
            // A free slot, or else the oldest block makes room.
            let i = c.iter().position(|s| s.0 == 0).unwrap_or(0);
            let old = c[i];
            c.copy_within(i + 1.., i);
            // SAFETY: the caller gave `p` back; nothing may use it now.
            unsafe { poison(p, l.size(), true) };
            let last = c.len() - 1;
            c[last] = (p as usize, l.size(), l.align());
            drop(c);
            if old.0 != 0 {
                let p = old.0 as *mut u8;
                // SAFETY: a cached block, now out of the cache, with the
                // layout it was cached with.
                unsafe {
                    poison(p, old.1, false);
                    System.dealloc(p, Layout::from_size_align_unchecked(old.1, old.2));
                }
            }
            return;
        }
        // SAFETY: `p` came from `System` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if l.size() < RECYCLE_MIN && new < RECYCLE_MIN {
            // SAFETY: `p` came from `System` with layout `l` (small blocks
            // are never cached).
            return unsafe { System.realloc(p, l, new) };
        }
        // SAFETY: the caller's contract for realloc.
        let q = unsafe { self.alloc(Layout::from_size_align_unchecked(new, l.align())) };
        if !q.is_null() {
            // SAFETY: both blocks are live and at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                self.dealloc(p, l);
            }
        }
        q
    }
}
