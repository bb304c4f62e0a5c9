//! What `ucrypt open` was asked for: its serving options as clap parses
//! them ([`Given`], [`PerfArgs`]), then checked and resolved
//! ([`OpenOptions`]); and the two ways it starts a daemon: serving in this
//! process ([`OpenOptions::serve`]) or re-executing the binary detached
//! ([`OpenOptions::detach`]), whose command line
//! ([`OpenOptions::child_args`]) carries every option but the table.
//!
//! ```text
//!  Given + Target ─ check ─► OpenOptions
//!  OpenOptions + Table ─┬─ serve  ──► Spec ──► serve::run (this process)
//!                       └─ detach ──► child_args ─┐
//!                                     Spec.table ─┴► detach::spawn ──► Ping
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crypto::table::Targets;
use datapath::{CryptMode, PerfFlags};

use crate::control::{mode_name, parse_mode, Ping};
use crate::error::Result;
use crate::resolve::{self, VolumeType};
use crate::runtime::{self, NameLock};
use crate::serve::{self, ExportSpec, Spec};
use crate::tls::TlsSpec;

/// The options of one `open`, as given (the table's own flags are merged
/// in by [`OpenOptions::spec`]).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Volume name.
    pub name: String,
    /// The backing device or file, absolute ([`resolve::device`]).
    pub device: PathBuf,
    /// Detached LUKS header, if any.
    pub header: Option<PathBuf>,
    /// The frontend.
    pub export: ExportSpec,
    /// NBD over TLS.
    pub tls: TlsSpec,
    /// Data-path mode.
    pub mode: CryptMode,
    /// Performance flags given on the command line.
    pub perf: PerfFlags,
    /// `--max-read-size`, `--max-write-size` (0: no cut).
    pub max_io: (u32, u32),
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// `--readonly`.
    pub read_only: bool,
    /// How the backing file is accessed.
    pub io_engine: backend::IoEngine,
    /// O_DIRECT policy for the backing file.
    pub direct: backend::DirectIo,
    /// The volume name, held since [`OpenOptions::check`] claimed it (and
    /// handed on to the daemon); `None` claims it when serving starts.
    pub lock: Option<Arc<NameLock>>,
}

/// `--type` as `open` and `resume` take it. Its variants' order and docs
/// are the CLI's help text (`--help` lists them as possible values).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TypeArg {
    /// LUKS1 or LUKS2 header on the device (or --header).
    Luks,
    /// A LUKS1 header only.
    Luks1,
    /// A LUKS2 header only.
    Luks2,
    /// Plain dm-crypt: built from --cipher, --key-size, --hash, ... as
    /// cryptsetup does, or given as a --table line.
    Plain,
    /// BitLocker (passphrase, recovery password, or a .BEK startup key
    /// as --key-file).
    Bitlk,
    /// FileVault 2 (passphrase; read-only, as cryptsetup).
    Fvault2,
    /// TrueCrypt or VeraCrypt (--hash, --cipher, --veracrypt-pim,
    /// --tcrypt-hidden|system|backup as cryptsetup takes them).
    Tcrypt,
}

impl TypeArg {
    /// The volume type `open` resolves to.
    pub fn kind(self) -> VolumeType {
        match self {
            Self::Luks => VolumeType::Luks,
            Self::Luks1 => VolumeType::Luks1,
            Self::Luks2 => VolumeType::Luks2,
            Self::Plain => VolumeType::Plain,
            Self::Bitlk => VolumeType::Bitlk,
            Self::Fvault2 => VolumeType::Fvault2,
            Self::Tcrypt => VolumeType::Tcrypt,
        }
    }

    /// The LUKS version `resume` insists on, if one (else whichever the
    /// header is).
    pub fn luks_version(self) -> Option<VolumeType> {
        match self {
            Self::Luks1 | Self::Luks2 => Some(self.kind()),
            Self::Luks | Self::Plain | Self::Bitlk | Self::Fvault2 | Self::Tcrypt => None,
        }
    }
}

