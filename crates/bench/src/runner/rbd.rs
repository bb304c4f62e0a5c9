//! `--ceph`: the fio runner against encrypted volumes on a Ceph cluster.
//!
//! ```text
//!   fio --ioengine=nbd --uri=nbd+unix:///<export>?socket=S
//!        │
//!        ├─► ucrypt open rbd:POOL/IMG --export nbd=S  (ucrypt-aes-<mode>, LUKS2 image)
//!        ├─► qemu-storage-daemon driver=rbd           (raw: unencrypted image, the ceiling)
//!        └─► qemu-storage-daemon driver=rbd,          (qsd-luks2, --peers: librbd's
//!              encrypt.format=luks2                    own LUKS2 on the same format)
//! ```
//!
//! The cluster is the caller's: `ucrypt --ceph-conf FILE [--ceph-id ID]
//! [--keyring FILE]` (or librados's defaults), handed in as
//! [`RbdPlan::cluster`]; `scripts/ceph-bench.sh`
//! starts a throwaway one. Every image is made in `--ceph-pool` when its
//! server starts and removed (`rbd rm`) after the servers stop: an
//! unencrypted one of the run's size for raw, and per encrypted server a
//! copy (`rbd cp`) of one image of that size plus LUKS2's 16 MiB header
//! formatted by `rbd encryption format IMG luks2` (its Argon2id costs
//! seconds, so it runs once), so ucrypt and librbd read the same on-disk
//! format (aes-xts-plain64, 4096-byte sectors). A run killed by SIGKILL
//! leaves its images (`ucrypt-bench-<pid>-…`) in the pool; SIGINT and
//! SIGTERM remove them. From there on it is the fio runner
//! ([`FioRunner`]): every export filled once, then the shared loop. The
//! headline is the Ceph comparison's three cells, 4k QD1, 4k QD16 and 1M
//! QD8, as random reads and writes (sequential reads would measure librbd's
//! readahead); the sweep runs only when `--sweep-targets` asks for it.
//! `raw` here is qsd over the unencrypted image, so "% raw" and the bound
//! io·c/(io+c) use the ceiling of the same rbd-to-NBD path.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use backend::rbd::RbdConfig;

use super::fio::FioRunner;
use super::servers::{self, Server, Starter};
use super::{Rep, RunTarget, Runner};
use crate::driver::{Rw, Workload};
use crate::plan::Shape;
use crate::report::{Report, Skipped};
use crate::target::{Cipher, Mode, Target};
use crate::{Error, Options};

/// The passphrase of every encrypted image (they are thrown away).
const PASSPHRASE: &str = "ucrypt-bench";

/// LUKS2's header as `rbd encryption format … luks2` lays it out: the data
/// starts 16 MiB in.
const LUKS2_HEADER_MIB: u64 = 16;

/// What to run on the cluster.
#[derive(Debug, Clone)]
pub struct RbdPlan {
    /// Pool the images are made in.
    pub pool: String,
    /// How the cluster is reached (`--ceph-conf`, `--ceph-id`,
    /// `--keyring`).
    pub cluster: RbdConfig,
    /// Add qemu-storage-daemon with librbd's LUKS2 (`qsd-luks2`).
    pub peers: bool,
    /// The ucrypt binary (`std::env::current_exe()` from the CLI).
    pub ucrypt_exe: PathBuf,
}

/// The options the Ceph runner runs with: images of at most 256 MiB
/// (each server has its own, filled once), and the headline of the Ceph
/// comparison: 4k QD1, 4k QD16 and 1M QD8, random read and write.
pub fn rbd_options(opts: &Options) -> Options {
    Options {
        size: opts.size.min(256 << 20),
        headline: vec![
            Shape { bs: 4096, qd: 1 },
            Shape { bs: 4096, qd: 16 },
            Shape { bs: 1 << 20, qd: 8 },
        ],
        headline_rw: vec![Rw::RandRead, Rw::RandWrite],
        ..opts.clone()
    }
}

/// Makes the images, starts the servers, runs the plan through fio and
/// returns the report; the images are removed before it returns.
pub fn run(opts: &Options, plan: &RbdPlan) -> Result<Report, Error> {
    let opts = rbd_options(opts);
    let mut runner = RbdRunner::new(&opts, plan)?;
    super::run(&mut runner, &opts)
}

/// fio against NBD servers of RBD images; removes the images when dropped.
pub struct RbdRunner {
    // Field order is drop order: the servers stop (and release their
    // images' locks and watches) before the images are removed.
    fio: FioRunner,
    _images: Images,
    /// Targets refused before any server started.
    skipped: Vec<Skipped>,
}

