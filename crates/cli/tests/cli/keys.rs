//! Keys out of reach: a daemon keeps its key in locked pages
//! that core dumps leave out, `table --showkeys` leaves no copy behind, and
//! a plain table's key need not be on any command line (`--key-file`,
//! `--table -`); a key given on argv draws a warning.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use testutil::{Capability, TempDir};

/// A key no other memory holds by chance (seeded, 64 bytes for XTS-256).
fn key() -> Vec<u8> {
    testutil::Rng::new(0x6b65_7973).bytes(64)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

struct Vol {
    dir: TempDir,
    run: PathBuf,
    img: PathBuf,
}

impl Vol {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let run = dir.join("run");
        let img = dir.join("vol.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        Self { dir, run, img }
    }

    fn ucrypt(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut c = Command::new(testutil::ucrypt_bin())
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", &self.run)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ucrypt");
        let mut input = c.stdin.take().unwrap();
        // A refusal may exit before reading stdin (EPIPE here).
        let _ = input.write_all(stdin);
        drop(input);
        c.wait_with_output().unwrap()
    }

    fn table(&self, key_field: &str) -> String {
        format!(
            "0 2048 crypt aes-xts-plain64 {key_field} 0 {} 0",
            self.img.display()
        )
    }

    /// `open` detached with the key from a key file; returns the pid.
    fn open_with_key_file(&self, name: &str) -> u32 {
        let kf = self.dir.join("key.bin");
        std::fs::write(&kf, key()).unwrap();
        let o = self.ucrypt(
            &[
                "open",
                "--table",
                &self.table("-"),
                "--key-file",
                kf.to_str().unwrap(),
                self.img.to_str().unwrap(),
                name,
            ],
            b"",
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "open: {err}");
        assert!(
            !err.contains("warning"),
            "no key on argv, no warning: {err}"
        );
        pid_of(&o)
    }

    fn close(&self, name: &str) {
        let o = self.ucrypt(&["close", name], b"");
        assert!(o.status.success(), "close: {o:?}");
    }
}

/// The pid from `open`'s "... (pid N)" line.
fn pid_of(o: &Output) -> u32 {
    let out = String::from_utf8_lossy(&o.stdout);
    out.rsplit("(pid ")
        .next()
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {out:?}"))
}

fn status_field(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// One mapping of a process: its address range and smaps `VmFlags`.
struct Mapping {
    start: u64,
    end: u64,
    flags: Vec<String>,
}

fn mappings(pid: u32) -> Vec<Mapping> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut v: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let first = line.split(' ').next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                v.push(Mapping {
                    start,
                    end,
                    flags: Vec::new(),
                });
                continue;
            }
        }
        if let (Some(f), Some(m)) = (line.strip_prefix("VmFlags:"), v.last_mut()) {
            m.flags = f.split_whitespace().map(str::to_owned).collect();
        }
    }
    v
}

/// Where `needle` occurs in the readable memory of `pid`, each with the
/// flags of its mapping. Needs root: the daemon is not dumpable, so only
/// CAP_SYS_PTRACE may read its /proc/PID/mem.
fn occurrences(pid: u32, needle: &[u8]) -> Vec<(u64, Vec<String>)> {
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut found = Vec::new();
    for m in mappings(pid) {
        if !m.flags.iter().any(|f| f == "rd") || m.end - m.start > (1 << 30) {
            continue;
        }
        let mut buf = vec![0u8; (m.end - m.start) as usize];
        if mem.seek(SeekFrom::Start(m.start)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        for (i, w) in buf.windows(needle.len()).enumerate() {
            if w == needle {
                found.push((m.start + i as u64, m.flags.clone()));
            }
        }
    }
    found
}

#[test]
fn daemon_keeps_the_key_in_locked_undumpable_pages_and_showkeys_leaves_no_copy() {
    let t = "daemon_keeps_the_key_in_locked_undumpable_pages_and_showkeys_leaves_no_copy";
    if !testutil::require(t, Capability::Root) {
        return;
    }
    let v = Vol::new("keys-locked");
    let pid = v.open_with_key_file("k");
    let key = key();
    let key_hex = hex(&key);

    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains("serve --spec-stdin"), "{cmdline}");
    assert!(!cmdline.contains(&key_hex[..16]), "key on argv: {cmdline}");

    assert!(status_field(pid, "VmLck:") > 0, "no locked memory");
    let raw = occurrences(pid, &key);
    assert!(!raw.is_empty(), "the daemon holds the key somewhere");
    for (addr, flags) in &raw {
        assert!(
            flags.iter().any(|f| f == "dd") && flags.iter().any(|f| f == "lo"),
            "key copy at {addr:#x} outside locked, undumpable pages: {flags:?}"
        );
    }

    for _ in 0..3 {
        let o = v.ucrypt(&["table", "--showkeys", "k"], b"");
        assert!(o.status.success(), "{o:?}");
        let line = String::from_utf8(o.stdout).unwrap();
        assert_eq!(line, format!("{}\n", v.table(&key_hex)));
    }
    // The daemon wipes a reply's key after sending it, so the CLI may be
    // done before the wipe is. The control socket serves one connection
    // at a time: once a masked `table` is answered, the last --showkeys
    // reply's buffers are wiped.
    let masked = v.ucrypt(&["table", "k"], b"");
    assert!(!String::from_utf8_lossy(&masked.stdout).contains(&key_hex));
    let left = occurrences(pid, key_hex.as_bytes());
    assert!(
        left.is_empty(),
        "--showkeys left hex copies of the key at {:x?}",
        left.iter().map(|(a, _)| a).collect::<Vec<_>>()
    );
    v.close("k");
}

