//! What `ucrypt open` was asked for, once parsed and resolved
//! ([`OpenOptions`]), and the two ways it starts a daemon: serving in this
//! process ([`OpenOptions::serve`]) or re-executing the binary detached
//! ([`OpenOptions::detach`]), whose command line
//! ([`OpenOptions::child_args`]) carries every option but the table.
//!
//! ```text
//!  OpenOptions + Table ─┬─ serve  ──► Spec ──► serve::run (this process)
//!                       └─ detach ──► child_args ─┐
//!                                     Spec.table ─┴► detach::spawn ──► Ping
//! ```

use std::path::{Path, PathBuf};

use crypto::table::Table;
use datapath::{CryptMode, PerfFlags};

use crate::control::{mode_name, parse_mode, Ping};
use crate::error::Result;
use crate::resolve::{self, VolumeType};
use crate::runtime;
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
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// `--readonly`.
    pub read_only: bool,
    /// How the backing file is accessed.
    pub io_engine: backend::IoEngine,
    /// O_DIRECT policy for the backing file.
    pub direct: backend::DirectIo,
}

/// `open`'s options as typed, before any check ([`OpenOptions::check`]).
#[derive(Debug, Clone, Copy)]
pub struct Given<'a> {
    /// Volume name.
    pub name: &'a str,
    /// The backing device or file.
    pub device: &'a Path,
    /// Detached LUKS header.
    pub header: Option<&'a Path>,
    /// `--export`.
    pub export: &'a str,
    /// `--listen`.
    pub listen: Option<&'a str>,
    /// `--num-queues`.
    pub num_queues: Option<u16>,
    /// `--tls`.
    pub tls: Option<&'a str>,
    /// `--tls-certificates`.
    pub tls_certificates: Option<&'a Path>,
    /// `--tls-psk`.
    pub tls_psk: Option<&'a Path>,
    /// `--tls-verify-peer`.
    pub tls_verify_peer: bool,
    /// `--mode`.
    pub mode: &'a str,
    /// Performance flags.
    pub perf: PerfFlags,
    /// `--allow-discards`.
    pub allow_discards: bool,
    /// `--readonly`.
    pub read_only: bool,
    /// How the backing file is accessed.
    pub io_engine: backend::IoEngine,
    /// O_DIRECT policy for the backing file.
    pub direct: backend::DirectIo,
    /// This process is the detached daemon: it re-checks its parent's claim.
    pub detached: bool,
}

impl OpenOptions {
    /// Checks `g` in the order the user meets the errors (name, mode,
    /// export, TLS credentials, loaded so that bad ones fail on the
    /// terminal before anything starts), claims the name in the runtime
    /// directory (`stale_mount` hears of a dead daemon's FUSE mount that
    /// had to be detached) and finds the device.
    pub fn check(g: &Given<'_>, stale_mount: impl FnOnce(&Path)) -> Result<Self> {
        runtime::check_name(g.name)?;
        let mode = parse_mode(g.mode)?;
        let export = ExportSpec::parse(g.export, g.listen)?.with_num_queues(g.num_queues)?;
        export.check_available()?;
        let (certs, psk) = (g.tls_certificates, g.tls_psk);
        let tls = TlsSpec::new(g.tls, certs, psk, g.tls_verify_peer, &export)?;
        tls.load()?;
        let claim = runtime::claim(g.name, g.detached.then(std::process::id))?;
        if claim.detached_stale_mount {
            stale_mount(&claim.paths.fuse);
        }
        Ok(Self {
            name: g.name.to_owned(),
            device: resolve::device(g.device)?,
            header: g.header.map(Path::to_path_buf),
            export,
            tls,
            mode,
            perf: g.perf,
            allow_discards: g.allow_discards,
            read_only: g.read_only,
            io_engine: g.io_engine,
            direct: g.direct,
        })
    }

    /// The daemon's [`Spec`] for `table`: its device becomes
    /// [`OpenOptions::device`] and the given flags are merged into it
    /// ([`resolve::engine_config`]).
    pub fn spec(self, mut table: Table, volume_type: VolumeType) -> Spec {
        table.device = self.device.display().to_string();
        let engine = resolve::engine_config(
            &mut table,
            self.mode,
            self.perf,
            self.allow_discards,
            self.read_only,
        );
        Spec {
            name: self.name,
            volume_type,
            table,
            export: self.export,
            tls: self.tls,
            engine,
            io_engine: self.io_engine,
            direct: self.direct,
        }
    }

    /// Serves `table` in this process until `close` or a signal; `ready`
    /// gets the ping answer once clients can connect ([`serve::run`]).
    pub fn serve(
        self,
        table: Table,
        volume_type: VolumeType,
        ready: impl FnOnce(&Ping),
    ) -> Result<()> {
        serve::run(self.spec(table, volume_type), ready)
    }

