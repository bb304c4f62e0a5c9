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

/// sha256sum's digest of `b` (hex).
fn sha(b: &[u8]) -> Vec<u8> {
    testutil::run("sha256sum", &[], Some(b)).stdout[..64].to_vec()
}

/// The sha256 of each file in `dir` (the image, its key, any header and
/// `LUKS-*` file), by name.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, sha(&std::fs::read(&p).unwrap()))
        })
        .collect();
    v.sort();
    v
}

fn is_luks(p: &Path) -> bool {
    Command::new("cryptsetup")
        .arg("isLuks")
        .arg(p)
        .status()
        .unwrap()
        .success()
}

fn log_text(v: &Vol, uuid: &str) -> String {
    let p = v.dir.path().join(format!("LUKS-{uuid}.log"));
    String::from_utf8_lossy(&std::fs::read(p).unwrap()).to_string()
}

/// The LUKS1 payload offset in bytes (`Payload offset`, sectors).
fn payload(v: &Vol) -> usize {
    let dump = v.dump(&[]);
    let line = dump
        .lines()
        .find(|l| l.starts_with("Payload offset:"))
        .unwrap();
    line.split(':')
        .nth(1)
        .unwrap()
        .trim()
        .parse::<usize>()
        .unwrap()
        * 512
}

#[test]
fn a_luks1_volume_is_decrypted_to_what_cryptsetup_leaves() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    // The plaintext at offset 0, the rest (the old data's tail) zero, the
    // header gone, no file left; interrupted at any write (marked, then
    // after each block and its log; the header overwritten from the
    // first block on, so `--uuid` names the files) and resumed.
    for crash in [None, Some(2), Some(3), Some(4), Some(8), Some(11)] {
        let v = Vol::new(&format!("luks1-dec-{crash:?}"), 340);
        let id = uuid(&v);
        let off = payload(&v);
        let mut want = v.plain.clone();
        want.resize(IMG as usize, 0);
        assert_eq!(off, 2 << 20);
        let out = v.reencrypt(crash, &["--decrypt"]);
        if let Some(n) = crash {
            assert!(!out.status.success(), "crash after write {n}");
            let log = log_text(&v, &id);
            assert!(log.contains("mode = 2") || n <= 2, "{n}: {log}");
            assert!(!is_luks(&v.img), "{n}: no LUKS tool opens it");
            let marked = std::fs::read(&v.img).unwrap()[..6] == *b"LUKS\xde\xad";
            if !marked {
                // The header is plaintext now: without --uuid the device
                // is not LUKS and nothing is written.
                let before = snapshot(v.dir.path());
                let out = v.reencrypt(None, &["--decrypt"]);
                assert!(!out.status.success(), "{n}");
                assert!(snapshot(v.dir.path()) == before, "{n}: nothing written");
            }
            let out = ok(
                v.reencrypt(None, &["--decrypt", "--uuid", &id]),
                &format!("resume after {n}"),
            );
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("resuming reencryption"),
                "{n}"
            );
        } else {
            ok(out, "ucrypt reencrypt --decrypt (LUKS1)");
        }
        let dev = std::fs::read(&v.img).unwrap();
        assert!(sha(&dev) == sha(&want), "{crash:?}: plaintext, then zeros");
        assert!(!is_luks(&v.img), "{crash:?}");
        assert!(v.leftovers().is_empty(), "{crash:?}: {:?}", v.leftovers());
    }
}

/// A plaintext image of `IMG` bytes (seeded) with the key file.
fn plain_image(tag: &str, seed: u64) -> Vol {
    let dir = TempDir::new(tag);
    let img = dir.path().join("img");
    let key = dir.path().join("key");
    std::fs::write(&key, b"luks1 passphrase").unwrap();
    let mut plain = vec![0u8; IMG as usize];
    Rng::new(seed).fill(&mut plain);
    std::fs::write(&img, &plain).unwrap();
    Vol {
        dir,
        img,
        key,
        plain,
    }
}

