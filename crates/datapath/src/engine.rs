//! The engine: admission (gate.rs), the choke point (check.rs), the mode,
//! and the generations a live reconfiguration swaps (see the crate
//! documentation for the picture).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use backend::Backend;
use crypto::SectorCrypt;

use crate::gate::{self, Gate};
use crate::mode::adaptive::Adaptive;
use crate::mode::classic::Classic;
use crate::mode::inline::Pass;
use crate::stats::{Dir, Path, StatsCore};
use crate::{check, cpu, mode};
use crate::{Completion, CryptMode, EngineConfig, Error, Hint, Op, Request, Stats, Volume};

/// The engine. `Send + Sync`; share it with `Arc`.
pub struct Engine {
    core: Arc<Core>,
}

/// Engine-wide state shared by every generation.
pub(crate) struct Core {
    gate: Gate,
    stats: StatsCore,
    /// CPUs available to the process.
    pub(crate) ncpu: usize,
    epoch: Instant,
    /// When a submitter last saw every core busy (ns since `epoch`; 0 = never).
    pub(crate) contended_at: AtomicU64,
    /// Test hook: adaptive hands off or splits (see [`Engine::force_split`]).
    pub(crate) force_split: std::sync::atomic::AtomicBool,
    /// Adaptive runs crypto in two passes like inline (see [`Engine::fuse`]).
    pub(crate) no_fuse: std::sync::atomic::AtomicBool,
    /// Machine load, for the adaptive mode's idle-core estimate.
    pub(crate) idle: cpu::Load,
    /// Threads of replaced generations, joined at shutdown.
    retired: Mutex<Vec<JoinHandle<()>>>,
    reconfig: Mutex<()>,
    /// Completion callbacks of asynchronous requests not yet returned.
    pub(crate) tails: Arc<mode::gather::Inflight>,
}

impl Core {
    /// Nanoseconds from the engine's start to `t` (at least 1).
    pub(crate) fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    /// True if every core was seen busy less than `hold` before `now`.
    pub(crate) fn contended(&self, now: u64, hold: Duration) -> bool {
        let at = self.contended_at.load(Relaxed);
        at != 0 && now.saturating_sub(at) < hold.as_nanos() as u64
    }

    fn retire(&self, mut handles: Vec<JoinHandle<()>>) {
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        // Reap what has already exited so repeated swaps do not pile up.
        let mut keep = Vec::with_capacity(r.len() + handles.len());
        for h in r.drain(..).chain(handles.drain(..)) {
            if h.is_finished() {
                let _ = h.join();
            } else {
                keep.push(h);
            }
        }
        *r = keep;
    }

