//! `rbd:POOL/IMAGE[@SNAP]` devices (issue 13) against a throwaway
//! single-node Ceph cluster (scripts/ceph-test-cluster.sh, started once for
//! this binary and stopped at its end): format, dump, add-key, open with an
//! NBD export and IO through nbdcopy, the exclusive lock (a second
//! read-write open exits 5), snapshots read-only; and a cluster that does
//! not answer fails the open within its bound.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use testutil::ceph::{Cluster, Store};
use testutil::{Capability, Rng, TempDir};

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const LIBRBD: &str = "/usr/lib/x86_64-linux-gnu/librbd.so.1";

/// Started for this binary (one test uses it; testutil's cluster, stopped
/// on drop); `None` after a logged skip when the Ceph packages are missing.
fn cluster(test: &str) -> Option<Cluster> {
    let tools = ["ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "nbdcopy"];
    let caps: Vec<Capability<'_>> = tools.iter().map(|t| Capability::Tool(t)).collect();
    if !testutil::require_all(test, &caps) {
        return None;
    }
    Some(Cluster::start("rbd-cluster", Store::Memstore(1 << 30)))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Ucrypt {
    dir: TempDir,
    conf: PathBuf,
    opened: Vec<String>,
}

impl Ucrypt {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(testutil::ucrypt_bin())
            .args(args)
            .arg("--ceph-conf")
            .arg(&self.conf)
            .env("UCRYPT_RUNTIME_DIR", self.dir.join("run"))
            .stdin(Stdio::null())
            .output()
            .expect("run ucrypt")
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "ucrypt {args:?}: {}", text(&o.stderr));
        text(&o.stdout)
    }

    fn open(&mut self, args: &[&str], name: &str) {
        let mut a = vec!["open"];
        a.extend_from_slice(args);
        a.push(name);
        self.ok(&a);
        self.opened.push(name.into());
    }

    fn close(&mut self, name: &str) {
        self.ok(&["close", name]);
        self.opened.retain(|n| n != name);
    }

    fn uri(&self, name: &str) -> String {
        let sock = self.dir.join("run").join(format!("{name}.nbd.sock"));
        format!("nbd+unix:///?socket={}", sock.display())
    }
}

impl Drop for Ucrypt {
    fn drop(&mut self) {
        for n in std::mem::take(&mut self.opened) {
            let _ = self.run(&["close", &n]);
        }
    }
}

fn nbdcopy(from: &str, to: &str) {
    let o = Command::new("nbdcopy").arg(from).arg(to).output().unwrap();
    assert!(
        o.status.success(),
        "nbdcopy {from} {to}: {}",
        text(&o.stderr)
    );
}

