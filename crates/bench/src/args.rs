//! What `ucrypt bench` is asked for ([`BenchArgs`], plain values the
//! `ucrypt-bench` binary fills from its command line): the profile
//! (`--profile`, `--quick`, `--full`), its [`Overrides`], where the jobs
//! run (`--via`, `--peers`, `--ceph`) and the dm-crypt flag advisor's
//! options. [`BenchArgs::options`] turns it into [`Options`],
//! [`BenchArgs::advisor`] and [`BenchArgs::via`] into the run it asks
//! for; the binary runs and prints.

use std::path::PathBuf;

use crate::{advisor, dmcrypt, Error, Options, OptionsError, Overrides, Via};

/// Options of `ucrypt bench`, as its command line names them.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Profile: quick, default, full, or grid (the data path's mode grid).
    pub profile: Option<String>,
    /// Short run for CI (same as --profile quick).
    pub quick: bool,
    /// Long run (same as --profile full).
    pub full: bool,
    /// Changes to the profile.
    pub overrides: Overrides,
    /// fio over NBD (raw baseline: nbdkit memory), vhost (libblkio over
    /// vhost-user-blk; raw baseline: qemu-storage-daemon), file (the engine
    /// over a file through io_uring and pread/pwrite; raw baseline: fio's
    /// io_uring engine on that file) or in-process (default).
    pub via: Option<String>,
    /// With --via file: the file to measure, on the disk to be measured
    /// (tmpfs gives the pread-vs-io_uring QD1 cell). Made if missing and
    /// kept; write cells overwrite it. Default: a new file in $TMPDIR (else
    /// /tmp), removed at the end.
    pub file: Option<PathBuf>,
    /// With --via file: the file's size (e.g. 1G; default: an existing
    /// file's size, else 1G); a shorter file is extended.
    pub file_size: Option<String>,
    /// With --via fio or vhost: every server's image in DIR (a directory
    /// on the filesystem or device to measure) instead of /dev/shm, each
    /// server as it runs in production (ucrypt's defaults, O_DIRECT where
    /// the filesystem takes it; qemu-storage-daemon cache.direct=on
    /// aio=io_uring; nbdkit's file plugin cache=none), plus `disk`: fio's
    /// io_uring engine on a plain file there (O_DIRECT), the io of the bound.
    pub dir: Option<PathBuf>,
    /// With --via fio: add nbdkit (luks filter) and qemu-storage-daemon (raw,
    /// luks); with --via vhost: qemu-storage-daemon (luks).
    pub peers: bool,
    /// fio on Ceph RBD images of the cluster --ceph-conf names: ucrypt
    /// (default aes-adaptive) on LUKS2 from `rbd encryption format`, raw =
    /// qemu-storage-daemon's rbd driver; --peers adds it with librbd's LUKS2.
    pub ceph: bool,
    /// With --ceph: the pool the images are made in (and removed from;
    /// default `rbd`).
    pub ceph_pool: String,
    /// With --ceph: how the cluster is reached (`--ceph-conf`,
    /// `--ceph-id`, `--keyring`).
    pub ceph_config: backend::rbd::RbdConfig,
    /// The dm-crypt flag advisor: measure the kernel's dm-crypt flags over
    /// brd (root, fio) and answer one `cryptsetup refresh` line.
    pub dm_crypt: bool,
    /// With --dm-crypt: the workload, db, vm, backup or seeds (default).
    pub workload: Option<String>,
    /// With --dm-crypt: decide for this fio job file instead.
    pub fio_job: Option<PathBuf>,
    /// With --dm-crypt: the live mapping to start from (cipher, flags).
    pub mapping: Option<String>,
    /// No progress bar (applied through [`Overrides::no_progress`]).
    pub no_progress: bool,
}

impl Default for BenchArgs {
    /// The default profile in process, Ceph's pool `rbd`.
    fn default() -> Self {
        Self {
            profile: None,
            quick: false,
            full: false,
            overrides: Overrides::default(),
            via: None,
            file: None,
            file_size: None,
            dir: None,
            peers: false,
            ceph: false,
            ceph_pool: "rbd".into(),
            ceph_config: backend::rbd::RbdConfig::default(),
            dm_crypt: false,
            workload: None,
            fio_job: None,
            mapping: None,
            no_progress: false,
        }
    }
}

impl BenchArgs {
    /// The profile named by `--profile`, `--quick` or `--full`, else
    /// `default`.
    pub fn profile(&self) -> &str {
        match (&self.profile, self.quick, self.full) {
            (Some(p), _, _) => p.as_str(),
            (None, true, _) => "quick",
            (None, _, true) => "full",
            _ => "default",
        }
    }

