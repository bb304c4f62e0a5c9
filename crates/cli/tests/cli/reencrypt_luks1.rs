//! `ucrypt reencrypt` of a LUKS1 volume (cryptsetup 2.6.1's LUKS1
//! reencryption, which needs device-mapper and so cannot run here): the
//! volume cryptsetup formatted gets a new volume key, cryptsetup opens it
//! afterwards with the same passphrase and UUID, and its plaintext is the
//! one written before; a run stopped by a crash after the device was
//! marked, or after a block and its log, leaves a device no LUKS tool
//! opens and the `LUKS-<uuid>.*` files, and the next run resumes it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::reencrypt::ok;
use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

/// 10 MiB image: 2 MiB LUKS1 header area, 8 MiB of data (two blocks).
const IMG: u64 = 10 << 20;

struct Vol {
    dir: TempDir,
    img: PathBuf,
    key: PathBuf,
    plain: Vec<u8>,
}

fn cryptsetup(args: &[&str], img: &Path, key: &Path) -> Output {
    Command::new("cryptsetup")
        .args(args)
        .arg("--key-file")
        .arg(key)
        .arg(img)
        .output()
        .unwrap()
}

impl Vol {
    fn new(tag: &str, seed: u64) -> Vol {
        let dir = TempDir::new(tag);
        let img = dir.path().join("img");
        let key = dir.path().join("key");
        std::fs::write(&key, b"luks1 passphrase").unwrap();
        std::fs::File::create(&img).unwrap().set_len(IMG).unwrap();
        ok(
            cryptsetup(
                &[
                    "luksFormat",
                    "-q",
                    "--type",
                    "luks1",
                    "--pbkdf-force-iterations",
                    "1000",
                ],
                &img,
                &key,
            ),
            "luksFormat --type luks1",
        );
        let mut v = Vol {
            dir,
            img,
            key,
            plain: Vec::new(),
        };
        let size = v.read_plain().len();
        let mut plain = vec![0u8; size];
        Rng::new(seed).fill(&mut plain);
        use std::io::Write;
        let mut c = Command::new(ucrypt_bin())
            .args(["map", "--write", "--luks"])
            .arg(&v.img)
            .arg("--key-file")
            .arg(&v.key)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(&plain).unwrap();
        assert!(c.wait().unwrap().success());
        v.plain = plain;
        v
    }

    fn read_plain(&self) -> Vec<u8> {
        ok(
            Command::new(ucrypt_bin())
                .args(["map", "--read", "--luks"])
                .arg(&self.img)
                .arg("--key-file")
                .arg(&self.key)
                .output()
                .unwrap(),
            "map --read",
        )
        .stdout
    }

    /// `ucrypt reencrypt` in the volume's directory (where the
    /// `LUKS-<uuid>.*` files go), `crash` after that many writes.
    fn reencrypt(&self, crash: Option<u32>, extra: &[&str]) -> Output {
        let mut c = Command::new(ucrypt_bin());
        c.current_dir(self.dir.path())
            .args(["reencrypt", "-q", "--pbkdf-force-iterations", "1000"])
            .args(extra)
            .arg("--key-file")
            .arg(&self.key)
            .arg(&self.img);
        if let Some(n) = crash {
            c.env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string());
        }
        c.output().unwrap()
    }

    fn dump(&self, extra: &[&str]) -> String {
        let mut args = vec!["luksDump"];
        args.extend_from_slice(extra);
        let out = ok(cryptsetup(&args, &self.img, &self.key), "luksDump");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn volume_key(&self) -> Vec<u8> {
        testutil::volume_key_from_dump(&self.dump(&["-q", "--dump-volume-key"]))
    }

    fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("LUKS-"))
            .collect()
    }

    /// Done: cryptsetup opens it with the same passphrase and UUID, the
    /// key is new, the plaintext the old, and no reencryption file stays.
    fn check_done(&self, uuid: &str, old_key: &[u8], what: &str) {
        ok(
            cryptsetup(&["open", "--test-passphrase"], &self.img, &self.key),
            "cryptsetup open --test-passphrase",
        );
        let dump = self.dump(&[]);
        assert!(dump.contains(uuid), "{what}: UUID kept:\n{dump}");
        assert!(
            dump.lines()
                .any(|l| l.starts_with("Version:") && l.trim_end().ends_with('1')),
            "{what}:\n{dump}"
        );
        assert_ne!(self.volume_key(), old_key, "{what}: a new volume key");
        assert!(self.read_plain() == self.plain, "{what}: plaintext");
        assert!(
            self.leftovers().is_empty(),
            "{what}: {:?}",
            self.leftovers()
        );
    }
}

fn uuid(v: &Vol) -> String {
    let out = ok(
        Command::new("cryptsetup")
            .arg("luksUUID")
            .arg(&v.img)
            .output()
            .unwrap(),
        "luksUUID",
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_luks1_volume_gets_a_new_key_cryptsetup_opens() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    let v = Vol::new("luks1-reenc", 300);
    let (id, key) = (uuid(&v), v.volume_key());
    ok(v.reencrypt(None, &[]), "ucrypt reencrypt (LUKS1)");
    v.check_done(&id, &key, "whole run");

    // A new cipher and key size.
    let key = v.volume_key();
    ok(
        v.reencrypt(
            None,
            &["--cipher", "aes-cbc-essiv:sha256", "--key-size", "256"],
        ),
        "ucrypt reencrypt --cipher",
    );
    v.check_done(&id, &key, "new cipher");
    let dump = v.dump(&[]);
    assert!(dump.contains("cbc-essiv:sha256"), "{dump}");
}

#[test]
fn an_interrupted_luks1_reencryption_resumes() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    // Writes: 1 the new header, 2 the mark, then per block (two here) its
    // sum, its data and its log. Crashed after the mark; after the first
    // block's sum, data (the log not moved yet: resumed from the sum) and
    // log; after the second block's data.
    for n in [2, 3, 4, 5, 7] {
        let v = Vol::new(&format!("luks1-crash-{n}"), 310 + n as u64);
        let (id, key) = (uuid(&v), v.volume_key());
        let out = v.reencrypt(Some(n), &[]);
        assert!(!out.status.success(), "crash after write {n}");
        let is_luks = Command::new("cryptsetup")
            .arg("isLuks")
            .arg(&v.img)
            .status()
            .unwrap();
        assert!(!is_luks.success(), "{n}: marked, no LUKS tool opens it");
        let files = v.leftovers();
        for ext in [".log", ".org", ".new"] {
            assert!(files.iter().any(|f| f.ends_with(ext)), "{n}: {files:?}");
        }
        // The ordinary path refuses a marked device; --resume-only runs.
        let out = ok(v.reencrypt(None, &["--resume-only"]), "resume");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("resuming reencryption"),
            "{n}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        v.check_done(&id, &key, &format!("crash {n}, resumed"));
    }
    // Not in progress: --resume-only is refused, nothing written.
    let v = Vol::new("luks1-noresume", 330);
    let before = std::fs::read(&v.img).unwrap();
    let out = v.reencrypt(None, &["--resume-only"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not in progress"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(&v.img).unwrap() == before);
}
