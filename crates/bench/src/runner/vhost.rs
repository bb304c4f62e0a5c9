//! `--via vhost`: the same plan driven by libblkio in this process
//! ([`client`]) over vhost-user-blk against servers on tmpfs-backed images,
//! or with `--dir` on images there (qemu-storage-daemon then with
//! `cache.direct=on,aio=io_uring`), beside fio's io_uring engine on a
//! plain file there (`disk`, the storage's rate: the bound's io).
//!
//! ```text
//!   client (libblkio virtio-blk-vhost-user, jobs = virtqueues)
//!        │
//!        ├─► ucrypt open --export vhost-user-blk=S --num-queues N  (ucrypt-<target>)
//!        ├─► qemu-storage-daemon raw                              (raw)
//!        └─► qemu-storage-daemon luks (LUKS1 by cryptsetup)       (qsd-luks, --peers)
//! ```
//!
//! ucrypt has no raw mode, so the raw baseline (`raw`, the `io` of the
//! bound) is qemu-storage-daemon's raw driver; `--peers` adds its luks
//! driver. Every server gets its own image in /dev/shm, is filled through
//! the client once, and is kept running, so the shared loop interleaves
//! repetitions across them. CPU time per GiB adds the server's CPU to
//! this process's (the client's).

pub mod client;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::servers::{self, Server};
use super::storage::StorageDir;
use super::{Rep, RunTarget, Runner};
use crate::driver::{cpu_time, Rw, Workload};
use crate::report::{Report, Skipped, DISK_TARGET};
use crate::stats::{self, Percentiles};
use crate::target::{Cipher, Target};
use crate::{Error, Options};

/// What to run through vhost-user-blk.
#[derive(Debug, Clone)]
pub struct VhostPlan {
    /// Add qemu-storage-daemon's luks driver (and the raw baseline).
    pub peers: bool,
    /// The ucrypt binary (`std::env::current_exe()` from the CLI).
    pub ucrypt_exe: PathBuf,
    /// `--dir`: the images' directory (None: /dev/shm).
    pub dir: Option<PathBuf>,
}

/// The sweep `--via vhost` runs when `--bs`, `--qd`, `--jobs` or `--rw`
/// is not given (each alone): random reads and writes, 4k, QD16 on each of
/// two virtqueues (the "4k QD32, 2 queues" cell).
pub const DEFAULT_SWEEP: [(&str, &str); 4] = [
    ("bs", "4k"),
    ("qd", "16"),
    ("jobs", "2"),
    ("rw", "randread,randwrite"),
];

/// The options the vhost runner runs with: each server gets its own RAM
/// image, so the images stay small (at most 256 MiB), and the headline is
/// 4k QD1 and 1M QD8 on one virtqueue: the fio runner's, so the two
/// frontends' tables line up.
pub fn vhost_options(opts: &Options) -> Options {
    super::fio::fio_options(opts)
}

/// Starts the servers, runs the plan through libblkio and returns the
/// report.
pub fn run(opts: &Options, plan: &VhostPlan) -> Result<Report, Error> {
    let opts = super::fio::fio_options_on(opts, plan.dir.as_deref());
    let mut runner = VhostRunner::new(&opts, plan)?;
    super::run(&mut runner, &opts)
}

/// libblkio against running vhost-user-blk servers.
pub struct VhostRunner {
    /// Per target: its server (None for `disk`, which is fio's).
    servers: Vec<Option<Server>>,
    sockets: Vec<PathBuf>,
    storage: Option<StorageDir>,
    /// Under `--dir`: the `disk` target's index, fio arguments and file.
    disk: Option<(usize, Vec<String>, PathBuf)>,
    size: u64,
    targets: Vec<RunTarget>,
    skipped: Vec<Skipped>,
    warmup: Duration,
    peers: bool,
}

/// One server to start: table name, ucrypt's target (None for qsd) and
/// for qsd whether it decrypts.
struct Start {
    name: String,
    target: Option<Target>,
    luks: bool,
}

/// The servers of `opts` and `peers`, in table order: raw, ucrypt's
/// targets (headline and sweep), qsd-luks.
fn server_list(opts: &Options, peers: bool) -> Vec<Start> {
    let mut v = Vec::new();
    let all = opts.served_targets();
    if peers || all.iter().any(|t| t.cipher.is_none()) {
        v.push(Start {
            name: "raw".into(),
            target: None,
            luks: false,
        });
    }
    for t in all.into_iter().filter(|t| t.cipher.is_some()) {
        v.push(Start {
            name: format!("ucrypt-{t}"),
            target: Some(t),
            luks: false,
        });
    }
    if peers {
        v.push(Start {
            name: "qsd-luks".into(),
            target: None,
            luks: true,
        });
    }
    v
}

