//! cryptsetup 2.6.1's `tests/fvault2-compat-test` with ucrypt in
//! cryptsetup's place, over `fvault2-images.tar.xz`: the dump fields the
//! script checks (and the whole text against `cryptsetup fvault2Dump`
//! where installed), the volume key from `--dump-volume-key`,
//! `open --type fvault2 --test-passphrase` (and a wrong passphrase: exit
//! 2), then the decrypted device (`map --read --fvault2`, where the
//! script opens a dm device): `blkid -p`'s UUID and the sha256 the script
//! expects; `map --write` is refused (read-only, as cryptsetup maps it).
//! GPL test data: fetched at test time by `scripts/fetch-cryptsetup-tests.sh`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn image(test: &str) -> Option<PathBuf> {
    for tool in ["apt-get", "xz", "tar", "blkid"] {
        if !testutil::require_tool(test, tool) {
            return None;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let suite = testutil::cryptsetup_suite(test, &cache)?;
    let dir = cache.join("fvault2-cli");
    let img = dir.join("fvault2-images/small");
    if !img.exists() {
        std::fs::create_dir_all(&dir).expect("mkdir");
        let st = Command::new("tar")
            .arg("xJf")
            .arg(suite.join("fvault2-images.tar.xz"))
            .arg("-C")
            .arg(&dir)
            .status()
            .expect("tar runs");
        assert!(st.success());
    }
    Some(img)
}

fn ucrypt(args: &[&str], stdin: Option<&[u8]>) -> Output {
    testutil::run(&testutil::ucrypt_bin().display().to_string(), args, stdin)
}

#[test]
fn cryptsetup_fvault2_compat_test() {
    let test = "cryptsetup_fvault2_compat_test";
    let Some(img) = image(test) else { return };
    let p = img.display().to_string();
    let o = ucrypt(&["fvault2Dump", &p], None);
    assert!(o.status.success());
    let dump = String::from_utf8_lossy(&o.stdout).into_owned();
    let value = |key: &str| {
        dump.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(
        value("Physical volume UUID"),
        "fc52bfae-5a1f-4f9b-b3a6-f33303a0e401"
    );
    assert_eq!(value("Family UUID"), "33a76caa-1481-4bc5-8d04-1ac1707c19c0");
    assert_eq!(value("Logical volume offset"), "67108864 [bytes]");
    assert_eq!(value("Logical volume size"), "167772160 [bytes]");
    assert_eq!(value("PBKDF2 iterations"), "204222");
    assert_eq!(
        value("PBKDF2 salt"),
        "2c 24 9e db 66 63 d6 fb cc 79 05 b7 a4 d7 27 52"
    );
    if testutil::which("cryptsetup").is_some() {
        let theirs = testutil::run("cryptsetup", &["fvault2Dump", &p], None);
        assert_eq!(dump, String::from_utf8_lossy(&theirs.stdout));
    }
    let o = ucrypt(
        &["fvault2Dump", &p, "--dump-volume-key"],
        Some(b"heslo123\n"),
    );
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let vk = text
        .lines()
        .find_map(|l| l.strip_prefix("Volume key:"))
        .map(str::trim)
        .unwrap_or_default();
    assert_eq!(vk, "20 73 4d 33 89 21 27 74 d7 61 0c 29 d7 32 88 09 16 f3 be 14 c4 b1 2a c7 aa f0 7e 5c cc 77 b3 19");
    let t = |pass: &[u8]| {
        ucrypt(
            &["open", "--type", "fvault2", "--test-passphrase", &p],
            Some(pass),
        )
        .status
        .code()
    };
    assert_eq!(t(b"heslo123\n"), Some(0));
    assert_eq!(t(b"heslo124\n"), Some(2), "wrong passphrase");

    let tmp = testutil::TempDir::new("fvault2");
    let out = tmp.join("dec");
    let key = tmp.join("pass");
    std::fs::write(&key, "heslo123").expect("key file");
    let k = key.display().to_string();
    let file = std::fs::File::create(&out).expect("output");
    let st = Command::new(testutil::ucrypt_bin())
        .args(["map", "--read", "--fvault2", &p, "--key-file", &k])
        .stdout(file)
        .status()
        .expect("ucrypt map runs");
    assert!(st.success());
    let o = out.display().to_string();
    let uuid = testutil::run_ok("blkid", &["-p", "-o", "value", "-s", "UUID", &o]);
    assert_eq!(uuid.trim(), "de124d8a-2164-394e-924f-8e28db0a09cb");
    let sum = testutil::run_ok("sha256sum", &[&o]);
    assert!(sum.starts_with("2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18"));
    let w = ucrypt(
        &["map", "--write", "--fvault2", &p, "--key-file", &k],
        Some(b""),
    );
    assert_eq!(w.status.code(), Some(1), "map --write refused");
}

#[test]
fn dump_detects_fvault2_and_a_saved_volume_key_opens_it() {
    let test = "dump_detects_fvault2_and_a_saved_volume_key_opens_it";
    let Some(img) = image(test) else { return };
    let p = img.display().to_string();
    // `dump` finds the type by its signature and prints fvault2Dump's text.
    let a = ucrypt(&["fvault2Dump", &p], None);
    let b = ucrypt(&["dump", &p], None);
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    assert_eq!(a.stdout, b.stdout);
    // The volume key saved to a file (and still printed), as cryptsetup.
    let tmp = testutil::TempDir::new("fvault2-vk");
    let vk = tmp.join("vk");
    let v = vk.display().to_string();
    let o = ucrypt(
        &["dump", "--dump-volume-key", "--volume-key-file", &v, &p],
        Some(b"heslo123\n"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Volume key:       \t20 73 4d 33"));
    let key = std::fs::read(&vk).expect("volume key file");
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "20734d3389212774d7610c29d732880916f3be14c4b12ac7aaf07e5ccc77b319"
    );
    // It opens the volume without the passphrase; -v's status line goes to
    // stderr, as stdout is the data.
    let out = tmp.join("dec");
    let file = std::fs::File::create(&out).expect("output");
    let o = Command::new(testutil::ucrypt_bin())
        .args([
            "map",
            "-v",
            "--read",
            "--fvault2",
            &p,
            "--volume-key-file",
            &v,
        ])
        .stdout(file)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("ucrypt map runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Command successful."));
    let sum = testutil::run_ok("sha256sum", &[&out.display().to_string()]);
    assert!(sum.starts_with("2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18"));
    let t = ucrypt(
        &[
            "open",
            "--type",
            "fvault2",
            "--test-passphrase",
            "--volume-key-file",
            &v,
            &p,
        ],
        None,
    );
    assert_eq!(
        t.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&t.stderr)
    );
    // A short file is refused with cryptsetup's message.
    std::fs::write(&vk, [0u8; 16]).expect("short key");
    let t = ucrypt(
        &[
            "open",
            "--type",
            "fvault2",
            "--test-passphrase",
            "--volume-key-file",
            &v,
            &p,
        ],
        None,
    );
    assert_eq!(t.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&t.stderr).contains("Cannot read 32 bytes from keyfile"));
    // Only BitLocker and FileVault 2 take a volume key file here.
    let t = ucrypt(
        &["open", "--test-passphrase", "--volume-key-file", &v, &p],
        None,
    );
    assert_eq!(t.status.code(), Some(1));
}
