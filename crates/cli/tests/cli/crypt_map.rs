//! `ucrypt map` end to end: round trips through a file "device", the
//! ciphertext on disk checked against the Python oracle, and every refusal
//! (device too small, ragged input, input longer than the mapping, bad key)
//! exiting non-zero without touching the device.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::{ucrypt_bin, TempDir};

const KEY: &str = "4a8e1c2b3d5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff0\
                   102132435465768798a9bacbdcedfe0f1e2d3c4b5a69788796a5b4c3d2e1f001";

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + i / 4096) as u8).collect()
}

fn table(dev: &Path, len_sectors: u64, offset: u64, extra: &str) -> String {
    format!(
        "0 {len_sectors} crypt aes-xts-plain64 {KEY} 0 {} {offset}{extra}",
        dev.display()
    )
}

fn run(args: &[&str], stdin: Option<&Path>, piped: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(ucrypt_bin());
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    match (stdin, piped) {
        (Some(p), _) => {
            cmd.stdin(std::fs::File::open(p).unwrap());
            cmd.output().unwrap()
        }
        (None, Some(data)) => {
            cmd.stdin(Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            let mut w = child.stdin.take().unwrap();
            let data = data.to_vec();
            let t = std::thread::spawn(move || {
                let _ = w.write_all(&data);
            });
            let out = child.wait_with_output().unwrap();
            t.join().unwrap();
            out
        }
        (None, None) => {
            cmd.stdin(Stdio::null());
            cmd.output().unwrap()
        }
    }
}

fn device(dir: &TempDir, len: usize) -> PathBuf {
    let p = dir.join("dev.img");
    std::fs::write(&p, vec![0xEEu8; len]).unwrap();
    p
}

#[test]
fn map_write_then_read_round_trips() {
    let dir = TempDir::new("crypt-map-rt");
    let dev = device(&dir, 2 << 20);
    let plain = pattern(1 << 20);
    let plain_path = dir.join("plain.img");
    std::fs::write(&plain_path, &plain).unwrap();
    let t = table(&dev, 2048, 16, "");

    let out = run(&["map", "--table", &t, "--write"], Some(&plain_path), None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let disk = std::fs::read(&dev).unwrap();
    assert!(
        disk[..16 * 512].iter().all(|&b| b == 0xEE),
        "bytes before the offset untouched"
    );
    assert_ne!(
        &disk[16 * 512..16 * 512 + plain.len()],
        &plain[..],
        "data is encrypted on disk"
    );
    assert!(
        disk[16 * 512 + plain.len()..].iter().all(|&b| b == 0xEE),
        "bytes after the input untouched"
    );

    let out = run(&["map", "--table", &t, "--read"], None, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.stdout.len(),
        2048 * 512,
        "read covers exactly the table length"
    );
    assert_eq!(&out.stdout[..plain.len()], &plain[..]);

    // The same through a pipe (the input is spooled, then written).
    let plain2: Vec<u8> = plain.iter().map(|b| b ^ 0x5A).collect();
    let out = run(&["map", "--table", &t, "--write"], None, Some(&plain2));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["map", "--table", &t, "--read"], None, None);
    assert_eq!(&out.stdout[..plain2.len()], &plain2[..]);
}

#[test]
fn map_ciphertext_matches_the_oracle() {
    let test = "map_ciphertext_matches_the_oracle";
    if !testutil::require_tool(test, "python3")
        || !testutil::require_python_module(test, "cryptography")
    {
        return;
    }
    let dir = TempDir::new("crypt-map-oracle");
    let dev = device(&dir, 1 << 20);
    let plain = pattern(64 << 10);
    let plain_path = dir.join("plain.img");
    std::fs::write(&plain_path, &plain).unwrap();
    let t = format!(
        "0 1024 crypt aes-cbc-essiv:sha256 {} 64 {} 8 2 sector_size:4096 iv_large_sectors",
        &KEY[..64],
        dev.display()
    );
    let out = run(&["map", "--table", &t, "--write"], Some(&plain_path), None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let disk = std::fs::read(&dev).unwrap();
    let oracle = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/dmcrypt.py");
    let mut child = Command::new("python3")
        .arg(oracle)
        .args([
            "encrypt",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key",
            &KEY[..64],
        ])
        .args([
            "--sector-size",
            "4096",
            "--iv-offset",
            "64",
            "--iv-large-sectors",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&plain).unwrap();
    let expect = child.wait_with_output().unwrap();
    assert!(expect.status.success());
    assert!(
        disk[8 * 512..8 * 512 + plain.len()] == expect.stdout[..],
        "on-disk ciphertext differs from the oracle"
    );
}

/// Runs a failing map and checks: non-zero exit, a clear message, device unchanged.
fn refused(dir: &TempDir, dev: &Path, t: &str, input: &[u8], code: i32, needle: &str) {
    let before = std::fs::read(dev).unwrap();
    let p = dir.join("in.img");
    std::fs::write(&p, input).unwrap();
    for out in [
        run(&["map", "--table", t, "--write"], Some(&p), None),
        run(&["map", "--table", t, "--write"], None, Some(input)),
    ] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(err.contains(needle), "expected {needle:?} in {err:?}");
        assert!(!err.contains(KEY), "the key must never be printed");
        assert_eq!(
            std::fs::read(dev).unwrap(),
            before,
            "device modified by a refused write"
        );
    }
}

#[test]
fn map_refusals_write_nothing() {
    let dir = TempDir::new("crypt-map-err");
    let dev = device(&dir, 512 << 10);
    // Device too small: offset 8 + 1024 sectors > 1024 sectors on disk.
    refused(
        &dir,
        &dev,
        &table(&dev, 1024, 8, ""),
        &pattern(4096),
        4,
        "too small",
    );
    // Input not a whole number of 4096-byte sectors.
    refused(
        &dir,
        &dev,
        &table(&dev, 512, 0, " 1 sector_size:4096"),
        &pattern(4096 + 512),
        1,
        "not a multiple",
    );
    // Input longer than the mapping.
    refused(
        &dir,
        &dev,
        &table(&dev, 8, 0, ""),
        &pattern(8192),
        1,
        "exceeds the mapping",
    );
    // Key of the wrong length for the cipher.
    let bad = format!(
        "0 8 crypt aes-xts-plain64 {} 0 {} 0",
        &KEY[..40],
        dev.display()
    );
    refused(
        &dir,
        &dev,
        &bad,
        &pattern(4096),
        1,
        "Error decoding and setting key",
    );
    // Unknown option names the option.
    refused(
        &dir,
        &dev,
        &table(&dev, 8, 0, " 1 turbo"),
        &pattern(4096),
        1,
        "turbo",
    );

    // Read: device too small is refused too, with nothing on stdout.
    let out = run(
        &["map", "--table", &table(&dev, 1024, 8, ""), "--read"],
        None,
        None,
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(out.stdout.is_empty());
    // Missing device.
    let out = run(
        &[
            "map",
            "--table",
            &table(&dir.join("nope"), 8, 0, ""),
            "--read",
        ],
        None,
        None,
    );
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Cannot open device"));
}

#[test]
fn map_cipher_null_is_a_copy() {
    let dir = TempDir::new("crypt-map-null");
    let dev = device(&dir, 64 << 10);
    let plain = pattern(32 << 10);
    let p = dir.join("p.img");
    std::fs::write(&p, &plain).unwrap();
    let t = format!(
        "0 64 crypt capi:ecb(cipher_null) - 0 {} 0 1 force_inline",
        dev.display()
    );
    let out = run(&["map", "--table", &t, "--write"], Some(&p), None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&std::fs::read(&dev).unwrap()[..plain.len()], &plain[..]);
}