impl VhostRunner {
    /// Checks the tools, then starts and fills every server; one that
    /// fails is skipped with its error.
    pub fn new(opts: &Options, plan: &VhostPlan) -> Result<Self, Error> {
        opts.validate()?;
        let list = server_list(opts, plan.peers);
        let qsd = list.iter().any(|s| s.target.is_none());
        let mut missing = Vec::new();
        for (tool, needed, why) in [
            (
                "qemu-storage-daemon",
                qsd,
                "qemu-storage-daemon (the raw baseline and --peers)",
            ),
            (
                "cryptsetup",
                plan.peers,
                "cryptsetup (to make the LUKS1 image)",
            ),
        ] {
            if needed && !servers::tool(tool) {
                missing.push(why.to_string());
            }
        }
        if !missing.is_empty() {
            return Err(Error::Missing {
                needs: "--via vhost needs qemu-storage-daemon for the raw baseline (--peers: and cryptsetup)",
                missing,
            });
        }
        let queues = opts.jobs.iter().copied().max().unwrap_or(1).max(1);
        let storage = plan.dir.as_deref().map(StorageDir::probe).transpose()?;
        if storage.is_some() && !servers::tool("fio") {
            return Err(Error::Missing {
                needs:
                    "--dir needs fio (its io_uring engine on a file there is the storage's rate)",
                missing: vec!["fio".into()],
            });
        }
        let mut runner = Self {
            servers: Vec::new(),
            sockets: Vec::new(),
            storage: None,
            disk: None,
            size: opts.size,
            targets: Vec::new(),
            skipped: Vec::new(),
            warmup: opts.warmup,
            peers: plan.peers,
        };
        super::watch_interrupts();
        servers::remove_stale();
        let tag = format!("{}-{}", std::process::id(), crate::timestamp_compact());
        let dir = servers::shm_dir();
        let img_dir = match &storage {
            Some(s) => {
                servers::remove_stale_in(&s.dir);
                s.dir.clone()
            }
            None => dir.clone(),
        };
        let on_disk = storage.is_some();
        for s in list {
            if super::interrupted() {
                return Err(Error::Interrupted);
            }
            eprintln!("bench: starting {} …", s.name);
            let stem = format!("{}{tag}-vhost-{}", servers::STEM, s.name);
            let (sock, img) = (
                dir.join(format!("{stem}.sock")),
                img_dir.join(format!("{stem}.img")),
            );
            let started = match s.target {
                Some(t) => {
                    let export = [
                        "--export".to_string(),
                        format!("vhost-user-blk={}", sock.display()),
                        "--num-queues".to_string(),
                        queues.to_string(),
                    ];
                    let exe = &plan.ucrypt_exe;
                    servers::spawn_ucrypt(exe, t, &s.name, &sock, &img, opts.size, &export)
                }
                None => start_qsd(&s.name, s.luks, &sock, &img, opts.size, queues, on_disk),
            };
            let srv = match started {
                Ok(srv) => srv,
                Err(e) => {
                    runner.skip(s.name, crate::error_chain(&e));
                    continue;
                }
            };
            // Fill the device so no server answers reads from holes.
            if let Err(reason) = fill(&sock, opts.size) {
                runner.skip(s.name, reason);
                continue;
            }
            let sweep = !opts.sweep_targets.is_empty();
            let (headline, swept) = match s.target {
                Some(t) => (opts.targets.contains(&t), opts.sweep_targets.contains(&t)),
                None if plan.peers => (!opts.targets.is_empty(), sweep),
                None => (
                    opts.targets.contains(&Target::RAW),
                    opts.sweep_targets.contains(&Target::RAW),
                ),
            };
            runner.targets.push(RunTarget {
                name: s.name,
                cipher: srv.cipher,
                mode: srv.mode,
                headline,
                swept,
            });
            runner.sockets.push(sock);
            runner.servers.push(Some(srv));
        }
        if let Some(s) = &storage {
            runner.add_disk(opts, s, &tag);
        }
        runner.storage = storage;
        Ok(runner)
    }

