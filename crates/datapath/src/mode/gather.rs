//! Gathering (the block layer's plug, for inline and adaptive): the reads
//! and writes a frontend submits back to back go to the backend as one
//! batch instead of one synchronous IO each.
//!
//! The gathering is a value the frontend owns, a [`Plug`] per submitting
//! context (the block layer's on-stack `struct blk_plug`), passed with
//! each request:
//!
//! ```text
//!  let mut plug = Plug::new();
//!  submit_plugged(&mut plug, req, Hint { ready: 2 })  ─► gathered in plug
//!  submit_plugged(&mut plug, req, Hint { ready: 1 })  ─► gathered
//!  submit_plugged(&mut plug, req, Hint { ready: 0 })  ─► gathered, then run:
//!     encrypt the writes ─► backend.write_batch ─┐ one io_uring_enter
//!     backend.read_batch ─► decrypt the reads   ─┘ per batch
//!     complete each (stats, gate release, done)
//! ```
//!
//! Why here and not a queue: inline and adaptive run a request in its
//! submitter, so the engine never has more than one IO of a connection in
//! flight, and a queue to an IO thread costs a cross-core wake-up per hop
//! (see the adaptive mode). The frontend knows what the engine cannot: how
//! many of its caller's requests it has already received and is about to
//! submit ([`Hint::ready`]). Those requests are all in flight together from
//! the caller's view (none is answered before the batch runs), so running
//! them as one batch, in any order, is what a device queue would do; and
//! the submitter thread keeps the crypto, as inline does.
//!
//! Only for backends whose batches reach a submission queue
//! ([`backend::Backend::batches`]: the file backend on io_uring) or that
//! complete asynchronously; others
//! keep the one-at-a-time paths (the ramdisk's fused crypto, for one). The
//! adaptive mode does not gather on a backend that lends its memory (a
//! file on tmpfs is mapped): it runs fused there, as on the ramdisk.
//!
//! # Completing as the IO completes
//!
//! On a backend that [`backend::Backend::completes_async`], the batch is
//! not waited for: the writes are encrypted here and every entry goes to
//! [`backend::Backend::submit_async`], which returns at once, so the
//! frontend goes on reading its next requests while these are in flight.
//! Each entry completes on the backend's completion thread as its own IO
//! finishes: a read is decrypted there, then stats, gate release and
//! `done` as for any request. In the adaptive mode a large write's
//! encryption (and its submission), or a large read's decryption and
//! completion, goes to a helper instead (mode/adaptive/crypto.rs), so
//! one connection's crypto is spread over cores as classic spreads it. The request holds its queue slot until then,
//! so drains (reconfigure, suspend, shutdown) wait for IO in flight. That
//! thread is marked an engine thread: a deferred request it replays is
//! parked, never waited for, and a panicking callback does not kill it.
//! There, a request also joins when the frontend says others of its
//! caller are in flight ([`Hint::behind`]) even with nothing ready, so a
//! queue refilled one request at a time stays deep; a caller at queue
//! depth one keeps the synchronous path (one positioned syscall, no
//! thread hop).
//! What a plug submitted this way is counted in the plug ([`Plug::settle`]):
//! a request submitted through it that is not gathered (a flush, discard,
//! write-zeroes, a queue-depth-one read or write) first waits until the
//! plug's earlier reads and writes completed, so it keeps running after
//! what was submitted before it, as with the synchronous batch. A caller
//! without a plug ([`crate::Engine::submit`], the blocking helpers) is a
//! plug of one: it gathers nothing across calls and waits for nothing of
//! anyone else's; one that holds a plug settles it first when its next
//! call must run after what the plug submitted.
//!
//! The batch runs, at the latest, when its plug
//! - gets a request with nothing more ready, or one that is not gathered
//!   (a flush, discard or write-zeroes runs after what was gathered before
//!   it: FUA and flush semantics are those of each request alone);
//! - would block in admission (the queue is full: what it gathered holds
//!   slots), or reaps ([`crate::Engine::reap`] takes the plug);
//! - reaches [`MAX_ENTRIES`] or [`MAX_BYTES`];
//! - is flushed ([`Plug::flush`]), which a frontend must do before it
//!   blocks (on its socket) after saying requests were ready, and before
//!   it calls a blocking helper or drains the engine (reconfigure,
//!   suspend, reload, shutdown: they wait for the slots gathered requests
//!   hold, and know nothing of the caller's plug);
//! - is dropped, so a frontend's way out cannot lose a request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use backend::{AsyncKind, AsyncOp, ReadOp, WriteOp};

