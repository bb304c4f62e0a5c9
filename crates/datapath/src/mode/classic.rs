//! Classic mode: dm-crypt's queued pipeline, stage for stage.
//!
//! Hand-written pipeline code, modelled on (not copied from) Linux
//! `drivers/md/dm-crypt.c`. Stages carry dm-crypt's function names:
//!
//! ```text
//!  READ                                   WRITE
//!  crypt_map                              crypt_map
//!   └► kcryptd_queue_read ─► [kcryptd_io]  └► kcryptd_queue_crypt ─► [kcryptd]
//!        kcryptd_io_read: backend read          kcryptd_crypt_write_convert:
//!        crypt_endio                              bounce = page_pool (bounded)
//!         └► kcryptd_queue_crypt ─► [kcryptd]     encrypt plaintext → bounce
//!              kcryptd_crypt_read_convert       kcryptd_crypt_write_io_submit:
//!                decrypt in place                ├ submit_from_crypt_cpus:
//!              kcryptd_crypt_read_done           │   backend write here
//!               └► complete                      └ else: insert in write_tree
//!                                                    (sorted by sector), wake
//!  no_read_workqueue: the whole read runs             [dmcrypt_write]: take the
//!  inline in the submitter (see inline.rs)             whole tree, write in order
//!  no_write_workqueue: encrypt + write inline       crypt_endio: free bounce,
//!                                                    complete
//! ```
//!
//! `[kcryptd_io]` is a pool of one thread per CPU (the kernel's per-CPU
//! `kcryptd_io` workqueue with `max_active` 1). Because [`backend::Backend`]
//! calls block, it also plays the block device: the backend read and
//! `crypt_endio` run on it. (In the kernel a read is usually submitted
//! straight from `crypt_map` and only falls back to `kcryptd_io` when the
//! clone allocation would sleep; here the stage is what makes submission
//! asynchronous for a blocking backend.)
//!
//! `[kcryptd]` is the crypt worker pool: `workers` threads (default one per
//! CPU) sharing one queue, like the unbound `kcryptd` workqueue; with
//! `same_cpu_crypt` one queue per CPU, each worker pinned to its CPU, and
//! work queued on the CPU that queued it (the bound workqueue).
//!
//! `[dmcrypt_write]` is one thread that takes every pending encrypted write
//! at once and submits them in sector order (the rbtree + `blk_start_plug`).
//!
//! Large requests (Linux 6.11): `crypt_map` accepts at most
//! `max_read_size`/`max_write_size` bytes of a bio and DM core resubmits
//! the rest, so a 1 MiB read enters the queues as 128 KiB pieces (the
//! default) whose decryption runs on several `kcryptd` workers at once.
//! Here [`Classic::submit`] cuts a queued read or write into pieces of
//! [`EngineConfig::max_io_size`](crate::EngineConfig::max_io_size) that
//! travel through the queues on their own; the request completes (and
//! counts once in the stats) when its last piece does, read pieces'
//! plaintext copied into one buffer. The kernel's sizes are module
//! parameters, one per host; here they are per volume. Requests that run
//! inline (`no_read_workqueue`, `no_write_workqueue`) are not cut: the
//! kernel runs those pieces one after another on the submitter, the same
//! work as the whole request.
//!
//! `high_priority` (Linux 6.10) creates the `kcryptd_io` and `kcryptd`
//! workqueues with `WQ_HIGHPRI`, whose worker pools run at nice -20, and
//! gives `dmcrypt_write` nice -20 too; here those threads set their nice
//! value to -20 (`setpriority`, which needs CAP_SYS_NICE: without it they
//! stay at the process's nice value, as the kernel's flag has no way to
//! fail). What has no userspace equivalent: highpri workqueues have their
//! own per-CPU worker pools, apart from every other kernel workqueue user;
//! threads here compete with the rest of the machine's threads by nice
//! value alone.
//!
//! FLUSH/FUA: a write completes only once the backend write returned (with
//! `fua` passed down), and a flush goes straight to the backend, so a flush
//! covers every write completed before it, as in the kernel where flush bios
//! are remapped to the device without entering the queues.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::check::{SectorRange, Work};
use crate::mode::inline::{self, Pass};
use crate::queue::{BouncePool, WorkQueue};
use crate::stats::{Dir, Path};
use crate::{Completion, Ctx, Done, Error};

