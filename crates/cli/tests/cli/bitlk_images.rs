//! cryptsetup 2.6.1's `tests/bitlk-compat-test` with ucrypt in cryptsetup's
//! place, over the suite's `bitlk-images.tar.xz` (its `images.conf` gives
//! each image's passphrase, recovery password, GUIDs, filesystem UUID and
//! the sha256 of the decrypted device). For every image the script uses:
//!
//! - HEADER CHECK: `ucrypt bitlkDump` shows what the script greps
//!   (volume size, description, GUID, cipher, the protectors' GUIDs), and
//!   the whole text equals `cryptsetup bitlkDump`'s where cryptsetup is
//!   installed;
//! - ACTIVATION: with the passphrase and the recovery password (piped, as
//!   `echo $PASSPHRASE |`), `open --type bitlk --test-passphrase` and the
//!   decrypted device (`map --read --bitlk`, where the script opens a
//!   dm device, once per image): `blkid -p` finds the expected filesystem UUID and the
//!   sha256 is the expected one; the images cryptsetup refuses
//!   (encrypt-on-write, a clear key) are refused with its message and
//!   exit code 1; `bitlkDump --dump-volume-key --volume-key-file` writes
//!   the volume key (the script then opens with it: `open` takes no
//!   `--volume-key-file` in ucrypt, so the key is compared with
//!   cryptsetup's dump instead, where cryptsetup is installed);
//! - the startup-key images open with their `.BEK` file as `--key-file`.
//!
//! The images and the script are GPL test data, fetched at test time by
//! `scripts/fetch-cryptsetup-tests.sh` and never stored here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The unpacked `bitlk-images` directory, or `None` (skipped).
fn images(test: &str) -> Option<PathBuf> {
    for tool in ["apt-get", "xz", "tar", "blkid"] {
        if !testutil::require_tool(test, tool) {
            return None;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let suite = testutil::cryptsetup_suite(test, &cache)?;
    let dir = cache.join("bitlk-cli").join("bitlk-images");
    if !dir.join("images.conf").exists() {
        std::fs::create_dir_all(dir.parent().expect("parent")).expect("mkdir");
        let st = Command::new("tar")
            .arg("xJf")
            .arg(suite.join("bitlk-images.tar.xz"))
            .arg("-C")
            .arg(dir.parent().expect("parent"))
            .status()
            .expect("tar runs");
        assert!(st.success(), "bitlk-images.tar.xz unpacks");
    }
    Some(dir)
}

/// `images.conf`: section → key → value (the script's `load_vars`).
fn conf(dir: &Path) -> HashMap<String, HashMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("images.conf")).expect("images.conf");
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut cur = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            cur = name.to_owned();
        } else if let Some((k, v)) = line.split_once('=') {
            out.entry(cur.clone())
                .or_default()
                .insert(k.to_owned(), v.to_owned());
        }
    }
    out
}

fn ucrypt(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let bin = testutil::ucrypt_bin();
    testutil::run(&bin.display().to_string(), args, stdin)
}

/// The line after the one containing `what` in `dump`, its value field
/// (the script's `grep "$what" -B 1 | head -1 | cut -d: -f2`).
fn guid_before(dump: &str, what: &str) -> Option<String> {
    let lines: Vec<&str> = dump.lines().collect();
    let i = lines.iter().position(|l| l.contains(what))?;
    let prev = lines.get(i.checked_sub(1)?)?;
    Some(prev.split(':').nth(1)?.trim().to_owned())
}

