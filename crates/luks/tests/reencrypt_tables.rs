//! `ucrypt_luks::reencrypt::tables` on a volume cryptsetup 2.6.1 left mid-way
//! (its SIGINT delivered under gdb after two hotzones, so it stops
//! between hotzones as on Ctrl-C): decrypting each segment's range with
//! its own table gives back the plaintext written before, with the old
//! key (from `luksDump --dump-volume-key` beforehand) — and the header
//! verbs still refuse the volume while it is in reencryption.

use std::path::Path;
use std::process::Command;

use testutil::{require_tool, Rng, TempDir};

fn volume_key(img: &Path, key: &Path) -> Vec<u8> {
    let out = Command::new("cryptsetup")
        .args([
            "luksDump",
            "--dump-volume-key",
            "--batch-mode",
            "--key-file",
        ])
        .arg(key)
        .arg(img)
        .output()
        .unwrap();
    testutil::volume_key_from_dump(&String::from_utf8(out.stdout).unwrap())
}

#[test]
fn tables_of_a_volume_cryptsetup_left_mid_way_decrypt_to_the_plaintext() {
    if !require_tool("reencrypt_tables", "cryptsetup") || !require_tool("reencrypt_tables", "gdb") {
        return;
    }
    let dir = TempDir::new("reenc-tables");
    let img = dir.path().join("img");
    let key = dir.path().join("key");
    std::fs::write(&key, b"tables passphrase").unwrap();
    const DATA: usize = 32 << 20;
    std::fs::File::create(&img)
        .unwrap()
        .set_len((16 << 20) + DATA as u64)
        .unwrap();
    let st = Command::new("cryptsetup")
        .args(testutil::FAST_LUKS2_FORMAT)
        .arg("--key-file")
        .arg(&key)
        .arg(&img)
        .status()
        .unwrap();
    assert!(st.success());
    let old = volume_key(&img, &key);
    let mut plain = vec![0u8; DATA];
    Rng::new(77).fill(&mut plain);
    let mut ct = plain.clone();
    crypto::SectorCrypt::new(&crypto::CryptConfig {
        cipher: "aes-xts-plain64".into(),
        key: zeroize::Zeroizing::new(old),
        iv_offset: 0,
        sector_size: 4096,
        iv_large_sectors: false,
    })
    .unwrap()
    .encrypt(0, &mut ct);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&ct, 16 << 20).unwrap();
    }
    // Two hotzones (each ends with an fdatasync), then SIGINT.
    let out = Command::new("gdb")
        .args([
            "-q",
            "-batch",
            "-ex",
            "set breakpoint pending on",
            "-ex",
            "break fdatasync",
        ])
        .args([
            "-ex",
            "run",
            "-ex",
            "continue",
            "-ex",
            "delete",
            "-ex",
            "signal SIGINT",
        ])
        .args([
            "--args",
            "cryptsetup",
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
        ])
        .args(["--hotzone-size", "4M", "--key-file"])
        .arg(&key)
        .arg(&img)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("Reencryption interrupted"), "{text}");

    // The ordinary loader still refuses the volume, with its reason.
    let e =
        ucrypt_luks::Volume::load(&img, None, &ucrypt_luks::DeviceAccess::default()).unwrap_err();
    assert!(e.to_string().contains("reencryption is in progress"), "{e}");

    let pass = std::fs::read(&key).unwrap();
    let st = ucrypt_luks::reencrypt::status(&img, &ucrypt_luks::DeviceAccess::default())
        .unwrap()
        .unwrap();
    assert!(st.hotzone().is_none());
    assert!(
        st.progress() > 0 && st.progress() < DATA as u64,
        "{}",
        st.progress()
    );
    let tables =
        ucrypt_luks::reencrypt::tables(&img, &ucrypt_luks::DeviceAccess::default(), &pass, None)
            .unwrap();
    assert_eq!(tables.len(), 2, "{tables:?}");
    let mut covered = 0;
    let data = std::fs::read(&img).unwrap();
    for t in &tables {
        let crypto::table::Target::Crypt(t) = t else {
            panic!("a reencryption maps crypt targets only: {t:?}");
        };
        assert_eq!(t.start * 512, covered);
        let off = (t.offset * 512) as usize;
        let len = (t.len * 512) as usize;
        let mut buf = data[off..off + len].to_vec();
        crypto::SectorCrypt::new(&t.crypt_config())
            .unwrap()
            .decrypt(0, &mut buf);
        assert!(
            buf == plain[covered as usize..covered as usize + len],
            "segment at sector {} decrypts to the plaintext",
            t.start
        );
        covered += len as u64;
    }
    assert_eq!(covered, DATA as u64);
    // The two keys differ: the first segment is under the new one.
    let keys: Vec<&[u8]> = tables
        .iter()
        .filter_map(|t| match t {
            crypto::table::Target::Crypt(t) => Some(t.key()),
            _ => None,
        })
        .collect();
    assert_ne!(keys[0], keys[1]);
}
