//! Adaptive mode (ours): inline by default; a whole request handed to a
//! warm helper when the caller keeps several in flight; one request's
//! crypto split across cores when that pays.
//!
//! Hand-written. The facts it is built on (measured on the 2-vCPU VM this
//! was developed on; see `ucrypt bench --profile grid`): waking a sleeping thread on
//! another core costs ~80 µs end to end, while a 4 KiB AES-XTS sector run
//! costs ~0.4 µs. A queue hop per request, which is what dm-crypt's
//! workqueues add, therefore loses by two orders of magnitude for small
//! requests, and only parallelism can pay it back. So, per request:
//!
//! ```text
//!  submit ─► plan(size, submitters, idle cores, learned caller depth)
//!     ├─ inline (small request, or every core already has a submitter):
//!     │     exactly the inline path (mode/inline.rs)
//!     ├─ hand-off (≥ OFFLOAD_MIN, a helper spinning idle, and the caller
//!     │     seen keeping more than one request in flight): the request is
//!     │     queued for that helper, `submit` returns at once and the
//!     │     submitter runs the caller's next request itself; the helper
//!     │     completes this one. dm-crypt's workqueue spread, minus the
//!     │     wake-up: the helper is already running.
//!     └─ split (large request, an idle core, a backend in memory):
//!           the buffer is cut into chunks (BytesMut::split_to, no copy),
//!           posted on the board; the submitter and any awake helper claim
//!           chunks with one atomic counter; the submitter waits for the
//!           last chunk, glues the chunks back (unsplit, no copy) and
//!           completes in place. What a chunk does depends on the backend:
//!           ├─ in memory (it lends its bytes: the ramdisk, a mapped tmpfs
//!           │     file): backend IO + crypto for its chunk (an IO there is
//!           │     a copy or the fused crypto itself, so it splits for free);
//!           └─ real storage (files, block devices, RBD), only when forced
//!                 (`Engine::force_split`): crypto only; the submitter reads
//!                 the whole request before posting it, or writes it whole
//!                 (FUA kept) once every chunk is encrypted. Unforced, such
//!                 a request runs inline: there the IO dominates, and the
//!                 split cost more than the crypto it spread (see split.rs).
//! ```
//!
//! A frontend that knows its caller's queue says so
//! ([`crate::Engine::submit_hinted`]): with requests behind this one, a
//! request of at least [`OFFLOAD_MIN`] goes to a helper that is not already
//! busy (woken if parked: the submitter does not wait for it), else runs
//! inline, so the submitter works as one more helper; with none behind, it
//! is split or inline as below, never handed off. Hinted hand-offs are not
//! scored on the caller's depth, only on how soon their helper began them:
//! one begun later than it took to run (a helper woken onto a core other
//! load keeps busy) pauses them with the same back-off (`hint.rs`).
//! On a completion-driven backend such requests are gathered instead
//! (mode/gather.rs) and only their crypto moves, by the same rules
//! (`crypto.rs`). Without a hint:
//!
//! The caller's queue depth cannot be seen up front (an inline request
//! completes before the next one is submitted), so it is learned: a helper
//! that finishes a handed-off request checks whether its submitter has
//! submitted again meanwhile (or within [`OFFLOAD_GRACE`]). If not, the
//! caller was waiting for it (queue depth 1) and paid a wake-up; hand-offs
//! then pause, 5 ms doubling to 80 ms, so such a caller loses at most one
//! wake-up per pause. Each overlapped hand-off resets the back-off and,
//! for [`PIPELINED_HOLD`], makes large requests go whole to helpers rather
//! than split.
//!
//! dm-crypt never splits one bio across CPUs; it only spreads whole bios.
//! Splitting gets the parallelism even at queue depth 1, and completing in
//! the submitting thread means the submitter is never the one waiting for a
//! cross-core wake-up. Claiming is dynamic, so a helper that wakes late
//! simply finds fewer chunks left: the split never costs more than a few
//! atomics over inline.
//!
//! "Idle cores" is measured, not assumed: besides the engine's own queue
//! depth (other submitters inside the engine), the planner samples the
//! machine's runnable-thread count (`/proc/loadavg`, at most every 2 ms, see
//! `cpu::Load`). A split is only worth it if its helper really runs at the
//! same time: measured on a 2-vCPU VM shared with ~10 runnable processes,
//! forced splitting halved throughput (the helper is preempted while it
//! holds a chunk, and the owner waits a whole scheduler slice for it), so
//! with no idle core the request stays inline.
//!
//! Helpers are kept warm by spinning only while that pays: after a window
//! each helper learns (`spin.rs`: from [`SPIN_WINDOW`] down to 20 µs when
//! its work comes further apart than a wake-up costs) with nothing to do,
//! or as soon as every core has a
//! submitter of its own (queue depth ≥ CPUs, remembered for
//! [`CONTENDED_HOLD`]), a helper parks, so an idle engine burns no CPU and a
//! fully loaded machine is not robbed by spinners. A parked helper is woken
//! (a futex wake, then ~80 µs until it arrives) only for requests of at least
//! [`WAKE_MIN`] bytes; smaller ones (from [`SPLIT_MIN`]) split only when a
//! helper is already spinning.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::check::Work;
use crate::mode::inline::{self, Pass};
use crate::stats::Path;
use crate::{Completion, Ctx, Done, Error, Hint};

