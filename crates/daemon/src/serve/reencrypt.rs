//! Online reencryption of the served volume (`ucrypt reencrypt
//! --active-name`, over the size it is served with), the decryption of
//! one served with a detached header (`--decrypt`; with the header inside
//! the device exported first, `dshift.rs`), and the continuation of an encryption or decryption
//! it serves mid-way (`--resume-only`): the LUKS2 reencryption loop
//! ([`luks::reencrypt::Online`]) runs on a thread of its own while the
//! frontend keeps serving, the engine held for each hotzone.
//!
//! ```text
//!  control: Reencrypt ─► [init] ─► unlock both keys ─► thread ─┐
//!                                                             │ per hotzone:
//!   fence.hold     engine.suspend: admission stops, in-flight requests
//!                  drain (a FLUSH in flight completes first)
//!   mover          read, protect (checksum/journal), header, reencrypt,
//!                  write, sync, header past the hotzone (durable)
//!   fence.advanced engine.reload_mapping(the header's segments at the
//!                  new boundary: new key or plaintext | old key or plaintext):
//!                  admitted again; then the rate limit's sleep, a pause
//! ```
//!
//! The whole engine is held per hotzone (requests outside the hotzone wait
//! too): the hold is one hotzone's move (a few MiB by default, see
//! [`DEFAULT_HOTZONE`]), and the mapping can only change while nothing is
//! in flight anyway. `status` reports the longest hold. When a request
//! waited through a hold, the clients get as long again before the next
//! one, so an unthrottled reencryption under client IO takes at most
//! half of the time; on an idle volume the hotzones go back to back. A request never
//! sees a half-moved hotzone: it runs before the hold under the old
//! mapping or after it under the new one, and the header that describes
//! the new mapping is on the device before any request is admitted under
//! it, so a crash at any point leaves every acknowledged write where the
//! header says (the next `open` repairs a torn hotzone first).
//!
//! `close` and SIGTERM stop the loop after the current hotzone (valid
//! metadata, resumable by `open` + `reencrypt --active-name`, or offline
//! by `reencrypt --resume-only`). If a hotzone fails midway the engine
//! stays held (its data may be half moved): requests wait until `close`
//! fails them, and the next `open` repairs the hotzone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crypto::table::{Target, Targets};
use luks::reencrypt::{self, Fence, Online, Outcome, Resilience, RunOptions};

use super::Daemon;
use crate::control::{InitParams, ReencryptAction, ReencryptStart, Reencryption, Reply};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::resolve::VolumeType;

/// The hotzone when none is asked for: small enough that holding IO for
/// one is brief, large enough that the header writes around it do not
/// dominate.
pub const DEFAULT_HOTZONE: u64 = 4 << 20;

