//! `ucrypt reencrypt` against cryptsetup 2.6.1 (`--force-offline-reencrypt`
//! on image files): each tool resumes what the other started, crashes
//! injected at every write of a run are repaired by both, the header
//! ucrypt writes is cryptsetup's field by field, and the plaintext read
//! back through `ucrypt map --luks` equals the original.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

const DATA: usize = 8 << 20;

struct Vol {
    _dir: TempDir,
    dir: PathBuf,
    img: PathBuf,
    key: PathBuf,
    plain: Vec<u8>,
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// `out`, after checking that its command succeeded (`what` names it).
pub(crate) fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A cryptsetup LUKS2 volume (16 MiB header, 8 MiB data) filled with
/// seeded random plaintext through ucrypt's map.
fn volume(tag: &str, seed: u64) -> Vol {
    volume_sized(tag, seed, DATA, &[])
}

/// [`volume`] with `data` bytes of data, formatted with `format` added
/// to cryptsetup's `luksFormat` arguments.
fn volume_sized(tag: &str, seed: u64, data: usize, format: &[&str]) -> Vol {
    let dir = TempDir::new(tag);
    let img = dir.path().join("img");
    let key = dir.path().join("key");
    std::fs::write(&key, b"reencrypt passphrase").unwrap();
    let f = std::fs::File::create(&img).unwrap();
    f.set_len((16 << 20) + data as u64).unwrap();
    ok(
        run(Command::new("cryptsetup")
            .args(testutil::FAST_LUKS2_FORMAT)
            .args(format)
            .arg("--key-file")
            .arg(&key)
            .arg(&img)),
        "luksFormat",
    );
    let mut plain = vec![0u8; data];
    Rng::new(seed).fill(&mut plain);
    write_plain(&img, &key, &plain);
    let d = dir.path().to_path_buf();
    Vol {
        _dir: dir,
        dir: d,
        img,
        key,
        plain,
    }
}

fn write_plain(img: &Path, key: &Path, plain: &[u8]) {
    use std::io::Write;
    let mut c = Command::new(ucrypt_bin())
        .args(["map", "--write", "--luks"])
        .arg(img)
        .arg("--key-file")
        .arg(key)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(plain).unwrap();
    assert!(c.wait().unwrap().success());
}

fn read_plain(img: &Path, key: &Path) -> Vec<u8> {
    ok(
        run(Command::new(ucrypt_bin())
            .args(["map", "--read", "--luks"])
            .arg(img)
            .arg("--key-file")
            .arg(key)),
        "map --read",
    )
    .stdout
}

fn ucrypt(img: &Path, key: &Path, args: &[&str]) -> Output {
    run(Command::new(ucrypt_bin())
        .args(["reencrypt", "-q", "--key-file"])
        .arg(key)
        .args(args)
        .arg(img))
}

fn cryptsetup_reencrypt(img: &Path, key: &Path, args: &[&str]) -> Output {
    run(Command::new("cryptsetup")
        .args(["reencrypt", "-q", "--force-offline-reencrypt", "--key-file"])
        .arg(key)
        .args(args)
        .arg(img))
}

fn json(img: &Path) -> Value {
    let out = ok(
        run(Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(img)),
        "luksDump --dump-json-metadata",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn volume_key(img: &Path, key: &Path) -> String {
    let out = ok(
        run(Command::new("cryptsetup")
            .args(["luksDump", "-q", "--dump-volume-key", "--key-file"])
            .arg(key)
            .arg(img)),
        "luksDump --dump-volume-key",
    );
    String::from_utf8(out.stdout).unwrap()
}

fn in_reencryption(img: &Path) -> bool {
    json(img)["config"]["requirements"]["mandatory"]
        .as_array()
        .is_some_and(|m| m.iter().any(|r| r == "online-reencrypt-v2"))
}

/// Salts, digests and the keyslot material's place aside, the metadata.
fn shape(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("salt");
                m.remove("digest");
                for x in m.values_mut() {
                    strip(x);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

#[test]
fn a_full_ucrypt_run_is_cryptsetups_and_keeps_the_plaintext() {
    if !require_tool("reencrypt_full", "cryptsetup") {
        return;
    }
    for (i, r) in ["checksum", "journal", "none"].into_iter().enumerate() {
        let v = volume("reenc-full", 10 + i as u64);
        let before = volume_key(&v.img, &v.key);
        ok(
            ucrypt(&v.img, &v.key, &["--resilience", r, "--hotzone-size", "1M"]),
            r,
        );
        assert!(!in_reencryption(&v.img));
        ok(
            run(Command::new("cryptsetup")
                .args(["open", "--test-passphrase", "--key-file"])
                .arg(&v.key)
                .arg(&v.img)),
            "open --test-passphrase",
        );
        assert_ne!(
            volume_key(&v.img, &v.key),
            before,
            "{r}: the volume key changed"
        );
        assert_eq!(read_plain(&v.img, &v.key), v.plain, "{r}: plaintext");
        let j = json(&v.img);
        let ks: Vec<&String> = j["keyslots"].as_object().unwrap().keys().collect();
        assert_eq!(ks, ["1"], "{r}: only the new keyslot is left");
        assert_eq!(j["segments"]["0"]["size"], "dynamic");
        assert!(j["config"].get("requirements").is_none(), "{r}: {j}");
    }
}

#[test]
fn init_only_writes_what_cryptsetup_writes() {
    if !require_tool("reencrypt_init_json", "cryptsetup") {
        return;
    }
    for r in ["checksum", "journal", "none"] {
        let v = volume("reenc-init", 3);
        let cs = v.dir.join("cs.img");
        std::fs::copy(&v.img, &cs).unwrap();
        ok(
            ucrypt(&v.img, &v.key, &["--init-only", "--resilience", r]),
            "ucrypt init",
        );
        ok(
            cryptsetup_reencrypt(&cs, &v.key, &["--init-only", "--resilience", r]),
            "cryptsetup init",
        );
        assert_eq!(shape(json(&v.img)), shape(json(&cs)), "{r}");
    }
}

#[test]
fn each_tool_resumes_what_the_other_initialized() {
    if !require_tool("reencrypt_resume", "cryptsetup") {
        return;
    }
    for r in ["checksum", "journal", "none"] {
        let v = volume("reenc-resume", 4);
        let other = v.dir.join("other.img");
        std::fs::copy(&v.img, &other).unwrap();
        ok(
            cryptsetup_reencrypt(&v.img, &v.key, &["--init-only", "--resilience", r]),
            r,
        );
        ok(
            ucrypt(&v.img, &v.key, &["--resume-only", "--hotzone-size", "1M"]),
            r,
        );
        assert!(!in_reencryption(&v.img));
        assert_eq!(
            read_plain(&v.img, &v.key),
            v.plain,
            "{r}: cryptsetup → ucrypt"
        );

        ok(
            ucrypt(&other, &v.key, &["--init-only", "--resilience", r]),
            r,
        );
        ok(cryptsetup_reencrypt(&other, &v.key, &["--resume-only"]), r);
        assert!(!in_reencryption(&other));
        assert_eq!(
            read_plain(&other, &v.key),
            v.plain,
            "{r}: ucrypt → cryptsetup"
        );
    }
}

/// Every write of a run (hotzone data pieces, the resilience area, each
/// header copy) is a crash point: after an abort there, ucrypt and (on a
/// copy, after its `repair`) cryptsetup both finish with the plaintext
/// intact. A checksum hotzone of 2 MiB stays in the mover's memory
/// between its checksums and its write; one of 8 MiB is read again for
/// the write.
#[test]
fn a_crash_at_any_write_is_repaired_by_both_tools() {
    if !require_tool("reencrypt_crash", "cryptsetup") {
        return;
    }
    for (r, hotzone) in [("checksum", "2M"), ("checksum", "8M"), ("journal", "2M")] {
        let v = volume("reenc-crash", 5);
        let pristine = v.dir.join("pristine.img");
        std::fs::copy(&v.img, &pristine).unwrap();
        let mut n = 1;
        loop {
            std::fs::copy(&pristine, &v.img).unwrap();
            let out = run(Command::new(ucrypt_bin())
                .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
                .args([
                    "reencrypt",
                    "-q",
                    "--hotzone-size",
                    hotzone,
                    "--resilience",
                    r,
                    "--key-file",
                ])
                .arg(&v.key)
                .arg(&v.img));
            if out.status.success() {
                assert!(n > 10, "{r} {hotzone}: a run has more than 10 writes");
                break;
            }
            let cs = v.dir.join("cs.img");
            std::fs::copy(&v.img, &cs).unwrap();
            if in_reencryption(&v.img) {
                ok(ucrypt(&v.img, &v.key, &["--resume-only"]), "ucrypt resume");
                ok(
                    run(Command::new("cryptsetup")
                        .args(["repair", "-q", "--key-file"])
                        .arg(&v.key)
                        .arg(&cs)),
                    "cryptsetup repair",
                );
                // Its repair finishes a run whose last hotzone it repairs.
                if in_reencryption(&cs) {
                    ok(
                        cryptsetup_reencrypt(&cs, &v.key, &["--resume-only"]),
                        "cryptsetup resume",
                    );
                }
            }
            assert_eq!(
                read_plain(&v.img, &v.key),
                v.plain,
                "{r} {hotzone}: ucrypt after crash {n}"
            );
            assert_eq!(
                read_plain(&cs, &v.key),
                v.plain,
                "{r} {hotzone}: cryptsetup after crash {n}"
            );
            n += 1;
        }
    }
}

/// A data area in 512-byte sectors that ends 1.5 KiB into a 4096-byte
/// checksum block: the short last block is hashed as it is, and a crash
/// at any write of the run is repaired by ucrypt with the plaintext
/// intact (cryptsetup repairs whole blocks only, so its repair is not
/// asked for here).
#[test]
fn a_short_last_checksum_block_is_protected_too() {
    if !require_tool("reencrypt_short_block", "cryptsetup") {
        return;
    }
    let v = volume_sized("reenc-short", 7, DATA + 1536, &["--sector-size", "512"]);
    let pristine = v.dir.join("pristine.img");
    std::fs::copy(&v.img, &pristine).unwrap();
    let mut n = 1;
    loop {
        std::fs::copy(&pristine, &v.img).unwrap();
        let out = run(Command::new(ucrypt_bin())
            .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
            .args(["reencrypt", "-q", "--key-file"])
            .arg(&v.key)
            .arg(&v.img));
        if out.status.success() {
            assert!(n > 10, "a run has more than 10 writes");
            break;
        }
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "crash {n}: {out:?}"
        );
        if in_reencryption(&v.img) {
            ok(ucrypt(&v.img, &v.key, &["--resume-only"]), "ucrypt resume");
        }
        assert_eq!(read_plain(&v.img, &v.key), v.plain, "after crash {n}");
        n += 1;
    }
    assert!(!in_reencryption(&v.img));
    ok(
        run(Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&v.key)
            .arg(&v.img)),
        "open --test-passphrase",
    );
    assert_eq!(read_plain(&v.img, &v.key), v.plain, "plaintext");
}

#[test]
fn tampered_metadata_and_misuse_are_refused_and_nothing_is_written() {
    if !require_tool("reencrypt_refusals", "cryptsetup") {
        return;
    }
    let v = volume("reenc-refuse", 6);
    let before = std::fs::read(&v.img).unwrap();
    let out = ucrypt(&v.img, &v.key, &["--resume-only"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Device reencryption not in progress."));
    let wrong = v.dir.join("wrong");
    std::fs::write(&wrong, b"not it").unwrap();
    let out = ucrypt(&v.img, &wrong, &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(std::fs::read(&v.img).unwrap() == before, "nothing written");

    // A changed reencrypt keyslot (another checksum hash) with valid
    // header checksums: the verification digest refuses it.
    ok(ucrypt(&v.img, &v.key, &["--init-only"]), "init");
    let out = ucrypt(&v.img, &v.key, &["--init-only"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already initialized"));
    // Both copies' JSON patched in place, their checksums recomputed.
    let mut img = std::fs::read(&v.img).unwrap();
    for base in [0usize, 16384] {
        let area = &mut img[base + 4096..base + 16384];
        let end = area.iter().position(|&b| b == 0).unwrap();
        let text = String::from_utf8(area[..end].to_vec()).unwrap();
        let changed = text.replacen(
            "\"hash\":\"sha256\",\"offset\":\"548864\"",
            "\"hash\":\"sha1\",\"offset\":\"548864\"",
            1,
        );
        assert_ne!(changed, text);
        area[..changed.len()].copy_from_slice(changed.as_bytes());
        for b in &mut area[changed.len()..] {
            *b = 0;
        }
        // Header checksum: sha256 over the area with the field zeroed.
        let hdr = &mut img[base..base + 16384];
        hdr[0x1c0..0x1c0 + 64].fill(0);
        let sum = sha256(hdr);
        hdr[0x1c0..0x1c0 + 32].copy_from_slice(&sum);
    }
    std::fs::write(&v.img, &img).unwrap();
    let tampered = std::fs::read(&v.img).unwrap();
    let out = ucrypt(&v.img, &v.key, &["--resume-only"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("verification digest does not match"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&v.img).unwrap() == tampered,
        "nothing written"
    );
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let out = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b)?;
            c.wait_with_output()
        })
        .unwrap();
    let hex = String::from_utf8(out.stdout).unwrap();
    let mut s = [0u8; 32];
    for (i, x) in s.iter_mut().enumerate() {
        *x = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    s
}

/// `prog ARGS` under gdb: stopped at its `hits`-th fdatasync (the end of
/// a hotzone), then SIGINT (`kill` false: it stops after that hotzone as
/// on Ctrl-C) or killed there (`kill` true: a crash mid-hotzone, the
/// hotzone's header written, the data synced, the next header not).
pub(crate) fn under_gdb(hits: usize, kill: bool, prog: &Path, args: &[&std::ffi::OsStr]) -> String {
    let mut c = Command::new("gdb");
    c.args([
        "-q",
        "-batch",
        "-ex",
        "set breakpoint pending on",
        "-ex",
        "break fdatasync",
        "-ex",
        "run",
    ]);
    for _ in 1..hits {
        c.args(["-ex", "continue"]);
    }
    if !kill {
        c.args(["-ex", "delete", "-ex", "signal SIGINT"]);
    }
    c.arg("--args").arg(prog).args(args);
    let out = c.output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn interrupted_or_killed_mid_way_the_other_tool_finishes() {
    if !require_tool("reencrypt_interrupt", "cryptsetup")
        || !require_tool("reencrypt_interrupt", "gdb")
    {
        return;
    }
    let cs = testutil::which("cryptsetup").unwrap();
    for kill in [false, true] {
        // cryptsetup stopped → ucrypt resumes.
        let v = volume("reenc-int", 8);
        let copy = v.dir.join("copy.img");
        std::fs::copy(&v.img, &copy).unwrap();
        let args: Vec<&std::ffi::OsStr> = [
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
            "--hotzone-size",
            "1M",
            "--key-file",
        ]
        .iter()
        .map(std::ffi::OsStr::new)
        .chain([v.key.as_os_str(), v.img.as_os_str()])
        .collect();
        let text = under_gdb(3, kill, &cs, &args);
        assert!(kill || text.contains("Reencryption interrupted"), "{text}");
        assert!(in_reencryption(&v.img));
        ok(ucrypt(&v.img, &v.key, &["--resume-only"]), "ucrypt resume");
        assert_eq!(
            read_plain(&v.img, &v.key),
            v.plain,
            "cryptsetup stopped (kill {kill}) → ucrypt"
        );

        // ucrypt stopped → cryptsetup resumes (after its repair when killed).
        let args: Vec<&std::ffi::OsStr> = ["reencrypt", "-q", "--hotzone-size", "1M", "--key-file"]
            .iter()
            .map(std::ffi::OsStr::new)
            .chain([v.key.as_os_str(), copy.as_os_str()])
            .collect();
        let text = under_gdb(3, kill, &ucrypt_bin(), &args);
        assert!(kill || text.contains("Reencryption interrupted."), "{text}");
        assert!(in_reencryption(&copy));
        if kill {
            ok(
                run(Command::new("cryptsetup")
                    .args(["repair", "-q", "--key-file"])
                    .arg(&v.key)
                    .arg(&copy)),
                "cryptsetup repair",
            );
        }
        ok(
            cryptsetup_reencrypt(&copy, &v.key, &["--resume-only"]),
            "cryptsetup resume",
        );
        assert_eq!(
            read_plain(&copy, &v.key),
            v.plain,
            "ucrypt stopped (kill {kill}) → cryptsetup"
        );
    }
}

#[test]
fn a_new_cipher_key_size_or_sector_size_is_cryptsetups_too() {
    if !require_tool("reencrypt_new_layout", "cryptsetup") {
        return;
    }
    let cases: [&[&str]; 2] = [
        &["--sector-size", "512"],
        &["--cipher", "aes-cbc-essiv:sha256", "--key-size", "256"],
    ];
    for opts in cases {
        let v = volume("reenc-layout", 9);
        let other = v.dir.join("other.img");
        std::fs::copy(&v.img, &other).unwrap();
        let mut args = opts.to_vec();
        args.extend(["--hotzone-size", "1M"]);
        ok(ucrypt(&v.img, &v.key, &args), "ucrypt");
        assert_eq!(read_plain(&v.img, &v.key), v.plain, "{opts:?}");
        let seg = &json(&v.img)["segments"]["0"];
        if opts[0] == "--sector-size" {
            assert_eq!(seg["sector_size"], 512);
        } else {
            assert_eq!(seg["encryption"], "aes-cbc-essiv:sha256");
            assert_eq!(json(&v.img)["keyslots"]["1"]["key_size"], 32);
        }
        let mut args = opts.to_vec();
        args.push("--init-only");
        ok(ucrypt(&other, &v.key, &args), "ucrypt init");
        ok(
            cryptsetup_reencrypt(&other, &v.key, &["--resume-only"]),
            "cryptsetup",
        );
        assert_eq!(
            read_plain(&other, &v.key),
            v.plain,
            "{opts:?} ucrypt → cryptsetup"
        );
        assert_eq!(json(&other)["segments"]["0"], *seg);
    }
}

/// `kill -9` at seeded random moments of real runs (64 MiB, 1 MiB
/// hotzones): whatever state is left, ucrypt and (on a copy, after its
/// repair) cryptsetup finish it with the plaintext intact.
#[test]
fn kill_9_at_random_moments_loses_nothing() {
    if !require_tool("reencrypt_kill9", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("reenc-kill9");
    let img = dir.path().join("img");
    let key = dir.path().join("key");
    std::fs::write(&key, b"kill passphrase").unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len((16 << 20) + (64 << 20))
        .unwrap();
    ok(
        run(Command::new("cryptsetup")
            .args(testutil::FAST_LUKS2_FORMAT)
            .arg("--key-file")
            .arg(&key)
            .arg(&img)),
        "luksFormat",
    );
    let mut plain = vec![0u8; 64 << 20];
    let mut rng = Rng::new(99);
    rng.fill(&mut plain);
    write_plain(&img, &key, &plain);
    let pristine = dir.path().join("pristine");
    std::fs::copy(&img, &pristine).unwrap();
    for round in 0..4 {
        std::fs::copy(&pristine, &img).unwrap();
        let mut child = Command::new(ucrypt_bin())
            .args(["reencrypt", "-q", "--hotzone-size", "1M", "--resilience"])
            .arg(if round % 2 == 0 {
                "checksum"
            } else {
                "journal"
            })
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(rng.below(400)));
        let _ = child.kill();
        let _ = child.wait();
        let cs = dir.path().join("cs");
        std::fs::copy(&img, &cs).unwrap();
        if in_reencryption(&img) {
            ok(ucrypt(&img, &key, &["--resume-only"]), "ucrypt resume");
            let _ = run(Command::new("cryptsetup")
                .args(["repair", "-q", "--key-file"])
                .arg(&key)
                .arg(&cs));
            if in_reencryption(&cs) {
                ok(
                    cryptsetup_reencrypt(&cs, &key, &["--resume-only"]),
                    "cryptsetup resume",
                );
            }
        }
        assert!(read_plain(&img, &key) == plain, "round {round}: ucrypt");
        assert!(read_plain(&cs, &key) == plain, "round {round}: cryptsetup");
    }
}

/// A volume cryptsetup left between two hotzones is served as cryptsetup
/// would map it (new key below the reencryption point, old above):
/// `map --luks` and `open` (read through NBD with nbdcopy) give the
/// plaintext, writes across the boundary land under the right keys (the
/// volume then finishes with `ucrypt reencrypt --resume-only` and reads
/// back what was written), and a hotzone a crash tore is refused until
/// it is repaired, with nothing written.
#[test]
fn a_volume_mid_reencryption_opens_and_maps() {
    if !require_tool("reencrypt_open", "cryptsetup")
        || !require_tool("reencrypt_open", "gdb")
        || !require_tool("reencrypt_open", "nbdcopy")
    {
        return;
    }
    let cs = testutil::which("cryptsetup").unwrap();
    let stop_cryptsetup = |v: &Vol, kill: bool| {
        let args: Vec<&std::ffi::OsStr> = [
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
            "--hotzone-size",
            "1M",
            "--key-file",
        ]
        .iter()
        .map(std::ffi::OsStr::new)
        .chain([v.key.as_os_str(), v.img.as_os_str()])
        .collect();
        let text = under_gdb(3, kill, &cs, &args);
        assert!(in_reencryption(&v.img), "{text}");
    };

    // Stopped cleanly: served and mapped like any volume.
    let mut v = volume("reenc-open", 21);
    stop_cryptsetup(&v, false);
    assert_eq!(read_plain(&v.img, &v.key), v.plain, "map --luks mid-way");

    let rt = v.dir.join("rt");
    let out = ok(
        run(Command::new(ucrypt_bin())
            .env("UCRYPT_RUNTIME_DIR", &rt)
            .args(["open", "--key-file"])
            .arg(&v.key)
            .arg(&v.img)
            .arg("mid")),
        "open mid-way",
    );
    let served = v.dir.join("served.img");
    let uri = format!("nbd+unix:///?socket={}", rt.join("mid.nbd.sock").display());
    let copied = run(Command::new("nbdcopy").arg(&uri).arg(&served));
    let status = run(Command::new(ucrypt_bin())
        .env("UCRYPT_RUNTIME_DIR", &rt)
        .args(["status", "mid"]));
    ok(
        run(Command::new(ucrypt_bin())
            .env("UCRYPT_RUNTIME_DIR", &rt)
            .args(["close", "mid"])),
        "close",
    );
    ok(
        copied,
        &format!("nbdcopy ({})", String::from_utf8_lossy(&out.stdout)),
    );
    assert_eq!(
        std::fs::read(&served).unwrap(),
        v.plain,
        "read through open mid-way; status:\n{}",
        String::from_utf8_lossy(&status.stdout)
    );

    // Writes on both sides of the boundary, then the rest is reencrypted.
    Rng::new(22).fill(&mut v.plain);
    write_plain(&v.img, &v.key, &v.plain);
    assert_eq!(read_plain(&v.img, &v.key), v.plain, "written mid-way");
    ok(ucrypt(&v.img, &v.key, &["--resume-only"]), "ucrypt resume");
    assert!(!in_reencryption(&v.img));
    assert_eq!(read_plain(&v.img, &v.key), v.plain, "after the resume");

    // Killed inside a hotzone: `open --test-passphrase` refuses it and
    // writes nothing; `map` repairs it first (as cryptsetup recovers it
    // at activation) and reads the plaintext.
    let v = volume("reenc-torn", 23);
    stop_cryptsetup(&v, true);
    let before = sha256(&std::fs::read(&v.img).unwrap());
    let out = run(Command::new(ucrypt_bin())
        .args(["open", "--test-passphrase"])
        .arg(&v.img)
        .arg("--key-file")
        .arg(&v.key));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("requires reencryption recovery"),
        "{err}"
    );
    assert_eq!(sha256(&std::fs::read(&v.img).unwrap()), before);
    assert_eq!(
        read_plain(&v.img, &v.key),
        v.plain,
        "map repairs the hotzone"
    );
}

/// A LUKS2 volume with a detached header (`hdr`, cryptsetup's format;
/// data offset 0 on an 8 MiB data file `img`) filled with seeded random
/// plaintext through ucrypt's map.
fn detached(tag: &str, seed: u64) -> (Vol, PathBuf) {
    let dir = TempDir::new(tag);
    let img = dir.path().join("data");
    let hdr = dir.path().join("hdr");
    let key = dir.path().join("key");
    std::fs::write(&key, b"reencrypt passphrase").unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(DATA as u64)
        .unwrap();
    ok(
        run(Command::new("cryptsetup")
            .args(testutil::FAST_LUKS2_FORMAT)
            .arg("--header")
            .arg(&hdr)
            .arg("--key-file")
            .arg(&key)
            .arg(&img)),
        "luksFormat --header",
    );
    let mut plain = vec![0u8; DATA];
    Rng::new(seed).fill(&mut plain);
    use std::io::Write;
    let mut c = Command::new(ucrypt_bin())
        .args(["map", "--write", "--luks"])
        .arg(&img)
        .arg("--header")
        .arg(&hdr)
        .arg("--key-file")
        .arg(&key)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&plain).unwrap();
    assert!(c.wait().unwrap().success());
    let d = dir.path().to_path_buf();
    (
        Vol {
            _dir: dir,
            dir: d,
            img,
            key,
            plain,
        },
        hdr,
    )
}

/// `tool reencrypt --decrypt --header HDR ARGS DATA` (cryptsetup offline).
fn decrypt(tool: &str, hdr: &Path, data: &Path, key: &Path, args: &[&str]) -> Output {
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.args(["reencrypt", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(ucrypt_bin());
        c.arg("reencrypt");
        c
    };
    run(c
        .args(["-q", "--decrypt", "--key-file"])
        .arg(key)
        .arg("--header")
        .arg(hdr)
        .args(args)
        .arg(data))
}

/// The header cryptsetup 2.6.1 leaves after a decryption: no keyslots,
/// no digests, one linear segment over the whole device.
fn decrypted_header(hdr: &Path) {
    let j = json(hdr);
    assert_eq!(j["keyslots"], serde_json::json!({}), "{j}");
    assert_eq!(j["digests"], serde_json::json!({}), "{j}");
    assert_eq!(
        j["segments"],
        serde_json::json!({"0": {"type": "linear", "offset": "0", "size": "dynamic"}}),
        "{j}"
    );
    assert!(j["config"].get("requirements").is_none(), "{j}");
}

#[test]
fn decrypt_with_a_detached_header_is_cryptsetups_and_each_tool_resumes_the_other() {
    if !require_tool("reencrypt_decrypt", "cryptsetup") {
        return;
    }
    for r in ["checksum", "journal", "none"] {
        // A whole ucrypt run: the data is the plaintext, the header
        // what cryptsetup leaves.
        let (v, hdr) = detached("reenc-dec", 40);
        ok(
            decrypt(
                "ucrypt",
                &hdr,
                &v.img,
                &v.key,
                &["--resilience", r, "--hotzone-size", "1M"],
            ),
            r,
        );
        assert_eq!(std::fs::read(&v.img).unwrap(), v.plain, "{r}: plaintext");
        decrypted_header(&hdr);
    }
    // Initialized by one, finished by the other; the metadata of an
    // initialized decryption is cryptsetup's field by field.
    for (first, second) in [("ucrypt", "cryptsetup"), ("cryptsetup", "ucrypt")] {
        let (v, hdr) = detached("reenc-dec-init", 41);
        ok(
            decrypt(first, &hdr, &v.img, &v.key, &["--init-only"]),
            first,
        );
        let mut j = shape(json(&hdr));
        let ks = j["keyslots"]["1"].as_object_mut().unwrap();
        assert_eq!(ks["mode"], "decrypt", "{first}");
        assert_eq!(ks["direction"], "backward", "{first}");
        let want = serde_json::json!({
            "0": {"type": "crypt", "offset": "0", "size": "dynamic", "iv_tweak": "0",
                  "encryption": "aes-xts-plain64", "sector_size": 4096},
            "1": {"type": "crypt", "offset": "0", "size": "dynamic", "iv_tweak": "0",
                  "encryption": "aes-xts-plain64", "sector_size": 4096,
                  "flags": ["backup-previous"]},
            "2": {"type": "linear", "offset": "0", "size": "dynamic",
                  "flags": ["backup-final"]},
        });
        assert_eq!(j["segments"], want, "{first}");
        ok(
            decrypt(second, &hdr, &v.img, &v.key, &["--resume-only"]),
            second,
        );
        assert_eq!(
            std::fs::read(&v.img).unwrap(),
            v.plain,
            "{first} → {second}"
        );
        decrypted_header(&hdr);
    }
}

/// A decryption stopped between hotzones (cryptsetup interrupted under
/// gdb, or killed mid-hotzone) is finished by ucrypt; one ucrypt stops
/// (killed at each of its writes) is finished by ucrypt and, on a copy
/// after its `repair`, by cryptsetup.
#[test]
fn an_interrupted_or_crashed_decryption_is_finished_by_either_tool() {
    if !require_tool("reencrypt_decrypt_crash", "cryptsetup")
        || !require_tool("reencrypt_decrypt_crash", "gdb")
    {
        return;
    }
    let cs = testutil::which("cryptsetup").unwrap();
    for kill in [false, true] {
        let (v, hdr) = detached("reenc-dec-int", 42);
        let args: Vec<std::ffi::OsString> = vec![
            "reencrypt".into(),
            "-q".into(),
            "--force-offline-reencrypt".into(),
            "--decrypt".into(),
            "--hotzone-size".into(),
            "2M".into(),
            "--key-file".into(),
            v.key.clone().into(),
            "--header".into(),
            hdr.clone().into(),
            v.img.clone().into(),
        ];
        let a: Vec<&std::ffi::OsStr> = args.iter().map(|x| x.as_os_str()).collect();
        let log = under_gdb(2, kill, &cs, &a);
        assert!(in_reencryption(&hdr), "cryptsetup stopped mid-way: {log}");
        ok(
            decrypt("ucrypt", &hdr, &v.img, &v.key, &["--resume-only"]),
            "ucrypt resumes cryptsetup's",
        );
        assert_eq!(std::fs::read(&v.img).unwrap(), v.plain, "kill {kill}");
        decrypted_header(&hdr);
    }
    for r in ["checksum", "journal"] {
        let (v, hdr) = detached("reenc-dec-crash", 43);
        let (p_img, p_hdr) = (v.dir.join("p.data"), v.dir.join("p.hdr"));
        std::fs::copy(&v.img, &p_img).unwrap();
        std::fs::copy(&hdr, &p_hdr).unwrap();
        let (c_img, c_hdr) = (v.dir.join("c.data"), v.dir.join("c.hdr"));
        let mut n = 1;
        loop {
            std::fs::copy(&p_img, &v.img).unwrap();
            std::fs::copy(&p_hdr, &hdr).unwrap();
            let out = run(Command::new(ucrypt_bin())
                .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
                .args(["reencrypt", "-q", "--decrypt", "--hotzone-size", "4M"])
                .args(["--resilience", r, "--key-file"])
                .arg(&v.key)
                .arg("--header")
                .arg(&hdr)
                .arg(&v.img));
            if out.status.success() {
                assert!(n > 5, "{r}: a run has more than 5 writes");
                break;
            }
            std::fs::copy(&v.img, &c_img).unwrap();
            std::fs::copy(&hdr, &c_hdr).unwrap();
            if in_reencryption(&hdr) {
                ok(
                    decrypt("ucrypt", &hdr, &v.img, &v.key, &["--resume-only"]),
                    "ucrypt resume",
                );
                ok(
                    run(Command::new("cryptsetup")
                        .args(["repair", "-q", "--key-file"])
                        .arg(&v.key)
                        .arg("--header")
                        .arg(&c_hdr)
                        .arg(&c_img)),
                    "cryptsetup repair",
                );
                // After repairing the last hotzone, cryptsetup 2.6.1's
                // header has every byte plaintext but is still in
                // reencryption, and its own --resume-only would decrypt
                // the whole device again (checked by hand): ucrypt
                // finishes that header, cryptsetup every other.
                let all_plain = json(&c_hdr)["segments"]["0"]
                    == serde_json::json!({"type": "linear", "offset": "0", "size": "dynamic"});
                if in_reencryption(&c_hdr) {
                    let tool = if all_plain { "ucrypt" } else { "cryptsetup" };
                    ok(
                        decrypt(tool, &c_hdr, &c_img, &v.key, &["--resume-only"]),
                        "resume after cryptsetup repair",
                    );
                }
                assert_eq!(
                    std::fs::read(&c_img).unwrap(),
                    v.plain,
                    "{r}: cryptsetup after crash {n}"
                );
            }
            assert_eq!(
                std::fs::read(&v.img).unwrap(),
                v.plain,
                "{r}: ucrypt after crash {n}"
            );
            n += 1;
        }
    }
}
