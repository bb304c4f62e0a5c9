//! `--via fio` and `--peers`: the same plan driven by fio (a real client)
//! over NBD against block-device servers on tmpfs-backed images, or with
//! `--dir` on images in that directory, beside fio's own io_uring engine
//! on a plain file there (`disk`, the storage's rate: the bound's io).
//!
//! ```text
//!   fio --ioengine=nbd --uri=nbd+unix:///<export>?socket=S
//!        │
//!        ├─► ucrypt open --export nbd=S --foreground   (ucrypt-<target>)
//!        ├─► nbdkit memory                             (raw)
//!        ├─► nbdkit --filter=luks file                 (nbdkit-luks)
//!        ├─► qemu-storage-daemon raw                   (qsd-raw)
//!        └─► qemu-storage-daemon luks                  (qsd-luks)
//!   fio --ioengine=io_uring --filename=DIR/… --direct=1  (disk, --dir only)
//! ```
//!
//! Every server is started (and filled) first and kept running, so the
//! shared loop can interleave repetitions across them. CPU time per GiB
//! adds the server's CPU (from `/proc/<pid>/stat`) to fio's own.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::servers::{self, Server};
use super::storage::StorageDir;
use super::{Rep, RunTarget, Runner};
use crate::driver::{Rw, Workload};
use crate::error::OptionsError;
use crate::plan::Shape;
use crate::report::{Report, Skipped, DISK_TARGET};
use crate::stats::{self, Percentiles};
use crate::target::Target;
use crate::{Error, Options};

/// What to run through fio.
#[derive(Debug, Clone)]
pub struct FioPlan {
    /// ucrypt's own targets (each served by `ucrypt open`); raw is served by
    /// nbdkit's memory plugin (fio needs a server; ucrypt has no raw mode).
    pub ucrypt_targets: Vec<Target>,
    /// Add nbdkit (luks filter) and qemu-storage-daemon (raw, luks).
    pub peers: bool,
    /// The ucrypt binary (`std::env::current_exe()` from the CLI).
    pub ucrypt_exe: PathBuf,
    /// `--dir`: the images' directory (None: /dev/shm).
    pub dir: Option<PathBuf>,
}

/// One fio measurement.
#[derive(Debug, Clone, Copy)]
pub struct FioRep {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// IOPS.
    pub iops: f64,
    /// Completion latency percentiles.
    pub lat: Option<Percentiles>,
    /// fio's CPU seconds (user + system) over the run.
    pub cpu_s: f64,
    /// Bytes moved.
    pub bytes: u64,
}

impl FioRep {
    /// This run as a repetition of `bs`-byte requests; CPU per GiB counts
    /// fio's own CPU plus `server_cpu_s` (the server's, where there is one).
    pub fn rep(self, bs: u32, server_cpu_s: f64) -> Rep {
        Rep {
            ops: self.bytes / u64::from(bs).max(1),
            bytes_per_s: self.bytes_per_s,
            iops: self.iops,
            lat: self.lat,
            cpu_s_per_gib: (self.bytes > 0)
                .then(|| (server_cpu_s + self.cpu_s) / (self.bytes as f64 / stats::GIB)),
            errors: 0,
            error: None,
            disk: None,
        }
    }
}

/// The options fio runs with: each server gets its own RAM image, so the
/// images stay small (at most 256 MiB), and the headline adds 1M QD8 (the
/// transport's ceiling) to 4k QD1.
pub fn fio_options(opts: &Options) -> Options {
    Options {
        size: opts.size.min(256 << 20),
        headline: vec![Shape { bs: 4096, qd: 1 }, Shape { bs: 1 << 20, qd: 8 }],
        ..opts.clone()
    }
}

/// [`fio_options`], but images on a disk (`--dir`) keep the size asked
/// for: they are not in RAM.
pub fn fio_options_on(opts: &Options, dir: Option<&std::path::Path>) -> Options {
    match dir {
        Some(_) => Options {
            size: opts.size,
            ..fio_options(opts)
        },
        None => fio_options(opts),
    }
}

/// Starts the servers, runs the plan through fio and returns the report.
pub fn run(opts: &Options, plan: &FioPlan) -> Result<Report, Error> {
    let opts = fio_options_on(opts, plan.dir.as_deref());
    let mut runner = FioRunner::new(&opts, plan)?;
    super::run(&mut runner, &opts)
}

