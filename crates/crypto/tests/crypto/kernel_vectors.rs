//! The Linux kernel's own self-test vectors (`crypto/testmgr.h`) for
//! ECB, CBC and XTS over Serpent, Twofish and Camellia, kept as data files
//! in `tests/data/kernel-ciphers/` and run in a loop through every
//! implementation of each (for Serpent its AVX2 and baseline kernels),
//! each vector also repeated over many data units in one call so the wide
//! kernels see whole passes.

use std::path::PathBuf;

use ucrypt_crypto::internal::crypt_unit;
use ucrypt_crypto::Provider;

struct Vector {
    key: Vec<u8>,
    iv: [u8; 16],
    ptext: Vec<u8>,
    ctext: Vec<u8>,
}

fn load(name: &str) -> Vec<Vector> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/kernel-ciphers")
        .join(format!("{name}.txt"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.split("\n\n")
        .filter(|p| p.lines().any(|l| l.starts_with("key = ")))
        .map(|p| {
            let get = |k: &str| {
                p.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} = ")))
                    .map(|v| hex::decode(v.trim()).unwrap())
            };
            let mut iv = [0u8; 16];
            if let Some(v) = get("iv") {
                iv.copy_from_slice(&v);
            }
            Vector {
                key: get("key").unwrap(),
                iv,
                ptext: get("ptext").unwrap(),
                ctext: get("ctext").unwrap(),
            }
        })
        .collect()
}

#[test]
fn kernel_testmgr_vectors() {
    for cipher in ["serpent", "twofish", "camellia"] {
        for chain in ["ecb", "cbc", "xts"] {
            let name = format!("{cipher}-{chain}");
            let vectors = load(&name);
            assert!(!vectors.is_empty(), "{name}: no vectors");
            let spec = match chain {
                "ecb" => name.clone(),
                _ => format!("{name}-plain64"),
            };
            for (i, v) in vectors.iter().enumerate() {
                for imp in [Provider::Auto, Provider::Rust] {
                    let what = format!("{name} vector {i} {imp:?}");
                    let mut buf = v.ptext.clone();
                    let used = crypt_unit(&spec, &v.key, imp, v.iv, &mut buf, true)
                        .unwrap_or_else(|| panic!("{what}: refused"));
                    assert!(used.contains(cipher), "{what}: {used}");
                    assert_eq!(hex::encode(&buf), hex::encode(&v.ctext), "{what}: encrypt");
                    crypt_unit(&spec, &v.key, imp, v.iv, &mut buf, false).unwrap();
                    assert_eq!(buf, v.ptext, "{what}: decrypt");
                    // ECB has no chaining: the vector repeated 40 times in
                    // one call must give the ciphertext repeated.
                    if chain == "ecb" {
                        let mut many = v.ptext.repeat(40);
                        crypt_unit(&spec, &v.key, imp, v.iv, &mut many, true).unwrap();
                        assert!(many == v.ctext.repeat(40), "{what}: x40");
                        crypt_unit(&spec, &v.key, imp, v.iv, &mut many, false).unwrap();
                        assert!(many == v.ptext.repeat(40), "{what}: x40 decrypt");
                    }
                }
            }
        }
    }
}
