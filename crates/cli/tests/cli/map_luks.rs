//! `ucrypt map --luks`: a LUKS volume made by cryptsetup, written and read
//! through ucrypt with no frontend, checked against the independent Python
//! oracle using the volume key `cryptsetup luksDump --dump-volume-key`
//! reveals. Also: a wrong passphrase changes nothing and exits 2.

use std::path::Path;
use std::process::{Command, Stdio};

use testutil::{require_python_module, require_tool, ucrypt_bin, TempDir};

fn contents(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// Formats the file `dev` as LUKS2 with cryptsetup (fast pbkdf2).
fn cryptsetup_luks2(dev: &Path, key: &Path) {
    let st = Command::new("cryptsetup")
        .args(testutil::FAST_LUKS2_FORMAT)
        .arg("--key-file")
        .arg(key)
        .arg(dev)
        .status()
        .unwrap();
    assert!(st.success(), "cryptsetup luksFormat");
}

fn volume_key_hex(dev: &Path, key: &Path) -> String {
    let out = Command::new("cryptsetup")
        .args(["luksDump", "-q", "--dump-volume-key", "--key-file"])
        .arg(key)
        .arg(dev)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "luksDump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // "MK dump:\t8f cc ..." then continuation lines starting with tabs.
    let mut hex = String::new();
    let mut inside = false;
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix("MK dump:")
            .or_else(|| line.strip_prefix("Volume key:"))
        {
            inside = true;
            hex.extend(rest.split_whitespace());
        } else if inside && line.starts_with('\t') {
            hex.extend(line.split_whitespace());
        } else if inside {
            break;
        }
    }
    assert!(!hex.is_empty(), "no key in luksDump output");
    hex
}

fn map_luks_round_trip(luks_type: &str, sector_size: &str, cipher: &str, key_size: &str) {
    let test = "map_luks_round_trip";
    if !require_tool(test, "cryptsetup") || !require_python_module(test, "cryptography") {
        return;
    }
    let dir = TempDir::new("mapluks");
    let dev = dir.join("vol.img");
    let key = dir.join("key");
    let plain = dir.join("plain.bin");
    std::fs::write(&key, b"correct horse").unwrap();
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(24 << 20)
        .unwrap();
    let mut fmt = Command::new("cryptsetup");
    fmt.args([
        "luksFormat",
        "-q",
        "--type",
        luks_type,
        "--cipher",
        cipher,
        "--key-size",
        key_size,
    ]);
    fmt.args([
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
    ])
    .arg(&key);
    if luks_type == "luks2" {
        fmt.args(["--sector-size", sector_size]);
    }
    let st = fmt.arg(&dev).status().unwrap();
    assert!(st.success(), "cryptsetup luksFormat");

    // Payload size and offset from ucrypt's own table for this volume.
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&plain, &data).unwrap();
    let st = Command::new(ucrypt_bin())
        .args(["map", "--write", "--luks"])
        .arg(&dev)
        .arg("--key-file")
        .arg(&key)
        .stdin(std::fs::File::open(&plain).unwrap())
        .status()
        .unwrap();
    assert!(st.success(), "ucrypt map --luks --write");

    let out = Command::new(ucrypt_bin())
        .args(["map", "--read", "--luks"])
        .arg(&dev)
        .arg("--key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ucrypt map --luks --read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        &out.stdout[..data.len()],
        &data[..],
        "read back differs from what was written"
    );

    // Independent check: decrypt the payload with the oracle and cryptsetup's key.
    let dump = Command::new("cryptsetup")
        .args(["luksDump"])
        .arg(&dev)
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout).to_string();
    let offset_bytes: u64 = if luks_type == "luks2" {
        // "offset: 16777216 [bytes]" in the Data segments section.
        dump.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("offset:")
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
            })
            .expect("LUKS2 segment offset")
    } else {
        let sectors: u64 = dump
            .lines()
            .find_map(|l| {
                l.strip_prefix("Payload offset:")
                    .map(|r| r.trim().parse().unwrap())
            })
            .expect("LUKS1 payload offset");
        sectors * 512
    };
    let raw = std::fs::read(&dev).unwrap();
    let cipher_text = &raw[offset_bytes as usize..offset_bytes as usize + data.len()];
    let mut oracle = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/oracle/dmcrypt.py"
        ))
        .args([
            "decrypt",
            "--cipher",
            cipher,
            "--key",
            &volume_key_hex(&dev, &key),
        ])
        .args([
            "--sector-size",
            if luks_type == "luks2" {
                sector_size
            } else {
                "512"
            },
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = oracle.stdin.take().unwrap();
    let ct = cipher_text.to_vec();
    let feeder = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &ct).unwrap());
    let out = oracle.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(out.status.success(), "oracle failed");
    assert_eq!(
        out.stdout, data,
        "oracle decryption of ucrypt's ciphertext differs ({luks_type}, {sector_size}, {cipher})"
    );
}

