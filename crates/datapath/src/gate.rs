//! Admission: bounded queue depth, back-pressure and dm-style suspend/resume.
//!
//! Hand-written. Every request passes [`Gate::admit`] before anything else
//! and [`Gate::release`] when it completes. The gate holds the current
//! [`Gen`] (volume + configuration + the mode's threads); a request keeps the
//! generation it was admitted under until it completes, so a swap never
//! mixes two tables inside one request.
//!
//! ```text
//!  submit ──► admit ──(in_flight < queue_depth && !suspended)──► dispatch
//!               │ else: wait on the condvar (back-pressure / suspended)
//!  complete ──► release ── in_flight -= 1, wake waiters if any
//!
//!  reconfigure / reload  (dm_suspend → table swap → dm_resume):
//!    suspended = true ─► wait in_flight == 0 ─► swap Gen ─► suspended = false
//! ```
//!
//! Because every request of the old generation has completed before the new
//! one admits anything, nothing is lost, duplicated or reordered against a
//! flush across a swap.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::{Error, Gen};

struct State {
    in_flight: usize,
    queue_depth: usize,
    /// A swap or shutdown is draining the engine.
    suspended: bool,
    shut: bool,
    /// Threads blocked in `admit` or `suspend` (so `release` knows whether
    /// waking is needed: a condvar notify is a syscall).
    waiters: usize,
    gen: Option<Arc<Gen>>,
}

/// The admission gate.
pub(crate) struct Gate {
    st: Mutex<State>,
    cv: Condvar,
    /// Mirror of `in_flight` readable without the lock (adaptive mode and
    /// stats read it).
    pub(crate) in_flight: AtomicUsize,
    /// Highest `in_flight` seen.
    pub(crate) max_in_flight: AtomicUsize,
}

impl Gate {
    /// A gate with nothing installed yet: [`Gate::install`] must follow
    /// before the first `admit`.
    pub(crate) fn new() -> Self {
        Self {
            st: Mutex::new(State { in_flight: 0, queue_depth: 1, suspended: false, shut: false, waiters: 0, gen: None }),
            cv: Condvar::new(),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        }
    }

    /// Installs the first generation.
    pub(crate) fn install(&self, gen: Arc<Gen>) {
        let mut g = self.lock();
        g.queue_depth = gen.ctx.cfg.queue_depth.max(1);
        g.gen = Some(gen);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters
        // half-updated (each critical section is a few plain assignments),
        // so a poisoned lock is still consistent.
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, mut g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        g.waiters += 1;
        let mut g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        g.waiters -= 1;
        g
    }

    /// Admits one request: returns its generation and the number of requests
    /// in flight including it. Blocks while the queue is full or a swap is
    /// in progress.
    pub(crate) fn admit(&self) -> Result<(Arc<Gen>, usize), Error> {
        let mut g = self.lock();
        loop {
            if g.shut {
                return Err(Error::Shutdown);
            }
            if !g.suspended && g.in_flight < g.queue_depth {
                break;
            }
            g = self.wait(g);
        }
        g.in_flight += 1;
        let n = g.in_flight;
        self.in_flight.store(n, Relaxed);
        if n > self.max_in_flight.load(Relaxed) {
            self.max_in_flight.store(n, Relaxed);
        }
        // Invariant: `gen` is only None after `shut` is set, checked above.
        let gen = g.gen.clone().expect("engine generation present while not shut down");
        Ok((gen, n))
    }

    /// Completes one admitted request.
    pub(crate) fn release(&self) {
        let mut g = self.lock();
        g.in_flight -= 1;
        self.in_flight.store(g.in_flight, Relaxed);
        if g.waiters > 0 {
            self.cv.notify_all();
        }
    }

    /// Suspends admission and waits until nothing is in flight; other
    /// suspenders queue behind. Returns false if the engine is shut down.
    fn suspend(&self) -> Result<MutexGuard<'_, State>, Error> {
        let mut g = self.lock();
        while g.suspended && !g.shut {
            g = self.wait(g);
        }
        if g.shut {
            return Err(Error::Shutdown);
        }
        g.suspended = true;
        while g.in_flight > 0 {
            g = self.wait(g);
        }
        Ok(g)
    }

    /// dm suspend → swap → resume: installs `new`, returns the old
    /// generation (drained: nothing of it is in flight).
    pub(crate) fn swap(&self, new: Arc<Gen>) -> Result<Arc<Gen>, Error> {
        let mut g = self.suspend()?;
        g.queue_depth = new.ctx.cfg.queue_depth.max(1);
        let old = g.gen.replace(new).expect("engine generation present while not shut down");
        g.suspended = false;
        if g.waiters > 0 {
            self.cv.notify_all();
        }
        Ok(old)
    }

    /// Stops admitting for good, drains, and hands back the last generation
    /// (None if already shut down).
    pub(crate) fn close(&self) -> Option<Arc<Gen>> {
        let mut g = self.lock();
        while g.suspended && !g.shut {
            g = self.wait(g);
        }
        if g.shut {
            return None;
        }
        g.suspended = true;
        while g.in_flight > 0 {
            g = self.wait(g);
        }
        g.shut = true;
        g.suspended = false;
        let old = g.gen.take();
        if g.waiters > 0 {
            self.cv.notify_all();
        }
        old
    }

    /// The current generation (None after shutdown).
    pub(crate) fn current(&self) -> Option<Arc<Gen>> {
        self.lock().gen.clone()
    }
}
