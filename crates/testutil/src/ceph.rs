//! The throwaway single-node Ceph cluster of the RBD tests
//! (`scripts/ceph-test-cluster.sh`), one home for the backend's and the
//! cli's RBD tests.
//!
//! Two ways to get one:
//!
//! - **Shared**: when [`SHARED_ENV`] names the `ceph.conf` of a cluster the
//!   script started (scripts/test.sh starts one for the whole suite), a
//!   [`Cluster`] attaches to it and makes its own pool there, removed when
//!   dropped, so test binaries never see each other's images. The cluster
//!   is whatever the starter made (bluestore, so an OSD restart keeps the
//!   data); the [`Store`] asked for is ignored.
//! - **Own**: otherwise (a test binary run alone) it starts a cluster in a
//!   temp dir and stops it (its tracked daemons only) when dropped; its
//!   pool is the script's `rbd`.
//!
//! [`Cluster::for_binary`] hands every test of one binary the same handle,
//! so a binary run alone starts one cluster however many tests use it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::TempDir;

/// The environment variable naming a running shared cluster's ceph.conf
/// (in the directory `ceph-test-cluster.sh start DIR` was given).
pub const SHARED_ENV: &str = "UCRYPT_CEPH_CONF";

/// The OSD's object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// In memory, of this many bytes: fast, lost when the OSD stops.
    Memstore(u64),
    /// The script's default, bluestore on a sparse file: survives an OSD
    /// restart (the fault tests stop and start it).
    Bluestore,
}

/// A running test cluster (shared or this handle's own) and this
/// handle's pool on it.
#[allow(missing_debug_implementations)]
pub struct Cluster {
    /// ceph.conf of this cluster (names its admin keyring).
    pub conf: PathBuf,
    /// The pool this handle's images go in.
    pub pool: String,
    /// The script's DIR of the cluster.
    cluster_dir: PathBuf,
    /// Attached to a shared cluster (else started by this handle).
    shared: bool,
    /// `osd-stop` ran without a later `osd-start`: restarted on drop.
    osd_down: AtomicBool,
    dir: TempDir,
}

/// `scripts/ceph-test-cluster.sh` in this repository.
pub fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-test-cluster.sh")
}

impl Cluster {
    /// The shared cluster (with a new pool on it) when [`SHARED_ENV`] is
    /// set, else a new cluster under a temp dir named after `tag` (about
    /// half a minute); panics with the script's output when it fails,
    /// after stopping whatever did start.
    pub fn start(tag: &str, store: Store) -> Self {
        let dir = TempDir::new(tag);
        match std::env::var_os(SHARED_ENV).filter(|v| !v.is_empty()) {
            Some(conf) => Self::attach(PathBuf::from(conf), tag, dir),
            None => Self::start_own(dir, store),
        }
    }

    /// One handle for every test of this binary that asks while another
    /// still holds it: the first caller starts (or attaches), the others
    /// wait for it and share it; the last one to drop it stops it.
    pub fn for_binary(tag: &str, store: Store) -> Arc<Self> {
        static ONE: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
        let mut one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = one.upgrade() {
            return c;
        }
        let c = Arc::new(Self::start(tag, store));
        *one = Arc::downgrade(&c);
        c
    }

    fn start_own(dir: TempDir, store: Store) -> Self {
        let mut cmd = Command::new("bash");
        cmd.arg(cluster_script()).arg("start").arg(dir.join("ceph"));
        if let Store::Memstore(bytes) = store {
            cmd.env("CEPH_TEST_OBJECTSTORE", "memstore")
                .env("CEPH_TEST_OSD_BYTES", bytes.to_string());
        }
        let o = cmd.output().expect("run ceph-test-cluster.sh");
        let cluster = Self {
            conf: dir.join("ceph").join("ceph.conf"),
            pool: "rbd".into(),
            cluster_dir: dir.join("ceph"),
            shared: false,
            osd_down: AtomicBool::new(false),
            dir,
        };
        assert!(
            o.status.success(),
            "ceph-test-cluster.sh start failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            cluster.conf.display().to_string(),
            "the script prints its ceph.conf"
        );
        cluster
    }

    fn attach(conf: PathBuf, tag: &str, dir: TempDir) -> Self {
        assert!(
            conf.is_file(),
            "{SHARED_ENV}={} names no ceph.conf",
            conf.display()
        );
        let cluster_dir = conf.parent().expect("ceph.conf has a directory").into();
        // Unique among the binaries (and their reruns) sharing the cluster.
        let pool = format!("{tag}-{}", std::process::id());
        let c = Self {
            conf,
            pool: pool.clone(),
            cluster_dir,
            shared: true,
            osd_down: AtomicBool::new(false),
            dir,
        };
        c.script_args("pool-create", &[&pool]);
        c
    }

    /// `POOL/NAME`: an image of this handle's pool, as `rbd` names it.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}", self.pool)
    }

    /// `rbd:POOL/NAME`: an image of this handle's pool, as ucrypt names it.
    pub fn device(&self, name: &str) -> String {
        format!("rbd:{}/{name}", self.pool)
    }

    /// A path in the test's scratch dir (next to, not inside, the cluster).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `bash scripts/ceph-test-cluster.sh VERB DIR` (e.g. `osd-stop`),
    /// asserting success. After `osd-stop`, dropping the handle starts the
    /// OSD again if the test did not (a shared cluster outlives the test).
    pub fn script(&self, verb: &str) -> Output {
        self.script_args(verb, &[])
    }

    fn script_args(&self, verb: &str, args: &[&str]) -> Output {
        let o = crate::run_cmd(
            Command::new("bash")
                .arg(cluster_script())
                .arg(verb)
                .arg(&self.cluster_dir)
                .args(args),
        );
        match verb {
            "osd-stop" => self.osd_down.store(true, Ordering::SeqCst),
            "osd-start" => self.osd_down.store(false, Ordering::SeqCst),
            _ => {}
        }
        o
    }

    /// `rbd -c CONF ARGS`, asserting success.
    pub fn rbd(&self, args: &[&str]) -> Output {
        crate::run_cmd(Command::new("rbd").arg("-c").arg(&self.conf).args(args))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = |verb: &str, args: &[&str]| {
            let _ = Command::new("bash")
                .arg(cluster_script())
                .arg(verb)
                .arg(&self.cluster_dir)
                .args(args)
                .output();
        };
        if !self.shared {
            script("stop", &[]);
            return;
        }
        if self.osd_down.load(Ordering::SeqCst) {
            script("osd-start", &[]);
        }
        script("pool-rm", &[&self.pool]);
    }
}
