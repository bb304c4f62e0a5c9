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
//!
//! Engine threads never block here. A completion callback running on an
//! engine thread (classic mode) may submit again; if the queue is full or a
//! swap is draining, blocking would deadlock (the drain may be waiting for
//! requests that thread still has to finish). Like dm's `md->deferred` list
//! (`queue_io` while suspended, replayed by `dm_wq_work` on resume), such a
//! request is parked on a FIFO and resubmitted when a slot frees or the swap
//! resumes. The list holds at most one request per completion callback run
//! since the last replay, so it is bounded by what was admitted.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::{Done, Error, Gen, Request};

/// A request parked by an engine thread (dm's deferred bio list).
pub(crate) type Deferred = (Request, Done);

thread_local! {
    static ENGINE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as an engine thread (it must never block in
/// admission).
pub(crate) fn mark_engine_thread() {
    ENGINE_THREAD.with(|c| c.set(true));
}

/// True on an engine worker thread.
pub(crate) fn on_engine_thread() -> bool {
    ENGINE_THREAD.with(|c| c.get())
}

struct State {
    in_flight: usize,
    queue_depth: usize,
    /// A swap or shutdown is draining the engine.
    suspended: bool,
    /// Suspended by the user (`luksSuspend`) until [`Gate::hold`] clears
    /// it: nothing is admitted, swaps still go through.
    held: bool,
    shut: bool,
    /// Threads blocked in `admit` or `suspend` (so `release` knows whether
    /// waking is needed: a condvar notify is a syscall).
    waiters: usize,
    gen: Option<Arc<Gen>>,
    deferred: VecDeque<Deferred>,
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
            st: Mutex::new(State {
                in_flight: 0,
                queue_depth: 1,
                suspended: false,
                held: false,
                shut: false,
                waiters: 0,
                gen: None,
                deferred: VecDeque::new(),
            }),
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
            if !g.suspended && !g.held && g.in_flight < g.queue_depth {
                break;
            }
            g = self.wait(g);
        }
        Ok(self.take_slot(&mut g))
    }

    fn take_slot(&self, g: &mut State) -> (Arc<Gen>, usize) {
        g.in_flight += 1;
        let n = g.in_flight;
        self.in_flight.store(n, Relaxed);
        if n > self.max_in_flight.load(Relaxed) {
            self.max_in_flight.store(n, Relaxed);
        }
        // Invariant: callers checked `shut`, and `gen` is only None after
        // `shut` is set.
        let gen = g
            .gen
            .clone()
            .expect("engine generation present while not shut down");
        (gen, n)
    }

    /// The engine-thread variant of [`Gate::admit`]: never blocks. If no
    /// slot is free (or a swap is draining) the request in `item` is moved
    /// to the deferred list and `Ok(None)` is returned.
    pub(crate) fn admit_or_defer(
        &self,
        item: impl FnOnce() -> Deferred,
    ) -> Result<Option<(Arc<Gen>, usize)>, Error> {
        let mut g = self.lock();
        if g.shut {
            return Err(Error::Shutdown);
        }
        if !g.suspended && !g.held && g.in_flight < g.queue_depth && g.deferred.is_empty() {
            return Ok(Some(self.take_slot(&mut g)));
        }
        g.deferred.push_back(item());
        Ok(None)
    }

    /// Completes one admitted request; returns a deferred request for the
    /// caller to resubmit if one can now be admitted.
    pub(crate) fn release(&self) -> Option<Deferred> {
        let mut g = self.lock();
        g.in_flight -= 1;
        self.in_flight.store(g.in_flight, Relaxed);
        if g.waiters > 0 {
            self.cv.notify_all();
        }
        if !g.deferred.is_empty()
            && !g.suspended
            && !g.held
            && !g.shut
            && g.in_flight < g.queue_depth
        {
            return g.deferred.pop_front();
        }
        None
    }

    /// Holds admission (`on`: callers block, engine threads defer, as while
    /// a swap drains, but until released) or releases it, waking waiters.
    pub(crate) fn hold(&self, on: bool) {
        let mut g = self.lock();
        g.held = on;
        if !on && g.waiters > 0 {
            self.cv.notify_all();
        }
    }

    /// True while [`Gate::hold`] holds admission.
    pub(crate) fn held(&self) -> bool {
        self.lock().held
    }

    /// Takes every deferred request (for replay after a resume, or to fail
    /// them at shutdown).
    pub(crate) fn take_deferred(&self) -> VecDeque<Deferred> {
        std::mem::take(&mut self.lock().deferred)
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
        let old = g
            .gen
            .replace(new)
            .expect("engine generation present while not shut down");
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