/// fio against running NBD servers (and, under `--dir`, on a plain file:
/// the `disk` target, no server).
pub struct FioRunner {
    servers: Vec<Option<Server>>,
    storage: Option<StorageDir>,
    /// Files to remove at the end (the `disk` target's).
    files: Vec<PathBuf>,
    args: Vec<Vec<String>>,
    targets: Vec<RunTarget>,
    skipped: Vec<Skipped>,
    size: u64,
    ramp: Duration,
    via: String,
    engine_stats: bool,
}

impl FioRunner {
    /// Checks the tools, then starts and fills every server; one that
    /// fails is skipped with its error.
    pub fn new(opts: &Options, plan: &FioPlan) -> Result<Self, Error> {
        opts.validate()?;
        let mut missing = Vec::new();
        for (tool, needed, why) in [
            ("fio", true, "fio"),
            ("nbdkit", true, "nbdkit (the raw baseline server)"),
            ("qemu-storage-daemon", plan.peers, "qemu-storage-daemon"),
            ("qemu-img", plan.peers, "qemu-img (to make LUKS images)"),
        ] {
            if needed && !servers::tool(tool) {
                missing.push(why.to_string());
            }
        }
        if !missing.is_empty() {
            return Err(Error::Missing {
                needs: "--via fio and --peers need fio and nbdkit (--peers: qemu-storage-daemon, qemu-img)",
                missing,
            });
        }
        let storage = plan.dir.as_deref().map(StorageDir::probe).transpose()?;
        super::watch_interrupts();
        servers::remove_stale();
        if let Some(s) = &storage {
            servers::remove_stale_in(&s.dir);
        }
        let tag = format!("{}-{}", std::process::id(), crate::timestamp_compact());
        let via = if plan.peers { "fio+peers" } else { "fio" };
        let plan = FioPlan {
            dir: storage.as_ref().map(|s| s.dir.clone()),
            ..plan.clone()
        };
        let mut runner = Self::start(opts, servers::starters(&plan, opts.size, &tag), via)?;
        if let Some(s) = storage {
            runner.add_disk(opts, &s, &tag);
            runner.storage = Some(s);
        }
        Ok(runner)
    }

    /// Adds the `disk` target: fio's io_uring engine on a plain file of
    /// `storage` (O_DIRECT where it takes it), filled first, the storage's
    /// own rate (the bound's io). Skipped with its error if it fails.
    pub(super) fn add_disk(&mut self, opts: &Options, storage: &StorageDir, tag: &str) {
        let path = storage.dir.join(format!("{}{tag}-disk.img", servers::STEM));
        let args = disk_args(&path, storage);
        let made = servers::make_raw_image(&path, opts.size).and_then(|()| fill(&args, opts.size));
        self.files.push(path);
        if let Err(e) = made {
            self.skipped.push(Skipped {
                target: DISK_TARGET.into(),
                reason: crate::error_chain(&e),
            });
            return;
        }
        self.targets.push(RunTarget {
            name: DISK_TARGET.into(),
            cipher: None,
            mode: None,
            headline: true,
            swept: !opts.sweep_targets.is_empty(),
        });
        self.args.push(args);
        self.servers.push(None);
    }

    /// Starts and fills the servers of `starters` in order (reported as
    /// `via`); one that fails is skipped with its error. The sweep covers
    /// `raw` and the starters whose ucrypt target is a sweep target.
    pub(super) fn start(
        opts: &Options,
        starters: Vec<servers::Starter>,
        via: &str,
    ) -> Result<Self, Error> {
        let mut runner = Self {
            servers: Vec::new(),
            storage: None,
            files: Vec::new(),
            args: Vec::new(),
            targets: Vec::new(),
            skipped: Vec::new(),
            size: opts.size,
            ramp: opts.warmup,
            via: via.into(),
            engine_stats: opts.engine_stats,
        };
        for starter in starters {
            if super::interrupted() {
                return Err(Error::Interrupted);
            }
            eprintln!("bench: starting {} …", starter.name);
            let srv = match (starter.start)() {
                Ok(s) => s,
                Err(e) => {
                    runner.skipped.push(Skipped {
                        target: starter.name,
                        reason: crate::error_chain(&e),
                    });
                    continue;
                }
            };
            let args = vec!["--ioengine=nbd".to_string(), format!("--uri={}", srv.uri)];
            // Fill the export so no server answers reads from unallocated holes.
            if let Err(e) = fill(&args, opts.size) {
                runner.skipped.push(Skipped {
                    target: starter.name,
                    reason: crate::error_chain(&e),
                });
                continue;
            }
            // The sweep covers raw and ucrypt's sweep targets; peers get the headline.
            let swept = match starter.target {
                Some(t) => opts.sweep_targets.contains(&t),
                None => starter.name == "raw",
            };
            // Peers and raw are headline targets; a ucrypt target only when
            // `--targets` names it (it may be served for the sweep alone).
            let headline = starter.target.is_none_or(|t| opts.targets.contains(&t));
            runner.targets.push(RunTarget {
                name: starter.name,
                cipher: srv.cipher,
                mode: srv.mode,
                headline,
                swept: swept && !opts.sweep_targets.is_empty(),
            });
            runner.args.push(args);
            runner.servers.push(Some(srv));
        }
        Ok(runner)
    }
}

