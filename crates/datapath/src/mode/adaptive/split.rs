//! The adaptive mode's splitting: one large request cut into chunks that
//! the submitter and warm helpers claim (see the parent module's diagram),
//! and [`Adaptive::try_split`], the one place that decides whether a
//! request is split.
//!
//! What a chunk does depends on the backend ([`chunks_do_io`]):
//!
//! - A backend that keeps its bytes in memory (it lends them:
//!   [`backend::Backend::direct`], the ramdisk or a mapped tmpfs file):
//!   each chunk does its own backend IO and its crypto. An IO there is a
//!   copy (or, fused, the crypto itself), so cutting it costs nothing and
//!   spreads the copies over cores too.
//! - Any other backend (files and block devices, RBD): the submitter does
//!   one backend IO for the whole request and the chunks split only the
//!   crypto: a read is read whole, then its chunks are decrypted in
//!   parallel; a write's chunks are encrypted in parallel, then it is
//!   written whole (with its FUA). On real storage one 1 MiB IO costs
//!   less than several 128 KiB ones at low queue depth, and the crypto is
//!   all that parallelism has to win. That is too little: [`Adaptive::plan`]
//!   splits there only when forced (`Engine::force_split`, tests and
//!   `ucrypt bench --force-split`). Measured on the development VM's
//!   virtio disk (ext4, O_DIRECT, 1 MiB at QD1, idle): the crypto it could
//!   save is about 55 µs of a 400-700 µs request, and splitting put
//!   adaptive at 0.67-0.96 of inline on writes and 0.77 on reads in
//!   process, 0.79 on vhost-user-blk writes; without it adaptive is at
//!   0.92-1.07 of inline in the same cells (docs/bench/HISTORY.md,
//!   2026-11-29).

use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::{Adaptive, Board, CONTENDED_HOLD, SPLIT_MIN, WAKE_MIN};
use crate::check::{SectorRange, Work};
use crate::mode::inline::{self, Pass};
use crate::stats::{Dir, Path};
use crate::{Completion, Ctx, Error};

/// Smallest chunk handed out.
const CHUNK_MIN: u64 = 64 << 10;
/// Chunks per participant (dynamic claiming evens out late starters).
const CHUNKS_PER_WORKER: u64 = 4;
/// Spin iterations a submitter waits for the last chunk before parking.
const OWNER_SPINS: u32 = 20_000;
/// One request's chunks on the board.
pub(super) struct SplitJob {
    write: bool,
    fua: bool,
    /// Each chunk does its own backend IO (see [`chunks_do_io`]); else
    /// the chunks are crypto only and the submitter does the IO.
    io: bool,
    range: SectorRange,
    chunk: u64,
    n: usize,
    chunks: Vec<Mutex<Option<BytesMut>>>,
    next: AtomicUsize,
    finished: AtomicUsize,
    err: Mutex<Option<Error>>,
    owner: Thread,
}

impl Adaptive {
    /// Splits `w` and completes it when [`Adaptive::plan`] says so;
    /// otherwise hands the request back untouched.
    pub(super) fn try_split<D: FnOnce(Completion)>(
        &self,
        ctx: &Ctx,
        w: Work,
        t0: Instant,
        len: u64,
        submitters: usize,
        done: D,
    ) -> Option<(Work, D)> {
        match w {
            Work::Read(r) if self.plan(ctx, len, submitters, t0) => {
                let res = self
                    .split(ctx, r, crate::bufpool::take(r.len() as usize), false, false)
                    .map(Some);
                ctx.complete(Dir::Read, Path::Split, r.len(), t0, res, done);
                None
            }
            Work::Write(r, data, fua) if self.plan(ctx, len, submitters, t0) => {
                let res = self.split(ctx, r, data, true, fua).map(|b| {
                    crate::bufpool::give(b);
                    None
                });
                ctx.complete(Dir::Write, Path::Split, r.len(), t0, res, done);
                None
            }
            w => Some((w, done)),
        }
    }