    /// Adds the `disk` target (fio's io_uring engine on a plain file of
    /// `storage`, filled first; see [`super::fio::disk_args`]).
    fn add_disk(&mut self, opts: &Options, storage: &StorageDir, tag: &str) {
        let path = storage
            .dir
            .join(format!("{}{tag}-vhost-disk.img", servers::STEM));
        let args = super::fio::disk_args(&path, storage);
        let made = servers::make_raw_image(&path, opts.size)
            .and_then(|()| super::fio::fill(&args, opts.size));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&path);
            self.skip(DISK_TARGET.into(), crate::error_chain(&e));
            return;
        }
        self.disk = Some((self.targets.len(), args, path));
        self.targets.push(RunTarget {
            name: DISK_TARGET.into(),
            cipher: None,
            mode: None,
            headline: true,
            swept: !opts.sweep_targets.is_empty(),
        });
        self.sockets.push(PathBuf::new());
        self.servers.push(None);
    }

    fn skip(&mut self, target: String, reason: String) {
        self.skipped.push(Skipped { target, reason });
    }
}

/// Starts qemu-storage-daemon over a new image: raw (a sparse file the
/// fill then writes) or LUKS1 ([`make_luks1_image`]), exported writable
/// over vhost-user-blk with `queues` virtqueues; `on_disk` (`--dir`):
/// as in production, `cache.direct=on,aio=io_uring`, else through the
/// page cache (tmpfs takes no O_DIRECT before Linux 6.6).
fn start_qsd(
    name: &str,
    luks: bool,
    sock: &Path,
    img: &Path,
    size: u64,
    queues: usize,
    on_disk: bool,
) -> Result<Server, Error> {
    let pass = "ucrypt-bench";
    let mut c = Command::new("qemu-storage-daemon");
    if luks {
        make_luks1_image(img, size, pass)?;
        c.arg("--object").arg(format!("secret,id=sec0,data={pass}"));
    } else {
        servers::make_raw_image(img, size)?;
    }
    c.arg("--blockdev").arg(format!(
        "driver=file,node-name=file0,filename={},{}",
        img.display(),
        if on_disk {
            "cache.direct=on,aio=io_uring"
        } else {
            "cache.direct=off"
        }
    ));
    c.arg("--blockdev").arg(if luks {
        "driver=luks,node-name=disk0,file=file0,key-secret=sec0".to_string()
    } else {
        "driver=raw,node-name=disk0,file=file0".to_string()
    });
    c.arg("--export").arg(format!(
        "type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path={},num-queues={queues},writable=on",
        sock.display()
    ));
    let files = vec![sock.to_path_buf(), img.to_path_buf()];
    let mut srv = servers::spawn(name, c, sock, "", files)?;
    srv.cipher = luks.then_some(Cipher::AesXts);
    Ok(srv)
}

/// LUKS1 header: 2 MiB before the data (cryptsetup's payload offset).
const LUKS1_PAYLOAD: u64 = 2 << 20;

