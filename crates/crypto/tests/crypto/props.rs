//! Property tests: decrypt(encrypt(x)) == x for random keys, sectors and
//! specs; out-of-place conversion gives the in-place bytes; flipping one bit changes only that sector's ciphertext (and for
//! XTS only that 16-byte block's); the parsers never panic on any input.

use proptest::prelude::*;
use ucrypt_crypto as crypto;
use zeroize::Zeroizing;

use crypto::table::Table;
use crypto::{CipherSpec, CryptConfig, SectorCrypt};

const SPECS: &[(&str, &[usize])] = &[
    ("aes-xts-plain64", &[32, 64]),
    ("aes-cbc-essiv:sha256", &[16, 32]),
    ("aes-cbc-plain64", &[24]),
    ("aes-ecb", &[16]),
    ("aes:2-xts-plain64", &[128]),
    ("aes-xts-eboiv", &[64]),
    ("aes-cbc-benbi", &[32]),
];

fn crypt_strategy() -> impl Strategy<Value = (CryptConfig, u64, usize)> {
    (
        0..SPECS.len(),
        0usize..4,
        0u32..4,
        any::<bool>(),
        0u64..1 << 20,
        0u64..1 << 40,
        1usize..4,
        any::<u64>(),
    )
        .prop_map(|(si, ki, ssi, large, ivo, sector, n, seed)| {
            let (spec, lens) = SPECS[si];
            let len = lens[ki % lens.len()];
            let ss = 512u32 << ssi;
            let step = u64::from(ss / 512);
            let key: Vec<u8> = (0..len)
                .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ i as u8)
                .collect();
            let cfg = CryptConfig {
                cipher: spec.into(),
                key: Zeroizing::new(key),
                iv_offset: ivo * step,
                sector_size: ss,
                iv_large_sectors: large,
            };
            (cfg, sector * step, n)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn decrypt_inverts_encrypt((cfg, sector, n) in crypt_strategy(), fill in any::<u8>()) {
        let c = SectorCrypt::new(&cfg).unwrap();
        let plain: Vec<u8> = (0..cfg.sector_size as usize * n).map(|i| fill.wrapping_add(i as u8)).collect();
        let mut buf = plain.clone();
        c.encrypt(sector, &mut buf);
        prop_assert_ne!(&buf, &plain);
        c.decrypt(sector, &mut buf);
        prop_assert_eq!(buf, plain);
    }

    #[test]
    fn out_of_place_matches_in_place((cfg, sector, n) in crypt_strategy(), fill in any::<u8>()) {
        let c = SectorCrypt::new(&cfg).unwrap();
        let plain: Vec<u8> = (0..cfg.sector_size as usize * n).map(|i| fill ^ (i * 7) as u8).collect();
        let mut in_place = plain.clone();
        c.encrypt(sector, &mut in_place);
        // The destination starts as garbage: every byte must be written.
        let mut out = vec![0xeeu8; plain.len()];
        c.encrypt_to(sector, &plain, &mut out);
        prop_assert_eq!(&out, &in_place);
        let mut back = vec![0x11u8; plain.len()];
        c.decrypt_to(sector, &out, &mut back);
        prop_assert_eq!(&back, &plain);
        // Appending keeps what the Vec held and adds exactly the plaintext.
        let mut appended = vec![0x22u8; 3];
        c.decrypt_append(sector, &out, &mut appended);
        prop_assert_eq!(&appended[..3], &[0x22u8; 3][..]);
        prop_assert_eq!(&appended[3..], &plain[..]);
    }

    #[test]
    fn one_bit_changes_only_its_sector((cfg, sector, n) in crypt_strategy(), bit in any::<usize>()) {
        let c = SectorCrypt::new(&cfg).unwrap();
        let ss = cfg.sector_size as usize;
        let n = n + 1;
        let plain = vec![0x3cu8; ss * n];
        let bit = bit % (plain.len() * 8);
        let mut flipped = plain.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let (mut a, mut b) = (plain.clone(), flipped);
        c.encrypt(sector, &mut a);
        c.encrypt(sector, &mut b);
        let hit = bit / 8 / ss;
        for s in 0..n {
            let same = a[s * ss..(s + 1) * ss] == b[s * ss..(s + 1) * ss];
            prop_assert_eq!(same, s != hit, "sector {} of {} (flipped bit in sector {})", s, n, hit);
        }
        if cfg.cipher.contains("xts") || cfg.cipher.contains("ecb") {
            // No chaining: only the flipped block changes.
            let blk = bit / 8 / 16;
            for k in 0..a.len() / 16 {
                prop_assert_eq!(a[k * 16..k * 16 + 16] == b[k * 16..k * 16 + 16], k != blk);
            }
        }
    }

    #[test]
    fn cipher_spec_parser_never_panics(s in ".{0,64}") {
        let _ = CipherSpec::parse(&s);
    }

    #[test]
    fn cipher_spec_parser_never_panics_on_near_misses(
        a in "(capi:)?[a-z_()]{0,12}(:[0-9]{0,3})?", b in "-?[a-z0-9()]{0,8}", c in "(-[a-z0-9]{0,10})?(:[a-z0-9:-]{0,8})?",
    ) {
        let _ = CipherSpec::parse(&format!("{a}{b}{c}"));
    }

    #[test]
    fn table_parser_never_panics(s in "\\PC{0,200}") {
        let _ = Table::parse(&s);
    }

    #[test]
    fn table_parser_never_panics_on_near_misses(
        start in "[0-9]{0,21}", len in "[0-9x]{0,21}", cipher in "(aes|capi:ecb\\(cipher_null\\)|aes-xts-plain64|aes-cbc-essiv:sha1)",
        key in "(-|[0-9a-f]{0,130}|:[0-9]{0,3}:logon:k)", ivo in "[0-9-]{0,20}", off in "[0-9]{0,20}",
        opts in "( [0-9]{1,2}( (allow_discards|sector_size:[0-9]{0,5}|force_inline|iv_large_sectors|integrity:[0-9]:aead|x)){0,10})?",
    ) {
        let line = format!("{start} {len} crypt {cipher} {key} {ivo} /dev/x {off}{opts}");
        if let Ok(t) = Table::parse(&line) {
            // Whatever parses must format and re-parse to the same table.
            prop_assert_eq!(Table::parse(&t.format(true)).unwrap(), t);
        }
    }
}