/// A reencryption this daemon started: its progress and controls, and the
/// thread moving the data.
pub(super) struct Running {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    stop: AtomicBool,
    progress: Mutex<Reencryption>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Reencryption> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Daemon {
    /// `Reencrypt`: checks that the served volume is the LUKS2 volume on
    /// its device, initializes a new reencryption if asked, unlocks both
    /// keys and starts the thread. Answers with the progress so far.
    pub(super) fn reencrypt(self: &Arc<Self>, start: ReencryptStart) -> Result<Reply> {
        let name = &self.ping.name;
        if self.volume_type != VolumeType::Luks2 {
            return Err(invalid(format!(
                "Device {name} is not a LUKS2 volume: online reencryption is for LUKS2 only."
            )));
        }
        let mut slot = self.reencryption.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|r| r.shared.lock().running) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("Reencryption of device {name} is already running."),
            ));
        }
        if self.engine.is_suspended() {
            return Err(invalid(format!("Volume {name} is suspended.")));
        }
        if self.engine.config().read_only {
            return Err(invalid(format!(
                "Volume {name} is served read-only: online reencryption writes to it."
            )));
        }
        let device = self.device_path();
        let mut header = self.header();
        let mut meta = header.clone().unwrap_or_else(|| device.clone());
        let state = reencrypt::status(&meta, &self.access)?;
        let pass = &start.passphrase;
        // An online run covers what is served (a volume resized smaller
        // than its data area: its first bytes only, cryptsetup's
        // fixed-length mode), checked before anything is written.
        let served = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len_bytes();
        let fixed = reencrypt::online_size(
            &device,
            &meta,
            &self.access,
            served,
            start.device_size,
            start.init.as_ref().and_then(|p| p.sector_size),
            start.init_only,
        )?;
        match (&state, &start.init) {
            (None, None) => return Err(invalid("Device reencryption not in progress.")),
            (Some(_), Some(_)) if start.init_only => {
                return Err(invalid(
                    "LUKS2 reencryption already initialized. Aborting operation.",
                ))
            }
            (None, Some(p)) => {
                if p.resilience.as_deref() == Some("none") {
                    return Err(refuse_none());
                }
                if p.decrypt && header.is_none() {
                    // The header is in the device: exported to a new file
                    // and the data shifted down (`dshift.rs`), or refused
                    // as cryptsetup refuses it without that file.
                    let Some(new) = &p.export_header else {
                        return Err(invalid(
                            "LUKS2 decryption is supported with detached header device only (with data offset set to 0).",
                        ));
                    };
                    self.start_decrypt_shift(&device, new, &start, p)?;
                    header = Some(new.clone());
                    meta = new.clone();
                } else {
                    self.init_held(&device, header.clone(), &start, p)?;
                }
            }
            (Some(_), None) => {
                if let Some(r) = start.resilience.as_deref() {
                    if r == "none" {
                        return Err(refuse_none());
                    }
                    reencrypt::set_resilience_held(
                        &device,
                        &meta,
                        &self.access,
                        pass,
                        start.key_slot,
                        r,
                        start.resilience_hash.as_deref(),
                    )?;
                }
            }
            (Some(_), Some(_)) => {}
        }
        let mut online = Online::unlock_at(&device, &meta, &self.access, pass, start.key_slot)?;
        if let Some(size) = fixed {
            online.fix_size(size)?;
        }
        let st = online.state();
        if st.resilience == Resilience::None {
            return Err(refuse_none());
        }
        let total = online.total()?;
        let progress = Reencryption {
            done: st.progress_of(total),
            total,
            direction: if st.backward { "backward" } else { "forward" }.into(),
            resilience: st.resilience.name().into(),
            hotzone: if start.hotzone > 0 {
                start.hotzone
            } else {
                DEFAULT_HOTZONE
            },
            hotzones: 0,
            rate: start.rate,
            paused: false,
            running: !start.init_only,
            finished: false,
            error: None,
            max_hold_us: 0,
        };
        if start.init_only {
            return Ok(Reply::Reencryption(progress));
        }
        if st.hotzone().is_none() {
            self.check_served(&online, progress.done)?;
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            progress: Mutex::new(progress.clone()),
            wake: Condvar::new(),
        });
        let d = Arc::clone(self);
        let sh = Arc::clone(&shared);
        let opts = RunOptions {
            hotzone: progress.hotzone,
            header,
            device_size: fixed,
            access: self.access.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("reencrypt".into())
            .spawn(move || d.reencrypt_thread(online, opts, &sh))
            .map_err(|e| {
                Error::new(ErrorKind::Io, "Cannot start the reencryption thread").with_source(e)
            })?;
        *slot = Some(Running {
            shared,
            thread: Some(thread),
        });
        Ok(Reply::Reencryption(progress))
    }

    /// A new reencryption's or decryption's metadata (`p`), written on a
    /// device this daemon serves.
    fn init_held(
        &self,
        device: &std::path::Path,
        header: Option<std::path::PathBuf>,
        start: &ReencryptStart,
        p: &InitParams,
    ) -> Result<()> {
        let req = reencrypt::InitRequest {
            cipher: p.cipher.clone(),
            key_bits: p.key_bits,
            sector_size: p.sector_size,
            resilience: p.resilience.clone(),
            resilience_hash: p.resilience_hash.clone(),
            kdf: p.kdf.as_ref().map(|k| k.request()).transpose()?,
            decrypt: p.decrypt,
            header,
            volume_key_file: None,
            access: self.access.clone(),
        };
        if p.slots.is_empty() {
            reencrypt::init_held(device, &start.passphrase, start.key_slot, &req)?;
        } else {
            let slots: Vec<reencrypt::SlotPassphrase<'_>> = p
                .slots
                .iter()
                .map(|s| reencrypt::SlotPassphrase {
                    slot: s.slot,
                    pass: &s.passphrase,
                })
                .collect();
            reencrypt::init_slots_held(device, &slots, &req)?;
        }
        Ok(())
    }

    /// `ReencryptSet`: pause, resume or a new rate.
    pub(super) fn reencrypt_set(&self, action: ReencryptAction) -> Result<Reply> {
        let name = &self.ping.name;
        let slot = self.reencryption.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = slot.as_ref().filter(|r| r.shared.lock().running) else {
            return Err(invalid(format!(
                "No reencryption of device {name} is running."
            )));
        };
        let mut p = r.shared.lock();
        match action {
            ReencryptAction::Pause => p.paused = true,
            ReencryptAction::Resume => p.paused = false,
            ReencryptAction::Rate(b) => p.rate = b,
        }
        r.shared.wake.notify_all();
        Ok(Reply::Reencryption(p.clone()))
    }

    /// The reencryption's progress for `status`: the one that ran here,
    /// else the one the header records (initialized only, or stopped
    /// before this daemon served the volume), as cryptsetup's status
    /// shows a device in reencryption whether or not it moves. `served`
    /// is the mapping (its lock held by the caller).
    pub(super) fn reencryption_status(&self, served: &Targets) -> Option<Reencryption> {
        {
            let slot = self.reencryption.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = slot.as_ref() {
                return Some(r.shared.lock().clone());
            }
        }
        self.reencryption_on_disk(served)
    }

    /// The header's reencryption, if any, not moving: its progress over
    /// the served size (what an online run covers).
    fn reencryption_on_disk(&self, served: &Targets) -> Option<Reencryption> {
        if self.volume_type != VolumeType::Luks2 {
            return None;
        }
        let meta = self
            .header()
            .unwrap_or_else(|| std::path::PathBuf::from(served.device()));
        // Metadata ucrypt cannot act on shows as none here; `reencrypt`
        // says why.
        let st = reencrypt::status(&meta, &self.access).ok().flatten()?;
        let total = served.len_bytes();
        Some(Reencryption {
            done: st.progress_of(total),
            total,
            direction: if st.backward { "backward" } else { "forward" }.into(),
            resilience: st.resilience.name().into(),
            hotzone: 0,
            hotzones: 0,
            rate: 0,
            paused: false,
            running: false,
            finished: false,
            error: None,
            max_hold_us: 0,
        })
    }

    /// True while a reencryption moves data (or is paused).
    pub(super) fn reencrypting(&self) -> bool {
        let slot = self.reencryption.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().is_some_and(|r| r.shared.lock().running)
    }

    /// Before `close` or a signal: the loop stops after its current
    /// hotzone (the header then describes where it stopped) and its thread
    /// is joined.
    pub(super) fn stop_reencryption(&self) {
        let thread = {
            let mut slot = self.reencryption.lock().unwrap_or_else(|e| e.into_inner());
            let Some(r) = slot.as_mut() else { return };
            r.shared.stop.store(true, Ordering::Relaxed);
            r.shared.wake.notify_all();
            r.thread.take()
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// The detached header the volume is served with, if any.
    pub(super) fn header(&self) -> Option<std::path::PathBuf> {
        self.header
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn device_path(&self) -> std::path::PathBuf {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        std::path::PathBuf::from(t.device())
    }

    /// The served mapping must be the one the header describes at `done`
    /// (the same keys, ciphers and offsets): otherwise the volume served
    /// is not this header's.
    fn check_served(&self, online: &Online, done: u64) -> Result<()> {
        let want = self.targets(online.tables(done)?)?;
        let have = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if *want.line(true) != *have.line(true) {
            return Err(invalid(format!(
                "Volume {} is not served with the keys of the LUKS2 header on {}.",
                self.ping.name,
                have.device()
            )));
        }
        Ok(())
    }

    /// The reencryption's targets as the served mapping: our device, the
    /// engine's flags on every crypt line.
    pub(super) fn targets(&self, tables: Vec<Target>) -> Result<Targets> {
        let mut t = Targets::new(tables)
            .map_err(|e| invalid("Invalid reencryption table").with_source(e))?;
        let have = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.set_device(have.device());
        drop(have);
        let cfg = self.engine.config();
        for c in t.tables_mut() {
            c.options.same_cpu_crypt = cfg.flags.same_cpu_crypt;
            c.options.submit_from_crypt_cpus = cfg.flags.submit_from_crypt_cpus;
            c.options.no_read_workqueue = cfg.flags.no_read_workqueue;
            c.options.no_write_workqueue = cfg.flags.no_write_workqueue;
            c.options.high_priority = cfg.flags.high_priority;
            c.options.allow_discards = cfg.allow_discards;
        }
        Ok(t)
    }

    /// Installs `t` in the held engine and lets IO through: several
    /// targets (or one plaintext target, the end of a decryption) as a
    /// mapping; one crypt target (the end of a reencryption or
    /// encryption) as the one-key volume `open` would have built, so
    /// `resize` and `luksSuspend` work on it again.
    pub(super) fn install(&self, t: &Targets) -> Result<()> {
        let e = |e: datapath::Error| Error::transparent(ErrorKind::Io, e);
        let Some(one) = t.as_single() else {
            let m = crate::targets::mapping(t, self.backend.clone())?;
            return self.engine.reload_mapping(m).map_err(e);
        };
        let crypt = Arc::new(crate::targets::cipher(one)?);
        let vol = datapath::Volume {
            backend: self.backend.clone(),
            crypt: Some(crypt.clone()),
            data_offset: one.offset_bytes(),
            size: one.len_bytes(),
            sector_size: one.options.sector_size,
        };
        self.engine.reload(vol).map_err(e)?;
        self.engine.resume(crypt).map_err(e)
    }

    fn reencrypt_thread(self: Arc<Self>, online: Online, opts: RunOptions, sh: &Shared) {
        let rate = sh.lock().rate;
        let mut fence = EngineFence {
            d: &self,
            sh,
            held: None,
            pace: Pace::new(rate, Instant::now()),
        };
        let r = online.run(
            &opts,
            &sh.stop,
            &mut |done, total| {
                let mut p = sh.lock();
                (p.done, p.total) = (done, total);
            },
            &mut fence,
        );
        let mut p = sh.lock();
        p.running = false;
        match r {
            Ok(Outcome::Finished) => p.finished = true,
            Ok(_) => {}
            Err(e) => {
                let e = Error::from(e);
                eprintln!(
                    "ucrypt: {}: reencryption failed: {}",
                    self.ping.name,
                    e.chain()
                );
                p.error = Some(e.chain());
            }
        }
    }
}

fn refuse_none() -> Error {
    invalid(
        "Online reencryption needs resilience checksum or journal: with none the data \
         clients write meanwhile is not protected against a crash.",
    )
}

/// The engine held per hotzone, the new mapping installed after it.
struct EngineFence<'a> {
    d: &'a Daemon,
    sh: &'a Shared,
    held: Option<Instant>,
    pace: Pace,
}

/// The rate limit's pacing: the bytes moved since the window started
/// against the time since then. A new limit and the end of a pause start
/// a new window, so neither the time paused nor the bytes moved under
/// another limit count: a resume after a long pause does not catch up at
/// full speed, and a limit set after an unthrottled stretch paces from
/// then on instead of stopping the data until the whole run's bytes fit.
struct Pace {
    rate: u64,
    since: Instant,
    moved: u64,
    paused: bool,
}

impl Pace {
    fn new(rate: u64, now: Instant) -> Self {
        Pace {
            rate,
            since: now,
            moved: 0,
            paused: false,
        }
    }

    /// A hotzone of `len` bytes is being moved.
    fn moved(&mut self, len: u64) {
        self.moved += len;
    }

    /// How long to wait at `now` before the next hotzone (`None`: go on)
    /// under the limit `rate` (bytes/s, 0: none), or while `paused`.
    fn wait(&mut self, rate: u64, paused: bool, now: Instant) -> Option<Duration> {
        if paused {
            self.paused = true;
            return Some(Duration::from_millis(500));
        }
        if self.paused || rate != self.rate {
            *self = Pace::new(rate, now);
        }
        if rate == 0 {
            return None;
        }
        let due = Duration::from_secs_f64(self.moved as f64 / rate as f64);
        due.checked_sub(now.duration_since(self.since))
            .filter(|w| !w.is_zero())
    }
}

/// How long the clients run between two hotzones after a hold of
/// `held`: as long as the hold when a request waited through it (`waited`),
/// so under client IO the reencryption takes at most half of the time and
/// the clients keep at least half; none when nobody waited, so an idle
/// volume reencrypts at full speed. (Back to back, an unthrottled
/// reencryption held the engine nearly all the time: clients starved.)
fn client_turn(held: Duration, waited: bool) -> Duration {
    if waited {
        held
    } else {
        Duration::ZERO
    }
}

pub(super) fn luks_err(e: impl std::fmt::Display) -> luks::Error {
    luks::Error::new(luks::ErrorKind::Io, e.to_string())
}

impl Fence for EngineFence<'_> {
    fn hold(&mut self, _off: u64, len: u64) -> luks::Result<()> {
        self.d.engine.suspend().map_err(luks_err)?;
        self.held = Some(Instant::now());
        self.pace.moved(len);
        Ok(())
    }

    fn advanced(&mut self, done: u64, total: u64, tables: Vec<Target>) -> luks::Result<()> {
        let new = self.d.targets(tables).map_err(luks_err)?;
        // Clients that waited through this hold get as long again before
        // the next one (see `client_turn`).
        let waited = self.d.engine.requests_waiting();
        {
            let mut t = self.d.table.lock().unwrap_or_else(|e| e.into_inner());
            self.d.install(&new).map_err(luks_err)?;
            *t = new;
        }
        let held = self.held.take().map_or(Duration::ZERO, |h| h.elapsed());
        let turn_ends = Instant::now() + client_turn(held, waited);
        let mut p = self.sh.lock();
        (p.done, p.total) = (done, total);
        p.hotzones += 1;
        p.max_hold_us = p.max_hold_us.max(held.as_micros() as u64);
        // The clients' turn, then the rate limit: sleep until the bytes
        // moved so far fit the rate; a pause waits here too, IO flowing
        // meanwhile. A stop ends all three.
        loop {
            if self.sh.stop.load(Ordering::Relaxed) || done >= total {
                return Ok(());
            }
            let now = Instant::now();
            let turn = turn_ends.saturating_duration_since(now);
            let w = match self.pace.wait(p.rate, p.paused, now) {
                Some(w) => w.max(turn),
                None if !turn.is_zero() => turn,
                None => return Ok(()),
            };
            p = self
                .sh
                .wake
                .wait_timeout(p, w)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn at(t0: Instant, secs: f64) -> Instant {
        t0 + Duration::from_secs_f64(secs)
    }

    #[test]
    fn clients_that_waited_get_a_turn_as_long_as_the_hold() {
        let hold = Duration::from_millis(12);
        assert_eq!(client_turn(hold, true), hold);
        assert_eq!(client_turn(hold, false), Duration::ZERO);
    }

    #[test]
    fn pace_holds_the_rate() {
        let t0 = Instant::now();
        let mut p = Pace::new(MIB, t0);
        p.moved(4 * MIB);
        let w = p.wait(MIB, false, at(t0, 1.0)).expect("a wait");
        assert_eq!(w, Duration::from_secs(3));
        assert_eq!(p.wait(0, false, at(t0, 1.0)), None, "no limit: no wait");
    }

    #[test]
    fn a_resume_after_a_long_pause_does_not_catch_up_at_full_speed() {
        let t0 = Instant::now();
        let mut p = Pace::new(MIB, t0);
        p.moved(4 * MIB);
        assert_eq!(p.wait(MIB, false, at(t0, 4.0)), None);
        // Paused for a minute.
        assert!(p.wait(MIB, true, at(t0, 4.0)).is_some());
        assert!(p.wait(MIB, true, at(t0, 64.0)).is_some());
        // Resumed: the next hotzone goes, the one after waits its turn
        // at 1 MiB/s rather than 60 MiB of "credit" moving at once.
        assert_eq!(p.wait(MIB, false, at(t0, 64.0)), None);
        p.moved(4 * MIB);
        let w = p
            .wait(MIB, false, at(t0, 64.5))
            .expect("paced after the resume");
        assert!(w >= Duration::from_secs(3), "{w:?}");
    }

    #[test]
    fn a_limit_set_after_an_unthrottled_stretch_paces_from_then_on() {
        let t0 = Instant::now();
        let mut p = Pace::new(0, t0);
        // 10 GiB in 10 s with no limit.
        for _ in 0..2560 {
            p.moved(4 * MIB);
        }
        assert_eq!(p.wait(0, false, at(t0, 10.0)), None);
        // `--rate 50`: the next hotzone waits about 4 MiB / 50 MiB/s, not
        // the 200 s the whole run's bytes would ask at that rate.
        assert_eq!(p.wait(50 * MIB, false, at(t0, 10.0)), None);
        p.moved(4 * MIB);
        let w = p.wait(50 * MIB, false, at(t0, 10.01)).unwrap_or_default();
        assert!(w <= Duration::from_millis(80), "{w:?}");
    }
}