    /// The profile with the overrides applied, validated
    /// ([`Options::with_overrides`]).
    pub fn options(&self) -> Result<Options, Error> {
        let mut o = Overrides {
            no_progress: self.no_progress,
            ..self.overrides.clone()
        };
        let file_run = self.via.as_deref() == Some("file") && !self.ceph;
        if !file_run && (self.file.is_some() || self.file_size.is_some()) {
            return Err(OptionsError::FileWithoutViaFile.into());
        }
        let servers = matches!(self.via.as_deref(), Some("fio" | "vhost"))
            || (self.via.is_none() && self.peers);
        if self.dir.is_some() && (self.ceph || !servers) {
            return Err(OptionsError::DirWithoutServers.into());
        }
        if self.ceph {
            // On Ceph: ucrypt adaptive against the peers, no sweep, unless told.
            o.targets.get_or_insert_with(|| "aes-adaptive".into());
            o.no_sweep |= o.sweep_targets.is_none();
        } else if self.via.as_deref() == Some("file") {
            // The engine's rows in each mode, 4096-byte sectors, no sweep,
            // unless told.
            o.targets
                .get_or_insert_with(|| crate::runner::file::DEFAULT_TARGETS.into());
            o.sector_size.get_or_insert(4096);
            o.no_sweep |= o.sweep_targets.is_none();
            self.file_size()?;
        } else if self.via.as_deref() == Some("vhost") {
            // vhost's own sweep for what is not given (jobs = virtqueues).
            for (field, value) in crate::runner::vhost::DEFAULT_SWEEP {
                let f = match field {
                    "bs" => &mut o.bs,
                    "qd" => &mut o.qd,
                    "jobs" => &mut o.jobs,
                    _ => &mut o.rw,
                };
                f.get_or_insert_with(|| value.to_string());
            }
        }
        Ok(Options::with_overrides(self.profile(), &o)?)
    }

    /// With `--dm-crypt`, the flag advisor's request ([`dmcrypt::run`]);
    /// else `None`.
    pub fn advisor(&self) -> Result<Option<dmcrypt::Request>, Error> {
        if !self.dm_crypt {
            return Ok(None);
        }
        let workload =
            advisor::AdvisorWorkload::new(self.workload.as_deref(), self.fio_job.as_deref())?;
        Ok(Some(dmcrypt::Request {
            workload,
            mapping: self.mapping.clone(),
        }))
    }

    /// Where the jobs run: fio against `ucrypt open` (served by
    /// `ucrypt_exe`, this binary) with `--via fio` or `--peers`, on Ceph
    /// with `--ceph` (fio, whatever `--via` says), libblkio against it over
    /// vhost-user-blk with `--via vhost`, else in this process.
    /// `ucrypt_exe`'s error only matters for fio and vhost. With `--via
    /// file`, the file and its size.
    pub fn via(&self, ucrypt_exe: std::io::Result<PathBuf>) -> std::io::Result<Via> {
        if self.ceph {
            Ok(Via::Rbd(crate::runner::rbd::RbdPlan {
                pool: self.ceph_pool.clone(),
                cluster: self.ceph_config.clone(),
                peers: self.peers,
                ucrypt_exe: ucrypt_exe?,
            }))
        } else if self.via.as_deref() == Some("vhost") {
            Ok(Via::Vhost(crate::runner::vhost::VhostPlan {
                peers: self.peers,
                ucrypt_exe: ucrypt_exe?,
                dir: self.dir.clone(),
            }))
        } else if self.via.as_deref() == Some("file") {
            Ok(Via::File(crate::runner::file::FilePlan {
                path: self.file.clone(),
                size: self.file_size().map_err(std::io::Error::other)?,
                shapes_given: self.overrides.bs.is_some() || self.overrides.qd.is_some(),
                rw_given: self.overrides.rw.is_some(),
            }))
        } else if self.via.as_deref() == Some("fio") || self.peers {
            Ok(Via::Fio {
                peers: self.peers,
                ucrypt_exe: ucrypt_exe?,
                dir: self.dir.clone(),
            })
        } else {
            Ok(Via::InProcess)
        }
    }

