//! `ucrypt reencrypt --decrypt --header NEWFILE DEVICE` where NEWFILE
//! does not exist: cryptsetup 2.6.1's decryption of a volume whose
//! header is inside the device (`decrypt_luks2_datashift_init`): the
//! header exported to NEWFILE, the data moved down by the data offset
//! while it is decrypted, over `luks::reencrypt::init_decrypt_shift`.
//! A resume names NEWFILE with `--header` and goes the ordinary way. The
//! online start (`--active-name`) is `reencrypt_online.rs`'s, with the
//! same checks and question.

use std::path::Path;

use luks::reencrypt::{self, DecryptShiftRequest};
use luks::{ops, DeviceAccess};

use super::reencrypt::{prompt, ReencryptArgs};
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// Whether `--decrypt --header` names a header file that does not exist
/// (cryptsetup's test: `stat` fails with `ENOENT`).
pub(super) fn wanted(a: &ReencryptArgs) -> bool {
    a.decrypt
        && a.active_name.is_none()
        && a.header.as_deref().is_some_and(|h| {
            std::fs::symlink_metadata(h).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        })
}

/// cryptsetup's refusal of a `--decrypt --header` file that exists but
/// holds no LUKS header.
pub(super) fn check_header(a: &ReencryptArgs, g: &Globals) -> CmdResult {
    let Some(h) = a.header.as_deref().filter(|_| a.decrypt) else {
        return Ok(());
    };
    let access = g.access();
    if h.exists() && luks::ops::probe(h, &access).is_err() && reencrypt::status(h, &access).is_err()
    {
        return Err(Failure::usage(format!(
            "Device {} is not a valid LUKS device.",
            h.display()
        )));
    }
    Ok(())
}

/// Only a plain LUKS2 volume on the device is exported; anything else
/// gets the error a missing header gets.
pub(super) fn check_plain_luks2(dev: &Path, header: &Path, access: &DeviceAccess) -> CmdResult {
    let plain_luks2 = matches!(luks::Volume::load(dev, None, access), Ok(v) if v.header().version() == 2)
        && matches!(reencrypt::status(dev, access), Ok(None));
    if !plain_luks2 {
        return Err(Failure::usage(format!(
            "Device {} does not exist or access denied.",
            header.display()
        )));
    }
    Ok(())
}

/// cryptsetup's question before the export (unless `--batch-mode`).
pub(super) fn confirm(dev: &Path, header: &Path, g: &Globals) -> CmdResult {
    if !g.batch_mode {
        let q = format!(
            "Header file {h} does not exist. Do you want to initialize LUKS2 decryption of \
             device {d} and export LUKS2 header to file {h}?",
            h = header.display(),
            d = dev.display()
        );
        if !ops::Ui::confirm(&mut super::luks::Terminal, &q) {
            return Err(Failure::usage("Operation aborted."));
        }
    }
    Ok(())
}

/// Initializes the decryption of `dev` with its header exported to
/// `header` (asking first unless `--batch-mode`), then runs it unless
/// `--init-only`.
pub(super) fn run(a: &ReencryptArgs, dev: &Path, header: &Path, g: &Globals) -> CmdResult {
    if a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    let access = g.access();
    check_plain_luks2(dev, header, &access)?;
    confirm(dev, header, g)?;
    let req = DecryptShiftRequest {
        resilience: a.resilience.clone(),
        resilience_hash: a.resilience_hash.clone(),
        hotzone: a.hotzone_size.unwrap_or(0),
        key_slot: a.key_slot,
        access,
    };
    if let Some(r) = req.resilience.as_deref() {
        if matches!(r, "datashift" | "none") {
            return Err(Failure::usage(
                "Requested --resilience option cannot be applied to current reencryption operation.",
            ));
        }
    }
    let pass = a.key.source(g.prompting()).read(&prompt(a, dev), false)?;
    reencrypt::init_decrypt_shift(dev, header, &pass, &req)?;
    if a.init_only {
        return Ok(());
    }
    super::reencrypt::run_steps(a, dev, &pass, false, g)
}
