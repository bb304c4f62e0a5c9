//! `reencrypt --volume-key-file FILE` (`luks2-reencryption-test` [23]):
//! the new volume key is the file's first `--key-size` bits, as
//! cryptsetup 2.6.1 takes it; a file too short, a missing one and the
//! volume's own key with nothing else changed are refused by both tools
//! with the same exit code and every file unchanged.

use std::path::Path;

use testutil::{require_tool, Rng, TempDir};

use super::reencrypt::ok;

const PW1: &[u8] = b"volume key passphrase 1\n";
const PW3: &[u8] = b"volume key passphrase 3\n";
const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn volume_key(img: &Path) -> Vec<u8> {
    let out = ok(
        testutil::run(
            "cryptsetup",
            &["luksDump", "-q", "--dump-volume-key", s(img)],
            Some(PW1),
        ),
        "luksDump --dump-volume-key",
    );
    testutil::volume_key_from_dump(&String::from_utf8_lossy(&out.stdout))
}

/// A 32 MiB volume as [23] formats it (AES-CBC-ESSIV, 256 bits, data at
/// 4 MiB, keyslots 0 and 1), filled with seeded data; returns the data.
fn setup(img: &Path, key: &Path) -> Vec<u8> {
    std::fs::File::create(img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let mut a = vec!["-q", "luksFormat", "--type", "luks2", "-s", "256"];
    a.extend(["-c", "aes-cbc-essiv:sha256", "--offset", "8192"]);
    a.extend_from_slice(FAST);
    a.push(s(img));
    ok(testutil::run("cryptsetup", &a, Some(PW1)), "luksFormat");
    let mut add = vec!["-q", "luksAddKey"];
    add.extend_from_slice(FAST);
    add.push(s(img));
    let input = [PW1, PW3].concat();
    ok(
        testutil::run("cryptsetup", &add, Some(&input)),
        "luksAddKey",
    );
    let mut plain = vec![0u8; 28 << 20];
    Rng::new(23).fill(&mut plain);
    let w = ["map", "--write", "--luks", s(img), "--key-file", s(key)];
    ok(testutil::run("ucrypt", &w, Some(&plain)), "map --write");
    plain
}

fn read(img: &Path, key: &Path) -> Vec<u8> {
    let r = ["map", "--read", "--luks", s(img), "--key-file", s(key)];
    ok(testutil::run("ucrypt", &r, None), "map --read").stdout
}

#[test]
fn the_new_key_comes_from_the_file_as_cryptsetup_takes_it() {
    if !require_tool("reencrypt_volume_key_file", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("revk");
    let key = dir.join("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    let vkey = dir.join("vkey");
    let mut vk = vec![0u8; 64];
    Rng::new(1).fill(&mut vk);
    std::fs::write(&vkey, &vk).unwrap();
    let img = dir.join("img");
    let plain = setup(&img, &key);
    for tool in ["cryptsetup", "ucrypt"] {
        let i = dir.join(&format!("{tool}.img"));
        std::fs::copy(&img, &i).unwrap();
        let mut a = vec!["reencrypt", s(&i), "-q", "-S0"];
        a.extend_from_slice(FAST);
        a.extend(["--volume-key-file", s(&vkey), "-s", "128"]);
        if tool == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        ok(testutil::run(tool, &a, Some(PW1)), tool);
        assert_eq!(volume_key(&i), vk[..16], "{tool}");
        assert!(read(&i, &key) == plain, "{tool}");
        // [23]'s check: the key file alone opens the data again.
        ok(
            testutil::run("cryptsetup", &["luksErase", "-q", s(&i)], None),
            "luksErase",
        );
        let mut add = vec![
            "luksAddKey",
            "-q",
            "--volume-key-file",
            s(&vkey),
            "-s",
            "128",
        ];
        add.extend_from_slice(FAST);
        add.push(s(&i));
        ok(testutil::run("cryptsetup", &add, Some(PW1)), "luksAddKey");
        assert!(read(&i, &key) == plain, "{tool} after luksErase");
    }
}

#[test]
fn volume_key_files_cryptsetup_refuses_are_refused_and_nothing_is_written() {
    if !require_tool("reencrypt_volume_key_refusals", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("revk-refuse");
    let key = dir.join("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    let img = dir.join("img");
    setup(&img, &key);
    let short = dir.join("short");
    std::fs::write(&short, [7u8; 31]).unwrap();
    let same = dir.join("same");
    std::fs::write(&same, volume_key(&img)).unwrap();
    let missing = dir.join("missing");
    let orig = std::fs::read(&img).unwrap();
    for (file, want) in [
        (&short, "Cannot read 32 bytes from keyfile"),
        (&missing, "Cannot read keyfile"),
        (
            &same,
            "No data segment parameters changed. Reencryption aborted.",
        ),
    ] {
        let mut a = vec!["reencrypt", s(&img), "-q", "-S0"];
        a.extend_from_slice(FAST);
        a.extend(["--volume-key-file", s(file)]);
        let mut ca = a.clone();
        ca.push("--force-offline-reencrypt");
        let cs = testutil::run("cryptsetup", &ca, Some(PW1));
        assert!(!cs.status.success(), "cryptsetup accepted {file:?}");
        assert!(String::from_utf8_lossy(&cs.stderr).contains(want));
        assert!(std::fs::read(&img).unwrap() == orig, "cryptsetup wrote");
        let u = testutil::run("ucrypt", &a, Some(PW1));
        let err = String::from_utf8_lossy(&u.stderr);
        assert_eq!(u.status.code(), cs.status.code(), "{file:?}: {err}");
        assert!(err.contains(want), "{file:?}: {err}");
        assert!(std::fs::read(&img).unwrap() == orig, "ucrypt wrote");
    }
}

/// `--encrypt --volume-key-file FILE` (detached header, and with a data
/// shift): the volume key is the file's first key-size bytes, as
/// cryptsetup's `luksFormat` in its `--encrypt` takes it; a file too
/// short is refused by both tools with the same exit code, ucrypt
/// writing nothing (cryptsetup leaves an empty 4 KiB header file).
#[test]
fn encryption_takes_the_volume_key_from_the_file() {
    if !require_tool("reencrypt_volume_key_encrypt", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("revk-encrypt");
    let key = dir.join("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    let vkey = dir.join("vkey");
    let mut vk = vec![0u8; 64];
    Rng::new(2).fill(&mut vk);
    std::fs::write(&vkey, &vk).unwrap();
    let mut plain = vec![0u8; 8 << 20];
    Rng::new(3).fill(&mut plain);
    let dump = |hdr: &Path| {
        let out = ok(
            testutil::run(
                "cryptsetup",
                &[
                    "luksDump",
                    "-q",
                    "--dump-volume-key",
                    "--key-file",
                    s(&key),
                    s(hdr),
                ],
                None,
            ),
            "luksDump --dump-volume-key",
        );
        testutil::volume_key_from_dump(&String::from_utf8_lossy(&out.stdout))
    };
    for tool in ["cryptsetup", "ucrypt"] {
        for (extra, klen) in [(&[][..], 64), (&["-s", "256"][..], 32)] {
            let (img, hdr) = (
                dir.join(&format!("{tool}.img")),
                dir.join(&format!("{tool}.hdr")),
            );
            std::fs::write(&img, &plain).unwrap();
            let _ = std::fs::remove_file(&hdr);
            let mut a = vec!["reencrypt", "-q", "--encrypt", "--header", s(&hdr)];
            a.extend(["--volume-key-file", s(&vkey), "--key-file", s(&key)]);
            a.extend_from_slice(FAST);
            a.extend_from_slice(extra);
            if tool == "cryptsetup" {
                a.push("--force-offline-reencrypt");
            }
            a.push(s(&img));
            ok(testutil::run(tool, &a, None), tool);
            assert_eq!(dump(&hdr), vk[..klen], "{tool} {extra:?}");
            let r = [
                "map",
                "--read",
                "--luks",
                s(&img),
                "--header",
                s(&hdr),
                "--key-file",
                s(&key),
            ];
            assert!(
                ok(testutil::run("ucrypt", &r, None), "map --read").stdout == plain,
                "{tool}"
            );
        }
        // With a data shift.
        let img = dir.join(&format!("{tool}.shift"));
        std::fs::write(&img, &plain).unwrap();
        let mut a = vec!["reencrypt", "-q", "--encrypt", "--reduce-device-size", "2M"];
        a.extend(["--volume-key-file", s(&vkey), "--key-file", s(&key)]);
        a.extend_from_slice(FAST);
        if tool == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        a.push(s(&img));
        ok(testutil::run(tool, &a, None), tool);
        assert_eq!(dump(&img), vk, "{tool} shift");
    }
    // Too short: refused, nothing of ucrypt's written.
    let short = dir.join("short");
    std::fs::write(&short, [7u8; 63]).unwrap();
    let mut codes = Vec::new();
    for tool in ["cryptsetup", "ucrypt"] {
        let (img, hdr) = (
            dir.join(&format!("{tool}.img")),
            dir.join(&format!("{tool}.short.hdr")),
        );
        std::fs::write(&img, &plain).unwrap();
        let mut a = vec!["reencrypt", "-q", "--encrypt", "--header", s(&hdr)];
        a.extend(["--volume-key-file", s(&short), "--key-file", s(&key)]);
        a.extend_from_slice(FAST);
        if tool == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        a.push(s(&img));
        let out = testutil::run(tool, &a, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Cannot read 64 bytes from keyfile"),
            "{tool}: {err}"
        );
        codes.push(out.status.code());
        assert!(std::fs::read(&img).unwrap() == plain, "{tool}: data");
        if tool == "ucrypt" {
            assert!(!hdr.exists(), "ucrypt created the header file");
        }
    }
    assert_eq!(codes[0], codes[1], "exit codes");
}

/// cryptsetup 2.6.1 ignores `--volume-key-file` in a decryption (even a
/// missing file); so does ucrypt, and the plaintext is the same.
#[test]
fn decryption_ignores_a_volume_key_file() {
    if !require_tool("reencrypt_volume_key_decrypt", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("revk-decrypt");
    let key = dir.join("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    let mut plain = vec![0u8; 8 << 20];
    Rng::new(4).fill(&mut plain);
    let (img, hdr) = (dir.join("img"), dir.join("hdr"));
    std::fs::write(&img, &plain).unwrap();
    let mut a = vec![
        "reencrypt",
        "-q",
        "--encrypt",
        "--header",
        s(&hdr),
        "--key-file",
        s(&key),
    ];
    a.extend_from_slice(FAST);
    a.push(s(&img));
    ok(testutil::run("ucrypt", &a, None), "encrypt");
    let missing = dir.join("missing");
    for tool in ["cryptsetup", "ucrypt"] {
        let (i, h) = (
            dir.join(&format!("{tool}.img")),
            dir.join(&format!("{tool}.hdr")),
        );
        std::fs::copy(&img, &i).unwrap();
        std::fs::copy(&hdr, &h).unwrap();
        let mut a = vec!["reencrypt", "-q", "--decrypt", "--header", s(&h)];
        a.extend(["--volume-key-file", s(&missing), "--key-file", s(&key)]);
        if tool == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        a.push(s(&i));
        ok(testutil::run(tool, &a, None), tool);
        assert!(std::fs::read(&i).unwrap() == plain, "{tool}: plaintext");
    }
}

/// LUKS1: cryptsetup 2.6.1's tool takes the new key of a reencryption
/// from `--volume-key-file` (its encryption ignores it); its LUKS1 run
/// needs device-mapper, so ucrypt's result is checked with luksDump.
#[test]
fn a_luks1_reencryption_takes_the_volume_key_from_the_file() {
    if !require_tool("reencrypt_volume_key_luks1", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("revk-luks1");
    let key = dir.join("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    let vkey = dir.join("vkey");
    let mut vk = vec![0u8; 64];
    Rng::new(5).fill(&mut vk);
    std::fs::write(&vkey, &vk).unwrap();
    let img = dir.join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let mut f = vec![
        "-q",
        "luksFormat",
        "--type",
        "luks1",
        "-s",
        "256",
        "--key-file",
        s(&key),
    ];
    f.extend_from_slice(FAST);
    f.push(s(&img));
    ok(testutil::run("cryptsetup", &f, None), "luksFormat");
    let mut plain = vec![0u8; 6 << 20];
    Rng::new(6).fill(&mut plain);
    let w = ["map", "--write", "--luks", s(&img), "--key-file", s(&key)];
    ok(testutil::run("ucrypt", &w, Some(&plain)), "map --write");
    let mut a = vec![
        "reencrypt",
        "-q",
        "--volume-key-file",
        s(&vkey),
        "--key-file",
        s(&key),
    ];
    a.extend_from_slice(FAST);
    a.push(s(&img));
    ok(in_dir(&dir, &a), "reencrypt");
    let out = ok(
        testutil::run(
            "cryptsetup",
            &[
                "luksDump",
                "-q",
                "--dump-volume-key",
                "--key-file",
                s(&key),
                s(&img),
            ],
            None,
        ),
        "luksDump",
    );
    let got = testutil::volume_key_from_dump(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(got, vk[..32]);
    let r = ["map", "--read", "--luks", s(&img), "--key-file", s(&key)];
    let back = ok(testutil::run("ucrypt", &r, None), "map --read").stdout;
    assert!(back[..plain.len()] == plain[..], "plaintext");
    // Too short: refused with cryptsetup's words, the device unchanged.
    let short = dir.join("short");
    std::fs::write(&short, [1u8; 31]).unwrap();
    let was = std::fs::read(&img).unwrap();
    let mut a = vec![
        "reencrypt",
        "-q",
        "--volume-key-file",
        s(&short),
        "--key-file",
        s(&key),
    ];
    a.extend_from_slice(FAST);
    a.push(s(&img));
    let out = in_dir(&dir, &a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Cannot read 32 bytes from keyfile"), "{err}");
    assert!(std::fs::read(&img).unwrap() == was, "nothing written");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("LUKS-"))
        .collect();
    assert!(leftovers.is_empty(), "no LUKS-<uuid> files left");
}

/// `ucrypt ARGS` run in `dir` (LUKS1 reencryption keeps its
/// `LUKS-<uuid>` files in the working directory).
fn in_dir(dir: &TempDir, args: &[&str]) -> std::process::Output {
    std::process::Command::new(testutil::ucrypt_bin())
        .current_dir(dir.path())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}