#[test]
fn a_plaintext_device_gains_luks1_with_a_data_shift() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    let reduce = 2usize << 20;
    let args = [
        "--encrypt",
        "--type",
        "luks1",
        "--reduce-device-size",
        "4096S",
    ];
    // Writes: 1 the new header file, then per 2 MiB block (the shift)
    // its data and its log, backward (four blocks), then the header.
    for crash in [None, Some(1), Some(2), Some(3), Some(6), Some(9), Some(10)] {
        let v = plain_image(&format!("luks1-enc-{crash:?}"), 350);
        let out = v.reencrypt(crash, &args);
        if let Some(n) = crash {
            assert!(!out.status.success(), "crash after write {n}");
            // Not LUKS until the header, the last write, is on it.
            assert_eq!(is_luks(&v.img), n == 10, "{n}");
            let log = log_text(&v, "cafecafe-cafe-cafe-cafe-cafecafeeeee");
            assert!(log.contains("direction = 1\nmode = 1\n"), "{n}: {log}");
            // The same command resumes it.
            let out = ok(v.reencrypt(None, &args), &format!("resume after {n}"));
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("resuming reencryption"),
                "{n}"
            );
        } else {
            ok(out, "ucrypt reencrypt --encrypt --type luks1");
        }
        ok(
            cryptsetup(&["open", "--test-passphrase"], &v.img, &v.key),
            "cryptsetup open --test-passphrase",
        );
        assert_eq!(payload(&v), reduce, "{crash:?}");
        let dump = v.dump(&[]);
        assert!(dump.contains("xts-plain64") && dump.contains("MK bits:       \t256"));
        // Every byte of the plaintext but the reduction's, shifted.
        assert!(
            v.read_plain() == v.plain[..IMG as usize - reduce],
            "{crash:?}: data"
        );
        // No plaintext left below the data (past the 256-bit key's
        // keyslot areas, which end at 2056 sectors).
        let dev = std::fs::read(&v.img).unwrap();
        assert!(
            dev[2056 * 512..reduce].iter().all(|&b| b == 0),
            "{crash:?}: the plaintext's old head is wiped"
        );
        assert!(v.leftovers().is_empty(), "{crash:?}: {:?}", v.leftovers());
    }
}

#[test]
fn a_detached_header_encrypts_reencrypts_and_decrypts_luks1() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    let v = plain_image("luks1-hdr", 360);
    let hdr = v.dir.path().join("hdr");
    let h = hdr.to_str().unwrap();
    ok(
        v.reencrypt(None, &["--encrypt", "--type", "luks1", "--header", h]),
        "encrypt --header",
    );
    assert!(!is_luks(&v.img) && is_luks(&hdr));
    let open = |what: &str| {
        let out = Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--header", h, "--key-file"])
            .arg(&v.key)
            .arg(&v.img)
            .output()
            .unwrap();
        ok(out, what);
        let out = Command::new(ucrypt_bin())
            .args(["map", "--read", "--luks"])
            .arg(&v.img)
            .args(["--header", h, "--key-file"])
            .arg(&v.key)
            .output()
            .unwrap();
        assert!(ok(out, what).stdout == v.plain, "{what}: data");
    };
    open("after --encrypt --header");
    ok(v.reencrypt(None, &["--header", h]), "reencrypt --header");
    open("after reencrypt --header");
    ok(
        v.reencrypt(None, &["--decrypt", "--header", h]),
        "--decrypt --header",
    );
    assert!(
        std::fs::read(&v.img).unwrap() == v.plain,
        "plaintext in place"
    );
    assert!(v.leftovers().is_empty(), "{:?}", v.leftovers());
    // An existing empty header file is filled.
    std::fs::write(&hdr, b"").unwrap();
    ok(
        v.reencrypt(None, &["--encrypt", "--type", "luks1", "--header", h]),
        "encrypt into an empty --header",
    );
    open("after --encrypt into an empty header");
}

