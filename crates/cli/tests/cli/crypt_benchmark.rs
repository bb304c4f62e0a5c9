//! `ucrypt benchmark`: the cryptsetup-style table and `--json` output.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use testutil::ucrypt_bin;

/// `ucrypt benchmark ARGS`'s standard output (the command must succeed).
/// Each argument list runs once per test binary and its output is shared:
/// a full benchmark (every KDF and cipher row) takes many seconds, and
/// several tests check the layout of the same run.
pub(crate) fn benchmark(args: &[&str]) -> String {
    type Runs = BTreeMap<Vec<String>, Arc<OnceLock<String>>>;
    static RUNS: Mutex<Runs> = Mutex::new(BTreeMap::new());
    let key = args.iter().map(|a| a.to_string()).collect();
    let run = RUNS.lock().unwrap().entry(key).or_default().clone();
    run.get_or_init(|| {
        let o = Command::new(ucrypt_bin())
            .arg("benchmark")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    })
    .clone()
}

#[test]
fn benchmark_json_parses() {
    let out = Command::new(ucrypt_bin())
        .args([
            "benchmark",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
            "--json",
            "--no-openssl",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let c = &v["ciphers"][0];
    assert_eq!(c["algorithm"], "aes-xts");
    assert_eq!(c["key_bits"], 256);
    assert!(c["encryption_mib_per_sec"].as_f64().unwrap() > 0.0);
    assert!(c["decryption_mib_per_sec"].as_f64().unwrap() > 0.0);
    assert!(!c["implementation"].as_str().unwrap().is_empty());
    assert!(
        v["pbkdf"].as_array().unwrap().is_empty(),
        "--cipher skips the KDF lines like cryptsetup"
    );
}

#[test]
fn benchmark_default_table_layout() {
    let text = benchmark(&["--no-openssl"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "# Tests are approximate using memory only (no storage IO)."
    );
    for kdf in [
        "PBKDF2-sha1 ",
        "PBKDF2-sha256 ",
        "PBKDF2-sha512 ",
        "argon2i ",
        "argon2id ",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(kdf)),
            "missing {kdf}: {text}"
        );
    }
    let h = lines
        .iter()
        .position(|l| *l == "#     Algorithm |       Key |      Encryption |      Decryption")
        .expect(&text);
    let rows: Vec<(&str, &str)> = lines[h + 1..]
        .iter()
        .take_while(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 6, "{l}");
            assert!(
                f[2].parse::<f64>().unwrap() > 0.0 && f[4].parse::<f64>().unwrap() > 0.0,
                "{l}"
            );
            if !f[0].starts_with("cipher_null") {
                // cipher_null is a no-op: its figure can outgrow the column.
                assert_eq!(l.len(), 63, "cryptsetup's column widths: {l:?}");
            }
            (f[0], f[1])
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("aes-cbc", "128b"),
            ("serpent-cbc", "128b"),
            ("twofish-cbc", "128b"),
            ("aes-cbc", "256b"),
            ("serpent-cbc", "256b"),
            ("twofish-cbc", "256b"),
            ("aes-xts", "256b"),
            ("serpent-xts", "256b"),
            ("twofish-xts", "256b"),
            ("aes-xts", "512b"),
            ("serpent-xts", "512b"),
            ("twofish-xts", "512b"),
            ("cipher_null-ecb", "0b")
        ]
    );
}

#[test]
fn benchmark_rejects_bad_cipher() {
    let out = Command::new(ucrypt_bin())
        .args(["benchmark", "--cipher", "aes-xts", "--key-size", "100"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("key"));
}
