//! `ucrypt reencrypt --active-name NAME`: the online reencryption of a
//! volume ucrypt serves (over the size it is served with; `--device-size`
//! must equal it), the start of its decryption (`--decrypt`: a detached
//! header, or the header inside the device exported to a new file), or
//! the continuation (`--resume-only`) of an
//! encryption or decryption it serves mid-way. The passphrase is read
//! here and crosses the control socket in locked memory; the daemon
//! initializes the metadata (unless it is in reencryption already) and
//! moves the data in the background while this command shows its
//! progress (polling `status`) until it ends. `--pause`, `--resume` and
//! `--rate` steer a running one; SIGINT/SIGTERM here pause it (IO keeps
//! flowing; `--resume` continues).
//!
//! Starting an encryption or decryption on an active LUKS2 device, as
//! cryptsetup 2.6.1 does it (`src/utils_reencrypt.c`: `reencrypt`,
//! `_encrypt`, `_decrypt`, `decrypt_luks2_init`,
//! `decrypt_luks2_datashift_init`, `encrypt_luks2_init`; every refusal
//! there is `-EINVAL` or `-ENOTSUP`, exit code 1), and what ucrypt does:
//!
//! | request on active NAME | cryptsetup 2.6.1 | ucrypt |
//! |---|---|---|
//! | `--decrypt --header HDR`, HDR a detached header, data offset 0 | starts online (backward, `checksum` unless `--resilience`) | the same, in the daemon; `--init-only` then `--resume-only` too |
//! | `--decrypt --header HDR`, header in the device (or offset > 0) | "LUKS2 decryption is supported with detached header device only (with data offset set to 0)." | the same |
//! | `--decrypt` without `--header` | "LUKS2 decryption requires --header option." | the same |
//! | `--decrypt --header NEW`, NEW not existing, header in the device | starts online: exports the header to NEW, then decrypts moving the data to offset 0 (`datashift-checksum`) | the same, in the daemon (the clients held during the export, `daemon::serve::dshift`); `--init-only` then `--resume-only --header NEW` too |
//! | `--encrypt DEVICE` | "Device HDR-or-DEVICE is already LUKS device. Aborting operation." | the same |
//! | `--encrypt` without DEVICE | "Command requires device as argument." | the same |
//! | `--reduce-device-size` without `--encrypt` | handed to libcryptsetup as a `datashift` reencryption or decryption | refused: not supported |
//!
//! The online encryption cryptsetup has is of a device not active yet:
//! `reencrypt --encrypt [--header HDR | --reduce-device-size SIZE]
//! DEVICE NAME` writes the metadata, activates NAME itself and encrypts
//! under it (`--init-only`: activates and stops there). ucrypt does the
//! same ([`encrypt_as`]): the metadata offline, then `ucrypt open` serves
//! NAME and the daemon encrypts under it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crypto::Secret;
use daemon::control::{
    self, InitParams, KdfParams, ReencryptAction, ReencryptStart, Reencryption, SlotPassphrase,
    DRAIN_TIMEOUT, QUERY_TIMEOUT,
};
use luks::reencrypt;

use super::reencrypt::{init_request, prompt, Progress, ReencryptArgs};
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// How often the progress is polled.
const POLL: Duration = Duration::from_millis(200);

/// Runs `reencrypt --active-name name`.
pub(super) fn run(a: ReencryptArgs, name: &str, g: &Globals) -> CmdResult {
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
    if a.encrypt && a.device.is_none() {
        return Err(Failure::usage("Command requires device as argument."));
    }
    if let Some(h) = a.header.as_ref().filter(|h| a.decrypt && !h.exists()) {
        // cryptsetup exports the device's header to the new file and
        // decrypts with a data shift.
        return decrypt_shift(&a, name, &dev, h, g, rate);
    }
    // The header: the detached one (`--header`, as the daemon serves it)
    // or on the device.
    let meta = a.header.clone().unwrap_or_else(|| dev.clone());
    if a.decrypt && !a.resume_only {
        check_decrypt_header(&a, &dev)?;
    }
    let state = reencrypt::status(&meta, &g.access())?;
    if state.is_none() {
        check_start(&a, &dev)?;
    }
    super::reencrypt::check_progress(state.is_some(), &a, g, &dev)?;
    let mut init = if state.is_none() {
        let req = init_request(&a, g)?;
        Some(InitParams {
            cipher: req.cipher,
            key_bits: req.key_bits,
            sector_size: req.sector_size,
            resilience: req.resilience,
            resilience_hash: req.resilience_hash,
            kdf: req.kdf.as_ref().map(KdfParams::of),
            decrypt: req.decrypt,
            export_header: None,
            slots: Vec::new(),
        })
    } else {
        None
    };
    if let Some(init) = init.as_mut().filter(|i| !i.decrypt && a.key_slot.is_none()) {
        // Every active keyslot renewed, each with its passphrase (asked
        // here, as the offline command asks them); the first one opens
        // the old and the new key for the run.
        let passes = super::reencrypt::slot_passphrases(&a, g, &meta)?;
        let first = passes[0].1.clone();
        init.slots = passes
            .into_iter()
            .map(|(slot, passphrase)| SlotPassphrase { slot, passphrase })
            .collect();
        return start_and_watch(&a, name, &dev, first, Some(init.clone()), rate);
    }
    let passphrase = a.key.source(g.prompting()).read(&prompt(&a, &dev), false)?;
    start_and_watch(&a, name, &dev, passphrase, init, rate)
}

