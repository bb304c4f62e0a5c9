//! Adaptive mode (ours): inline by default, one request's crypto split
//! across cores when that pays.
//!
//! Hand-written. The facts it is built on (measured on the 2-vCPU VM this
//! was developed on; see `examples/grid.rs`): waking a sleeping thread on
//! another core costs ~80 µs end to end, while a 4 KiB AES-XTS sector run
//! costs ~0.4 µs. A queue hop per request, which is what dm-crypt's
//! workqueues add, therefore loses by two orders of magnitude for small
//! requests, and only parallelism can pay it back. So, per request:
//!
//! ```text
//!  submit ─► plan(size, queue depth, idle cores)
//!     ├─ inline (small request, or every core already has a submitter):
//!     │     exactly the inline path (mode/inline.rs)
//!     └─ split (large request and an idle core):
//!           the buffer is cut into chunks (BytesMut::split_to, no copy),
//!           posted on the board; the submitter and any awake helper claim
//!           chunks with one atomic counter, each doing backend IO + crypto
//!           for its chunk; the submitter waits for the last chunk, glues
//!           the chunks back (unsplit, no copy) and completes in place.
//! ```
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
//! Helpers are kept warm by spinning only while load lasts: after
//! [`SPIN_WINDOW`] with nothing to do, or as soon as every core has a
//! submitter of its own (queue depth ≥ CPUs, remembered for
//! [`CONTENDED_HOLD`]), a helper parks, so an idle engine burns no CPU and a
//! fully loaded machine is not robbed by spinners. A parked helper is woken
//! (a futex wake, then ~80 µs until it arrives) only for requests of at least
//! [`WAKE_MIN`] bytes; smaller ones (from [`SPLIT_MIN`]) split only when a
//! helper is already spinning.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::check::{SectorRange, Work};
use crate::mode::inline;
use crate::stats::{Dir, Path};
use crate::{Completion, Ctx, Error};

/// Smallest request split when a helper is already awake.
pub const SPLIT_MIN: u64 = 128 << 10;
/// Smallest request for which a parked helper is woken.
pub const WAKE_MIN: u64 = 512 << 10;
/// Smallest chunk handed out.
const CHUNK_MIN: u64 = 64 << 10;
/// Chunks per participant (dynamic claiming evens out late starters).
const CHUNKS_PER_WORKER: u64 = 4;
/// How long an idle helper spins before parking.
pub const SPIN_WINDOW: Duration = Duration::from_micros(300);
/// How long a sighting of "every core has a submitter" blocks splitting.
pub const CONTENDED_HOLD: Duration = Duration::from_millis(5);
/// Spin iterations a submitter waits for the last chunk before parking.
const OWNER_SPINS: u32 = 20_000;

struct SplitJob {
    write: bool,
    fua: bool,
    range: SectorRange,
    chunk: u64,
    n: usize,
    chunks: Vec<Mutex<Option<BytesMut>>>,
    next: AtomicUsize,
    finished: AtomicUsize,
    err: Mutex<Option<Error>>,
    owner: Thread,
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
        let board = Arc::new(Board {
            jobs: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            awake: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
        });
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

    /// Runs a checked request: inline or split, always completing here.
    pub(crate) fn submit(
        &self,
        ctx: &Ctx,
        w: Work,
        t0: Instant,
        depth: usize,
        done: impl FnOnce(Completion),
    ) {
        match w {
            Work::Read(r) if self.plan(ctx, r.len(), depth, t0) => {
                let res = self
                    .split(ctx, r, vec![0u8; r.len() as usize], false, false)
                    .map(Some);
                ctx.complete(Dir::Read, Path::Split, r.len(), t0, res, done);
            }
            Work::Write(r, data, fua) if self.plan(ctx, r.len(), depth, t0) => {
                let res = self.split(ctx, r, data, true, fua).map(|_| None);
                ctx.complete(Dir::Write, Path::Split, r.len(), t0, res, done);
            }
            w => inline::run(ctx, w, t0, done),
        }
    }

    /// Split or not: size, queue depth (= submitters inside the engine,
    /// since every adaptive request completes in its submitter) and idle
    /// cores.
    fn plan(&self, ctx: &Ctx, len: u64, depth: usize, t0: Instant) -> bool {
        // Splitting spreads crypto; with no cipher (or cipher_null) only
        // memory copies would be spread, and measured on the dev VM that
        // lost up to 40% on 1M writes (grid: null write 1M qd1 j1).
        if self.helpers == 0 || ctx.crypt.is_none() {
            return false;
        }
        if ctx.core.force_split.load(Relaxed) {
            return len > 4096;
        }
        if ctx.crypt.as_ref().is_some_and(|c| c.is_null()) {
            return false;
        }
        if len < SPLIT_MIN {
            return false;
        }
        let now = ctx.core.nanos(t0);
        if depth >= ctx.core.ncpu {
            ctx.core.contended_at.store(now, Relaxed);
            return false;
        }
        if ctx.core.contended(now, CONTENDED_HOLD) {
            return false;
        }
        // Idle cores: every CPU but this submitter's, less whatever else is
        // runnable on the machine right now (other processes included).
        if ctx.core.idle.others(now, self.board.awake.load(Relaxed)) + 1 >= ctx.core.ncpu {
            ctx.core.contended_at.store(now, Relaxed);
            return false;
        }
        len >= WAKE_MIN || self.board.spinning.load(Relaxed) > 0
    }

