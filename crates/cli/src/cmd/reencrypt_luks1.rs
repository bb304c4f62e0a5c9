//! `ucrypt reencrypt` of a LUKS1 volume: cryptsetup 2.6.1's LUKS1
//! reencryption (a new volume key; `--cipher`, `--key-size`, `--hash`, the new
//! keyslot's `--pbkdf-force-iterations`; `--keep-key`; `--reduce-device-size`;
//! `--decrypt`; `--encrypt --type luks1` with `--reduce-device-size` or a
//! detached `--header`), its `LUKS-<uuid>.log/.org/.new` files in the
//! working directory, over `luks::reencrypt::luks1`.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use luks::passphrase::Prompting;
use luks::reencrypt::{luks1, Outcome};

use super::reencrypt::{prompt, Progress, ReencryptArgs};
use crate::global::Globals;
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

/// Whether `reencrypt` of `dev` is cryptsetup's LUKS1 tool's: `--encrypt
/// --type luks1`; a LUKS1 header (on `dev` or `--header`), or one marked
/// by a LUKS1 reencryption; `--decrypt --uuid` resuming a decryption
/// whose log is in the working directory.
pub(super) fn wanted(a: &ReencryptArgs, dev: &Path) -> bool {
    if a.encrypt {
        return matches!(a.luks_type.as_deref(), Some("luks1" | "luks"));
    }
    if is_luks1(a.header.as_deref().unwrap_or(dev)) {
        return true;
    }
    match (&a.uuid, a.decrypt) {
        (Some(u), true) => Path::new(&format!("LUKS-{u}.log")).exists(),
        _ => false,
    }
}

/// Whether `header` names the same file or device as `dev` (cryptsetup:
/// such a header is not detached).
fn same_file(header: &Path, dev: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    id(header).is_some() && id(header) == id(dev)
}

/// The request from the options, refusing what cryptsetup refuses and
/// what ucrypt does not do (with the words of each).
fn request(a: &ReencryptArgs, dev: &Path, g: &Globals) -> Result<luks1::Luks1Request, Failure> {
    for (given, what) in [
        (a.init_only, "--init-only"),
        (a.sector_size.is_some(), "--sector-size"),
        (a.resilience.is_some(), "--resilience"),
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
    if let Some(r) = a.reduce_device_size {
        if r > 1 << 30 {
            return Err(Failure::usage("Maximum device reduce size is 1 GiB."));
        }
        if r % 512 != 0 {
            return Err(Failure::usage(
                "Reduce size must be multiple of 512 bytes sector.",
            ));
        }
    }
    let mode = if a.encrypt {
        luks1::Luks1Mode::Encrypt
    } else if a.decrypt {
        luks1::Luks1Mode::Decrypt
    } else {
        luks1::Luks1Mode::Reencrypt
    };
    // cryptsetup's tool would shift the data with the old key kept (or
    // decrypt backward over itself): the data would be lost.
    if a.keep_key {
        for (given, what) in [
            (a.reduce_device_size.is_some(), "--reduce-device-size"),
            (a.cipher.is_some(), "--cipher"),
            (a.key_size.is_some(), "--key-size"),
            (
                mode != luks1::Luks1Mode::Reencrypt,
                "--encrypt or --decrypt",
            ),
        ] {
            if given {
                return Err(Failure::usage(format!(
                    "LUKS1 reencryption with --keep-key and {what} is not supported by ucrypt (the data would be lost)."
                )));
            }
        }
    }
    if mode == luks1::Luks1Mode::Decrypt && a.reduce_device_size.is_some() {
        return Err(Failure::usage(
            "LUKS1 decryption with --reduce-device-size is not supported by ucrypt (the data would be lost).",
        ));
    }
    let header = a.header.clone().filter(|h| !same_file(h, dev));
    if mode == luks1::Luks1Mode::Encrypt && header.is_none() && a.reduce_device_size.is_none() {
        return Err(Failure::usage(
            "Encryption without detached header (--header) is not possible without data device size reduction (--reduce-device-size).",
        ));
    }
    Ok(luks1::Luks1Request {
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        hash: Some(luks::Hash::parse(&a.kdf.hash)?),
        kdf: a.kdf.request(1, g.verbose())?,
        mode,
        reduce: a.reduce_device_size.unwrap_or(0),
        keep_key: a.keep_key,
        header,
        uuid: a.uuid.clone(),
        access: g.access(),
        volume_key_file: a.volume_key_file.clone(),
    })
}

/// Runs the LUKS1 reencryption of `dev` (or resumes it), the passphrase
/// asked as `g` says.
pub(super) fn run(a: &ReencryptArgs, dev: &Path, g: &Globals) -> CmdResult {
    let prompting = g.prompting();
    let req = request(a, dev, g)?;
    let dir = std::env::current_dir()
        .map_err(|e| Failure::usage(format!("Cannot read the working directory: {e}")))?;
    let uuid = luks1::resumable(dev, &dir, &req)?;
    let resumed = uuid.is_some();
    if a.resume_only && !resumed {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    if let Some(uuid) = uuid {
        println!(
            "Log file {} exists, resuming reencryption.",
            dir.join(format!("LUKS-{uuid}.log")).display()
        );
    } else if req.uuid.is_some() {
        return Err(Failure::usage(
            "No decryption in progress, provided UUID can be used only to resume suspended \
             decryption process.",
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let renew_each = req.mode == luks1::Luks1Mode::Reencrypt;
    if !resumed && renew_each && a.key_slot.is_none() && a.key.key_file.is_none() {
        // Every active keyslot renewed, each passphrase asked for its
        // keyslot and checked, as cryptsetup's LUKS1 reencryption does.
        let passes = slot_passphrases(a, dev, prompting, &req.access)?;
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
    let fresh_encrypt = !resumed && req.mode == luks1::Luks1Mode::Encrypt;
    let text = match (a.key_slot, fresh_encrypt) {
        (_, true) => "Enter new passphrase: ".to_string(),
        (None, false) if req.mode == luks1::Luks1Mode::Decrypt || resumed => {
            "Enter any existing passphrase: ".to_string()
        }
        _ => prompt(a, dev),
    };
    let pass = a.key.source(prompting).read(&text, fresh_encrypt)?;
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
    access: &luks::DeviceAccess,
) -> Result<Vec<(u32, crypto::Secret)>, Failure> {
    let vol = luks::Volume::load(dev, a.header.as_deref(), access)?;
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