#[test]
fn keep_key_and_a_data_shift_on_a_luks1_reencryption() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    let v = Vol::new("luks1-keep", 370);
    let (id, key) = (uuid(&v), v.volume_key());
    let out = Command::new(ucrypt_bin())
        .current_dir(v.dir.path())
        .args(["reencrypt", "-q", "--keep-key", "--hash", "sha512"])
        .args(["--pbkdf-force-iterations", "1001", "--key-file"])
        .arg(&v.key)
        .arg(&v.img)
        .output()
        .unwrap();
    ok(out, "--keep-key");
    assert_eq!(v.volume_key(), key, "the key is kept");
    let dump = v.dump(&[]);
    assert!(
        dump.contains("Hash spec:     \tsha512") && dump.contains("1001"),
        "{dump}"
    );
    assert!(dump.contains(&id));
    assert!(v.read_plain() == v.plain);
    assert!(v.leftovers().is_empty());
    // --reduce-device-size: the data moves up by 1024 sectors (its last
    // 512 KiB drop off); crashed after a block and resumed.
    let reduce = 512usize << 10;
    for crash in [None, Some(4), Some(9)] {
        let v = Vol::new(&format!("luks1-shift-{crash:?}"), 380);
        let key = v.volume_key();
        let id = uuid(&v);
        let extra = ["-s", "256", "--reduce-device-size", "1024S"];
        let out = v.reencrypt(crash, &extra);
        if let Some(n) = crash {
            assert!(!out.status.success(), "{n}");
            assert!(log_text(&v, &id).contains("direction = 1\nmode = 0\n"));
            ok(v.reencrypt(None, &["--resume-only"]), "resume");
        } else {
            ok(out, "--reduce-device-size");
        }
        assert_eq!(payload(&v), (2 << 20) + reduce);
        assert_ne!(v.volume_key(), key);
        assert!(
            v.read_plain() == v.plain[..v.plain.len() - reduce],
            "{crash:?}: data shifted"
        );
        assert!(v.leftovers().is_empty(), "{crash:?}");
    }
}

#[test]
fn luks1_refusals_write_nothing() {
    if !require_tool("reencrypt_luks1", "cryptsetup") {
        return;
    }
    let v = Vol::new("luks1-refuse", 390);
    let refuse = |v: &Vol, extra: &[&str], code: i32, want: &str| {
        let before = snapshot(v.dir.path());
        let out = v.reencrypt(None, extra);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(
            snapshot(v.dir.path()) == before,
            "{extra:?}: nothing written"
        );
    };
    // --encrypt of a device that is already LUKS.
    refuse(
        &v,
        &[
            "--encrypt",
            "--type",
            "luks1",
            "--reduce-device-size",
            "4096S",
        ],
        1,
        "is already LUKS device. Aborting operation.",
    );
    // A reduction the device cannot hold.
    refuse(&v, &["--reduce-device-size", "1G"], 1, "is too small");
    let p = plain_image("luks1-refuse-plain", 391);
    refuse(
        &p,
        &[
            "--encrypt",
            "--type",
            "luks1",
            "--reduce-device-size",
            "20M",
        ],
        1,
        "is too small",
    );
    refuse(
        &p,
        &["--encrypt", "--type", "luks1"],
        1,
        "not possible without data device size reduction",
    );
    // --keep-key with a shift would lose the data.
    refuse(
        &v,
        &["--keep-key", "--reduce-device-size", "1024S"],
        1,
        "--keep-key",
    );
    // A wrong passphrase (exit 2, as cryptsetup's).
    std::fs::write(&v.key, b"not the passphrase").unwrap();
    for extra in [&[][..], &["--decrypt"], &["--keep-key"]] {
        refuse(&v, extra, 2, "No key available with this passphrase");
    }
}
