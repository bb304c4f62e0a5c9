//! Live changes, as dm's suspend/resume: stop admitting, drain, swap the
//! generation, resume ([`Engine::reconfigure`], [`Engine::resize`],
//! [`Engine::reload`], [`Engine::suspend`] / [`Engine::resume`]), and the
//! end of it all ([`Engine::shutdown`]).
//!
//! Each drains: it waits until every admitted request has completed,
//! including those gathered in a frontend's [`Plug`](crate::Plug) and not
//! yet run. A plug's owner runs its plug on its own (when it would block,
//! see the plug), so a drain from another thread waits for it; a thread
//! that calls one of these itself flushes its plug first
//! ([`Plug::flush`](crate::Plug::flush)), or it would wait on its own
//! requests.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crypto::SectorCrypt;

use super::generation::Gen;
use super::submit::replay;
use super::{catch, Engine};
use crate::layout::Layout;
use crate::segments::Cipher;
use crate::{EngineConfig, Error, Mapping, Volume};

impl Engine {
    /// Switches mode/flags live: suspend (drain), swap, resume. The volume
    /// stays; its backend and cipher are shared with the new generation.
    pub fn reconfigure(&self, cfg: EngineConfig) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let lay = self.current()?;
        self.swap(lay, cfg)
    }

    /// Changes the decrypted device's size live (`cryptsetup resize`: a
    /// table reload with a new length): drain, swap, resume. From then on
    /// the choke point refuses requests past `size`. A multi-target
    /// mapping is refused: which target would change is the table's to
    /// say ([`Engine::reload_mapping`]).
    pub fn resize(&self, size: u64) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let vol = self.current_volume("resized")?;
        self.swap(Layout::volume(Volume { size, ..vol })?, self.config())
    }

    /// `luksSuspend`: stops admitting (callers block in `submit`, requests
    /// from engine threads wait on the deferred list), drains what is in
    /// flight, then swaps in a generation without the cipher, so the key
    /// goes with the last reference to the old one. Nothing is admitted
    /// again until [`Engine::resume`] (or [`Engine::reload_mapping`]);
    /// [`Engine::shutdown`] fails what waits.
    pub fn suspend(&self) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        let lay = self.current()?;
        let cfg = self.config();
        self.core.gate.hold(true);
        // The cipherless generation never runs a request: admission stays
        // held until `resume` installs a cipher again.
        self.swap(Layout { crypt: None, ..lay }, cfg)
            .inspect_err(|_| self.core.gate.hold(false))
    }

    /// `luksResume`: installs `crypt` and admits again; the requests that
    /// waited run now. An error if not suspended, or if the mapping has
    /// several targets (those resume with [`Engine::reload_mapping`],
    /// which brings every target's key).
    pub fn resume(&self, crypt: Arc<SectorCrypt>) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        if !self.core.gate.held() {
            return Err(Error::Invalid("The engine is not suspended".into()));
        }
        let vol = self.current_volume("resumed with one key")?;
        let lay = Layout::volume(Volume {
            crypt: Some(crypt),
            ..vol
        })?;
        self.swap(lay, self.config())?;
        self.core.gate.hold(false);
        replay(&self.core, self.core.gate.take_deferred(), false);
        Ok(())
    }

    /// True between [`Engine::suspend`] and [`Engine::resume`].
    pub fn is_suspended(&self) -> bool {
        self.core.gate.held()
    }

    /// True when a request waits for admission: blocked by a suspension
    /// or a swap, or by a full queue (a client with IO to do now).
    pub fn requests_waiting(&self) -> bool {
        self.core.gate.has_waiters()
    }

    /// The current generation's layout.
    fn current(&self) -> Result<Layout, Error> {
        let cur = self.core.gate.current().ok_or(Error::Shutdown)?;
        let c = &cur.ctx;
        Ok(Layout {
            backend: c.backend.clone(),
            crypt: c.crypt.clone(),
            data_offset: c.data_offset,
            segs: c.segs.clone(),
            size: c.size,
            sector_size: c.sector_size,
        })
    }

    /// The current generation as a one-target volume; an error naming
    /// what cannot be done (`what`) to a multi-target mapping.
    fn current_volume(&self, what: &str) -> Result<Volume, Error> {
        let lay = self.current()?;
        if lay.segs.is_some() {
            return Err(Error::Invalid(format!(
                "A mapping of several targets cannot be {what}; reload its table instead"
            )));
        }
        let crypt = match lay.crypt {
            Some(Cipher::One(c)) => Some(c),
            _ => None,
        };
        Ok(Volume {
            backend: lay.backend,
            crypt,
            data_offset: lay.data_offset,
            size: lay.size,
            sector_size: lay.sector_size,
        })
    }

    /// Replaces the whole volume (table reload) live: drain, swap, resume.
    pub fn reload(&self, vol: Volume) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        self.swap(Layout::volume(vol)?, self.config())
    }

    /// Replaces the mapping with another target list live (`dmsetup
    /// reload` + `resume`): stop admitting, drain what is in flight, swap,
    /// admit again. Requests in flight finish under the old targets; every
    /// request admitted after sees only the new ones (a request is never
    /// split across two lists). On a suspended engine the new mapping is
    /// installed and the engine resumes, as `dmsetup resume` activates a
    /// loaded table.
    pub fn reload_mapping(&self, m: Mapping) -> Result<(), Error> {
        let _one = self.core.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        self.swap(Layout::mapping(m)?, self.config())?;
        if self.core.gate.held() {
            self.core.gate.hold(false);
            replay(&self.core, self.core.gate.take_deferred(), false);
        }
        Ok(())
    }

    fn swap(&self, vol: Layout, cfg: EngineConfig) -> Result<(), Error> {
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

    /// Drains in-flight requests, flushes, stops and joins worker threads.
    /// Later requests fail with [`Error::Shutdown`]. Idempotent.
    pub fn shutdown(&self) -> Result<(), Error> {
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
