//! IEEE Std 1619-2007 Annex B XTS-AES known answers, kept as data files in
//! `tests/data/xts/` and run in a loop through every XTS implementation and,
//! for 512-byte data units, through `SectorCrypt` as `aes-xts-plain64`.

use std::path::PathBuf;

use ucrypt_crypto as crypto;

use crypto::internal::{xts_decrypt, xts_encrypt};
use crypto::{CryptConfig, Provider, SectorCrypt};
use zeroize::Zeroizing;

struct Vector {
    name: String,
    key: Vec<u8>,
    dusn: u128,
    plaintext: Vec<u8>,
    ciphertext: Vec<u8>,
}

fn load() -> Vec<Vector> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/xts");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let get = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} = ")))
                    .unwrap_or_else(|| panic!("{}: no {k}", p.display()))
                    .trim()
                    .to_owned()
            };
            let dusn = get("dusn");
            Vector {
                name: p.file_name().unwrap().to_string_lossy().into_owned(),
                key: hex::decode(get("key")).unwrap(),
                dusn: u128::from_str_radix(dusn.trim_start_matches("0x"), 16).unwrap(),
                plaintext: hex::decode(get("plaintext")).unwrap(),
                ciphertext: hex::decode(get("ciphertext")).unwrap(),
            }
        })
        .collect()
}

#[test]
fn ieee_1619_vectors_all_implementations() {
    let vectors = load();
    assert!(
        vectors.len() >= 6,
        "expected the IEEE vectors in tests/data/xts"
    );
    for v in &vectors {
        for imp in [
            Provider::Rust,
            Provider::OpenSsl,
            Provider::AesNi,
            Provider::Vaes,
            Provider::Auto,
        ] {
            let mut buf = v.plaintext.clone();
            let used = xts_encrypt(&v.key, imp, v.dusn.to_le_bytes(), &mut buf).unwrap();
            assert_eq!(
                hex::encode(&buf),
                hex::encode(&v.ciphertext),
                "{} encrypt via {used}",
                v.name
            );
            xts_decrypt(&v.key, imp, v.dusn.to_le_bytes(), &mut buf).unwrap();
            assert_eq!(buf, v.plaintext, "{} decrypt via {used}", v.name);
        }
    }
}

#[test]
fn ieee_1619_sector_vectors_through_sector_crypt() {
    let mut n = 0;
    for v in load().iter().filter(|v| v.plaintext.len() == 512) {
        for imp in [
            Provider::Rust,
            Provider::OpenSsl,
            Provider::AesNi,
            Provider::Vaes,
        ] {
            // plain64 IV = little-endian (sector + iv_offset): put the DUSN in iv_offset.
            let cfg = CryptConfig {
                cipher: "aes-xts-plain64".into(),
                key: Zeroizing::new(v.key.clone()),
                iv_offset: v.dusn as u64,
                sector_size: 512,
                iv_large_sectors: false,
            };
            let c = SectorCrypt::with_provider(&cfg, imp).unwrap();
            let mut buf = v.plaintext.clone();
            c.encrypt(0, &mut buf);
            assert_eq!(buf, v.ciphertext, "{} via {}", v.name, c.implementation());
            c.decrypt(0, &mut buf);
            assert_eq!(buf, v.plaintext);
        }
        n += 1;
    }
    assert!(n >= 3);
}

#[test]
fn equal_halves_vector_uses_the_rust_fallback() {
    let v = load()
        .into_iter()
        .find(|v| v.name.contains("vector-01"))
        .unwrap();
    assert_eq!(v.key[..16], v.key[16..], "vector 1 has equal key halves");
    let mut buf = v.plaintext.clone();
    let used = xts_encrypt(&v.key, Provider::OpenSsl, [0; 16], &mut buf).unwrap();
    assert_eq!(used, crypto::RUST_XTS_NAME);
    assert_eq!(buf, v.ciphertext);
}