impl RbdRunner {
    /// Checks the tools, then makes each server's image, starts and fills
    /// it; a server that fails is skipped with its error.
    pub fn new(opts: &Options, plan: &RbdPlan) -> Result<Self, Error> {
        opts.validate()?;
        let missing: Vec<String> = ["fio", "rbd", "qemu-storage-daemon"]
            .into_iter()
            .filter(|t| !servers::tool(t))
            .map(String::from)
            .collect();
        if !missing.is_empty() {
            return Err(Error::Missing {
                needs: "--ceph needs fio, rbd (ceph-common) and qemu-storage-daemon \
                        (with qemu-block-extra's rbd driver)",
                missing,
            });
        }
        super::watch_interrupts();
        servers::remove_stale();
        let tag = format!("{}-{}", std::process::id(), crate::timestamp_compact());
        let cluster = Cluster {
            cfg: plan.cluster.clone(),
            pool: plan.pool.clone(),
        };
        let pass = servers::shm_dir().join(format!("{}{tag}-ceph.pass", servers::STEM));
        let images = Images {
            cluster: cluster.clone(),
            names: Arc::default(),
            pass: pass.clone(),
        };
        std::fs::write(&pass, PASSPHRASE).map_err(|source| Error::Output {
            path: pass.clone(),
            source,
        })?;
        eprintln!(
            "bench: Ceph pool {} ({}), images of {} MiB",
            plan.pool,
            cluster.cfg.conf.as_deref().map_or_else(
                || "librados's ceph.conf".into(),
                |p| p.display().to_string()
            ),
            opts.size >> 20
        );
        let mut starters = Vec::new();
        let maker = Maker {
            cluster,
            images: images.names.clone(),
            pass,
            size: opts.size,
            tag,
            template: Arc::default(),
        };
        starters.push(maker.qsd("raw", false));
        let mut skipped = Vec::new();
        for t in opts
            .served_targets()
            .into_iter()
            .filter(|t| t.cipher.is_some())
        {
            if t.cipher == Some(Cipher::AesXts) {
                starters.push(maker.ucrypt(t, &plan.ucrypt_exe));
            } else {
                skipped.push(Skipped {
                    target: format!("ucrypt-{t}"),
                    reason: "on Ceph the images are LUKS2 made by `rbd encryption format` \
                             (aes-xts-plain64 only)"
                        .into(),
                });
            }
        }
        if plan.peers {
            starters.push(maker.qsd("qsd-luks2", true));
        }
        let via = if plan.peers {
            "fio+rbd+peers"
        } else {
            "fio+rbd"
        };
        let fio = FioRunner::start(opts, starters, via)?;
        Ok(Self {
            fio,
            _images: images,
            skipped,
        })
    }
}

impl Runner for RbdRunner {
    fn via(&self) -> String {
        self.fio.via()
    }
    fn targets(&self) -> &[RunTarget] {
        self.fio.targets()
    }
    fn skipped(&self) -> Vec<Skipped> {
        let mut v = self.skipped.clone();
        v.extend(self.fio.skipped());
        v
    }
    fn warm_up(&mut self, target: usize, w: &Workload) {
        self.fio.warm_up(target, w);
    }
    fn run(&mut self, target: usize, w: &Workload) -> Rep {
        self.fio.run(target, w)
    }
    fn after_cell(&mut self, w: &Workload) {
        self.fio.after_cell(w);
    }
}

/// How `rbd` and qemu reach the cluster, and the pool.
#[derive(Debug, Clone)]
struct Cluster {
    cfg: RbdConfig,
    pool: String,
}

impl Cluster {
    /// `rbd [-c CONF] [--id ID] [--keyring FILE] ARGS`, its connecting
    /// bounded as ucrypt's own (an unreachable cluster fails, not hangs).
    fn rbd(&self, args: &[&str]) -> Result<(), Error> {
        let mut c = Command::new("rbd");
        let bound = self.cfg.timeout.unwrap_or(backend::rbd::DEFAULT_TIMEOUT);
        c.arg(format!("--client-mount-timeout={}", bound.as_secs().max(1)));
        if let Some(conf) = &self.cfg.conf {
            c.arg("-c").arg(conf);
        }
        if let Some(id) = &self.cfg.id {
            c.arg("--id").arg(id);
        }
        if let Some(k) = &self.cfg.keyring {
            c.arg("--keyring").arg(k);
        }
        let out = c
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| Error::Spawn {
                program: "rbd".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(Error::Failed {
                program: format!(
                    "rbd {}",
                    args.iter().take(2).cloned().collect::<Vec<_>>().join(" ")
                ),
                status: out.status,
                output: String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | "),
            });
        }
        Ok(())
    }

