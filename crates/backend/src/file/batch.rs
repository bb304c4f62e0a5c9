//! Batches on the calling thread's ring ([`Backend::read_batch`] /
//! [`Backend::write_batch`]): routing each entry (direct, buffered or
//! through the arena), one submission for all of them, the single-operation
//! path for what the ring cannot take, and FUA per entry.

use std::io;
use std::sync::atomic::Ordering;

use super::dio::aligned_mem;
use super::{uring, FileBackend, FuaMode, IoEngine, Route};
use crate::{check_range, Backend, ReadOp, WriteOp};

impl FileBackend {
    /// True when a batch of `n` should go to this thread's ring as one
    /// submission (io_uring in use and this thread has a ring).
    fn batch_here(&self, n: usize) -> bool {
        n > 1 && self.engine == IoEngine::Uring && uring::thread_ring_ready()
    }

    /// Where a batched transfer of `len` bytes at `offset` from memory `p`
    /// goes: `Ok(Some((route, bounce)))` to the ring (through the thread's
    /// aligned arena when `bounce`), `Ok(None)` when it needs the
    /// single-operation path (empty, more than one SQE, an alignment the
    /// arena does not give, or under [`HOP_MIN`](super::HOP_MIN) on a file without nowait
    /// IO), `Err` when the request itself is refused.
    fn batch_route(
        &self,
        p: *const u8,
        len: usize,
        offset: u64,
    ) -> io::Result<Option<(Route, bool)>> {
        check_range(self.size(), offset, len as u64)?;
        let route = self.route(offset, len)?;
        let bounce = matches!(route, Route::Direct(_) if !aligned_mem(p, self.dio_align));
        if !self.ring_takes(len) || (bounce && self.dio_align > uring::ARENA_ALIGN as u64) {
            return Ok(None);
        }
        if bounce {
            self.stats.bounced_ops.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some((route, bounce)))
    }

    /// Runs `xs` on this thread's ring as one batch and puts each result
    /// into `res` (`xs[k]` belongs to entry `idx[k]`); entries left `None`
    /// (the ring failed) go to the single-operation path afterwards.
    fn run_batch(
        &self,
        mut xs: Vec<uring::Xfer<'_>>,
        idx: &[usize],
        res: &mut [Option<io::Result<()>>],
    ) {
        if xs.is_empty() {
            return;
        }
        self.stats
            .uring_ops
            .fetch_add(xs.len() as u64, Ordering::Relaxed);
        self.stats.uring_batches.fetch_add(1, Ordering::Relaxed);
        uring::run_batch(&mut xs);
        for (&i, x) in idx.iter().zip(xs) {
            res[i] = x.res;
        }
    }

    /// [`Backend::read_batch`]: the batch on this thread's ring.
    pub(super) fn read_batch_ring(&self, ops: &mut [ReadOp<'_>]) -> Vec<io::Result<()>> {
        if !self.batch_here(ops.len()) {
            return ops
                .iter_mut()
                .map(|o| self.read_at(o.buf, o.offset))
                .collect();
        }
        let mut res: Vec<Option<io::Result<()>>> = Vec::with_capacity(ops.len());
        let mut xs = Vec::with_capacity(ops.len());
        let mut idx = Vec::with_capacity(ops.len());
        for (i, o) in ops.iter_mut().enumerate() {
            match self.batch_route(o.buf.as_ptr(), o.buf.len(), o.offset) {
                Ok(Some((route, bounce))) => {
                    self.count_route(&route);
                    let (Route::Direct(fd) | Route::Buffered(fd)) = route;
                    let x = uring::Xfer::read(fd, o.buf, o.offset);
                    xs.push(if bounce { x.bounced() } else { x });
                    idx.push(i);
                    res.push(None);
                }
                Ok(None) => res.push(Some(self.read_at(o.buf, o.offset))),
                Err(e) => res.push(Some(Err(e))),
            }
        }
        self.run_batch(xs, &idx, &mut res);
        res.into_iter()
            .zip(ops.iter_mut())
            .map(|(r, o)| r.unwrap_or_else(|| self.read_at(o.buf, o.offset)))
            .collect()
    }

    /// [`Backend::write_batch`]: the batch on this thread's ring, FUA per
    /// entry.
    pub(super) fn write_batch_ring(&self, ops: &[WriteOp<'_>]) -> Vec<io::Result<()>> {
        if !self.batch_here(ops.len()) || self.opts.read_only {
            return ops
                .iter()
                .map(|o| self.write_at(o.buf, o.offset, o.fua))
                .collect();
        }
        let mut res: Vec<Option<io::Result<()>>> = Vec::with_capacity(ops.len());
        let mut xs = Vec::with_capacity(ops.len());
        let mut idx = Vec::with_capacity(ops.len());
        for (i, o) in ops.iter().enumerate() {
            match self.batch_route(o.buf.as_ptr(), o.buf.len(), o.offset) {
                Ok(Some((route, bounce))) => {
                    self.count_route(&route);
                    let (Route::Direct(fd) | Route::Buffered(fd)) = route;
                    let dsync = o.fua && self.opts.fua == FuaMode::Dsync;
                    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
                    let x = uring::Xfer::write(fd, o.buf, o.offset, flags);
                    xs.push(if bounce { x.bounced() } else { x });
                    idx.push(i);
                    res.push(None);
                }
                Ok(None) => res.push(Some(self.write_at(o.buf, o.offset, o.fua))),
                Err(e) => res.push(Some(Err(e))),
            }
        }
        self.run_batch(xs, &idx, &mut res);
        // Entries the ring could not take (and the single-path ones above)
        // are complete, FUA included; the batched ones need their FUA.
        let mut batched = vec![false; ops.len()];
        let mut out: Vec<io::Result<()>> = Vec::with_capacity(ops.len());
        for (k, (r, o)) in res.into_iter().zip(ops).enumerate() {
            out.push(match r {
                Some(r) => {
                    batched[k] = idx.binary_search(&k).is_ok();
                    r
                }
                None => self.write_at(o.buf, o.offset, o.fua),
            });
        }
        let idx: Vec<usize> = (0..ops.len()).filter(|&k| batched[k]).collect();
        // FUA: RWF_DSYNC writes are durable on completion; with
        // WriteThenFlush one fdatasync after the batch makes every
        // successful FUA write of it durable before it is reported.
        let dsync = self.opts.fua == FuaMode::Dsync;
        let mut need_sync = false;
        for &i in &idx {
            if ops[i].fua && out[i].is_ok() {
                if dsync {
                    self.stats.dsync_writes.fetch_add(1, Ordering::Relaxed);
                } else {
                    need_sync = true;
                }
            }
        }
        if need_sync {
            if let Err(e) = self.fdatasync() {
                for &i in &idx {
                    if ops[i].fua && out[i].is_ok() {
                        out[i] = Err(match e.raw_os_error() {
                            Some(errno) => io::Error::from_raw_os_error(errno),
                            None => io::Error::new(e.kind(), e.to_string()),
                        });
                    }
                }
            }
        }
        out
    }
}
