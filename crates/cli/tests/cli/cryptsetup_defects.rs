//! Regression tests for the defects found by running ucrypt and
//! cryptsetup 2.6 side by side: each case does the same thing with both
//! tools (or with ucrypt, then checks the result with cryptsetup) and
//! compares what a cryptsetup user would see: exit codes, `luksDump`,
//! `token export`, `repair`, `open --test-passphrase`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;

use testutil::TempDir;

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn tools(test: &str) -> bool {
    testutil::require_tool(test, "cryptsetup")
}

fn run(prog: &str, args: &[&str]) -> Output {
    testutil::run(prog, args, None)
}

fn ok(prog: &str, args: &[&str]) -> String {
    testutil::run_ok(prog, args)
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn image(dir: &TempDir, name: &str, mib: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    p
}

fn key(dir: &TempDir, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .write_all(content)
        .unwrap();
    p
}

fn with<'a>(head: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    [head, FAST, tail].concat()
}

/// `cryptsetup open --test-passphrase`: does this key file open the volume?
fn cs_opens(dev: &Path, header: Option<&Path>, kf: &Path, slot: Option<&str>) -> bool {
    let mut a = vec!["open", "--test-passphrase", s(dev), "-d", s(kf)];
    if let Some(h) = header {
        a.extend(["--header", s(h)]);
    }
    if let Some(sl) = slot {
        a.extend(["-S", sl]);
    }
    run("cryptsetup", &a).status.success()
}