    /// qemu's `--blockdev driver=rbd,…` for `image` (node and export
    /// `disk0`); the keyring comes from ceph.conf.
    fn qsd_blockdev(&self, image: &str) -> String {
        let q = |s: &str| s.replace(',', ",,");
        let mut o = format!(
            "driver=rbd,node-name=disk0,pool={},image={}",
            q(&self.pool),
            q(image)
        );
        if let Some(conf) = &self.cfg.conf {
            let abs = std::path::absolute(conf).unwrap_or_else(|_| conf.clone());
            o.push_str(&format!(",conf={}", q(&abs.display().to_string())));
        }
        o.push_str(&format!(
            ",user={}",
            q(self.cfg.id.as_deref().unwrap_or("admin"))
        ));
        o
    }
}

/// The run's images (removed when dropped) and its passphrase file.
struct Images {
    cluster: Cluster,
    names: Arc<Mutex<Vec<String>>>,
    pass: PathBuf,
}

impl Drop for Images {
    fn drop(&mut self) {
        let names = std::mem::take(&mut *self.names.lock().unwrap_or_else(|p| p.into_inner()));
        // All at once: an image ucrypt served keeps its watch until the
        // OSD times it out (30 s by default), and `rbd rm` waits for that.
        let cluster = &self.cluster;
        std::thread::scope(|s| {
            for name in &names {
                s.spawn(move || {
                    let img = format!("{}/{name}", cluster.pool);
                    if let Err(e) = cluster.rbd(&["rm", "--no-progress", &img]) {
                        eprintln!("bench: could not remove {img}: {}", crate::error_chain(&e));
                    }
                });
            }
        });
        let _ = std::fs::remove_file(&self.pass);
    }
}

/// The run's images: made on demand, recorded for removal.
#[derive(Clone)]
struct Maker {
    cluster: Cluster,
    images: Arc<Mutex<Vec<String>>>,
    pass: PathBuf,
    size: u64,
    tag: String,
    /// The LUKS2 image `rbd encryption format` made (once: it spends
    /// seconds of Argon2id), copied for every encrypted server.
    template: Arc<Mutex<Option<String>>>,
}

impl Maker {
    /// `rbd create` of `{STEM}{tag}-{name}` (recorded for removal).
    fn create(&self, name: &str, mib: u64) -> Result<String, Error> {
        let image = format!("{}{}-{name}", servers::STEM, self.tag);
        self.cluster
            .rbd(&["create", &self.spec(&image), "--size", &format!("{mib}M")])?;
        self.record(&image);
        Ok(image)
    }

    fn record(&self, image: &str) {
        self.images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(image.into());
    }

    fn spec(&self, image: &str) -> String {
        format!("{}/{image}", self.cluster.pool)
    }

    /// A new image for server `name` holding `size` bytes of data:
    /// unencrypted, or a copy of the LUKS2 template (the same header, so
    /// the same passphrase and format).
    fn image(&self, name: &str, luks2: bool) -> Result<String, Error> {
        let mib = self.size.div_ceil(1 << 20);
        if !luks2 {
            return self.create(name, mib);
        }
        let mut template = self.template.lock().unwrap_or_else(|p| p.into_inner());
        let t = match template.as_ref() {
            Some(t) => t.clone(),
            None => {
                let t = self.create("luks2", mib + LUKS2_HEADER_MIB)?;
                let pass = self.pass.display().to_string();
                self.cluster
                    .rbd(&["encryption", "format", &self.spec(&t), "luks2", &pass])?;
                template.insert(t).clone()
            }
        };
        drop(template);
        let image = format!("{}{}-{name}", servers::STEM, self.tag);
        self.cluster
            .rbd(&["cp", "--no-progress", &self.spec(&t), &self.spec(&image)])?;
        self.record(&image);
        Ok(image)
    }

    /// qemu-storage-daemon's rbd driver on a new image (`luks2`: formatted
    /// and opened by librbd's own encryption).
    fn qsd(&self, name: &'static str, luks2: bool) -> Starter {
        let m = self.clone();
        Starter {
            name: name.into(),
            target: None,
            start: Box::new(move || {
                let image = m.image(name, luks2)?;
                let (cluster, pass, tag) = (&m.cluster, &m.pass, &m.tag);
                let so = sock(tag, name);
                let mut c = Command::new("qemu-storage-daemon");
                let mut dev = cluster.qsd_blockdev(&image);
                if luks2 {
                    c.arg("--object")
                        .arg(format!("secret,id=sec0,file={}", pass.display()));
                    dev.push_str(",encrypt.format=luks2,encrypt.key-secret=sec0");
                }
                c.arg("--blockdev").arg(dev);
                c.arg("--nbd-server")
                    .arg(format!("addr.type=unix,addr.path={}", so.display()));
                c.arg("--export")
                    .arg("type=nbd,id=exp0,node-name=disk0,name=disk0,writable=on");
                let mut srv = servers::spawn(name, c, &so, "disk0", vec![so.clone()])?;
                srv.cipher = luks2.then_some(Cipher::AesXts);
                Ok(srv)
            }),
        }
    }

