//! [`VolumeSpec`]: the one value that crosses from the command line to
//! the daemon. The cli (the only crate that knows clap) parses and checks
//! what a user typed into it, with the parsers this crate offers
//! ([`crate::ExportSpec::parse`], [`crate::TlsSpec::new`],
//! [`crate::control::parse_mode`], [`parse_io_engine`],
//! [`parse_direct_io`]); [`crate::open::OpenOptions::claim`] claims its
//! name and finds its device. What the serving daemon needs besides the
//! table is this serde value. In the foreground it is served in the same
//! process; a detached daemon reads it from its parent over a pipe
//! ([`crate::detach`]) and never parses a command line.
//!
//! ```text
//!  cli: clap ─ check ─► VolumeSpec ─ claim ─┬─ serve (this process)
//!           resolve ─► Targets ─────────────┘  or detach: pipe ─► child:
//!                                              JSON line, then the table
//!                                              with its key (locked memory)
//! ```
//!
//! The key never is a part of it: the table travels beside it, in a
//! [`crypto::Secret`].

use std::path::PathBuf;
use std::sync::Arc;

use crypto::table::Targets;
use datapath::{CryptMode, PerfFlags};
use serde::{Deserialize, Serialize};

use crate::control::Flags;
use crate::error::{invalid, Result};
use crate::resolve::{self, VolumeType};
use crate::runtime::NameLock;
use crate::serve::{ExportSpec, Spec};
use crate::tls::TlsSpec;

/// Everything a daemon serving one volume needs besides its table,
/// resolved: paths absolute (a detached daemon runs in `/`), options
/// checked. Serialised as one JSON object (unknown fields refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    /// Volume name (checked with [`crate::runtime::check_name`]).
    pub name: String,
    /// The volume type, for `status` (what the mapping resolved to).
    pub volume_type: VolumeType,
    /// The backing device or file, absolute ([`resolve::device`]), or an
    /// `rbd:` image name.
    pub device: PathBuf,
    /// Detached LUKS header, if any (online reencryption refuses one).
    pub header: Option<PathBuf>,
    /// The frontend.
    pub export: ExportSpec,
    /// NBD over TLS.
    pub tls: TlsSpec,
    /// Data-path mode.
    #[serde(with = "crate::control::mode")]
    pub mode: CryptMode,
    /// Performance flags given on the command line, with
    /// `--max-read-size`/`--max-write-size` (0: no cut); the table's own
    /// flags are merged in when served ([`VolumeSpec::into_spec`]).
    pub perf: Flags,
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// `--readonly` (always for FileVault 2, as cryptsetup maps it).
    pub read_only: bool,
    /// How the backing file is accessed: `auto`, `uring` or `syscalls`.
    #[serde(with = "io_engine")]
    pub io_engine: backend::IoEngine,
    /// O_DIRECT policy for the backing file: `auto`, `never` or `required`.
    #[serde(with = "direct_io")]
    pub direct: backend::DirectIo,
    /// How an `rbd:` device reaches its cluster.
    pub ceph: Ceph,
}

/// The Ceph cluster settings of an `rbd:` device
/// ([`backend::rbd::RbdConfig`] without its timeout), paths absolute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ceph {
    /// `--ceph-conf`.
    pub conf: Option<PathBuf>,
    /// `--ceph-id`.
    pub id: Option<String>,
    /// `--keyring`.
    pub keyring: Option<PathBuf>,
}

impl Ceph {
    /// The settings `c` (the command line's), paths made absolute.
    pub fn of(c: &backend::rbd::RbdConfig) -> Self {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        Self {
            conf: c.conf.as_ref().map(abs),
            id: c.id.clone(),
            keyring: c.keyring.as_ref().map(abs),
        }
    }

    /// These settings as an `rbd:` open is given them.
    pub fn config(&self) -> backend::rbd::RbdConfig {
        backend::rbd::RbdConfig {
            conf: self.conf.clone(),
            id: self.id.clone(),
            keyring: self.keyring.clone(),
            timeout: None,
        }
    }
}

impl VolumeSpec {
    /// The daemon's [`Spec`] for `table`: its device becomes
    /// [`VolumeSpec::device`] and the given flags are merged into it
    /// ([`resolve::engine_config`]). `lock` is the name's claim, if held.
    /// The daemon reaches its devices with metadata locking on and the
    /// spec's Ceph settings ([`Spec::access`]).
    pub fn into_spec(self, mut table: Targets, lock: Option<Arc<NameLock>>) -> Spec {
        table.set_device(&self.device.display().to_string());
        let mut engine = resolve::engine_config(
            &mut table,
            self.mode,
            PerfFlags::from(self.perf),
            self.allow_discards,
            self.read_only,
        );
        (engine.max_read_size, engine.max_write_size) =
            (self.perf.max_read_size, self.perf.max_write_size);
        Spec {
            name: self.name,
            volume_type: self.volume_type,
            table,
            export: self.export,
            tls: self.tls,
            engine,
            io_engine: self.io_engine,
            direct: self.direct,
            header: self.header,
            lock,
            access: luks::DeviceAccess {
                locking: true,
                ceph: self.ceph.config(),
            },
        }
    }

    /// The JSON line the detached daemon reads first.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses [`VolumeSpec::to_json`]'s output.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes)
            .map_err(|e| invalid("Invalid volume spec from the parent").with_source(e))
    }
}

/// `--io-engine`'s words.
pub fn parse_io_engine(s: &str) -> Result<backend::IoEngine> {
    match s {
        "auto" => Ok(backend::IoEngine::Auto),
        "uring" => Ok(backend::IoEngine::Uring),
        "syscalls" => Ok(backend::IoEngine::Syscalls),
        _ => Err(invalid(format!(
            "Unknown --io-engine {s:?}: use auto, uring or syscalls"
        ))),
    }
}