impl Runner for FioRunner {
    fn via(&self) -> String {
        self.via.clone()
    }

    fn targets(&self) -> &[RunTarget] {
        &self.targets
    }

    fn skipped(&self) -> Vec<Skipped> {
        self.skipped.clone()
    }

    fn storage(&self) -> Option<String> {
        self.storage.as_ref().map(StorageDir::describe)
    }

    fn run(&mut self, target: usize, w: &Workload) -> Rep {
        let cpu = |s: &Option<Server>| s.as_ref().map_or(Duration::ZERO, Server::cpu);
        let c0 = cpu(&self.servers[target]);
        match fio(&self.args[target], w, self.size, self.ramp) {
            Ok(r) => {
                let server_cpu = cpu(&self.servers[target]).saturating_sub(c0);
                r.rep(w.bs, server_cpu.as_secs_f64())
            }
            Err(e) => Rep {
                errors: 1,
                error: Some(crate::error_chain(&e)),
                ..Rep::default()
            },
        }
    }

    fn after_cell(&mut self, w: &Workload) {
        if !self.engine_stats {
            return;
        }
        for (t, srv) in self.targets.iter().zip(&self.servers) {
            let Some(stats) = srv.as_ref().and_then(Server::engine_stats) else {
                continue;
            };
            let dir = if w.rw.is_write() { "write" } else { "read" };
            eprintln!(
                "{} (cumulative, ucrypt status): {} {}",
                super::engine_stats_head(&t.name, w),
                stats[dir],
                stats["in_flight"]
                    .as_u64()
                    .map_or(String::new(), |n| format!("in_flight={n}")),
            );
        }
    }
}

impl Drop for FioRunner {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// fio's arguments for the `disk` target on `path`: its io_uring engine,
/// O_DIRECT where `storage` takes it (as ucrypt and qemu-storage-daemon
/// open their images there).
pub(super) fn disk_args(path: &std::path::Path, storage: &StorageDir) -> Vec<String> {
    let mut v = vec![
        "--ioengine=io_uring".to_string(),
        format!("--filename={}", path.display()),
    ];
    if storage.direct && !storage.tmpfs() {
        v.push("--direct=1".into());
    }
    v
}

/// Runs one fio job; `engine_args` says where (e.g. `--ioengine=nbd`,
/// `--uri=…`, or `--filename=/dev/…`, `--ioengine=libaio`, `--direct=1`).
pub fn fio(
    engine_args: &[String],
    w: &Workload,
    size: u64,
    ramp: Duration,
) -> Result<FioRep, Error> {
    fio_env(engine_args, &[], w, size, ramp)
}

/// [`fio`] with these environment variables set for fio.
pub fn fio_env(
    engine_args: &[String],
    env: &[(&str, &str)],
    w: &Workload,
    size: u64,
    ramp: Duration,
) -> Result<FioRep, Error> {
    let per_job = (size / w.jobs as u64) / u64::from(w.bs) * u64::from(w.bs);
    if per_job == 0 {
        return Err(OptionsError::TooSmall {
            size,
            jobs: w.jobs,
            bs: w.bs,
        }
        .into());
    }
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=ucrypt-bench".to_string(),
        format!("--rw={}", w.rw.name()),
        format!("--bs={}", w.bs),
        format!("--iodepth={}", w.qd),
        format!("--numjobs={}", w.jobs),
        format!("--size={per_job}"),
        format!("--offset_increment={per_job}"),
        format!("--runtime={}ms", w.runtime.as_millis().max(1)),
        format!("--ramp_time={}ms", ramp.as_millis()),
        "--time_based".into(),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ]);
    cmd.args(engine_args);
    cmd.envs(env.iter().copied());
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: "fio".into(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Failed {
            program: "fio".into(),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr)
                .lines()
                .chain(text.lines())
                .take(4)
                .collect::<Vec<_>>()
                .join(" | "),
        });
    }
    parse_fio_json(&text, w.rw)
}