    fn split(
        &self,
        ctx: &Ctx,
        r: SectorRange,
        buf: Vec<u8>,
        write: bool,
        fua: bool,
    ) -> Result<Vec<u8>, Error> {
        let participants = 1 + self.helpers as u64;
        let min = if ctx.core.force_split.load(Relaxed) {
            4096
        } else {
            CHUNK_MIN
        };
        let chunk = (r.len() / (participants * CHUNKS_PER_WORKER))
            .max(min)
            .next_multiple_of(4096);
        // Zero-copy: a freshly made Bytes is unique, so try_into_mut succeeds.
        let mut whole = Bytes::from(buf)
            .try_into_mut()
            .unwrap_or_else(|b| BytesMut::from(&b[..]));
        let mut chunks = Vec::with_capacity(r.len().div_ceil(chunk) as usize);
        while !whole.is_empty() {
            let n = whole.len().min(chunk as usize);
            chunks.push(Mutex::new(Some(whole.split_to(n))));
        }
        // The empty remainder still references the buffer: dropped now, the
        // chunks are its only owners and the final Vec::from is zero-copy.
        drop(whole);
        let n = chunks.len();
        let job = Arc::new(SplitJob {
            write,
            fua,
            range: r,
            chunk,
            n,
            chunks,
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            err: Mutex::new(None),
            owner: std::thread::current(),
        });
        self.board.post(&job);
        run_chunks(ctx, &job);
        self.board.withdraw(&job);
        let mut spins = 0;
        while job.finished.load(Acquire) < n {
            if spins < OWNER_SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::park();
            }
        }
        if let Some(e) = job.err.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Err(e);
        }
        let mut parts = job
            .chunks
            .iter()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).take());
        // Invariant: every chunk was put back before `finished` reached n.
        let mut whole = parts.next().flatten().unwrap_or_default();
        for p in parts {
            whole.unsplit(p.unwrap_or_default());
        }
        Ok(Vec::from(whole))
    }

    /// Wakes and stops the helpers.
    pub(crate) fn close(&self) {
        self.board.closed.store(true, SeqCst);
        let _g = self.board.parked.lock().unwrap_or_else(|e| e.into_inner());
        self.board.wake.notify_all();
    }
}

impl Board {
    fn post(&self, job: &Arc<SplitJob>) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(job.clone());
        self.open.fetch_add(1, SeqCst);
        if self.spinning.load(SeqCst) == 0 {
            let g = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            if *g > 0 {
                self.wake.notify_one();
            }
        }
    }

    fn withdraw(&self, job: &Arc<SplitJob>) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|j| !Arc::ptr_eq(j, job));
        self.open.fetch_sub(1, SeqCst);
    }

    fn claimable(&self) -> Option<Arc<SplitJob>> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().find(|j| j.next.load(Relaxed) < j.n).cloned()
    }
}

/// Claims and runs chunks of `job` until none is left.
fn run_chunks(ctx: &Ctx, job: &SplitJob) {
    loop {
        let i = job.next.fetch_add(1, AcqRel);
        if i >= job.n {
            return;
        }
        let slot = &job.chunks[i];
        // Invariant: chunk i is taken only by the claimer of index i.
        let mut b = slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        let r = job.range.sub(i as u64 * job.chunk, b.len() as u64);
        let res = if job.write {
            inline::write_from(ctx, r, &mut b, job.fua)
        } else {
            inline::read_into(ctx, r, &mut b)
        };
        if let Err(e) = res {
            job.err
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(b);
        if job.finished.fetch_add(1, AcqRel) + 1 == job.n {
            job.owner.unpark();
        }
    }
}

/// A helper: claim chunks while there are any, spin briefly when idle,
/// park when the load is gone or every core has its own submitter.
fn helper(board: &Board, ctx: &Ctx) {
    let mut last_work = Instant::now();
    board.awake.fetch_add(1, SeqCst);
    board.spinning.fetch_add(1, SeqCst);
    let mut spins = 0u32;
    loop {
        if board.open.load(SeqCst) > 0 {
            if let Some(job) = board.claimable() {
                board.spinning.fetch_sub(1, SeqCst);
                run_chunks(ctx, &job);
                board.spinning.fetch_add(1, SeqCst);
                last_work = Instant::now();
                continue;
            }
        }
        if board.closed.load(SeqCst) {
            break;
        }
        spins += 1;
        if spins % 64 != 0 {
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        if now.duration_since(last_work) < SPIN_WINDOW
            && !ctx.core.contended(ctx.core.nanos(now), CONTENDED_HOLD)
        {
            continue;
        }
        board.spinning.fetch_sub(1, SeqCst);
        board.awake.fetch_sub(1, SeqCst);
        let mut g = board.parked.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        while board.open.load(SeqCst) == 0 && !board.closed.load(SeqCst) {
            g = board.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        *g -= 1;
        drop(g);
        board.awake.fetch_add(1, SeqCst);
        board.spinning.fetch_add(1, SeqCst);
        last_work = Instant::now();
    }
    board.spinning.fetch_sub(1, SeqCst);
    board.awake.fetch_sub(1, SeqCst);
}
