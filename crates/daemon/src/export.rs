//! `--export` and `--listen` parsed into an [`ExportSpec`]: which frontend
//! serves the device, and where.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, Error, ErrorKind, Result};

/// Which frontend serves the device (in a [`crate::VolumeSpec`] as
/// `{"nbd_unix": null}`, `"ublk"`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExportSpec {
    /// NBD on a unix socket (`NAME.nbd.sock` in the runtime dir if `None`).
    NbdUnix(Option<PathBuf>),
    /// NBD on TCP (unencrypted on the wire unless [`TlsSpec`] turns TLS on).
    NbdTcp(SocketAddr),
    /// A FUSE file export at a mountpoint (`NAME.fuse` if `None`).
    Fuse {
        /// The mountpoint (`NAME.fuse` in the runtime directory if `None`).
        mountpoint: Option<PathBuf>,
        /// Whether requests go over FUSE-over-io_uring (`uring=`).
        #[serde(default)]
        uring: FuseUring,
    },
    /// A ublk block device.
    Ublk,
    /// A vhost-user-blk socket for virtual machines, offering this many queues.
    VhostUserBlk {
        /// The socket the hypervisor connects to.
        socket: PathBuf,
        /// Request queues offered: the most the guest may use.
        num_queues: u16,
    },
}

/// `--export fuse=...,uring=auto|on|off`: whether a FUSE export's
/// requests go over FUSE-over-io_uring (`auto`: when the kernel takes
/// it). The default is `off`: measured on this project's 2-CPU VM
/// (cryptsetup's BitLocker image in /dev/shm, fio through the mount,
/// `scripts/bench-foreign.sh`), the ring served 4k QD1 at about half the
/// rate of /dev/fuse and was no faster at 4k QD32 or 1M QD8 (see
/// docs/bench/HISTORY.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FuseUring {
    /// The ring when the kernel's `enable_uring` is on, /dev/fuse otherwise.
    Auto,
    /// The ring, or the export fails to start.
    On,
    /// /dev/fuse only.
    #[default]
    Off,
}

impl From<FuseUring> for fuse::UringMode {
    fn from(u: FuseUring) -> Self {
        match u {
            FuseUring::Auto => Self::Auto,
            FuseUring::On => Self::On,
            FuseUring::Off => Self::Off,
        }
    }
}

/// `fuse`'s arguments after the word: `""`, `=MOUNTPOINT`,
/// `=MOUNTPOINT,uring=MODE`, `=uring=MODE` or `,uring=MODE`.
fn parse_fuse(rest: &str, path: impl Fn(&str) -> Result<PathBuf>) -> Result<ExportSpec> {
    let (dir, option) = match rest.split_at_checked(1) {
        None => (None, None),
        Some((",", opt)) => (None, Some(opt)),
        Some((_, body)) if body.starts_with("uring=") => (None, Some(body)),
        Some((_, body)) => match body.rsplit_once(",uring=") {
            Some((d, _)) => (Some(d), Some(&body[d.len() + 1..])),
            None => (Some(body), None),
        },
    };
    let uring = match option {
        None => FuseUring::Off,
        Some("uring=auto") => FuseUring::Auto,
        Some("uring=on") => FuseUring::On,
        Some("uring=off") => FuseUring::Off,
        Some(o) => {
            return Err(invalid(format!(
                "Invalid FUSE export option {o:?}: use uring=auto, uring=on or uring=off"
            )))
        }
    };
    Ok(ExportSpec::Fuse {
        mountpoint: dir.map(path).transpose()?,
        uring,
    })
}

