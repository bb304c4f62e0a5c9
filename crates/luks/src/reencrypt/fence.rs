//! The seam between the reencryption loop and a volume being served while
//! it runs (online reencryption): the loop tells a [`Fence`] which range it
//! is about to move and, once the header describes the new boundary
//! durably, hands it the mapping to serve from then on.
//!
//! ```text
//!   Online::unlock (header, state, both keys)      the daemon
//!   Online::run ─┬─ fence.hold(off, len) ────────► IO to the range waits
//!                ├─ mover: read, protect, header, reencrypt, write, sync
//!                ├─ header past the hotzone (or the final header)
//!                └─ fence.advanced(done, tables) ► new mapping, IO flows
//! ```
//!
//! The caller holds the device (the daemon's exclusive claim); nothing
//! here claims it again. Offline `run` goes through the same loop with
//! [`Unfenced`].

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crypto::table::Target;
use crypto::Secret;

use super::header::RawHeader;
use super::lock::ReencryptLock;
use super::{
    data_size, post_segments_mem, read_header_of, segment_targets, size, Outcome, RunOptions, State,
};
use crate::error::{invalid, Result};
use crate::DeviceAccess;

/// What the reencryption loop needs from whoever serves the volume
/// meanwhile.
pub trait Fence {
    /// Before the bytes `[off, off+len)` of the data area are read: from
    /// now until [`Fence::advanced`], no request may touch them (the data
    /// moves under a new key, the header changes).
    fn hold(&mut self, off: u64, len: u64) -> Result<()>;
    /// The header on the device now says `done` bytes are moved (forward:
    /// from the data start; backward: from its end; `done == total`: the
    /// reencryption is finalized); `tables`
    /// is the mapping that serves this (the moved side under the new
    /// key or plaintext, the rest as before). The hold ends here.
    fn advanced(&mut self, done: u64, total: u64, tables: Vec<Target>) -> Result<()>;
    /// Whether a volume is served meanwhile, so [`Fence::advanced`] needs
    /// the mapping (offline: no tables are built).
    fn serves(&self) -> bool {
        true
    }
}

/// No one serves the volume (offline reencryption).
pub struct Unfenced;

impl Fence for Unfenced {
    fn hold(&mut self, _off: u64, _len: u64) -> Result<()> {
        Ok(())
    }

    fn advanced(&mut self, _done: u64, _total: u64, _tables: Vec<Target>) -> Result<()> {
        Ok(())
    }

    fn serves(&self) -> bool {
        false
    }
}

/// A reencryption with its keys unlocked and its metadata verified, ready
/// to run.
pub struct Online {
    pub(super) device: PathBuf,
    /// Where the LUKS2 header is: `device`, or a detached header file.
    pub(super) meta: PathBuf,
    pub(super) header: RawHeader,
    pub(super) dev_size: u64,
    pub(super) state: State,
    pub(super) old_key: Secret,
    pub(super) new_key: Secret,
    /// How the devices are opened (locking, Ceph).
    pub(super) access: DeviceAccess,
    /// cryptsetup's reencryption lock, held until the run ends.
    pub(super) _lock: Option<ReencryptLock>,
}

impl Online {
    /// Loads the reencryption state of `device` (refused when none is in
    /// progress) and unlocks the old and the new key with `pass`; the
    /// device is opened as `access` says.
    pub fn unlock(
        device: &Path,
        access: &DeviceAccess,
        pass: &[u8],
        key_slot: Option<u32>,
    ) -> Result<Self> {
        Self::unlock_at(device, device, access, pass, key_slot)
    }

    /// [`Online::unlock`] with the header in `meta` (a detached header
    /// file, or `device` itself).
    pub fn unlock_at(
        device: &Path,
        meta: &Path,
        access: &DeviceAccess,
        pass: &[u8],
        key_slot: Option<u32>,
    ) -> Result<Self> {
        let (first, _) = read_header_of(meta, device, access)?;
        // Under the lock, the header again: another process may have moved
        // the reencryption on (or ended it) before the lock was had.
        let lock = ReencryptLock::take(&first.bin.uuid, access.locking)?;
        let (header, dev_size) = read_header_of(meta, device, access)?;
        let state =
            State::load(&header)?.ok_or_else(|| invalid("Device reencryption not in progress."))?;
        super::upgrade::check_resumable(&state)?;
        let (old_key, new_key) =
            super::upgrade::unlock_keys(&header, meta, access, pass, key_slot, &state)?;
        state.verify(&header, &old_key, &new_key)?;
        Ok(Online {
            device: device.to_path_buf(),
            meta: meta.to_path_buf(),
            header,
            dev_size,
            state,
            old_key,
            new_key,
            access: access.clone(),
            _lock: lock,
        })
    }

    /// The state as loaded.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Bytes of the data area.
    pub fn total(&self) -> Result<u64> {
        data_size(self.dev_size, &self.state)
    }

    /// Runs only over the data's first `size` bytes (cryptsetup's
    /// fixed-length mode, `size.rs`; [`super::online_size`] says which):
    /// [`Online::total`] and [`Online::tables`] cover that many, and a
    /// [`Online::run`] needs the same in [`RunOptions::device_size`].
    pub fn fix_size(&mut self, size: u64) -> Result<()> {
        self.state.fixed_size = Some(size::check(&self.state, self.dev_size, size)?);
        Ok(())
    }

    /// Runs the reencryption to its end or until `stop` is set (checked
    /// between hotzones), `fence` told around every hotzone (a torn one
    /// repaired first included). `progress(done, total)` after each.
    pub fn run(
        self,
        opts: &RunOptions,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(u64, u64),
        fence: &mut dyn Fence,
    ) -> Result<Outcome> {
        super::run_loop(self, opts, stop, progress, fence)
    }

    /// The mapping after the first `done` bytes moved (forward: from
    /// the data start; backward: from its end), as [`super::tables`]
    /// builds it from the segments the header names at that point: the
    /// new key (or plaintext, for a decryption) on the moved side, the
    /// old key (or plaintext, for an encryption) on the other; one target
    /// when either side is empty.
    pub fn tables(&self, done: u64) -> Result<Vec<Target>> {
        let total = self.total()?;
        let mut h = self.header.clone();
        post_segments_mem(&mut h, &self.state, done.min(total), total)?;
        segment_targets(
            &h,
            &self.state,
            &self.device,
            total,
            &self.old_key,
            &self.new_key,
        )
    }
}