/// Bytes of bounce buffers the write path may have lent out at once (the
/// page_pool budget; a single larger request still proceeds alone).
const BOUNCE_BUDGET: usize = 64 << 20;

/// A request travelling through the queues.
struct Io {
    range: SectorRange,
    fua: bool,
    buf: Vec<u8>,
    done: Done,
    t0: Instant,
    /// A piece of a larger request: the whole and this piece's byte
    /// offset in it.
    part: Option<(Arc<Split>, u64)>,
}

/// A request cut into pieces ([`Classic::submit`]): completes once, when
/// its last piece does.
struct Split {
    st: Mutex<SplitState>,
}

struct SplitState {
    /// Pieces not yet completed.
    left: usize,
    /// The whole request's bytes.
    len: u64,
    /// Reads: the plaintext, each piece copied to its offset.
    buf: Vec<u8>,
    /// The first piece's error.
    err: Option<Error>,
    /// The request's callback (taken by the last piece).
    done: Option<Done>,
}

/// Work for the `kcryptd` pool.
enum CryptWork {
    ReadConvert(Io),
    WriteConvert(Io),
}

/// Pending writes keyed by (sector, arrival), next arrival number, closed.
type TreeState = (BTreeMap<(u64, u64), Io>, u64, bool);

/// The encrypted writes waiting for `dmcrypt_write`, sorted by sector.
struct WriteTree {
    st: Mutex<TreeState>,
    cv: Condvar,
}

struct Shared {
    ctx: Arc<Ctx>,
    io_q: WorkQueue<Io>,
    crypt_qs: Vec<WorkQueue<CryptWork>>,
    same_cpu: bool,
    submit_from_crypt_cpus: bool,
    tree: WriteTree,
    pool: BouncePool,
}

/// A running classic pipeline.
pub(crate) struct Classic {
    sh: Arc<Shared>,
}

impl Classic {
    /// Starts the kcryptd_io, kcryptd and dmcrypt_write threads.
    pub(crate) fn start(ctx: Arc<Ctx>, handles: &mut Vec<JoinHandle<()>>) -> Result<Self, Error> {
        let ncpu = ctx.core.ncpu;
        let workers = if ctx.cfg.workers == 0 {
            ncpu
        } else {
            ctx.cfg.workers
        };
        let flags = ctx.cfg.flags;
        let qd = ctx.cfg.queue_depth.max(1);
        let nq = if flags.same_cpu_crypt { workers } else { 1 };
        let high = flags.high_priority;
        let sh = Arc::new(Shared {
            io_q: WorkQueue::new(qd),
            crypt_qs: (0..nq).map(|_| WorkQueue::new(qd)).collect(),
            same_cpu: flags.same_cpu_crypt,
            submit_from_crypt_cpus: flags.submit_from_crypt_cpus,
            tree: WriteTree {
                st: Mutex::new((BTreeMap::new(), 0, false)),
                cv: Condvar::new(),
            },
            pool: BouncePool::new(BOUNCE_BUDGET),
            ctx,
        });
        let spawn =
            |name: String, f: Box<dyn FnOnce() + Send>, handles: &mut Vec<JoinHandle<()>>| {
                let f = move || {
                    crate::gate::mark_engine_thread();
                    if high {
                        raise_priority();
                    }
                    f()
                };
                std::thread::Builder::new()
                    .name(name)
                    .spawn(f)
                    .map(|h| handles.push(h))
                    .map_err(Error::Io)
            };
        let started = Self { sh: sh.clone() };
        let spawn_all = |handles: &mut Vec<JoinHandle<()>>| -> Result<(), Error> {
            for i in 0..ncpu {
                let s = sh.clone();
                spawn(
                    format!("kcryptd_io/{i}"),
                    Box::new(move || kcryptd_io(&s)),
                    handles,
                )?;
            }
            for i in 0..workers {
                let s = sh.clone();
                let q = if s.same_cpu { i } else { 0 };
                let f = move || {
                    if s.same_cpu {
                        crate::cpu::pin_to(i % s.ctx.core.ncpu);
                    }
                    kcryptd(&s, q)
                };
                spawn(format!("kcryptd/{i}"), Box::new(f), handles)?;
            }
            if !flags.submit_from_crypt_cpus {
                let s = sh.clone();
                spawn(
                    "dmcrypt_write".into(),
                    Box::new(move || dmcrypt_write(&s)),
                    handles,
                )?;
            }
            Ok(())
        };
        if let Err(e) = spawn_all(handles) {
            // The threads already started exit once their queues close.
            started.close();
            return Err(e);
        }
        Ok(started)
    }