use crate::check::Work;
use crate::stats::{Dir, Path};
use crate::{Completion, Done, Error, Gen, Hint};

/// Most requests gathered into one batch (the file backend's ring size).
pub(crate) const MAX_ENTRIES: usize = 64;
/// Most bytes gathered into one batch (the file backend's bounce arena).
pub(crate) const MAX_BYTES: u64 = 8 << 20;

/// A request waiting in a plug's batch; it holds its queue slot.
struct Pending {
    gen: Arc<Gen>,
    w: Work,
    t0: Instant,
    done: Done,
}

/// A submitting context's gathering, as the block layer's on-stack
/// `struct blk_plug`: the requests gathered and not yet run, and the count
/// of those it submitted to a completion-driven backend that have not
/// completed (see the module doc).
///
/// A frontend holds one per submitting context (an NBD connection's
/// thread, a vhost-user queue thread, a bench job) and submits through it
/// with [`crate::Engine::submit_plugged`]. What it gathered holds queue
/// slots until it runs: the plug runs it by the rules above, on
/// [`Plug::flush`], and when dropped, so no request is lost. The engine's
/// drains and blocking helpers take no plug: a thread that calls them
/// flushes (or settles) its own first.
///
/// A plug gathers for one engine generation at a time: a request of
/// another engine (or generation) runs what was gathered first.
#[derive(Default)]
pub struct Plug {
    /// The gathered requests, in submission order, and their bytes.
    gathered: Vec<Pending>,
    bytes: u64,
    /// Its requests submitted to a completion-driven backend and not yet
    /// completed (made by its first such batch: a plug of one that never
    /// reaches one allocates nothing).
    inflight: Option<Arc<Inflight>>,
}

impl Plug {
    /// An empty plug.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests gathered and not yet run.
    pub fn gathered(&self) -> usize {
        self.gathered.len()
    }

    /// Runs what was gathered, if anything (the blocking point's unplug):
    /// a frontend that said requests were ready calls it before it blocks
    /// (on its socket, or on anything those requests' completions
    /// release), and before a blocking engine call or a drain
    /// ([`crate::Engine::reconfigure`] and the like wait for the queue
    /// slots these requests hold). Cheap when there is nothing.
    pub fn flush(&mut self) {
        if self.gathered.is_empty() {
            return;
        }
        self.bytes = 0;
        run(std::mem::take(&mut self.gathered), &mut self.inflight);
    }

    /// Runs what was gathered and waits until every request this plug
    /// submitted to a completion-driven backend has completed (never on a
    /// backend's completion thread, which must not wait for IO): what the
    /// caller does next runs after all of them, as after a synchronous
    /// batch.
    pub fn settle(&mut self) {
        self.flush();
        if let Some(i) = self
            .inflight
            .as_ref()
            .filter(|_| !backend::on_completion_thread())
        {
            i.wait_zero();
        }
    }
}

impl Drop for Plug {
    /// Runs what is left (each request's `done` runs as usual).
    fn drop(&mut self) {
        self.flush();
    }
}

impl std::fmt::Debug for Plug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plug")
            .field("gathered", &self.gathered.len())
            .field("bytes", &self.bytes)
            .field(
                "in_flight",
                &self
                    .inflight
                    .as_ref()
                    .map_or(0, |i| i.n.load(Ordering::Relaxed)),
            )
            .finish()
    }
}

/// A count of requests in flight (one plug's, or an engine's callbacks
/// still running), and a way to wait for none.
#[derive(Default)]
pub(crate) struct Inflight {
    n: AtomicUsize,
    lock: Mutex<()>,
    zero: Condvar,
}