mod crypto;
mod hint;
mod spin;
mod split;
mod submitters;

use spin::Spin;
use split::{run_chunks, SplitJob};
use submitters::Submitters;

/// Smallest request split when a helper is already awake.
pub const SPLIT_MIN: u64 = 128 << 10;
/// Smallest request for which a parked helper is woken.
pub const WAKE_MIN: u64 = 512 << 10;
/// Longest an idle helper spins before parking (see `spin.rs` for how
/// each helper learns its own window, down to 20 µs).
pub const SPIN_WINDOW: Duration = Duration::from_micros(300);
/// How long a sighting of "every core has a submitter" blocks splitting.
pub const CONTENDED_HOLD: Duration = Duration::from_millis(5);
/// First pause in hand-offs after one was not overlapped (the submitter
/// waited for it: a queue-depth-1 caller); doubled per further miss.
const OFFLOAD_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause in hand-offs.
const OFFLOAD_BACKOFF_MAX: Duration = Duration::from_millis(80);
/// Least time between two wake-ups of a parked helper for a hand-off.
const OFFLOAD_WAKE_EVERY: Duration = Duration::from_millis(1);
/// Smallest request handed off whole: below it the hand-off's own cost
/// (cache lines of the request, its buffer and the callback crossing cores)
/// eats the overlap (grid, 4k QD16 one job: 0.75 of inline).
const OFFLOAD_MIN: u64 = 16 << 10;
/// How long a helper that finished a hand-off waits for the submitter's
/// next submission before scoring the hand-off a miss.
pub const OFFLOAD_GRACE: Duration = Duration::from_micros(3);
/// How long after the last overlapped hand-off large requests are handed
/// off whole rather than split (the caller keeps several in flight).
pub const PIPELINED_HOLD: Duration = Duration::from_millis(5);

/// A whole request handed to an idle helper.
struct Offload {
    w: Work,
    t0: Instant,
    done: Done,
    /// `Board::submits` when it was handed off.
    seq: u64,
    /// Scored as a hit or a miss of the learned queue depth (not when the
    /// frontend's hint chose it).
    scored: bool,
}

/// Work queued for a helper.
enum Task {
    /// A whole request (IO and crypto).
    Request(Offload),
    /// The crypto of a request the gather path has on a completion-driven
    /// backend (see `crypto.rs`), queued at the instant given if its start
    /// is scored.
    Crypto(Option<Instant>, Box<dyn FnOnce() + Send>),
}