    /// `crypt_map`: routes a checked request, queued ones cut at the
    /// volume's `max_read_size`/`max_write_size` (DM core's resubmission
    /// of the rest after `dm_accept_partial_bio`).
    pub(crate) fn submit(
        &self,
        ctx: &Ctx,
        w: Work,
        t0: Instant,
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        let flags = ctx.cfg.flags;
        match w {
            Work::Read(r) if !flags.no_read_workqueue => {
                let max = ctx.cfg.max_io_size(false, ctx.sector_size);
                // kcryptd_queue_read, per piece
                for io in pieces(r, max, Vec::new(), false, t0, Box::new(done), true) {
                    self.sh.io_q.push(io);
                }
            }
            Work::Write(r, data, fua) if !flags.no_write_workqueue => {
                let max = ctx.cfg.max_io_size(true, ctx.sector_size);
                for io in pieces(r, max, data, fua, t0, Box::new(done), false) {
                    kcryptd_queue_crypt(&self.sh, CryptWork::WriteConvert(io));
                }
            }
            w => inline::run(ctx, w, t0, Pass::Two, done),
        }
    }

    /// Lets every thread exit once its queue is drained.
    pub(crate) fn close(&self) {
        self.sh.io_q.close();
        for q in &self.sh.crypt_qs {
            q.close();
        }
        self.sh.tree.st.lock().unwrap_or_else(|e| e.into_inner()).2 = true;
        self.sh.tree.cv.notify_all();
    }
}

/// `range` as the [`Io`]s that go through the queues: itself if it is at
/// most `max` bytes, else pieces of `max` (the last shorter) sharing one
/// [`Split`]; a write's `data` is cut with it, a read's buffer is made
/// by the read stage (`read` true: the whole request's plaintext buffer
/// is allocated here for the pieces to fill).
fn pieces(
    range: SectorRange,
    max: u64,
    mut data: Vec<u8>,
    fua: bool,
    t0: Instant,
    done: Done,
    read: bool,
) -> Vec<Io> {
    let len = range.len();
    if len <= max {
        return vec![Io {
            range,
            fua,
            buf: data,
            done,
            t0,
            part: None,
        }];
    }
    let n = len.div_ceil(max) as usize;
    let split = Arc::new(Split {
        st: Mutex::new(SplitState {
            left: n,
            len,
            // Every byte is a piece's plaintext before it is handed on (a
            // failed piece fails the request and the buffer is dropped).
            buf: if read {
                crate::bufpool::take(len as usize)
            } else {
                Vec::new()
            },
            err: None,
            done: Some(done),
        }),
    });
    let mut v = Vec::with_capacity(n);
    let mut off = 0;
    while off < len {
        let l = max.min(len - off);
        let buf = if read {
            Vec::new()
        } else {
            // Each piece owns its plaintext, as each bio clone has its own
            // pages; the write stage copies it into a bounce buffer anyway.
            let rest = data.split_off(l as usize);
            std::mem::replace(&mut data, rest)
        };
        v.push(Io {
            range: range.sub(off, l),
            fua,
            buf,
            done: Box::new(|_| {}),
            t0,
            part: Some((Arc::clone(&split), off)),
        });
        off += l;
    }
    v
}

