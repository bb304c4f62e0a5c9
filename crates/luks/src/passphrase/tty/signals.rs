//! The terminal put back when a signal ends the process mid-prompt, as
//! cryptsetup does: Ctrl-C (SIGINT), SIGTERM, SIGHUP or SIGQUIT while echo
//! is off would otherwise leave the user's terminal silent (an interactive
//! shell repairs it, a script's parent need not).
//!
//! Hand-written on `libc::sigaction`, the only unsafe code in this crate:
//! signal-hook cannot hand a signal back to its default action once the
//! prompt is over (unregistered, its handler leaves the signal ignored),
//! and a handler for the whole run would change what SIGTERM does to the
//! daemon later. While a [`Guard`] lives, a handler restores the saved
//! settings (TCSAFLUSH: a half-typed passphrase is discarded rather than
//! left for the shell to read and echo), puts the signal's default action
//! back and raises the signal again, so the process ends exactly as it
//! would have. Only signals at their default action are taken: one the
//! process ignores or handles itself is left alone. Dropping the guard puts
//! every previous action back.
#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicI32, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

/// The signals that end a process at a prompt.
const SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// What the handler needs. Written only while no handler is installed
/// (under [`PROMPT`], before the first `sigaction`), read only by the
/// handler and the guard's drop.
struct Saved {
    termios: libc::termios,
    /// The previous action of each of [`SIGNALS`], and whether ours
    /// replaced it (only a default action is replaced).
    old: [(libc::sigaction, bool); SIGNALS.len()],
}

struct Slot(std::cell::UnsafeCell<MaybeUninit<Saved>>);
// SAFETY: see `Saved`: written by the one prompt holding `PROMPT` before
// any handler can read it, then only read until the guard is dropped.
unsafe impl Sync for Slot {}

static SAVED: Slot = Slot(std::cell::UnsafeCell::new(MaybeUninit::uninit()));
/// The terminal's fd while a guard lives, else -1.
static FD: AtomicI32 = AtomicI32::new(-1);
/// One prompt at a time owns `SAVED`.
static PROMPT: Mutex<()> = Mutex::new(());

/// Restores the terminal's settings, as read now, if one of [`SIGNALS`]
/// arrives before it is dropped.
pub(super) struct Guard {
    _prompt: MutexGuard<'static, ()>,
}

impl Guard {
    /// Saves `fd`'s settings and installs the handlers. Call before
    /// turning echo off; drop after turning it back on.
    pub(super) fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let prompt = PROMPT.lock().unwrap_or_else(|e| e.into_inner());
        let raw = fd.as_raw_fd();
        // SAFETY: `termios` and `sigaction` are plain C structs, valid
        // zeroed; `SAVED` is ours alone (no handler installed, `PROMPT`
        // held), and every pointer passed is to a live local or to it.
        unsafe {
            let saved = (*SAVED.0.get()).as_mut_ptr();
            let mut termios: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(raw, &mut termios) != 0 {
                return Err(io::Error::last_os_error());
            }
            saved.write(Saved {
                termios,
                old: [(std::mem::zeroed(), false); SIGNALS.len()],
            });
            FD.store(raw, SeqCst);
            let guard = Self { _prompt: prompt };
            for (i, &sig) in SIGNALS.iter().enumerate() {
                let old = &mut (*saved).old[i];
                if libc::sigaction(sig, std::ptr::null(), &mut old.0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // Only a signal that would end the process: one ignored
                // stays ignored, and one the program handles (say, a
                // daemon's SIGTERM) must not find the prompt going on with
                // echo back on.
                if old.0.sa_sigaction != libc::SIG_DFL {
                    continue;
                }
                let mut ours: libc::sigaction = std::mem::zeroed();
                ours.sa_sigaction = handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
                libc::sigemptyset(&mut ours.sa_mask);
                // Reads and polls go on after any other signal.
                ours.sa_flags = libc::SA_RESTART;
                if libc::sigaction(sig, &ours, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                old.1 = true;
            }
            Ok(guard)
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: `SAVED` was written in `new`; restoring an action read
        // from `sigaction` is always valid.
        unsafe {
            let saved = &*(*SAVED.0.get()).as_ptr();
            for (i, &sig) in SIGNALS.iter().enumerate() {
                if saved.old[i].1 {
                    libc::sigaction(sig, &saved.old[i].0, std::ptr::null_mut());
                }
            }
        }
        FD.store(-1, SeqCst);
    }
}

/// Async-signal-safe: `tcsetattr`, `sigaction` and `raise` only.
extern "C" fn handler(sig: libc::c_int) {
    let fd = FD.load(SeqCst);
    if fd < 0 {
        return;
    }
    // SAFETY: `FD` is set only while a guard lives, and `SAVED` is then
    // fully written and not written again.
    unsafe {
        let saved = &*(*SAVED.0.get()).as_ptr();
        libc::tcsetattr(fd, libc::TCSAFLUSH, &saved.termios);
        if let Some(i) = SIGNALS.iter().position(|&s| s == sig) {
            libc::sigaction(sig, &saved.old[i].0, std::ptr::null_mut());
        }
        // Blocked until this handler returns, then delivered under the
        // previous (default) action.
        libc::raise(sig);
    }
}