/// A LUKS1 image whose data area is `size` bytes, aes-xts-plain64 with a
/// 512-bit key, by cryptsetup with 1000 PBKDF2 iterations (qemu-img's luks
/// format spends seconds benchmarking its KDF; qemu 7.2 reads LUKS1 only).
fn make_luks1_image(path: &Path, size: u64, pass: &str) -> Result<(), Error> {
    servers::make_raw_image(path, size + LUKS1_PAYLOAD)?;
    let mut child = Command::new("cryptsetup")
        .args([
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
        ])
        .args([
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--hash",
            "sha256",
        ])
        .args(["--key-file", "-"])
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            program: "cryptsetup".into(),
            source,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error shows as cryptsetup's failure below.
        let _ = stdin.write_all(pass.as_bytes());
    }
    let out = child.wait_with_output().map_err(|source| Error::Spawn {
        program: "cryptsetup".into(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: "cryptsetup luksFormat --type luks1".into(),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Writes the whole device once (1M requests, QD8, one queue).
fn fill(sock: &Path, size: u64) -> Result<(), String> {
    let job = client::Job {
        rw: Rw::Write,
        bs: (1 << 20).min(size as u32),
        qd: 8,
        queues: 1,
        runtime: Duration::from_secs(3600),
        once: true,
    };
    let out = client::run(sock, &job).map_err(|e| crate::error_chain(&e))?;
    match out.error {
        Some(e) => Err(format!("fill: {e}")),
        None => Ok(()),
    }
}

impl Drop for VhostRunner {
    fn drop(&mut self) {
        if let Some((_, _, f)) = &self.disk {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Runner for VhostRunner {
    fn via(&self) -> String {
        if self.peers {
            "vhost+peers".into()
        } else {
            "vhost".into()
        }
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

    fn warm_up(&mut self, target: usize, w: &Workload) {
        // fio ramps up within each `disk` run.
        if !self.warmup.is_zero() && self.servers[target].is_some() {
            let _ = client::run(&self.sockets[target], &job(w, self.warmup));
        }
    }

    fn run(&mut self, target: usize, w: &Workload) -> Rep {
        if let Some((_, args, _)) = self.disk.as_ref().filter(|d| d.0 == target) {
            return match super::fio::fio(args, w, self.size, self.warmup) {
                Ok(r) => r.rep(w.bs, 0.0),
                Err(e) => Rep {
                    errors: 1,
                    error: Some(crate::error_chain(&e)),
                    ..Rep::default()
                },
            };
        }
        let Some(srv) = &self.servers[target] else {
            return Rep::default();
        };
        let (s0, c0) = (srv.cpu(), cpu_time());
        let out = match client::run(&self.sockets[target], &job(w, w.runtime)) {
            Ok(o) => o,
            Err(e) => {
                return Rep {
                    errors: 1,
                    error: Some(crate::error_chain(&e)),
                    ..Rep::default()
                }
            }
        };
        let cpu = (srv.cpu().saturating_sub(s0) + cpu_time().saturating_sub(c0)).as_secs_f64();
        rep_of(out, w.bs, cpu)
    }
}

/// The client job of workload `w`, for `runtime`.
fn job(w: &Workload, runtime: Duration) -> client::Job {
    client::Job {
        rw: w.rw,
        bs: w.bs,
        qd: w.qd,
        queues: w.jobs,
        runtime,
        once: false,
    }
}

/// A repetition from the client's outcome (`cpu_s`: client and server).
fn rep_of(mut out: client::Outcome, bs: u32, cpu_s: f64) -> Rep {
    let secs = out.elapsed.as_secs_f64().max(1e-9);
    let bytes = out.ops as f64 * f64::from(bs);
    Rep {
        ops: out.ops,
        bytes_per_s: bytes / secs,
        iops: out.ops as f64 / secs,
        lat: Percentiles::of_ns(&mut out.lat_ns),
        cpu_s_per_gib: (out.ops > 0).then(|| cpu_s / (bytes / stats::GIB)),
        errors: out.errors,
        error: out.error,
        disk: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Shape;
    use crate::target::Mode;

    #[test]
    fn servers_cover_raw_the_union_of_targets_and_peers() {
        let aes = |m| Target::new(Cipher::AesXts, m);
        let o = Options {
            targets: vec![aes(Mode::Adaptive)],
            sweep_targets: vec![Target::RAW, aes(Mode::Classic), aes(Mode::Adaptive)],
            ..Options::quick()
        };
        let names =
            |peers| -> Vec<String> { server_list(&o, peers).into_iter().map(|s| s.name).collect() };
        assert_eq!(
            names(false),
            ["raw", "ucrypt-aes-adaptive", "ucrypt-aes-classic"]
        );
        assert_eq!(
            names(true),
            [
                "raw",
                "ucrypt-aes-adaptive",
                "ucrypt-aes-classic",
                "qsd-luks"
            ]
        );
        let no_raw = Options {
            targets: vec![aes(Mode::Inline)],
            sweep_targets: Vec::new(),
            ..Options::quick()
        };
        let v = server_list(&no_raw, false);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].target, Some(aes(Mode::Inline)));
    }

    #[test]
    fn a_rep_is_rated_over_the_clients_wall_time() {
        let out = client::Outcome {
            ops: 256,
            elapsed: Duration::from_millis(500),
            lat_ns: vec![3000; 256],
            ..client::Outcome::default()
        };
        let r = rep_of(out, 4096, 0.5);
        assert_eq!(stats::mib_per_s(r.bytes_per_s), 2.0);
        assert_eq!(r.iops, 512.0);
        assert_eq!(r.lat.map(|l| l.p99), Some(3.0));
        // 1 MiB moved for 0.5 s of CPU: 512 s/GiB.
        assert_eq!(r.cpu_s_per_gib, Some(512.0));
        let none = rep_of(client::Outcome::default(), 4096, 0.1);
        assert_eq!((none.ops, none.cpu_s_per_gib), (0, None));
    }

    #[test]
    fn vhost_options_keep_images_small_and_add_the_1m_headline() {
        let o = vhost_options(&Options::standard());
        assert_eq!(o.size, 256 << 20);
        assert_eq!(
            o.headline,
            [Shape { bs: 4096, qd: 1 }, Shape { bs: 1 << 20, qd: 8 }]
        );
    }
}