    /// `--file-size` in bytes ([`BenchArgs::options`] reports a bad one).
    fn file_size(&self) -> Result<Option<u64>, OptionsError> {
        self.file_size
            .as_deref()
            .map(|s| {
                crate::stats::parse_size(s).ok_or_else(|| OptionsError::Invalid {
                    what: "file size",
                    value: s.into(),
                    example: "256M, 1G",
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ucrypt bench --via VIA` (none: in process) with `more` changes,
    /// as the command line would give them.
    fn args(via: Option<&str>, more: impl FnOnce(&mut BenchArgs)) -> BenchArgs {
        let mut a = BenchArgs {
            via: via.map(Into::into),
            ..BenchArgs::default()
        };
        more(&mut a);
        a
    }

    #[test]
    fn dir_goes_with_the_server_runners_only() {
        let exe = || Ok(PathBuf::from("/bin/ucrypt"));
        for via in ["fio", "vhost"] {
            let a = args(Some(via), |a| a.dir = Some("/var/tmp".into()));
            assert!(a.options().is_ok(), "--via {via}");
            let dir = match a.via(exe()).unwrap() {
                Via::Fio { dir, .. } => dir,
                Via::Vhost(p) => p.dir,
                other => panic!("{other:?}"),
            };
            assert_eq!(dir, Some(PathBuf::from("/var/tmp")));
        }
        let peers = args(None, |a| {
            a.peers = true;
            a.dir = Some("/var/tmp".into());
        });
        assert!(peers.options().is_ok(), "--peers alone runs fio");
        for via in [None, Some("file"), Some("in-process")] {
            let a = args(via, |a| a.dir = Some("/var/tmp".into()));
            let e = a.options().unwrap_err();
            assert_eq!(
                e.to_string(),
                "--dir goes with --via fio or --via vhost",
                "{via:?}"
            );
        }
        match args(Some("fio"), |_| {}).via(exe()).unwrap() {
            Via::Fio { dir, .. } => assert_eq!(dir, None),
            other => panic!("{other:?}"),
        }
    }

    // What each `--via` fills in (the runners' plans and option defaults).

    #[test]
    fn via_file_defaults_to_the_modes_on_4k_sectors_without_a_sweep() {
        let a = args(Some("file"), |a| {
            a.file = Some("/x/f.img".into());
            a.file_size = Some("256M".into());
        });
        let o = a.options().unwrap();
        let names: Vec<String> = o.targets.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["raw", "aes-classic", "aes-inline", "aes-adaptive"]);
        assert_eq!(o.sector_size, 4096);
        assert!(o.sweep_targets.is_empty());
        match a.via(Err(std::io::ErrorKind::NotFound.into())).unwrap() {
            crate::Via::File(p) => {
                assert_eq!(p.path, Some(std::path::PathBuf::from("/x/f.img")));
                assert_eq!(p.size, Some(256 << 20));
            }
            v => panic!("{v:?}"),
        }
        // What the command line says wins.
        let told = args(Some("file"), |a| {
            a.overrides.targets = Some("aes-inline".into());
            a.overrides.sector_size = Some(512);
        });
        let o = told.options().unwrap();
        assert_eq!((o.targets.len(), o.sector_size), (1, 512));
        // --bs/--qd/--rw choose the cells (each size at each depth).
        let cells = args(Some("file"), |a| {
            a.overrides.bs = Some("64k,1M".into());
            a.overrides.qd = Some("1,4".into());
            a.overrides.rw = Some("randread".into());
        });
        let crate::Via::File(plan) = cells.via(Err(std::io::ErrorKind::NotFound.into())).unwrap()
        else {
            panic!("not a file plan")
        };
        let o = crate::runner::file::file_options(&cells.options().unwrap(), 64 << 20, &plan);
        let shapes: Vec<(u32, usize)> = o.headline.iter().map(|s| (s.bs, s.qd)).collect();
        assert_eq!(
            shapes,
            [(64 << 10, 1), (64 << 10, 4), (1 << 20, 1), (1 << 20, 4)]
        );
        assert_eq!(o.headline_rw, [crate::driver::Rw::RandRead]);
        let only_qd = args(Some("file"), |a| a.overrides.qd = Some("2".into()));
        let crate::Via::File(plan) = only_qd
            .via(Err(std::io::ErrorKind::NotFound.into()))
            .unwrap()
        else {
            panic!("not a file plan")
        };
        let o = crate::runner::file::file_options(&only_qd.options().unwrap(), 64 << 20, &plan);
        assert!(o.headline.iter().all(|s| s.qd == 2), "{:?}", o.headline);
        assert_eq!(
            o.headline_rw,
            [crate::driver::Rw::RandRead, crate::driver::Rw::RandWrite]
        );
        let bad = args(Some("file"), |a| a.file_size = Some("lots".into()));
        let e = bad.options().unwrap_err();
        assert_eq!(e.to_string(), "Invalid file size `lots` (e.g. 256M, 1G)");
        for other in [
            args(Some("fio"), |a| a.file = Some("/x".into())),
            args(None, |a| a.file_size = Some("1G".into())),
        ] {
            let e = other.options().unwrap_err();
            assert_eq!(e.to_string(), "--file and --file-size go with --via file");
        }
    }

    #[test]
    fn via_vhost_fills_in_its_sweep_where_the_command_line_is_silent() {
        let a = args(Some("vhost"), |a| {
            a.peers = true;
            a.overrides.qd = Some("4".into());
        });
        let o = a.options().unwrap();
        assert_eq!((o.bs, o.qd, o.jobs), (vec![4096], vec![4], vec![2]));
        assert_eq!(
            o.rw,
            [crate::driver::Rw::RandRead, crate::driver::Rw::RandWrite]
        );
        match a.via(Ok("/bin/ucrypt".into())).unwrap() {
            crate::Via::Vhost(p) => assert!(p.peers),
            v => panic!("{v:?}"),
        }
        // fio and in-process keep the profile's sweep.
        let fio = args(Some("fio"), |_| {}).options().unwrap();
        assert_eq!(fio.bs, crate::Options::standard().bs);
        assert_eq!(fio.jobs, crate::Options::standard().jobs);
    }
}
