//! The exact dm-crypt table lines from the seed documents
//! (`shared/seeds/`): each parses, formats back to itself (they are already
//! in the kernel's canonical form, except the out-of-tree `force_inline`),
//! and builds a working cipher.

use ucrypt_crypto as crypto;

use crypto::table::Table;
use crypto::SectorCrypt;

const ZERO_KEY: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[test]
fn seed_lines_round_trip() {
    let xts = format!("0 8388608 crypt aes-xts-plain64 {ZERO_KEY} 0 1:0 0");
    let lines = [
        "0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0".to_owned(),
        "0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 no_read_workqueue".to_owned(),
        "0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 no_write_workqueue".to_owned(),
        xts.clone(),
        format!("{xts} 1 same_cpu_crypt"),
        format!("{xts} 1 submit_from_crypt_cpus"),
    ];
    for line in &lines {
        let t = Table::parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(&t.format(true), line);
        // dmsetup without --showkeys: these keys are zeros or `-` already.
        assert_eq!(&t.format(false), line);
        let c = SectorCrypt::new(&t.crypt_config()).unwrap();
        let mut buf = vec![7u8; 4096];
        c.encrypt(8, &mut buf);
        c.decrypt(8, &mut buf);
        assert_eq!(buf, vec![7u8; 4096]);
    }
    let t = Table::parse("0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 force_inline")
        .unwrap();
    assert!(t.options.no_read_workqueue && t.options.no_write_workqueue);
    assert_eq!(Table::parse(&t.format(false)).unwrap(), t);
    let e = Table::parse("0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 no_such_flag")
        .unwrap_err();
    assert!(e.to_string().contains("no_such_flag"), "{e}");
}

#[test]
fn seed_xts_line_has_equal_key_halves_and_still_works() {
    // An all-zero 256-bit XTS key: both halves equal. OpenSSL refuses it,
    // dm-crypt accepts it, so ucrypt must too (VAES, AES-NI or Rust runs it).
    let t = Table::parse(&format!(
        "0 8388608 crypt aes-xts-plain64 {ZERO_KEY} 0 1:0 0"
    ))
    .unwrap();
    let c = SectorCrypt::new(&t.crypt_config()).unwrap();
    assert!(
        [
            crypto::VAES_XTS_NAME,
            crypto::AESNI_XTS_NAME,
            crypto::RUST_XTS_NAME
        ]
        .contains(&c.implementation()),
        "{}",
        c.implementation()
    );
    // IEEE 1619 vector 1 is exactly this key at sector 0.
    let mut buf = vec![0u8; 512];
    c.encrypt(0, &mut buf);
    assert_eq!(
        hex::encode(&buf[..32]),
        "917cf69ebd68b2ec9b9fe9a3eadda692cd43d2f59598ed858c02c2652fbf922e"
    );
}
