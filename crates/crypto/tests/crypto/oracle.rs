//! Every supported cipher/IV combination against the independent Python
//! oracle (`tests/oracle/dmcrypt.py`, python3 + `cryptography`): sector sizes
//! 512 and 4096, with and without `iv_large_sectors`, a non-zero `iv_offset`
//! and a non-zero start sector, and TrueCrypt's legacy `lrw-benbi` and
//! `cbc-tcw` (aes, camellia, cast5, des3_ede) at sector numbers beyond 2^32;
//! our ciphertext must equal the oracle's, our
//! decryption must invert the oracle's encryption, and the oracle's
//! decryption must invert ours. All conversions go through one
//! `dmcrypt.py batch` process.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ucrypt_crypto as crypto;
use zeroize::Zeroizing;

use crypto::{CryptConfig, Provider, SectorCrypt};

fn oracle() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/dmcrypt.py")
}

struct Case {
    cipher: String,
    key: Vec<u8>,
    sector_size: u32,
    large: bool,
    iv_offset: u64,
    start: u64,
    xts: Provider,
}

/// The real interpreter behind `python3` (skips slow launcher shims).
fn python() -> &'static str {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "python3".to_owned())
    })
}

/// Runs all `jobs` through one `dmcrypt.py batch` process.
fn run_oracle_batch(jobs: &[serde_json::Value]) -> Vec<Result<Vec<u8>, String>> {
    let mut child = Command::new(python())
        .arg(oracle())
        .arg("batch")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input: String = jobs.iter().map(|j| format!("{j}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), jobs.len(), "one oracle answer per job");
    lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            match v["data"].as_str() {
                Some(h) => Ok(hex::decode(h).unwrap()),
                None => Err(v["error"].to_string()),
            }
        })
        .collect()
}

fn job(c: &Case, dir: &str, data: &[u8]) -> serde_json::Value {
    serde_json::json!({
        "direction": dir,
        "cipher": c.cipher,
        "key": if c.key.is_empty() { "-".to_owned() } else { hex::encode(&c.key) },
        "sector_size": c.sector_size,
        "iv_offset": c.iv_offset,
        "iv_large_sectors": c.large,
        "start_sector": c.start,
        "data": hex::encode(data),
    })
}

fn key_bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(73).wrapping_add(seed))
        .collect()
}

fn cases() -> Vec<Case> {
    // (spec, key lengths)
    let specs: Vec<(&str, Vec<usize>)> = vec![
        ("aes-xts-plain64", vec![32, 48, 64]),
        ("aes-xts-plain", vec![64]),
        ("aes-xts-plain64be", vec![64]),
        ("aes-xts-essiv:sha256", vec![64]),
        ("aes-xts-benbi", vec![32]),
        ("aes-xts-null", vec![64]),
        ("aes-xts-eboiv", vec![64]),
        ("capi:xts(aes)-plain64", vec![64]),
        ("aes-cbc-plain", vec![16]),
        ("aes-cbc-plain64", vec![16, 24, 32]),
        ("aes-cbc-plain64be", vec![32]),
        ("aes-cbc-essiv:sha256", vec![16, 32]),
        ("aes-cbc-essiv:md5", vec![24]),
        ("capi:cbc(aes)-essiv:sha256", vec![32]),
        ("aes-cbc-benbi", vec![32]),
        ("aes-cbc-null", vec![16]),
        ("aes-cbc-eboiv", vec![32]),
        ("aes", vec![16]),
        ("aes-ecb", vec![16, 24, 32]),
        ("capi:ecb(aes)", vec![32]),
        ("aes:2-cbc-essiv:sha256", vec![64]),
        ("aes:4-xts-plain64", vec![256]),
        ("aes:2-cbc-eboiv", vec![32]),
        ("cipher_null-ecb", vec![0]),
        ("capi:ecb(cipher_null)", vec![0]),
    ];
    let mut v = Vec::new();
    for (spec, lens) in specs {
        for len in lens {
            for (ss, large) in [(512u32, false), (512, true), (4096, false), (4096, true)] {
                let step = u64::from(ss / 512);
                v.push(Case {
                    cipher: spec.into(),
                    key: key_bytes(len, len as u8 ^ ss as u8),
                    sector_size: ss,
                    large,
                    iv_offset: 3 * step + if large { 0 } else { 8 * step },
                    start: 5 * step,
                    xts: Provider::Auto,
                });
            }
        }
    }
    // XTS keys with equal halves: OpenSSL refuses them, dm-crypt accepts them.
    for ss in [512u32, 4096] {
        let mut key = key_bytes(32, 9);
        key.extend_from_within(..);
        v.push(Case {
            cipher: "aes-xts-plain64".into(),
            key,
            sector_size: ss,
            large: false,
            iv_offset: 8,
            start: 16,
            xts: Provider::OpenSsl,
        });
    }
    // TrueCrypt's legacy modes (dm-crypt's tcw takes 512-byte sectors only),
    // at sector numbers from 0 to beyond 2^32 (the IVs, the LRW tweak and the
    // tcw whitening all take the 64-bit sector number).
    for (spec, len) in [
        ("aes-lrw-benbi", 32),
        ("aes-lrw-benbi", 48),
        ("aes-lrw-benbi", 40),
        ("camellia-lrw-benbi", 48),
        ("aes-cbc-tcw", 48),
        ("aes-cbc-tcw", 64),
        ("cast5-cbc-tcw", 40),
        ("des3_ede-cbc-tcw", 48),
    ] {
        for (iv_offset, start) in [
            (0, 0),
            (0, 13),
            (256, (1 << 32) + 3),
            ((1 << 33) + 5, 9),
            // LRW's 128-bit block index carries out of its low 64 bits
            // within sector 2^59 - 1.
            (0, (1 << 59) - 2),
        ] {
            v.push(Case {
                cipher: spec.into(),
                key: key_bytes(len, start as u8 ^ len as u8),
                sector_size: 512,
                large: false,
                iv_offset,
                start,
                xts: Provider::Auto,
            });
        }
    }
    // The pure-Rust modes on ordinary keys too.
    for ss in [512u32, 4096] {
        for (spec, len) in [
            ("aes-xts-plain64", 64),
            ("aes-xts-essiv:sha256", 32),
            ("aes-cbc-essiv:sha256", 32),
            ("aes-cbc-eboiv", 16),
            ("aes-ecb", 24),
        ] {
            v.push(Case {
                cipher: spec.into(),
                key: key_bytes(len, 1),
                sector_size: ss,
                large: true,
                iv_offset: 64,
                start: 8,
                xts: Provider::Rust,
            });
        }
    }
    v
}