#[test]
fn plain_tables_read_the_key_from_a_file_or_the_line_from_stdin() {
    let v = Vol::new("keys-sources");
    let key = key();
    let key_hex = hex(&key);
    // Reference: a literal key on argv still works, with a warning.
    let plain: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let literal = v.table(&key_hex);
    let o = v.ucrypt(&["map", "--write", "--table", &literal], &plain);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: the key in --table is visible to every user"),
        "{err}"
    );
    let kf = v.dir.join("key.bin");
    std::fs::write(&kf, &key).unwrap();
    let read = |args: &[&str], stdin: &[u8]| {
        let mut a = vec!["map", "--read"];
        a.extend_from_slice(args);
        let o = v.ucrypt(&a, stdin);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(!err.contains("warning"), "{args:?}: {err}");
        o.stdout[..plain.len()].to_vec()
    };
    let dash = v.table("-");
    assert_eq!(
        read(&["--table", &dash, "--key-file", kf.to_str().unwrap()], b""),
        plain
    );
    assert_eq!(read(&["--table", &dash, "--key-file", "-"], &key), plain);
    assert_eq!(read(&["--table", "-"], literal.as_bytes()), plain);

    // Refusals: exit 1, a clear message, the key never echoed.
    let refused = |args: &[&str], stdin: &[u8], why: &str| {
        let o = v.ucrypt(args, stdin);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains(&key_hex[..16]), "{err}");
    };
    let kfs = kf.to_str().unwrap();
    refused(
        &["map", "--read", "--table", &literal, "--key-file", kfs],
        b"",
        "must be \"-\"",
    );
    refused(
        &["map", "--read", "--table", "-", "--key-file", "-"],
        b"",
        "both read stdin",
    );
    refused(
        &["map", "--write", "--table", &dash, "--key-file", "-"],
        &key,
        "--write reads plaintext from stdin",
    );
    std::fs::write(&kf, &key[..33]).unwrap();
    refused(
        &["map", "--read", "--table", &dash, "--key-file", kfs],
        b"",
        "got 264 bits",
    );
    let missing = v.dir.join("missing");
    refused(
        &[
            "map",
            "--read",
            "--table",
            &dash,
            "--key-file",
            missing.to_str().unwrap(),
        ],
        b"",
        "Cannot open key file",
    );
}

#[test]
fn foreground_daemon_takes_its_table_from_stdin_not_argv() {
    let v = Vol::new("keys-fg");
    let key_hex = hex(&key());
    let mut child = Command::new(testutil::ucrypt_bin())
        .args([
            "open",
            "--foreground",
            "--table",
            "-",
            v.img.to_str().unwrap(),
            "fg",
        ])
        .env("UCRYPT_RUNTIME_DIR", &v.run)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(v.table(&key_hex).as_bytes()).unwrap();
    drop(input);
    // The first stdout line says the volume is served.
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        seen.push(b[0]);
    }
    let line = String::from_utf8_lossy(&seen).into_owned();
    let served = line.contains("serving");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    let closed = v.ucrypt(&["close", "fg"], b"");
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(served, "{line:?} {err}");
    assert!(cmdline.contains("--table -"), "{cmdline}");
    assert!(!cmdline.contains(&key_hex[..16]), "{cmdline}");
    assert!(!err.contains("warning"), "{err}");
    assert!(closed.status.success(), "{closed:?}");
}

#[test]
fn without_lockable_memory_ucrypt_warns_once_and_goes_on() {
    let t = "without_lockable_memory_ucrypt_warns_once_and_goes_on";
    if !testutil::require(t, Capability::Tool("prlimit"))
        || !testutil::require(t, Capability::Tool("setpriv"))
    {
        return;
    }
    let v = Vol::new("keys-nolock");
    let key_hex = hex(&key());
    let plain = vec![0x5au8; 4096];
    let literal = v.table(&key_hex);
    let o = v.ucrypt(&["map", "--write", "--table", &literal], &plain);
    assert!(o.status.success(), "{o:?}");
    // RLIMIT_MEMLOCK 0; root also loses CAP_IPC_LOCK, which ignores it.
    let mut cmd = Command::new("prlimit");
    if testutil::is_root() {
        cmd = Command::new("setpriv");
        cmd.args(["--bounding-set=-ipc_lock", "--", "prlimit"]);
    }
    let mut c = cmd
        .args(["--memlock=0:0", "--"])
        .arg(testutil::ucrypt_bin())
        .args(["map", "--read", "--table", "-"])
        .env("UCRYPT_RUNTIME_DIR", &v.run)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = c.stdin.take().unwrap();
    input.write_all(literal.as_bytes()).unwrap();
    drop(input);
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(&o.stdout[..plain.len()], &plain[..]);
    assert_eq!(
        err.matches("warning: cannot lock key memory").count(),
        1,
        "{err}"
    );
}
