//! Misuse rows: paths ucrypt creates (sockets, mountpoints, runtime
//! files) and volume names.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use testutil::Capability;

use super::harness::{text, Case, Expect, Outcome, Row};

/// A fixed aes-xts-plain64 key (hex) for plain tables.
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

/// `open --type plain --table -` arguments for `img` (1 MiB) as `name`;
/// the table goes on stdin ([`table`]), so what a refusal prints comes
/// first.
fn plain_open(img: &str, name: &str, extra: &[&str]) -> Vec<String> {
    plain_verb("open", img, name, extra)
}

/// [`plain_open`] spelled `verb` (`open`, `luksOpen`).
fn plain_verb(verb: &str, img: &str, name: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [verb, "--type", "plain", "--table", "-"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend([img.to_owned(), name.to_owned()]);
    a
}

/// The table line of `img` (1 MiB), for stdin.
fn table(img: &str) -> Vec<u8> {
    format!("0 2048 crypt aes-xts-plain64 {KEY} 0 {img} 0\n").into_bytes()
}

/// `ucrypt ARGS` with `img`'s table on stdin.
fn run(c: &Case, a: &[String], img: &Path) -> std::process::Output {
    c.ucrypt_in(&args(a), Some(&table(s(img))))
}

/// [`run`] for a command that serves in the foreground if it is not
/// refused: given 60 s to exit, else killed and reported as served.
fn bounded(c: &Case, a: &[String], img: &Path) -> Outcome {
    let mut child = c
        .command(&args(a))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(&table(s(img))).expect("table on stdin");
    drop(stdin);
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let o = child.wait_with_output().expect("killed child");
            return Outcome::note(None, format!("not refused: it served\n{}", text(&o)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output").into()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A foreground daemon (`verb --foreground`) serving `img` as `name`,
/// started and waited for until it prints its ready line; kept by the
/// case, and closed with it.
fn foreground(c: &mut Case, verb: &str, img: &Path, name: &str) -> u32 {
    let a = plain_verb(verb, s(img), name, &["--foreground"]);
    let mut child = c
        .command(&args(&a))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a foreground daemon");
    c.served(name);
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(&table(s(img))).expect("table on stdin");
    drop(stdin);
    let mut line = String::new();
    let out = child.stdout.take().expect("piped stdout");
    BufReader::new(out)
        .read_line(&mut line)
        .expect("ready line");
    assert!(
        line.contains(name),
        "{verb} --foreground did not become ready: {line:?}"
    );
    let pid = child.id();
    c.keep(Reaped(child));
    pid
}

/// A child reaped (killed if still running) when the row ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `status NAME` answers for pid `pid`, and `close NAME` then succeeds:
/// the first daemon was neither replaced nor orphaned.
fn still_served_and_closable(c: &Case, name: &str, pid: u32) {
    let st = c.ucrypt(&["status", name]);
    assert!(
        st.status.success(),
        "status after the misuse: {}",
        text(&st)
    );
    let pidfile = std::fs::read_to_string(c.runtime().join(format!("{name}.pid")))
        .expect("pid file of the first daemon");
    assert_eq!(
        pidfile.trim(),
        pid.to_string(),
        "the pid file was taken over"
    );
    let cl = c.ucrypt(&["close", name]);
    assert!(cl.status.success(), "close after the misuse: {}", text(&cl));
    testutil::wait_until(Duration::from_secs(30), "the first daemon to exit", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| st.contains(") Z"))
    });
}

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "vhost-user-blk socket path names a disk image",
            needs: &[],
            expect: Expect::Exit(5, "is not a socket"),
            case: |c: &mut Case| {
                let img = c.image("backing.img", 1 << 20);
                let victim = c.image("vm1.img", 1 << 20);
                c.watch(&img);
                c.watch(&victim);
                let export = format!("vhost-user-blk={}", victim.display());
                let a = plain_open(s(&img), "v", &["--export", &export]);
                c.served("v");
                run(c, &a, &img).into()
            },
        },
        Row {
            what: "vhost-user-blk socket path names another server's live socket",
            needs: &[],
            expect: Expect::Exit(5, "is in use by another server"),
            case: |c: &mut Case| {
                let img = c.image("backing.img", 1 << 20);
                c.watch(&img);
                let sock = c.path("qemu-storage.sock");
                let other = UnixListener::bind(&sock).expect("the other server's socket");
                let export = format!("vhost-user-blk={}", sock.display());
                let a = plain_open(s(&img), "v", &["--export", &export]);
                c.served("v");
                let out: Outcome = run(c, &a, &img).into();
                // The other server still owns its socket and gets clients.
                let client = UnixStream::connect(&sock).expect("the other server still listens");
                other.set_nonblocking(true).expect("nonblocking");
                other
                    .accept()
                    .expect("the socket at the path is still the other server's");
                drop(client);
                c.keep(other);
                out
            },
        },
        Row {
            what: "NBD socket path names a directory",
            needs: &[],
            expect: Expect::Exit(5, "sockdir exists and is not a socket"),
            case: |c: &mut Case| {
                let img = c.image("backing.img", 1 << 20);
                c.watch(&img);
                let d = c.path("sockdir");
                std::fs::create_dir(&d).expect("directory");
                let inside = d.join("notes.txt");
                std::fs::write(&inside, b"kept").expect("file in the directory");
                c.watch(&inside);
                let export = format!("nbd={}", d.display());
                let a = plain_open(s(&img), "v", &["--export", &export]);
                c.served("v");
                let out = run(c, &a, &img).into();
                assert!(d.is_dir(), "the directory is still a directory");
                out
            },
        },
        Row {
            what: "FUSE mountpoint names a regular file",
            needs: &[],
            expect: Expect::Exit(5, "exists and is not a directory"),
            case: |c: &mut Case| {
                let img = c.image("backing.img", 1 << 20);
                let victim = c.image("notes.img", 64 << 10);
                c.watch(&img);
                c.watch(&victim);
                let export = format!("fuse={}", victim.display());
                let a = plain_open(s(&img), "v", &["--export", &export]);
                c.served("v");
                run(c, &a, &img).into()
            },
        },
        Row {
            what: "FUSE mountpoint names a directory that holds files",
            needs: &[Capability::DevFuse, Capability::Tool("fusermount3")],
            expect: Expect::Exit(5, "is not empty"),
            case: |c: &mut Case| {
                let img = c.image("backing.img", 1 << 20);
                c.watch(&img);
                let home = c.path("home");
                std::fs::create_dir(&home).expect("directory");
                let doc = home.join("thesis.tex");
                std::fs::write(&doc, b"\\chapter{One}").expect("a file in it");
                c.watch(&doc);
                let export = format!("fuse={}", home.display());
                let a = plain_open(s(&img), "v", &["--export", &export]);
                c.served("v");
                let out = run(c, &a, &img).into();
                // Not hidden under a mount either.
                assert_eq!(
                    std::fs::read(&doc).ok().as_deref(),
                    Some(&b"\\chapter{One}"[..])
                );
                out
            },
        },
        Row {
            what: "open NAME while luksOpen --foreground serves NAME",
            needs: &[],
            expect: Expect::Exit(5, "Device v already exists"),
            case: |c: &mut Case| {
                let img = c.image("first.img", 1 << 20);
                let other = c.image("second.img", 1 << 20);
                c.watch(&img);
                c.watch(&other);
                let pid = foreground(c, "luksOpen", &img, "v");
                let out: Outcome = run(c, &plain_open(s(&other), "v", &[]), &other).into();
                still_served_and_closable(c, "v", pid);
                out
            },
        },
        Row {
            what: "luksOpen --foreground NAME while luksOpen --foreground serves NAME",
            needs: &[],
            expect: Expect::Exit(5, "Device v already exists"),
            case: |c: &mut Case| {
                let img = c.image("first.img", 1 << 20);
                let other = c.image("second.img", 1 << 20);
                c.watch(&img);
                c.watch(&other);
                let pid = foreground(c, "luksOpen", &img, "v");
                let a = plain_verb("luksOpen", s(&other), "v", &["--foreground"]);
                let out = bounded(c, &a, &other);
                still_served_and_closable(c, "v", pid);
                out
            },
        },
        Row {
            what: "open --foreground NAME while open NAME waits for its passphrase",
            needs: &[],
            expect: Expect::Exit(5, "Device v already exists"),
            case: |c: &mut Case| {
                let (img, _key) = c.luks2("first.img", 18 << 20, "first pass");
                let other = c.image("second.img", 1 << 20);
                c.watch(&other);
                // The first open has claimed v and reads its passphrase
                // from stdin, which stays open and silent for now.
                let mut first = c
                    .command(&["open", "--type", "luks", s(&img), "v"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn the first open");
                c.served("v");
                let lock = c.runtime().join("v.lock");
                testutil::wait_until(Duration::from_secs(30), "the first open's claim", || {
                    lock.exists()
                });
                let a = plain_verb("open", s(&other), "v", &["--foreground"]);
                let out = bounded(c, &a, &other);
                // Now the passphrase: the first open goes on and serves v.
                let mut stdin = first.stdin.take().expect("piped stdin");
                stdin.write_all(b"first pass").expect("passphrase");
                drop(stdin);
                let done = first.wait_with_output().expect("first open");
                assert!(done.status.success(), "the first open: {}", text(&done));
                let pid = std::fs::read_to_string(c.runtime().join("v.pid"))
                    .expect("pid file")
                    .trim()
                    .parse()
                    .expect("pid");
                still_served_and_closable(c, "v", pid);
                out
            },
        },
        Row {
            what: "open after a killed daemon left its sockets and pid file",
            needs: &[],
            expect: Expect::Survives,
            case: |c: &mut Case| {
                let img = c.image("backing.img", 1 << 20);
                c.watch(&img);
                let sock = c.path("vm.sock");
                let export = format!("vhost-user-blk={}", sock.display());
                let a = plain_open(s(&img), "v", &["--export", &export]);
                c.served("v");
                let first = run(c, &a, &img);
                assert!(first.status.success(), "setup open: {}", text(&first));
                let pid: u32 = std::fs::read_to_string(c.runtime().join("v.pid"))
                    .expect("pid file")
                    .trim()
                    .parse()
                    .expect("pid");
                let k = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .expect("kill");
                assert!(k.success());
                testutil::wait_until(Duration::from_secs(30), "the killed daemon", || {
                    std::fs::read_to_string(format!("/proc/{pid}/stat"))
                        .map_or(true, |st| st.contains(") Z"))
                });
                assert!(sock.exists(), "a killed daemon leaves its socket");
                let again = run(c, &a, &img);
                assert!(
                    again.status.success(),
                    "the stale socket and files were not replaced: {}",
                    text(&again)
                );
                UnixStream::connect(&sock).expect("the new daemon listens on the socket");
                let st = c.ucrypt(&["status", "v"]);
                assert!(st.status.success(), "status: {}", text(&st));
                let cl = c.ucrypt(&["close", "v"]);
                assert!(cl.status.success(), "close: {}", text(&cl));
                assert!(!sock.exists(), "close removes the socket it created");
                Outcome::note(again.status.code(), text(&again))
            },
        },
    ]
}