#[test]
fn every_combination_matches_the_python_oracle() {
    let test = "every_combination_matches_the_python_oracle";
    if !testutil::require_tool(test, "python3")
        || !testutil::require_python_module(test, "cryptography")
    {
        return;
    }
    let cases = cases();
    // Our side first: plaintext, our ciphertext.
    let ours: Vec<(Vec<u8>, Vec<u8>, SectorCrypt)> = cases.iter().map(ours).collect();
    // Then one oracle process: its encryption of each plaintext and its
    // decryption of each of our ciphertexts.
    let mut jobs = Vec::new();
    for (c, (plain, enc, _)) in cases.iter().zip(&ours) {
        jobs.push(job(c, "encrypt", plain));
        jobs.push(job(c, "decrypt", enc));
    }
    let answers = run_oracle_batch(&jobs);
    let mut failures = Vec::new();
    for (i, (c, (plain, enc, sc))) in cases.iter().zip(&ours).enumerate() {
        let what = format!(
            "{} key {}b ss {} large {} iv_offset {} start {} via {}",
            c.cipher,
            c.key.len() * 8,
            c.sector_size,
            c.large,
            c.iv_offset,
            c.start,
            sc.implementation()
        );
        let (their_enc, their_dec) = (&answers[2 * i], &answers[2 * i + 1]);
        match their_enc {
            Ok(t) if t == enc => {
                let mut back = t.clone();
                sc.decrypt(c.start, &mut back);
                if &back != plain {
                    failures.push(format!(
                        "{what}: our decryption of the oracle's ciphertext differs"
                    ));
                }
            }
            Ok(_) => failures.push(format!("{what}: ciphertext differs from the oracle")),
            Err(e) => failures.push(format!("{what}: oracle error {e}")),
        }
        match their_dec {
            Ok(t) if t == plain => {}
            Ok(_) => failures.push(format!(
                "{what}: the oracle's decryption of our ciphertext differs"
            )),
            Err(e) => failures.push(format!("{what}: oracle error {e}")),
        }
        if !sc.is_null() && enc == plain {
            failures.push(format!("{what}: encryption changed nothing"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn ours(c: &Case) -> (Vec<u8>, Vec<u8>, SectorCrypt) {
    let cfg = CryptConfig {
        cipher: c.cipher.clone(),
        key: Zeroizing::new(c.key.clone()),
        iv_offset: c.iv_offset,
        sector_size: c.sector_size,
        iv_large_sectors: c.large,
    };
    let sc =
        SectorCrypt::with_provider(&cfg, c.xts).unwrap_or_else(|e| panic!("{}: {e}", c.cipher));
    let sectors = if c.sector_size == 512 { 6 } else { 3 };
    let plain: Vec<u8> = (0..c.sector_size as usize * sectors)
        .map(|i| (i * 31 + i / 512) as u8)
        .collect();
    let mut enc = plain.clone();
    sc.encrypt(c.start, &mut enc);
    // The out-of-place calls the ramdisk's fused path uses must give the
    // same bytes (which the caller then checks against the oracle).
    let mut out = vec![0u8; plain.len()];
    sc.encrypt_to(c.start, &plain, &mut out);
    assert!(out == enc, "{}: encrypt_to differs from encrypt", c.cipher);
    sc.decrypt_to(c.start, &enc, &mut out);
    assert!(out == plain, "{}: decrypt_to does not invert", c.cipher);
    let mut appended = Vec::new();
    sc.decrypt_append(c.start, &enc, &mut appended);
    assert!(
        appended == plain,
        "{}: decrypt_append does not invert",
        c.cipher
    );
    (plain, enc, sc)
}
