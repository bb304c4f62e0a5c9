//! Surviving SIGBUS on a mapped file: the fault becomes an IO error.
//!
//! A shared mapping of a file faults with SIGBUS where a `pread` or
//! `pwrite` would have returned an error: a page past the end of a file
//! that something truncated under us, or a hole in a tmpfs file that
//! cannot be filled because the filesystem is full (`ENOSPC`). Unhandled,
//! that kills the daemon, in-flight requests and all.
//!
//! A mapping registers its address range here ([`Guard`]). The process's
//! SIGBUS handler (installed once, on the first registration) looks the
//! faulting address up: inside a registered range, it marks the range
//! broken, then maps a private anonymous page over the faulting page with
//! `MAP_FIXED`, so the faulting instruction completes on that page when the
//! handler returns. The thread that was lending the range checks
//! [`Guard::broken`] after its access and reports an IO error (what it
//! wrote went to the anonymous page, not the file); the mapping is never
//! used again, and the backend goes on with `pread`/`pwrite`, which report
//! the real error (a short read, `ENOSPC`). Any other address goes to the
//! action that was installed before (Rust's stack-overflow handler, or the
//! default action, which ends the process as it would have without us).
//!
//! The flag is set before the page is replaced: a thread that writes the
//! replaced page did so after the `mmap` call returned in the handler,
//! hence after the flag's store, so its later check sees it.
//!
//! Everything the handler does is async-signal-safe: atomic loads and
//! stores, `mmap`, `sigaction`, and a call of the previous handler.
// FFI: sigaction and mmap. Every unsafe block has a SAFETY note.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Mapped ranges guarded at once; a mapping that finds no free slot is not
/// made (the file is then read and written with syscalls only).
const SLOTS: usize = 64;

struct Slot {
    /// Start address; 0 when the slot is free.
    start: AtomicUsize,
    end: AtomicUsize,
    broken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    broken: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];

/// The action SIGBUS had before ours (set once, before ours is installed).
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

/// A registered range; unregisters on drop (before the mapping goes).
pub(super) struct Guard(&'static Slot);

impl Guard {
    /// Registers `start..start+len`; `None` when the handler cannot be
    /// installed or every slot is taken.
    pub(super) fn register(start: usize, len: usize) -> Option<Self> {
        install()?;
        for s in &TABLE {
            // Claim a free slot: `end` first, then `start` (a nonzero
            // start is what the handler takes as a live slot).
            if s.start
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.broken.store(false, Ordering::SeqCst);
                s.end.store(start + len, Ordering::SeqCst);
                s.start.store(start, Ordering::SeqCst);
                return Some(Self(s));
            }
        }
        None
    }

    /// True once a SIGBUS hit the range: nothing lent from it since can
    /// be trusted, and it must not be lent again.
    pub(super) fn broken(&self) -> bool {
        self.0.broken.load(Ordering::SeqCst)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.end.store(0, Ordering::SeqCst);
        self.0.start.store(0, Ordering::SeqCst);
    }
}

/// Installs the handler once; `None` if `sigaction` refused.
fn install() -> Option<()> {
    PREVIOUS
        .get_or_init(|| {
            // SAFETY: all-zero is a valid `sigaction` (no handler, empty
            // mask, no flags), filled in below before use.
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as above; the kernel fills it with the old action.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            // SAFETY: `new.sa_mask` is a valid sigset_t owned here.
            unsafe { libc::sigemptyset(&mut new.sa_mask) };
            // SAFETY: both pointers are to valid `sigaction` values on this
            // stack; the handler only does async-signal-safe work.
            let r = unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) };
            (r == 0).then_some(old)
        })
        .map(drop)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &TABLE {
        let start = s.start.load(Ordering::SeqCst);
        if start == 0 || start == usize::MAX || addr < start || addr >= s.end.load(Ordering::SeqCst)
        {
            continue;
        }
        s.broken.store(true, Ordering::SeqCst);
        let page = addr & !(super::super::lend::PAGE - 1);
        // SAFETY: `page` is a page of a mapping this process made and still
        // holds (the slot is live until the mapping's owner unregisters it,
        // before unmapping); replacing it with an anonymous page changes no
        // memory Rust owns elsewhere, and the owner never trusts that page
        // again (`broken`).
        let r = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                super::super::lend::PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            return;
        }
        break;
    }
    // Not ours (or the page could not be replaced): what would have
    // happened without us.
    match PREVIOUS.get().copied().flatten() {
        Some(prev) if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN => {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO,
                // so this is its signature; it gets our arguments unchanged.
                let h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                h(sig, info, ctx);
            } else {
                // SAFETY: as above, for a handler without SA_SIGINFO.
                let h: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                h(sig);
            }
        }
        _ => {
            // The default action: put it back and return, so the faulting
            // access runs again and the process ends with SIGBUS.
            // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: valid pointer to a sigaction on this stack.
            unsafe { libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut()) };
        }
    }
}