/// Completes `io`: a whole request at once; a piece into its [`Split`],
/// the request completing with its last piece (over the whole range, from
/// its submission time, with the first error if a piece failed).
fn complete_io(sh: &Shared, dir: Dir, io: &mut Io, res: Completion) {
    let done = std::mem::replace(&mut io.done, Box::new(|_| {}));
    let Some((split, off)) = io.part.take() else {
        return complete(sh, dir, io.range, io.t0, res, done);
    };
    let mut g = split.st.lock().unwrap_or_else(|e| e.into_inner());
    match res {
        Ok(Some(data)) => {
            let at = off as usize;
            if let Some(dst) = g.buf.get_mut(at..at + data.len()) {
                dst.copy_from_slice(&data);
            }
            crate::bufpool::give(data);
        }
        Ok(None) => {}
        Err(e) => {
            g.err.get_or_insert(e);
        }
    }
    g.left -= 1;
    if g.left > 0 {
        return;
    }
    let len = g.len;
    let res = match g.err.take() {
        Some(e) => Err(e),
        None if dir == Dir::Read => Ok(Some(std::mem::take(&mut g.buf))),
        None => Ok(None),
    };
    let Some(done) = g.done.take() else { return };
    drop(g);
    sh.ctx.complete(dir, Path::Queued, len, io.t0, res, done);
}

fn complete(
    sh: &Shared,
    dir: Dir,
    io_range: SectorRange,
    t0: Instant,
    res: Completion,
    done: Done,
) {
    sh.ctx
        .complete(dir, Path::Queued, io_range.len(), t0, res, done);
}

/// nice -20 for this thread (`high_priority`); refused without
/// CAP_SYS_NICE, which leaves it at the process's nice value. On Linux
/// `setpriority(PRIO_PROCESS, tid)` sets one thread's nice value.
fn raise_priority() {
    let tid = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(tid), -20);
}

/// `kcryptd_queue_crypt`: hands work to the crypt pool (this CPU's queue
/// with `same_cpu_crypt`).
fn kcryptd_queue_crypt(sh: &Shared, w: CryptWork) {
    let i = if sh.same_cpu {
        crate::cpu::current() % sh.crypt_qs.len()
    } else {
        0
    };
    sh.crypt_qs[i].push(w);
}

/// Reads one `kcryptd_io` worker takes off the queue at once: everything
/// pending up to this, handed to the backend as one batch (the kernel's
/// plug: one submission for the bios queued meanwhile).
const IO_BATCH: usize = 64;

/// The `kcryptd_io` worker: `kcryptd_io_read` + the device + `crypt_endio`.
fn kcryptd_io(sh: &Shared) {
    let mut ios = Vec::with_capacity(IO_BATCH);
    while sh.io_q.pop_many(IO_BATCH, &mut ios) {
        for io in ios.iter_mut() {
            // The backend read fills it all or fails the request, which
            // then drops it: pooled contents never reach a reply.
            io.buf = crate::bufpool::take(io.range.len() as usize);
        }
        let mut ops: Vec<backend::ReadOp<'_>> = ios
            .iter_mut()
            .map(|io| backend::ReadOp {
                offset: io.range.at(),
                buf: &mut io.buf,
            })
            .collect();
        let res = sh.ctx.backend.read_batch(&mut ops);
        drop(ops);
        for (io, r) in ios.drain(..).zip(res) {
            match r {
                // crypt_endio: hand the ciphertext to kcryptd for decryption.
                Ok(()) => kcryptd_queue_crypt(sh, CryptWork::ReadConvert(io)),
                Err(e) => {
                    let mut io = io;
                    complete_io(sh, Dir::Read, &mut io, Err(Error::Io(e)));
                }
            }
        }
    }
}