#[test]
fn luks_on_rbd_format_dump_add_key_open_lock_and_snapshot() {
    let test = "luks_on_rbd_format_dump_add_key_open_lock_and_snapshot";
    let Some(c) = cluster(test) else { return };

    c.rbd(&["create", "--size", "32M", "rbd/vol"]);
    let mut u = Ucrypt {
        dir: TempDir::new("rbd-luks"),
        conf: c.conf.clone(),
        opened: Vec::new(),
    };
    let pass = u.dir.join("pass");
    let pass2 = u.dir.join("pass2");
    std::fs::write(&pass, b"first passphrase").unwrap();
    std::fs::write(&pass2, b"second passphrase").unwrap();
    let (p, p2) = (pass.to_str().unwrap(), pass2.to_str().unwrap());

    // format, dump (the same text as for the image exported to a file)
    let mut a = vec!["format", "--type", "luks2", "-q", "-d", p];
    a.extend_from_slice(FAST);
    a.push("rbd:rbd/vol");
    u.ok(&a);
    let dump = u.ok(&["dump", "rbd:rbd/vol"]);
    assert!(dump.contains("Version:       \t2"), "{dump}");
    let exported = u.dir.join("exported.img");
    c.rbd(&["export", "rbd/vol", exported.to_str().unwrap()]);
    let file_dump = u.ok(&["dump", exported.to_str().unwrap()]);
    assert_eq!(
        dump, file_dump,
        "dump of rbd: differs from the exported image's"
    );

    // add-key: slot 1 then opens the volume
    let mut a = vec!["add-key", "-d", p];
    a.extend_from_slice(FAST);
    a.extend_from_slice(&["rbd:rbd/vol", p2]);
    u.ok(&a);
    assert!(u.ok(&["dump", "rbd:rbd/vol"]).contains("  1: luks2"));

    // open with the new key, write and read back through NBD
    u.open(
        &["--type", "luks", "-d", p2, "--export", "nbd", "rbd:rbd/vol"],
        "v",
    );
    let mut data = vec![0u8; 4 << 20];
    Rng::new(13).fill(&mut data);
    let src = u.dir.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    nbdcopy(src.to_str().unwrap(), &u.uri("v"));
    let back = u.dir.join("back.bin");
    nbdcopy(&u.uri("v"), back.to_str().unwrap());
    let back_data = std::fs::read(&back).unwrap();
    assert_eq!(&back_data[..data.len()], &data[..], "read back differs");

    // a second read-write user is refused with exit 5: open and add-key
    let o = u.run(&[
        "open",
        "--type",
        "luks",
        "-d",
        p,
        "--export",
        "nbd",
        "rbd:rbd/vol",
        "w",
    ]);
    assert_eq!(o.status.code(), Some(5), "second open: {}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("rbd:rbd/vol"),
        "{}",
        text(&o.stderr)
    );
    assert!(
        !text(&o.stderr).contains("passphrase"),
        "{}",
        text(&o.stderr)
    );
    let o = u.run(&["add-key", "-d", p, "rbd:rbd/vol", p2]);
    assert_eq!(
        o.status.code(),
        Some(5),
        "add-key while open: {}",
        text(&o.stderr)
    );
    u.close("v");

    // snapshot: read-only, keeps the data written before it
    c.rbd(&["snap", "create", "rbd/vol@s1"]);
    let o = u.run(&["open", "--type", "luks", "-d", p, "rbd:rbd/vol@s1", "rw"]);
    assert!(!o.status.success(), "a snapshot opened read-write");
    assert!(text(&o.stderr).contains("read-only"), "{}", text(&o.stderr));
    u.open(
        &["--type", "luks", "-d", p, "--readonly", "rbd:rbd/vol@s1"],
        "snap",
    );
    let snap = u.dir.join("snap.bin");
    nbdcopy(&u.uri("snap"), snap.to_str().unwrap());
    let snap_data = std::fs::read(&snap).unwrap();
    assert_eq!(&snap_data[..data.len()], &data[..], "snapshot read differs");
    u.close("snap");

    // map reads through the engine; header backup and restore round-trip
    let o = u.run(&["map", "--read", "--luks", "rbd:rbd/vol", "--key-file", p]);
    assert!(o.status.success(), "map --read: {}", text(&o.stderr));
    assert_eq!(&o.stdout[..data.len()], &data[..], "map --read differs");
    let before = u.ok(&["dump", "rbd:rbd/vol"]);
    let backup = u.dir.join("hdr.bak");
    let b = backup.to_str().unwrap();
    u.ok(&["header-backup", "rbd:rbd/vol", "--header-backup-file", b]);
    u.ok(&[
        "header-restore",
        "-q",
        "rbd:rbd/vol",
        "--header-backup-file",
        b,
    ]);
    assert_eq!(before, u.ok(&["dump", "rbd:rbd/vol"]), "dump after restore");

    // errors name the image, never a key
    let o = u.run(&["dump", "rbd:rbd/missing"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("rbd:rbd/missing"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn unanswering_cluster_fails_the_open_within_its_bound() {
    let test = "unanswering_cluster_fails_the_open_within_its_bound";
    if !Path::new(LIBRBD).exists() && !testutil::skip(test, "librbd1 is not installed") {
        return;
    }
    let dir = TempDir::new("rbd-bogus");
    // A monitor address nobody listens on, and a 3 s bound.
    let conf = dir.join("ceph.conf");
    std::fs::write(
        &conf,
        "[global]\nmon host = 127.0.0.1:9\nauth client required = none\n\
         client mount timeout = 3\nlog to stderr = false\n",
    )
    .unwrap();
    let started = Instant::now();
    let mut child = Command::new(testutil::ucrypt_bin())
        .args(["dump", "rbd:rbd/vol", "--ceph-conf"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Generous: the bound is 3 s; a hang would never end.
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("no answer after 120 s with a 3 s connect bound");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(err.contains("rbd:rbd/vol"), "{err}");
    assert!(err.contains("did not answer within 3 s"), "{err}");
}
