//! `ucrypt reencrypt --active-name NAME`: the online reencryption of a
//! volume ucrypt serves, or the continuation (`--resume-only`) of an
//! encryption or decryption it serves mid-way. The passphrase is read here and crosses the
//! control socket in locked memory; the daemon moves the data in the
//! background while this command shows its progress (polling `status`)
//! until it ends. `--pause`, `--resume` and `--rate` steer a running one;
//! SIGINT/SIGTERM here pause it (IO keeps flowing; `--resume` continues).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use daemon::control::{
    self, InitParams, KdfParams, ReencryptAction, ReencryptStart, Reencryption, DRAIN_TIMEOUT,
    QUERY_TIMEOUT,
};
use luks::reencrypt;

use super::reencrypt::{init_request, prompt, Progress, ReencryptArgs};
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// How often the progress is polled.
const POLL: Duration = Duration::from_millis(200);

/// Runs `reencrypt --active-name name`.
pub(super) fn run(a: ReencryptArgs, name: &str, g: Globals) -> CmdResult {
    let rate = match a.rate {
        Some(r) if !(r.is_finite() && r >= 0.0) => {
            return Err(Failure::usage(format!("Invalid rate {r}.")))
        }
        Some(r) => (r * f64::from(1 << 20)) as u64,
        None => 0,
    };
    if a.pause || a.resume {
        let mut r = None;
        if a.pause {
            r = Some(control::reencrypt_set(
                name,
                ReencryptAction::Pause,
                QUERY_TIMEOUT,
            )?);
        }
        if a.rate.is_some() {
            r = Some(control::reencrypt_set(
                name,
                ReencryptAction::Rate(rate),
                QUERY_TIMEOUT,
            )?);
        }
        if a.resume {
            r = Some(control::reencrypt_set(
                name,
                ReencryptAction::Resume,
                QUERY_TIMEOUT,
            )?);
        }
        if let Some(r) = r {
            println!("{name}: reencryption {r}");
        }
        return Ok(());
    }
    let st = control::status(name, QUERY_TIMEOUT)?;
    if a.rate.is_some() && st.reencryption.as_ref().is_some_and(|r| r.running) {
        // `--rate` alone steers the one running.
        let r = control::reencrypt_set(name, ReencryptAction::Rate(rate), QUERY_TIMEOUT)?;
        println!("{name}: reencryption {r}");
        return Ok(());
    }
    if st.volume_type != daemon::resolve::VolumeType::Luks2 {
        return Err(Failure::usage(format!(
            "Device {name} is not a LUKS2 volume: online reencryption is for LUKS2 only."
        )));
    }
    let dev = Path::new(&st.device).to_path_buf();
    if let Some(given) = &a.device {
        let same = match (std::fs::canonicalize(given), std::fs::canonicalize(&dev)) {
            (Ok(x), Ok(y)) => x == y,
            _ => given == &dev,
        };
        if !same {
            return Err(Failure::usage(format!(
                "Device {} is not the device of active volume {name} ({}).",
                given.display(),
                dev.display()
            )));
        }
    }
    if st.reencryption.as_ref().is_some_and(|r| r.running) {
        return Err(Failure::new(
            5,
            format!("Reencryption of device {name} is already running."),
        ));
    }
    // The header: the detached one (`--header`, as the daemon serves it)
    // or on the device.
    let meta = a.header.clone().unwrap_or_else(|| dev.clone());
    let state = reencrypt::status(&meta)?;
    if state.is_none() && (a.encrypt || a.decrypt || a.reduce_device_size.is_some()) {
        // An encryption or decryption in progress (started offline, by
        // either tool) continues online; starting one online does not.
        return Err(Failure::usage(
            "Starting LUKS2 encryption or decryption (--encrypt, --decrypt, \
             --reduce-device-size) online is not supported by ucrypt reencrypt: start it \
             offline (or with --init-only), then continue it with --resume-only --active-name.",
        ));
    }
    super::reencrypt::check_progress(state.is_some(), &a, g, &dev)?;
    let init = if state.is_none() {
        let req = init_request(&a)?;
        Some(InitParams {
            cipher: req.cipher,
            key_bits: req.key_bits,
            sector_size: req.sector_size,
            resilience: req.resilience,
            resilience_hash: req.resilience_hash,
            kdf: req.kdf.as_ref().map(KdfParams::of),
        })
    } else {
        None
    };
    let passphrase = a.key.source(g.prompting()).read(&prompt(&a, &dev), false)?;
    let start = ReencryptStart {
        passphrase,
        key_slot: a.key_slot,
        init,
        init_only: a.init_only,
        hotzone: a.hotzone_size.unwrap_or(0),
        rate,
    };
    let first = control::reencrypt(name, start, DRAIN_TIMEOUT)?;
    if a.init_only {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Failure::usage(format!("Cannot handle signals: {e}")))?;
    }
    let mut pr = Progress::new(a.progress_json, a.progress_frequency, &dev);
    pr.update(first.done, first.total);
    let end = watch(name, &stop, &mut pr)?;
    pr.finish();
    match end {
        Some(r) if r.finished => Ok(()),
        Some(Reencryption { error: Some(e), .. }) => {
            Err(Failure::new(1, format!("Reencryption failed: {e}")))
        }
        Some(_) => Err(Failure::usage("Reencryption interrupted.")),
        None => {
            control::reencrypt_set(name, ReencryptAction::Pause, QUERY_TIMEOUT)?;
            Err(Failure::usage(format!(
                "Reencryption interrupted: paused (ucrypt reencrypt --active-name {name} --resume continues it)."
            )))
        }
    }
}

/// Polls the daemon until the reencryption ends (its last progress) or a
/// signal arrives (`None`). A daemon that went away (closed) ends it too.
fn watch(
    name: &str,
    stop: &AtomicBool,
    pr: &mut Progress,
) -> Result<Option<Reencryption>, Failure> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        std::thread::sleep(POLL);
        let st = match control::status(name, QUERY_TIMEOUT) {
            Ok(st) => st,
            Err(e) if e.kind() == daemon::ErrorKind::NotActive => {
                return Err(Failure::usage(format!(
                    "Reencryption interrupted: device {name} was closed."
                )))
            }
            Err(e) => return Err(e.into()),
        };
        let Some(r) = st.reencryption else {
            return Err(Failure::usage("Reencryption interrupted."));
        };
        pr.update(r.done, r.total);
        if !r.running {
            return Ok(Some(r));
        }
    }
}
