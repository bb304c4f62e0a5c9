//! Every supported cipher/IV combination against the independent Python
//! oracle (`tests/oracle/dmcrypt.py`, python3 + `cryptography`): sector sizes
//! 512 and 4096, with and without `iv_large_sectors`, a non-zero `iv_offset`
//! and a non-zero start sector; our ciphertext must equal the oracle's, our
//! decryption must invert the oracle's encryption, and the oracle's
//! decryption must invert ours.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ucrypt_crypto as crypto;
use zeroize::Zeroizing;

use crypto::{CryptConfig, SectorCrypt, Provider};

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

fn run_oracle(c: &Case, dir: &str, input: &[u8]) -> Vec<u8> {
    let key = if c.key.is_empty() { "-".to_owned() } else { hex::encode(&c.key) };
    let mut cmd = Command::new(python());
    cmd.arg(oracle())
        .arg(dir)
        .args(["--cipher", &c.cipher, "--key", &key])
        .args(["--sector-size", &c.sector_size.to_string()])
        .args(["--iv-offset", &c.iv_offset.to_string()])
        .args(["--start-sector", &c.start.to_string()]);
    if c.large {
        cmd.arg("--iv-large-sectors");
    }
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "oracle failed for {}: {}", c.cipher, String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn key_bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(73).wrapping_add(seed)).collect()
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
        v.push(Case { cipher: "aes-xts-plain64".into(), key, sector_size: ss, large: false, iv_offset: 8, start: 16, xts: Provider::OpenSsl });
    }
    // The pure-Rust modes on ordinary keys too.
    for ss in [512u32, 4096] {
        for (spec, len) in [("aes-xts-plain64", 64), ("aes-xts-essiv:sha256", 32), ("aes-cbc-essiv:sha256", 32), ("aes-cbc-eboiv", 16), ("aes-ecb", 24)] {
            v.push(Case { cipher: spec.into(), key: key_bytes(len, 1), sector_size: ss, large: true, iv_offset: 64, start: 8, xts: Provider::Rust });
        }
    }
    v
}

#[test]
fn every_combination_matches_the_python_oracle() {
    if !testutil::require_tool("every_combination_matches_the_python_oracle", "python3")
        || !testutil::require_python_module("every_combination_matches_the_python_oracle", "cryptography")
    {
        return;
    }
    let cases = cases();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                if let Err(e) = std::panic::catch_unwind(|| check(c)) {
                    let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                    failures.lock().unwrap().push(format!(
                        "{} key {}b ss {} large {} iv_offset {}: {msg}",
                        c.cipher,
                        c.key.len() * 8,
                        c.sector_size,
                        c.large,
                        c.iv_offset
                    ));
                }
            });
        }
    });
    let f = failures.into_inner().unwrap();
    assert!(f.is_empty(), "{} of {} cases failed:\n{}", f.len(), cases.len(), f.join("\n"));
}

fn check(c: &Case) {
    let cfg = CryptConfig {
        cipher: c.cipher.clone(),
        key: Zeroizing::new(c.key.clone()),
        iv_offset: c.iv_offset,
        sector_size: c.sector_size,
        iv_large_sectors: c.large,
    };
    let sc = SectorCrypt::with_provider(&cfg, c.xts).unwrap();
    let sectors = if c.sector_size == 512 { 6 } else { 3 };
    let plain: Vec<u8> = (0..c.sector_size as usize * sectors).map(|i| (i * 31 + i / 512) as u8).collect();
    let mut ours = plain.clone();
    sc.encrypt(c.start, &mut ours);
    let theirs = run_oracle(c, "encrypt", &plain);
    assert!(ours == theirs, "ciphertext differs from the oracle ({})", sc.implementation());
    if !sc.is_null() {
        assert_ne!(ours, plain, "encryption changed nothing");
    }
    let mut back = theirs;
    sc.decrypt(c.start, &mut back);
    assert!(back == plain, "our decryption of the oracle's ciphertext differs");
    // The oracle's own decryption: on half of the cases, to keep the suite fast.
    if c.large || c.xts != Provider::Auto {
        let back2 = run_oracle(c, "decrypt", &ours);
        assert!(back2 == plain, "the oracle's decryption of our ciphertext differs");
    }
}
