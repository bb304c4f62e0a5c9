//! `ucrypt reencrypt` of a LUKS1 volume: cryptsetup 2.6.1's LUKS1
//! reencryption (a new volume key; `--cipher`, `--key-size`, `--hash`, the new
//! keyslot's `--pbkdf-force-iterations`), its `LUKS-<uuid>.log/.org/.new`
//! files in the working directory, over `luks::reencrypt::luks1`.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use luks::passphrase::Prompting;
use luks::reencrypt::{luks1, Outcome};

use super::reencrypt::{prompt, Progress, ReencryptArgs};
use crate::{CmdResult, Failure};

/// Whether `dev` holds a LUKS1 volume, or one marked as in LUKS1
/// reencryption.
pub(super) fn is_luks1(dev: &Path) -> bool {
    let mut head = [0u8; 8];
    let read = std::fs::File::open(dev).and_then(|f| {
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut head, 0)
    });
    read.is_ok()
        && (head[..6] == *b"LUKS\xba\xbe" || head[..6] == luks1::NOMAGIC)
        && head[6..8] == [0, 1]
}

/// Runs the LUKS1 reencryption of `dev` (or resumes it), the passphrase
/// asked as `prompting` says.
pub(super) fn run(a: &ReencryptArgs, dev: &Path, prompting: Prompting) -> CmdResult {
    for (given, what) in [
        (a.init_only, "--init-only"),
        (a.sector_size.is_some(), "--sector-size"),
        (a.resilience.is_some(), "--resilience"),
        (a.decrypt, "--decrypt"),
        (a.header.is_some(), "--header"),
    ] {
        if given {
            return Err(Failure::usage(format!(
                "LUKS1 reencryption with {what} is not supported by ucrypt."
            )));
        }
    }
    if a.key_slot.is_some_and(|s| s >= 8) {
        return Err(Failure::usage("Key slot is invalid."));
    }
    let resumed = luks1::in_progress(dev)?.is_some();
    if a.resume_only && !resumed {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    let kdf = a.kdf.request(1)?;
    let req = luks1::Luks1Request {
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        hash: Some(luks::Hash::parse(&a.kdf.hash)?),
        kdf,
    };
    let dir = std::env::current_dir()
        .map_err(|e| Failure::usage(format!("Cannot read the working directory: {e}")))?;
    if resumed {
        let uuid = luks1::in_progress(dev)?.unwrap_or_default();
        println!(
            "Log file {} exists, resuming reencryption.",
            dir.join(format!("LUKS-{uuid}.log")).display()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    if !resumed && a.key_slot.is_none() && a.key.key_file.is_none() {
        // Every active keyslot renewed, each passphrase asked for its
        // keyslot and checked, as cryptsetup's LUKS1 reencryption does.
        let passes = slot_passphrases(a, dev, prompting)?;
        let slots: Vec<luks::reencrypt::SlotPassphrase<'_>> = passes
            .iter()
            .map(|(slot, p)| luks::reencrypt::SlotPassphrase {
                slot: *slot,
                pass: p,
            })
            .collect();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, stop.clone())
                .map_err(|e| Failure::usage(format!("Cannot handle signals: {e}")))?;
        }
        let mut pr = Progress::new(a.progress_json, a.progress_frequency, dev);
        let out = luks1::run_slots(dev, &dir, &slots, &req, &stop, &mut |d, t| pr.update(d, t))?;
        pr.finish();
        return match out {
            Outcome::Interrupted => Err(Failure::usage("Reencryption interrupted.")),
            _ => Ok(()),
        };
    }
    let pass = a.key.source(prompting).read(&prompt(a, dev), false)?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Failure::usage(format!("Cannot handle signals: {e}")))?;
    }
    let mut pr = Progress::new(a.progress_json, a.progress_frequency, dev);
    let out = luks1::run(dev, &dir, &pass, a.key_slot, &req, &stop, &mut |d, t| {
        pr.update(d, t)
    })?;
    pr.finish();
    match out {
        Outcome::Interrupted => Err(Failure::usage("Reencryption interrupted.")),
        _ => Ok(()),
    }
}

/// The passphrase of every active keyslot of the LUKS1 volume on `dev`,
/// in slot order, each asked as cryptsetup asks it ("Enter passphrase for
/// key slot N: ") and checked against its keyslot (never empty).
fn slot_passphrases(
    a: &ReencryptArgs,
    dev: &Path,
    prompting: Prompting,
) -> Result<Vec<(u32, crypto::Secret)>, Failure> {
    let vol = luks::Volume::load(dev, None)?;
    let slots = vol.header().active_slots();
    super::reencrypt::ask_each_slot(&a.key.source(prompting), slots, |slot, p| {
        vol.unlock(p, Some(slot))
            .map(drop)
            .map_err(|e| match e.kind() {
                luks::ErrorKind::WrongPassphrase => luks::Error::new(
                    luks::ErrorKind::WrongPassphrase,
                    "No key available with this passphrase.",
                ),
                _ => e,
            })
    })
}