    fn join_retired(&self) {
        let handles = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        let me = std::thread::current().id();
        for h in handles {
            // A callback running on an engine thread may shut the engine
            // down; that thread exits on its own right after.
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

/// One volume + configuration, with the mode's threads: what a table swap
/// replaces.
pub(crate) struct Ctx {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) crypt: Option<Arc<SectorCrypt>>,
    pub(crate) data_offset: u64,
    pub(crate) size: u64,
    pub(crate) sector_size: u32,
    pub(crate) cfg: EngineConfig,
    pub(crate) core: Arc<Core>,
}

/// A caught panic's payload.
type Panic = Box<dyn std::any::Any + Send>;

/// Runs `f`, returning its panic instead of unwinding, so the caller can
/// finish its bookkeeping before re-raising it.
fn catch(f: impl FnOnce()) -> Option<Panic> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()
}

/// A completion callback carried through queues.
pub(crate) type Done = Box<dyn FnOnce(Completion) + Send>;

impl Ctx {
    /// Records stats, releases the request's queue slot, runs `done`.
    pub(crate) fn complete(
        &self,
        dir: Dir,
        path: Path,
        bytes: u64,
        t0: Instant,
        res: Completion,
        done: impl FnOnce(Completion),
    ) {
        // One request in LATENCY_SAMPLE per thread reads the clock a second
        // time for the histogram; the rest pay for one read (t0, which the
        // adaptive mode also uses as "now").
        let ns = crate::stats::sample_latency().then(|| t0.elapsed().as_nanos() as u64);
        self.core
            .stats
            .record(dir, self.cfg.mode, path, bytes, ns, res.is_ok());
        let next = self.core.gate.release();
        // `next` left the deferred list: it must be replayed even if `done`
        // panics, or it is lost (its callback never runs).
        let mut panicked = catch(|| done(res));
        if let Some(d) = next {
            let p = catch(|| replay(&self.core, [d], true));
            panicked = panicked.or(p);
        }
        // A panicking callback must not take an engine thread (and every
        // request queued behind it) down with it; the panic hook has already
        // reported it. A caller's thread gets its panic back.
        if let Some(p) = panicked {
            if !gate::on_engine_thread() {
                std::panic::resume_unwind(p);
            }
        }
    }
}

pub(crate) enum Pipe {
    Inline,
    Classic(Classic),
    Adaptive(Adaptive),
}

pub(crate) struct Gen {
    pub(crate) ctx: Arc<Ctx>,
    pipe: Pipe,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Gen {
    fn build(core: &Arc<Core>, vol: Volume, cfg: EngineConfig) -> Result<Arc<Gen>, Error> {
        check_volume(&vol)?;
        if cfg.queue_depth == 0 {
            return Err(Error::Invalid("queue_depth must be at least 1".into()));
        }
        let ctx = Arc::new(Ctx {
            backend: vol.backend,
            crypt: vol.crypt,
            data_offset: vol.data_offset,
            size: vol.size,
            sector_size: vol.sector_size,
            cfg,
            core: core.clone(),
        });
        let mut handles = Vec::new();
        let inline = ctx.crypt.is_none()
            || ctx.cfg.mode == CryptMode::Inline
            || (ctx.cfg.mode == CryptMode::Classic
                && ctx.cfg.flags.no_read_workqueue
                && ctx.cfg.flags.no_write_workqueue);
        let pipe = if inline {
            Pipe::Inline
        } else {
            match ctx.cfg.mode {
                CryptMode::Adaptive => Pipe::Adaptive(
                    Adaptive::start(ctx.clone(), &mut handles)
                        .inspect_err(|_| core.retire(std::mem::take(&mut handles)))?,
                ),
                _ => Pipe::Classic(
                    Classic::start(ctx.clone(), &mut handles)
                        .inspect_err(|_| core.retire(std::mem::take(&mut handles)))?,
                ),
            }
        };
        Ok(Arc::new(Gen {
            ctx,
            pipe,
            handles: Mutex::new(handles),
        }))
    }

    /// Lets the mode's threads exit (they drain their queues first) and
    /// hands them to the core for joining.
    fn retire(&self) {
        match &self.pipe {
            Pipe::Inline => {}
            Pipe::Classic(c) => c.close(),
            Pipe::Adaptive(a) => a.close(),
        }
        let handles = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()));
        self.ctx.core.retire(handles);
    }
}

fn check_volume(vol: &Volume) -> Result<(), Error> {
    let ss = vol.sector_size;
    if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
        return Err(Error::Invalid(format!(
            "Sector size {ss} is not a power of two in 512..=4096"
        )));
    }
    if let Some(c) = &vol.crypt {
        if c.sector_size() != ss as usize {
            return Err(Error::Invalid(format!(
                "Cipher sector size {} differs from the volume sector size {ss}",
                c.sector_size()
            )));
        }
    }
    if vol.size % ss as u64 != 0 {
        return Err(Error::Invalid(format!(
            "Volume size {} is not a multiple of the sector size {ss}",
            vol.size
        )));
    }
    if vol.data_offset % 512 != 0 {
        return Err(Error::Invalid(format!(
            "Data offset {} is not a multiple of 512",
            vol.data_offset
        )));
    }
    let end = vol.data_offset.checked_add(vol.size);
    if end.is_none_or(|e| e > vol.backend.size()) {
        return Err(Error::Invalid(format!(
            "Volume ({} bytes at offset {}) does not fit the {}-byte backend",
            vol.size,
            vol.data_offset,
            vol.backend.size()
        )));
    }
    Ok(())
}