/// A cryptsetup LUKS2 volume with passphrases in slots 0 and 1 and a
/// custom token bound to `token_slots`.
fn cs_volume_with_token(dir: &TempDir, name: &str, token_slots: &str) -> PathBuf {
    let dev = image(dir, name, 40);
    let k0 = key(dir, "k0", b"zero");
    let k1 = key(dir, "k1", b"one");
    ok(
        "cryptsetup",
        &with(
            &["luksFormat", "-q", "--type", "luks2", s(&dev), s(&k0)],
            &[],
        ),
    );
    ok(
        "cryptsetup",
        &with(&["luksAddKey", "-q", s(&dev), "-d", s(&k0), s(&k1)], &[]),
    );
    let tok = key(
        dir,
        "token.json",
        format!(r#"{{"type":"my-type","keyslots":[{token_slots}]}}"#).as_bytes(),
    );
    ok(
        "cryptsetup",
        &["token", "import", s(&dev), "--json-file", s(&tok)],
    );
    dev
}

fn token_keyslots(dev: &Path) -> Vec<String> {
    let out = ok(
        "cryptsetup",
        &["token", "export", s(dev), "--token-id", "0"],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["keyslots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

/// The header cryptsetup still accepts whole: dump, repair, and our dump
/// equal to its dump.
fn cs_accepts(dev: &Path) {
    let dump = ok("cryptsetup", &["luksDump", s(dev)]);
    ok("cryptsetup", &["repair", "-q", s(dev)]);
    assert_eq!(ok("ucrypt", &["dump", s(dev)]), dump);
}

#[test]
fn capi_cipher_gets_a_keyslot_cipher_cryptsetup_can_use() {
    if !tools("capi_cipher_gets_a_keyslot_cipher_cryptsetup_can_use") {
        return;
    }
    let dir = TempDir::new("defect1");
    let dev = image(&dir, "capi.img", 32);
    let kf = key(&dir, "k", b"capi pass");
    ok(
        "ucrypt",
        &with(
            &["format", "-q", "-c", "capi:xts(aes)-plain64", s(&dev)],
            &["-d", s(&kf)],
        ),
    );
    let dump = ok("cryptsetup", &["luksDump", s(&dev)]);
    assert!(dump.contains("\tcipher: capi:xts(aes)-plain64\n"), "{dump}");
    // The keyslot falls back to cryptsetup's default keyslot cipher.
    assert!(dump.contains("\tCipher:     aes-xts-plain64\n"), "{dump}");
    assert!(dump.contains("\tCipher key: 512 bits\n"), "{dump}");
    assert!(
        cs_opens(&dev, None, &kf, None),
        "cryptsetup cannot use the keyslot"
    );
    // A key added later gets the same keyslot cipher.
    let k2 = key(&dir, "k2", b"second");
    ok(
        "ucrypt",
        &with(&["add-key", s(&dev), "-d", s(&kf)], &[s(&k2)]),
    );
    assert!(cs_opens(&dev, None, &k2, Some("1")));
}

#[test]
fn tokens_follow_removed_killed_and_changed_keyslots() {
    if !tools("tokens_follow_removed_killed_and_changed_keyslots") {
        return;
    }
    let dir = TempDir::new("defect2");
    let k1 = dir.join("k1");
    // kill-slot, remove-key: the reference goes, the token stays.
    for (verb, tail) in [
        ("kill-slot", vec!["1"]),
        ("remove-key", vec!["-d", k1.to_str().unwrap()]),
    ] {
        let ours = cs_volume_with_token(&dir, "ours.img", r#""0","1""#);
        let theirs = dir.join("theirs.img");
        std::fs::copy(&ours, &theirs).unwrap();
        let mut a = vec![verb, "-q", s(&ours)];
        a.extend(&tail);
        ok("ucrypt", &a);
        let cs_verb = if verb == "kill-slot" {
            "luksKillSlot"
        } else {
            "luksRemoveKey"
        };
        let mut a = vec![cs_verb, "-q", s(&theirs)];
        a.extend(&tail);
        ok("cryptsetup", &a);
        assert_eq!(token_keyslots(&ours), vec!["0"], "{verb}");
        assert_eq!(token_keyslots(&ours), token_keyslots(&theirs), "{verb}");
        cs_accepts(&ours);
    }
    // change-key keeps the slot, so the token keeps pointing at it.
    let dev = cs_volume_with_token(&dir, "change.img", r#""1""#);
    let k3 = key(&dir, "k3", b"three");
    ok(
        "ucrypt",
        &with(&["change-key", s(&dev), "-d", s(&k1)], &[s(&k3)]),
    );
    assert_eq!(token_keyslots(&dev), vec!["1"]);
    cs_accepts(&dev);
}

#[test]
fn format_force_with_a_bad_option_writes_nothing() {
    if !tools("format_force_with_a_bad_option_writes_nothing") {
        return;
    }
    let dir = TempDir::new("defect3");
    let dev = cs_volume_with_token(&dir, "old.img", r#""0""#);
    let k0 = dir.join("k0");
    let before = std::fs::read(&dev).unwrap();
    for bad in [
        &["--pbkdf", "nope"][..],
        &["--pbkdf", "argon2id", "--pbkdf-memory", "10"],
        &["--hash", "nohash"],
    ] {
        let mut a = vec!["format", "-q", "--force", s(&dev), "-d", s(&k0)];
        a.extend(bad);
        let o = run("ucrypt", &a);
        // cryptsetup refuses the same options with exit 1 (on a copy:
        // 2.6.1 itself wipes the old header before refusing a too small
        // --pbkdf-memory).
        let copy = dir.join("copy.img");
        std::fs::copy(&dev, &copy).unwrap();
        let mut c = vec!["luksFormat", "-q", s(&copy), s(&k0)];
        c.extend(bad);
        let theirs = run("cryptsetup", &c);
        assert_eq!((code(&o), code(&theirs)), (1, 1), "{bad:?}");
        assert!(std::fs::read(&dev).unwrap() == before, "{bad:?} wrote");
    }
    assert!(cs_opens(&dev, None, &k0, None));
}

#[test]
fn detached_header_with_a_small_offset_shrinks_the_keyslots_area() {
    if !tools("detached_header_with_a_small_offset_shrinks_the_keyslots_area") {
        return;
    }
    let dir = TempDir::new("defect4");
    let kf = key(&dir, "k", b"detached");
    let mut dumps = Vec::new();
    let mut warnings = Vec::new();
    for prog in ["ucrypt", "cryptsetup"] {
        let data = image(&dir, &format!("{prog}.data"), 8);
        let hdr = dir.join(&format!("{prog}.hdr"));
        let o = if prog == "ucrypt" {
            run(
                prog,
                &with(
                    &["format", "-q", "--header", s(&hdr), "--offset", "2048"],
                    &[s(&data), "-d", s(&kf)],
                ),
            )
        } else {
            run(
                prog,
                &with(
                    &["luksFormat", "-q", "--header", s(&hdr), "--offset", "2048"],
                    &[s(&data), s(&kf)],
                ),
            )
        };
        assert_eq!(
            code(&o),
            0,
            "{prog}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        warnings.push(String::from_utf8(o.stdout).unwrap());
        assert!(cs_opens(&data, Some(&hdr), &kf, None), "{prog}");
        let dump = ok("cryptsetup", &["luksDump", s(&hdr)]);
        dumps.push(
            dump.lines()
                .filter(|l| l.contains("area") || l.contains("offset"))
                .map(str::to_string)
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(dumps[0], dumps[1]);
    assert!(dumps[0].iter().any(|l| l.contains("1015808")), "{dumps:?}");
    assert_eq!(warnings[0], warnings[1]);
    assert!(warnings[0].starts_with("WARNING: keyslots area (1015808 bytes)"));
}

#[test]
fn change_key_keeps_the_luks2_slot_and_moves_the_luks1_slot_like_cryptsetup() {
    if !tools("change_key_keeps_the_luks2_slot_and_moves_the_luks1_slot_like_cryptsetup") {
        return;
    }
    let dir = TempDir::new("defect5");
    let k0 = key(&dir, "k0", b"zero");
    let k1 = key(&dir, "k1", b"one");
    let k2 = key(&dir, "k2", b"two");
    for ty in ["luks1", "luks2"] {
        let ours = image(&dir, "ours.img", 40);
        ok(
            "cryptsetup",
            &with(&["luksFormat", "-q", "--type", ty, s(&ours), s(&k0)], &[]),
        );
        ok(
            "cryptsetup",
            &with(&["luksAddKey", "-q", s(&ours), "-d", s(&k0), s(&k1)], &[]),
        );
        let theirs = dir.join("theirs.img");
        std::fs::copy(&ours, &theirs).unwrap();
        ok(
            "ucrypt",
            &with(&["change-key", s(&ours), "-d", s(&k0)], &[s(&k2)]),
        );
        ok(
            "cryptsetup",
            &with(
                &["luksChangeKey", "-q", s(&theirs), "-d", s(&k0)],
                &[s(&k2)],
            ),
        );
        let slots = |p: &Path| -> Vec<String> {
            ok("cryptsetup", &["luksDump", s(p)])
                .lines()
                .filter(|l| l.contains("ENABLED") || l.ends_with(": luks2"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(slots(&ours), slots(&theirs), "{ty}");
        assert!(!cs_opens(&ours, None, &k0, None), "{ty}: old passphrase");
        let new_slot = if ty == "luks2" { "0" } else { "2" };
        assert!(cs_opens(&ours, None, &k2, Some(new_slot)), "{ty}");
        assert!(cs_opens(&ours, None, &k1, Some("1")), "{ty}");
    }
}

#[test]
fn short_h_is_hash_as_in_cryptsetup() {
    if !tools("short_h_is_hash_as_in_cryptsetup") {
        return;
    }
    let dir = TempDir::new("defect6");
    let kf = key(&dir, "k", b"hash me");
    let mut hashes = Vec::new();
    for prog in ["ucrypt", "cryptsetup"] {
        let dev = image(&dir, &format!("{prog}.img"), 32);
        if prog == "ucrypt" {
            ok(
                prog,
                &with(&["format", "-q", "-h", "sha1", s(&dev)], &["-d", s(&kf)]),
            );
        } else {
            ok(
                prog,
                &with(&["luksFormat", "-q", "-h", "sha1", s(&dev)], &[s(&kf)]),
            );
        }
        hashes.push(
            ok("cryptsetup", &["luksDump", s(&dev)])
                .lines()
                .filter(|l| l.contains("Hash:") || l.contains("AF hash:"))
                .map(str::to_string)
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(hashes[0], hashes[1]);
    assert!(hashes[0].iter().all(|l| l.ends_with("sha1")), "{hashes:?}");
    // Help is still there, under --help and -?.
    for h in ["--help", "-?"] {
        let o = run("ucrypt", &["format", h]);
        assert_eq!(code(&o), 0);
        assert!(String::from_utf8_lossy(&o.stdout).contains("luksFormat"));
    }
}

#[test]
fn usage_errors_and_bad_files_exit_1_like_cryptsetup() {
    if !tools("usage_errors_and_bad_files_exit_1_like_cryptsetup") {
        return;
    }
    let dir = TempDir::new("defect7");
    let dev = image(&dir, "v.img", 32);
    let kf = key(&dir, "k", b"codes");
    ok("ucrypt", &with(&["format", "-q", s(&dev)], &["-d", s(&kf)]));
    let missing = dir.join("no-such-key");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["format"], vec!["luksFormat"]),
        (
            vec!["dump", "--bogus", s(&dev)],
            vec!["luksDump", "--bogus", s(&dev)],
        ),
        (
            vec!["add-key", s(&dev), "-d", s(&missing), s(&kf)],
            vec!["luksAddKey", s(&dev), "-d", s(&missing), s(&kf)],
        ),
        (
            vec!["header-backup", s(&dev), "--header-backup-file", s(&kf)],
            vec!["luksHeaderBackup", s(&dev), "--header-backup-file", s(&kf)],
        ),
    ];
    for (ours, theirs) in cases {
        let o = run("ucrypt", &ours);
        let t = run("cryptsetup", &theirs);
        assert_eq!(code(&o), code(&t), "{ours:?} vs {theirs:?}");
        assert_eq!(code(&o), 1, "{ours:?}");
    }
    assert_eq!(std::fs::read(&kf).unwrap(), b"codes", "backup target kept");
}

#[test]
fn reencryption_in_progress_is_named() {
    if !tools("reencryption_in_progress_is_named") {
        return;
    }
    let dir = TempDir::new("defect8");
    let dev = image(&dir, "r.img", 40);
    let kf = key(&dir, "k", b"reencrypt");
    ok(
        "cryptsetup",
        &with(
            &["luksFormat", "-q", "--type", "luks2", s(&dev), s(&kf)],
            &[],
        ),
    );
    ok(
        "cryptsetup",
        &with(
            &["reencrypt", "-q", "--init-only", s(&dev), "-d", s(&kf)],
            &[],
        ),
    );
    for verb in ["dump", "uuid"] {
        let o = run("ucrypt", &[verb, s(&dev)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_ne!(code(&o), 0, "{verb}");
        assert!(err.contains("reencryption is in progress"), "{verb}: {err}");
        assert!(!err.contains("unusable"), "{verb}: {err}");
    }
}
