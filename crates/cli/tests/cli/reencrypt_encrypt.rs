//! `ucrypt reencrypt --encrypt --header FILE` against cryptsetup 2.6.1
//! (`--force-offline-reencrypt` on image files): the metadata of an
//! initialized encryption is cryptsetup's field by field, each tool
//! finishes what the other started or left interrupted, a crash at any
//! write of a run is repaired by both, the finished volume opens in both
//! and its plaintext is the original bytes; misuse is refused with
//! nothing written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::reencrypt::ok;
use serde_json::Value;
use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

/// The plaintext device: small, so a whole crash loop stays quick.
const DATA: usize = 4 << 20;

/// Fast keyslot parameters for both tools.
pub(crate) const FAST_KDF: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Plain {
    _dir: TempDir,
    dir: PathBuf,
    img: PathBuf,
    hdr: PathBuf,
    key: PathBuf,
    plain: Vec<u8>,
}

/// A plaintext data file of seeded random bytes and a passphrase file;
/// the header path (`hdr`) does not exist yet.
fn plain(tag: &str, seed: u64) -> Plain {
    let dir = TempDir::new(tag);
    let img = dir.path().join("data");
    let hdr = dir.path().join("hdr");
    let key = dir.path().join("key");
    std::fs::write(&key, b"encrypt passphrase").unwrap();
    let mut plain = vec![0u8; DATA];
    Rng::new(seed).fill(&mut plain);
    std::fs::write(&img, &plain).unwrap();
    let d = dir.path().to_path_buf();
    Plain {
        _dir: dir,
        dir: d,
        img,
        hdr,
        key,
        plain,
    }
}

