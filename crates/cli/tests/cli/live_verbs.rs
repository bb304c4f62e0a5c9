//! The verbs that act on an open volume, checked as cryptsetup behaves on
//! a dm-crypt mapping: `resize` (live; `--size`, `--device-size`, default
//! all the device holds; clients see the new size, nothing is written
//! past it), `luksSuspend`/`luksResume` (IO waits, the key is wiped,
//! resume asks for the passphrase again, LUKS only), `status`/`list
//! --json`, and `-v`/`--debug` on every verb (side by side with
//! cryptsetup where it can run without device-mapper).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use testutil::TempDir;

const MIB: u64 = 1 << 20;
/// cryptsetup's default LUKS2 data offset, in 512-byte sectors.
const OFFSET: u64 = 32768;

struct Vol {
    dir: TempDir,
    image: PathBuf,
    pass: PathBuf,
    name: String,
}

impl Vol {
    /// A LUKS2 volume by cryptsetup (16 MiB header, `data_mib` of data).
    fn luks(tag: &str, data_mib: u64, sector_size: u32) -> Self {
        let v = Self::blank(tag, 16 + data_mib);
        run(Command::new("cryptsetup")
            .args(["luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2"])
            .args(["--pbkdf-force-iterations", "1000", "--sector-size"])
            .arg(sector_size.to_string())
            .arg("--key-file")
            .arg(&v.pass)
            .arg(&v.image));
        v
    }

    fn blank(tag: &str, mib: u64) -> Self {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let image = dir.join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib * MIB)
            .unwrap();
        let pass = dir.join("pass");
        std::fs::write(&pass, "correct horse battery staple").unwrap();
        Self {
            dir,
            image,
            pass,
            name: format!("lv{}", std::process::id()),
        }
    }

    fn ucrypt(&self, args: &[&str]) -> Output {
        Command::new(testutil::ucrypt_bin())
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", self.dir.join("run"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs `ucrypt ARGS`, which must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.ucrypt(args);
        assert!(o.status.success(), "ucrypt {args:?}: {}", text(&o.stderr));
        text(&o.stdout)
    }

    /// Runs `ucrypt ARGS`, which must fail with `code`; returns stderr.
    fn fails(&self, code: i32, args: &[&str]) -> String {
        let o = self.ucrypt(args);
        assert_eq!(
            o.status.code(),
            Some(code),
            "ucrypt {args:?}: {}",
            text(&o.stderr)
        );
        text(&o.stderr)
    }

    fn open_luks(&self) {
        let (pass, image) = (
            self.pass.display().to_string(),
            self.image.display().to_string(),
        );
        self.ok(&["open", "--key-file", &pass, &image, &self.name]);
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["status", "--json", &self.name])).unwrap()
    }

    fn uri(&self) -> String {
        let sock = self.dir.join("run").join(format!("{}.nbd.sock", self.name));
        format!("nbd+unix:///?socket={}", sock.display())
    }

    /// The key field of `table --showkeys`.
    fn key(&self) -> String {
        let line = self.ok(&["table", "--showkeys", &self.name]);
        line.split_whitespace().nth(4).unwrap().to_owned()
    }
}

impl Drop for Vol {
    fn drop(&mut self) {
        let _ = self.ucrypt(&["close", &self.name]);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?}: {}", text(&o.stderr));
    o
}

/// `qemu-io` on the NBD export running `cmds` in one connection.
fn qemu_io(uri: &str, cmds: &[&str]) -> Command {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(uri);
    c
}

/// `nbdinfo --size`: the size a new connection is told.
fn nbd_size(uri: &str) -> u64 {
    let o = run(Command::new("nbdinfo").args(["--size", uri]));
    text(&o.stdout).trim().parse().unwrap()
}

fn tools(test: &str) -> bool {
    ["cryptsetup", "qemu-io", "nbdinfo"]
        .iter()
        .all(|t| testutil::require_tool(test, t))
}

/// Waits for `child` (bounded), returning its output.
fn finish(mut child: Child, what: &str) -> (bool, String) {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{what} never finished"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (child.wait().unwrap().success(), out)
}