/// dm-crypt performance flags as `open` and `refresh` take them
/// (`cryptsetup --perf-*`).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct PerfArgs {
    /// Decrypt reads inline (no read workqueue).
    #[arg(long = "perf-no_read_workqueue")]
    pub no_read_workqueue: bool,
    /// Encrypt writes inline (no write workqueue).
    #[arg(long = "perf-no_write_workqueue")]
    pub no_write_workqueue: bool,
    /// Encrypt on the submitting CPU.
    #[arg(long = "perf-same_cpu_crypt")]
    pub same_cpu_crypt: bool,
    /// Submit writes from the crypt threads.
    #[arg(long = "perf-submit_from_crypt_cpus")]
    pub submit_from_crypt_cpus: bool,
    /// Run the classic pipeline's threads at high priority (nice -20; the
    /// kernel's WQ_HIGHPRI workqueues, dm-crypt 1.26, Linux 6.10).
    #[arg(long = "perf-high_priority")]
    pub high_priority: bool,
    /// Classic mode: cut queued reads into pieces of at most BYTES that
    /// the crypt threads take on their own, as Linux 6.11's dm-crypt does
    /// at its max_read_size module parameter. In the kernel the parameter
    /// is one per host (/sys/module/dm_crypt/parameters/max_read_size);
    /// here it is per volume. 0 or absent: no cut (dm-crypt before 6.11;
    /// ucrypt's pieces are copied where the kernel's share the request's
    /// pages). 131072 is the kernel's default since 6.11.
    #[arg(long, value_name = "BYTES")]
    pub max_read_size: Option<u32>,
    /// The same for writes (dm-crypt's max_write_size; at most 1 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_write_size: Option<u32>,
}

impl PerfArgs {
    /// The flags as the engine takes them.
    pub fn flags(&self) -> PerfFlags {
        PerfFlags {
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
            high_priority: self.high_priority,
        }
    }

    /// `--max-read-size` and `--max-write-size` (0 when not given).
    pub fn max_io(&self) -> (u32, u32) {
        (
            self.max_read_size.unwrap_or(0),
            self.max_write_size.unwrap_or(0),
        )
    }
}

/// How `open` serves the volume, as typed, before any check
/// ([`OpenOptions::check`]). clap parses `open`'s options straight into
/// this struct (the `ucrypt` binary flattens it); the field docs are
/// `ucrypt open --help`'s text.
#[derive(clap::Args, Debug, Clone)]
pub struct Given {
    /// Frontend: nbd[=SOCKET] (default), fuse[=MOUNTPOINT], ublk or vhost-user-blk=SOCKET.
    #[arg(long, default_value = "nbd")]
    pub export: String,
    /// Most request queues a vhost-user-blk export offers (default 64, so a
    /// hypervisor's default of one queue per vCPU fits); the guest uses as
    /// many as it asks for, served by up to one thread per host CPU.
    #[arg(long, value_name = "N")]
    pub num_queues: Option<u16>,
    /// Serve NBD on TCP at [ADDR:]PORT (loopback if no address); needs TLS
    /// credentials that authenticate clients (--tls-psk, or
    /// --tls-certificates with client certificates) or --tls=off.
    #[arg(long)]
    pub listen: Option<String>,
    /// NBD over TLS: off, on (offered; unix socket only) or require (default when credentials are given).
    #[arg(long)]
    pub tls: Option<String>,
    /// TLS certificate directory: ca-cert.pem, server-cert.pem, server-key.pem (qemu/nbdkit layout).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// TLS pre-shared keys: a psktool file of identity:hexkey lines.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Require clients to present a certificate signed by the directory's
    /// ca-cert.pem: default with --listen, off on a unix socket;
    /// --tls-verify-peer=no serves any TLS client over TCP (warned).
    #[arg(
        long,
        value_name = "yes|no",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "yes",
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub tls_verify_peer: Option<bool>,
    /// Performance flags.
    #[command(flatten)]
    pub perf: PerfArgs,
    /// Data-path mode: adaptive (default), classic (default with --perf-*)
    /// or inline.
    #[arg(long)]
    pub mode: Option<String>,
    /// Pass discards (TRIM) down to the device.
    #[arg(long)]
    pub allow_discards: bool,
    /// Serve read-only.
    #[arg(long, short = 'r')]
    pub readonly: bool,
    /// Stay in the foreground instead of detaching.
    #[arg(long)]
    pub foreground: bool,
    /// How the backing file is read and written: auto (uring when the
    /// kernel allows it), uring (queued requests batched on io_uring) or
    /// syscalls (pread/pwritev2/fdatasync).
    #[arg(long, default_value = "auto", value_parser = ["auto", "uring", "syscalls"])]
    pub io_engine: String,
    /// O_DIRECT on the backing file: auto (aligned requests bypass the page
    /// cache, like loop --direct-io), never, or required (fail if refused).
    #[arg(long, default_value = "auto", value_parser = ["auto", "never", "required"])]
    pub direct_io: String,
}

