//! `rbd:POOL/IMAGE[@SNAP]` devices against a throwaway
//! single-node Ceph cluster (testutil::ceph: the suite's shared one, or
//! one started once for this binary and stopped at its end): format, dump,
//! add-key, open with an NBD export and IO through nbdcopy, the exclusive
//! lock (a second read-write open exits 5), snapshots read-only; a live
//! `resize` after `rbd resize` of the open image; and a cluster that does
//! not answer fails the open within its bound.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testutil::ceph::{Cluster, Store};
use testutil::{Capability, Rng, TempDir};

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const LIBRBD: &str = "/usr/lib/x86_64-linux-gnu/librbd.so.1";

/// This binary's cluster, shared by its tests (testutil's: stopped, or its
/// pool removed, when the last test drops it); `None` after a logged skip
/// when the Ceph packages or NBD tools are missing.
fn cluster(test: &str) -> Option<Arc<Cluster>> {
    let tools = [
        "ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "nbdcopy", "nbdinfo", "qemu-io",
    ];
    let caps: Vec<Capability<'_>> = tools.iter().map(|t| Capability::Tool(t)).collect();
    if !testutil::require_all(test, &caps) {
        return None;
    }
    Some(Cluster::for_binary("rbd-cluster", Store::Memstore(1 << 30)))
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

    let (img, dev) = (c.image("vol"), c.device("vol"));
    let (snap_img, snap_dev) = (format!("{img}@s1"), format!("{dev}@s1"));
    let missing = c.device("missing");
    c.rbd(&["create", "--size", "32M", &img]);
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
    a.push(&dev);
    u.ok(&a);
    let dump = u.ok(&["dump", &dev]);
    assert!(dump.contains("Version:       \t2"), "{dump}");
    let exported = u.dir.join("exported.img");
    c.rbd(&["export", &img, exported.to_str().unwrap()]);
    let file_dump = u.ok(&["dump", exported.to_str().unwrap()]);
    assert_eq!(
        dump, file_dump,
        "dump of rbd: differs from the exported image's"
    );

    // add-key: slot 1 then opens the volume
    let mut a = vec!["add-key", "-d", p];
    a.extend_from_slice(FAST);
    a.extend_from_slice(&[&dev, p2]);
    u.ok(&a);
    assert!(u.ok(&["dump", &dev]).contains("  1: luks2"));

    // open with the new key, write and read back through NBD
    u.open(&["--type", "luks", "-d", p2, "--export", "nbd", &dev], "v");
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
        "open", "--type", "luks", "-d", p, "--export", "nbd", &dev, "w",
    ]);
    assert_eq!(o.status.code(), Some(5), "second open: {}", text(&o.stderr));
    assert!(text(&o.stderr).contains(&dev), "{}", text(&o.stderr));
    assert!(
        !text(&o.stderr).contains("passphrase"),
        "{}",
        text(&o.stderr)
    );
    let o = u.run(&["add-key", "-d", p, &dev, p2]);
    assert_eq!(
        o.status.code(),
        Some(5),
        "add-key while open: {}",
        text(&o.stderr)
    );
    u.close("v");

    // close releases the image at once: `close` returns after the daemon
    // has exited, and it drops its backend (rbd_close) before exiting, so
    // no watcher or exclusive lock is left for the cluster's timeout (~30 s)
    let status = text(&c.rbd(&["status", &img]).stdout);
    assert!(status.contains("Watchers: none"), "after close: {status}");
    let locks = text(&c.rbd(&["lock", "ls", &img]).stdout);
    assert!(locks.trim().is_empty(), "after close: {locks}");

    // snapshot: read-only, keeps the data written before it
    c.rbd(&["snap", "create", &snap_img]);
    let o = u.run(&["open", "--type", "luks", "-d", p, &snap_dev, "rw"]);
    assert!(!o.status.success(), "a snapshot opened read-write");
    assert!(text(&o.stderr).contains("read-only"), "{}", text(&o.stderr));
    u.open(
        &["--type", "luks", "-d", p, "--readonly", &snap_dev],
        "snap",
    );
    let snap = u.dir.join("snap.bin");
    nbdcopy(&u.uri("snap"), snap.to_str().unwrap());
    let snap_data = std::fs::read(&snap).unwrap();
    assert_eq!(&snap_data[..data.len()], &data[..], "snapshot read differs");
    u.close("snap");

    // map reads through the engine; header backup and restore round-trip
    let o = u.run(&["map", "--read", "--luks", &dev, "--key-file", p]);
    assert!(o.status.success(), "map --read: {}", text(&o.stderr));
    assert_eq!(&o.stdout[..data.len()], &data[..], "map --read differs");
    let before = u.ok(&["dump", &dev]);
    let backup = u.dir.join("hdr.bak");
    let b = backup.to_str().unwrap();
    u.ok(&["header-backup", &dev, "--header-backup-file", b]);
    u.ok(&["header-restore", "-q", &dev, "--header-backup-file", b]);
    assert_eq!(before, u.ok(&["dump", &dev]), "dump after restore");

    // errors name the image, never a key
    let o = u.run(&["dump", &missing]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains(&missing), "{}", text(&o.stderr));
}