/// Why a request is handed off whole.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OffloadKind {
    /// The learned queue depth (see [`Adaptive::offload_ok`]).
    Learned,
    /// The frontend's [`Hint`] (see [`Adaptive::hinted_offload_ok`]).
    Hinted,
    /// The test hook.
    Forced,
}

struct Board {
    jobs: Mutex<Vec<Arc<SplitJob>>>,
    open: AtomicUsize,
    spinning: AtomicUsize,
    /// Helpers not parked (spinning or working).
    awake: AtomicUsize,
    parked: Mutex<usize>,
    wake: Condvar,
    closed: AtomicBool,
    /// Whole requests and crypto handed to helpers, and their count.
    handoff: Mutex<VecDeque<Task>>,
    handoff_len: AtomicUsize,
    /// Handed-off requests not yet completed.
    offloaded: AtomicUsize,
    /// Helpers running a handed-off request.
    busy: AtomicUsize,
    /// Hand-offs, and submissions made while one was in flight (the
    /// overlap test's clock: see `note_submit`).
    submits: AtomicU64,
    /// Requests the test hook (`force_split`) has seen.
    forced: AtomicU64,
    /// No hand-offs before this time (ns since the engine's epoch).
    offload_off_until: AtomicU64,
    /// Hand-offs in a row that the submitter waited for.
    offload_misses: AtomicU32,
    /// No hinted hand-offs before this time (ns since the engine's epoch).
    hinted_off_until: AtomicU64,
    /// Hinted hand-offs in a row that a helper started late.
    hinted_late: AtomicU32,
    /// Last time a parked helper was woken for a hand-off (ns).
    offload_woken_at: AtomicU64,
    /// Last overlapped hand-off (ns; 0 = never).
    pipelined_at: AtomicU64,
    /// A parked helper is asked to spin (set under `parked`).
    nudged: AtomicBool,
    /// Threads inside [`Adaptive::submit`].
    active: AtomicUsize,
    /// Threads that submitted large requests lately (`submitters.rs`).
    submitters: Submitters,
}

/// Counts a thread out of [`Board::active`] on every return path.
struct Active<'a>(&'a AtomicUsize);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// A running adaptive pipeline: the board and its helper threads.
pub(crate) struct Adaptive {
    board: Arc<Board>,
    helpers: usize,
}

impl Adaptive {
    /// Starts `workers - 1` helpers (the submitter is the other worker).
    pub(crate) fn start(ctx: Arc<Ctx>, handles: &mut Vec<JoinHandle<()>>) -> Result<Self, Error> {
        let workers = if ctx.cfg.workers == 0 {
            ctx.core.ncpu
        } else {
            ctx.cfg.workers
        };
        let board = Arc::new(Board::new());
        let mut me = Self {
            board: board.clone(),
            helpers: 0,
        };
        for i in 0..workers.saturating_sub(1) {
            let (b, c) = (board.clone(), ctx.clone());
            let h = std::thread::Builder::new()
                .name(format!("ucrypt-helper/{i}"))
                .spawn(move || {
                    crate::gate::mark_engine_thread();
                    helper(&b, &c)
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    me.close();
                    return Err(Error::Io(e));
                }
            }
            me.helpers += 1;
        }
        Ok(me)
    }

