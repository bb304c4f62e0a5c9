//! `ucrypt reencrypt --encrypt --offset SECTORS` against cryptsetup
//! 2.6.1 (luks2-reencryption-test [2] and [3]): with a detached header
//! the data starts at the offset and the bytes before it stay; with
//! `--reduce-device-size` the offset may not pass half of it and one
//! below makes it twice the offset. The metadata is cryptsetup's, each
//! tool finishes the other's, and refusals write nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::reencrypt::ok;
use crate::reencrypt_encrypt::{check_volume, json, shape, FAST_KDF};
use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

/// `TOOL reencrypt -q --encrypt ARGS DEV` (cryptsetup offline).
fn encrypt(tool: &str, key: &Path, args: &[&str], dev: &Path) -> Output {
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.args(["reencrypt", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(ucrypt_bin());
        c.arg("reencrypt");
        c
    };
    c.args(["-q", "--encrypt"])
        .args(FAST_KDF)
        .arg("--key-file")
        .arg(key)
        .args(args)
        .arg(dev)
        .output()
        .unwrap()
}

/// `TOOL reencrypt -q --resume-only [--header HDR] DEV`.
fn resume(tool: &str, key: &Path, hdr: Option<&Path>, dev: &Path) -> Output {
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.args(["reencrypt", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(ucrypt_bin());
        c.arg("reencrypt");
        c
    };
    c.args(["-q", "--resume-only", "--key-file"]).arg(key);
    if let Some(h) = hdr {
        c.arg("--header").arg(h);
    }
    c.arg(dev).output().unwrap()
}

/// A directory with a passphrase file and a device of `len` seeded
/// random bytes (its copy `c.data` for cryptsetup).
fn setup(tag: &str, len: usize, seed: u64) -> (TempDir, PathBuf, Vec<u8>) {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("key"), b"offset passphrase").unwrap();
    let mut plain = vec![0u8; len];
    Rng::new(seed).fill(&mut plain);
    std::fs::write(dir.path().join("data"), &plain).unwrap();
    std::fs::write(dir.path().join("c.data"), &plain).unwrap();
    let d = dir.path().to_path_buf();
    (dir, d, plain)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn offset_with_a_detached_header_is_cryptsetups() {
    if !require_tool("reencrypt_offset_header", "cryptsetup") {
        return;
    }
    const OFF: usize = 2 << 20;
    let (_t, d, plain) = setup("enc-offset-hdr", 8 << 20, 200);
    let (img, c_img, key) = (d.join("data"), d.join("c.data"), d.join("key"));
    let (hdr, c_hdr) = (d.join("hdr"), d.join("c.hdr"));
    let args = |h: &Path| {
        vec!["--init-only", "--offset", "4096", "--header"]
            .into_iter()
            .map(str::to_string)
            .chain([s(h).to_string()])
            .collect::<Vec<_>>()
    };
    let (u_args, c_args) = (args(&hdr), args(&c_hdr));
    let u_args: Vec<&str> = u_args.iter().map(String::as_str).collect();
    let c_args: Vec<&str> = c_args.iter().map(String::as_str).collect();
    ok(encrypt("ucrypt", &key, &u_args, &img), "ucrypt init");
    ok(
        encrypt("cryptsetup", &key, &c_args, &c_img),
        "cryptsetup init",
    );
    assert_eq!(shape(json(&hdr)), shape(json(&c_hdr)), "init");
    assert_eq!(json(&hdr)["segments"]["0"]["offset"], "2097152");
    assert_eq!(
        std::fs::metadata(&hdr).unwrap().len(),
        std::fs::metadata(&c_hdr).unwrap().len(),
        "header file size"
    );
    assert!(std::fs::read(&img).unwrap() == plain, "init writes no data");
    ok(
        resume("cryptsetup", &key, Some(&hdr), &img),
        "cryptsetup resumes",
    );
    ok(
        resume("ucrypt", &key, Some(&c_hdr), &c_img),
        "ucrypt resumes",
    );
    for (i, h, what) in [
        (&img, &hdr, "ucrypt → cryptsetup"),
        (&c_img, &c_hdr, "cryptsetup → ucrypt"),
    ] {
        check_volume(&key, i, Some(h), &plain[OFF..], what);
        let now = std::fs::read(i).unwrap();
        assert!(
            now[..OFF] == plain[..OFF],
            "{what}: the bytes before the offset stay"
        );
        assert!(
            now[OFF..OFF + 4096] != plain[OFF..OFF + 4096],
            "{what}: encrypted"
        );
    }
    assert_eq!(shape(json(&hdr)), shape(json(&c_hdr)), "finished");
    // A whole ucrypt run.
    std::fs::write(&img, &plain).unwrap();
    std::fs::remove_file(&hdr).unwrap();
    ok(
        encrypt(
            "ucrypt",
            &key,
            &["--offset", "4096", "--header", s(&hdr)],
            &img,
        ),
        "ucrypt run",
    );
    check_volume(&key, &img, Some(&hdr), &plain[OFF..], "ucrypt run");
}

#[test]
fn offset_with_reduce_device_size_is_cryptsetups() {
    if !require_tool("reencrypt_offset_shift", "cryptsetup") {
        return;
    }
    let (_t, d, plain) = setup("enc-offset-shift", 12 << 20, 210);
    let (img, c_img, key) = (d.join("data"), d.join("c.data"), d.join("key"));
    // 2048 sectors (1 MiB) below half of 4 MiB: the reduction becomes 2 MiB.
    let args = [
        "--init-only",
        "--reduce-device-size",
        "4M",
        "--offset",
        "2048",
    ];
    let u = ok(encrypt("ucrypt", &key, &args, &img), "ucrypt init");
    let c = ok(
        encrypt("cryptsetup", &key, &args, &c_img),
        "cryptsetup init",
    );
    let line = "Adjusting --reduce-device-size value to twice the --offset 4096 (sectors).\n";
    assert_eq!(String::from_utf8_lossy(&u.stdout), line);
    assert!(String::from_utf8_lossy(&c.stdout).contains(line));
    assert_eq!(shape(json(&img)), shape(json(&c_img)), "init");
    let (a, b) = (std::fs::read(&img).unwrap(), std::fs::read(&c_img).unwrap());
    assert!(a[1 << 20..] == b[1 << 20..], "the data and its moved copy");
    ok(resume("cryptsetup", &key, None, &img), "cryptsetup resumes");
    ok(resume("ucrypt", &key, None, &c_img), "ucrypt resumes");
    let data = &plain[..10 << 20];
    check_volume(&key, &img, None, data, "ucrypt → cryptsetup");
    check_volume(&key, &c_img, None, data, "cryptsetup → ucrypt");
    assert_eq!(shape(json(&img)), shape(json(&c_img)), "finished");
    // An offset of exactly half the reduction changes nothing.
    std::fs::write(&img, &plain).unwrap();
    std::fs::write(&c_img, &plain).unwrap();
    let u = ok(
        encrypt(
            "ucrypt",
            &key,
            &[
                "--init-only",
                "--reduce-device-size",
                "4M",
                "--offset",
                "4096",
            ],
            &img,
        ),
        "half",
    );
    assert!(u.stdout.is_empty(), "no adjustment");
    ok(
        encrypt(
            "cryptsetup",
            &key,
            &["--init-only", "--reduce-device-size", "4M"],
            &c_img,
        ),
        "cryptsetup without --offset",
    );
    assert_eq!(shape(json(&img)), shape(json(&c_img)), "half");
}

#[test]
fn an_offset_is_refused_where_cryptsetup_refuses_it() {
    if !require_tool("reencrypt_offset_misuse", "cryptsetup") {
        return;
    }
    let (_t, d, plain) = setup("enc-offset-misuse", 8 << 20, 220);
    let (img, c_img, key) = (d.join("data"), d.join("c.data"), d.join("key"));
    let (hdr, c_hdr) = (d.join("hdr"), d.join("c.hdr"));
    let cases: [(&[&str], &str); 4] = [
        (&["--offset", "8", "--header"], "Requested data offset is too small."),
        (&["--offset", "100", "--header"], "Data offset is not multiple of 4096 bytes."),
        (&["--offset", "512", "--header"], "No space for new keyslot."),
        (
            &["--reduce-device-size", "4M", "--offset", "4097"],
            "Requested data offset must be less than or equal to half of --reduce-device-size parameter.",
        ),
    ];
    for (args, want) in cases {
        let with = |h: &Path| {
            let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            if v.last().is_some_and(|a| a == "--header") {
                v.push(s(h).to_string());
            }
            v
        };
        let (u_args, c_args) = (with(&hdr), with(&c_hdr));
        let u_args: Vec<&str> = u_args.iter().map(String::as_str).collect();
        let c_args: Vec<&str> = c_args.iter().map(String::as_str).collect();
        let c = encrypt("cryptsetup", &key, &c_args, &c_img);
        assert_eq!(c.status.code(), Some(1), "cryptsetup {args:?}");
        assert!(
            String::from_utf8_lossy(&c.stderr).contains(want),
            "cryptsetup {args:?}"
        );
        let u = encrypt("ucrypt", &key, &u_args, &img);
        let err = String::from_utf8_lossy(&u.stderr);
        assert_eq!(u.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?}, got {err:?}");
        assert!(
            std::fs::read(&img).unwrap() == plain,
            "{args:?}: the device is unchanged"
        );
        assert!(!hdr.exists(), "{args:?}: no header file");
        let _ = std::fs::remove_file(&c_hdr);
        std::fs::write(&c_img, &plain).unwrap();
    }
}
