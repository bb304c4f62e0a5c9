//! cryptsetup's verb spellings (`luksFormat`, `luksOpen`, `isLuks`, …)
//! typed the way a cryptsetup user types them, run on copies of the same
//! volume by ucrypt and by cryptsetup: the exit codes agree and
//! `cryptsetup luksDump` sees the same keyslots afterwards. `open --type
//! luks1|luks2` refuses the other version as cryptsetup does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::TempDir;

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn run_in(prog: &str, args: &[&str], run_dir: Option<&Path>) -> Output {
    let bin = if prog == "ucrypt" {
        testutil::ucrypt_bin()
    } else {
        PathBuf::from(prog)
    };
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = run_dir {
        cmd.env("UCRYPT_RUNTIME_DIR", d);
    }
    cmd.output().unwrap_or_else(|e| panic!("spawn {prog}: {e}"))
}

fn run(prog: &str, args: &[&str]) -> Output {
    run_in(prog, args, None)
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn key(dir: &TempDir, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .write_all(content)
        .unwrap();
    p
}

/// Keyslot lines of `cryptsetup luksDump` (which slots are active).
fn slots(dev: &Path) -> Vec<String> {
    let o = run("cryptsetup", &["luksDump", s(dev)]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(": luks2") || l.contains("ENABLED"))
        .map(str::to_string)
        .collect()
}

#[test]
fn cryptsetup_spellings_do_what_cryptsetup_does() {
    if !testutil::require_tool("cryptsetup_spellings_do_what_cryptsetup_does", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("spellings");
    let k0 = key(&dir, "k0", b"zero");
    let k1 = key(&dir, "k1", b"one");
    let k2 = key(&dir, "k2", b"two");
    let k3 = key(&dir, "k3", b"three");
    let bad = key(&dir, "bad", b"wrong");
    let vk = key(&dir, "vk", &[0x5a; 64]);
    for ty in ["luks1", "luks2"] {
        let ours = dir.join("ours.img");
        let theirs = dir.join("theirs.img");
        for p in [&ours, &theirs] {
            std::fs::File::create(p).unwrap().set_len(40 << 20).unwrap();
        }
        let (o, t) = (s(&ours), s(&theirs));
        // Each step: the same argument list for both tools (DEVICE given
        // as "@"), then the same exit code.
        let steps: Vec<Vec<&str>> = vec![
            // cryptsetup's older names and its RNG choice are taken too.
            [
                &[
                    "luksFormat",
                    "-q",
                    "--type",
                    ty,
                    "--use-urandom",
                    "--master-key-file",
                    s(&vk),
                    "@",
                    s(&k0),
                ][..],
                FAST,
            ]
            .concat(),
            vec!["isLuks", "@"],
            vec!["isLuks", "--type", ty, "@"],
            vec![
                "isLuks",
                "--type",
                if ty == "luks1" { "luks2" } else { "luks1" },
                "@",
            ],
            [&["luksAddKey", "@", "-d", s(&k0), s(&k1)][..], FAST].concat(),
            [&["luksAddKey", "@", "-d", s(&bad), s(&k2)][..], FAST].concat(),
            [&["luksChangeKey", "@", "-d", s(&k1), s(&k2)][..], FAST].concat(),
            vec!["luksRemoveKey", "-q", "@", s(&k0)],
            [&["luksAddKey", "@", "-d", s(&k2), s(&k0)][..], FAST].concat(),
            vec!["luksKillSlot", "-q", "@", "0"],
            vec!["luksUUID", "@"],
            vec![
                "luksUUID",
                "-q",
                "--uuid",
                "01234567-89ab-cdef-0123-456789abcdef",
                "@",
            ],
            vec!["luksDump", "@"],
            // --test-args: the arguments parse, nothing is killed.
            vec!["luksKillSlot", "--test-args", "-q", "@", "1"],
            [
                &["luksAddKey", "--master-key-file", s(&vk), "@", s(&k3)][..],
                FAST,
            ]
            .concat(),
            vec!["luksDump", "--dump-master-key", "-q", "-d", s(&k3), "@"],
        ];
        for step in steps {
            let ours_args: Vec<&str> = step.iter().map(|a| if *a == "@" { o } else { a }).collect();
            let theirs_args: Vec<&str> =
                step.iter().map(|a| if *a == "@" { t } else { a }).collect();
            let u = run("ucrypt", &ours_args);
            let c = run("cryptsetup", &theirs_args);
            assert_eq!(
                code(&u),
                code(&c),
                "{ty} {step:?}: ucrypt said {}",
                String::from_utf8_lossy(&u.stderr)
            );
            assert_eq!(slots(&ours), slots(&theirs), "{ty} {step:?}");
            if step.contains(&"--dump-master-key") {
                // The key given at format time, shown as cryptsetup shows it.
                let shown = |out: &[u8], dev: &str| String::from_utf8_lossy(out).replace(dev, "@");
                assert_eq!(shown(&u.stdout, o), shown(&c.stdout, t), "{ty}");
                assert!(shown(&u.stdout, o).contains("MK dump:\t5a 5a"), "{ty}");
            }
            if step[0] == "luksUUID" {
                assert_eq!(u.stdout.is_empty(), c.stdout.is_empty(), "{step:?}");
            }
        }
        assert_eq!(
            String::from_utf8(run("ucrypt", &["luksUUID", o]).stdout).unwrap(),
            "01234567-89ab-cdef-0123-456789abcdef\n"
        );
        // Header backup and restore under cryptsetup's names.
        let bak = dir.join(&format!("{ty}.bak"));
        let u = run(
            "ucrypt",
            &["luksHeaderBackup", o, "--header-backup-file", s(&bak)],
        );
        assert_eq!(code(&u), 0);
        let cs_bak = dir.join(&format!("{ty}.cs.bak"));
        let c = run(
            "cryptsetup",
            &["luksHeaderBackup", o, "--header-backup-file", s(&cs_bak)],
        );
        assert_eq!(code(&c), 0);
        assert!(std::fs::read(&bak).unwrap() == std::fs::read(&cs_bak).unwrap());
        let u = run(
            "ucrypt",
            &[
                "luksHeaderRestore",
                "-q",
                t,
                "--header-backup-file",
                s(&bak),
            ],
        );
        assert_eq!(code(&u), 0, "{}", String::from_utf8_lossy(&u.stderr));
        assert_eq!(slots(&ours), slots(&theirs));
        std::fs::remove_file(&ours).unwrap();
        std::fs::remove_file(&theirs).unwrap();
    }
}

#[test]
fn luks_open_and_close_with_type() {
    if !testutil::require_tool("luks_open_and_close_with_type", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("luksopen");
    let run_dir = dir.join("run");
    let kf = key(&dir, "k", b"open me");
    let dev = dir.join("v.img");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    let f = run(
        "cryptsetup",
        &[
            &["luksFormat", "-q", "--type", "luks2", s(&dev), s(&kf)][..],
            FAST,
        ]
        .concat(),
    );
    assert_eq!(code(&f), 0);
    let name = format!("so{}", std::process::id());
    let sock = dir.join("nbd.sock");
    let export = format!("nbd={}", sock.display());
    // The wrong version is refused before any daemon starts, like
    // `cryptsetup open --type luks1` on a LUKS2 volume.
    let u = run_in(
        "ucrypt",
        &["luksOpen", "--type", "luks1", "-d", s(&kf), s(&dev), &name],
        Some(&run_dir),
    );
    let c = run(
        "cryptsetup",
        &[
            "open",
            "--test-passphrase",
            "--type",
            "luks1",
            "-d",
            s(&kf),
            s(&dev),
        ],
    );
    assert_eq!((code(&u), code(&c)), (1, 1));
    assert!(String::from_utf8_lossy(&u.stderr).contains("is not a valid LUKS device"));
    let u = run_in(
        "ucrypt",
        &[
            "luksOpen",
            "--type",
            "luks2",
            "-d",
            s(&kf),
            "--export",
            &export,
            s(&dev),
            &name,
        ],
        Some(&run_dir),
    );
    assert_eq!(code(&u), 0, "{}", String::from_utf8_lossy(&u.stderr));
    let st = run_in("ucrypt", &["status", &name], Some(&run_dir));
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("LUKS2"),
        "{}",
        String::from_utf8_lossy(&st.stdout)
    );
    let u = run_in("ucrypt", &["luksClose", &name], Some(&run_dir));
    assert_eq!(code(&u), 0, "{}", String::from_utf8_lossy(&u.stderr));
    let u = run_in("ucrypt", &["status", &name], Some(&run_dir));
    assert_ne!(code(&u), 0, "closed");
}

#[test]
fn dump_json_metadata_matches_cryptsetup() {
    if !testutil::require_tool("dump_json_metadata_matches_cryptsetup", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("dumpjson");
    let k0 = key(&dir, "k0", b"zero");
    let k1 = key(&dir, "k1", b"one");
    let tok = key(
        &dir,
        "t.json",
        br#"{"type":"my-type","keyslots":["1"],"x":1}"#,
    );
    for ty in ["luks2", "luks1"] {
        let dev = dir.join(&format!("{ty}.img"));
        std::fs::File::create(&dev)
            .unwrap()
            .set_len(40 << 20)
            .unwrap();
        let d = s(&dev);
        let f = run(
            "cryptsetup",
            &[&["luksFormat", "-q", "--type", ty, d, s(&k0)][..], FAST].concat(),
        );
        assert_eq!(code(&f), 0);
        if ty == "luks2" {
            // Written by ucrypt, then a token added by cryptsetup.
            let a = run(
                "ucrypt",
                &[&["luksAddKey", d, "-d", s(&k0), s(&k1)][..], FAST].concat(),
            );
            assert_eq!(code(&a), 0);
            let t = run(
                "cryptsetup",
                &["token", "import", d, "--json-file", s(&tok)],
            );
            assert_eq!(code(&t), 0);
        }
        let u = run("ucrypt", &["luksDump", "--dump-json-metadata", d]);
        let c = run("cryptsetup", &["luksDump", "--dump-json-metadata", d]);
        assert_eq!(code(&u), code(&c), "{ty}");
        if ty == "luks2" {
            assert_eq!(
                String::from_utf8(u.stdout).unwrap(),
                String::from_utf8(c.stdout).unwrap()
            );
        } else {
            assert_eq!(code(&u), 1);
        }
    }
}

#[test]
fn keyfile_offset_and_size_like_cryptsetup() {
    if !testutil::require_tool("keyfile_offset_and_size_like_cryptsetup", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("keyfile-range");
    let big = key(&dir, "big", b"XXXXpass1YYYnew22ZZ");
    let pass1 = key(&dir, "pass1", b"pass1");
    let new2 = key(&dir, "new2", b"new22");
    let dev = dir.join("v.img");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    let d = s(&dev);
    let b = s(&big);
    let f = run(
        "ucrypt",
        &[
            &["luksFormat", "-q", "--keyfile-offset", "4", "-l", "5", d, b][..],
            FAST,
        ]
        .concat(),
    );
    assert_eq!(code(&f), 0, "{}", String::from_utf8_lossy(&f.stderr));
    let a = run(
        "ucrypt",
        &[
            &["luksAddKey", d, "-d", b, "--keyfile-offset", "4", "-l", "5"][..],
            &["--new-keyfile-offset", "12", "--new-keyfile-size", "5", b],
            FAST,
        ]
        .concat(),
    );
    assert_eq!(code(&a), 0, "{}", String::from_utf8_lossy(&a.stderr));
    for (kf, slot) in [(&pass1, "0"), (&new2, "1")] {
        let o = run(
            "cryptsetup",
            &["open", "--test-passphrase", "-S", slot, d, "-d", s(kf)],
        );
        assert_eq!(code(&o), 0, "slot {slot}");
    }
    // Out of range: both refuse with exit 1.
    for bad in [
        &["--keyfile-offset", "40"][..],
        &["--keyfile-offset", "4", "-l", "50"],
    ] {
        let mut u = vec!["luksDump", "--dump-volume-key", "-q", d, "-d", b];
        u.extend(bad);
        let mut c = vec!["open", "--test-passphrase", d, "-d", b];
        c.extend(bad);
        assert_eq!(
            (code(&run("ucrypt", &u)), code(&run("cryptsetup", &c))),
            (1, 1),
            "{bad:?}"
        );
    }
}
