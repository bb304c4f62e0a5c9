//! `ucrypt bench`'s command line as clap parses it ([`BenchFlags`], with
//! the profile's changes in [`OverrideFlags`]), turned once into the bench
//! crate's plain `bench::BenchArgs` ([`BenchFlags::request`]).

use std::path::PathBuf;

/// Options of `ucrypt bench` (`bench::BenchArgs`). The field docs are its
/// `--help` text.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchFlags {
    /// Profile: quick, default, full, or grid (the data path's mode grid).
    #[arg(long, value_name = "NAME", value_parser = ["quick", "default", "full", "grid"],
          conflicts_with_all = ["quick", "full"])]
    profile: Option<String>,
    /// Short run for CI (same as --profile quick).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Long run (same as --profile full).
    #[arg(long)]
    full: bool,
    /// Changes to the profile.
    #[command(flatten)]
    overrides: OverrideFlags,
    /// fio over NBD (raw baseline: nbdkit memory), vhost (libblkio over
    /// vhost-user-blk; raw baseline: qemu-storage-daemon), file (the engine
    /// over a file through io_uring and pread/pwrite; raw baseline: fio's
    /// io_uring engine on that file) or in-process (default).
    #[arg(long, value_name = "HOW", value_parser = ["fio", "vhost", "file", "in-process"])]
    via: Option<String>,
    /// With --via file: the file to measure, on the disk to be measured
    /// (tmpfs gives the pread-vs-io_uring QD1 cell). Made if missing and
    /// kept; write cells overwrite it. Default: a new file in $TMPDIR (else
    /// /tmp), removed at the end.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// With --via file: the file's size (e.g. 1G; default: an existing
    /// file's size, else 1G); a shorter file is extended.
    #[arg(long, value_name = "SIZE")]
    file_size: Option<String>,
    /// With --via fio or vhost: every server's image in DIR (a directory
    /// on the filesystem or device to measure) instead of /dev/shm, each
    /// server as it runs in production (ucrypt's defaults, O_DIRECT where
    /// the filesystem takes it; qemu-storage-daemon cache.direct=on
    /// aio=io_uring; nbdkit's file plugin cache=none), plus `disk`: fio's
    /// io_uring engine on a plain file there (O_DIRECT), the io of the bound.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// With --via fio: add nbdkit (luks filter) and qemu-storage-daemon (raw,
    /// luks); with --via vhost: qemu-storage-daemon (luks).
    #[arg(long)]
    peers: bool,
    /// fio on Ceph RBD images of the cluster --ceph-conf names: ucrypt
    /// (default aes-adaptive) on LUKS2 from `rbd encryption format`, raw =
    /// qemu-storage-daemon's rbd driver; --peers adds it with librbd's LUKS2.
    #[arg(long, conflicts_with = "dm_crypt")]
    ceph: bool,
    /// With --ceph: the pool the images are made in (and removed from).
    #[arg(long, value_name = "POOL", requires = "ceph", default_value = "rbd")]
    ceph_pool: String,
    /// The dm-crypt flag advisor: measure the kernel's dm-crypt flags over
    /// brd (root, fio) and answer one `cryptsetup refresh` line.
    #[arg(long)]
    dm_crypt: bool,
    /// With --dm-crypt: the workload, db, vm, backup or seeds (default).
    #[arg(
        long,
        value_name = "PRESET",
        requires = "dm_crypt",
        conflicts_with = "fio_job"
    )]
    workload: Option<String>,
    /// With --dm-crypt: decide for this fio job file instead.
    #[arg(long, value_name = "FILE", requires = "dm_crypt")]
    fio_job: Option<PathBuf>,
    /// With --dm-crypt: the live mapping to start from (cipher, flags).
    #[arg(long, value_name = "NAME", requires = "dm_crypt")]
    mapping: Option<String>,
    /// No progress bar.
    // Here rather than in `OverrideFlags` only so that `--help` lists it
    // last, as it always has.
    #[arg(long)]
    no_progress: bool,
}

