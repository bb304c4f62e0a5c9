//! The XTS implementations against OpenSSL's EVP AES-XTS, one sector per
//! EVP call: random keys (128- and 256-bit AES, equal halves included),
//! sector sizes 512..4096, sector counts across the AES-NI path's tweak
//! batches, start sectors, `iv_offset`, `iv_large_sectors` and every IV
//! mode that goes with XTS. For plain and plain64 the reference is built
//! here from the `openssl` crate alone; for the other IV modes the
//! implementations must match the OpenSSL provider (whose IVs the oracle
//! tests check). Each output path (in place, into a slice, appended) is
//! compared.

use openssl::cipher::Cipher;
use openssl::cipher_ctx::CipherCtx;
use proptest::prelude::*;
use ucrypt_crypto as crypto;
use zeroize::Zeroizing;

use crypto::{CryptConfig, Provider, SectorCrypt};

/// IV modes usable with XTS in dm-crypt (`aes:2-` exercises two keys).
const SPECS: &[&str] = &[
    "aes-xts-plain64",
    "aes-xts-plain",
    "aes-xts-plain64be",
    "aes-xts-essiv:sha256",
    "aes-xts-benbi",
    "aes-xts-null",
    "aes-xts-eboiv",
    "aes:2-xts-plain64",
];

#[derive(Debug, Clone)]
struct Case {
    spec: &'static str,
    key: Vec<u8>,
    sector_size: u32,
    large: bool,
    iv_offset: u64,
    start: u64,
    count: usize,
    seed: u8,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..SPECS.len(),
        any::<bool>(),
        any::<bool>(),
        0u32..4,
        any::<bool>(),
        0u64..1 << 33,
        0u64..1 << 34,
        1usize..40,
        any::<u64>(),
    )
        .prop_map(|(si, wide, equal, ssi, large, ivo, start, count, seed)| {
            let spec = SPECS[si];
            let parts = if spec.starts_with("aes:2") { 2 } else { 1 };
            let half = if wide { 32 } else { 16 };
            let mut key: Vec<u8> = (0..2 * half * parts)
                .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ (i as u8).wrapping_mul(29))
                .collect();
            if equal && parts == 1 {
                // Equal halves: OpenSSL refuses, dm-crypt accepts.
                let (a, b) = key.split_at_mut(half);
                b.copy_from_slice(a);
            }
            let ss = 512u32 << ssi;
            let step = u64::from(ss / 512);
            Case {
                spec,
                key,
                sector_size: ss,
                large,
                iv_offset: ivo * step,
                start: start * step,
                count: if ss == 4096 { count.min(12) } else { count },
                seed: seed as u8,
            }
        })
}

fn crypt(c: &Case, p: Provider) -> SectorCrypt {
    SectorCrypt::with_provider(
        &CryptConfig {
            cipher: c.spec.into(),
            key: Zeroizing::new(c.key.clone()),
            iv_offset: c.iv_offset,
            sector_size: c.sector_size,
            iv_large_sectors: c.large,
        },
        p,
    )
    .unwrap()
}

/// plain/plain64 ciphertext straight from OpenSSL EVP, one call per sector;
/// `None` where OpenSSL refuses the key (equal halves).
fn evp_reference(c: &Case, plain: &[u8]) -> Option<Vec<u8>> {
    let cipher = match c.key.len() {
        32 => Cipher::aes_128_xts(),
        64 => Cipher::aes_256_xts(),
        _ => return None,
    };
    let ss = c.sector_size as usize;
    let shift = (ss / 512).trailing_zeros();
    let mut out = vec![0u8; plain.len()];
    for (i, (p, o)) in plain.chunks(ss).zip(out.chunks_mut(ss)).enumerate() {
        let cc = (c.start + c.iv_offset).wrapping_add(i as u64 * (ss as u64 / 512));
        let s = if c.large { cc >> shift } else { cc };
        let mut iv = [0u8; 16];
        match c.spec {
            "aes-xts-plain64" => iv[..8].copy_from_slice(&s.to_le_bytes()),
            "aes-xts-plain" => iv[..4].copy_from_slice(&(s as u32).to_le_bytes()),
            _ => return None,
        }
        let mut ctx = CipherCtx::new().unwrap();
        ctx.encrypt_init(Some(cipher), Some(&c.key), Some(&iv))
            .ok()?;
        assert_eq!(ctx.cipher_update(p, Some(o)).unwrap(), ss);
    }
    Some(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn xts_paths_match_openssl_per_sector(c in case()) {
        let ss = c.sector_size as usize;
        let plain: Vec<u8> = (0..ss * c.count)
            .map(|i| (i as u8).wrapping_mul(13) ^ c.seed)
            .collect();
        // What the OpenSSL provider writes (the Rust XTS for keys OpenSSL
        // refuses), checked against EVP directly where the IV is simple.
        let reference = crypt(&c, Provider::OpenSsl);
        let mut want = plain.clone();
        reference.encrypt(c.start, &mut want);
        if let Some(evp) = evp_reference(&c, &plain) {
            prop_assert_eq!(&want, &evp);
        }
        for p in [Provider::Auto, Provider::AesNi, Provider::Vaes, Provider::Rust] {
            let x = crypt(&c, p);
            let name = x.implementation();
            let mut a = plain.clone();
            x.encrypt(c.start, &mut a);
            prop_assert_eq!(&a, &want, "in place via {}", name);
            let mut b = vec![0xa5u8; plain.len()];
            x.encrypt_to(c.start, &plain, &mut b);
            prop_assert_eq!(&b, &want, "into a slice via {}", name);
            let mut back = vec![0x5au8; plain.len()];
            x.decrypt_to(c.start, &want, &mut back);
            prop_assert_eq!(&back, &plain, "decrypt into a slice via {}", name);
            let mut d = vec![7u8, 8];
            x.decrypt_append(c.start, &want, &mut d);
            prop_assert_eq!(&d[..2], &[7u8, 8][..]);
            prop_assert_eq!(&d[2..], &plain[..], "decrypt appended via {}", name);
            x.decrypt(c.start, &mut a);
            prop_assert_eq!(&a, &plain, "decrypt in place via {}", name);
        }
    }
}

#[test]
fn aesni_is_chosen_where_the_cpu_has_it() {
    let c = crypt(
        &Case {
            spec: "aes-xts-plain64",
            key: (0..64).collect(),
            sector_size: 512,
            large: false,
            iv_offset: 0,
            start: 0,
            count: 1,
            seed: 0,
        },
        Provider::AesNi,
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        assert_eq!(c.implementation(), crypto::AESNI_XTS_NAME);
        return;
    }
    assert_eq!(c.implementation(), crypto::OPENSSL_XTS_NAME);
}

#[test]
fn vaes_is_chosen_where_the_cpu_has_it() {
    let case = |sector_size| Case {
        spec: "aes-xts-plain64",
        key: (0..64).collect(),
        sector_size,
        large: false,
        iv_offset: 0,
        start: 0,
        count: 1,
        seed: 0,
    };
    let wide = crypt(&case(512), Provider::Vaes);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("vaes")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("aes")
    {
        assert_eq!(wide.implementation(), crypto::VAES_XTS_NAME);
        if std::env::var_os("UCRYPT_CRYPTO").is_none() {
            // Auto takes it for 512-byte sectors everywhere it runs.
            let auto = crypt(&case(512), Provider::Auto);
            assert_eq!(auto.implementation(), crypto::VAES_XTS_NAME);
        }
        return;
    }
    assert_ne!(wide.implementation(), crypto::VAES_XTS_NAME);
}