/// Which volume `open` serves, and as whom: what [`OpenOptions::check`] needs besides
/// [`Given`] (the rest of `open`'s command line also feeds
/// [`resolve::Mapping`]).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Volume name.
    pub name: &'a str,
    /// The backing device or file.
    pub device: &'a Path,
    /// Detached LUKS header.
    pub header: Option<&'a Path>,
}

impl OpenOptions {
    /// Checks `g` for volume `v` in the order the user meets the errors
    /// (name, mode, export, TLS credentials, loaded so that bad ones fail
    /// on the terminal before anything starts), claims the name in the
    /// runtime directory (`stale_mount` hears of a dead daemon's FUSE
    /// mount that had to be detached) and finds the device. The mode
    /// defaults to adaptive, or classic when dm-crypt's flags are being
    /// modelled (`--perf-*`). Ceph's settings are the process's
    /// ([`Ceph::current`]).
    pub fn check(g: &Given, v: Target<'_>, stale_mount: impl FnOnce(&Path)) -> Result<Self> {
        runtime::check_name(v.name)?;
        let perf = g.perf.flags();
        let (max_read_size, max_write_size) = g.perf.max_io();
        let classic = perf != PerfFlags::default() || (max_read_size, max_write_size) != (0, 0);
        let mode = g
            .mode
            .as_deref()
            .unwrap_or(if classic { "classic" } else { "adaptive" });
        let mode = parse_mode(mode)?;
        let export =
            ExportSpec::parse(&g.export, g.listen.as_deref())?.with_num_queues(g.num_queues)?;
        export.check_available()?;
        let (certs, psk) = (g.tls_certificates.as_deref(), g.tls_psk.as_deref());
        let tls = TlsSpec::new(g.tls.as_deref(), certs, psk, g.tls_verify_peer, &export)?;
        tls.load()?;
        let io_engine = parse_io_engine(&g.io_engine)?;
        let direct = parse_direct_io(&g.direct_io)?;
        let claim = runtime::claim(v.name, false)?;
        if claim.detached_stale_mount {
            stale_mount(&claim.paths.fuse);
        }
        let header = v
            .header
            .map(|h| std::path::absolute(h).unwrap_or_else(|_| h.to_path_buf()));
        let spec = VolumeSpec {
            name: v.name.to_owned(),
            volume_type: VolumeType::Luks,
            device: resolve::device(v.device)?,
            header,
            export,
            tls,
            mode,
            perf: Flags {
                max_read_size,
                max_write_size,
                ..Flags::from(perf)
            },
            allow_discards: g.allow_discards,
            read_only: g.readonly,
            io_engine,
            direct,
            ceph: Ceph::current(),
        };
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
    pub fn serve(
        self,
        table: Targets,
        volume_type: VolumeType,
        ready: impl FnOnce(&Ping),
    ) -> Result<()> {
        let (spec, lock) = self.resolved(volume_type);
        serve::run(spec.into_spec(table, Some(lock)), ready)
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

    #[test]
    fn fvault2_is_served_read_only() {
        let dir = std::env::temp_dir().join(format!("ucrypt-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = "open-resolved";
        let lock = runtime::NameLock::acquire(&dir.join("n.lock"), name).unwrap();
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
