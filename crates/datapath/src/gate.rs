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
//!
//!  luksSuspend / luksResume (Engine::suspend / resume):
//!    held = true ─► swap to a cipherless Gen ... swap to a keyed Gen ─► held = false
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
//!
//! # No lock on the hot path
//!
//! The request count and the gate's flags share one atomic word
//! (`Gate::state`): admitting is a compare-and-swap that succeeds while
//! the engine is neither suspended nor full, releasing is one `fetch_sub`.
//! The mutex is taken only off that path: to wait (full, suspended), to
//! wake waiters (the `WAITERS` flag tells a releaser there are some), for
//! the deferred list (`DEFERRED`), and for swaps. Because the flags and the
//! count are one word, a suspender that set `SUSPENDED` either sees a
//! racing admitter's slot (and waits for it) or the admitter sees the flag
//! (and waits): a generation cannot change under a request that holds a
//! slot. So each thread caches the current generation with the gate's
//! epoch (unique across engines) and takes the lock only when the epoch
//! moved.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use crate::{Done, Error, Gen, Request};

/// A request parked by an engine thread (dm's deferred bio list).
pub(crate) type Deferred = (Request, Done);

thread_local! {
    static ENGINE_THREAD: Cell<bool> = const { Cell::new(false) };
    /// This thread's view of the last generation it was admitted under:
    /// the gate epoch and the generation (weak: a swapped-out generation
    /// must not be kept alive by an idle thread).
    static CACHED: RefCell<(u64, Weak<Gen>)> = const { RefCell::new((0, Weak::new())) };
}

/// Epochs handed out to generations, unique across every engine.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// Marks the calling thread as an engine thread (it must never block in
/// admission).
pub(crate) fn mark_engine_thread() {
    ENGINE_THREAD.with(|c| c.set(true));
}

/// True on an engine worker thread.
pub(crate) fn on_engine_thread() -> bool {
    ENGINE_THREAD.with(|c| c.get())
}

/// `Gate::state`: requests in flight (the low 32 bits).
const COUNT: u64 = (1 << 32) - 1;
/// `Gate::state`: a swap or shutdown is draining the engine.
const SUSPENDED: u64 = 1 << 32;
/// `Gate::state`: shut down for good.
const SHUT: u64 = 1 << 33;
/// `Gate::state`: threads wait on the condvar (releasers must wake them).
const WAITERS: u64 = 1 << 34;
/// `Gate::state`: the deferred list is not empty.
const DEFERRED: u64 = 1 << 35;
/// `Gate::state`: held by the user (`luksSuspend`) until [`Gate::hold`]
/// releases it: nothing is admitted, swaps still go through.
const HELD: u64 = 1 << 36;

/// What the mutex guards (everything off the hot path).
struct State {
    /// Threads blocked in `admit` or `suspend`.
    waiters: usize,
    gen: Option<Arc<Gen>>,
    deferred: VecDeque<Deferred>,
}

/// The admission gate.
pub(crate) struct Gate {
    /// Requests in flight (`COUNT`) and the flags; see the module doc.
    state: AtomicU64,
    /// Most requests in flight at once (the generation's queue depth).
    queue_depth: AtomicUsize,
    /// The installed generation's epoch (changes only while suspended and
    /// drained, under the lock).
    epoch: AtomicU64,
    st: Mutex<State>,
    cv: Condvar,
    /// Highest in-flight count seen.
    pub(crate) max_in_flight: AtomicUsize,
}

