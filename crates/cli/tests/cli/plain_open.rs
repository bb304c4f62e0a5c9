//! `ucrypt open --type plain` with cryptsetup's options: the
//! table each combination builds, with keys computed here by `openssl dgst`
//! from cryptsetup 2.6.1's rules (passphrases hashed in rounds of
//! "A"*round ‖ passphrase; key files other than `-` read raw and never
//! hashed), the key-file range, `--test-passphrase`, and the refusals.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::TempDir;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(args: &[&str], run_dir: &Path, stdin: &[u8]) -> Output {
    let mut c = Command::new(testutil::ucrypt_bin())
        .args(args)
        .env("UCRYPT_RUNTIME_DIR", run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ucrypt");
    let mut i = c.stdin.take().unwrap();
    // The command may exit before reading (refusals): ignore EPIPE.
    let _ = i.write_all(stdin);
    drop(i);
    c.wait_with_output().unwrap()
}

fn ok(args: &[&str], run_dir: &Path, stdin: &[u8]) -> Output {
    let o = run(args, run_dir, stdin);
    assert!(
        o.status.success(),
        "ucrypt {args:?} ({:?}): {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `openssl dgst -HASH -binary` of `data`.
fn dgst(hash: &str, data: &[u8]) -> Vec<u8> {
    let mut c = Command::new("openssl")
        .args(["dgst", &format!("-{hash}"), "-binary"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    c.stdin.take().unwrap().write_all(data).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success());
    o.stdout
}

struct Setup {
    dir: TempDir,
    img: PathBuf,
    run: PathBuf,
}

fn setup(tag: &str) -> Option<Setup> {
    if !testutil::require_tool(tag, "openssl") {
        return None;
    }
    let dir = TempDir::new(tag);
    let img = dir.join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let run = dir.join("run");
    Some(Setup { dir, img, run })
}

/// Opens with `args` (stdin `input`), returns the `table --showkeys` line
/// and closes again.
fn table_of(t: &Setup, args: &[&str], input: &[u8]) -> (String, String) {
    let mut a = vec!["open", "--type", "plain"];
    a.extend_from_slice(args);
    a.extend_from_slice(&[s(&t.img), "p"]);
    let o = ok(&a, &t.run, input);
    let line = ok(&["table", "--showkeys", "p"], &t.run, b"");
    ok(&["close", "p"], &t.run, b"");
    (
        String::from_utf8(line.stdout).unwrap().trim().to_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn passphrases_are_hashed_in_rounds() {
    let Some(t) = setup("plain-hash") else { return };
    let args = [
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "-h",
        "sha256",
        "--offset",
        "8",
        "--skip",
        "16",
        "--size",
        "64",
    ];
    // Piped stdin without --key-file: one line, the newline is not key.
    let (line, _) = table_of(&t, &args, b"secret words\nignored");
    let mut key = dgst("sha256", b"secret words");
    key.extend(dgst("sha256", b"Asecret words"));
    let dev = std::path::absolute(&t.img).unwrap();
    assert_eq!(
        line,
        format!(
            "0 64 crypt aes-xts-plain64 {} 16 {} 8",
            hex(&key),
            dev.display()
        )
    );
    // The defaults: aes-cbc-essiv:sha256, 256 bits, the whole device.
    let (line, _) = table_of(&t, &[], b"pw\n");
    let w: Vec<&str> = line.split(' ').collect();
    assert_eq!(
        (w[0], w[1], w[3], w[4].len()),
        ("0", "8192", "aes-cbc-essiv:sha256", 64)
    );
}

#[test]
fn key_files_are_raw_and_cut_by_their_range() {
    let Some(t) = setup("plain-keyfile") else {
        return;
    };
    let bytes: Vec<u8> = (0u8..100).collect();
    let kf = t.dir.join("key");
    std::fs::write(&kf, &bytes).unwrap();
    // --hash is ignored for a key file (with cryptsetup's warning).
    let (line, err) = table_of(
        &t,
        &["-d", s(&kf), "--keyfile-offset", "5", "--hash", "sha256"],
        b"",
    );
    assert_eq!(line.split(' ').nth(4), Some(hex(&bytes[5..37]).as_str()));
    assert!(err.contains("--hash parameter is being ignored"), "{err}");
    // `-` with --hash plain: the first key-size bytes of stdin, raw.
    let (line, _) = table_of(&t, &["-d", "-", "--hash", "plain", "-s", "128"], &bytes);
    assert_eq!(line.split(' ').nth(4), Some(hex(&bytes[..16]).as_str()));
    // `-` hashed, --keyfile-size taken.
    let (line, _) = table_of(
        &t,
        &[
            "-d",
            "-",
            "-h",
            "sha256",
            "--keyfile-offset",
            "2",
            "-l",
            "10",
        ],
        &bytes,
    );
    assert_eq!(
        line.split(' ').nth(4),
        Some(hex(&dgst("sha256", &bytes[2..12])).as_str())
    );
}

#[test]
fn refusals_exit_1_and_start_nothing() {
    let Some(t) = setup("plain-refuse") else {
        return;
    };
    let short = t.dir.join("short");
    std::fs::write(&short, [1u8; 10]).unwrap();
    let img = s(&t.img);
    for args in [
        vec!["open", "--type", "plain", "-d", s(&short), img, "p"],
        vec!["open", "--type", "plain", "--test-passphrase", img],
        vec!["open", "--type", "plain", "--offset", "8192", img, "p"],
        vec!["open", "--type", "plain", "--size", "8193", img, "p"],
        vec!["open", "--type", "plain", "-h", "nohash", img, "p"],
        vec!["open", "--type", "luks", "--cipher", "aes", img, "p"],
        vec!["open", "--type", "luks", "--sector-size", "4096", img, "p"],
        vec!["open", "--type", "plain", "--iv-large-sectors", img, "p"],
    ] {
        let o = run(&args, &t.run, b"pw\n");
        assert_eq!(
            o.status.code(),
            Some(1),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = ok(&["list"], &t.run, b"");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn test_passphrase_checks_luks_without_opening() {
    let Some(t) = setup("plain-testpass") else {
        return;
    };
    let img = s(&t.img);
    let kf = t.dir.join("kf");
    std::fs::write(&kf, b"XXXXgood-passYY").unwrap();
    ok(
        &[
            "format",
            "--batch-mode",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&kf),
            "--keyfile-offset",
            "4",
            "--keyfile-size",
            "9",
            img,
        ],
        &t.run,
        b"",
    );
    ok(
        &[
            "open",
            "--test-passphrase",
            "-d",
            s(&kf),
            "--keyfile-offset",
            "4",
            "-l",
            "9",
            img,
        ],
        &t.run,
        b"",
    );
    ok(
        &["luksOpen", "--test-passphrase", img],
        &t.run,
        b"good-pass\n",
    );
    let o = run(&["open", "--test-passphrase", img], &t.run, b"bad-pass\n");
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(
        &["open", "--test-passphrase", "-d", s(&kf), img],
        &t.run,
        b"",
    );
    assert_eq!(o.status.code(), Some(2));
    let o = ok(&["list"], &t.run, b"");
    assert!(o.stdout.is_empty());
}
