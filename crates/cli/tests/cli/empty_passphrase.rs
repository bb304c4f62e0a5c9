//! Empty passphrases: cryptsetup formats and opens volumes with
//! an empty key file, so ucrypt must accept them too — opening a volume
//! cryptsetup made, and formatting / adding keys cryptsetup then opens.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::TempDir;

const FAST_PBKDF2: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(prog: &str, args: &[&str], run_dir: &Path) -> Output {
    let bin = if prog == "ucrypt" {
        testutil::ucrypt_bin()
    } else {
        PathBuf::from(prog)
    };
    Command::new(bin)
        .args(args)
        .env("UCRYPT_RUNTIME_DIR", run_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"))
}

fn ok(prog: &str, args: &[&str], run_dir: &Path) {
    let o = run(prog, args, run_dir);
    assert!(
        o.status.success(),
        "{prog} {args:?} ({:?}): {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

struct Setup {
    dir: TempDir,
    img: PathBuf,
    empty: PathBuf,
}

fn setup(tag: &str) -> Option<Setup> {
    if !testutil::require_tool(tag, "cryptsetup") {
        return None;
    }
    let dir = TempDir::new(tag);
    let img = dir.join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    Some(Setup { dir, img, empty })
}

#[test]
fn opens_cryptsetup_volume_with_empty_key_file() {
    let Some(t) = setup("empty-open") else { return };
    let run_dir = t.dir.join("run");
    for ty in ["luks1", "luks2"] {
        let mut args = vec!["luksFormat", "--batch-mode", "--type", ty];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend_from_slice(&["--key-file", s(&t.empty), s(&t.img)]);
        ok("cryptsetup", &args, &run_dir);
        ok(
            "ucrypt",
            &["open", "--key-file", s(&t.empty), s(&t.img), "e"],
            &run_dir,
        );
        ok("ucrypt", &["close", "e"], &run_dir);
    }
}

#[test]
fn formats_and_adds_empty_passphrases_cryptsetup_opens() {
    let Some(t) = setup("empty-format") else {
        return;
    };
    let run_dir = t.dir.join("run");
    let other = t.dir.join("other");
    std::fs::write(&other, b"other passphrase").unwrap();
    let test_pass = |kf: &Path| {
        ok(
            "cryptsetup",
            &["open", "--test-passphrase", "--key-file", s(kf), s(&t.img)],
            &run_dir,
        )
    };
    for ty in ["luks1", "luks2"] {
        // Formatted with an empty passphrase.
        let mut args = vec!["format", "--batch-mode", "--force", "--type", ty];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend_from_slice(&["--key-file", s(&t.empty), s(&t.img)]);
        ok("ucrypt", &args, &run_dir);
        test_pass(&t.empty);
        // Unlocked with the empty passphrase to add another one.
        let mut args = vec!["add-key", "--key-file", s(&t.empty)];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend_from_slice(&[s(&t.img), s(&other)]);
        ok("ucrypt", &args, &run_dir);
        test_pass(&other);

        // Formatted with a passphrase, then an empty one added.
        let mut args = vec!["format", "--batch-mode", "--force", "--type", ty];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend_from_slice(&["--key-file", s(&other), s(&t.img)]);
        ok("ucrypt", &args, &run_dir);
        let mut args = vec!["add-key", "--key-file", s(&other)];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend_from_slice(&[s(&t.img), s(&t.empty)]);
        ok("ucrypt", &args, &run_dir);
        test_pass(&t.empty);
    }
}