    /// Runs a checked request: split, handed off whole to an idle helper,
    /// or inline.
    pub(crate) fn submit(
        &self,
        ctx: &Ctx,
        w: Work,
        t0: Instant,
        hint: Option<Hint>,
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        let len = match &w {
            Work::Read(r) | Work::Write(r, ..) => r.len(),
            _ => 0,
        };
        // Tell a pending hand-off that its submitter is back (see
        // `run_offload`); with none pending this writes nothing.
        self.note_submit();
        let forced = ctx.core.force_split.load(Relaxed);
        if len < OFFLOAD_MIN.min(SPLIT_MIN) && !forced {
            // Too small to move: the inline path.
            return inline::run(ctx, w, t0, Pass::adaptive(ctx), done);
        }
        // Threads that keep submitting, inside `submit` right now or not
        // (an NBD connection receiving its next payload still keeps a
        // core busy; see `submitters.rs`), this one included.
        let now = ctx.core.nanos(t0);
        let noted = self.board.submitters.note(now);
        if noted >= ctx.core.ncpu && !forced {
            // Every core has a submitter: nothing moves (`offload_ok`,
            // `hinted_offload_ok` and `plan` all say so), so take the
            // inline path without a write to the board, where each of
            // these submitters would bump `active` twice. (On the 2-vCPU
            // dev VM the saving was below the noise: 16k reads, 2-4 jobs.)
            ctx.core.saturated(now, noted);
            return inline::run(ctx, w, t0, Pass::adaptive(ctx), done);
        }
        // Threads running a request of a movable size right now in
        // submitting context, this one included (requests handed off are
        // not counted: their submitter has moved on).
        let submitters = (self.board.active.fetch_add(1, SeqCst) + 1).max(noted);
        let _active = Active(&self.board.active);
        if len == 0 {
            return inline::run(ctx, w, t0, Pass::adaptive(ctx), done);
        }
        if forced && self.helpers > 0 && ctx.crypt.is_some() {
            // Test hook: every other request handed off, the rest split.
            if self.board.forced.fetch_add(1, Relaxed) % 2 == 0 {
                return self.offload(w, t0, Box::new(done), OffloadKind::Forced);
            }
        }
        if let Some(h) = hint {
            return self.submit_hinted(ctx, w, t0, h, (len, submitters), done);
        }
        // A caller seen keeping several requests in flight gets whole
        // requests spread over cores (no chunk bookkeeping, no waiting for
        // the last chunk); otherwise a large request is split.
        let pipelined = {
            let at = self.board.pipelined_at.load(Relaxed);
            at != 0 && now.saturating_sub(at) < PIPELINED_HOLD.as_nanos() as u64
        };
        if pipelined && self.offload_ok(ctx, len, submitters, t0) {
            return self.offload(w, t0, Box::new(done), OffloadKind::Learned);
        }
        let Some((w, done)) = self.try_split(ctx, w, t0, len, submitters, done) else {
            return;
        };
        if !pipelined && self.offload_ok(ctx, len, submitters, t0) {
            return self.offload(w, t0, Box::new(done), OffloadKind::Learned);
        }
        inline::run(ctx, w, t0, Pass::adaptive(ctx), done)
    }

    /// Counts a submission that stays with its submitter, for the overlap
    /// test of a hand-off in flight (`run_offload`); with none in flight
    /// there is nothing to tell, and no shared line is written.
    fn note_submit(&self) {
        if self.board.offloaded.load(Relaxed) > 0 {
            self.board.submits.fetch_add(1, SeqCst);
        }
    }

    /// Hand the whole request to a helper or not. Worth it only when the
    /// caller keeps more than one request in flight (then the submitter
    /// runs the next one while a helper runs this one) and a helper is
    /// already spinning on an idle core (a hand-off is then a cache-line
    /// transfer, not an ~80 µs wake-up). The caller's queue depth is not
    /// visible up front (inline requests complete before the next is
    /// submitted), so it is learned: a hand-off the submitter did not
    /// overlap with a submission of its own (it waited for it: a
    /// queue-depth-1 caller) pauses hand-offs with exponential back-off;
    /// an overlapped one resets the back-off.
    fn offload_ok(&self, ctx: &Ctx, len: u64, submitters: usize, t0: Instant) -> bool {
        let Some(c) = &ctx.crypt else { return false };
        // cipher_null: only memory copies would move; never worth a hop.
        if self.helpers == 0 || c.is_null() {
            return false;
        }
        let now = ctx.core.nanos(t0);
        if now < self.board.offload_off_until.load(Relaxed) {
            return false;
        }
        if ctx.core.saturated(now, submitters) || ctx.core.contended(now, CONTENDED_HOLD) {
            return false;
        }
        // Persistent load only: a hand-off does not hold its submitter
        // up, so a helper briefly sharing its core costs little.
        let load = ctx
            .core
            .idle
            .persistent(now, self.board.awake.load(Relaxed));
        if ctx.core.saturated(now, load + submitters) {
            return false;
        }
        if len < OFFLOAD_MIN {
            return false;
        }
        let spinning = self.board.spinning.load(Relaxed);
        if spinning > self.board.handoff_len.load(Relaxed) {
            return true;
        }
        if spinning == 0 && self.board.awake.load(Relaxed) < self.helpers {
            // Nobody warm: wake one (rate-limited) for the requests that
            // follow; this one runs inline.
            let at = self.board.offload_woken_at.load(Relaxed);
            if now.saturating_sub(at) >= OFFLOAD_WAKE_EVERY.as_nanos() as u64
                && self
                    .board
                    .offload_woken_at
                    .compare_exchange(at, now, Relaxed, Relaxed)
                    .is_ok()
            {
                self.board.nudge();
            }
        }
        false
    }