impl Inflight {
    fn end(&self) {
        if self.n.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Taking the lock orders this with a waiter between its check
            // and its wait.
            drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.zero.notify_all();
        }
    }

    pub(crate) fn wait_zero(&self) {
        if self.n.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while self.n.load(Ordering::Acquire) != 0 {
            g = self.zero.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Whether `w` (admitted under `gen`) joins `plug`'s batch: a read or
/// write the frontend says more follow, or that follows gathered ones, on a
/// backend whose batches are queued together.
pub(crate) fn wants(plug: &Plug, gen: &Gen, w: &Work, hint: Option<Hint>) -> bool {
    let len = match w {
        Work::Read(r) | Work::Write(r, ..) => r.len(),
        _ => return false,
    };
    let b = &gen.ctx.backend;
    if len == 0 || len > MAX_BYTES || !(b.batches() || b.completes_async()) {
        return false;
    }
    let ready = hint.is_some_and(|h| h.ready > 0);
    let deep = hint.is_some_and(|h| h.behind > 0) && gen.ctx.backend.completes_async();
    ready
        || deep
        || (hint.is_some()
            && plug
                .gathered
                .last()
                .is_some_and(|p| std::ptr::eq(&*p.gen, gen)))
}

/// Adds a request to `plug`'s batch; runs the batch when the frontend
/// has nothing more ready (`last`) or the batch is full.
pub(crate) fn add(plug: &mut Plug, gen: Arc<Gen>, w: Work, t0: Instant, done: Done, last: bool) {
    let len = match &w {
        Work::Read(r) | Work::Write(r, ..) => r.len(),
        _ => 0,
    };
    let other = plug
        .gathered
        .last()
        .is_some_and(|p| !Arc::ptr_eq(&p.gen, &gen))
        || plug.bytes + len > MAX_BYTES;
    if other {
        // Another engine's (or generation's) batch, or no room: run it first.
        plug.flush();
    }
    plug.gathered.push(Pending { gen, w, t0, done });
    plug.bytes += len;
    let full = plug.gathered.len() >= MAX_ENTRIES || plug.bytes >= MAX_BYTES;
    if last || full {
        plug.flush();
    }
}

/// Runs a batch (all of one generation): writes encrypted and submitted
/// together, reads submitted together and decrypted, then every request
/// completed. A panicking callback does not keep the others from
/// completing; the first panic is re-raised afterwards.
fn run(batch: Vec<Pending>, inflight: &mut Option<Arc<Inflight>>) {
    // `add` keeps one generation per batch.
    let gen = batch[0].gen.clone();
    let ctx = &*gen.ctx;
    if ctx.backend.completes_async() {
        return run_async(&gen, batch, inflight.get_or_insert_with(Arc::default));
    }
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for p in batch {
        match p.w {
            Work::Read(r) => reads.push((r, vec![0u8; r.len() as usize], p.t0, p.done)),
            Work::Write(r, mut data, fua) => {
                if let Some(c) = &ctx.crypt {
                    c.encrypt(r.sector(), &mut data);
                }
                writes.push((r, data, fua, p.t0, p.done));
            }
            // Invariant: `wants` admits reads and writes only.
            _ => unreachable!("only reads and writes are gathered"),
        }
    }
    let wres = if writes.is_empty() {
        Vec::new()
    } else {
        let ops: Vec<WriteOp<'_>> = writes
            .iter()
            .map(|(r, data, fua, ..)| WriteOp {
                buf: data,
                offset: r.at(),
                fua: *fua,
            })
            .collect();
        ctx.backend.write_batch(&ops)
    };
    let rres = if reads.is_empty() {
        Vec::new()
    } else {
        let mut ops: Vec<ReadOp<'_>> = reads
            .iter_mut()
            .map(|(r, buf, ..)| ReadOp {
                buf,
                offset: r.at(),
            })
            .collect();
        ctx.backend.read_batch(&mut ops)
    };
    let mut panicked = None;
    for ((r, _, _, t0, done), res) in writes.into_iter().zip(wres) {
        let res: Completion = res.map(|()| None).map_err(Error::Io);
        let p = catch(|| ctx.complete(Dir::Write, Path::Inline, r.len(), t0, res, done));
        panicked = panicked.or(p);
    }
    for ((r, mut buf, t0, done), res) in reads.into_iter().zip(rres) {
        let res: Completion = res
            .map(|()| {
                if let Some(c) = &ctx.crypt {
                    c.decrypt(r.sector(), &mut buf);
                }
                Some(buf)
            })
            .map_err(Error::Io);
        let p = catch(|| ctx.complete(Dir::Read, Path::Inline, r.len(), t0, res, done));
        panicked = panicked.or(p);
    }
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
}

/// Submits a batch and returns: writes encrypted here (or, in the
/// adaptive mode, by a helper that then submits them), each request
/// completed by its entry's callback (see the module doc).
fn run_async(gen: &Arc<Gen>, batch: Vec<Pending>, inflight: &Arc<Inflight>) {
    let ctx = &gen.ctx;
    let mut ops = Vec::with_capacity(batch.len());
    inflight.n.fetch_add(batch.len(), Ordering::AcqRel);
    let tails = ctx.core.tails.clone();
    tails.n.fetch_add(batch.len(), Ordering::AcqRel);
    for p in batch {
        let c = ctx.clone();
        let fl = inflight.clone();
        let tail = Tail(tails.clone());
        let (t0, done) = (p.t0, p.done);
        // Keeps the generation alive until the last entry completes.
        let gen = p.gen;
        let op = match p.w {
            Work::Read(r) => AsyncOp {
                kind: AsyncKind::Read,
                offset: r.at(),
                // Stale bytes of a pooled buffer are all overwritten, or the
                // read fails and the buffer is dropped (see crate::bufpool).
                buf: crate::bufpool::take(r.len() as usize),
                done: Box::new(move |buf, res| {
                    engine_side();
                    // Only off the completion thread: a submitter reaping
                    // its own completions (a full queue) is about to wait,
                    // so it decrypts them itself.
                    let moved = res.is_ok()
                        && backend::on_completion_thread()
                        && gen
                            .adaptive()
                            .is_some_and(|a| a.crypto_handoff_ok(&c, r.len(), true));
                    let g = gen.clone();
                    let finish = move |mut buf: Vec<u8>, res: std::io::Result<()>, path| {
                        let res: Completion = res
                            .map(|()| {
                                if let Some(cr) = &c.crypt {
                                    cr.decrypt(r.sector(), &mut buf);
                                }
                                Some(buf)
                            })
                            .map_err(Error::Io);
                        counted(&fl, || c.complete(Dir::Read, path, r.len(), t0, res, done));
                        drop((gen, c));
                        drop(tail);
                    };
                    match g.adaptive() {
                        Some(a) if moved => a.hand_crypto(
                            true,
                            r.len(),
                            Box::new(move || finish(buf, res, Path::Offload)),
                        ),
                        _ => finish(buf, res, Path::Inline),
                    }
                }),
            },
            Work::Write(r, data, fua) => {
                let moved = gen
                    .adaptive()
                    .is_some_and(|a| a.crypto_handoff_ok(ctx, r.len(), false));
                let path = if moved { Path::Offload } else { Path::Inline };
                let g = gen.clone();
                let mut op = AsyncOp {
                    kind: AsyncKind::Write { fua },
                    offset: r.at(),
                    buf: data,
                    done: Box::new(move |buf, res| {
                        engine_side();
                        crate::bufpool::give(buf);
                        let res: Completion = res.map(|()| None).map_err(Error::Io);
                        counted(&fl, || c.complete(Dir::Write, path, r.len(), t0, res, done));
                        drop((gen, c));
                        drop(tail);
                    }),
                };
                match g.adaptive() {
                    Some(a) if moved => {
                        let c = ctx.clone();
                        a.hand_crypto(
                            false,
                            r.len(),
                            Box::new(move || {
                                if let Some(cr) = &c.crypt {
                                    cr.encrypt(r.sector(), &mut op.buf);
                                }
                                c.backend.submit_async(vec![op]);
                            }),
                        );
                        continue;
                    }
                    _ => {
                        if let Some(cr) = &ctx.crypt {
                            cr.encrypt(r.sector(), &mut op.buf);
                        }
                        op
                    }
                }
            }
            // Invariant: `wants` admits reads and writes only.
            _ => unreachable!("only reads and writes are gathered"),
        };
        ops.push(op);
    }
    if !ops.is_empty() {
        ctx.backend.submit_async(ops);
    }
}

/// Counts a callback out of its engine's running ones when dropped (after
/// its references to the generation, and so to the backend, went; also on
/// a panic).
struct Tail(Arc<Inflight>);

impl Drop for Tail {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Runs a request's completion `f`, then counts it out of its plug's
/// [`Inflight`] (also when `f` panics): a settling plug then sees its
/// `done` has run. `f` cannot settle that plug itself: the plug is its
/// owner's, borrowed while its batch runs.
fn counted(fl: &Inflight, f: impl FnOnce()) {
    struct End<'a>(&'a Inflight);
    impl Drop for End<'_> {
        fn drop(&mut self) {
            self.0.end();
        }
    }
    let _end = End(fl);
    f();
}

/// Marks a backend's completion thread as an engine thread (never blocks
/// in admission, survives callback panics); a callback running on the
/// submitter's own thread leaves it as it is.
fn engine_side() {
    if backend::on_completion_thread() && !crate::gate::on_engine_thread() {
        crate::gate::mark_engine_thread();
    }
}

/// Runs `f`, returning its panic instead of unwinding.
fn catch(f: impl FnOnce()) -> Option<Box<dyn std::any::Any + Send>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()
}
