//! `ucrypt reencrypt --active-name`: a served LUKS2 volume reencrypted
//! while a verifying writer keeps doing random writes and reads through
//! NBD (or the FUSE file), every read checked against a model of what was
//! written; afterwards the plaintext equals the model, cryptsetup accepts
//! the header and the volume key changed. `close` mid-way leaves a volume
//! that `open` serves and `reencrypt --active-name` finishes. The crash
//! matrix kills the daemon (`kill -9`) at seeded random points of the run
//! and at the crash hook's write counts: every write the writer saw
//! acknowledged reads back intact through `ucrypt map --luks`, and
//! `ucrypt reencrypt --resume-only` (and, for a sample, cryptsetup's)
//! finishes it. `UCRYPT_CRASH_POINTS` raises the number of points (100 by
//! default).

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

use crate::nbd_client::NbdClient;

#[path = "reencrypt_online_dshift.rs"]
mod dshift;
#[path = "reencrypt_online_size.rs"]
mod size;
#[path = "reencrypt_online_status.rs"]
mod status;

/// Data area of the test volumes (the LUKS2 header takes 16 MiB before it).
const DATA: u64 = 16 << 20;
const HEADER: u64 = 16 << 20;
const PASS: &[u8] = b"online passphrase";

/// A LUKS2 image with a served name, in a directory of its own (its own
/// runtime dir).
struct Vol {
    dir: TempDir,
    img: PathBuf,
    key: PathBuf,
    name: String,
}

impl Vol {
    /// A fast LUKS2 volume (ucrypt's format, pbkdf2 1000 iterations)
    /// filled with seeded plaintext; returns it and the plaintext.
    fn new(tag: &str, base: &Path, seed: u64) -> (Self, Vec<u8>) {
        Self::formatted(tag, base, seed, &[])
    }