/// `nbdinfo --size`: the size a new NBD connection is told.
fn nbd_size(uri: &str) -> u64 {
    let o = Command::new("nbdinfo")
        .args(["--size", uri])
        .output()
        .unwrap();
    assert!(o.status.success(), "nbdinfo {uri}: {}", text(&o.stderr));
    text(&o.stdout).trim().parse().unwrap()
}

/// `qemu-io -f raw -c CMD... URI`, asserting success (a `read -P` that
/// finds other bytes fails it).
fn qemu_io(uri: &str, cmds: &[&str]) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let o = c.arg(uri).output().unwrap();
    let out = text(&o.stdout);
    assert!(
        o.status.success() && !out.contains("failed") && !out.contains("Pattern verification"),
        "qemu-io {cmds:?}: {out}{}",
        text(&o.stderr)
    );
}

#[test]
fn rbd_resize_of_an_open_image_grows_the_mapping_on_resize() {
    let test = "rbd_resize_of_an_open_image_grows_the_mapping_on_resize";
    let Some(c) = cluster(test) else { return };
    let (img, dev) = (c.image("grow"), c.device("grow"));
    c.rbd(&["create", "--size", "24M", &img]);
    let mut u = Ucrypt {
        dir: TempDir::new("rbd-grow"),
        conf: c.conf.clone(),
        opened: Vec::new(),
    };
    let pass = u.dir.join("pass");
    std::fs::write(&pass, b"grow passphrase").unwrap();
    let p = pass.to_str().unwrap();
    let mut a = vec!["format", "--type", "luks2", "-q", "-d", p];
    a.extend_from_slice(FAST);
    a.push(&dev);
    u.ok(&a);
    u.open(&["--type", "luks", "-d", p, "--export", "nbd", &dev], "g");
    let uri = u.uri("g");
    let sectors = |u: &Ucrypt| -> u64 {
        let s: serde_json::Value = serde_json::from_str(&u.ok(&["status", "--json", "g"])).unwrap();
        s["size_sectors"].as_u64().expect("size_sectors")
    };
    let before = sectors(&u);
    assert_eq!(nbd_size(&uri), before * 512);
    let old_end = before * 512;
    qemu_io(&uri, &["write -P 0x5a 0 4096"]);

    // Grown by the cluster while ucrypt holds the image's exclusive lock
    // (librbd asks the lock owner, ucrypt's daemon, to do it).
    c.rbd(&["resize", "--size", "40M", &img]);
    assert_eq!(sectors(&u), before, "the mapping grows on `resize` only");
    u.ok(&["resize", "g"]);
    let after = sectors(&u);
    assert_eq!(
        after,
        before + (16 << 20) / 512,
        "all the grown image holds"
    );
    assert!(u
        .ok(&["status", "g"])
        .contains(&format!("\n  size:    {after} sectors\n")));
    assert_eq!(nbd_size(&uri), after * 512, "a new NBD client's size");
    let end = after * 512 - 4096;
    qemu_io(
        &uri,
        &[
            &format!("write -P 0x33 {end} 4096"),
            &format!("write -P 0x44 {old_end} 4096"),
            &format!("read -P 0x33 {end} 4096"),
            "read -P 0x5a 0 4096",
        ],
    );
    u.close("g");

    // On the image for the next user: a fresh open sees the grown volume.
    let o = u.run(&["map", "--read", "--luks", &dev, "--key-file", p]);
    assert!(o.status.success(), "map --read: {}", text(&o.stderr));
    assert_eq!(o.stdout.len() as u64, after * 512);
    assert!(o.stdout[..4096].iter().all(|&b| b == 0x5a));
    let at = old_end as usize;
    assert!(o.stdout[at..at + 4096].iter().all(|&b| b == 0x44));
    assert!(o.stdout[end as usize..].iter().all(|&b| b == 0x33));
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