    /// Starts the daemon detached (`exe` is this binary), hands it `table`
    /// on stdin and returns its first ping answer ([`crate::detach::spawn`]).
    pub fn detach(self, exe: &Path, table: Table, volume_type: VolumeType) -> Result<Ping> {
        let args = self.child_args(volume_type == VolumeType::Plain);
        let spec = self.spec(table, volume_type);
        crate::detach::spawn(exe, &args, &spec.name, &spec.table)
    }

    /// The detached daemon's command line: `open --foreground
    /// --table-stdin` with every option (paths absolute: it runs in `/`);
    /// `plain` picks `--type=plain` over `--type=luks`.
    pub fn child_args(&self, plain: bool) -> Vec<String> {
        let mut v: Vec<String> = vec!["open".into(), "--foreground".into(), "--table-stdin".into()];
        v.push(format!("--type={}", if plain { "plain" } else { "luks" }));
        if let Some(h) = &self.header {
            let h = std::path::absolute(h).unwrap_or_else(|_| h.clone());
            v.push(format!("--header={}", h.display()));
        }
        let queues = self.export.num_queues();
        let (export, listen) = self.export.to_args();
        v.push(format!("--export={export}"));
        if let Some(l) = listen {
            v.push(format!("--listen={l}"));
        }
        if let Some(n) = queues {
            v.push(format!("--num-queues={n}"));
        }
        v.extend(self.tls.to_args());
        let p = &self.perf;
        for (on, f) in [
            (p.no_read_workqueue, "--perf-no_read_workqueue"),
            (p.no_write_workqueue, "--perf-no_write_workqueue"),
            (p.same_cpu_crypt, "--perf-same_cpu_crypt"),
            (p.submit_from_crypt_cpus, "--perf-submit_from_crypt_cpus"),
            (self.allow_discards, "--allow-discards"),
            (self.read_only, "--readonly"),
        ] {
            if on {
                v.push(f.into());
            }
        }
        v.push(format!("--mode={}", mode_name(self.mode)));
        let io = match self.io_engine {
            backend::IoEngine::Uring => "uring",
            backend::IoEngine::Auto => "auto",
            _ => "syscalls",
        };
        v.push(format!("--io-engine={io}"));
        let direct = match self.direct {
            backend::DirectIo::Never => "never",
            backend::DirectIo::Required => "required",
            _ => "auto",
        };
        v.push(format!("--direct-io={direct}"));
        // How an rbd: device reaches its cluster (nothing for a path).
        v.extend(backend::rbd::RbdConfig::current().to_args());
        v.push("--".into());
        v.push(self.device.display().to_string());
        v.push(self.name.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> OpenOptions {
        OpenOptions {
            name: "v".into(),
            device: "/img".into(),
            header: None,
            export: ExportSpec::NbdUnix(None),
            tls: TlsSpec::default(),
            mode: CryptMode::Classic,
            perf: PerfFlags::default(),
            allow_discards: false,
            read_only: false,
            io_engine: backend::IoEngine::Syscalls,
            direct: backend::DirectIo::Auto,
        }
    }

    #[test]
    fn child_args_of_the_defaults() {
        assert_eq!(
            options().child_args(true).join(" "),
            "open --foreground --table-stdin --type=plain --export=nbd --mode=classic \
             --io-engine=syscalls --direct-io=auto -- /img v"
        );
    }

    #[test]
    fn child_args_carry_every_option() {
        let o = OpenOptions {
            header: Some("/h".into()),
            export: ExportSpec::Fuse(Some("/mnt".into())),
            mode: CryptMode::Adaptive,
            perf: PerfFlags {
                no_read_workqueue: true,
                submit_from_crypt_cpus: true,
                ..PerfFlags::default()
            },
            allow_discards: true,
            read_only: true,
            io_engine: backend::IoEngine::Uring,
            direct: backend::DirectIo::Required,
            ..options()
        };
        assert_eq!(
            o.child_args(false).join(" "),
            "open --foreground --table-stdin --type=luks --header=/h --export=fuse=/mnt \
             --perf-no_read_workqueue --perf-submit_from_crypt_cpus --allow-discards --readonly \
             --mode=adaptive --io-engine=uring --direct-io=required -- /img v"
        );
    }

    #[test]
    fn spec_merges_the_given_flags_into_the_table() {
        let t = resolve::plain_table(
            "0 8 crypt aes-xts-plain64 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 /x 0",
        )
        .unwrap();
        let o = OpenOptions {
            allow_discards: true,
            ..options()
        };
        let s = o.spec(t, VolumeType::Plain);
        assert_eq!(s.table.device, "/img");
        assert!(s.engine.allow_discards && s.table.options.allow_discards);
        assert_eq!(s.name, "v");
    }
}