/// `TOOL reencrypt --encrypt --header HDR ARGS DATA` (cryptsetup
/// offline, batch mode, fast KDF).
fn encrypt(tool: &str, hdr: &Path, data: &Path, key: &Path, args: &[&str]) -> Output {
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.args(["reencrypt", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(ucrypt_bin());
        c.arg("reencrypt");
        c
    };
    c.args(["-q", "--encrypt", "--type", "luks2"])
        .args(FAST_KDF)
        .arg("--key-file")
        .arg(key)
        .arg("--header")
        .arg(hdr)
        .args(args)
        .arg(data)
        .output()
        .unwrap()
}

pub(crate) fn json(hdr: &Path) -> Value {
    let out = ok(
        Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(hdr)
            .output()
            .unwrap(),
        "luksDump --dump-json-metadata",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn in_reencryption(hdr: &Path) -> bool {
    json(hdr)["config"]["requirements"]["mandatory"]
        .as_array()
        .is_some_and(|m| m.iter().any(|r| r == "online-reencrypt-v2"))
}

/// Salts and digests aside, the metadata.
pub(crate) fn shape(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("salt");
                m.remove("digest");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// The finished volume: cryptsetup accepts the passphrase, ucrypt's map
/// reads the original plaintext, the header is an ordinary LUKS2 one.
fn check_finished(p: &Plain, img: &Path, hdr: &Path, what: &str) {
    check_volume(&p.key, img, Some(hdr), &p.plain, what);
    assert!(
        std::fs::read(img).unwrap()[..4096] != p.plain[..4096],
        "{what}: the data is encrypted"
    );
}

/// The finished volume `img` (header `hdr`, or on it) opens in
/// cryptsetup and its first bytes read through ucrypt's map are `plain`.
pub(crate) fn check_volume(key: &Path, img: &Path, hdr: Option<&Path>, plain: &[u8], what: &str) {
    let meta = hdr.unwrap_or(img);
    assert!(!in_reencryption(meta), "{what}: still in reencryption");
    let mut c = Command::new("cryptsetup");
    c.args(["open", "--test-passphrase", "--key-file"]).arg(key);
    if let Some(h) = hdr {
        c.arg("--header").arg(h);
    }
    ok(
        c.arg(img).output().unwrap(),
        &format!("{what}: cryptsetup open --test-passphrase"),
    );
    let mut c = Command::new(ucrypt_bin());
    c.args(["map", "--read", "--luks"]).arg(img);
    if let Some(h) = hdr {
        c.arg("--header").arg(h);
    }
    let out = ok(
        c.arg("--key-file").arg(key).output().unwrap(),
        &format!("{what}: map --read"),
    );
    assert!(
        out.stdout.len() >= plain.len() && out.stdout[..plain.len()] == *plain,
        "{what}: plaintext differs"
    );
}

#[test]
fn init_only_writes_what_cryptsetup_writes_and_each_tool_finishes_the_other() {
    if !require_tool("reencrypt_encrypt_init", "cryptsetup") {
        return;
    }
    for (i, r) in ["checksum", "journal", "none"].into_iter().enumerate() {
        let p = plain("enc-init", 50 + i as u64);
        let (c_img, c_hdr) = (p.dir.join("c.data"), p.dir.join("c.hdr"));
        std::fs::copy(&p.img, &c_img).unwrap();
        let args = ["--init-only", "--resilience", r];
        ok(encrypt("ucrypt", &p.hdr, &p.img, &p.key, &args), r);
        ok(encrypt("cryptsetup", &c_hdr, &c_img, &p.key, &args), r);
        assert_eq!(shape(json(&p.hdr)), shape(json(&c_hdr)), "{r}");
        assert_eq!(
            std::fs::metadata(&p.hdr).unwrap().len(),
            std::fs::metadata(&c_hdr).unwrap().len(),
            "{r}: header file size"
        );
        assert_eq!(
            std::fs::read(&p.img).unwrap(),
            p.plain,
            "{r}: data untouched"
        );
        // Each finishes the other's.
        ok(
            encrypt("cryptsetup", &p.hdr, &p.img, &p.key, &["--resume-only"]),
            r,
        );
        ok(
            encrypt("ucrypt", &c_hdr, &c_img, &p.key, &["--resume-only"]),
            r,
        );
        check_finished(&p, &p.img, &p.hdr, &format!("{r}: ucrypt → cryptsetup"));
        check_finished(&p, &c_img, &c_hdr, &format!("{r}: cryptsetup → ucrypt"));
        assert_eq!(shape(json(&p.hdr)), shape(json(&c_hdr)), "{r}: finished");
    }
    // Another cipher, key size and sector size.
    let p = plain("enc-init-cipher", 60);
    let (c_img, c_hdr) = (p.dir.join("c.data"), p.dir.join("c.hdr"));
    std::fs::copy(&p.img, &c_img).unwrap();
    let args = [
        "--init-only",
        "--cipher",
        "aes-cbc-essiv:sha256",
        "--key-size",
        "256",
        "--sector-size",
        "4096",
    ];
    ok(encrypt("ucrypt", &p.hdr, &p.img, &p.key, &args), "cbc");
    ok(encrypt("cryptsetup", &c_hdr, &c_img, &p.key, &args), "cbc");
    assert_eq!(shape(json(&p.hdr)), shape(json(&c_hdr)), "cbc");
    ok(
        encrypt("ucrypt", &p.hdr, &p.img, &p.key, &["--resume-only"]),
        "cbc",
    );
    check_finished(&p, &p.img, &p.hdr, "cbc");
}

#[test]
fn a_whole_ucrypt_run_is_cryptsetups() {
    if !require_tool("reencrypt_encrypt_full", "cryptsetup") {
        return;
    }
    let p = plain("enc-full", 70);
    let (c_img, c_hdr) = (p.dir.join("c.data"), p.dir.join("c.hdr"));
    std::fs::copy(&p.img, &c_img).unwrap();
    ok(
        encrypt("ucrypt", &p.hdr, &p.img, &p.key, &["--hotzone-size", "1M"]),
        "ucrypt",
    );
    ok(
        encrypt("cryptsetup", &c_hdr, &c_img, &p.key, &[]),
        "cryptsetup",
    );
    check_finished(&p, &p.img, &p.hdr, "ucrypt");
    check_finished(&p, &c_img, &c_hdr, "cryptsetup");
    assert_eq!(shape(json(&p.hdr)), shape(json(&c_hdr)));
    // The result opens with ucrypt's open --test-passphrase too.
    ok(
        Command::new(ucrypt_bin())
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&p.key)
            .arg("--header")
            .arg(&p.hdr)
            .arg(&p.img)
            .output()
            .unwrap(),
        "ucrypt open --test-passphrase",
    );
}

/// `prog ARGS` under gdb, stopped at its `hits`-th fdatasync (the end of
/// a hotzone) and sent SIGINT there: it stops after that hotzone as on
/// Ctrl-C.
fn interrupted_under_gdb(hits: usize, prog: &Path, args: &[std::ffi::OsString]) -> String {
    let mut c = Command::new("gdb");
    c.args(["-q", "-batch", "-ex", "set breakpoint pending on"]);
    c.args(["-ex", "break fdatasync", "-ex", "run"]);
    for _ in 1..hits {
        c.args(["-ex", "continue"]);
    }
    c.args(["-ex", "delete", "-ex", "signal SIGINT"]);
    c.arg("--args").arg(prog).args(args);
    let out = c.output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// A run stopped mid-way by one tool (ucrypt killed at each of its
/// writes; cryptsetup interrupted under gdb) is finished by the other
/// and, for ucrypt's crashes, by ucrypt itself.
#[test]
fn an_interrupted_or_crashed_encryption_is_finished_by_either_tool() {
    if !require_tool("reencrypt_encrypt_crash", "cryptsetup")
        || !require_tool("reencrypt_encrypt_crash", "gdb")
    {
        return;
    }
    // cryptsetup stopped under gdb between two hotzones, finished by ucrypt.
    {
        let p = plain("enc-int", 80);
        let cs = testutil::which("cryptsetup").unwrap();
        let mut args: Vec<std::ffi::OsString> = [
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
            "--encrypt",
            "--type",
            "luks2",
            "--hotzone-size",
            "1M",
        ]
        .into_iter()
        .map(Into::into)
        .collect();
        args.extend(FAST_KDF.iter().map(Into::into));
        args.extend([
            "--key-file".into(),
            p.key.clone().into(),
            "--header".into(),
            p.hdr.clone().into(),
            p.img.clone().into(),
        ]);
        let log = interrupted_under_gdb(3, &cs, &args);
        assert!(in_reencryption(&p.hdr), "cryptsetup stopped mid-way: {log}");
        ok(
            encrypt("ucrypt", &p.hdr, &p.img, &p.key, &["--resume-only"]),
            "ucrypt resumes cryptsetup's",
        );
        check_finished(&p, &p.img, &p.hdr, "cryptsetup interrupted → ucrypt");
    }
    for r in ["checksum", "journal"] {
        let p = plain("enc-crash", 81);
        ok(
            encrypt(
                "ucrypt",
                &p.hdr,
                &p.img,
                &p.key,
                &["--init-only", "--resilience", r],
            ),
            "init",
        );
        let (p_img, p_hdr) = (p.dir.join("p.data"), p.dir.join("p.hdr"));
        std::fs::copy(&p.img, &p_img).unwrap();
        std::fs::copy(&p.hdr, &p_hdr).unwrap();
        let (c_img, c_hdr) = (p.dir.join("c.data"), p.dir.join("c.hdr"));
        let mut n = 1;
        loop {
            std::fs::copy(&p_img, &p.img).unwrap();
            std::fs::copy(&p_hdr, &p.hdr).unwrap();
            let out = Command::new(ucrypt_bin())
                .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
                .args(["reencrypt", "-q", "--encrypt", "--resume-only"])
                .args(["--hotzone-size", "1M", "--key-file"])
                .arg(&p.key)
                .arg("--header")
                .arg(&p.hdr)
                .arg(&p.img)
                .output()
                .unwrap();
            if out.status.success() {
                assert!(n > 10, "{r}: a run has more than 10 writes");
                break;
            }
            std::fs::copy(&p.img, &c_img).unwrap();
            std::fs::copy(&p.hdr, &c_hdr).unwrap();
            if in_reencryption(&p.hdr) {
                ok(
                    encrypt("ucrypt", &p.hdr, &p.img, &p.key, &["--resume-only"]),
                    &format!("{r}: ucrypt resume after crash {n}"),
                );
                ok(
                    Command::new("cryptsetup")
                        .args(["repair", "-q", "--key-file"])
                        .arg(&p.key)
                        .arg("--header")
                        .arg(&c_hdr)
                        .arg(&c_img)
                        .output()
                        .unwrap(),
                    "cryptsetup repair",
                );
                if in_reencryption(&c_hdr) {
                    ok(
                        encrypt("cryptsetup", &c_hdr, &c_img, &p.key, &["--resume-only"]),
                        &format!("{r}: cryptsetup resume after crash {n}"),
                    );
                }
                check_finished(
                    &p,
                    &c_img,
                    &c_hdr,
                    &format!("{r}: cryptsetup after crash {n}"),
                );
            }
            check_finished(&p, &p.img, &p.hdr, &format!("{r}: ucrypt after crash {n}"));
            n += 1;
        }
    }
}

fn hash_of(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

/// Misuse is refused with cryptsetup's message and exit code, and
/// nothing is written (every file's bytes compared before and after).
#[test]
fn misuse_is_refused_and_nothing_is_written() {
    if !require_tool("reencrypt_encrypt_misuse", "cryptsetup") {
        return;
    }
    let p = plain("enc-misuse", 90);
    // A LUKS2 image (header on it) and a detached LUKS2 header.
    let luks = p.dir.join("luks");
    std::fs::write(&luks, vec![0u8; 20 << 20]).unwrap();
    ok(
        Command::new("cryptsetup")
            .args(testutil::FAST_LUKS2_FORMAT)
            .arg("--key-file")
            .arg(&p.key)
            .arg(&luks)
            .output()
            .unwrap(),
        "luksFormat",
    );
    let before =
        |paths: &[&Path]| -> Vec<Option<Vec<u8>>> { paths.iter().map(|p| hash_of(p)).collect() };
    let refused = |out: Output, want: &str, paths: &[&Path], was: Vec<Option<Vec<u8>>>| {
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{want}: {err}");
        assert!(err.contains(want), "want {want:?}, got {err:?}");
        for (p, w) in paths.iter().zip(was) {
            assert!(hash_of(p) == w, "{want}: {} changed", p.display());
        }
    };
    let new_hdr = p.dir.join("new-hdr");
    // The data device carries LUKS already.
    let paths: [&Path; 2] = [&luks, &new_hdr];
    let was = before(&paths);
    refused(
        encrypt("ucrypt", &new_hdr, &luks, &p.key, &[]),
        &format!(
            "Device {} is already LUKS device. Aborting operation.",
            luks.display()
        ),
        &paths,
        was,
    );
    // The header file is an ordinary LUKS header.
    let paths: [&Path; 2] = [&p.img, &luks];
    let was = before(&paths);
    refused(
        encrypt("ucrypt", &luks, &p.img, &p.key, &[]),
        &format!(
            "Device {} is already LUKS device. Aborting operation.",
            luks.display()
        ),
        &paths,
        was,
    );
    // No --header (and no --reduce-device-size).
    let paths: [&Path; 1] = [&p.img];
    let was = before(&paths);
    refused(
        Command::new(ucrypt_bin())
            .args(["reencrypt", "-q", "--encrypt", "--key-file"])
            .arg(&p.key)
            .arg(&p.img)
            .output()
            .unwrap(),
        "Encryption without detached header (--header) is not possible without data device \
         size reduction (--reduce-device-size).",
        &paths,
        was,
    );
    // --resume-only with a missing header, or one not in reencryption.
    let paths: [&Path; 3] = [&p.img, &luks, &new_hdr];
    for hdr in [&new_hdr, &luks] {
        let was = before(&paths);
        refused(
            encrypt("ucrypt", hdr, &p.img, &p.key, &["--resume-only"]),
            "Device reencryption not in progress.",
            &paths,
            was,
        );
    }
    // A second --encrypt --init-only of a device in reencryption; an
    // --encrypt whose data device is a header in reencryption.
    ok(
        encrypt("ucrypt", &p.hdr, &p.img, &p.key, &["--init-only"]),
        "init",
    );
    let paths: [&Path; 2] = [&p.img, &p.hdr];
    let was = before(&paths);
    refused(
        encrypt("ucrypt", &p.hdr, &p.img, &p.key, &["--init-only"]),
        "LUKS2 reencryption already initialized. Aborting operation.",
        &paths,
        was,
    );
    let paths: [&Path; 3] = [&p.img, &p.hdr, &new_hdr];
    let was = before(&paths);
    refused(
        encrypt("ucrypt", &new_hdr, &p.hdr, &p.key, &[]),
        &format!(
            "Device {} is already in LUKS reencryption. Aborting operation.",
            p.hdr.display()
        ),
        &paths,
        was,
    );
    // A wrong passphrase on resume.
    let wrong = p.dir.join("wrong");
    std::fs::write(&wrong, b"not the passphrase").unwrap();
    let out = encrypt("ucrypt", &p.hdr, &p.img, &wrong, &["--resume-only"]);
    assert_eq!(out.status.code(), Some(2), "wrong passphrase");
    assert_eq!(std::fs::read(&p.img).unwrap(), p.plain);
    // --reduce-device-size that is not a multiple of 512.
    let paths: [&Path; 1] = [&p.img];
    let was = before(&paths);
    refused(
        Command::new(ucrypt_bin())
            .args([
                "reencrypt",
                "-q",
                "--encrypt",
                "--reduce-device-size",
                "1000",
            ])
            .arg("--key-file")
            .arg(&p.key)
            .arg(&p.img)
            .output()
            .unwrap(),
        "Reduce size must be multiple of 512 bytes sector.",
        &paths,
        was,
    );
}

/// The device of a data shift: 12 MiB, of which the last `REDUCE` are
/// free; the data moves by half of it.
const SHIFT_DEV: usize = 12 << 20;
const REDUCE: &str = "4M";
const REDUCE_BYTES: usize = 4 << 20;

/// `TOOL reencrypt --encrypt --reduce-device-size REDUCE ARGS DEV`.
fn encrypt_shift(tool: &str, dev: &Path, key: &Path, args: &[&str]) -> Output {
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.args(["reencrypt", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(ucrypt_bin());
        c.arg("reencrypt");
        c
    };
    c.args([
        "-q",
        "--encrypt",
        "--type",
        "luks2",
        "--reduce-device-size",
        REDUCE,
    ])
    .args(FAST_KDF)
    .arg("--key-file")
    .arg(key)
    .args(args)
    .arg(dev)
    .output()
    .unwrap()
}

/// A 12 MiB plaintext device of seeded random bytes.
fn shift_device(tag: &str, seed: u64) -> Plain {
    let p = plain(tag, seed);
    let mut all = vec![0u8; SHIFT_DEV];
    Rng::new(seed).fill(&mut all);
    std::fs::write(&p.img, &all).unwrap();
    Plain { plain: all, ..p }
}

#[test]
fn reduce_device_size_is_cryptsetups_and_each_tool_finishes_the_other() {
    if !require_tool("reencrypt_encrypt_shift", "cryptsetup") {
        return;
    }
    let p = shift_device("enc-shift", 100);
    let data = &p.plain[..SHIFT_DEV - REDUCE_BYTES];
    let c_img = p.dir.join("c.data");
    std::fs::copy(&p.img, &c_img).unwrap();
    ok(
        encrypt_shift("ucrypt", &p.img, &p.key, &["--init-only"]),
        "ucrypt init",
    );
    ok(
        encrypt_shift("cryptsetup", &c_img, &p.key, &["--init-only"]),
        "cryptsetup init",
    );
    assert_eq!(shape(json(&p.img)), shape(json(&c_img)), "init");
    // Both devices hold the same bytes outside the header: the data in
    // place and its first half-shift moved to the end.
    let (a, b) = (
        std::fs::read(&p.img).unwrap(),
        std::fs::read(&c_img).unwrap(),
    );
    assert!(a[2 << 20..] == b[2 << 20..], "moved data");
    ok(
        encrypt_shift("cryptsetup", &p.img, &p.key, &["--resume-only"]),
        "cryptsetup finishes ucrypt's",
    );
    ok(
        encrypt_shift("ucrypt", &c_img, &p.key, &["--resume-only"]),
        "ucrypt finishes cryptsetup's",
    );
    check_volume(&p.key, &p.img, None, data, "ucrypt → cryptsetup");
    check_volume(&p.key, &c_img, None, data, "cryptsetup → ucrypt");
    assert_eq!(shape(json(&p.img)), shape(json(&c_img)), "finished");
    // A whole ucrypt run; the moved copy of the plaintext is wiped.
    let p = shift_device("enc-shift-full", 101);
    ok(encrypt_shift("ucrypt", &p.img, &p.key, &[]), "ucrypt");
    check_volume(
        &p.key,
        &p.img,
        None,
        &p.plain[..SHIFT_DEV - REDUCE_BYTES],
        "ucrypt run",
    );
    let bytes = std::fs::read(&p.img).unwrap();
    assert!(
        bytes[SHIFT_DEV - (2 << 20)..] != p.plain[..2 << 20],
        "the moved plaintext is wiped"
    );
}

/// ucrypt killed at each write of an encryption with a data shift (its
/// init and its run) leaves a device ucrypt, and on a copy cryptsetup,
/// finishes with the data intact.
#[test]
fn a_crashed_encryption_with_a_data_shift_is_finished_by_either_tool() {
    if !require_tool("reencrypt_encrypt_shift_crash", "cryptsetup") {
        return;
    }
    let p = shift_device("enc-shift-crash", 110);
    let data = p.plain[..SHIFT_DEV - REDUCE_BYTES].to_vec();
    let c_img = p.dir.join("c.data");
    // The init: killed before its header reaches the device, the device
    // is the plaintext still.
    for n in 1..=3 {
        std::fs::write(&p.img, &p.plain).unwrap();
        let out = Command::new(ucrypt_bin())
            .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
            .env("TMPDIR", &p.dir)
            .args([
                "reencrypt",
                "-q",
                "--encrypt",
                "--reduce-device-size",
                REDUCE,
            ])
            .args(FAST_KDF)
            .arg("--init-only")
            .arg("--key-file")
            .arg(&p.key)
            .arg(&p.img)
            .output()
            .unwrap();
        assert!(!out.status.success(), "init crash {n}");
        let now = std::fs::read(&p.img).unwrap();
        assert!(now[..data.len()] == data[..], "init crash {n}: data intact");
    }
    std::fs::write(&p.img, &p.plain).unwrap();
    ok(
        encrypt_shift("ucrypt", &p.img, &p.key, &["--init-only"]),
        "init",
    );
    let start = std::fs::read(&p.img).unwrap();
    let mut n = 1;
    loop {
        std::fs::write(&p.img, &start).unwrap();
        let out = Command::new(ucrypt_bin())
            .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
            .args([
                "reencrypt",
                "-q",
                "--encrypt",
                "--resume-only",
                "--key-file",
            ])
            .arg(&p.key)
            .arg(&p.img)
            .output()
            .unwrap();
        if out.status.success() {
            assert!(n > 10, "a run has more than 10 writes");
            break;
        }
        std::fs::copy(&p.img, &c_img).unwrap();
        if in_reencryption(&p.img) {
            ok(
                encrypt_shift("ucrypt", &p.img, &p.key, &["--resume-only"]),
                &format!("ucrypt resume after crash {n}"),
            );
            // cryptsetup wants its repair first after a crash.
            ok(
                Command::new("cryptsetup")
                    .args(["repair", "-q", "--key-file"])
                    .arg(&p.key)
                    .arg(&c_img)
                    .output()
                    .unwrap(),
                "cryptsetup repair",
            );
            if in_reencryption(&c_img) {
                ok(
                    encrypt_shift("cryptsetup", &c_img, &p.key, &["--resume-only"]),
                    &format!("cryptsetup resume after crash {n}"),
                );
            }
            check_volume(
                &p.key,
                &c_img,
                None,
                &data,
                &format!("cryptsetup after crash {n}"),
            );
        }
        check_volume(
            &p.key,
            &p.img,
            None,
            &data,
            &format!("ucrypt after crash {n}"),
        );
        n += 1;
    }
}

#[test]
fn a_data_shift_is_refused_where_cryptsetup_refuses_it() {
    if !require_tool("reencrypt_encrypt_shift_misuse", "cryptsetup") {
        return;
    }
    let p = plain("enc-shift-misuse", 120);
    let was = std::fs::read(&p.img).unwrap();
    for (reduce, want) in [
        ("4M", format!("Device {} is too small.", p.img.display())),
        ("2G", "Maximum device reduce size is 1 GiB.".to_string()),
        ("64K", "No space for new keyslot.".to_string()),
    ] {
        let out = Command::new(ucrypt_bin())
            .args([
                "reencrypt",
                "-q",
                "--encrypt",
                "--reduce-device-size",
                reduce,
            ])
            .args(FAST_KDF)
            .arg("--key-file")
            .arg(&p.key)
            .arg(&p.img)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{reduce}: {err}");
        assert!(err.contains(&want), "{reduce}: want {want:?}, got {err:?}");
        assert!(
            std::fs::read(&p.img).unwrap() == was,
            "{reduce}: nothing written"
        );
    }
}
