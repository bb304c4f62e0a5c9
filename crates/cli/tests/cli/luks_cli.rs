//! `ucrypt` LUKS verbs end to end against cryptsetup (the reference):
//! ucrypt formats / adds / removes keys and cryptsetup agrees, and the
//! other way round; `dump` output is compared with `cryptsetup luksDump`
//! line for line; bad passphrases exit 2 and leave the image unchanged;
//! `map --luks` (through [`luks_table`]) returns what the independent
//! oracle decrypts with the key cryptsetup reveals.

use std::path::{Path, PathBuf};
use std::process::Output;

use daemon::resolve::luks_table;
use testutil::TempDir;
use ucrypt_cli::map::{map as map_device_io, Direction as MapDirection};

const FAST_ARGON: &[&str] = &[
    "--pbkdf",
    "argon2id",
    "--pbkdf-force-iterations",
    "4",
    "--pbkdf-memory",
    "1024",
    "--pbkdf-parallel",
    "1",
];
const FAST_PBKDF2: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn tools(test: &str) -> bool {
    testutil::require_tool(test, "cryptsetup")
        && testutil::require_tool(test, "python3")
        && testutil::require_python_module(test, "cryptography")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(prog: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    testutil::run(prog, args, stdin)
}

fn ok(prog: &str, args: &[&str]) -> String {
    testutil::run_ok(prog, args)
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
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
    std::fs::write(&p, content).unwrap();
    p
}

/// The whole image, to prove a failed command wrote nothing.
fn sha(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

fn args<'a>(head: &[&'a str], kdf: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    head.iter().chain(kdf).chain(tail).copied().collect()
}