impl Gate {
    /// A gate with nothing installed yet: [`Gate::install`] must follow
    /// before the first `admit`.
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            queue_depth: AtomicUsize::new(1),
            epoch: AtomicU64::new(0),
            st: Mutex::new(State {
                waiters: 0,
                gen: None,
                deferred: VecDeque::new(),
            }),
            cv: Condvar::new(),
            max_in_flight: AtomicUsize::new(0),
        }
    }

    /// Installs the first generation.
    pub(crate) fn install(&self, gen: Arc<Gen>) {
        let mut g = self.lock();
        self.set_gen(&mut g, gen);
    }

    /// Makes `gen` current (under the lock, with nothing in flight).
    fn set_gen(&self, g: &mut State, gen: Arc<Gen>) -> Option<Arc<Gen>> {
        self.queue_depth
            .store(gen.ctx.cfg.queue_depth.max(1), SeqCst);
        self.epoch.store(NEXT_EPOCH.fetch_add(1, Relaxed), SeqCst);
        g.gen.replace(gen)
    }

    /// Requests in flight now.
    pub(crate) fn in_flight(&self) -> usize {
        (self.state.load(Relaxed) & COUNT) as usize
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state
        // half-updated (each critical section is a few plain assignments),
        // so a poisoned lock is still consistent.
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits on the condvar. The caller announced itself with
    /// [`Gate::will_wait`] before its last check of the state, so a
    /// releaser that frees what it waits for finds `WAITERS` and wakes it.
    fn wait<'a>(&self, mut g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        g.waiters += 1;
        let mut g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        g.waiters -= 1;
        if g.waiters == 0 {
            self.state.fetch_and(!WAITERS, SeqCst);
        }
        g
    }

    /// Sets `WAITERS` (under the lock) and returns the state after it.
    fn will_wait(&self) -> u64 {
        self.state.fetch_or(WAITERS, SeqCst) | WAITERS
    }

    /// Takes a slot if the engine is open and not full: one CAS, no lock.
    fn try_slot(&self) -> Option<usize> {
        let qd = self.queue_depth.load(Relaxed) as u64;
        let mut s = self.state.load(Relaxed);
        loop {
            if s & (SUSPENDED | SHUT | HELD) != 0 || s & COUNT >= qd {
                return None;
            }
            match self.state.compare_exchange_weak(s, s + 1, SeqCst, Relaxed) {
                Ok(_) => {
                    let n = ((s & COUNT) + 1) as usize;
                    if n > self.max_in_flight.load(Relaxed) {
                        self.max_in_flight.fetch_max(n, Relaxed);
                    }
                    return Some(n);
                }
                Err(now) => s = now,
            }
        }
    }

    /// The generation of a request holding a slot: this thread's cached
    /// one while the epoch has not moved (it cannot move while the slot is
    /// held), else read under the lock.
    fn gen_of_slot(&self) -> Arc<Gen> {
        let epoch = self.epoch.load(SeqCst);
        let hit = CACHED.with(|c| {
            let c = c.borrow();
            (c.0 == epoch).then(|| c.1.upgrade()).flatten()
        });
        if let Some(g) = hit {
            return g;
        }
        // Invariant: a slot is only taken while not shut down, and `gen`
        // is only None after shutdown.
        let gen = self
            .lock()
            .gen
            .clone()
            .expect("engine generation present while not shut down");
        CACHED.with(|c| *c.borrow_mut() = (epoch, Arc::downgrade(&gen)));
        gen
    }

    /// Admits one request without blocking or locking, if a slot is free
    /// and no swap is draining: its generation and the number of requests
    /// in flight including it. `None`: [`Gate::admit`] would wait (or fail).
    pub(crate) fn admit_fast(&self) -> Option<(Arc<Gen>, usize)> {
        let n = self.try_slot()?;
        Some((self.gen_of_slot(), n))
    }

    /// Admits one request: returns its generation and the number of requests
    /// in flight including it. Blocks while the queue is full or a swap is
    /// in progress.
    pub(crate) fn admit(&self) -> Result<(Arc<Gen>, usize), Error> {
        if let Some(a) = self.admit_fast() {
            return Ok(a);
        }
        let mut g = self.lock();
        loop {
            if self.will_wait() & SHUT != 0 {
                return Err(Error::Shutdown);
            }
            // Checked after announcing: a release from here on sees WAITERS.
            if let Some(n) = self.try_slot() {
                if g.waiters == 0 {
                    self.state.fetch_and(!WAITERS, SeqCst);
                }
                drop(g);
                return Ok((self.gen_of_slot(), n));
            }
            g = self.wait(g);
        }
    }

    /// The engine-thread variant of [`Gate::admit`]: never blocks. If no
    /// slot is free (or a swap is draining) `item` is moved to the deferred
    /// list and `Ok(None)` is returned; else it comes back admitted (and
    /// with the error if the engine is shut down).
    ///
    /// `head` says `item` is the list's former head, handed back by
    /// [`Gate::release`] with the slot it freed: it must not queue behind
    /// the requests deferred after it (that slot would stay unused, and with
    /// nothing else in flight no release would ever come to replay them),
    /// and if it cannot be admitted after all it goes back to the front.
    #[allow(clippy::type_complexity)]
    pub(crate) fn admit_or_defer(
        &self,
        item: Deferred,
        head: bool,
    ) -> Result<Option<((Arc<Gen>, usize), Deferred)>, (Error, Deferred)> {
        let mut g = self.lock();
        if self.state.load(SeqCst) & SHUT != 0 {
            return Err((Error::Shutdown, item));
        }
        // Deferred requests go first (FIFO).
        if !head && !g.deferred.is_empty() {
            g.deferred.push_back(item);
            return Ok(None);
        }
        if let Some(n) = self.try_slot() {
            drop(g);
            return Ok(Some(((self.gen_of_slot(), n), item)));
        }
        if head {
            g.deferred.push_front(item);
        } else {
            g.deferred.push_back(item);
        }
        self.state.fetch_or(DEFERRED, SeqCst);
        // A release between the check above and the flag did not look at
        // the list: if it freed a slot, this request takes it now.
        if let Some(n) = self.try_slot() {
            let item = if head {
                g.deferred.pop_front()
            } else {
                g.deferred.pop_back()
            };
            let item = item.expect("pushed just above");
            if g.deferred.is_empty() {
                self.state.fetch_and(!DEFERRED, SeqCst);
            }
            drop(g);
            return Ok(Some(((self.gen_of_slot(), n), item)));
        }
        Ok(None)
    }

    /// The deferred list's head if it can be admitted in state `s`.
    fn pop_deferred(&self, g: &mut State, s: u64) -> Option<Deferred> {
        let qd = self.queue_depth.load(Relaxed) as u64;
        if g.deferred.is_empty() || s & (SUSPENDED | SHUT | HELD) != 0 || s & COUNT >= qd {
            return None;
        }
        let d = g.deferred.pop_front();
        if g.deferred.is_empty() {
            self.state.fetch_and(!DEFERRED, SeqCst);
        }
        d
    }

    /// Completes one admitted request; returns a deferred request for the
    /// caller to resubmit if one can now be admitted.
    pub(crate) fn release(&self) -> Option<Deferred> {
        let s = self.state.fetch_sub(1, SeqCst) - 1;
        if s & (WAITERS | DEFERRED) == 0 {
            return None;
        }
        let mut g = self.lock();
        if g.waiters > 0 {
            self.cv.notify_all();
        }
        let s = self.state.load(SeqCst);
        self.pop_deferred(&mut g, s)
    }

    /// Holds admission (`on`: callers block, engine threads defer, as while
    /// a swap drains, but until released) or releases it, waking waiters.
    pub(crate) fn hold(&self, on: bool) {
        let g = self.lock();
        if on {
            self.state.fetch_or(HELD, SeqCst);
        } else {
            self.state.fetch_and(!HELD, SeqCst);
            if g.waiters > 0 {
                self.cv.notify_all();
            }
        }
    }

    /// True when a request waits to be admitted: a caller blocked in
    /// `admit` (held, draining or full) or one an engine thread parked.
    pub(crate) fn has_waiters(&self) -> bool {
        self.state.load(SeqCst) & (WAITERS | DEFERRED) != 0
    }

    /// True while [`Gate::hold`] holds admission.
    pub(crate) fn held(&self) -> bool {
        self.state.load(SeqCst) & HELD != 0
    }

    /// Takes every deferred request (for replay after a resume, or to fail
    /// them at shutdown).
    pub(crate) fn take_deferred(&self) -> VecDeque<Deferred> {
        let mut g = self.lock();
        self.state.fetch_and(!DEFERRED, SeqCst);
        std::mem::take(&mut g.deferred)
    }

    /// Suspends admission and waits until nothing is in flight; other
    /// suspenders queue behind. Fails if the engine is shut down.
    fn suspend(&self) -> Result<MutexGuard<'_, State>, Error> {
        let mut g = self.lock();
        loop {
            let s = self.will_wait();
            if s & SHUT != 0 {
                return Err(Error::Shutdown);
            }
            if s & SUSPENDED == 0 {
                break;
            }
            g = self.wait(g);
        }
        self.state.fetch_or(SUSPENDED, SeqCst);
        while self.will_wait() & COUNT > 0 {
            g = self.wait(g);
        }
        Ok(g)
    }

    /// Lifts a suspension (setting `also`) and wakes whoever waits.
    fn resume(&self, g: &State, also: u64) {
        self.state.fetch_or(also, SeqCst);
        self.state.fetch_and(!SUSPENDED, SeqCst);
        if g.waiters > 0 {
            self.cv.notify_all();
        } else {
            self.state.fetch_and(!WAITERS, SeqCst);
        }
    }

    /// dm suspend → swap → resume: installs `new`, returns the old
    /// generation (drained: nothing of it is in flight).
    pub(crate) fn swap(&self, new: Arc<Gen>) -> Result<Arc<Gen>, Error> {
        let mut g = self.suspend()?;
        // Invariant: installed at start, taken only at shutdown.
        let old = self
            .set_gen(&mut g, new)
            .expect("engine generation present while not shut down");
        self.resume(&g, 0);
        Ok(old)
    }

    /// Stops admitting for good, drains, and hands back the last generation
    /// (None if already shut down).
    pub(crate) fn close(&self) -> Option<Arc<Gen>> {
        let mut g = self.suspend().ok()?;
        let old = g.gen.take();
        self.resume(&g, SHUT);
        old
    }

    /// The current generation (None after shutdown).
    pub(crate) fn current(&self) -> Option<Arc<Gen>> {
        self.lock().gen.clone()
    }
}