    /// Queues `w` for a helper and returns; the helper completes it.
    fn offload(&self, w: Work, t0: Instant, done: Done, kind: OffloadKind) {
        // Counted in flight before numbered: a submission after this one
        // then sees it (`note_submit`) and moves `submits` past `seq`.
        self.board.offloaded.fetch_add(1, SeqCst);
        let seq = self.board.submits.fetch_add(1, SeqCst) + 1;
        let scored = kind != OffloadKind::Hinted;
        self.board
            .handoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(Task::Request(Offload {
                w,
                t0,
                done,
                seq,
                scored,
            }));
        self.board.handoff_len.fetch_add(1, SeqCst);
        if kind == OffloadKind::Forced || self.board.spinning.load(SeqCst) == 0 {
            self.board.nudge();
        }
    }

    /// Wakes and stops the helpers.
    pub(crate) fn close(&self) {
        self.board.close();
    }
}

impl Board {
    fn new() -> Self {
        Self {
            jobs: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            awake: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
            handoff: Mutex::new(VecDeque::new()),
            handoff_len: AtomicUsize::new(0),
            offloaded: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            submits: AtomicU64::new(0),
            forced: AtomicU64::new(0),
            offload_off_until: AtomicU64::new(0),
            offload_misses: AtomicU32::new(0),
            hinted_off_until: AtomicU64::new(0),
            hinted_late: AtomicU32::new(0),
            offload_woken_at: AtomicU64::new(0),
            pipelined_at: AtomicU64::new(0),
            nudged: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            submitters: Submitters::new(),
        }
    }

    /// Wakes one parked helper, if any.
    fn nudge(&self) {
        let g = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if *g > 0 {
            self.nudged.store(true, SeqCst);
            self.wake.notify_one();
        }
    }

    /// Parks the calling helper until there is work, the board closes or
    /// a submitter nudges it; true when a nudge woke it with nothing to do
    /// (it is asked to be warm for the requests that follow).
    ///
    /// The nudge is consumed by whichever helper wakes next, with work or
    /// without. Left set (a helper woken for a queued hand-off never
    /// looked at it), it sent that helper's next park straight back out
    /// as "asked": a full [`SPIN_WINDOW`] spun after every hand-off that
    /// had to wake a helper (NBD 1M QD8 writes: the helper's spin loop
    /// was 12% of the daemon's CPU samples, more than its encryption).
    fn park(&self) -> bool {
        let mut g = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        let asked = loop {
            let nudged = self.nudged.swap(false, SeqCst);
            if !self.idle() || self.closed.load(SeqCst) {
                break false;
            }
            if nudged {
                break true;
            }
            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        };
        *g -= 1;
        asked
    }

    /// Closes the board and wakes its parked helpers.
    fn close(&self) {
        self.closed.store(true, SeqCst);
        let _g = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_all();
    }

    /// True when a helper has nothing to do.
    fn idle(&self) -> bool {
        self.open.load(SeqCst) == 0 && self.handoff_len.load(SeqCst) == 0
    }

