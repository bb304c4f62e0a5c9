//! Starting a volume's daemon from a checked [`VolumeSpec`]: the claim on
//! its name, taken before any prompt ([`OpenOptions::claim`]), and the two
//! ways a daemon starts: serving in this process ([`OpenOptions::serve`])
//! or re-executing the binary detached ([`OpenOptions::detach`]), which
//! hands the child the same [`VolumeSpec`] and the table over a pipe.
//!
//! ```text
//!  VolumeSpec ─ claim ─► OpenOptions { VolumeSpec, name lock }
//!  OpenOptions + Table ─┬─ serve  ──► Spec ──► serve::run (this process)
//!                       └─ detach ──► VolumeSpec + Table ─► detach::spawn ─► Ping
//! ```

use std::path::Path;
use std::sync::Arc;

use crypto::table::Targets;

use crate::control::Ping;
use crate::error::Result;
use crate::resolve::{self, VolumeType};
use crate::runtime::{self, NameLock};
use crate::serve;
use crate::spec::VolumeSpec;

/// One `open`, checked: the [`VolumeSpec`] to serve and the claim on its
/// name, held from before any prompt until the daemon runs.
#[derive(Debug)]
pub struct OpenOptions {
    /// What the daemon serves; its `volume_type` is set from what the
    /// mapping resolved to when serving starts ([`OpenOptions::serve`],
    /// [`OpenOptions::detach`]).
    pub spec: VolumeSpec,
    /// The volume name, claimed by [`OpenOptions::claim`] (handed on to
    /// the daemon).
    pub lock: Arc<NameLock>,
}

impl OpenOptions {
    /// Claims the spec's name in the runtime directory (`stale_mount`
    /// hears of a dead daemon's FUSE mount that had to be detached), then
    /// finds the device (made absolute: [`resolve::device`]).
    pub fn claim(mut spec: VolumeSpec, stale_mount: impl FnOnce(&Path)) -> Result<Self> {
        let claim = runtime::claim(&spec.name, false)?;
        if claim.detached_stale_mount {
            stale_mount(&claim.paths.fuse);
        }
        spec.device = resolve::device(&spec.device)?;
        Ok(Self {
            spec,
            lock: Arc::new(claim.lock),
        })
    }

    /// The spec for a mapping resolved as `volume_type` (FileVault 2 is
    /// served read-only, as cryptsetup maps it).
    pub fn resolved(mut self, volume_type: VolumeType) -> (VolumeSpec, Arc<NameLock>) {
        self.spec.volume_type = volume_type;
        self.spec.read_only |= volume_type == VolumeType::Fvault2;
        (self.spec, self.lock)
    }

    /// Serves `table` in this process until `close` or a signal; `ready`
    /// gets the ping answer once clients can connect ([`serve::run`]).
    /// `locking` off (`--disable-locks`) leaves a LUKS header unlocked
    /// while the daemon reads and writes it (online reencryption).
    pub fn serve(
        self,
        table: Targets,
        volume_type: VolumeType,
        locking: bool,
        ready: impl FnOnce(&Ping),
    ) -> Result<()> {
        let (spec, lock) = self.resolved(volume_type);
        let mut spec = spec.into_spec(table, Some(lock));
        spec.access.locking = locking;
        serve::run(spec, ready)
    }

    /// Starts the daemon detached (`exe` is this binary), hands it the
    /// spec and `table` over a pipe and returns its first ping answer
    /// ([`crate::detach::spawn`]).
    pub fn detach(self, exe: &Path, table: Targets, volume_type: VolumeType) -> Result<Ping> {
        let (spec, lock) = self.resolved(volume_type);
        crate::detach::spawn(exe, &spec, &table, &lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Flags;
    use crate::spec::Ceph;
    use crate::{ExportSpec, TlsSpec};

    #[test]
    fn fvault2_is_served_read_only() {
        let dir = std::env::temp_dir().join(format!("ucrypt-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = "open-resolved";
        let lock = NameLock::acquire(&dir.join("n.lock"), name).unwrap();
        let o = OpenOptions {
            spec: VolumeSpec {
                name: name.into(),
                volume_type: VolumeType::Luks,
                device: "/img".into(),
                header: None,
                export: ExportSpec::NbdUnix(None),
                tls: TlsSpec::default(),
                mode: datapath::CryptMode::Adaptive,
                perf: Flags::default(),
                allow_discards: false,
                read_only: false,
                io_engine: backend::IoEngine::Auto,
                direct: backend::DirectIo::Auto,
                ceph: Ceph::default(),
            },
            lock: Arc::new(lock),
        };
        let (s, _) = o.resolved(VolumeType::Fvault2);
        assert!(s.read_only);
        assert_eq!(s.volume_type, VolumeType::Fvault2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