    /// [`Vol::new`] with `extra` luksFormat options.
    fn formatted(tag: &str, base: &Path, seed: u64, extra: &[&str]) -> (Self, Vec<u8>) {
        let dir = TempDir::new_in(base, tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let img = dir.join("img");
        let key = dir.join("key");
        std::fs::write(&key, PASS).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(HEADER + DATA)
            .unwrap();
        let v = Vol {
            dir,
            img,
            key,
            name: "v".into(),
        };
        let mut args: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
        let (k, i) = (v.key.to_str().unwrap(), v.img.to_str().unwrap());
        args.extend_from_slice(extra);
        args.extend(["--key-file", k, i]);
        ok(v.ucrypt(&args), "luksFormat");
        let mut plain = vec![0u8; DATA as usize];
        Rng::new(seed).fill(&mut plain);
        v.write_plain(&plain);
        (v, plain)
    }

    /// A volume sharing `other`'s image bytes (copied), in a new dir.
    fn copy_of(other: &Vol, tag: &str, base: &Path) -> Vol {
        let dir = TempDir::new_in(base, tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let img = dir.join("img");
        let key = dir.join("key");
        std::fs::copy(&other.img, &img).unwrap();
        std::fs::write(&key, PASS).unwrap();
        Vol {
            dir,
            img,
            key,
            name: "v".into(),
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(ucrypt_bin());
        c.args(args).env("UCRYPT_RUNTIME_DIR", self.dir.join("run"));
        c
    }

    fn ucrypt(&self, args: &[&str]) -> Output {
        self.cmd(args).stdin(Stdio::null()).output().unwrap()
    }

    fn k(&self) -> &str {
        self.key.to_str().unwrap()
    }

    fn i(&self) -> &str {
        self.img.to_str().unwrap()
    }

    fn write_plain(&self, plain: &[u8]) {
        let mut c = self
            .cmd(&["map", "--write", "--luks", self.i(), "--key-file", self.k()])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(plain).unwrap();
        assert!(c.wait().unwrap().success());
    }

    /// The plaintext through `ucrypt map --luks` (which repairs a torn
    /// hotzone first).
    fn read_plain(&self) -> Vec<u8> {
        let o = ok(
            self.ucrypt(&["map", "--read", "--luks", self.i(), "--key-file", self.k()]),
            "map --luks",
        );
        o.stdout
    }

    fn open(&self, extra: &[&str]) {
        let mut args = vec!["open", "--key-file", self.k()];
        args.extend_from_slice(extra);
        args.extend([self.i(), self.name.as_str()]);
        ok(self.ucrypt(&args), "open");
    }

    fn close(&self) {
        ok(self.ucrypt(&["close", &self.name]), "close");
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run").join(format!("{}.nbd.sock", self.name))
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("run").join(format!("{}.pid", self.name)))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// `reencrypt --active-name` in the background.
    fn reencrypt_online(&self, extra: &[&str]) -> Child {
        let mut args = vec![
            "reencrypt",
            "-q",
            "--active-name",
            "v",
            "--key-file",
            self.k(),
        ];
        args.extend_from_slice(extra);
        self.cmd(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn status(&self) -> Option<Value> {
        let o = self.ucrypt(&["status", "--json", &self.name]);
        serde_json::from_slice(&o.stdout).ok()
    }

    /// Whether the primary header's JSON (up to its first NUL) names the
    /// reencryption requirement.
    fn in_reencryption(&self) -> bool {
        in_reencryption_at(&self.img)
    }
}

impl Vol {
    /// `cryptsetup reencrypt --resume-only --force-offline-reencrypt` of
    /// this volume.
    fn cryptsetup_resume(&self) -> Output {
        Command::new("cryptsetup")
            .args([
                "reencrypt",
                "-q",
                "--resume-only",
                "--force-offline-reencrypt",
                "--key-file",
            ])
            .arg(&self.key)
            .arg(&self.img)
            .output()
            .unwrap()
    }

    /// The header's segments and the reencryption keyslot's resilience
    /// (for a failure message).
    fn status_of_header(&self) -> String {
        let mut json = vec![0u8; 12 << 10];
        if std::fs::File::open(&self.img)
            .and_then(|f| f.read_exact_at(&mut json, 4096))
            .is_err()
        {
            return "unreadable".into();
        }
        let end = json.iter().position(|&b| b == 0).unwrap_or(json.len());
        let Ok(v) = serde_json::from_slice::<Value>(&json[..end]) else {
            return "not JSON".into();
        };
        let rs = v["keyslots"]
            .as_object()
            .and_then(|k| k.values().find(|k| k["type"] == "reencrypt"))
            .map(|k| k["area"].to_string());
        format!("segments {}, reencrypt area {rs:?}", v["segments"])
    }
}

/// Whether the primary header's JSON in `hdr` (up to its first NUL)
/// names the reencryption requirement.
fn in_reencryption_at(hdr: &Path) -> bool {
    let mut json = vec![0u8; 12 << 10];
    std::fs::File::open(hdr)
        .unwrap()
        .read_exact_at(&mut json, 4096)
        .unwrap();
    let end = json.iter().position(|&b| b == 0).unwrap_or(json.len());
    String::from_utf8_lossy(&json[..end]).contains("online-reencrypt")
}

impl Drop for Vol {
    fn drop(&mut self) {
        if let Some(pid) = self.pid().filter(|&p| serves(p, &self.img)) {
            let _ = self.ucrypt(&["close", &self.name]);
            kill_daemon(pid, &self.img);
        }
    }
}

fn ok(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn wait_child(c: Child, what: &str) -> Output {
    ok(c.wait_with_output().unwrap(), what)
}

/// Where the images live: /dev/shm when it is a tmpfs (syncs cost
/// nothing there), else the temp dir.
pub(crate) fn base() -> PathBuf {
    if testutil::Capability::ShmTmpfs.missing().is_none() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// A block device's three operations, as the verifying writer needs them.
pub(crate) trait Dev {
    fn write(&mut self, off: u64, data: &[u8]) -> std::io::Result<()>;
    fn read(&mut self, off: u64, len: usize) -> std::io::Result<Vec<u8>>;
    fn flush(&mut self) -> std::io::Result<()>;
}

impl Dev for NbdClient {
    fn write(&mut self, off: u64, data: &[u8]) -> std::io::Result<()> {
        NbdClient::write(self, off, data, false)
    }

    fn read(&mut self, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
        NbdClient::read(self, off, len)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        NbdClient::flush(self)
    }
}

/// An NBD client of `v`'s export, which is [`DATA`] bytes.
fn nbd(v: &Vol) -> NbdClient {
    let c = NbdClient::connect(&v.socket()).unwrap();
    assert_eq!(c.size, DATA);
    c
}

impl Dev for std::fs::File {
    fn write(&mut self, off: u64, data: &[u8]) -> std::io::Result<()> {
        self.write_all_at(data, off)
    }

    fn read(&mut self, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, off)?;
        Ok(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
}

/// What the verifying writer saw: the model of the plaintext (every
/// acknowledged write applied), the write in flight when the device went
/// away (it may or may not have landed), the operations done, and the
/// first read that disagreed with the model.
pub(crate) struct Seen {
    pub(crate) model: Vec<u8>,
    inflight: Option<(u64, Vec<u8>)>,
    pub(crate) ops: u64,
    pub(crate) mismatch: Option<String>,
}

/// Random writes (4 KiB aligned, 4–64 KiB) and reads checked against the
/// model, a FLUSH after every 8, until `stop` or the device fails.
fn verifying_writer(dev: &mut dyn Dev, mut model: Vec<u8>, seed: u64, stop: &AtomicBool) -> Seen {
    let mut rng = Rng::new(seed);
    let blocks = model.len() as u64 / 4096;
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..8 {
            let n = 1 + rng.below(16);
            let off = rng.below(blocks - n) * 4096;
            let len = (n * 4096) as usize;
            let at = off as usize;
            if rng.below(10) < 6 {
                let data = rng.bytes(len);
                if dev.write(off, &data).is_err() {
                    return Seen {
                        model,
                        inflight: Some((off, data)),
                        ops,
                        mismatch: None,
                    };
                }
                model[at..at + len].copy_from_slice(&data);
            } else {
                match dev.read(off, len) {
                    Ok(got) if got != model[at..at + len] => {
                        let first = got
                            .iter()
                            .zip(&model[at..at + len])
                            .position(|(a, b)| a != b)
                            .unwrap_or(0);
                        return Seen {
                            model,
                            inflight: None,
                            ops,
                            mismatch: Some(format!(
                                "read at {} differs from the model",
                                off + first as u64
                            )),
                        };
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            ops += 1;
        }
        if dev.flush().is_err() {
            break;
        }
    }
    Seen {
        model,
        inflight: None,
        ops,
        mismatch: None,
    }
}

/// Every 512-byte sector of `got` outside the write in flight is the
/// model's: the first that is not, if any. The write in flight when the
/// daemon died was never acknowledged, and its range may hold anything:
/// old bytes, new ones, or a sector torn part-way (a killed process's
/// write to a file stops at any byte, as an aborted write leaves a
/// disk's blocks indeterminate).
fn lost_write(got: &[u8], seen: &Seen) -> Option<u64> {
    assert_eq!(got.len(), seen.model.len());
    let inflight = |at: u64| {
        seen.inflight
            .as_ref()
            .is_some_and(|(off, d)| at >= *off && at < off + d.len() as u64)
    };
    got.chunks(512)
        .zip(seen.model.chunks(512))
        .enumerate()
        .map(|(i, (g, m))| (i as u64 * 512, g == m))
        .find(|&(at, same)| !same && !inflight(at))
        .map(|(at, _)| at)
}

fn volume_key(img: &Path, key: &Path) -> Vec<u8> {
    let o = ok(
        Command::new("cryptsetup")
            .args(["luksDump", "--dump-volume-key", "-q", "--key-file"])
            .arg(key)
            .arg(img)
            .output()
            .unwrap(),
        "luksDump --dump-volume-key",
    );
    testutil::volume_key_from_dump(&String::from_utf8_lossy(&o.stdout))
}

/// The writer on its own thread over a device `connect` makes.
pub(crate) fn start_writer<D: Dev + Send + 'static>(
    dev: D,
    model: Vec<u8>,
    seed: u64,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<Seen>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let mut dev = dev;
    let t = std::thread::spawn(move || verifying_writer(&mut dev, model, seed, &s));
    (stop, t)
}

/// Online under a writer through `dev`, then the checks of the header and
/// the key.
fn online_under_writer(test: &str, fuse: bool) {
    if !require_tool(test, "cryptsetup") {
        return;
    }
    if fuse && !testutil::require(test, testutil::Capability::DevFuse) {
        return;
    }
    let (v, plain) = Vol::new(test, &base(), 0x0a11);
    let old_key = volume_key(&v.img, &v.key);
    if fuse {
        v.open(&["--export", "fuse"]);
    } else {
        v.open(&[]);
    }
    let (stop, writer) = if fuse {
        let file = v.dir.join("run").join("v.fuse").join("v");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        start_writer(f, plain, 7)
    } else {
        start_writer(nbd(&v), plain, 7)
    };
    let t0 = Instant::now();
    let out = wait_child(
        v.reencrypt_online(&["--hotzone-size", "1M", "--progress-frequency", "1"]),
        "reencrypt --active-name",
    );
    let took = t0.elapsed();
    let st = v.status().expect("status");
    let r = &st["reencryption"];
    assert_eq!(r["finished"], true, "{st}");
    assert_eq!(r["done"], DATA, "{st}");
    assert!(
        st["targets"].as_array().is_none(),
        "one target at the end: {st}"
    );
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
    assert!(seen.ops > 0, "the writer did IO");
    eprintln!(
        "{test}: {} writer ops during {took:?}, longest hold {} us, {} hotzones; {}",
        seen.ops,
        r["max_hold_us"],
        r["hotzones"],
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
    );
    v.close();
    assert_eq!(v.read_plain(), seen.model, "plaintext after close");
    assert!(!v.in_reencryption());
    ok(
        Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&v.key)
            .arg(&v.img)
            .output()
            .unwrap(),
        "cryptsetup open --test-passphrase",
    );
    assert_ne!(
        volume_key(&v.img, &v.key),
        old_key,
        "the volume key changed"
    );
}

#[test]
fn online_reencryption_under_a_verifying_nbd_writer() {
    online_under_writer("online_reencryption_under_a_verifying_nbd_writer", false);
}

#[test]
fn online_reencryption_under_a_verifying_fuse_writer() {
    online_under_writer("online_reencryption_under_a_verifying_fuse_writer", true);
}

#[test]
fn close_midway_then_open_continues() {
    let (v, plain) = Vol::new("close_midway", &base(), 0xc105e);
    v.open(&[]);
    let (stop, writer) = start_writer(nbd(&v), plain, 11);
    // Slow enough to be caught in the middle.
    let child = v.reencrypt_online(&["--hotzone-size", "1M", "--rate", "8"]);
    testutil::wait_until(Duration::from_secs(60), "two hotzones", || {
        v.status()
            .is_some_and(|s| s["reencryption"]["hotzones"].as_u64() >= Some(2))
    });
    // Pause and resume answer with the progress.
    let o = ok(
        v.ucrypt(&["reencrypt", "--active-name", "v", "--pause"]),
        "pause",
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("paused"));
    ok(
        v.ucrypt(&["reencrypt", "--active-name", "v", "--resume", "--rate", "8"]),
        "resume",
    );
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
    v.close();
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success(), "the watcher ends with the close");
    assert!(v.in_reencryption(), "stopped mid-way");
    assert_eq!(v.read_plain(), seen.model, "plaintext mid-way");
    // Served again (new key below the point, old above), continued online.
    v.open(&[]);
    let st = v.status().unwrap();
    assert_eq!(st["targets"].as_array().map(Vec::len), Some(2), "{st}");
    let (stop, writer) = start_writer(nbd(&v), seen.model, 13);
    wait_child(v.reencrypt_online(&[]), "continue online");
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
    v.close();
    assert!(!v.in_reencryption());
    assert_eq!(v.read_plain(), seen.model, "plaintext at the end");
}

/// One crash point: `hook` (the crash hook's write count) or a kill
/// after `delay`. Returns whether a lost write was found (with where).
fn crash_point(
    template: &Vol,
    plain: &[u8],
    i: u64,
    hook: Option<u64>,
    delay: Duration,
    cryptsetup: bool,
) -> Result<(), String> {
    let v = Vol::copy_of(template, &format!("crash{i}"), &base());
    let mut open = v.cmd(&["open", "--key-file", v.k(), v.i(), "v"]);
    if let Some(n) = hook {
        open.env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string());
    }
    let o = ok(open.stdin(Stdio::null()).output().unwrap(), "open");
    // The pid `open` printed: "... (pid N)".
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    let pid: i32 = line
        .rsplit_once("(pid ")
        .and_then(|(_, p)| p.trim().trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("point {i}: no pid in {line:?}"));
    if !serves(pid, &v.img) {
        return Err(format!(
            "point {i}: the daemon {pid} is gone right after open (pid file: {:?})",
            v.pid()
        ));
    }
    let (stop, writer) = start_writer(nbd(&v), plain.to_vec(), 100 + i);
    let child = v.reencrypt_online(&["--hotzone-size", "256K", "--rate", "64"]);
    if hook.is_none() {
        std::thread::sleep(delay);
        kill_daemon(pid, &v.img);
    }
    let _ = child.wait_with_output();
    // A crash hook past the run's last write: the daemon is still there.
    kill_daemon(pid, &v.img);
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    if let Some(m) = seen.mismatch {
        return Err(format!("point {i}: {m}"));
    }
    testutil::wait_until(Duration::from_secs(30), "the killed daemon", || {
        !serves(pid, &v.img)
    });
    // The kernel lets go of a killed process's files after it is gone from
    // /proc: a multi-threaded exit and io_uring's ring teardown finish
    // asynchronously. Until then the image is (rightly) in use.
    testutil::wait_until(Duration::from_secs(30), "the killed daemon's lock", || {
        !locked(&v.img)
    });
    let copy = cryptsetup.then(|| Vol::copy_of(&v, &format!("crash{i}cs"), &base()));
    let got = v.read_plain();
    if let Some(at) = lost_write(&got, &seen) {
        let bad = got
            .chunks(512)
            .zip(seen.model.chunks(512))
            .filter(|(g, m)| g != m)
            .count();
        let inflight = seen.inflight.as_ref().map(|(off, d)| (*off, d.len()));
        return Err(format!(
            "point {i} ({hook:?}, {delay:?}): byte {at} lost an acknowledged write \
             ({bad} sectors differ from the model; the write in flight (offset, length): \
             {inflight:?}; {} writer ops; header: {})",
            seen.ops,
            v.status_of_header()
        ));
    }
    if v.in_reencryption() {
        ok(
            v.ucrypt(&[
                "reencrypt",
                "-q",
                "--resume-only",
                "--key-file",
                v.k(),
                v.i(),
            ]),
            "reencrypt --resume-only",
        );
    }
    if v.read_plain() != got {
        return Err(format!("point {i}: the plaintext changed when finished"));
    }
    if let Some(c) = copy {
        if c.in_reencryption() {
            // cryptsetup 2.6.1 repairs a torn hotzone with `repair` first.
            ok(
                Command::new("cryptsetup")
                    .args(["repair", "-q", "--key-file"])
                    .arg(&c.key)
                    .arg(&c.img)
                    .output()
                    .unwrap(),
                "cryptsetup repair",
            );
            ok(c.cryptsetup_resume(), "cryptsetup reencrypt --resume-only");
        }
        if c.read_plain() != got {
            return Err(format!("point {i}: cryptsetup's finish differs"));
        }
    }
    Ok(())
}

/// Whether process `pid` is (still) a ucrypt serving `img`.
fn serves(pid: i32, img: &Path) -> bool {
    // The detached daemon's argv names only the volume (`serve --spec-stdin
    // v`, the same name in every lane): it is the one holding `img` open.
    let real = std::fs::canonicalize(img).unwrap_or_else(|_| img.to_path_buf());
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == img || t == real))
    })
}

/// Whether any process (or a killed one's leftover io_uring) holds a
/// POSIX, OFD or flock lock on `img`, from /proc/locks
/// ("N: OFDLCK ADVISORY WRITE -1 MAJ:MIN:INODE 0 EOF").
pub(crate) fn locked(img: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(img) else {
        return false;
    };
    let dev = m.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let id = format!("{major:02x}:{minor:02x}:{}", m.ino());
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().any(|w| w == id))
}

/// `kill -9 pid` if it is still the daemon serving `img` (a pid freed by
/// a crash may already be another lane's).
fn kill_daemon(pid: i32, img: &Path) {
    if serves(pid, img) {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
}

#[test]
fn crash_matrix_kill_9_under_a_verifying_writer() {
    let points: u64 = std::env::var("UCRYPT_CRASH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let cryptsetup = testutil::which("cryptsetup").is_some();
    // One template per lane: the lanes run at once, and a reencryption
    // (ucrypt's or cryptsetup's) holds a lock per volume UUID
    // (/run/cryptsetup/LN_LUKS2-reencryption-UUID), which copies of one
    // image would share.
    let lanes = 4;
    let templates: Vec<(Vol, Vec<u8>)> = (0..lanes)
        .map(|l| Vol::new(&format!("crash_template{l}"), &base(), 0xc4a5 + l))
        .collect();
    let (template, plain) = &templates[0];
    // One clean run: how long the reencryption takes and how many writes
    // its crash points count, to spread the kills over.
    let t = Vol::copy_of(template, "crash_clean", &base());
    t.open(&[]);
    let t0 = Instant::now();
    wait_child(
        t.reencrypt_online(&["--hotzone-size", "256K", "--rate", "64"]),
        "clean run",
    );
    let span = t0.elapsed();
    t.close();
    assert_eq!(&t.read_plain(), plain);
    // 64 hotzones of 256 KiB: a checksum write, the hotzone's header
    // (two copies), the data, the header past it (two copies).
    let writes = (DATA / (256 << 10)) * 6;
    let mut rng = Rng::new(testutil::rng::base_seed() ^ 0xdead);
    let plan: Vec<(u64, Option<u64>, Duration)> = (0..points)
        .map(|i| {
            if i % 2 == 0 {
                (i, Some(1 + rng.below(writes)), Duration::ZERO)
            } else {
                let ms = rng.below(span.as_millis() as u64 + 1);
                (i, None, Duration::from_millis(ms))
            }
        })
        .collect();
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..lanes)
            .map(|lane| {
                let plan = &plan;
                let (template, plain) = &templates[lane as usize];
                s.spawn(move || {
                    plan.iter()
                        .filter(|(i, ..)| i % lanes == lane)
                        .filter_map(|&(i, hook, delay)| {
                            crash_point(template, plain, i, hook, delay, cryptsetup && i % 10 == 0)
                                .err()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    eprintln!(
        "crash matrix: {points} points ({} by the crash hook, {} by a kill after a delay up to {span:?}) in {:?}, seed base {}",
        points.div_ceil(2),
        points / 2,
        started.elapsed(),
        testutil::rng::base_seed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// cryptsetup's reencryption lock (`/run/cryptsetup/LN_LUKS2-reencryption-
/// UUID`, an exclusive `flock`) is the one ucrypt takes: while another
/// process holds it ucrypt refuses to move the data, with cryptsetup's
/// message and exit code, and writes nothing; while a ucrypt daemon
/// reencrypts online, cryptsetup refuses in turn.
#[test]
fn the_reencryption_lock_is_cryptsetups() {
    let test = "the_reencryption_lock_is_cryptsetups";
    if !require_tool(test, "cryptsetup")
        || !require_tool(test, "flock")
        || !testutil::require(test, testutil::Capability::Root)
    {
        return;
    }
    let (v, plain) = Vol::new(test, &base(), 0x10c4);
    ok(
        v.ucrypt(&["reencrypt", "-q", "--init-only", "--key-file", v.k(), v.i()]),
        "reencrypt --init-only",
    );
    let uuid = ok(
        Command::new("cryptsetup")
            .arg("luksUUID")
            .arg(&v.img)
            .output()
            .unwrap(),
        "cryptsetup luksUUID",
    );
    let lock = PathBuf::from(format!(
        "/run/cryptsetup/LN_LUKS2-reencryption-{}",
        String::from_utf8_lossy(&uuid.stdout).trim()
    ));
    std::fs::create_dir_all("/run/cryptsetup").unwrap();
    // Whether someone holds it, read from /proc/locks: a probe that took
    // the lock itself, however briefly, would make the daemon's
    // non-blocking attempt fail.
    let held = || locked(&lock);

    // Another process holds it: ucrypt refuses, the image is untouched.
    let mut holder = Command::new("flock")
        .args(["-x", "-o"])
        .arg(&lock)
        .args(["sleep", "120"])
        .spawn()
        .unwrap();
    testutil::wait_until(Duration::from_secs(30), "flock to hold the lock", held);
    let before = std::fs::read(&v.img).unwrap();
    let o = v.ucrypt(&[
        "reencrypt",
        "-q",
        "--resume-only",
        "--key-file",
        v.k(),
        v.i(),
    ]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Reencryption process is already running."),
        "{o:?}"
    );
    assert!(
        std::fs::read(&v.img).unwrap() == before,
        "the image changed"
    );

    // A daemon reencrypts online (slowly): cryptsetup refuses to resume
    // the same reencryption meanwhile.
    v.open(&[]);
    let mut child = v.reencrypt_online(&["--hotzone-size", "256K", "--rate", "0.5"]);
    let t0 = Instant::now();
    while !held() {
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("reencrypt --active-name ended early ({st}): {err}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the daemon did not take the lock in 30 s; status {:?}",
            v.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // cryptsetup reads the header more than once before it asks for the
    // lock; a hotzone the daemon finishes in between makes it refuse with
    // "Detected attempt for concurrent LUKS2 metadata update." (exit 1).
    // A refusal too, but not the one checked here: ask again while the
    // daemon still holds the lock.
    let mut o = v.cryptsetup_resume();
    for _ in 0..20 {
        let raced = o.status.code() == Some(1)
            && String::from_utf8_lossy(&o.stderr).contains("concurrent LUKS2 metadata update");
        if !raced {
            break;
        }
        assert!(
            held(),
            "the daemon let go of the lock before cryptsetup asked"
        );
        o = v.cryptsetup_resume();
    }
    ok(
        v.ucrypt(&["reencrypt", "-q", "--active-name", "v", "--rate", "0"]),
        "reencrypt --rate 0",
    );
    wait_child(child, "reencrypt --active-name");
    v.close();
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Reencryption process is already running."),
        "{o:?}"
    );
    assert!(!v.in_reencryption());
    assert!(v.read_plain() == plain, "the plaintext changed");
    // The lock is let go at the end, and its file removed (as cryptsetup
    // removes it).
    assert!(!held());
    assert!(!lock.exists(), "{} left behind", lock.display());
}

/// `reencrypt --active-name` of a served volume with three keyslots asks
/// the passphrase of each (stdin, one a line, as cryptsetup reads them)
/// and renews every one: afterwards each opens the volume with cryptsetup
/// and ucrypt, the key changed and the plaintext is intact. A wrong
/// passphrase for the second keyslot is refused first, the image
/// unchanged.
#[test]
fn online_renews_every_keyslot() {
    let test = "reencrypt_online_keyslots";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let (v, plain) = Vol::new(test, &base(), 0x5107);
    let passes: [&[u8]; 3] = [
        PASS,
        b"second online passphrase",
        b"third online passphrase",
    ];
    for p in &passes[1..] {
        let nk = v.dir.join("new-key");
        std::fs::write(&nk, p).unwrap();
        ok(
            Command::new("cryptsetup")
                .args([
                    "luksAddKey",
                    "-q",
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    "--key-file",
                    v.k(),
                    v.i(),
                ])
                .arg(&nk)
                .output()
                .unwrap(),
            "luksAddKey",
        );
    }
    let old_key = volume_key(&v.img, &v.key);
    v.open(&[]);
    let stdin_of = |lines: &[&[u8]]| {
        let mut s = Vec::new();
        for l in lines {
            s.extend_from_slice(l);
            s.push(b'\n');
        }
        s
    };
    let reencrypt = |input: Vec<u8>| {
        let mut c = v
            .cmd(&["reencrypt", "-q", "--active-name", "v"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(&input).unwrap();
        c.wait_with_output().unwrap()
    };
    let before = std::fs::read(&v.img).unwrap();
    let out = reencrypt(stdin_of(&[passes[0], b"wrong", passes[2]]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No key available with this passphrase."),
        "{out:?}"
    );
    assert!(std::fs::read(&v.img).unwrap() == before, "nothing written");
    ok(reencrypt(stdin_of(&passes)), "reencrypt --active-name");
    let st = v.status().expect("status");
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    v.close();
    assert!(!v.in_reencryption());
    for p in passes {
        let k = v.dir.join("try-key");
        std::fs::write(&k, p).unwrap();
        ok(
            Command::new("cryptsetup")
                .args(["open", "--test-passphrase", "--key-file"])
                .arg(&k)
                .arg(&v.img)
                .output()
                .unwrap(),
            "cryptsetup open --test-passphrase",
        );
        let back = ok(
            v.ucrypt(&[
                "map",
                "--read",
                "--luks",
                v.i(),
                "--key-file",
                k.to_str().unwrap(),
            ]),
            "map --luks",
        );
        assert!(back.stdout == plain, "plaintext through each passphrase");
    }
    assert_ne!(volume_key(&v.img, &v.key), old_key, "the key changed");
}

/// A resume with `--active-name` given another `--resilience` switches
/// it before the data moves again, as cryptsetup's resume does: the
/// header's reencrypt keyslot carries the new mode (and its digest holds:
/// cryptsetup finishes the run), the daemon moves under it, and the data
/// ends intact. `none` is refused online with nothing written.
#[test]
fn online_resume_switches_the_resilience() {
    let test = "reencrypt_online_resilience";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let (v, plain) = Vol::new(test, &base(), 0x5108);
    v.open(&[]);
    wait_child(v.reencrypt_online(&["--init-only"]), "init-only");
    assert!(
        v.status_of_header().contains("checksum"),
        "{}",
        v.status_of_header()
    );
    let before = std::fs::read(&v.img).unwrap();
    let out = v
        .reencrypt_online(&["--resume-only", "--resilience", "none"])
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("checksum or journal"),
        "{out:?}"
    );
    assert!(std::fs::read(&v.img).unwrap() == before, "nothing written");
    // Switched, and caught mid-way (slow enough) to see it move under
    // the new mode.
    let child = v.reencrypt_online(&[
        "--resume-only",
        "--resilience",
        "journal",
        "--hotzone-size",
        "1M",
        "--rate",
        "4",
    ]);
    testutil::wait_until(Duration::from_secs(60), "a hotzone moved", || {
        v.status()
            .is_some_and(|s| s["reencryption"]["hotzones"].as_u64() >= Some(1))
    });
    let st = v.status().unwrap();
    assert_eq!(st["reencryption"]["resilience"], "journal", "{st}");
    assert!(
        v.status_of_header().contains("journal"),
        "{}",
        v.status_of_header()
    );
    v.close();
    let _ = child.wait_with_output().unwrap();
    assert!(v.in_reencryption(), "stopped mid-way");
    // cryptsetup accepts the switched metadata (its digest) and finishes.
    let o = v.cryptsetup_resume();
    assert!(o.status.success(), "cryptsetup resume: {o:?}");
    assert!(!v.in_reencryption());
    assert_eq!(v.read_plain(), plain, "plaintext at the end");
}
