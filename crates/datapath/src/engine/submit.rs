//! Submission: admission (the gate), the choke point (`check`), then the
//! mode; the per-thread trampoline that keeps a resubmitting callback from
//! recursing, and the replay of requests the gate deferred.

use std::sync::Arc;
use std::time::Instant;

use super::generation::Pipe;
use super::{catch, Core, Engine};
use crate::gate;
use crate::mode::gather::{self, Plug};
use crate::mode::inline::Pass;
use crate::stats::Path;
use crate::{check, mode, segments};
use crate::{Completion, Gen, Hint, Request};

thread_local! {
    /// Set while this thread is inside [`dispatch`].
    static DISPATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Requests submitted by completion callbacks running inside an outer
    /// [`dispatch`] on this thread, run once it returns.
    static TRAMPOLINE: std::cell::RefCell<std::collections::VecDeque<(Arc<Core>, gate::Deferred, bool)>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// [`Engine::submit`]: a callback that runs inline (inside `submit`) and
/// submits again does not recurse: its request runs after the outer one
/// returns, so a resubmitting client cannot overflow the stack.
/// `head`: see [`Gate::admit_or_defer`](gate::Gate::admit_or_defer).
/// `hint`: the frontend's, for this request only (see
/// [`Engine::submit_hinted`]); a request queued on the trampoline runs
/// without it, later, when the caller's queue may look different.
/// `plug`: the caller's gathering; the requests queued on the trampoline
/// meanwhile run through it too (after what it submitted before them).
fn submit_trampolined(
    core: &Arc<Core>,
    plug: &mut Plug,
    req: Request,
    done: impl FnOnce(Completion) + Send + 'static,
    head: bool,
    hint: Option<Hint>,
) {
    if DISPATCHING.with(|d| d.get()) {
        TRAMPOLINE.with(|t| {
            t.borrow_mut()
                .push_back((core.clone(), (req, Box::new(done)), head))
        });
        return;
    }
    DISPATCHING.with(|d| d.set(true));
    // A callback panicking in one request must neither strand the requests
    // queued on the trampoline nor leave this thread marked as dispatching
    // (its later submits would only queue): drain, then re-raise the first.
    let mut panicked = catch(|| dispatch(core, plug, req, done, head, hint));
    while let Some((core, (req, done), head)) = TRAMPOLINE.with(|t| t.borrow_mut().pop_front()) {
        let p = catch(|| dispatch(&core, plug, req, done, head, None));
        panicked = panicked.or(p);
    }
    DISPATCHING.with(|d| d.set(false));
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

/// Admission, the choke point, then the mode, gathering into `plug`.
pub(super) fn dispatch(
    core: &Arc<Core>,
    plug: &mut Plug,
    req: Request,
    done: impl FnOnce(Completion) + Send + 'static,
    head: bool,
    hint: Option<Hint>,
) {
    if gate::on_engine_thread() {
        // Never block an engine thread (see gate.rs): park the request on
        // the deferred list instead.
        return match core.gate.admit_or_defer((req, Box::new(done)), head) {
            Ok(Some(((gen, _), (req, done)))) => run_admitted(plug, gen, req, hint, done),
            Ok(None) => {}
            Err((e, (_, done))) => done(Err(e)),
        };
    }
    let admitted = match core.gate.admit_fast() {
        Some(a) => Ok(a),
        None => {
            // About to wait for a slot: what the plug gathered holds
            // slots, so it runs first.
            plug.flush();
            reap_then_admit(core)
        }
    };
    match admitted {
        Ok((gen, _)) => run_admitted(plug, gen, req, hint, done),
        Err(e) => done(Err(e)),
    }
}

/// Admission for a submitter that found the queue full: it reaps the
/// backend's completions itself ([`backend::Backend::reap`]) while that
/// frees slots, then waits in the gate as before.
fn reap_then_admit(core: &Core) -> Result<(Arc<Gen>, usize), crate::Error> {
    if let Some(gen) = core.gate.current() {
        while gen.ctx.backend.reap() > 0 {
            if let Some(a) = core.gate.admit_fast() {
                return Ok(a);
            }
        }
    }
    core.gate.admit()
}

/// The choke point, then the mode, for a request holding a slot of `gen`.
fn run_admitted(
    plug: &mut Plug,
    gen: Arc<Gen>,
    req: Request,
    hint: Option<Hint>,
    done: impl FnOnce(Completion) + Send + 'static,
) {
    let t0 = Instant::now();
    let ctx = &*gen.ctx;
    let w = match check::check(ctx, req) {
        Ok(w) => w,
        Err((dir, e)) => return ctx.complete(dir, Path::Inline, 0, t0, Err(e), done),
    };
    // A multi-target request that crosses from one device run to another
    // (targets at different distances on the device): its pieces run
    // here, in order, unfused (see `segments`).
    if let Some(segs) = ctx.segs.as_ref().filter(|s| !s.uniform) {
        if segments::crosses(segs, &w) {
            plug.settle();
            let dir = w.dir();
            let mut bytes = 0;
            let res = segments::run_split(segs, w, |piece| {
                let (_, n, r) = mode::inline::exec(ctx, piece, Pass::Two);
                bytes += n;
                r
            });
            return ctx.complete(dir, Path::Inline, bytes, t0, res, done);
        }
    }
    // Adaptive on a backend that lends its memory (the ramdisk, a file on
    // tmpfs) runs fused instead: a copy it saves beats a ring it would
    // feed.
    let gathers = match gen.pipe {
        Pipe::Inline => true,
        Pipe::Adaptive(_) => !mode::inline::lends(ctx),
        Pipe::Classic(_) => false,
    };
    if gathers && gather::wants(plug, &gen, &w, hint) {
        let last = hint.is_none_or(|h| h.ready == 0);
        return gather::add(plug, gen.clone(), w, t0, Box::new(done), last);
    }
    // Whatever the plug gathered was submitted before this request, and
    // has completed when it runs.
    plug.settle();
    match &gen.pipe {
        Pipe::Inline => mode::inline::run(ctx, w, t0, Pass::Two, done),
        Pipe::Classic(c) => c.submit(ctx, w, t0, done),
        Pipe::Adaptive(a) => a.submit(ctx, w, t0, hint, done),
    }
}

/// Resubmits requests the gate deferred. They have left the deferred list,
/// so a panicking callback must not stop the rest: every one is submitted,
/// then the first panic is re-raised.
///
/// `head`: `items` is the one request [`Gate::release`](gate::Gate::release)
/// took off the list's front with the slot it freed.
pub(super) fn replay(
    core: &Arc<Core>,
    items: impl IntoIterator<Item = gate::Deferred>,
    head: bool,
) {
    let mut panicked = None;
    for (req, done) in items {
        // Each a plug of one: replayed without a hint, nothing is gathered.
        let p = catch(|| submit_trampolined(core, &mut Plug::new(), req, done, head, None));
        panicked = panicked.or(p);
    }
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

impl Engine {
    /// Submits a request; `done` runs exactly once, on some engine or
    /// caller thread. Blocks while `queue_depth` requests are in flight or
    /// a reconfiguration is draining the engine. A callback that panics on
    /// the calling thread has its panic re-raised from here, once the
    /// requests waiting behind it have been passed on. Gathers nothing (a
    /// plug of one, see [`Plug`]).
    pub fn submit(&self, req: Request, done: impl FnOnce(Completion) + Send + 'static) {
        submit_trampolined(&self.core, &mut Plug::new(), req, done, false, None);
    }

    /// [`Engine::submit`] with what the frontend knows about its caller's
    /// queue (see [`Hint`]). The hint applies to this request only; one
    /// deferred by admission or queued behind a callback's own submission
    /// runs without it. A plug of one: a request the hint says to gather
    /// runs as a batch of one before this returns; gathering across calls
    /// takes a [`Plug`] ([`Engine::submit_plugged`]).
    pub fn submit_hinted(
        &self,
        req: Request,
        hint: Hint,
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        submit_trampolined(&self.core, &mut Plug::new(), req, done, false, Some(hint));
    }

    /// [`Engine::submit_hinted`] gathering into `plug`, the caller's (one
    /// per submitting context): reads and writes the hint says more follow
    /// wait there and run as one backend batch (see [`Plug`] for when).
    /// A request that is not gathered first runs what `plug` gathered and
    /// waits for what it submitted asynchronously, so it runs after them.
    pub fn submit_plugged(
        &self,
        plug: &mut Plug,
        req: Request,
        hint: Hint,
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        submit_trampolined(&self.core, plug, req, done, false, Some(hint));
    }

    /// Runs the completions of requests in flight on the backend on the
    /// calling thread ([`backend::Backend::reap`]), as a submitter that
    /// found the queue full does: a caller about to wait for one of its
    /// requests to complete calls it instead of sleeping until the
    /// backend's completion thread runs that request's callback and wakes
    /// it (one cross-core hop per request fewer). Runs what `plug` (the
    /// caller's) gathered first. Returns the requests completed; 0 when
    /// the backend has no such queue, has nothing in flight, or none
    /// completed within its short wait (then wait as before: the callbacks
    /// run elsewhere). Never from a completion callback or an engine
    /// thread (returns 0).
    pub fn reap(&self, plug: &mut Plug) -> usize {
        if gate::on_engine_thread()
            || backend::on_completion_thread()
            || DISPATCHING.with(|d| d.get())
        {
            return 0;
        }
        plug.flush();
        match self.core.gate.current() {
            Some(gen) => gen.ctx.backend.reap(),
            None => 0,
        }
    }
}