/// Writes the whole device once (1M blocks, QD8).
pub fn fill(engine_args: &[String], size: u64) -> Result<(), Error> {
    let out = Command::new("fio")
        .args([
            "--name=fill",
            "--rw=write",
            "--bs=1M",
            "--iodepth=8",
            &format!("--size={size}"),
            "--output-format=json",
        ])
        .args(engine_args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: "fio".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: "fio fill".into(),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Extracts throughput, IOPS, latency and CPU from fio's JSON output (text
/// before the first `{` — warnings — is skipped).
pub fn parse_fio_json(text: &str, rw: Rw) -> Result<FioRep, Error> {
    let start = text.find('{').ok_or(Error::FioField("a JSON object"))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).map_err(Error::FioJson)?;
    let job = &v["jobs"][0];
    let dir = if rw.is_write() {
        &job["write"]
    } else {
        &job["read"]
    };
    let bytes_per_s = dir["bw_bytes"]
        .as_f64()
        .ok_or(Error::FioField("bw_bytes"))?;
    let iops = dir["iops"].as_f64().ok_or(Error::FioField("iops"))?;
    let bytes = dir["io_bytes"].as_u64().unwrap_or(0);
    if let Some(e) = job["error"].as_i64().filter(|&e| e != 0) {
        return Err(Error::FioJob(e));
    }
    let pct = &dir["clat_ns"]["percentile"];
    let p = |k: &str| pct[k].as_f64().map(|ns| ns / 1000.0);
    let lat = match (p("50.000000"), p("99.000000"), p("99.900000")) {
        (Some(p50), Some(p99), Some(p999)) => Some(Percentiles { p50, p99, p999 }),
        _ => None,
    };
    let runtime_s = job["job_runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    let cpu_pct = job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    Ok(FioRep {
        bytes_per_s,
        iops,
        lat,
        cpu_s: cpu_pct / 100.0 * runtime_s,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json() {
        let text = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs":[{"jobname":"x","error":0,"job_runtime":1000,"usr_cpu":10.0,"sys_cpu":15.0,
 "read":{"io_bytes":104857600,"bw_bytes":104857600,"iops":25600.0,
  "clat_ns":{"percentile":{"50.000000":12000,"99.000000":30000,"99.900000":45000}}},
 "write":{"io_bytes":0,"bw_bytes":0,"iops":0.0}}]}"#;
        let r = parse_fio_json(text, Rw::Read).unwrap();
        assert_eq!(stats::mib_per_s(r.bytes_per_s), 100.0);
        assert_eq!(r.iops, 25600.0);
        assert_eq!(
            r.lat,
            Some(Percentiles {
                p50: 12.0,
                p99: 30.0,
                p999: 45.0
            })
        );
        assert!((r.cpu_s - 0.25).abs() < 1e-9);
        assert_eq!(parse_fio_json(text, Rw::Write).unwrap().lat, None);
        assert!(matches!(
            parse_fio_json("garbage", Rw::Read),
            Err(Error::FioField(_))
        ));
        assert!(matches!(
            parse_fio_json("{\"jobs\":[]}", Rw::Read),
            Err(Error::FioField("bw_bytes"))
        ));
        assert!(matches!(
            parse_fio_json("{\"jobs\":", Rw::Read),
            Err(Error::FioJson(_))
        ));
    }

    #[test]
    fn fio_options_keep_images_small_and_add_the_1m_headline() {
        let o = fio_options(&Options::standard());
        assert_eq!(o.size, 256 << 20);
        assert_eq!(o.headline.len(), 2);
        assert_eq!(o.headline[1], Shape { bs: 1 << 20, qd: 8 });
        let small = Options {
            size: 32 << 20,
            ..Options::quick()
        };
        assert_eq!(fio_options(&small).size, 32 << 20);
    }
}