thread_local! {
    /// Set while this thread is inside [`dispatch`].
    static DISPATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Requests submitted by completion callbacks running inside an outer
    /// [`dispatch`] on this thread, run once it returns.
    /// The hint of the [`Engine::submit_hinted`] call in progress on this
    /// thread, taken by the first [`dispatch`] (its own request's).
    static HINT: std::cell::Cell<Option<Hint>> = const { std::cell::Cell::new(None) };
    static TRAMPOLINE: std::cell::RefCell<std::collections::VecDeque<(Arc<Core>, gate::Deferred, bool)>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// [`Engine::submit`]: a callback that runs inline (inside `submit`) and
/// submits again does not recurse: its request runs after the outer one
/// returns, so a resubmitting client cannot overflow the stack.
/// `head`: see [`Gate::admit_or_defer`](gate::Gate::admit_or_defer).
fn submit_trampolined(
    core: &Arc<Core>,
    req: Request,
    done: impl FnOnce(Completion) + Send + 'static,
    head: bool,
) {
    if DISPATCHING.with(|d| d.get()) {
        // Runs later, when the caller's queue may look different.
        HINT.with(|h| h.set(None));
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
    let mut panicked = catch(|| dispatch(core, req, done, head));
    while let Some((core, (req, done), head)) = TRAMPOLINE.with(|t| t.borrow_mut().pop_front()) {
        let p = catch(|| dispatch(&core, req, done, head));
        panicked = panicked.or(p);
    }
    DISPATCHING.with(|d| d.set(false));
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

/// Admission, the choke point, then the mode.
fn dispatch(
    core: &Arc<Core>,
    req: Request,
    done: impl FnOnce(Completion) + Send + 'static,
    head: bool,
) {
    let hint = HINT.with(|h| h.take());
    if gate::on_engine_thread() {
        // Never block an engine thread (see gate.rs): park the request on
        // the deferred list instead.
        return match core.gate.admit_or_defer((req, Box::new(done)), head) {
            Ok(Some(((gen, _), (req, done)))) => run_admitted(gen, req, hint, done),
            Ok(None) => {}
            Err((e, (_, done))) => done(Err(e)),
        };
    }
    let admitted = match core.gate.admit_fast() {
        Some(a) => Ok(a),
        None => {
            // About to wait for a slot: what this thread gathered holds
            // slots, so it runs first.
            mode::gather::unplug();
            core.gate.admit()
        }
    };
    match admitted {
        Ok((gen, _)) => run_admitted(gen, req, hint, done),
        Err(e) => done(Err(e)),
    }
}

/// The choke point, then the mode, for a request holding a slot of `gen`.
fn run_admitted(
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
    let gathers = matches!(gen.pipe, Pipe::Inline | Pipe::Adaptive(_));
    if gathers && mode::gather::wants(&gen, &w, hint) {
        let last = hint.is_none_or(|h| h.ready == 0);
        return mode::gather::add(gen.clone(), w, t0, Box::new(done), last);
    }
    // Whatever this thread gathered was submitted before this request, and
    // has completed when it runs.
    mode::gather::settle();
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
fn replay(core: &Arc<Core>, items: impl IntoIterator<Item = gate::Deferred>, head: bool) {
    let mut panicked = None;
    for (req, done) in items {
        let p = catch(|| submit_trampolined(core, req, done, head));
        panicked = panicked.or(p);
    }
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

impl Engine {
    /// Starts an engine over `vol`.
    pub fn new(vol: Volume, cfg: EngineConfig) -> Result<Self, Error> {
        let core = Arc::new(Core {
            gate: Gate::new(),
            stats: StatsCore::new(),
            ncpu: cpu::count(),
            epoch: Instant::now(),
            contended_at: AtomicU64::new(0),
            idle: cpu::Load::new(),
            force_split: std::sync::atomic::AtomicBool::new(false),
            no_fuse: std::sync::atomic::AtomicBool::new(false),
            retired: Mutex::new(Vec::new()),
            reconfig: Mutex::new(()),
            tails: Arc::default(),
        });
        let gen = Gen::build(&core, vol, cfg)?;
        core.gate.install(gen);
        Ok(Self { core })
    }

    /// Submits a request; `done` runs exactly once, on some engine or
    /// caller thread. Blocks while `queue_depth` requests are in flight or
    /// a reconfiguration is draining the engine. A callback that panics on
    /// the calling thread has its panic re-raised from here, once the
    /// requests waiting behind it have been passed on.
    pub fn submit(&self, req: Request, done: impl FnOnce(Completion) + Send + 'static) {
        submit_trampolined(&self.core, req, done, false);
    }

    /// [`Engine::submit`] with what the frontend knows about its caller's
    /// queue (see [`Hint`]). The hint applies to this request only; one
    /// deferred by admission or queued behind a callback's own submission
    /// runs without it.
    pub fn submit_hinted(
        &self,
        req: Request,
        hint: Hint,
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        HINT.with(|h| h.set(Some(hint)));
        submit_trampolined(&self.core, req, done, false);
        HINT.with(|h| h.set(None));
    }

    /// Runs the reads and writes this thread's hinted submissions gathered
    /// (see [`Hint::ready`]), for every engine; cheap when there are none.
    /// A frontend that said requests were ready calls it before it blocks
    /// (on its socket, or on anything those requests' completions release);
    /// blocking engine calls do it themselves.
    pub fn unplug(&self) {
        mode::gather::unplug();
    }

    /// Submits and waits for the completion.
    fn run(&self, req: Request) -> Completion {
        mode::gather::settle();
        let slot = Arc::new((Mutex::new(None), Condvar::new()));
        let s2 = slot.clone();
        // Not trampolined: a blocking helper called from a callback must
        // run now, not after the callback (which is waiting for it).
        dispatch(
            &self.core,
            req,
            move |c| {
                *s2.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                s2.1.notify_one();
            },
            false,
        );
        let mut g = slot.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(c) = g.take() {
                return c;
            }
            g = slot.1.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocking read helper.
    pub fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, Error> {
        self.run(Request {
            op: Op::Read { len },
            offset,
            fua: false,
        })
        .map(|d| d.unwrap_or_default())
    }

    /// Blocking write helper.
    pub fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), Error> {
        self.run(Request {
            op: Op::Write { data },
            offset,
            fua,
        })
        .map(|_| ())
    }

    /// Blocking flush helper.
    pub fn flush(&self) -> Result<(), Error> {
        self.run(Request {
            op: Op::Flush,
            offset: 0,
            fua: false,
        })
        .map(|_| ())
    }

    /// Blocking discard helper.
    pub fn discard(&self, offset: u64, len: u32) -> Result<(), Error> {
        self.run(Request {
            op: Op::Discard { len },
            offset,
            fua: false,
        })
        .map(|_| ())
    }

    /// Blocking write-zeroes helper.
    pub fn write_zeroes(&self, offset: u64, len: u32, fua: bool) -> Result<(), Error> {
        self.run(Request {
            op: Op::WriteZeroes { len },
            offset,
            fua,
        })
        .map(|_| ())
    }

    /// Switches mode/flags live: suspend (drain), swap, resume. The volume
    /// stays; its backend and cipher are shared with the new generation.
    pub fn reconfigure(&self, cfg: EngineConfig) -> Result<(), Error> {
        mode::gather::unplug();
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let (vol, _) = self.current()?;
        self.swap(vol, cfg)
    }

    /// Changes the decrypted device's size live (`cryptsetup resize`: a
    /// table reload with a new length): drain, swap, resume. From then on
    /// the choke point refuses requests past `size`.
    pub fn resize(&self, size: u64) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let (vol, cfg) = self.current()?;
        self.swap(Volume { size, ..vol }, cfg)
    }

    /// `luksSuspend`: stops admitting (callers block in `submit`, requests
    /// from engine threads wait on the deferred list), drains what is in
    /// flight, then swaps in a generation without the cipher, so the key
    /// goes with the last reference to the old one. Nothing is admitted
    /// again until [`Engine::resume`]; [`Engine::shutdown`] fails what
    /// waits.
    pub fn suspend(&self) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let (vol, cfg) = self.current()?;
        self.core.gate.hold(true);
        // The cipherless generation never runs a request: admission stays
        // held until `resume` installs a cipher again.
        self.swap(Volume { crypt: None, ..vol }, cfg)
            .inspect_err(|_| self.core.gate.hold(false))
    }

    /// `luksResume`: installs `crypt` and admits again; the requests that
    /// waited run now. An error if not suspended.
    pub fn resume(&self, crypt: Arc<SectorCrypt>) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        if !self.core.gate.held() {
            return Err(Error::Invalid("The engine is not suspended".into()));
        }
        let (vol, cfg) = self.current()?;
        self.swap(
            Volume {
                crypt: Some(crypt),
                ..vol
            },
            cfg,
        )?;
        self.core.gate.hold(false);
        replay(&self.core, self.core.gate.take_deferred(), false);
        Ok(())
    }

    /// True between [`Engine::suspend`] and [`Engine::resume`].
    pub fn is_suspended(&self) -> bool {
        self.core.gate.held()
    }

    /// The current generation's volume and configuration.
    fn current(&self) -> Result<(Volume, EngineConfig), Error> {
        let cur = self.core.gate.current().ok_or(Error::Shutdown)?;
        let vol = Volume {
            backend: cur.ctx.backend.clone(),
            crypt: cur.ctx.crypt.clone(),
            data_offset: cur.ctx.data_offset,
            size: cur.ctx.size,
            sector_size: cur.ctx.sector_size,
        };
        Ok((vol, cur.ctx.cfg.clone()))
    }

    /// Replaces the whole volume (table reload) live: drain, swap, resume.
    pub fn reload(&self, vol: Volume) -> Result<(), Error> {
        mode::gather::unplug();
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let cfg = self.config();
        self.swap(vol, cfg)
    }

    fn swap(&self, vol: Volume, cfg: EngineConfig) -> Result<(), Error> {
        // Build (and start the threads of) the new generation before
        // suspending, so the pause is only the drain.
        let new = Gen::build(&self.core, vol, cfg)?;
        match self.core.gate.swap(new.clone()) {
            Ok(old) => {
                old.retire();
                self.core.stats.reconfigurations.fetch_add(1, Relaxed);
                // dm_wq_work: replay what engine threads deferred meanwhile
                // (unless suspended: `resume` replays them).
                if !self.core.gate.held() {
                    replay(&self.core, self.core.gate.take_deferred(), false);
                }
                Ok(())
            }
            Err(e) => {
                new.retire();
                Err(e)
            }
        }
    }

    fn with_gen<T>(&self, f: impl FnOnce(&Ctx) -> T, dflt: T) -> T {
        self.core.gate.current().map(|g| f(&g.ctx)).unwrap_or(dflt)
    }

    /// Current configuration.
    pub fn config(&self) -> EngineConfig {
        self.with_gen(|c| c.cfg.clone(), EngineConfig::default())
    }

    /// Decrypted device size in bytes.
    pub fn size(&self) -> u64 {
        self.with_gen(|c| c.size, 0)
    }

    /// Logical sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.with_gen(|c| c.sector_size, 512)
    }

    /// A snapshot of the engine's counters (for `status` and the bench).
    pub fn stats(&self) -> Stats {
        let (read, write, flushes, discards, other_errors) = self.core.stats.snapshot();
        Stats {
            read,
            write,
            flushes,
            discards,
            other_errors,
            in_flight: self.core.gate.in_flight() as u64,
            max_in_flight: self.core.gate.max_in_flight.load(Relaxed) as u64,
            reconfigurations: self.core.stats.reconfigurations.load(Relaxed),
            mode: self.with_gen(|c| c.cfg.mode, CryptMode::default()),
        }
    }

    /// Test hook: make the adaptive mode hand every other read or write
    /// off whole to a helper, and split the rest when larger than 4 KiB
    /// (into 4 KiB-aligned chunks), whatever the load, so tests exercise
    /// both cross-core paths on a busy machine. Not for production use.
    #[doc(hidden)]
    pub fn force_split(&self, on: bool) {
        self.core.force_split.store(on, Relaxed);
    }

    /// Whether the adaptive mode fuses crypto with the backend's copy when
    /// the backend lends its memory (the ramdisk does): on by default. Off,
    /// adaptive moves bytes as inline does (a copy plus a crypto pass), so a
    /// benchmark can tell what fusing is worth from what scheduling is.
    pub fn fuse(&self, on: bool) {
        self.core.no_fuse.store(!on, Relaxed);
    }

    /// Drains in-flight requests, flushes, stops and joins worker threads.
    /// Later requests fail with [`Error::Shutdown`]. Idempotent.
    pub fn shutdown(&self) -> Result<(), Error> {
        mode::gather::unplug();
        let res = match self.core.gate.close() {
            Some(last) => {
                let r = last.ctx.backend.flush().map_err(Error::Io);
                last.retire();
                r
            }
            None => Ok(()),
        };
        // Every deferred request is failed and every thread joined even if
        // one of these callbacks panics; the first panic is re-raised after.
        let mut panicked = None;
        for (_, done) in self.core.gate.take_deferred() {
            let p = catch(|| done(Err(Error::Shutdown)));
            panicked = panicked.or(p);
        }
        self.core.join_retired();
        // The drain ends when the last slot is released, before that
        // request's callback has run and let go of the backend: wait for
        // the asynchronous ones too, so dropping the engine here drops the
        // backend here (its files, and their lock, closed on return).
        if !backend::on_completion_thread() {
            self.core.tails.wait_zero();
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        res
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
