//! `rbd:POOL/IMAGE[@SNAP]` device specs and the Ceph client settings
//! (`--ceph-conf`, `--ceph-id`, `--keyring`) an open is given.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Error, ErrorKind};

/// The prefix that makes a device name an RBD image.
pub const PREFIX: &str = "rbd:";

/// An RBD image (or one of its snapshots) named as a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// RADOS pool.
    pub pool: String,
    /// Image name in the pool.
    pub image: String,
    /// Snapshot name: the image is then read-only.
    pub snap: Option<String>,
}

impl RbdSpec {
    /// Parses `rbd:POOL/IMAGE[@SNAP]`; `None` when `device` does not start
    /// with `rbd:` (it is a path), an error when it does but is malformed.
    pub fn parse(device: &str) -> Option<Result<Self, Error>> {
        let rest = device.strip_prefix(PREFIX)?;
        let bad = |why: &str| {
            Error::new(ErrorKind::Open {
                path: device.to_owned(),
            })
            .with_context(format!("{why}; expected rbd:POOL/IMAGE[@SNAP]"))
        };
        Some((|| {
            let (pool, rest) = rest.split_once('/').ok_or_else(|| bad("no pool"))?;
            let (image, snap) = match rest.split_once('@') {
                Some((i, s)) => (i, Some(s)),
                None => (rest, None),
            };
            let ok = |s: &str| !s.is_empty() && !s.contains(['/', '@', '\0']);
            if !ok(pool) {
                return Err(bad("invalid pool name"));
            }
            if !ok(image) {
                return Err(bad("invalid image name"));
            }
            if snap.is_some_and(|s| !ok(s)) {
                return Err(bad("invalid snapshot name"));
            }
            Ok(Self {
                pool: pool.to_owned(),
                image: image.to_owned(),
                snap: snap.map(str::to_owned),
            })
        })())
    }

    /// [`RbdSpec::parse`] of a path given on the command line.
    pub fn of_path(path: &Path) -> Option<Result<Self, Error>> {
        Self::parse(path.to_str()?)
    }
}

impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}{}/{}", self.pool, self.image)?;
        if let Some(s) = &self.snap {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

/// Whether `path` names an RBD image (`rbd:` prefix) rather than a file.
pub fn is_rbd(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with(PREFIX))
}

/// Default bound on connecting to the cluster (monitor session and
/// monitor commands), unless ceph.conf sets `client_mount_timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How an open reaches the Ceph cluster (the cli builds it once from its
/// options and passes it to whatever opens an `rbd:` device); unset fields
/// take librados's defaults (`$CEPH_CONF` or /etc/ceph/ceph.conf, `client.admin`, the
/// keyring named in ceph.conf).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RbdConfig {
    /// ceph.conf to read (`--ceph-conf`).
    pub conf: Option<PathBuf>,
    /// Client id without `client.` (`--ceph-id`).
    pub id: Option<String>,
    /// Keyring file (`--keyring`).
    pub keyring: Option<PathBuf>,
    /// Bound on connecting; [`DEFAULT_TIMEOUT`] unless set here or by
    /// `client_mount_timeout` in ceph.conf.
    pub timeout: Option<Duration>,
}

impl RbdConfig {
    /// The command-line options that reproduce these settings (for a
    /// re-executed daemon, which runs in `/`): `--ceph-conf=…`,
    /// `--ceph-id=…`, `--keyring=…`, paths made absolute.
    pub fn to_args(&self) -> Vec<String> {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let mut v = Vec::new();
        if let Some(c) = &self.conf {
            v.push(format!("--ceph-conf={}", abs(c).display()));
        }
        if let Some(i) = &self.id {
            v.push(format!("--ceph-id={i}"));
        }
        if let Some(k) = &self.keyring {
            v.push(format!("--keyring={}", abs(k).display()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pool_image_and_snapshot() {
        let s = RbdSpec::parse("rbd:rbd/vol1").unwrap().unwrap();
        assert_eq!(
            (s.pool.as_str(), s.image.as_str(), s.snap),
            ("rbd", "vol1", None)
        );
        let s = RbdSpec::parse("rbd:p/i@snap1").unwrap().unwrap();
        assert_eq!(s.snap.as_deref(), Some("snap1"));
        assert_eq!(s.to_string(), "rbd:p/i@snap1");
        assert!(RbdSpec::parse("/dev/sda").is_none());
        assert!(RbdSpec::parse("rbdx:p/i").is_none());
    }

    #[test]
    fn rejects_malformed_specs_naming_them() {
        for bad in [
            "rbd:",
            "rbd:pool",
            "rbd:/img",
            "rbd:p/",
            "rbd:p/i@",
            "rbd:p/i/j",
            "rbd:p/i@s@t",
        ] {
            let e = RbdSpec::parse(bad).unwrap().unwrap_err();
            assert!(e.to_string().contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn config_round_trips_through_args() {
        let c = RbdConfig {
            conf: Some("/c/ceph.conf".into()),
            id: Some("ucrypt".into()),
            keyring: Some("/k".into()),
            timeout: None,
        };
        assert_eq!(
            c.to_args(),
            [
                "--ceph-conf=/c/ceph.conf",
                "--ceph-id=ucrypt",
                "--keyring=/k"
            ]
        );
        assert!(RbdConfig::default().to_args().is_empty());
        assert!(is_rbd(Path::new("rbd:a/b")) && !is_rbd(Path::new("./rbd:a/b")));
    }
}
