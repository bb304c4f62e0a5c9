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
use crate::mode::adaptive::Adaptive;
use crate::mode::classic::Classic;
use crate::segments::{Cipher, Segs};
use crate::stats::{Dir, Path};
use crate::{Completion, CryptMode, EngineConfig, Error, Mapping, Volume};

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

/// What a generation serves: a [`Volume`] or a [`Mapping`], checked.
#[derive(Clone)]
pub(crate) struct Layout {
    pub(crate) backend: Arc<dyn backend::Backend>,
    pub(crate) crypt: Option<Cipher>,
    pub(crate) data_offset: u64,
    pub(crate) segs: Option<Arc<Segs>>,
    pub(crate) size: u64,
    pub(crate) sector_size: u32,
}

impl Layout {
    /// A one-target volume, checked.
    pub(crate) fn volume(vol: Volume) -> Result<Layout, Error> {
        check_volume(&vol)?;
        Ok(Layout {
            backend: vol.backend,
            crypt: vol.crypt.map(Cipher::One),
            data_offset: vol.data_offset,
            segs: None,
            size: vol.size,
            sector_size: vol.sector_size,
        })
    }

    /// A mapping, checked: one target is exactly a [`Volume`].
    pub(crate) fn mapping(m: Mapping) -> Result<Layout, Error> {
        match m.targets.as_slice() {
            [] => Err(Error::Invalid("A mapping needs at least one target".into())),
            [t] => Self::volume(Volume {
                backend: m.backend,
                crypt: t.crypt.clone(),
                data_offset: t.offset,
                size: t.len,
                sector_size: t.crypt.as_ref().map_or(512, |c| c.sector_size() as u32),
            }),
            targets => {
                let (segs, size) = Segs::build(targets, m.backend.size())?;
                let sector_size = segs_sector_size(targets);
                let segs = Arc::new(segs);
                Ok(Layout {
                    data_offset: targets[0].offset,
                    crypt: (!segs.is_plain()).then(|| Cipher::Many(segs.clone())),
                    segs: Some(segs),
                    backend: m.backend,
                    size,
                    sector_size,
                })
            }
        }
    }
}

fn segs_sector_size(targets: &[crate::Target]) -> u32 {
    targets
        .iter()
        .map(|t| t.crypt.as_ref().map_or(512, |c| c.sector_size() as u32))
        .max()
        .unwrap_or(512)
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
