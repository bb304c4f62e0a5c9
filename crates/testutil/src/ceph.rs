//! The throwaway single-node Ceph cluster of the RBD tests
//! (`scripts/ceph-test-cluster.sh`): started in a temp dir, stopped (its
//! tracked daemons only) when dropped. One home for the backend's and the
//! cli's RBD tests, which each start one per test binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::TempDir;

/// The OSD's object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// In memory, of this many bytes: fast, lost when the OSD stops.
    Memstore(u64),
    /// The script's default, bluestore on a sparse file: survives an OSD
    /// restart (the fault tests stop and start it).
    Bluestore,
}

/// A running test cluster.
#[allow(missing_debug_implementations)]
pub struct Cluster {
    /// ceph.conf of this cluster (names its admin keyring).
    pub conf: PathBuf,
    dir: TempDir,
}

/// `scripts/ceph-test-cluster.sh` in this repository.
pub fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-test-cluster.sh")
}

impl Cluster {
    /// Starts a cluster under a new temp dir named after `tag` (about half
    /// a minute); panics with the script's output when it fails, after
    /// stopping whatever did start.
    pub fn start(tag: &str, store: Store) -> Self {
        let dir = TempDir::new(tag);
        let mut cmd = Command::new("bash");
        cmd.arg(cluster_script()).arg("start").arg(dir.join("ceph"));
        if let Store::Memstore(bytes) = store {
            cmd.env("CEPH_TEST_OBJECTSTORE", "memstore")
                .env("CEPH_TEST_OSD_BYTES", bytes.to_string());
        }
        let o = cmd.output().expect("run ceph-test-cluster.sh");
        let cluster = Self {
            conf: dir.join("ceph").join("ceph.conf"),
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

    /// A path in the test's scratch dir (next to, not inside, the cluster).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `bash scripts/ceph-test-cluster.sh VERB DIR` (e.g. `osd-stop`),
    /// asserting success.
    pub fn script(&self, verb: &str) -> Output {
        checked(
            Command::new("bash")
                .arg(cluster_script())
                .arg(verb)
                .arg(self.dir.join("ceph")),
        )
    }

    /// `rbd -c CONF ARGS`, asserting success.
    pub fn rbd(&self, args: &[&str]) -> Output {
        checked(Command::new("rbd").arg("-c").arg(&self.conf).args(args))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(cluster_script())
            .arg("stop")
            .arg(self.dir.join("ceph"))
            .output();
    }
}

fn checked(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}