/// `reencrypt --decrypt --header NEWFILE --active-name NAME` of a volume
/// served with its header inside the device: the offline command's
/// checks and question (`reencrypt_dshift.rs`), then the daemon exports
/// the header to NEWFILE and decrypts with a data shift under its
/// clients (`--init-only`: the metadata only, the volume then served
/// with NEWFILE).
fn decrypt_shift(
    a: &ReencryptArgs,
    name: &str,
    dev: &Path,
    header: &Path,
    g: &Globals,
    rate: u64,
) -> CmdResult {
    if a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    super::reencrypt_dshift::check_plain_luks2(dev, header, &g.access())?;
    if let Some("datashift" | "none") = a.resilience.as_deref() {
        return Err(Failure::usage(
            "Requested --resilience option cannot be applied to current reencryption operation.",
        ));
    }
    super::reencrypt_dshift::confirm(dev, header, g)?;
    // The daemon's working directory is not this one.
    let new = std::path::absolute(header)
        .map_err(|e| Failure::usage(format!("Invalid header path {}: {e}", header.display())))?;
    let init = InitParams {
        resilience: a.resilience.clone(),
        resilience_hash: a.resilience_hash.clone(),
        decrypt: true,
        export_header: Some(new),
        ..InitParams::default()
    };
    let passphrase = a.key.source(g.prompting()).read(&prompt(a, dev), false)?;
    start_and_watch(a, name, dev, passphrase, Some(init), rate)
}

/// `reencrypt --encrypt ... DEVICE NAME` after the metadata is written:
/// serves DEVICE as NAME (`ucrypt open`, the passphrase on its stdin) and
/// encrypts under it, as cryptsetup activates NAME and encrypts online.
pub(super) fn encrypt_as(
    a: &ReencryptArgs,
    dev: &Path,
    name: &str,
    pass: Secret,
    g: &crate::global::Globals,
) -> CmdResult {
    use std::io::Write;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::device(format!("Cannot find the ucrypt binary: {e}")))?;
    let mut c = std::process::Command::new(exe);
    c.arg("open");
    if let Some(h) = &a.header {
        c.arg("--header").arg(h);
    }
    if let Some(s) = a.key_slot {
        c.arg("--key-slot").arg(s.to_string());
    }
    // The parent's -v/--debug, as cryptsetup's activation inside its
    // reencrypt logs under them; open's closing status line is left to
    // this command's own (its stdout is read for that: the daemon open
    // starts writes to its log file, never to this pipe).
    if g.verbose {
        c.arg("--verbose");
    }
    if g.debug {
        c.arg("--debug");
    }
    if g.verbose() {
        c.stdout(std::process::Stdio::piped());
    }
    let mut child = c
        .args(["--key-file", "-"])
        .arg(dev)
        .arg(name)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Failure::device(format!("Cannot run ucrypt open: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A failed write shows as open's own error (no passphrase).
        let _ = stdin.write_all(&pass);
    }
    if let Some(out) = child.stdout.take() {
        super::reencrypt_verbose::forward_child(out);
    }
    let st = child
        .wait()
        .map_err(|e| Failure::device(format!("Cannot run ucrypt open: {e}")))?;
    if !st.success() {
        return Err(Failure::new(
            st.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1),
            format!("Cannot activate device {name} for online encryption."),
        ));
    }
    println!("{name} is now active and ready for online encryption.");
    if a.init_only {
        return Ok(());
    }
    start_and_watch(a, name, dev, pass, None, 0)
}

/// Asks the daemon serving `name` to start (`init`) or resume the
/// reencryption, then shows its progress until it ends.
pub(super) fn start_and_watch(
    a: &ReencryptArgs,
    name: &str,
    dev: &Path,
    passphrase: Secret,
    init: Option<InitParams>,
    rate: u64,
) -> CmdResult {
    // A resume may switch the resilience, as cryptsetup's does (the
    // daemon writes it before the data moves again); a start's is in
    // `init`.
    let switch = init.is_none();
    let start = ReencryptStart {
        passphrase,
        key_slot: a.key_slot,
        init,
        init_only: a.init_only,
        hotzone: a.hotzone_size.unwrap_or(0),
        rate,
        resilience: a.resilience.clone().filter(|_| switch),
        resilience_hash: a.resilience_hash.clone().filter(|_| switch),
        device_size: a.device_size,
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
    let mut pr = Progress::new(a.progress_json, a.progress_frequency, dev);
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

/// The refusals of a start on an active device (see the table above):
/// the volume's LUKS2 header is not in reencryption.
fn check_start(a: &ReencryptArgs, dev: &Path) -> CmdResult {
    if a.encrypt {
        // cryptsetup names the header, or the device argument.
        let named = a.header.as_ref().or(a.device.as_ref()).map_or(dev, |p| p);
        return Err(Failure::usage(format!(
            "Device {} is already LUKS device. Aborting operation.",
            named.display()
        )));
    }
    if a.reduce_device_size.is_some() {
        return Err(Failure::usage(
            "Reencryption or decryption with a data shift (--reduce-device-size) of an \
             active device is not supported by ucrypt reencrypt.",
        ));
    }
    Ok(())
}

/// `--decrypt` needs `--header HDR`, a detached header, not the device
/// (checked before the header is read).
fn check_decrypt_header(a: &ReencryptArgs, dev: &Path) -> CmdResult {
    let Some(hdr) = &a.header else {
        return Err(Failure::usage("LUKS2 decryption requires --header option."));
    };
    let same = match (std::fs::canonicalize(hdr), std::fs::canonicalize(dev)) {
        (Ok(x), Ok(y)) => x == y,
        _ => hdr == dev,
    };
    if same {
        return Err(Failure::usage(
            "LUKS2 decryption is supported with detached header device only (with data \
             offset set to 0).",
        ));
    }
    Ok(())
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