#[test]
fn resize_shrinks_and_grows_live_and_clients_see_it() {
    let test = "resize_shrinks_and_grows_live_and_clients_see_it";
    if !tools(test) {
        return;
    }
    let v = Vol::luks("lv-resize", 8, 4096);
    v.open_luks();
    let uri = v.uri();
    assert_eq!(v.status()["size_sectors"], 16384);
    assert_eq!(nbd_size(&uri), 8 * MIB);
    // A client connected before the shrink keeps its size (NBD cannot
    // announce a new one): its write past the new end must fail and leave
    // the device untouched.
    let mut old = qemu_io(&uri, &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = old.stdin.take().unwrap();
    writeln!(stdin, "write -P 0x5a 0 4096").unwrap();
    let tail_at = ((OFFSET + 8192) * 512) as usize;
    // The first write has landed once the image holds ciphertext there.
    let t = Instant::now();
    while std::fs::read(&v.image).unwrap()[(OFFSET * 512) as usize..][..4096]
        .iter()
        .all(|&b| b == 0)
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "first write never landed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // Sector-size alignment and the device's end, as cryptsetup checks.
    let e = v.fails(1, &["resize", "--size", "8193", &v.name]);
    assert!(
        e.contains("Device size is not aligned to requested sector size."),
        "{e}"
    );
    let e = v.fails(1, &["resize", "--size", "16392", &v.name]);
    assert!(e.contains("is too small."), "{e}");
    let e = v.fails(1, &["resize", "--device-size", "1000", &v.name]);
    assert!(
        e.contains("Device size must be multiple of 512 bytes sector."),
        "{e}"
    );

    v.ok(&["resize", "--size", "8192", &v.name]);
    assert_eq!(v.status()["size_sectors"], 8192);
    assert!(v
        .ok(&["status", &v.name])
        .contains("\n  size:    8192 sectors\n"));
    assert_eq!(nbd_size(&uri), 4 * MIB);
    let before = std::fs::read(&v.image).unwrap()[tail_at..].to_vec();
    writeln!(stdin, "write -P 0x11 {} 4096", 8192 * 512).unwrap();
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let mut out = String::new();
    old.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    old.wait().unwrap();
    assert!(out.contains("write failed"), "{out}");
    assert_eq!(std::fs::read(&v.image).unwrap()[tail_at..], before[..]);

    // Grow the file, then resize without --size: all the device holds.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&v.image)
        .unwrap()
        .set_len(32 * MIB)
        .unwrap();
    v.ok(&["resize", &v.name]);
    assert_eq!(v.status()["size_sectors"], 32768);
    assert_eq!(nbd_size(&uri), 16 * MIB);
    let end = 16 * MIB - 4096;
    run(&mut qemu_io(
        &uri,
        &[
            &format!("write -P 0x33 {end} 4096"),
            &format!("read -P 0x33 {end} 4096"),
            "read -P 0x5a 0 4096",
        ],
    ));
    // --device-size is bytes: back to 4 MiB.
    v.ok(&["resize", "--device-size", &(4 * MIB).to_string(), &v.name]);
    assert_eq!(v.status()["size_sectors"], 8192);
    v.ok(&["close", &v.name]);
}

#[test]
fn resize_shows_in_the_fuse_file() {
    let test = "resize_shows_in_the_fuse_file";
    let fuse = [
        testutil::Capability::Tool("cryptsetup"),
        testutil::Capability::Tool("fusermount3"),
        testutil::Capability::DevFuse,
    ];
    if !testutil::require_all(test, &fuse) {
        return;
    }
    let v = Vol::luks("lv-fuse", 8, 512);
    let (pass, image) = (v.pass.display().to_string(), v.image.display().to_string());
    v.ok(&[
        "open",
        "--export",
        "fuse",
        "--key-file",
        &pass,
        &image,
        &v.name,
    ]);
    let file = v
        .dir
        .join("run")
        .join(format!("{}.fuse", v.name))
        .join(&v.name);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 8 * MIB);
    v.ok(&["resize", "--size", "2048", &v.name]);
    // The kernel caches the file's attributes for up to a second.
    let t = Instant::now();
    while std::fs::metadata(&file).unwrap().len() != MIB {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "FUSE file never shrank"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    v.ok(&["close", &v.name]);
}

#[test]
fn suspend_blocks_io_wipes_the_key_and_resume_asks_again() {
    let test = "suspend_blocks_io_wipes_the_key_and_resume_asks_again";
    if !tools(test) {
        return;
    }
    let v = Vol::luks("lv-suspend", 4, 512);
    v.open_luks();
    let uri = v.uri();
    run(&mut qemu_io(&uri, &["write -P 0x5a 0 65536"]));
    let key = v.key();
    assert!(key.chars().any(|c| c != '0'));

    v.ok(&["luksSuspend", &v.name]);
    let st = v.ok(&["status", &v.name]);
    assert!(st.contains("\n  mode:    read/write (suspended)\n"), "{st}");
    assert_eq!(v.status()["suspended"], true);
    // Wiped: the daemon's table keeps the key's length, not its bytes.
    assert_eq!(v.key(), "0".repeat(key.len()));
    let e = v.fails(1, &["suspend", &v.name]);
    assert!(
        e.contains(&format!("Volume {} is already suspended.", v.name)),
        "{e}"
    );

    // IO waits (neither fails nor completes) while suspended.
    let reader = qemu_io(&uri, &["read -P 0x5a 0 65536"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = Some(reader);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        reader.as_mut().unwrap().try_wait().unwrap().is_none(),
        "a read completed on a suspended volume"
    );

    // A wrong passphrase is refused (exit 2) and changes nothing.
    let wrong = v.dir.join("wrong");
    std::fs::write(&wrong, "not it").unwrap();
    v.fails(
        2,
        &[
            "luksResume",
            "--key-file",
            &wrong.display().to_string(),
            &v.name,
        ],
    );
    assert_eq!(v.status()["suspended"], true);

    let pass = v.pass.display().to_string();
    v.ok(&["resume", "--key-file", &pass, &v.name]);
    let (ok, out) = finish(reader.take().unwrap(), "the read held by suspend");
    assert!(ok && out.contains("read 65536/65536"), "{out}");
    assert_eq!(v.key(), key);
    assert_eq!(v.status()["suspended"], false);
    let e = v.fails(1, &["resume", "--key-file", &pass, &v.name]);
    assert!(
        e.contains(&format!("Volume {} is not suspended.", v.name)),
        "{e}"
    );

    // Closing a suspended volume works (cryptsetup: resume or close).
    v.ok(&["suspend", &v.name]);
    v.ok(&["close", &v.name]);
    v.fails(4, &["status", &v.name]);
}

#[test]
fn plain_volumes_refuse_suspend_and_resume_like_cryptsetup() {
    let test = "plain_volumes_refuse_suspend_and_resume_like_cryptsetup";
    if !testutil::require_tool(test, "cryptsetup") {
        return;
    }
    let v = Vol::blank("lv-plain", 4);
    let image = v.image.display().to_string();
    // Plain mode reads the key itself (32 bytes) from a key file.
    std::fs::write(&v.pass, [7u8; 32]).unwrap();
    let pass = v.pass.display().to_string();
    v.ok(&[
        "open",
        "--type",
        "plain",
        "--key-file",
        &pass,
        &image,
        &v.name,
    ]);
    let e = v.fails(1, &["luksSuspend", &v.name]);
    assert!(
        e.contains(&format!("Suspend is not supported for device {}.", v.name)),
        "{e}"
    );
    let e = v.fails(1, &["luksResume", "--key-file", &pass, &v.name]);
    assert!(
        e.contains("This operation is supported only for LUKS device."),
        "{e}"
    );

    // --json on status and list.
    let st = v.status();
    assert_eq!(st["schema"], 1);
    assert_eq!(st["volume_type"], "PLAIN");
    assert_eq!(st["cipher"], "aes-cbc-essiv:sha256");
    assert_eq!(st["suspended"], false);
    let list: serde_json::Value = serde_json::from_str(&v.ok(&["list", "--json"])).unwrap();
    assert_eq!(list["schema"], 1);
    assert_eq!(list["volumes"][0]["name"], v.name.as_str());
    assert_eq!(list["volumes"][0]["export"], "nbd");
    assert_eq!(list["volumes"][0]["answering"], true);

    // -v on a verb with no --verbose of its own, before or after it.
    for args in [["-v", "status", &v.name], ["status", "--verbose", &v.name]] {
        let out = v.ok(&args);
        assert_eq!(out.lines().last(), Some("Command successful."), "{out}");
        assert!(out.starts_with(&format!("{} is active", v.name)), "{out}");
    }
    let o = v.ucrypt(&["-v", "status", "nosuch"]);
    assert_eq!(o.status.code(), Some(4));
    assert_eq!(
        text(&o.stdout).lines().last(),
        Some("Command failed with code -4 (wrong device or file specified).")
    );
    let out = v.ok(&["--debug", "list"]);
    assert!(out.starts_with("# ucrypt "), "{out}");
    assert!(
        out.contains(" processing \"ucrypt --debug list\"\n"),
        "{out}"
    );
    assert_eq!(out.lines().last(), Some("Command successful."));
}

#[test]
fn verbose_closing_lines_match_cryptsetup() {
    let test = "verbose_closing_lines_match_cryptsetup";
    if !testutil::require_tool(test, "cryptsetup") {
        return;
    }
    let luks = Vol::luks("lv-verbose", 1, 512);
    let blank = Vol::blank("lv-verbose-blank", 1);
    let (l, b) = (
        luks.image.display().to_string(),
        blank.image.display().to_string(),
    );
    for (args, code) in [
        (["-v", "isLuks", &l], 0),
        (["isLuks", "-v", &l], 0),
        (["-v", "isLuks", &b], 1),
        (["--verbose", "luksUUID", &l], 0),
        (["--verbose", "luksUUID", &b], 1),
        (["-v", "luksDump", &l], 0),
        (["-v", "luksDump", &b], 1),
    ] {
        let theirs = Command::new("cryptsetup").args(args).output().unwrap();
        let ours = luks.ucrypt(&args);
        assert_eq!(theirs.status.code(), Some(code), "cryptsetup {args:?}");
        assert_eq!(
            ours.status.code(),
            Some(code),
            "ucrypt {args:?}: {}",
            text(&ours.stderr)
        );
        let last = |o: &Output| text(&o.stdout).lines().last().map(str::to_owned);
        assert_eq!(last(&ours), last(&theirs), "{args:?}");
    }
}