#[test]
fn luks2_xts_4096_map_matches_oracle() {
    map_luks_round_trip("luks2", "4096", "aes-xts-plain64", "512");
}

#[test]
fn luks1_cbc_essiv_map_matches_oracle() {
    map_luks_round_trip("luks1", "512", "aes-cbc-essiv:sha256", "256");
}

#[test]
fn map_luks_wrong_passphrase_exits_2_and_writes_nothing() {
    let test = "map_luks_wrong_passphrase_exits_2_and_writes_nothing";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let dir = TempDir::new("mapluks-bad");
    let dev = dir.join("vol.img");
    let key = dir.join("key");
    let bad = dir.join("bad");
    std::fs::write(&key, b"right").unwrap();
    std::fs::write(&bad, b"wrong").unwrap();
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    cryptsetup_luks2(&dev, &key);
    let before = contents(&dev);
    let out = Command::new(ucrypt_bin())
        .args(["map", "--write", "--luks"])
        .arg(&dev)
        .arg("--key-file")
        .arg(&bad)
        .stdin(Stdio::from(std::fs::File::open(&key).unwrap()))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        before == contents(&dev),
        "device changed after a wrong passphrase"
    );
}

#[test]
fn map_luks_write_refuses_passphrase_from_the_data_stream() {
    let test = "map_luks_write_refuses_passphrase_from_the_data_stream";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let dir = TempDir::new("mapluks-stdin");
    let dev = dir.join("vol.img");
    let key = dir.join("key");
    std::fs::write(&key, b"right").unwrap();
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    cryptsetup_luks2(&dev, &key);
    let before = contents(&dev);
    // No --key-file and a piped stdin: the first line of the data must not
    // be taken as the passphrase.
    let data = dir.join("data");
    std::fs::write(&data, [b"right\n".as_slice(), &[7u8; 4090]].concat()).unwrap();
    for extra in [&[][..], &["--key-file", "-"][..]] {
        let out = Command::new(ucrypt_bin())
            .args(["map", "--write", "--luks"])
            .arg(&dev)
            .args(extra)
            .stdin(Stdio::from(std::fs::File::open(&data).unwrap()))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("--key-file FILE"));
    }
    assert!(before == contents(&dev), "device changed");
}

/// `map --luks` reads a key-file range as `open` and cryptsetup do: the
/// range cryptsetup accepts unlocks (data written through it reads back
/// through a file holding just the passphrase), a range cryptsetup
/// refuses exits 2 as cryptsetup's, and a range with --table is refused.
#[test]
fn map_luks_takes_keyfile_ranges_like_cryptsetup() {
    let test = "map_luks_takes_keyfile_ranges_like_cryptsetup";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let dir = TempDir::new("mapluks-range");
    let dev = dir.join("vol.img");
    let pass = dir.join("pass");
    let padded = dir.join("padded");
    std::fs::write(&pass, b"right").unwrap();
    std::fs::write(&padded, b"xxxxrightyyyy").unwrap();
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    cryptsetup_luks2(&dev, &pass);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: [(&[&str], i32); 4] = [
        (&["--keyfile-offset", "4", "--keyfile-size", "5"], 0),
        (&["--keyfile-offset", "4", "-l", "5"], 0),
        (&["--keyfile-offset", "3", "-l", "5"], 2),
        (&["--keyfile-size", "5"], 2),
    ];
    let data = testutil::random_bytes(8192, 41);
    let input = dir.join("data");
    std::fs::write(&input, &data).unwrap();
    for (range, want) in cases {
        let cs = Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-file", &s(&padded)])
            .args(range)
            .arg(&dev)
            .output()
            .unwrap();
        assert_eq!(cs.status.code(), Some(want), "cryptsetup {range:?}");
        let before = contents(&dev);
        let out = Command::new(ucrypt_bin())
            .args([
                "map",
                "--write",
                "--luks",
                &s(&dev),
                "--key-file",
                &s(&padded),
            ])
            .args(range)
            .stdin(Stdio::from(std::fs::File::open(&input).unwrap()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(want), "ucrypt {range:?}: {err}");
        if want != 0 {
            assert!(before == contents(&dev), "{range:?}: device changed");
            continue;
        }
        let out = Command::new(ucrypt_bin())
            .args(["map", "--read", "--luks", &s(&dev), "-d", &s(&pass)])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout[..data.len()] == data[..], "{range:?}: data");
    }
    let table = format!("0 8 crypt aes-xts-plain64 - 0 {} 0", s(&dev));
    let out = Command::new(ucrypt_bin())
        .args(["map", "--read", "--table", &table, "-d", &s(&padded)])
        .args(["--keyfile-offset", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("do not apply to --table"), "{err}");
}
