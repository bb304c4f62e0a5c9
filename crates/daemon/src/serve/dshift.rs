//! The start of a decryption with a data shift on a volume served with
//! its header inside the device (`reencrypt --decrypt --header NEWFILE
//! --active-name`, as cryptsetup 2.6.1 starts it online): the init
//! ([`reencrypt::init_decrypt_shift_held`]) runs with the engine held,
//! and the mapping its metadata describes is installed before any
//! request is admitted again; the data then moves as any online
//! reencryption does (`reencrypt.rs`).
//!
//! ```text
//!   checks, the passphrase opens the key          clients' IO flows
//!   engine.suspend                                 requests wait
//!   init: header copied to NEWFILE (synced), the device's signatures
//!         wiped, the data's first bytes copied to the device start
//!         (synced), the metadata written to NEWFILE
//!   the daemon's header is NEWFILE; the mapping of its segments at 0
//!   (the moved segment at the device start, the rest in place)
//!   installed                                      requests run
//! ```
//!
//! The order keeps every acknowledged write where a header says: until
//! the metadata is written, NEWFILE (or the device) holds the old header,
//! which still describes the data in place (the copy only overwrites the
//! old header's area); once it is written, the copy holds what the
//! clients last wrote, since none ran during the init. A failure before
//! the init writes anything lets IO through under the old mapping; one
//! after it keeps the engine held (the old mapping would write where the
//! new metadata no longer reads), so requests wait until `close` fails
//! them and `open --header NEWFILE` serves the volume again.

use std::path::Path;

use luks::reencrypt::{self, DecryptShiftRequest, Online};

use super::reencrypt::luks_err;
use super::Daemon;
use crate::control::{InitParams, ReencryptStart};
use crate::error::Result;

impl Daemon {
    /// Initializes the decryption with a data shift of `device` (its
    /// header inside it) exporting the header to `new`, with the clients
    /// held throughout; on success the daemon serves the volume with the
    /// header `new`.
    pub(super) fn start_decrypt_shift(
        &self,
        device: &Path,
        new: &Path,
        start: &ReencryptStart,
        p: &InitParams,
    ) -> Result<()> {
        let req = DecryptShiftRequest {
            resilience: p.resilience.clone(),
            resilience_hash: p.resilience_hash.clone(),
            hotzone: start.hotzone,
            key_slot: start.key_slot,
            access: self.access.clone(),
        };
        let mut held = false;
        let r =
            reencrypt::init_decrypt_shift_held(device, new, &start.passphrase, &req, &mut || {
                self.engine.suspend().map_err(luks_err)?;
                held = true;
                Ok(())
            });
        if let Err(e) = r {
            // Unless NEWFILE holds the new metadata, the old mapping
            // still holds (written at most: NEWFILE with the old header,
            // the old header's area).
            let described = reencrypt::status(new, &self.access).is_ok_and(|s| s.is_some());
            if held && !described {
                let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                self.install(&t)?;
            }
            return Err(e.into());
        }
        *self.header.lock().unwrap_or_else(|e| e.into_inner()) = Some(new.to_path_buf());
        let online =
            Online::unlock_at(device, new, &self.access, &start.passphrase, start.key_slot)?;
        let t = self.targets(online.tables(0)?)?;
        drop(online);
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        self.install(&t)?;
        *table = t;
        Ok(())
    }
}