    /// Split or not: size, submitters inside the engine (requests in
    /// flight less those handed off) and idle cores.
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
        // On real storage the IO dominates a large request and the split
        // costs more than the crypto it spreads (see the module doc).
        if len < SPLIT_MIN || !chunks_do_io(ctx) {
            return false;
        }
        let now = ctx.core.nanos(t0);
        if ctx.core.saturated(now, depth) || ctx.core.contended(now, CONTENDED_HOLD) {
            return false;
        }
        // Idle cores: every CPU but this submitter's, less whatever else is
        // runnable on the machine right now (other processes included).
        let load = ctx.core.idle.others(now, self.board.awake.load(Relaxed));
        if ctx.core.saturated(now, load + depth) {
            return false;
        }
        len >= WAKE_MIN || self.board.spinning.load(Relaxed) > 0
    }

    fn split(
        &self,
        ctx: &Ctx,
        r: SectorRange,
        mut buf: Vec<u8>,
        write: bool,
        fua: bool,
    ) -> Result<Vec<u8>, Error> {
        let io = chunks_do_io(ctx);
        if !io && !write {
            // One read for the whole request; a failed one decrypts nothing.
            ctx.backend.read_at(&mut buf, r.at())?;
        }
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
            io,
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
        let whole = Vec::from(whole);
        if !io && write {
            // Every chunk is encrypted: one write for the whole request.
            ctx.backend.write_at(&whole, r.at(), fua)?;
        }
        Ok(whole)
    }
}

/// True when a split request's chunks each do their own backend IO: the
/// backend keeps its bytes in memory (it lends them, see the module doc).
/// Otherwise the submitter does one IO and the chunks only the crypto.
fn chunks_do_io(ctx: &Ctx) -> bool {
    ctx.backend.direct().is_some()
}

impl Board {
    pub(super) fn post(&self, job: &Arc<SplitJob>) {
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

    pub(super) fn withdraw(&self, job: &Arc<SplitJob>) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|j| !Arc::ptr_eq(j, job));
        self.open.fetch_sub(1, SeqCst);
    }

    pub(super) fn claimable(&self) -> Option<Arc<SplitJob>> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().find(|j| j.next.load(Relaxed) < j.n).cloned()
    }
}

/// Claims and runs chunks of `job` until none is left.
pub(super) fn run_chunks(ctx: &Ctx, job: &SplitJob) {
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
        let res = if !job.io {
            // Crypto only: the submitter reads before posting the job and
            // writes once every chunk is back.
            if let Some(c) = &ctx.crypt {
                if job.write {
                    c.encrypt(r.sector(), &mut b);
                } else {
                    c.decrypt(r.sector(), &mut b);
                }
            }
            Ok(())
        } else if job.write {
            inline::write_from(ctx, r, &mut b, job.fua, Pass::adaptive(ctx))
        } else {
            inline::read_into(ctx, r, &mut b, Pass::adaptive(ctx))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::chunks_do_io;
    use crate::{Engine, EngineConfig};

    fn on(backend: Arc<dyn backend::Backend>) -> bool {
        let v = crate::Volume {
            backend,
            ..crate::test_volume(true)
        };
        let e = Engine::new(v, EngineConfig::default()).expect("engine");
        let io = e.current_gen().map(|g| chunks_do_io(&g.ctx));
        e.shutdown().expect("shutdown");
        io.expect("a generation")
    }

    #[test]
    fn chunks_do_their_own_io_only_on_a_backend_in_memory() {
        let mem = || backend::MemBackend::new(64 << 20).expect("ramdisk");
        assert!(on(Arc::new(mem())), "the ramdisk lends its bytes");
        // The same ramdisk behind a wrapper that lends nothing, as a file
        // or block device lends nothing: one IO per request.
        assert!(!on(Arc::new(backend::FaultBackend::new(mem()))));
    }
}
