//! The control requests that change a served volume in place, as
//! cryptsetup does to a live dm-crypt mapping: `resize` (a table reload
//! with a new length), `luksSuspend` (IO blocked, key wiped) and
//! `luksResume` (key reinstated from an unlocked header, IO let through),
//! and `reload` (a new table swapped in, as `dmsetup reload` + `resume`).
//!
//! ```text
//!  resize  ─► backend.refresh_size ─► engine.resize (drain, swap) ─► table.len
//!             └─► export: NBD/vhost answer the new size to who asks next,
//!                 FUSE after its attribute timeout, ublk by UPDATE_SIZE
//!  suspend ─► engine.suspend (hold, drain, drop the cipher) ─► table key zeroed
//!  resume  ─► table line checked against ours ─► engine.resume (cipher, replay)
//!  reload  ─► table parsed, same device and length ─► engine.reload_mapping
//!             (drain, swap, admit) ─► table replaced
//! ```
//!
//! `resize` and `resume` take one-target mappings only: a mapping of
//! several targets changes through `reload`, whose table says what each
//! target becomes.

use std::sync::Arc;

use crypto::table::Table;
use crypto::{Secret, SectorCrypt};

use super::frontend::Frontend;
use super::Daemon;
use crate::control::Reply;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::resolve::VolumeType;