    fn take_handoff(&self) -> Option<Task> {
        if self.handoff_len.load(SeqCst) == 0 {
            return None;
        }
        let o = self
            .handoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()?;
        self.handoff_len.fetch_sub(1, SeqCst);
        Some(o)
    }
}

/// A helper: claim chunks while there are any, then run handed-off
/// requests, spin when idle (for as long as [`spin::Spin`] has learned pays),
/// park when that window passes or every core has its own submitter.
fn helper(board: &Board, ctx: &Ctx) {
    let mut spin = Spin::new();
    // Start of the idle spell in progress (None: working).
    let mut idle_since: Option<Instant> = Some(Instant::now());
    board.awake.fetch_add(1, SeqCst);
    board.spinning.fetch_add(1, SeqCst);
    let mut spins = 0u32;
    loop {
        let job = if board.open.load(SeqCst) > 0 {
            board.claimable()
        } else {
            None
        };
        let offload = if job.is_none() {
            board.take_handoff()
        } else {
            None
        };
        if job.is_some() || offload.is_some() {
            if let Some(t) = idle_since.take() {
                spin.found(t.elapsed());
            }
            board.spinning.fetch_sub(1, SeqCst);
            if let Some(job) = job {
                run_chunks(ctx, &job);
            } else if let Some(t) = offload {
                board.busy.fetch_add(1, SeqCst);
                match t {
                    Task::Request(o) => run_offload(board, ctx, o),
                    Task::Crypto(queued, f) => crypto::run(board, ctx, queued, f),
                }
                board.busy.fetch_sub(1, SeqCst);
            }
            board.spinning.fetch_add(1, SeqCst);
            continue;
        }
        if board.closed.load(SeqCst) {
            break;
        }
        spins = spins.wrapping_add(1);
        if spins % 64 != 0 {
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        let since = *idle_since.get_or_insert(now);
        if now.duration_since(since) < spin.window()
            && !ctx.core.contended(ctx.core.nanos(now), CONTENDED_HOLD)
        {
            continue;
        }
        spin.missed();
        board.spinning.fetch_sub(1, SeqCst);
        board.awake.fetch_sub(1, SeqCst);
        let asked = board.park();
        board.awake.fetch_add(1, SeqCst);
        board.spinning.fetch_add(1, SeqCst);
        if asked {
            // Nudged to be warm for the requests that follow: a fresh
            // spell, spun in full.
            spin.asked();
            idle_since = Some(Instant::now());
        }
    }
    board.spinning.fetch_sub(1, SeqCst);
    board.awake.fetch_sub(1, SeqCst);
}

/// Runs a handed-off request and completes it on this helper; first
/// scores the hand-off (see [`Adaptive::offload_ok`]).
fn run_offload(board: &Board, ctx: &Ctx, o: Offload) {
    let start = Instant::now();
    let (dir, bytes, res) = inline::exec(ctx, o.w, Pass::adaptive(ctx));
    if !o.scored {
        hint::score_start(board, ctx, o.t0, start);
        ctx.complete(dir, Path::Offload, bytes, o.t0, res, o.done);
        board.offloaded.fetch_sub(1, SeqCst);
        return;
    }
    // A caller with more in flight submits again while this ran, or within
    // a few µs; one waiting for this completion cannot.
    let mut now = Instant::now();
    let deadline = now + OFFLOAD_GRACE;
    let mut hit = board.submits.load(SeqCst) > o.seq;
    while !hit && now < deadline {
        std::hint::spin_loop();
        hit = board.submits.load(SeqCst) > o.seq;
        now = Instant::now();
    }
    let now = ctx.core.nanos(now);
    if hit {
        board.offload_misses.store(0, Relaxed);
        board.pipelined_at.store(now, Relaxed);
    } else {
        let misses = board.offload_misses.fetch_add(1, Relaxed).min(16);
        let pause = (OFFLOAD_BACKOFF_MIN.as_nanos() as u64)
            .saturating_mul(1 << misses)
            .min(OFFLOAD_BACKOFF_MAX.as_nanos() as u64);
        board.offload_off_until.store(now + pause, Relaxed);
    }
    ctx.complete(dir, Path::Offload, bytes, o.t0, res, o.done);
    // After the gate released the slot: counted in neither is harmless (a
    // submitter too few), in both would look like a second submitter.
    board.offloaded.fetch_sub(1, SeqCst);
}

/// An AES adaptive engine with two workers (one helper) that believes the
/// machine has `ncpu` CPUs, for the tests here and in `crypto.rs`.
#[cfg(test)]
fn test_engine(ncpu: usize) -> crate::Engine {
    let cfg = crate::EngineConfig {
        mode: crate::CryptMode::Adaptive,
        workers: 2,
        ..crate::EngineConfig::default()
    };
    crate::Engine::with_cpus(
        crate::layout::Layout::volume(crate::test_volume(true)).unwrap(),
        cfg,
        ncpu,
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Engine;

    /// The board's overlap clock (`submits`).
    fn submits(e: &Engine) -> u64 {
        e.current_gen()
            .and_then(|g| g.adaptive().map(|a| a.board.submits.load(SeqCst)))
            .expect("an adaptive generation")
    }

    #[test]
    fn a_saturated_engine_runs_movable_requests_without_writing_the_board() {
        // One CPU, and this thread submits: every core has a submitter.
        // One helper all the same, so hand-offs were possible.
        let e = test_engine(1);
        let data: Vec<u8> = (0..64 << 10).map(|i| (i * 31 + 7) as u8).collect();
        for i in 0..64u64 {
            e.write(i * (64 << 10), data.clone(), false).unwrap();
            assert_eq!(e.read(i * (64 << 10), 64 << 10).unwrap(), data);
        }
        // Before: one shared counter bumped per movable request (128),
        // and `active` twice more.
        assert_eq!(submits(&e), 0, "saturated requests wrote the board");
        let s = e.stats();
        assert_eq!((s.read.inline, s.write.inline), (64, 64), "{s:?}");
    }

    /// Queues a hand-off that does nothing, as a submitter would.
    fn queue_noop(b: &Board) {
        b.handoff
            .lock()
            .unwrap()
            .push_back(Task::Crypto(None, Box::new(|| {})));
        b.handoff_len.fetch_add(1, SeqCst);
    }

    /// A helper thread parked on `b` (returned once it is), which answers
    /// whether it was asked to spin.
    fn parked_helper(b: &Arc<Board>) -> std::thread::JoinHandle<bool> {
        let h = {
            let b = b.clone();
            std::thread::spawn(move || b.park())
        };
        while *b.parked.lock().unwrap() != 1 {
            std::thread::yield_now();
        }
        h
    }

    #[test]
    fn a_helper_woken_for_a_hand_off_is_not_later_taken_as_asked_to_spin() {
        let b = Arc::new(Board::new());
        let h = parked_helper(&b);
        // A submitter queues a write's crypto and wakes the parked helper.
        queue_noop(&b);
        b.nudge();
        assert!(!h.join().unwrap(), "woken for work, not asked to spin");
        assert!(b.take_handoff().is_some());
        // Before: the nudge stayed set, and the helper's next park
        // returned at once as "asked", a full spin window after every
        // woken hand-off.
        assert!(!b.nudged.load(SeqCst), "the nudge outlived its wake-up");
        let h = parked_helper(&b);
        b.close();
        assert!(!h.join().unwrap(), "closing is no request to spin");
    }

    #[test]
    fn a_nudge_with_nothing_queued_asks_a_parked_helper_to_spin() {
        let b = Arc::new(Board::new());
        let h = parked_helper(&b);
        b.nudge();
        assert!(h.join().unwrap(), "a bare nudge asks for a warm helper");
        assert!(!b.nudged.load(SeqCst));
    }
}