/// `map --read --bitlk IMG` with `pass` piped (or a key file): the
/// decrypted device written to `out`; returns its sha256 and the UUID
/// `blkid -p` finds on it.
fn decrypted(img: &Path, pass: Input<'_>, out: &Path) -> (String, String) {
    let mut cmd = Command::new(testutil::ucrypt_bin());
    cmd.args(["map", "--read", "--bitlk"]).arg(img);
    let file = std::fs::File::create(out).expect("output file");
    cmd.stdout(file).stderr(Stdio::piped());
    match pass {
        Input::Piped(p) => {
            cmd.stdin(Stdio::piped());
            let mut child = cmd.spawn().expect("ucrypt map runs");
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(p).expect("passphrase piped");
            drop(stdin);
            let o = child.wait_with_output().expect("ucrypt map ends");
            assert!(
                o.status.success(),
                "map {}: {}",
                img.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Input::KeyFile(k) => {
            cmd.arg("--key-file").arg(k).stdin(Stdio::null());
            let o = cmd.output().expect("ucrypt map runs");
            assert!(
                o.status.success(),
                "map {}: {}",
                img.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    let sum = testutil::run_ok("sha256sum", &[&out.display().to_string()]);
    let uuid = testutil::run_ok(
        "blkid",
        &[
            "-p",
            "-o",
            "value",
            "-s",
            "UUID",
            &out.display().to_string(),
        ],
    );
    let _ = std::fs::remove_file(out);
    (
        sum.split_whitespace().next().unwrap_or_default().to_owned(),
        uuid.trim().to_owned(),
    )
}

#[derive(Clone, Copy)]
enum Input<'a> {
    Piped(&'a [u8]),
    KeyFile(&'a Path),
}

#[test]
fn cryptsetup_bitlk_compat_test() {
    let test = "cryptsetup_bitlk_compat_test";
    let Some(dir) = images(test) else { return };
    let have_cryptsetup = testutil::which("cryptsetup").is_some();
    let conf = conf(&dir);
    let tmp = testutil::TempDir::new("bitlk-images");
    let mut names: Vec<&String> = conf.keys().collect();
    names.sort();
    let (mut opened, mut refused) = (0, 0);
    for name in names {
        let c = &conf[name];
        let img = dir.join(format!("{name}.img"));
        let p = img.display().to_string();

        // HEADER CHECK
        let o = ucrypt(&["bitlkDump", &p], None);
        assert!(o.status.success(), "{name}: bitlkDump");
        let dump = String::from_utf8_lossy(&o.stdout).into_owned();
        let field = |f: &str| {
            dump.lines()
                .find(|l| l.contains(f))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.split_whitespace().collect::<String>())
                .unwrap_or_default()
        };
        let size = field("Volume size:");
        assert!(
            size == "104857600[bytes]" || size == "134217728[bytes]",
            "{name}: {size}"
        );
        let desc = field("Description:");
        assert!(
            desc.starts_with("DESKTOP") || desc.starts_with("WIN"),
            "{name}: {desc}"
        );
        assert_eq!(field("GUID:"), c["GUID"], "{name}: GUID");
        assert_eq!(
            format!("{}-{}", field("Cipher name"), field("Cipher mode")),
            c["CIPHER"],
            "{name}: cipher"
        );
        let (what, key) = if name.contains("smart-card") {
            ("VMK protected with smart card", "SC_VMK_GUID")
        } else if name.contains("startup-key") {
            ("VMK protected with startup key", "SK_VMK_GUID")
        } else {
            ("VMK protected with passphrase", "PW_VMK_GUID")
        };
        assert_eq!(
            guid_before(&dump, what).as_deref(),
            c.get(key).map(String::as_str),
            "{name}: {what}"
        );
        assert_eq!(
            guid_before(&dump, "VMK protected with recovery passphrase").as_deref(),
            c.get("RP_VMK_GUID").map(String::as_str),
            "{name}: recovery VMK"
        );
        if have_cryptsetup {
            let theirs = testutil::run("cryptsetup", &["bitlkDump", &p], None);
            assert_eq!(
                dump,
                String::from_utf8_lossy(&theirs.stdout),
                "{name}: dump text"
            );
        }

        // ACTIVATION FS UUID CHECK
        let refusal = name.contains("eow") || name.contains("clearkey");
        let passes: Vec<&str> = ["PW", "RP"]
            .iter()
            .filter_map(|k| c.get(*k).filter(|v| !v.is_empty()).map(String::as_str))
            .collect();
        let mut last = "";
        for (i, pass) in passes.iter().enumerate() {
            last = pass;
            let line = format!("{pass}\n");
            let o = ucrypt(
                &["open", "--type", "bitlk", "-r", &p, "--test-passphrase"],
                Some(line.as_bytes()),
            );
            let code = o.status.code();
            if refusal {
                assert_eq!(code, Some(1), "{name}: refused as cryptsetup refuses it");
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(err.contains("cannot be activated"), "{name}: {err}");
                continue;
            }
            assert_eq!(
                code,
                Some(0),
                "{name}: --test-passphrase: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            // The decrypted device once per image (with the recovery
            // password where there is one): each unlock is a 2^20-round KDF.
            if i + 1 < passes.len() {
                continue;
            }
            let (sum, uuid) = decrypted(&img, Input::Piped(line.as_bytes()), &tmp.join("dec"));
            assert_eq!(uuid, c["UUID"], "{name}: filesystem UUID");
            assert_eq!(
                sum, c["SHA256SUM"],
                "{name}: sha256 of the decrypted device"
            );
        }

        // The volume key, dumped to a file with the last passphrase.
        let vk = tmp.join("vk");
        let o = ucrypt(
            &[
                "bitlkDump",
                "-r",
                &p,
                "--dump-volume-key",
                "--volume-key-file",
                &vk.display().to_string(),
            ],
            Some(format!("{last}\n").as_bytes()),
        );
        if refusal {
            assert_eq!(
                o.status.code(),
                Some(1),
                "{name}: no volume key from a refused image"
            );
            refused += 1;
            continue;
        }
        assert!(
            o.status.success(),
            "{name}: dump volume key: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let key = std::fs::read(&vk).expect("volume key file");
        // Against cryptsetup's for a sample (the bitlk crate's test compares
        // every image's).
        if have_cryptsetup && opened % 4 == 0 {
            let theirs = testutil::run(
                "cryptsetup",
                &["bitlkDump", "-q", "--dump-volume-key", &p],
                Some(format!("{last}\n").as_bytes()),
            );
            let theirs = testutil::volume_key_from_dump(&String::from_utf8_lossy(&theirs.stdout));
            assert_eq!(key, theirs, "{name}: volume key");
        }
        let _ = std::fs::remove_file(&vk);

        // The startup key, from the archive's .BEK file.
        if let Some(g) = c.get("SK_VMK_GUID") {
            let bek = dir.join(format!("{}.BEK", g.to_uppercase()));
            let b = bek.display().to_string();
            let o = ucrypt(
                &[
                    "open",
                    "--type",
                    "bitlk",
                    "-r",
                    &p,
                    "--test-passphrase",
                    "--key-file",
                    &b,
                ],
                None,
            );
            assert!(
                o.status.success(),
                "{name}: .BEK: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let (sum, uuid) = decrypted(&img, Input::KeyFile(&bek), &tmp.join("dec"));
            assert_eq!(
                (uuid.as_str(), sum.as_str()),
                (c["UUID"].as_str(), c["SHA256SUM"].as_str()),
                "{name}: .BEK"
            );
        }
        opened += 1;
    }
    eprintln!(
        "{test}: {opened} images opened as expected, {refused} refused as cryptsetup refuses them"
    );
    assert!(
        opened + refused == conf.len() && opened >= 12,
        "{opened} opened, {refused} refused"
    );
}

#[test]
fn dump_detects_bitlk_prints_local_time_and_a_saved_key_opens_it() {
    let test = "dump_detects_bitlk_prints_local_time_and_a_saved_key_opens_it";
    let Some(dir) = images(test) else { return };
    let img = dir.join("bitlk-aes-xts-128.img");
    let p = img.display().to_string();
    let in_zone = |tz: &str, args: &[&str]| {
        Command::new(testutil::ucrypt_bin())
            .env("TZ", tz)
            .args(args)
            .output()
            .expect("ucrypt runs")
    };
    // ctime's local time, as cryptsetup prints it (checked against
    // `TZ=… cryptsetup bitlkDump` on this image: 07:01:55 UTC).
    for (tz, want) in [
        ("UTC", "Thu Jul  4 07:01:55 2019"),
        ("Asia/Tokyo", "Thu Jul  4 16:01:55 2019"),
        ("EST5EDT", "Thu Jul  4 03:01:55 2019"),
    ] {
        let o = in_zone(tz, &["bitlkDump", &p]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains(&format!("Created:      \t{want}\n")),
            "TZ={tz}: {text}"
        );
        if testutil::which("cryptsetup").is_some() {
            let c = Command::new("cryptsetup")
                .env("TZ", tz)
                .args(["bitlkDump", &p])
                .output()
                .expect("cryptsetup runs");
            if c.status.success() {
                assert_eq!(o.stdout, c.stdout, "TZ={tz}");
            }
        }
        // `dump` finds BitLocker by its signature: the same text.
        let d = in_zone(tz, &["dump", &p]);
        assert_eq!(d.stdout, o.stdout, "dump, TZ={tz}");
    }
    // The volume key saved by --volume-key-file opens the volume.
    let c = conf(&dir);
    let pw = c["bitlk-aes-xts-128"]["PW"].clone();
    let tmp = testutil::TempDir::new("bitlk-vk");
    let vk = tmp.join("vk");
    let v = vk.display().to_string();
    let o = ucrypt(
        &[
            "bitlkDump",
            "--dump-volume-key",
            "--volume-key-file",
            &v,
            &p,
        ],
        Some(format!("{pw}\n").as_bytes()),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("Key stored to file {v}.")));
    let by_pass = tmp.join("a");
    let by_key = tmp.join("b");
    let kf = tmp.join("pw");
    std::fs::write(&kf, &pw).expect("passphrase file");
    for (out, extra) in [
        (&by_pass, ["--key-file", kf.to_str().expect("utf-8")]),
        (&by_key, ["--volume-key-file", v.as_str()]),
    ] {
        let f = std::fs::File::create(out).expect("output");
        let st = Command::new(testutil::ucrypt_bin())
            .args(["map", "--read", "--bitlk", &p])
            .args(extra)
            .stdout(f)
            .status()
            .expect("ucrypt map runs");
        assert!(st.success(), "{extra:?}");
    }
    assert!(
        std::fs::read(&by_pass).expect("a") == std::fs::read(&by_key).expect("b"),
        "the volume key maps what the passphrase maps"
    );
}
