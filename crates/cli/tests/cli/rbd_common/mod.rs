//! Shared helpers for the Ceph RBD tests: a throwaway single-node cluster
//! (`scripts/ceph-test-cluster.sh`, stopped on drop), the `rbd` CLI, and
//! librbd's own LUKS encryption driven through qemu's rbd driver
//! (`encrypt.format=luks|luks2`), the independent peer ucrypt must agree with.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use testutil::{ceph, Capability};

/// Runs a command, panicking with its output on failure.
pub use testutil::run_cmd as run;

/// Checks what the RBD tests need (the Ceph daemons and CLI, qemu with its
/// rbd driver); false (after a logged skip) when something is missing.
pub fn require_ceph(test: &str) -> bool {
    let tools = [
        "ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "qemu-img", "qemu-io", "python3",
    ];
    if !testutil::require_all(test, &tools.map(Capability::Tool)) {
        return false;
    }
    let help = Command::new("qemu-img").arg("--help").output();
    let has_rbd = help.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .any(|w| w == "rbd")
    });
    has_rbd || testutil::skip(test, "qemu-img has no rbd driver (qemu-block-extra)")
}

/// librbd encryption formats, as `rbd encryption format` and qemu name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Luks {
    /// LUKS1 (`rbd … luks1`, qemu `encrypt.format=luks`).
    V1,
    /// LUKS2 (`rbd … luks2`, qemu `encrypt.format=luks2`).
    V2,
}

impl Luks {
    /// The `rbd encryption format` word.
    pub fn rbd(self) -> &'static str {
        match self {
            Luks::V1 => "luks1",
            Luks::V2 => "luks2",
        }
    }
    /// qemu's `encrypt.format` value.
    pub fn qemu(self) -> &'static str {
        match self {
            Luks::V1 => "luks",
            Luks::V2 => "luks2",
        }
    }
}

/// The tests' cluster (bluestore: it survives the fault test's OSD
/// restart), with the rbd, qemu and librbd-encryption helpers below; the
/// cluster itself is testutil's (the suite's shared one with a pool of this
/// binary's, or one started by `scripts/ceph-test-cluster.sh` and stopped
/// on drop). Images are named within [`ceph::Cluster::pool`].
pub struct Cluster(ceph::Cluster);

impl std::ops::Deref for Cluster {
    type Target = ceph::Cluster;
    fn deref(&self) -> &ceph::Cluster {
        &self.0
    }
}

impl Cluster {
    /// Attaches to the shared cluster or starts one (about half a minute);
    /// panics with the script's output when it fails.
    pub fn start(tag: &str) -> Self {
        Self(ceph::Cluster::start(tag, ceph::Store::Bluestore))
    }

    /// `rbd -c CONF ARGS`, asserting success; its stdout.
    pub fn rbd(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.0.rbd(args).stdout).into_owned()
    }

    /// Creates `POOL/NAME` of `size` bytes.
    pub fn create(&self, name: &str, size: u64) {
        self.rbd(&["create", &self.image(name), "--size", &format!("{size}B")]);
    }

    /// `rbd export`: the raw (ciphertext) image into a fresh file.
    pub fn export(&self, name: &str, to: &Path) {
        let _ = std::fs::remove_file(to);
        let to = to.display().to_string();
        self.rbd(&["export", "--no-progress", &self.image(name), &to]);
    }

    /// `rbd import`: a raw file as the new image `POOL/NAME`.
    pub fn import(&self, from: &Path, name: &str) {
        let from = from.display().to_string();
        self.rbd(&["import", "--no-progress", &from, &self.image(name)]);
    }

    /// qemu `--image-opts` for `POOL/NAME` opened through librbd's encryption
    /// with the passphrase in the qemu secret `s0`.
    pub fn qemu_opts(&self, name: &str, luks: Luks) -> String {
        format!(
            "driver=rbd,pool={},image={name},conf={},user=admin,\
             encrypt.format={},encrypt.key-secret=s0",
            self.pool,
            self.conf.display(),
            luks.qemu()
        )
    }

    /// The plaintext size librbd's encryption exposes for `POOL/NAME`.
    pub fn librbd_size(&self, name: &str, luks: Luks, pass: &Path) -> u64 {
        let o = run(Command::new("qemu-img")
            .arg("info")
            .arg("--output=json")
            .arg("--object")
            .arg(secret(pass))
            .arg("--image-opts")
            .arg(self.qemu_opts(name, luks)));
        let text = String::from_utf8_lossy(&o.stdout);
        let key = "\"virtual-size\":";
        let at = text.find(key).expect("virtual-size in qemu-img info") + key.len();
        text[at..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a number after virtual-size")
    }

    /// Writes the file `plain` at offset 0 of `POOL/NAME` through librbd's
    /// encryption (qemu-img convert into the existing image).
    pub fn librbd_write(&self, name: &str, luks: Luks, pass: &Path, plain: &Path) {
        run(Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "--object"])
            .arg(secret(pass))
            .arg(plain)
            .arg("--target-image-opts")
            .arg(self.qemu_opts(name, luks)));
    }

    /// Reads the whole plaintext of `POOL/NAME` through librbd's encryption.
    /// (`qemu-img dd`, not `convert`: qemu 7.2's rbd block-status with
    /// encryption reports holes at ciphertext offsets, so `convert` skips
    /// data as zeros.)
    pub fn librbd_read(&self, name: &str, luks: Luks, pass: &Path) -> Vec<u8> {
        let out = self.scratch(&format!("{name}.librbd-read"));
        let _ = std::fs::remove_file(&out);
        run(Command::new("qemu-img")
            .args(["dd", "--object"])
            .arg(secret(pass))
            .args(["--image-opts", "-O", "raw", "bs=1M"])
            .arg(format!("if={}", self.qemu_opts(name, luks)))
            .arg(format!("of={}", out.display())));
        let data = std::fs::read(&out).expect("read qemu-img dd output");
        let _ = std::fs::remove_file(&out);
        data
    }
}

/// A qemu `--object secret` reading the passphrase file.
fn secret(pass: &Path) -> String {
    format!("secret,id=s0,file={}", pass.display())
}

/// `ucrypt ARGS` with `stdin` from a file (or nothing); asserts success.
pub fn ucrypt(args: &[&str], stdin: Option<&Path>) -> Output {
    let mut cmd = Command::new(testutil::ucrypt_bin());
    cmd.args(args);
    if let Some(p) = stdin {
        cmd.stdin(std::fs::File::open(p).expect("open stdin file"));
    }
    run(&mut cmd)
}
