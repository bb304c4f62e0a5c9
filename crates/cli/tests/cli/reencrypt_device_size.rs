//! `reencrypt --device-size SIZE` (`luks2-reencryption-test` [16], [18],
//! [20], [21], offline, scaled down): only the data's first SIZE bytes
//! are reencrypted, encrypted or decrypted, the rest of the device keeps
//! its bytes, and the finished header is cryptsetup 2.6.1's on the same
//! input (its final segment to the device's end). cryptsetup's
//! refusals are ucrypt's, with every file unchanged.

use std::path::{Path, PathBuf};

use serde_json::Value;
use testutil::{require_tool, Rng, TempDir};

use super::reencrypt::ok;

const PW: &[u8] = b"device size passphrase\n";
const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn key(dir: &TempDir) -> PathBuf {
    let k = dir.join("key");
    std::fs::write(&k, &PW[..PW.len() - 1]).unwrap();
    k
}

fn segments(hdr: &Path) -> Value {
    let out = ok(
        testutil::run(
            "cryptsetup",
            &["luksDump", "--dump-json-metadata", s(hdr)],
            None,
        ),
        "luksDump",
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    j["segments"].clone()
}

/// The first `len` bytes of the volume read through `ucrypt map --read`.
fn head(img: &Path, hdr: Option<&Path>, key: &Path, len: u64) -> Vec<u8> {
    let mut a = vec!["map", "--read", "--luks", s(img), "--key-file", s(key)];
    if let Some(h) = hdr {
        a.extend(["--header", s(h)]);
    }
    let mut out = ok(testutil::run("ucrypt", &a, None), "map --read").stdout;
    out.truncate(len.min(out.len() as u64) as usize);
    out
}

/// cryptsetup (`--force-offline-reencrypt`) on a copy of `img` (and of
/// `hdr`) and ucrypt on another, `args` given to both: both succeed with
/// the same segments; returns the two images (cryptsetup's, ucrypt's)
/// and their headers.
fn both(
    dir: &TempDir,
    img: &Path,
    hdr: Option<&Path>,
    args: &[&str],
) -> [(PathBuf, Option<PathBuf>); 2] {
    let mut out = Vec::new();
    for (tool, tag) in [("cryptsetup", "cs"), ("ucrypt", "u")] {
        let i = dir.join(&format!("{tag}.img"));
        std::fs::copy(img, &i).unwrap();
        let h = hdr.map(|h| {
            let p = dir.join(&format!("{tag}.hdr"));
            if h.exists() {
                std::fs::copy(h, &p).unwrap();
            } else {
                let _ = std::fs::remove_file(&p);
            }
            p
        });
        let mut a = vec!["reencrypt", "-q"];
        a.extend_from_slice(FAST);
        a.extend_from_slice(args);
        if let Some(h) = &h {
            a.extend(["--header", s(h)]);
        }
        if tool == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        a.push(s(&i));
        ok(
            testutil::run(tool, &a, Some(PW)),
            &format!("{tool} {args:?}"),
        );
        out.push((i, h));
    }
    let [c, u]: [(PathBuf, Option<PathBuf>); 2] = out.try_into().unwrap();
    assert_eq!(
        segments(c.1.as_deref().unwrap_or(&c.0)),
        segments(u.1.as_deref().unwrap_or(&u.0)),
        "{args:?}"
    );
    [c, u]
}

fn plain_image(path: &Path, len: u64, seed: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    Rng::new(seed).fill(&mut b);
    std::fs::write(path, &b).unwrap();
    b
}

fn format(img: &Path, hdr: Option<&Path>, key: &Path, mib: u64, seed: u64) -> Vec<u8> {
    std::fs::File::create(img)
        .unwrap()
        .set_len(mib * MIB)
        .unwrap();
    let mut a = vec!["-q", "luksFormat", "--type", "luks2"];
    a.extend_from_slice(FAST);
    match hdr {
        Some(h) => a.extend(["--header", s(h)]),
        None => a.extend(["--offset", "16384"]),
    }
    a.push(s(img));
    ok(testutil::run("cryptsetup", &a, Some(PW)), "luksFormat");
    let data = if hdr.is_some() { mib } else { mib - 8 } * MIB;
    let mut plain = vec![0u8; data as usize];
    Rng::new(seed).fill(&mut plain);
    let mut w = vec!["map", "--write", "--luks", s(img), "--key-file", s(key)];
    if let Some(h) = hdr {
        w.extend(["--header", s(h)]);
    }
    ok(testutil::run("ucrypt", &w, Some(&plain)), "map --write");
    plain
}

#[test]
fn fixed_size_reencryption_is_cryptsetups() {
    if !require_tool("reencrypt_device_size_reencrypt", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("redevsize-re");
    let key = key(&dir);
    for detached in [false, true] {
        let img = dir.join("img");
        let hdr_path = dir.join("hdr");
        let _ = std::fs::remove_file(&hdr_path);
        let hdr = detached.then_some(hdr_path.as_path());
        let plain = format(&img, hdr, &key, 20, 16);
        let offset = if detached { 0 } else { 8 * MIB };
        let orig = std::fs::read(&img).unwrap();
        for (ss, size, res) in [
            ("512", "2048s", "checksum"),
            ("4096", "3M", "journal"),
            ("4096", "5M", "none"),
        ] {
            let args = [
                "--sector-size",
                ss,
                "--device-size",
                size,
                "--resilience",
                res,
            ];
            let len = luks::ops::parse_size(size).unwrap();
            for (i, h) in both(&dir, &img, hdr, &args) {
                assert_eq!(
                    head(&i, h.as_deref(), &key, len),
                    plain[..len as usize],
                    "{args:?}"
                );
                let now = std::fs::read(&i).unwrap();
                let tail = (offset + len) as usize;
                assert!(now[tail..] == orig[tail..], "{args:?}: the tail changed");
            }
        }
    }
}

#[test]
fn fixed_size_encryption_and_decryption_are_cryptsetups() {
    if !require_tool("reencrypt_device_size_plaintext", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("redevsize-plain");
    let key = key(&dir);
    // [20]: encryption into a detached header.
    let img = dir.join("img");
    let hdr = dir.join("hdr");
    let plain = plain_image(&img, 12 * MIB, 20);
    for (ss, size, res) in [("512", "2048s", "checksum"), ("4096", "7M", "none")] {
        let args = [
            "--encrypt",
            "--sector-size",
            ss,
            "--device-size",
            size,
            "--resilience",
            res,
        ];
        let len = luks::ops::parse_size(size).unwrap() as usize;
        for (i, h) in both(&dir, &img, Some(&hdr), &args) {
            assert_eq!(head(&i, h.as_deref(), &key, len as u64), plain[..len]);
            let now = std::fs::read(&i).unwrap();
            assert!(now[len..] == plain[len..], "{args:?}: the tail changed");
        }
    }
    // [21]: decryption of a detached header's volume.
    let plain = format(&img, Some(&hdr), &key, 12, 21);
    let orig = std::fs::read(&img).unwrap();
    for (size, res) in [("2048s", "checksum"), ("5M", "journal")] {
        let args = ["--decrypt", "--device-size", size, "--resilience", res];
        let len = luks::ops::parse_size(size).unwrap() as usize;
        for (i, _) in both(&dir, &img, Some(&hdr), &args) {
            let now = std::fs::read(&i).unwrap();
            assert!(now[..len] == plain[..len], "{args:?}: not decrypted");
            assert!(now[len..] == orig[len..], "{args:?}: the tail changed");
        }
    }
}

#[test]
fn device_sizes_cryptsetup_refuses_are_refused_and_nothing_is_written() {
    if !require_tool("reencrypt_device_size_refusals", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("redevsize-refuse");
    let key = key(&dir);
    let img = dir.join("img");
    format(&img, None, &key, 20, 30);
    let orig = std::fs::read(&img).unwrap();
    let area = 12 * 1024;
    let over = format!("{}k", area + 4);
    let misaligned = format!("{}k", 8 * 1024 + 2);
    let cases: [&[&str]; 5] = [
        &["--device-size", &over],
        &["--sector-size", "4096", "--device-size", &misaligned],
        &["--device-size", "0"],
        &["--device-size", "1000"],
        &["--device-size", "4M", "--reduce-device-size", "4M"],
    ];
    for args in cases {
        let c = dir.join("c.img");
        std::fs::copy(&img, &c).unwrap();
        let mut a = vec!["reencrypt", "-q"];
        a.extend_from_slice(FAST);
        a.extend_from_slice(args);
        a.push(s(&c));
        let mut ca = a.clone();
        ca.push("--force-offline-reencrypt");
        let cs = testutil::run("cryptsetup", &ca, Some(PW));
        assert!(!cs.status.success(), "cryptsetup accepted {args:?}");
        std::fs::copy(&img, &c).unwrap();
        let u = testutil::run("ucrypt", &a, Some(PW));
        let err = String::from_utf8_lossy(&u.stderr);
        assert_eq!(u.status.code(), cs.status.code(), "{args:?}: {err}");
        let cs_err = String::from_utf8_lossy(&cs.stderr);
        let first = cs_err
            .lines()
            .map(|l| l.trim_start_matches("cryptsetup: "))
            .find(|l| !l.starts_with("Usage:") && !l.starts_with(' '))
            .unwrap();
        assert!(
            err.contains(first),
            "{args:?}: cryptsetup {first:?}, ucrypt {err}"
        );
        assert!(std::fs::read(&c).unwrap() == orig, "ucrypt {args:?} wrote");
    }
}

/// A fixed-size run stopped mid-way (a crash between two writes) records
/// data segments of fixed sizes only; either tool resumes it without
/// `--device-size` over the whole device (the part past the size is
/// still under the old key), as cryptsetup does.
#[test]
fn a_crashed_fixed_size_run_is_finished_by_either_tool() {
    if !require_tool("reencrypt_device_size_crash", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("redevsize-crash");
    let key = key(&dir);
    let img = dir.join("img");
    let plain = format(&img, None, &key, 20, 40);
    for n in [7, 12] {
        let a = dir.join("a.img");
        std::fs::copy(&img, &a).unwrap();
        let mut args = vec!["reencrypt", "-q"];
        args.extend_from_slice(FAST);
        args.extend([
            "--device-size",
            "6M",
            "--hotzone-size",
            "1M",
            "--resilience",
            "journal",
            s(&a),
        ]);
        let mut with_key = args.clone();
        with_key.extend(["--key-file", s(&key)]);
        let out = std::process::Command::new(testutil::ucrypt_bin())
            .args(&with_key)
            .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
            .output()
            .unwrap();
        assert!(!out.status.success(), "crash point {n} not reached");
        let segs = segments(&a);
        let sizes: Vec<&str> = segs
            .as_object()
            .unwrap()
            .values()
            .filter(|v| v.get("flags").is_none())
            .map(|v| v["size"].as_str().unwrap())
            .collect();
        assert!(!sizes.contains(&"dynamic"), "{n}: {segs}");
        let b = dir.join("b.img");
        std::fs::copy(&a, &b).unwrap();
        if segs.to_string().contains("in-reencryption") {
            ok(
                testutil::run("cryptsetup", &["repair", "-q", s(&a)], Some(PW)),
                "cryptsetup repair",
            );
        }
        let cs = [
            "reencrypt",
            "-q",
            "--resume-only",
            "--force-offline-reencrypt",
            s(&a),
        ];
        ok(
            testutil::run("cryptsetup", &cs, Some(PW)),
            "cryptsetup resume",
        );
        let u = ["reencrypt", "-q", "--resume-only", s(&b)];
        ok(testutil::run("ucrypt", &u, Some(PW)), "ucrypt resume");
        assert_eq!(segments(&a), segments(&b), "{n}");
        for f in [&a, &b] {
            assert!(head(f, None, &key, u64::MAX) == plain, "{n}");
        }
    }
}