fn oracle(dir: &str, cipher: &str, key: &[u8], sector_size: u32, data: &[u8]) -> Vec<u8> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/dmcrypt.py");
    let hexkey: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let ss = sector_size.to_string();
    let o = run(
        "python3",
        &[
            s(&script),
            dir,
            "--cipher",
            cipher,
            "--key",
            &hexkey,
            "--sector-size",
            &ss,
        ],
        Some(data),
    );
    assert!(
        o.status.success(),
        "oracle: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn mk_dump_key(text: &str) -> Vec<u8> {
    let mut hex = String::new();
    let mut on = false;
    for line in text.lines() {
        if let Some(r) = line.strip_prefix("MK dump:") {
            on = true;
            hex.push_str(r);
        } else if on && line.starts_with('\t') {
            hex.push_str(line);
        }
    }
    let hex: String = hex.split_whitespace().collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// ucrypt format -> cryptsetup isLuks/luksDump (identical dump text), same
/// volume key; ucrypt add-key -> cryptsetup opens with it; cryptsetup
/// luksAddKey -> ucrypt opens with it.
fn format_both_ways(luks_type: &str, kdf: &[&str]) {
    let test = format!("luks_cli::format_both_ways::{luks_type}");
    if !tools(&test) {
        return;
    }
    let dir = TempDir::new("luks-cli-fmt");
    let dev = image(&dir, "dev.img", 18);
    let kf = key(&dir, "k1", b"first passphrase");
    let kf2 = key(&dir, "k2", b"second passphrase");
    let kf3 = key(&dir, "k3", b"third \x00 binary \n key");
    ok(
        "ucrypt",
        &args(
            &[
                "format",
                "--type",
                luks_type,
                "-d",
                s(&kf),
                "--uuid",
                "12345678-1234-4234-8234-123456789abc",
            ],
            kdf,
            &[s(&dev)],
        ),
    );
    ok("cryptsetup", &["isLuks", s(&dev)]);
    let ours = ok("ucrypt", &["dump", s(&dev)]);
    let theirs = ok("cryptsetup", &["luksDump", s(&dev)]);
    assert_eq!(ours, theirs, "dump differs from cryptsetup luksDump");
    assert!(ours.contains("12345678-1234-4234-8234-123456789abc"));
    let ours = ok(
        "ucrypt",
        &["dump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
    );
    let theirs = ok(
        "cryptsetup",
        &["luksDump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
    );
    assert_eq!(ours, theirs, "volume key dump differs");
    let vk = mk_dump_key(&theirs);
    assert!(vk.len() == 64, "MK dump parsed: {}", vk.len());
    let (b1, b2) = (dir.join("ours.bak"), dir.join("theirs.bak"));
    ok(
        "ucrypt",
        &["header-backup", "--header-backup-file", s(&b1), s(&dev)],
    );
    ok(
        "cryptsetup",
        &["luksHeaderBackup", "--header-backup-file", s(&b2), s(&dev)],
    );
    assert!(
        std::fs::read(&b1).unwrap() == std::fs::read(&b2).unwrap(),
        "{luks_type} backup differs from cryptsetup's"
    );

    ok(
        "ucrypt",
        &args(&["add-key", "-d", s(&kf)], kdf, &[s(&dev), s(&kf2)]),
    );
    let via2 = ok(
        "cryptsetup",
        &[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "-d",
            s(&kf2),
            s(&dev),
        ],
    );
    assert_eq!(mk_dump_key(&via2), vk);
    let ds = ok("cryptsetup", &["luksDump", s(&dev)]);
    assert_eq!(ds, ok("ucrypt", &["dump", s(&dev)]), "dump after add-key");

    ok(
        "cryptsetup",
        &args(
            &["luksAddKey", "-q", "-d", s(&kf2)],
            kdf,
            &[s(&dev), s(&kf3)],
        ),
    );
    let via3 = ok(
        "ucrypt",
        &["dump", "--dump-volume-key", "-q", "-d", s(&kf3), s(&dev)],
    );
    assert_eq!(mk_dump_key(&via3), vk);
    assert_eq!(
        ok("ucrypt", &["dump", s(&dev)]),
        ok("cryptsetup", &["luksDump", s(&dev)])
    );

    // remove-key / change-key / kill-slot, checked by cryptsetup.
    ok("ucrypt", &["remove-key", "-q", "-d", s(&kf2), s(&dev)]);
    let o = run(
        "cryptsetup",
        &[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "-d",
            s(&kf2),
            s(&dev),
        ],
        None,
    );
    assert!(
        !o.status.success(),
        "removed passphrase still opens in cryptsetup"
    );
    let kf4 = key(&dir, "k4", b"changed");
    ok(
        "ucrypt",
        &args(&["change-key", "-d", s(&kf3)], kdf, &[s(&dev), s(&kf4)]),
    );
    assert_eq!(
        mk_dump_key(&ok(
            "cryptsetup",
            &[
                "luksDump",
                "--dump-volume-key",
                "-q",
                "-d",
                s(&kf4),
                s(&dev)
            ]
        )),
        vk
    );
    assert!(!run(
        "cryptsetup",
        &[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "-d",
            s(&kf3),
            s(&dev)
        ],
        None
    )
    .status
    .success());
    let before = ok("cryptsetup", &["luksDump", s(&dev)]);
    // change-key moved LUKS1's key to the free slot 1 and kept LUKS2's in
    // slot 2, as cryptsetup does.
    let (slot4, n4) = if luks_type == "luks1" {
        ("Key Slot 1: ENABLED", "1")
    } else {
        ("  2: luks2", "2")
    };
    assert!(before.contains(slot4), "{before}");
    ok("ucrypt", &["kill-slot", "-d", s(&kf), s(&dev), n4]);
    let after = ok("cryptsetup", &["luksDump", s(&dev)]);
    assert!(!after.contains(slot4), "{after}");
    ok(
        "cryptsetup",
        &["luksDump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
    );
}

#[test]
fn luks2_format_both_ways() {
    format_both_ways("luks2", FAST_ARGON);
}

#[test]
fn luks1_format_both_ways() {
    format_both_ways("luks1", FAST_PBKDF2);
}

#[test]
fn wrong_passphrase_exits_2_and_changes_nothing() {
    if !tools("luks_cli::wrong_passphrase") {
        return;
    }
    let dir = TempDir::new("luks-cli-wrong");
    let dev = image(&dir, "dev.img", 18);
    let kf = key(&dir, "k", b"right");
    let bad = key(&dir, "bad", b"wrong");
    let new = key(&dir, "new", b"new");
    ok(
        "ucrypt",
        &args(&["format", "-d", s(&kf)], FAST_PBKDF2, &[s(&dev)]),
    );
    ok(
        "ucrypt",
        &args(&["add-key", "-d", s(&kf)], FAST_PBKDF2, &[s(&dev), s(&new)]),
    );
    let before = sha(&dev);
    let cases: Vec<Vec<&str>> = vec![
        vec!["dump", "--dump-volume-key", "-q", "-d", s(&bad), s(&dev)],
        args(
            &["add-key", "-d", s(&bad)],
            FAST_PBKDF2,
            &[s(&dev), s(&new)],
        ),
        vec!["remove-key", "-q", "-d", s(&bad), s(&dev)],
        args(
            &["change-key", "-d", s(&bad)],
            FAST_PBKDF2,
            &[s(&dev), s(&new)],
        ),
        vec!["kill-slot", "-d", s(&bad), s(&dev), "1"],
        vec![
            "dump",
            "--dump-volume-key",
            "-q",
            "-S",
            "1",
            "-d",
            s(&kf),
            s(&dev),
        ],
    ];
    for a in cases {
        let o = run("ucrypt", &a, None);
        assert_eq!(code(&o), 2, "{a:?}: {}", String::from_utf8_lossy(&o.stderr));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("No key available"), "{err}");
        assert_eq!(sha(&dev), before, "{a:?} changed the image");
    }
    // Wrong device: exit 4; not LUKS: exit 1.
    let o = run("ucrypt", &["dump", s(&dir.join("missing.img"))], None);
    assert_eq!(code(&o), 4);
    let o = run("ucrypt", &["dump", s(&kf)], None);
    assert_eq!(code(&o), 1);
    let o = run("ucrypt", &["is-luks", s(&kf)], None);
    assert_eq!(code(&o), 1);
    ok("ucrypt", &["is-luks", "--type", "luks2", s(&dev)]);
    assert_eq!(
        code(&run(
            "ucrypt",
            &["is-luks", "--type", "luks1", s(&dev)],
            None
        )),
        1
    );
}

#[test]
fn format_refuses_existing_header_without_force() {
    if !tools("luks_cli::format_refuses") {
        return;
    }
    let dir = TempDir::new("luks-cli-force");
    let dev = image(&dir, "dev.img", 18);
    let kf = key(&dir, "k", b"pass");
    ok(
        "cryptsetup",
        &args(
            &["luksFormat", "-q", "--type", "luks1", "-d", s(&kf)],
            FAST_PBKDF2,
            &[s(&dev)],
        ),
    );
    let before = sha(&dev);
    let o = run(
        "ucrypt",
        &args(&["format", "-d", s(&kf)], FAST_PBKDF2, &[s(&dev)]),
        None,
    );
    assert_eq!(code(&o), 1, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(sha(&dev), before);
    ok(
        "ucrypt",
        &args(
            &["format", "--force", "-d", s(&kf)],
            FAST_PBKDF2,
            &[s(&dev)],
        ),
    );
    assert!(ok("cryptsetup", &["luksDump", s(&dev)]).contains("Version:       \t2"));
}

#[test]
fn passphrase_from_stdin_and_piped_line() {
    if !tools("luks_cli::stdin") {
        return;
    }
    let dir = TempDir::new("luks-cli-stdin");
    let dev = image(&dir, "dev.img", 18);
    // Piped (no key file): one line, newline stripped, like cryptsetup.
    let o = run(
        "ucrypt",
        &args(&["format"], FAST_PBKDF2, &[s(&dev)]),
        Some(b"line pass\nignored"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let kf = key(&dir, "k", b"line pass");
    ok(
        "cryptsetup",
        &["luksDump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
    );
    // --key-file - : all of stdin, binary-safe.
    let o = run(
        "ucrypt",
        &[
            "dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            "-",
            s(&dev),
        ],
        Some(b"line pass"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(
        "ucrypt",
        &[
            "dump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            "-",
            s(&dev),
        ],
        Some(b"line pass\n"),
    );
    assert_eq!(code(&o), 2, "a key file keeps its newline");
}

#[test]
fn header_backup_restore_both_ways_and_secondary_fallback() {
    if !tools("luks_cli::backup") {
        return;
    }
    let dir = TempDir::new("luks-cli-bak");
    let dev = image(&dir, "dev.img", 18);
    let kf = key(&dir, "k", b"pass");
    ok(
        "ucrypt",
        &args(&["format", "-d", s(&kf)], FAST_ARGON, &[s(&dev)]),
    );
    let uuid = ok("ucrypt", &["uuid", s(&dev)]);
    assert_eq!(uuid, ok("cryptsetup", &["luksUUID", s(&dev)]));
    let ours = dir.join("ours.bak");
    ok(
        "ucrypt",
        &["header-backup", "--header-backup-file", s(&ours), s(&dev)],
    );
    let theirs = dir.join("theirs.bak");
    ok(
        "cryptsetup",
        &[
            "luksHeaderBackup",
            "--header-backup-file",
            s(&theirs),
            s(&dev),
        ],
    );
    assert_eq!(
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap(),
        "same backup bytes as cryptsetup"
    );

    // Primary copy damaged: ucrypt warns and opens from the secondary.
    let mut img = std::fs::read(&dev).unwrap();
    img[4096 + 3] ^= 0xff;
    std::fs::write(&dev, &img).unwrap();
    let o = run(
        "ucrypt",
        &["dump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("WARNING: Primary LUKS2 header is corrupted")
    );

    // Both damaged: clean failure; restore cryptsetup's backup with ucrypt.
    img[16384 + 4096 + 3] ^= 0xff;
    std::fs::write(&dev, &img).unwrap();
    let o = run("ucrypt", &["dump", s(&dev)], None);
    assert_eq!(code(&o), 1, "{}", String::from_utf8_lossy(&o.stderr));
    ok(
        "ucrypt",
        &[
            "header-restore",
            "-q",
            "--header-backup-file",
            s(&theirs),
            s(&dev),
        ],
    );
    ok(
        "cryptsetup",
        &["luksDump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
    );
    // And ucrypt's backup restored by cryptsetup.
    img = std::fs::read(&dev).unwrap();
    img[..4096].fill(0);
    std::fs::write(&dev, &img).unwrap();
    ok(
        "cryptsetup",
        &[
            "luksHeaderRestore",
            "-q",
            "--header-backup-file",
            s(&ours),
            s(&dev),
        ],
    );
    ok(
        "ucrypt",
        &["dump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)],
    );
    // uuid --uuid sets it; cryptsetup agrees.
    ok(
        "ucrypt",
        &[
            "uuid",
            "--uuid",
            "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
            s(&dev),
        ],
    );
    assert_eq!(
        ok("cryptsetup", &["luksUUID", s(&dev)]).trim(),
        "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
    );
}

/// `map --luks` core: cryptsetup-made volumes read through luks_table +
/// map_device_io give the oracle's plaintext; writes decrypt under the
/// oracle. Reads also go through the binary's `map --luks`.
#[test]
fn map_luks_matches_oracle() {
    if !tools("luks_cli::map_luks") {
        return;
    }
    let dir = TempDir::new("luks-cli-map");
    for (t, cipher, bits, sector, detached) in [
        ("luks2", "aes-xts-plain64", "512", "4096", false),
        ("luks2", "aes-cbc-essiv:sha256", "256", "512", true),
        ("luks1", "aes-xts-plain64", "256", "512", false),
    ] {
        let dev = image(&dir, "dev.img", if detached { 1 } else { 17 });
        let hdr = dir.join("hdr.img");
        let _ = std::fs::remove_file(&hdr);
        let kf = key(&dir, "k", b"map pass");
        let mut a = vec![
            "luksFormat",
            "-q",
            "--type",
            t,
            "--cipher",
            cipher,
            "--key-size",
            bits,
            "-d",
            s(&kf),
        ];
        a.extend(FAST_PBKDF2);
        if t == "luks2" {
            a.extend(["--sector-size", sector]);
        }
        if detached {
            a.extend(["--header", s(&hdr)]);
        }
        a.push(s(&dev));
        ok("cryptsetup", &a);
        let header = detached.then_some(hdr.as_path());
        let meta = header.unwrap_or(&dev);
        let vk = mk_dump_key(&ok(
            "cryptsetup",
            &["luksDump", "--dump-volume-key", "-q", "-d", s(&kf), s(meta)],
        ));
        let table =
            luks_table(&dev, header, &std::fs::read(&kf).unwrap(), None).expect("luks_table");
        let off = table.offset * 512;
        let len = std::fs::metadata(&dev).unwrap().len() - off;
        // Ciphertext as dm-crypt would have written it.
        let ct = testutil::random_bytes(len as usize, 0x2545_F491_4F6C_DD1D);
        {
            use std::os::unix::fs::FileExt;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&dev)
                .unwrap()
                .write_all_at(&ct, off)
                .unwrap();
        }
        let mut out = Vec::new();
        map_device_io(
            &table.clone().into(),
            MapDirection::Read,
            &mut std::io::empty(),
            None,
            &mut out,
        )
        .map_err(|e| e.chain())
        .unwrap();
        let ss: u32 = sector.parse().unwrap();
        assert!(
            out == oracle("decrypt", cipher, &vk, ss, &ct),
            "{t} {cipher}: map --luks read differs from the oracle"
        );
        // Write direction.
        let plain: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        map_device_io(
            &table.clone().into(),
            MapDirection::Write,
            &mut &plain[..],
            Some(len),
            &mut std::io::sink(),
        )
        .map_err(|e| e.chain())
        .unwrap();
        let on_disk = {
            use std::os::unix::fs::FileExt;
            let mut b = vec![0u8; len as usize];
            std::fs::File::open(&dev)
                .unwrap()
                .read_exact_at(&mut b, off)
                .unwrap();
            b
        };
        assert!(
            oracle("decrypt", cipher, &vk, ss, &on_disk) == plain,
            "{t} {cipher}: map --luks write not decryptable"
        );

        // Through the binary too (`map --luks` is wired; no silent fallback).
        let help = ok("ucrypt", &["map", "--help"]);
        assert!(help.contains("--luks"), "map --help lacks --luks: {help}");
        let mut a = vec!["map", "--luks", s(&dev), "--key-file", s(&kf), "--read"];
        if detached {
            a.extend(["--header", s(&hdr)]);
        }
        let o = run("ucrypt", &a, None);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout == plain, "ucrypt map --luks --read differs");
    }
}
