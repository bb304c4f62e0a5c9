//! Cipher cascades (TrueCrypt/VeraCrypt chains, stacked dm-crypt devices
//! in cryptsetup): a stacked `SectorCrypt` must give the bytes the layers
//! give one after another, and a cascade's table text must read back.

use ucrypt_crypto as crypto;

use crypto::table::{Table, Targets};
use crypto::{CryptConfig, SectorCrypt};
use zeroize::Zeroizing;

fn layer(cipher: &str, seed: u8) -> SectorCrypt {
    SectorCrypt::new(&CryptConfig {
        cipher: cipher.into(),
        key: Zeroizing::new(
            (0..64u8)
                .map(|i| i.wrapping_mul(seed).wrapping_add(seed))
                .collect(),
        ),
        iv_offset: 256,
        sector_size: 512,
        iv_large_sectors: false,
    })
    .expect("layer")
}

const CHAIN: [(&str, u8); 3] = [
    ("serpent-xts-plain64", 3),
    ("twofish-xts-plain64", 5),
    ("aes-xts-plain64", 7),
];

#[test]
fn a_stack_is_its_layers_in_order() {
    let stack =
        SectorCrypt::stacked(CHAIN.iter().map(|(c, s)| layer(c, *s)).collect()).expect("stack");
    assert_eq!(stack.below().len(), 2);
    let mut rng = testutil::Rng::new(3);
    let plain = rng.bytes(8 * 512);
    // Written: the top layer (first cipher) first, as dm's top device.
    let mut want = plain.clone();
    for (c, s) in CHAIN {
        layer(c, s).encrypt(40, &mut want);
    }
    let mut got = plain.clone();
    stack.encrypt(40, &mut got);
    assert_eq!(got, want, "encrypt");
    let mut to = vec![0u8; plain.len()];
    stack.encrypt_to(40, &plain, &mut to);
    assert_eq!(to, want, "encrypt_to");
    let mut back = Vec::with_capacity(4);
    back.push(9u8);
    stack.decrypt_append(40, &want, &mut back);
    assert_eq!(&back[1..], &plain[..], "decrypt_append");
    stack.decrypt(40, &mut got);
    assert_eq!(got, plain, "decrypt");
}

#[test]
fn a_stack_refuses_mixed_sector_sizes() {
    let big = SectorCrypt::new(&CryptConfig {
        cipher: "aes-xts-plain64".into(),
        key: Zeroizing::new(vec![1u8; 64]),
        iv_offset: 0,
        sector_size: 4096,
        iv_large_sectors: false,
    })
    .expect("4k layer");
    assert!(SectorCrypt::stacked(vec![layer("aes-xts-plain64", 1), big]).is_err());
    assert!(SectorCrypt::stacked(Vec::new()).is_err());
}

#[test]
fn a_cascade_table_reads_back_and_runs_the_stack() {
    let key = |s: u8| "ab".repeat(32).replace("ab", &format!("{s:02x}"));
    let lines: Vec<Table> = CHAIN
        .iter()
        .map(|(c, s)| {
            Table::parse(&format!("0 2048 crypt {c} {} 256 /dev/x 256", key(*s))).expect("line")
        })
        .collect();
    let t = Table::stacked(lines).expect("stack");
    assert_eq!(t.below().len(), 2);
    let text = Targets::single(t.clone()).format(true);
    assert_eq!(text.lines().count(), 3);
    assert!(text.lines().skip(1).all(|l| l.starts_with('+')), "{text}");
    let again = Targets::parse(&text).expect("reads back");
    assert_eq!(again.as_single(), Some(&t));
    // A `+` line with nothing to stack on is refused.
    assert!(Targets::parse(&format!(
        "+{}",
        text.lines()
            .nth(1)
            .unwrap_or_default()
            .trim_start_matches('+')
    ))
    .is_err());
    // Layers with different lengths are refused.
    let short = Table::parse(&format!(
        "0 1024 crypt aes-xts-plain64 {} 256 /dev/x 256",
        key(1)
    ))
    .expect("line");
    assert!(Table::stacked(vec![t.clone(), short]).is_err());
    let sc = t.sector_crypt().expect("cipher");
    assert_eq!(sc.below().len(), 2);
}

#[test]
fn kuznyechik_xts_is_the_rustcrypto_cipher_under_xts() {
    use kuznyechik::cipher::{BlockCipherEncrypt, KeyInit};
    let key: Vec<u8> = (0..64u8).collect();
    let sc = SectorCrypt::new(&CryptConfig {
        cipher: "kuznyechik-xts-plain64".into(),
        key: Zeroizing::new(key.clone()),
        iv_offset: 0,
        sector_size: 512,
        iv_large_sectors: false,
    })
    .expect("kuznyechik");
    let mut buf = vec![0x5au8; 512];
    sc.encrypt(3, &mut buf);
    // XTS by hand over the RustCrypto block cipher.
    let data = kuznyechik::Kuznyechik::new_from_slice(&key[..32]).expect("key");
    let tweak = kuznyechik::Kuznyechik::new_from_slice(&key[32..]).expect("key");
    let mut t = kuznyechik::cipher::Block::<kuznyechik::Kuznyechik>::default();
    t[..8].copy_from_slice(&3u64.to_le_bytes());
    tweak.encrypt_block(&mut t);
    let mut tw = u128::from_le_bytes(t[..].try_into().expect("16"));
    for chunk in buf.chunks_exact(16) {
        let mut b = kuznyechik::cipher::Block::<kuznyechik::Kuznyechik>::default();
        for (i, x) in b.iter_mut().enumerate() {
            *x = 0x5a ^ tw.to_le_bytes()[i];
        }
        data.encrypt_block(&mut b);
        let want: Vec<u8> = b.iter().zip(tw.to_le_bytes()).map(|(x, y)| x ^ y).collect();
        assert_eq!(chunk, &want[..]);
        tw = (tw << 1) ^ if tw >> 127 != 0 { 0x87 } else { 0 };
    }
}