impl ExportSpec {
    /// Parses `nbd[=SOCKET]`, `fuse[=MOUNTPOINT][,uring=auto|on|off]`, `ublk` or
    /// `vhost-user-blk=SOCKET` ([`vhost_blk::MAX_QUEUES`] queues; see
    /// [`ExportSpec::with_num_queues`]); with `listen`
    /// (`PORT` on loopback, or `ADDR:PORT`) NBD is served on TCP instead.
    /// Paths are made absolute (a detached daemon runs in `/`).
    pub fn parse(export: &str, listen: Option<&str>) -> Result<Self> {
        let (kind, arg) = match export.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (export, None),
        };
        let path = |v: &str| -> Result<PathBuf> {
            std::path::absolute(v)
                .map_err(|e| invalid(format!("Invalid path {v:?}")).with_source(e))
        };
        if let Some(rest) = export
            .strip_prefix("fuse")
            .filter(|r| r.is_empty() || r.starts_with('=') || r.starts_with(','))
        {
            if listen.is_some() {
                return Err(invalid("--listen only applies to --export nbd"));
            }
            return parse_fuse(rest, path);
        }
        let spec = match (kind, arg, listen) {
            ("nbd", Some(_), Some(_)) => {
                return Err(invalid(
                    "Give either --export nbd=SOCKET or --listen, not both",
                ))
            }
            ("nbd", None, Some(l)) => Self::NbdTcp(parse_listen(l)?),
            ("nbd", None, None) => Self::NbdUnix(None),
            ("nbd", Some(p), None) => Self::NbdUnix(Some(path(p)?)),
            ("ublk", None, _) => Self::Ublk,
            ("vhost-user-blk", Some(p), _) if !p.is_empty() => Self::VhostUserBlk {
                socket: path(p)?,
                num_queues: vhost_blk::MAX_QUEUES,
            },
            _ => {
                return Err(invalid(format!(
                    "Unknown export {export:?}: use nbd[=SOCKET], fuse[=MOUNTPOINT][,uring=auto|on|off], ublk or vhost-user-blk=SOCKET"
                )))
            }
        };
        if listen.is_some() && !matches!(spec, Self::NbdTcp(_)) {
            return Err(invalid("--listen only applies to --export nbd"));
        }
        Ok(spec)
    }

    /// `--num-queues N` for a vhost-user-blk export (an error for any
    /// other export, or for 0 or more than the device supports).
    pub fn with_num_queues(self, n: Option<u16>) -> Result<Self> {
        match (self, n) {
            (s, None) => Ok(s),
            (Self::VhostUserBlk { socket, .. }, Some(n))
                if (1..=vhost_blk::MAX_QUEUES).contains(&n) =>
            {
                Ok(Self::VhostUserBlk {
                    socket,
                    num_queues: n,
                })
            }
            (Self::VhostUserBlk { .. }, Some(n)) => Err(invalid(format!(
                "Invalid --num-queues {n}: use 1 to {}",
                vhost_blk::MAX_QUEUES
            ))),
            (_, Some(_)) => Err(invalid(
                "--num-queues only applies to --export vhost-user-blk",
            )),
        }
    }

    /// The queue count of a vhost-user-blk export.
    pub fn num_queues(&self) -> Option<u16> {
        match self {
            Self::VhostUserBlk { num_queues, .. } => Some(*num_queues),
            _ => None,
        }
    }

    /// Fails early when this machine cannot serve the export (ublk needs
    /// the `ublk_drv` kernel module).
    pub fn check_available(&self) -> Result<()> {
        if *self == Self::Ublk && !ublk::available() {
            return Err(ublk_unavailable());
        }
        Ok(())
    }
}

/// `PORT` (loopback) or an explicit `ADDR:PORT` / `[V6]:PORT`.
fn parse_listen(s: &str) -> Result<SocketAddr> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        invalid(format!(
            "Invalid --listen {s:?}: use PORT or ADDR:PORT (e.g. 127.0.0.1:10809)"
        ))
    })
}

/// The error for `--export ublk` on a kernel without ublk.
fn ublk_unavailable() -> Error {
    Error::new(
        ErrorKind::NoDevice,
        format!(
            "ublk export not available: {} is missing (load the ublk_drv kernel module); use --export nbd or --export fuse",
            ublk::CONTROL_PATH
        ),
    )
}