/// `--direct-io`'s words.
pub fn parse_direct_io(s: &str) -> Result<backend::DirectIo> {
    match s {
        "auto" => Ok(backend::DirectIo::Auto),
        "never" => Ok(backend::DirectIo::Never),
        "required" => Ok(backend::DirectIo::Required),
        _ => Err(invalid(format!(
            "Unknown --direct-io {s:?}: use auto, never or required"
        ))),
    }
}

fn io_engine_name(e: backend::IoEngine) -> &'static str {
    match e {
        backend::IoEngine::Uring => "uring",
        backend::IoEngine::Auto => "auto",
        _ => "syscalls",
    }
}

fn direct_io_name(d: backend::DirectIo) -> &'static str {
    match d {
        backend::DirectIo::Never => "never",
        backend::DirectIo::Required => "required",
        _ => "auto",
    }
}

/// A [`backend::IoEngine`] as its `--io-engine` word.
mod io_engine {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(e: &backend::IoEngine, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(super::io_engine_name(*e))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<backend::IoEngine, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_io_engine(&s).map_err(serde::de::Error::custom)
    }
}

/// A [`backend::DirectIo`] as its `--direct-io` word.
mod direct_io {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(e: &backend::DirectIo, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(super::direct_io_name(*e))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<backend::DirectIo, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_direct_io(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> VolumeSpec {
        VolumeSpec {
            name: "v".into(),
            volume_type: VolumeType::Plain,
            device: "/img".into(),
            header: None,
            export: ExportSpec::NbdUnix(None),
            tls: TlsSpec::default(),
            mode: CryptMode::Classic,
            perf: Flags::default(),
            allow_discards: false,
            read_only: false,
            io_engine: backend::IoEngine::Syscalls,
            direct: backend::DirectIo::Auto,
            ceph: Ceph::default(),
        }
    }

    #[test]
    fn every_field_round_trips_through_json() {
        let certs = TlsSpec {
            mode: Some(nbd::TlsMode::Require),
            certificates: Some("/etc/pki/ucrypt".into()),
            psk: None,
            verify_peer: true,
        };
        let specs = [
            spec(),
            VolumeSpec {
                volume_type: VolumeType::Luks2,
                header: Some("/h".into()),
                export: ExportSpec::Fuse {
                    mountpoint: Some("/mnt".into()),
                    uring: crate::FuseUring::On,
                },
                mode: CryptMode::Adaptive,
                perf: Flags {
                    perf: PerfFlags {
                        no_read_workqueue: true,
                        submit_from_crypt_cpus: true,
                        high_priority: true,
                        ..PerfFlags::default()
                    },
                    max_read_size: 65536,
                    ..Flags::default()
                },
                allow_discards: true,
                read_only: true,
                io_engine: backend::IoEngine::Uring,
                direct: backend::DirectIo::Required,
                ceph: Ceph {
                    conf: Some("/etc/ceph/c.conf".into()),
                    id: Some("u".into()),
                    keyring: Some("/k".into()),
                },
                ..spec()
            },
            VolumeSpec {
                export: ExportSpec::NbdTcp("[::1]:10809".parse().unwrap()),
                tls: certs,
                mode: CryptMode::Inline,
                io_engine: backend::IoEngine::Auto,
                direct: backend::DirectIo::Never,
                ..spec()
            },
            VolumeSpec {
                export: ExportSpec::NbdTcp("127.0.0.1:7".parse().unwrap()),
                tls: TlsSpec {
                    mode: Some(nbd::TlsMode::Off),
                    ..TlsSpec::default()
                },
                ..spec()
            },
            VolumeSpec {
                export: ExportSpec::VhostUserBlk {
                    socket: "/run/v.sock".into(),
                    num_queues: 3,
                },
                volume_type: VolumeType::Tcrypt,
                ..spec()
            },
            VolumeSpec {
                export: ExportSpec::Ublk,
                tls: TlsSpec {
                    psk: Some("/psk".into()),
                    ..TlsSpec::default()
                },
                ..spec()
            },
        ];
        for s in specs {
            let json = s.to_json();
            assert!(!json.contains('\n'), "one line: {json}");
            assert_eq!(VolumeSpec::from_json(json.as_bytes()).unwrap(), s, "{json}");
        }
    }

    #[test]
    fn bad_json_is_refused_not_defaulted() {
        let good = spec().to_json();
        for bad in [
            String::new(),
            "{}".into(),
            good.replace("\"syscalls\"", "\"fast\""),
            good.replace("\"classic\"", "\"turbo\""),
            good.replacen('{', "{\"extra\":1,", 1),
            good[..good.len() / 2].to_owned(),
        ] {
            let e = VolumeSpec::from_json(bad.as_bytes()).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn into_spec_merges_the_given_flags_into_the_table() {
        let t = resolve::plain_targets(
            "0 8 crypt aes-xts-plain64 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 /x 0",
        )
        .unwrap();
        let v = VolumeSpec {
            allow_discards: true,
            perf: Flags {
                max_write_size: 4096,
                ..Flags::default()
            },
            ..spec()
        };
        let s = v.into_spec(t, None);
        assert_eq!(s.table.device(), "/img");
        let t = s.table.as_single().unwrap();
        assert!(s.engine.allow_discards && t.options.allow_discards);
        assert_eq!(s.engine.max_write_size, 4096);
        assert_eq!(s.name, "v");
    }
}