    /// `ucrypt open rbd:POOL/IMG` in `t`'s mode on a new LUKS2 image.
    fn ucrypt(&self, t: Target, exe: &Path) -> Starter {
        let (m, exe) = (self.clone(), exe.to_path_buf());
        let name = format!("ucrypt-{t}");
        Starter {
            name: name.clone(),
            target: Some(t),
            start: Box::new(move || -> Result<Server, Error> {
                let image = m.image(&name, true)?;
                let (cluster, pass, tag) = (&m.cluster, &m.pass, &m.tag);
                let so = sock(tag, &name);
                let run_dir = so.with_extension("run");
                let mut c = Command::new(&exe);
                c.env("UCRYPT_RUNTIME_DIR", &run_dir);
                c.args(cluster.cfg.to_args());
                c.args(["open", "--foreground", "--key-file"]).arg(pass);
                c.args(mode_args(t.mode));
                c.arg("--export").arg(format!("nbd={}", so.display()));
                c.arg(format!("rbd:{}/{image}", cluster.pool));
                c.arg(format!("bench-{t}"));
                let mut srv = servers::spawn(&name, c, &so, "", vec![so.clone(), run_dir])?;
                srv.cipher = t.cipher;
                srv.mode = Some(t.mode);
                Ok(srv)
            }),
        }
    }
}

/// The socket of server `name`, in the shared-memory dir under the
/// bench's stem (so a killed run's sockets are removed by the next).
fn sock(tag: &str, name: &str) -> PathBuf {
    servers::shm_dir().join(format!("{}{tag}-{name}.sock", servers::STEM))
}

/// `ucrypt open`'s options for a bench mode.
fn mode_args(m: Mode) -> &'static [&'static str] {
    match m {
        Mode::Classic => &["--mode", "classic"],
        Mode::InlineRead => &["--mode", "classic", "--perf-no_read_workqueue"],
        Mode::InlineWrite => &["--mode", "classic", "--perf-no_write_workqueue"],
        Mode::Inline => &["--mode", "inline"],
        Mode::Adaptive => &["--mode", "adaptive"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;
    use crate::report::Phase;

    #[test]
    fn ceph_options_run_the_three_cells_randomly_on_small_images() {
        let o = rbd_options(&Options::standard());
        assert_eq!(o.size, 256 << 20);
        let p = Plan::new(&Options {
            sweep_targets: Vec::new(),
            ..o
        });
        let cells: Vec<(Rw, u32, usize)> = p
            .cells
            .iter()
            .map(|c| (c.workload.rw, c.workload.bs, c.workload.qd))
            .collect();
        assert_eq!(
            cells,
            [
                (Rw::RandRead, 4096, 1),
                (Rw::RandWrite, 4096, 1),
                (Rw::RandRead, 4096, 16),
                (Rw::RandWrite, 4096, 16),
                (Rw::RandRead, 1 << 20, 8),
                (Rw::RandWrite, 1 << 20, 8),
            ]
        );
        assert!(p.cells.iter().all(|c| c.phase == Phase::Headline));
    }

    #[test]
    fn qemu_reaches_the_cluster_ucrypt_does() {
        let c = Cluster {
            cfg: RbdConfig {
                conf: Some("/etc/x,y/ceph.conf".into()),
                id: Some("host7".into()),
                ..RbdConfig::default()
            },
            pool: "vols".into(),
        };
        assert_eq!(
            c.qsd_blockdev("img"),
            "driver=rbd,node-name=disk0,pool=vols,image=img,conf=/etc/x,,y/ceph.conf,user=host7"
        );
        let d = Cluster {
            cfg: RbdConfig::default(),
            pool: "rbd".into(),
        };
        assert_eq!(
            d.qsd_blockdev("i"),
            "driver=rbd,node-name=disk0,pool=rbd,image=i,user=admin"
        );
        assert_eq!(mode_args(Mode::InlineRead)[2], "--perf-no_read_workqueue");
        assert_eq!(mode_args(Mode::Adaptive), ["--mode", "adaptive"]);
    }
}
