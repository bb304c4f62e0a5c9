//! `reencrypt::init_encrypt` without external tools: the state an
//! encryption starts with (detached header; data shift), a whole run to
//! the end, and the reencryption-state loader fed truncated, random and
//! mutated headers of an encryption with a data shift without a panic
//! (the `reencrypt_state` fuzz target's property on stable Rust).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde_json::Value;
use testutil::{Rng, TempDir};
use ucrypt_luks as luks;

use luks::kdf::KdfRequest;
use luks::reencrypt::{self, EncryptRequest, Mode, Resilience};

const PASS: &[u8] = b"encrypt passphrase";

fn request(header: Option<&Path>, reduce: Option<u64>) -> EncryptRequest {
    EncryptRequest {
        cipher: None,
        key_bits: None,
        sector_size: None,
        resilience: None,
        resilience_hash: None,
        hash: luks::Hash::Sha256,
        kdf: KdfRequest {
            kind: "pbkdf2".into(),
            force_iterations: Some(1000),
            ..Default::default()
        },
        key_slot: None,
        uuid: None,
        header: header.map(Path::to_path_buf),
        reduce,
        access: luks::DeviceAccess::default(),
        offset: None,
        volume_key_file: None,
    }
}

fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut b = vec![0u8; len];
    Rng::new(seed).fill(&mut b);
    std::fs::write(path, &b).unwrap();
    b
}

fn finish(dev: &Path, header: Option<&Path>) {
    let opts = reencrypt::RunOptions {
        hotzone: 0,
        header: header.map(Path::to_path_buf),
        device_size: None,
        access: luks::DeviceAccess::default(),
    };
    let out = reencrypt::run(
        dev,
        PASS,
        None,
        &opts,
        &AtomicBool::new(false),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(out, reencrypt::Outcome::Finished);
    assert!(
        reencrypt::status(header.unwrap_or(dev), &luks::DeviceAccess::default())
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_detached_encryption_starts_forward_from_plaintext_and_finishes() {
    let dir = TempDir::new("luks-enc");
    let (dev, hdr) = (dir.path().join("dev"), dir.path().join("hdr"));
    let plain = random_file(&dev, 2 << 20, 1);
    let st = reencrypt::init_encrypt(&dev, PASS, &request(Some(&hdr), None)).unwrap();
    assert_eq!(st.mode, Mode::Encrypt);
    assert!(!st.backward);
    assert!(matches!(st.resilience, Resilience::Checksum { .. }));
    assert_eq!(st.old.kind, "linear");
    assert_eq!((st.new.kind.as_str(), st.new.offset), ("crypt", 0));
    assert_eq!(std::fs::read(&dev).unwrap(), plain, "init writes no data");
    // A second init is refused: the header records an encryption.
    let e = reencrypt::init_encrypt(&dev, PASS, &request(Some(&hdr), None)).unwrap_err();
    assert!(
        e.to_string().contains("already in LUKS reencryption"),
        "{e}"
    );
    finish(&dev, Some(&hdr));
    assert_ne!(std::fs::read(&dev).unwrap(), plain, "encrypted");
}

#[test]
fn a_data_shift_moves_the_first_bytes_to_the_end_and_finishes() {
    let dir = TempDir::new("luks-enc-shift");
    let dev = dir.path().join("dev");
    let plain = random_file(&dev, 12 << 20, 2);
    let st = reencrypt::init_encrypt(&dev, PASS, &request(None, Some(4 << 20))).unwrap();
    let shift = 2 << 20;
    assert_eq!(st.mode, Mode::Encrypt);
    assert!(st.backward);
    assert_eq!(st.resilience, Resilience::Datashift { shift });
    assert_eq!(st.new.offset, shift);
    assert_eq!(st.old.fixed_size().unwrap(), Some(8 << 20));
    let moved = st.moved.as_ref().unwrap();
    assert_eq!(moved.offset, (12 << 20) - shift);
    let now = std::fs::read(&dev).unwrap();
    assert_eq!(
        now[(12 << 20) - shift as usize..],
        plain[..shift as usize],
        "the first bytes wait at the end"
    );
    assert_eq!(now[shift as usize..8 << 20], plain[shift as usize..8 << 20]);
    finish(&dev, None);
}

/// The header image of an encryption with a data shift (both copies and
/// the keyslots area: the first 2 MiB of the device).
fn shift_header() -> Vec<u8> {
    let dir = TempDir::new("luks-enc-fuzz");
    let dev = dir.path().join("dev");
    random_file(&dev, 12 << 20, 3);
    reencrypt::init_encrypt(&dev, PASS, &request(None, Some(4 << 20))).unwrap();
    let mut b = std::fs::read(&dev).unwrap();
    b.truncate(2 << 20);
    b
}

/// Writes `json` into both copies of the header image and re-seals them.
fn with_json(img: &[u8], json: &Value) -> Vec<u8> {
    let mut out = img.to_vec();
    let hdr = u64::from_be_bytes(img[8..16].try_into().unwrap()) as usize;
    let text = serde_json::to_vec(json).unwrap();
    for off in [0, hdr] {
        if text.len() > hdr - 4096 {
            return out;
        }
        out[off + 4096..off + hdr].fill(0);
        out[off + 4096..off + 4096 + text.len()].copy_from_slice(&text);
        luks::luks2::binary::seal(&mut out[off..off + hdr]);
    }
    out
}

fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            path.push(k.clone());
            out.push(path.clone());
            leaves(x, path, out);
            path.pop();
        }
    }
}

#[test]
fn the_state_loader_never_panics_on_a_mangled_data_shift_header() {
    let img = shift_header();
    luks::internal::fuzzing::reencrypt_state(&img);
    let hdr = u64::from_be_bytes(img[8..16].try_into().unwrap()) as usize;
    let end = img[4096..hdr].iter().position(|&b| b == 0).unwrap() + 4096;
    let json: Value = serde_json::from_slice(&img[4096..end]).unwrap();
    // Truncated images and random bytes.
    let mut rng = Rng::new(7);
    for cut in [0, 1, 512, 4095, 4096, 8000, hdr, hdr + 100, 2 * hdr, 65536] {
        luks::internal::fuzzing::reencrypt_state(&img[..cut.min(img.len())]);
    }
    let mut junk = vec![0u8; 64 << 10];
    for _ in 0..20 {
        rng.fill(&mut junk);
        luks::internal::fuzzing::reencrypt_state(&junk);
    }
    // Every field of the segments and keyslots replaced by odd values or
    // removed, one at a time.
    let mut paths = Vec::new();
    for top in ["segments", "keyslots", "digests", "config"] {
        let mut p = vec![top.to_string()];
        leaves(&json[top], &mut p, &mut paths);
    }
    let odd: [Option<Value>; 9] = [
        None,
        Some(Value::from("0")),
        Some(Value::from("dynamic")),
        Some(Value::from("18446744073709551615")),
        Some(Value::from("4096")),
        Some(Value::from(4096)),
        Some(Value::from("linear")),
        Some(Value::from(vec!["backup-moved-segment"])),
        Some(Value::Null),
    ];
    for path in &paths {
        for o in &odd {
            let mut j = json.clone();
            let (last, parents) = path.split_last().unwrap();
            let mut at = &mut j;
            for k in parents {
                at = at.get_mut(k).unwrap();
            }
            let obj = at.as_object_mut().unwrap();
            match o {
                None => {
                    obj.remove(last);
                }
                Some(v) => {
                    obj.insert(last.clone(), v.clone());
                }
            }
            luks::internal::fuzzing::reencrypt_state(&with_json(&img, &j));
        }
    }
}
