//! `reencrypt -v`: the lines cryptsetup 2.6.1's libcryptsetup adds on
//! stdout when a reencryption starts ("Key slot N unlocked." for each
//! keyslot a passphrase opened, then "Key slot N created." for each
//! keyslot of the new key; an encryption creates one, a decryption
//! creates none, a resume says neither), before the closing
//! "Command successful." line `-v` prints anyway.

use std::path::Path;

use luks::reencrypt;

use crate::global::Globals;
use crate::Failure;

/// The keyslots of the new volume key a start on `meta` created.
pub(super) fn created(g: &Globals, meta: &Path) -> Result<Vec<u32>, Failure> {
    if !g.verbose() {
        return Ok(Vec::new());
    }
    Ok(reencrypt::new_key_slots(meta, &g.access())?)
}

/// The keyslot `pass` opens on `meta` (`key_slot` if given), for the
/// "unlocked" line of a start with one passphrase.
pub(super) fn opened_by(
    g: &Globals,
    meta: &Path,
    key_slot: Option<u32>,
    pass: &[u8],
) -> Result<Option<u32>, Failure> {
    if !g.verbose() {
        return Ok(None);
    }
    if key_slot.is_some() {
        return Ok(key_slot);
    }
    let access = g.access();
    Ok(reencrypt::active_slots(meta, &access)?
        .into_iter()
        .find(|&s| reencrypt::check_slot(meta, &access, s, pass).is_ok()))
}

/// Prints the start's lines: `unlocked`, then `created`, in order.
pub(super) fn started(g: &Globals, unlocked: &[u32], created: &[u32]) {
    if !g.verbose() {
        return;
    }
    for s in unlocked {
        println!("Key slot {s} unlocked.");
    }
    for s in created {
        println!("Key slot {s} created.");
    }
}

/// Copies the spawned `open`'s stdout (its `-v`/`--debug` lines) to ours
/// until it ends, but for its closing status line: the reencryption's
/// own ends the run.
pub(super) fn forward_child(out: std::process::ChildStdout) {
    use std::io::BufRead;
    for line in std::io::BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if line.starts_with("Command successful.") || line.starts_with("Command failed with code") {
            continue;
        }
        println!("{line}");
    }
}