impl BenchFlags {
    /// The bench crate's request: these options as plain values, the
    /// cluster of `--ceph` reached as `ceph` says.
    pub fn request(&self, ceph: backend::rbd::RbdConfig) -> bench::BenchArgs {
        bench::BenchArgs {
            profile: self.profile.clone(),
            quick: self.quick,
            full: self.full,
            via: self.via.clone(),
            file: self.file.clone(),
            file_size: self.file_size.clone(),
            dir: self.dir.clone(),
            peers: self.peers,
            ceph: self.ceph,
            ceph_pool: self.ceph_pool.clone(),
            ceph_config: ceph,
            dm_crypt: self.dm_crypt,
            workload: self.workload.clone(),
            fio_job: self.fio_job.clone(),
            mapping: self.mapping.clone(),
            no_progress: self.no_progress,
            overrides: self.overrides.overrides(),
        }
    }
}

/// The changes to a profile (`bench::Overrides`), as typed. The field docs
/// are `ucrypt bench --help`'s text.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OverrideFlags {
    /// Headline targets: names (raw, null-classic, aes-inline …), `null`, `aes`, `all`.
    #[arg(long, value_name = "LIST")]
    targets: Option<String>,
    /// Sweep targets (heatmaps need raw and <cipher>-classic with inline/adaptive).
    #[arg(long, value_name = "LIST")]
    sweep_targets: Option<String>,
    /// Skip the sweep (headline table only).
    #[arg(long)]
    no_sweep: bool,
    /// Sweep block sizes, e.g. 4k,64k,1M.
    #[arg(long, value_name = "LIST")]
    bs: Option<String>,
    /// Sweep queue depths per job, e.g. 1,4,16,64.
    #[arg(long, value_name = "LIST")]
    qd: Option<String>,
    /// Sweep job (thread) counts, e.g. 1,2,4.
    #[arg(long, value_name = "LIST")]
    jobs: Option<String>,
    /// Sweep directions: read,write,randread,randwrite.
    #[arg(long, value_name = "LIST")]
    rw: Option<String>,
    /// Length of one headline repetition (e.g. 250ms, 1s).
    #[arg(long, value_name = "TIME")]
    runtime: Option<String>,
    /// Length of one sweep repetition.
    #[arg(long, value_name = "TIME", conflicts_with = "seconds")]
    sweep_runtime: Option<String>,
    /// Length of one sweep repetition in seconds (e.g. 0.25).
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// Warm-up per target before each cell.
    #[arg(long, value_name = "TIME")]
    warmup: Option<String>,
    /// Headline repetitions.
    #[arg(long, value_name = "N")]
    reps: Option<usize>,
    /// Sweep repetitions (rounds; their target order rotates per round).
    #[arg(long, value_name = "N", visible_alias = "rounds")]
    sweep_reps: Option<usize>,
    /// Sector size of the encrypted in-process targets (512 … 4096).
    #[arg(long, value_name = "BYTES")]
    sector_size: Option<u32>,
    /// Adaptive moves bytes as inline does (no fused copy and crypto pass).
    #[arg(long)]
    no_fuse: bool,
    /// Adaptive hands off and splits whatever the load.
    #[arg(long)]
    force_split: bool,
    /// Print each engine's per-path request counts after every cell (stderr;
    /// with `--via fio`, each served ucrypt's `status` counters).
    #[arg(long)]
    engine_stats: bool,
    /// Ramdisk size (e.g. 512M, 1G; at most 2G by default profiles).
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,
    /// Results folder (default ./results/bench-<UTC time>/).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

impl OverrideFlags {
    /// The bench crate's overrides (`--no-progress` is
    /// [`BenchFlags::no_progress`]).
    fn overrides(&self) -> bench::Overrides {
        bench::Overrides {
            targets: self.targets.clone(),
            sweep_targets: self.sweep_targets.clone(),
            no_sweep: self.no_sweep,
            bs: self.bs.clone(),
            qd: self.qd.clone(),
            jobs: self.jobs.clone(),
            rw: self.rw.clone(),
            runtime: self.runtime.clone(),
            sweep_runtime: self.sweep_runtime.clone(),
            seconds: self.seconds,
            warmup: self.warmup.clone(),
            reps: self.reps,
            sweep_reps: self.sweep_reps,
            sector_size: self.sector_size,
            no_fuse: self.no_fuse,
            force_split: self.force_split,
            engine_stats: self.engine_stats,
            size: self.size.clone(),
            out: self.out.clone(),
            no_progress: false,
        }
    }
}