/// The `kcryptd` crypt worker.
fn kcryptd(sh: &Shared, q: usize) {
    while let Some(w) = sh.crypt_qs[q].pop() {
        match w {
            CryptWork::ReadConvert(io) => kcryptd_crypt_read_convert(sh, io),
            CryptWork::WriteConvert(io) => kcryptd_crypt_write_convert(sh, io),
        }
    }
}

fn kcryptd_crypt_read_convert(sh: &Shared, mut io: Io) {
    if let Some(c) = &sh.ctx.crypt {
        c.decrypt(io.range.sector(), &mut io.buf);
    }
    // kcryptd_crypt_read_done
    let buf = std::mem::take(&mut io.buf);
    complete_io(sh, Dir::Read, &mut io, Ok(Some(buf)));
}

fn kcryptd_crypt_write_convert(sh: &Shared, mut io: Io) {
    let len = io.buf.len();
    let mut bounce = sh.pool.alloc(len);
    bounce.extend_from_slice(&io.buf);
    io.buf = bounce;
    if let Some(c) = &sh.ctx.crypt {
        c.encrypt(io.range.sector(), &mut io.buf);
    }
    kcryptd_crypt_write_io_submit(sh, io);
}

fn kcryptd_crypt_write_io_submit(sh: &Shared, io: Io) {
    if sh.submit_from_crypt_cpus {
        return write_and_endio(sh, io);
    }
    let mut g = sh.tree.st.lock().unwrap_or_else(|e| e.into_inner());
    let was_empty = g.0.is_empty();
    let seq = g.1;
    g.1 += 1;
    g.0.insert((io.range.sector(), seq), io);
    drop(g);
    if was_empty {
        sh.tree.cv.notify_one();
    }
}

/// Backend write of an encrypted bounce buffer, then `crypt_endio`.
fn write_and_endio(sh: &Shared, mut io: Io) {
    let res = sh.ctx.backend.write_at(&io.buf, io.range.at(), io.fua);
    endio_write(sh, &mut io, res);
}

/// `crypt_endio` of a write: frees the bounce buffer, completes.
fn endio_write(sh: &Shared, io: &mut Io, res: std::io::Result<()>) {
    let len = io.range.len() as usize;
    sh.pool.free(std::mem::take(&mut io.buf), len);
    let res = res.map(|_| None).map_err(Error::Io);
    complete_io(sh, Dir::Write, io, res);
}

/// The `dmcrypt_write` thread.
fn dmcrypt_write(sh: &Shared) {
    loop {
        let mut g = sh.tree.st.lock().unwrap_or_else(|e| e.into_inner());
        while g.0.is_empty() && !g.2 {
            g = sh.tree.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        if g.0.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut g.0);
        drop(g);
        // The whole tree in sector order as one submission (blk_start_plug);
        // two writes to the same sectors go in separate batches, in
        // arrival order, so the later one lands last.
        let mut ios: Vec<Io> = batch.into_values().collect();
        let mut start = 0;
        while start < ios.len() {
            let mut end = start + 1;
            let mut reach = ios[start].range.at() + ios[start].range.len();
            while end < ios.len() && reach <= ios[end].range.at() {
                reach = reach.max(ios[end].range.at() + ios[end].range.len());
                end += 1;
            }
            let ops: Vec<backend::WriteOp<'_>> = ios[start..end]
                .iter()
                .map(|io| backend::WriteOp {
                    buf: &io.buf,
                    offset: io.range.at(),
                    fua: io.fua,
                })
                .collect();
            let res = sh.ctx.backend.write_batch(&ops);
            drop(ops);
            for (io, r) in ios[start..end].iter_mut().zip(res) {
                endio_write(sh, io, r);
            }
            start = end;
        }
    }
}
