//! How `open` serves a volume, as clap parses it ([`ServeArgs`],
//! [`PerfArgs`], `--type`'s [`TypeArg`]), checked into the daemon's one
//! input, a `daemon::VolumeSpec` ([`ServeArgs::spec`]). The daemon
//! library takes that value and never sees a command line.
//!
//! ```text
//!  ServeArgs ─ spec ─► VolumeSpec ─ OpenOptions::claim ─► serve | detach
//! ```
//!
//! A new serving option is a field here, its line in [`ServeArgs::spec`],
//! a field of `daemon::VolumeSpec` and its use where the daemon serves.

use std::path::{Path, PathBuf};

use clap::Args;
use crypto::perf::{Flag, PerfFlags};
use daemon::control::{parse_mode, Flags};
use daemon::resolve::VolumeType;
use daemon::spec::{parse_direct_io, parse_io_engine, Ceph};
use daemon::{ExportSpec, TlsSpec, VolumeSpec};

/// `--type` as `open` and `resume` take it. Its variants' order and docs
/// are the CLI's help text (`--help` lists them as possible values).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
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
/// (`cryptsetup --perf-*`, spelt by `crypto::perf::Flag::cli_long`).
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct PerfArgs {
    /// Decrypt reads inline (no read workqueue).
    #[arg(long = Flag::NoReadWorkqueue.cli_long())]
    pub no_read_workqueue: bool,
    /// Encrypt writes inline (no write workqueue).
    #[arg(long = Flag::NoWriteWorkqueue.cli_long())]
    pub no_write_workqueue: bool,
    /// Encrypt on the submitting CPU.
    #[arg(long = Flag::SameCpuCrypt.cli_long())]
    pub same_cpu_crypt: bool,
    /// Submit writes from the crypt threads.
    #[arg(long = Flag::SubmitFromCryptCpus.cli_long())]
    pub submit_from_crypt_cpus: bool,
    /// Run the classic pipeline's threads at high priority (nice -20; the
    /// kernel's WQ_HIGHPRI workqueues, dm-crypt 1.26, Linux 6.10).
    #[arg(long = Flag::HighPriority.cli_long())]
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
    /// The flags given.
    pub fn perf_flags(&self) -> PerfFlags {
        PerfFlags {
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
            high_priority: self.high_priority,
        }
    }

    /// Turns on every flag set in `more` (crypttab's options beside the
    /// command line's).
    pub fn add(&mut self, more: PerfFlags) {
        let u = self.perf_flags().union(more);
        self.same_cpu_crypt = u.same_cpu_crypt;
        self.submit_from_crypt_cpus = u.submit_from_crypt_cpus;
        self.no_read_workqueue = u.no_read_workqueue;
        self.no_write_workqueue = u.no_write_workqueue;
        self.high_priority = u.high_priority;
    }

    /// The flags and piece sizes (0 when not given) as they cross to the
    /// daemon (`open`'s spec, `refresh`'s request).
    pub fn flags(&self) -> Flags {
        Flags {
            perf: self.perf_flags(),
            max_read_size: self.max_read_size.unwrap_or(0),
            max_write_size: self.max_write_size.unwrap_or(0),
        }
    }
}

/// How `open` serves the volume, as typed, before any check
/// ([`ServeArgs::spec`]). The field docs are `ucrypt open --help`'s text.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
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

impl ServeArgs {
    /// The volume spec for `name` on `device` (made absolute, and checked
    /// to exist, when the name is claimed: `daemon::open::OpenOptions::claim`),
    /// checked in the order the user meets the errors: name, mode, export,
    /// TLS credentials (loaded, so that bad ones fail on the terminal
    /// before anything starts). The mode defaults to adaptive, or classic
    /// when dm-crypt's flags are being modelled (`--perf-*`). The volume
    /// type is set once the mapping is resolved; Ceph's settings are
    /// `ceph` (`--ceph-*`).
    pub fn spec(
        &self,
        name: &str,
        device: &Path,
        header: Option<&Path>,
        ceph: &backend::rbd::RbdConfig,
    ) -> daemon::Result<VolumeSpec> {
        daemon::runtime::check_name(name)?;
        let perf = self.perf.flags();
        let classic = perf != Flags::default();
        let mode = self
            .mode
            .as_deref()
            .unwrap_or(if classic { "classic" } else { "adaptive" });
        let mode = parse_mode(mode)?;
        let export = ExportSpec::parse(&self.export, self.listen.as_deref())?
            .with_num_queues(self.num_queues)?;
        export.check_available()?;
        let (certs, psk) = (self.tls_certificates.as_deref(), self.tls_psk.as_deref());
        let tls = TlsSpec::new(
            self.tls.as_deref(),
            certs,
            psk,
            self.tls_verify_peer,
            &export,
        )?;
        tls.load()?;
        Ok(VolumeSpec {
            name: name.to_owned(),
            volume_type: VolumeType::Luks,
            device: device.to_path_buf(),
            header: header.map(|h| std::path::absolute(h).unwrap_or_else(|_| h.to_path_buf())),
            export,
            tls,
            mode,
            perf,
            allow_discards: self.allow_discards,
            read_only: self.readonly,
            io_engine: parse_io_engine(&self.io_engine)?,
            direct: parse_direct_io(&self.direct_io)?,
            ceph: Ceph::of(ceph),
        })
    }
}
