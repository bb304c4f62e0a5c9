//! A generation: one volume + configuration with the mode's threads, what
//! a live reconfiguration (table swap) replaces; and how a request
//! completes in it ([`Ctx::complete`]: stats, queue slot, callback).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use backend::Backend;

use super::submit::replay;
use super::{catch, Core};
use crate::gate;
use crate::layout::Layout;
use crate::mode::adaptive::Adaptive;
use crate::mode::classic::Classic;
use crate::segments::{Cipher, Segs};
use crate::stats::{Dir, Path};
use crate::{Completion, CryptMode, EngineConfig, Error};

/// One volume + configuration, with the mode's threads: what a table swap
/// replaces.
pub(crate) struct Ctx {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) crypt: Option<Cipher>,
    pub(crate) data_offset: u64,
    /// The targets of a multi-target mapping (`None`: one target).
    pub(crate) segs: Option<Arc<Segs>>,
    pub(crate) size: u64,
    pub(crate) sector_size: u32,
    pub(crate) cfg: EngineConfig,
    pub(crate) core: Arc<Core>,
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
    pub(super) pipe: Pipe,
    pub(super) handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Gen {
    /// The adaptive pipeline, when this generation runs one.
    pub(crate) fn adaptive(&self) -> Option<&Adaptive> {
        match &self.pipe {
            Pipe::Adaptive(a) => Some(a),
            _ => None,
        }
    }

    pub(super) fn build(
        core: &Arc<Core>,
        lay: Layout,
        cfg: EngineConfig,
    ) -> Result<Arc<Gen>, Error> {
        if cfg.queue_depth == 0 {
            return Err(Error::Invalid("queue_depth must be at least 1".into()));
        }
        let ctx = Arc::new(Ctx {
            backend: lay.backend,
            crypt: lay.crypt,
            data_offset: lay.data_offset,
            segs: lay.segs,
            size: lay.size,
            sector_size: lay.sector_size,
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
    pub(super) fn retire(&self) {
        match &self.pipe {
            Pipe::Inline => {}
            Pipe::Classic(c) => c.close(),
            Pipe::Adaptive(a) => a.close(),
        }
        let handles = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()));
        self.ctx.core.retire(handles);
    }
}
