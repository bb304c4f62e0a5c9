//! The runtime directory on a shared host: a directory another
//! user could write to, a symlink in its place or one planted under the
//! log file's name, and a control socket served by another uid are all
//! refused before anything is written or sent.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use testutil::TempDir;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

fn ucrypt(run: &Path, args: &[&str]) -> Output {
    Command::new(testutil::ucrypt_bin())
        .args(args)
        .env("UCRYPT_RUNTIME_DIR", run)
        .stdin(Stdio::null())
        .output()
        .expect("run ucrypt")
}

fn image(dir: &TempDir) -> PathBuf {
    let p = dir.join("vol.img");
    std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
    p
}

fn table(img: &Path) -> String {
    format!("0 2048 crypt aes-xts-plain64 {KEY} 0 {} 0", img.display())
}

/// `ucrypt open` (plain, NBD) of `img` as `name` in runtime dir `run`.
fn open(run: &Path, img: &Path, name: &str) -> Output {
    let t = table(img);
    ucrypt(
        run,
        &[
            "open",
            "--type",
            "plain",
            "--table",
            &t,
            img.to_str().unwrap(),
            name,
        ],
    )
}

fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// An insecure runtime dir must be refused with exit 2, a message naming
/// it, and nothing created in it.
fn assert_refused(run: &Path, img: &Path, why: &str) {
    let before = entries(run);
    let o = open(run, img, "v");
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() {
        let _ = ucrypt(run, &["close", "v"]);
    }
    assert_eq!(o.status.code(), Some(2), "open: {err}");
    assert!(
        err.contains("Refusing insecure runtime directory") && err.contains(why),
        "{err}"
    );
    assert_eq!(entries(run), before, "nothing may be written");
    let o = ucrypt(run, &["status", "v"]);
    assert_eq!(o.status.code(), Some(2), "status: {:?}", o);
    // `list` says so too, rather than listing nothing.
    let o = ucrypt(run, &["list"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "list: {o:?}");
    assert!(
        err.contains("Refusing insecure runtime directory") && err.contains(why),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "list: {o:?}");
}

#[test]
fn list_of_a_missing_runtime_dir_is_empty() {
    let dir = TempDir::new("rt-none");
    let o = ucrypt(&dir.join("none"), &["list"]);
    assert!(o.status.success(), "{o:?}");
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{o:?}");
}

#[test]
fn world_writable_runtime_dir_is_refused() {
    let dir = TempDir::new("rt-0777");
    let img = image(&dir);
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_refused(&run, &img, "mode 0777");
}

#[test]
fn runtime_dir_owned_by_another_user_is_refused() {
    let dir = TempDir::new("rt-owner");
    let img = image(&dir);
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let other = 65534;
    if !testutil::is_root() || std::os::unix::fs::chown(&run, Some(other), None).is_err() {
        // Only root can give a directory away.
        testutil::skip_or_fail(
            "runtime_dir_owned_by_another_user_is_refused",
            "cannot chown (not root)",
        );
        return;
    }
    assert_refused(&run, &img, &format!("owned by uid {other}"));
}

#[test]
fn symlinked_runtime_dir_is_refused() {
    let dir = TempDir::new("rt-symlink");
    let img = image(&dir);
    let real = dir.join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = dir.join("run");
    std::os::unix::fs::symlink(&real, &run).unwrap();
    assert_refused(&run, &img, "symbolic link");
    assert!(entries(&real).is_empty());
}

#[test]
fn planted_log_symlink_is_not_followed() {
    let dir = TempDir::new("rt-logsym");
    let img = image(&dir);
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, run.join("v.log")).unwrap();

    let o = open(&run, &img, "v");
    let closed = ucrypt(&run, &["close", "v"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(closed.status.success(), "{closed:?}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
}

#[test]
fn control_socket_of_another_uid_is_not_talked_to() {
    let dir = TempDir::new("rt-peer");
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A directory the other user can bind its socket in.
    let drop_dir = dir.join("other");
    std::fs::create_dir(&drop_dir).unwrap();
    std::fs::set_permissions(&drop_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = drop_dir.join("s");
    let got = drop_dir.join("got");

    let (Some(setpriv), Some(py)) = (testutil::which("setpriv"), testutil::which("python3")) else {
        testutil::skip_or_fail(
            "control_socket_of_another_uid_is_not_talked_to",
            "needs setpriv and python3",
        );
        return;
    };
    if !testutil::is_root() {
        testutil::skip_or_fail(
            "control_socket_of_another_uid_is_not_talked_to",
            "needs root to run a server as another uid",
        );
        return;
    }
    // A fake daemon as uid 65534: records whatever a client sends. Its
    // socket gets its name only once it listens (a connection between
    // bind and listen would be refused).
    let script = format!(
        "import os, socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind({sock:?} + '.new')\n\
         s.listen(1)\n\
         os.rename({sock:?} + '.new', {sock:?})\n\
         s.settimeout(20)\n\
         c, _ = s.accept()\n\
         c.settimeout(3)\n\
         data = b''\n\
         try:\n\
         \x20   while True:\n\
         \x20       b = c.recv(4096)\n\
         \x20       if not b: break\n\
         \x20       data += b\n\
         except Exception:\n\
         \x20   pass\n\
         open({got:?}, 'w').write(str(len(data)))\n",
        sock = sock.display().to_string(),
        got = got.display().to_string(),
    );
    // The system python, not a per-user shim the other uid cannot run.
    let py = if Path::new("/usr/bin/python3").exists() {
        PathBuf::from("/usr/bin/python3")
    } else {
        py
    };
    let mut server = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(py)
        .args(["-c", &script])
        .spawn()
        .expect("start fake server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sock.exists(), "fake server did not start");
    std::fs::rename(&sock, run.join("v.ctl.sock")).unwrap();

    let o = ucrypt(&run, &["status", "v"]);
    let err = String::from_utf8_lossy(&o.stderr);
    let status = server.wait().unwrap();
    assert!(status.success(), "fake server failed");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("served by uid 65534"), "{err}");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "0", "bytes sent");
}
