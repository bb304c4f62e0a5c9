//! Live changes, as dm's suspend/resume: stop admitting, drain, swap the
//! generation, resume ([`Engine::reconfigure`], [`Engine::resize`],
//! [`Engine::reload`], [`Engine::suspend`] / [`Engine::resume`]), and the
//! end of it all ([`Engine::shutdown`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crypto::SectorCrypt;

use super::generation::Gen;
use super::submit::replay;
use super::{catch, Engine};
use crate::mode;
use crate::{EngineConfig, Error, Volume};

impl Engine {
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
