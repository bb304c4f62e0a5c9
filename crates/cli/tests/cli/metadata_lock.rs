//! LUKS metadata locking, as cryptsetup's: a header verb waits while
//! another process holds the `flock` of the header file, or of a block
//! device's `/run/cryptsetup/L_MAJOR:MINOR` (a cryptsetup reading or
//! writing the header), and `--disable-locks` does not wait.
//! The holder is util-linux's `flock`, the call cryptsetup makes; where
//! cryptsetup is installed, the test also checks that it waits for such a
//! holder, the behaviour the interlock with ucrypt rests on.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testutil::TempDir;

const U1: &str = "11111111-2222-3333-4444-555555555555";
const U2: &str = "66666666-7777-8888-9999-000000000000";
const U3: &str = "12345678-9abc-def0-1234-56789abcdef0";

/// Holds an exclusive `flock` on `img` (util-linux `flock -o`: the lock
/// stays with the `flock` process) until dropped.
struct Holder(Child);

impl Holder {
    fn take(img: &Path) -> Self {
        let child = Command::new("flock")
            .args(["-x", "-o"])
            .arg(img)
            .args(["sleep", "120"])
            .spawn()
            .expect("spawn flock");
        // Held once a non-blocking shared lock is refused.
        let start = Instant::now();
        while Command::new("flock")
            .args(["-n", "-s"])
            .arg(img)
            .arg("true")
            .status()
            .unwrap()
            .success()
        {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "flock never held"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ucrypt(args: &[&str]) -> Command {
    let mut c = Command::new(testutil::ucrypt_bin());
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn uuid_of(img: &str) -> String {
    testutil::run_ok(testutil::ucrypt_bin().to_str().unwrap(), &["luksUUID", img])
        .trim()
        .to_string()
}

/// Runs `cmd`, checks it is still waiting after a second, releases
/// `holder`, and checks it then succeeds.
fn waits_for(mut cmd: Command, holder: Holder) {
    let mut child = cmd.spawn().expect("spawn");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        child.try_wait().unwrap().is_none(),
        "{cmd:?} did not wait for the lock"
    );
    drop(holder);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A 20 MiB image file in `dir`.
fn image(dir: &TempDir) -> std::path::PathBuf {
    let img = dir.join("v.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    img
}

/// LUKS2-formats `target` with the passphrase "pw" (a key file in `dir`).
fn format(dir: &TempDir, target: &str) {
    let key = dir.join("key");
    std::fs::write(&key, "pw").unwrap();
    let o = ucrypt(testutil::FAST_LUKS2_FORMAT)
        .args(["--key-file", key.to_str().unwrap(), target])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Sets `target`'s UUID to `uuid` with `extra` options while `holder`
/// holds a lock, checking it did not wait for that lock.
fn written_despite(holder: Holder, extra: &[&str], uuid: &str, target: &str) {
    let o = ucrypt(extra)
        .args(["luksUUID", "-q", "--uuid", uuid, target])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(holder);
    assert_eq!(uuid_of(target), uuid);
}

/// Where cryptsetup is installed: its luksUUID on `target` waits for a
/// holder of `lock`, then lands (the interlock with ucrypt rests on it).
fn cryptsetup_waits_for(tag: &str, lock: &Path, target: &str) {
    if testutil::require_tool(tag, "cryptsetup") {
        let mut cs = Command::new("cryptsetup");
        cs.args(["luksUUID", "-q", "--uuid", U3, target])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        waits_for(cs, Holder::take(lock));
        assert_eq!(uuid_of(target), U3);
    }
}

#[test]
fn header_verbs_wait_for_the_metadata_lock_unless_locks_are_disabled() {
    if !testutil::require_tool("metadata-lock", "flock") {
        return;
    }
    let dir = TempDir::new("metadata-lock");
    let img = image(&dir);
    let img_s = img.to_str().unwrap();
    format(&dir, img_s);

    // --disable-locks: written at once, under the holder's nose.
    written_despite(Holder::take(&img), &["--disable-locks"], U1, img_s);

    // Locked: the write waits for the holder, then lands.
    waits_for(
        ucrypt(&["luksUUID", "-q", "--uuid", U2, img_s]),
        Holder::take(&img),
    );
    assert_eq!(uuid_of(img_s), U2);
    // So does a read (luksDump), as cryptsetup's.
    waits_for(ucrypt(&["luksDump", img_s]), Holder::take(&img));

    // cryptsetup waits for the same lock: ucrypt's exclusive lock while it
    // writes keeps cryptsetup out, as cryptsetup's keeps ucrypt out.
    cryptsetup_waits_for("metadata-lock-cryptsetup", &img, img_s);
}

#[test]
fn a_block_device_is_locked_where_cryptsetup_locks_it() {
    use std::os::unix::fs::MetadataExt;
    const T: &str = "metadata-lock-bdev";
    if !testutil::require_all(
        T,
        &[
            testutil::Capability::Tool("flock"),
            testutil::Capability::Tool("losetup"),
            testutil::Capability::LoopDevices,
            testutil::Capability::Root,
        ],
    ) {
        return;
    }
    let dir = TempDir::new(T);
    let Some(lo) = testutil::LoopDevice::attach(T, &image(&dir), &[]) else {
        return;
    };
    let dev = lo.path();
    format(&dir, dev);

    // cryptsetup's lock file for the device: /run/cryptsetup/L_MAJOR:MINOR.
    // (glibc's encoding of a dev_t; the directory as cryptsetup makes it.)
    let rdev = std::fs::metadata(dev).unwrap().rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let run = Path::new("/run/cryptsetup");
    let _ =
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(run);
    let lock = run.join(format!("L_{major}:{minor}"));

    // A write and a read wait for whoever holds that file's lock.
    waits_for(
        ucrypt(&["luksUUID", "-q", "--uuid", U1, dev]),
        Holder::take(&lock),
    );
    assert_eq!(uuid_of(dev), U1);
    waits_for(ucrypt(&["luksDump", dev]), Holder::take(&lock));
    // And, as cryptsetup, the last one out removes the file.
    assert!(!lock.exists(), "{} left behind", lock.display());
    // Not the device node's lock: a holder there does not stop a header write.
    written_despite(Holder::take(Path::new(dev)), &[], U2, dev);

    // cryptsetup waits for the same file.
    cryptsetup_waits_for("metadata-lock-bdev-cryptsetup", &lock, dev);
}
