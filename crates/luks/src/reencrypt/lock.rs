//! cryptsetup's reencryption lock: one process at a time moves a LUKS2
//! volume's data. cryptsetup takes an exclusive, non-blocking `flock` on
//! `/run/cryptsetup/LN_LUKS2-reencryption-UUID` for as long as it
//! reencrypts (or repairs) a volume; ucrypt takes the same lock, so a
//! `cryptsetup reencrypt` and a `ucrypt reencrypt` (offline, or online in
//! a daemon) of one volume refuse each other instead of both moving its
//! hotzones. The lock is per UUID, as cryptsetup's: two copies of one
//! image share it.
//!
//! Off with metadata locking (`--disable-locks`), as cryptsetup's; not
//! taken where the lock directory cannot be used (no `/run/cryptsetup`
//! and no permission to create it, as for an unprivileged user), where
//! cryptsetup could not run either.

use rustix::fs::FlockOperation;

use crate::error::{Error, ErrorKind, Result};
use crate::lockfile::LockFile;

/// The held lock; released when dropped (the end of the run, or the
/// process's exit, a crash included).
pub(crate) struct ReencryptLock {
    _file: LockFile,
}

impl ReencryptLock {
    /// Takes the lock of the volume with `uuid`: [`ErrorKind::Busy`] with
    /// cryptsetup's message while another process reencrypts it; `None`
    /// when locking is off (`locking` false, as with `--disable-locks`)
    /// or cannot be done here.
    pub(crate) fn take(uuid: &str, locking: bool) -> Result<Option<Self>> {
        if !locking {
            return Ok(None);
        }
        let name = format!("LUKS2-reencryption-{uuid}");
        match LockFile::named(&name, FlockOperation::NonBlockingLockExclusive) {
            Ok(l) => Ok(l.map(|l| Self { _file: l })),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(Error::new(
                ErrorKind::Busy,
                "Reencryption process is already running.",
            )),
            Err(e) => Err(Error::io("Failed to acquire reencryption lock.", e)),
        }
    }
}