impl Daemon {
    /// `resize [--size]`: the new length in 512-byte sectors, or all the
    /// device holds past the data offset (rounded down to the encryption
    /// sector) when `None`.
    pub(super) fn resize(&self, size_sectors: Option<u64>) -> Result<Reply> {
        let name = &self.ping.name;
        if self.engine.is_suspended() {
            return Err(invalid(format!("Volume {name} is suspended.")));
        }
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let Some(t) = table.as_single_mut() else {
            return Err(invalid(format!(
                "Volume {name} maps several targets; resize is for one: reload a table with the new length instead."
            )));
        };
        let device_bytes = self.backend.refresh_size().map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("Cannot read the size of {}", t.device),
            )
            .with_source(e)
        })?;
        let step = u64::from(t.options.sector_size / 512);
        let room = (device_bytes / 512).saturating_sub(t.offset);
        let len = match size_sectors {
            Some(n) if n % step != 0 => {
                return Err(invalid(
                    "Device size is not aligned to requested sector size.",
                ))
            }
            Some(n) => n,
            None => room - room % step,
        };
        if len == 0 || len > room {
            // cryptsetup's device_block_adjust: -EINVAL, exit 1.
            return Err(invalid(format!("Device {} is too small.", t.device)));
        }
        self.engine
            .resize(len * 512)
            .map_err(|e| Error::transparent(ErrorKind::Io, e))?;
        t.len = len;
        drop(table);
        let mut notes = Vec::new();
        let frontend = self.frontend.lock().unwrap_or_else(|e| e.into_inner());
        match &*frontend {
            Some(Frontend::Ublk { id, .. }) => {
                if let Err(e) = ublk::update_size(*id, len * 512) {
                    notes.push(format!(
                        "/dev/ublkb{id} keeps its old size: the kernel refused UBLK_CMD_UPDATE_SIZE \
                         (Linux 6.16 or later has it): {}; requests past the new end fail",
                        crate::error::chain(&e)
                    ));
                }
            }
            Some(Frontend::Nbd(s)) if s.stats().connections > 0 => notes.push(
                "NBD clients connected now keep the size they were given (the protocol cannot \
                 announce a new one); new connections get the new size, and requests past the \
                 new end fail"
                    .into(),
            ),
            Some(Frontend::Vhost(_)) => notes.push(
                "the vhost-user-blk config space has the new capacity, but no config-change \
                 interrupt is sent (rust-vmm vhost cannot send CONFIG_CHANGE_MSG): the guest \
                 sees it when it re-reads the configuration or reconnects"
                    .into(),
            ),
            _ => {}
        }
        Ok(Reply::Resized {
            size_sectors: len,
            notes,
        })
    }

    /// `luksSuspend`: LUKS volumes only, as in cryptsetup.
    pub(super) fn suspend(&self) -> Result<Reply> {
        let name = &self.ping.name;
        if self.volume_type == VolumeType::Plain {
            return Err(invalid(format!(
                "Suspend is not supported for device {name}."
            )));
        }
        if self.engine.is_suspended() {
            return Err(invalid(format!("Volume {name} is already suspended.")));
        }
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        self.engine.suspend().map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("Error during suspending device {name}."),
            )
            .with_source(e)
        })?;
        // The engine dropped its cipher; this is the other copy of the key.
        t.wipe_keys();
        Ok(Reply::Suspended)
    }

    /// `luksResume` with the table line the client unlocked from the
    /// header: it must describe this very mapping (same cipher, key size,
    /// device, offsets and options; the length is ours, which a resize may
    /// have changed).
    pub(super) fn resume(&self, line: Secret) -> Result<Reply> {
        let name = &self.ping.name;
        if !self.engine.is_suspended() {
            return Err(invalid(format!("Volume {name} is not suspended.")));
        }
        let text = line
            .as_str()
            .ok_or_else(|| invalid("The resume table line is not UTF-8"))?;
        let mut new =
            Table::parse(text).map_err(|e| Error::transparent(ErrorKind::InvalidInput, e))?;
        drop(line);
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let Some(t) = table.as_single_mut() else {
            return Err(invalid(format!(
                "Volume {name} maps several targets; resume it with a reload of its table."
            )));
        };
        new.len = t.len;
        if new.line(false) != t.line(false) {
            return Err(invalid(format!(
                "The unlocked header does not describe volume {name} (cipher, key size, device or offsets differ)"
            )));
        }
        let crypt = SectorCrypt::new(&new.crypt_config())
            .map_err(|e| Error::transparent(ErrorKind::InvalidInput, e))?;
        self.engine
            .resume(Arc::new(crypt))
            .map_err(|e| Error::transparent(ErrorKind::Io, e))?;
        *t = new;
        Ok(Reply::Resumed)
    }

    /// `reload`: replaces the table live. The new one must map the same
    /// device (it is the one the daemon holds open) and the same length
    /// (a size change is `resize`'s); the engine keeps its mode and flags,
    /// which every crypt line of the new table is updated to show.
    /// Refused while suspended: `luksResume` (or `close`) comes first.
    pub(super) fn reload(&self, text: Secret) -> Result<Reply> {
        let name = &self.ping.name;
        if self.engine.is_suspended() {
            return Err(invalid(format!("Volume {name} is suspended.")));
        }
        let text = text
            .as_str()
            .ok_or_else(|| invalid("Invalid table: the table is not UTF-8"))?;
        let mut new = crate::resolve::plain_targets(text)?;
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if !same_file(new.device(), table.device()) {
            return Err(invalid(format!(
                "The new table maps {}, volume {name} maps {}: a reload keeps the device.",
                new.device(),
                table.device()
            )));
        }
        if new.len() != table.len() {
            return Err(invalid(format!(
                "The new table maps {} sectors, volume {name} maps {}: a reload keeps the length (use resize).",
                new.len(),
                table.len()
            )));
        }
        new.set_device(table.device());
        let cfg = self.engine.config();
        for t in new.tables_mut() {
            t.options.perf = t.options.perf.with_workqueue_flags_of(cfg.flags);
            t.options.allow_discards = cfg.allow_discards;
        }
        let m = crate::targets::mapping(&new, self.backend.clone())?;
        self.engine
            .reload_mapping(m)
            .map_err(|e| Error::transparent(ErrorKind::InvalidInput, e))?;
        let reply = Reply::Reloaded {
            targets: new.count(),
            size_sectors: new.len(),
        };
        *table = new;
        Ok(reply)
    }

    /// Before a close or a signal: a suspended engine cannot drain, so
    /// its waiting requests fail (the engine shuts down here) and the
    /// frontend is stopped by force. True if it was suspended.
    pub(super) fn fail_suspended(&self) -> bool {
        if !self.engine.is_suspended() {
            return false;
        }
        eprintln!(
            "ucrypt: {}: closing while suspended; waiting requests fail",
            self.ping.name
        );
        let _ = self.engine.shutdown();
        true
    }
}

/// True when `a` and `b` name the same file (or, when either cannot be
/// resolved, are the same text).
fn same_file(a: &str, b: &str) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
