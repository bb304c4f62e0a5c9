//! Serpent, Twofish and Camellia through `SectorCrypt` against independent
//! references on random data: RustCrypto's `serpent` 0.6, `twofish` 0.8
//! and `camellia` 0.2 (one block per call, XTS and CBC built here from
//! IEEE 1619 and the CBC definition), and the system OpenSSL's Camellia
//! (`openssl enc`: ECB, CBC, and XTS assembled by hand from ECB). Every key size, 512..4096-byte sectors,
//! plain64/plain/essiv IVs, up to 40 sectors per call, start sectors and
//! `iv_offset`, buffers at unaligned offsets, in place and out of place,
//! each implementation (`Auto`, and `Rust`, which keeps Serpent on its
//! baseline kernel). Seeds from `testutil::Rng` (`UCRYPT_TEST_SEED`).

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use sha2::Digest;
use testutil::Rng;
use ucrypt_crypto::{CryptConfig, Provider, SectorCrypt};
use zeroize::Zeroizing;

/// A RustCrypto block cipher keyed once (sizes differ; a test value).
#[allow(clippy::large_enum_variant)]
enum Reference {
    Serpent(serpent::Serpent),
    Twofish(twofish::Twofish),
    C128(camellia::Camellia128),
    C192(camellia::Camellia192),
    C256(camellia::Camellia256),
}

impl Reference {
    fn new(cipher: &str, key: &[u8]) -> Self {
        match (cipher, key.len()) {
            ("serpent", _) => Self::Serpent(serpent::Serpent::new_from_slice(key).unwrap()),
            ("twofish", _) => Self::Twofish(twofish::Twofish::new_from_slice(key).unwrap()),
            ("camellia", 16) => Self::C128(camellia::Camellia128::new_from_slice(key).unwrap()),
            ("camellia", 24) => Self::C192(camellia::Camellia192::new_from_slice(key).unwrap()),
            ("camellia", 32) => Self::C256(camellia::Camellia256::new_from_slice(key).unwrap()),
            _ => panic!("{cipher} with a {}-byte key", key.len()),
        }
    }

    fn enc(&self, b: &mut [u8]) {
        let blk: &mut aes::Block = b.try_into().unwrap();
        match self {
            Self::Serpent(c) => c.encrypt_block(blk),
            Self::Twofish(c) => c.encrypt_block(blk),
            Self::C128(c) => c.encrypt_block(blk),
            Self::C192(c) => c.encrypt_block(blk),
            Self::C256(c) => c.encrypt_block(blk),
        }
    }

    fn dec(&self, b: &mut [u8]) {
        let blk: &mut aes::Block = b.try_into().unwrap();
        match self {
            Self::Serpent(c) => c.decrypt_block(blk),
            Self::Twofish(c) => c.decrypt_block(blk),
            Self::C128(c) => c.decrypt_block(blk),
            Self::C192(c) => c.decrypt_block(blk),
            Self::C256(c) => c.decrypt_block(blk),
        }
    }
}

fn xor16(a: &mut [u8], b: &[u8]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

fn mul_alpha(t: [u8; 16]) -> [u8; 16] {
    let v = u128::from_le_bytes(t);
    ((v << 1) ^ ((v >> 127) * 0x87)).to_le_bytes()
}

/// The IV of 512-byte sector `s` (already in IV units) for `iv`.
fn iv_of(iv: &str, s: u64, essiv: Option<&Reference>) -> [u8; 16] {
    let mut b = [0u8; 16];
    match iv {
        "plain64" => b[..8].copy_from_slice(&s.to_le_bytes()),
        "plain" => b[..4].copy_from_slice(&(s as u32).to_le_bytes()),
        "essiv:sha256" => {
            b[..8].copy_from_slice(&s.to_le_bytes());
            essiv.unwrap().enc(&mut b);
        }
        _ => panic!("{iv}"),
    }
    b
}

/// Converts whole sectors block by block with the reference.
#[allow(clippy::too_many_arguments)]
fn reference(
    cipher: &str,
    chain: &str,
    iv: &str,
    key: &[u8],
    sector_size: usize,
    first_iv_sector: u64,
    encrypt: bool,
    buf: &mut [u8],
) {
    let salt;
    let essiv = if iv.starts_with("essiv") {
        salt = sha2::Sha256::digest(key);
        Some(Reference::new(cipher, &salt))
    } else {
        None
    };
    let step = sector_size as u64 / 512;
    let (data, tweak) = match chain {
        "xts" => {
            let (a, b) = key.split_at(key.len() / 2);
            (Reference::new(cipher, a), Some(Reference::new(cipher, b)))
        }
        _ => (Reference::new(cipher, key), None),
    };
    for (i, sector) in buf.chunks_mut(sector_size).enumerate() {
        let v = match chain {
            "ecb" => [0; 16],
            _ => iv_of(iv, first_iv_sector + i as u64 * step, essiv.as_ref()),
        };
        match chain {
            "xts" => {
                let mut t = v;
                tweak.as_ref().unwrap().enc(&mut t);
                for b in sector.chunks_mut(16) {
                    xor16(b, &t);
                    if encrypt {
                        data.enc(b);
                    } else {
                        data.dec(b);
                    }
                    xor16(b, &t);
                    t = mul_alpha(t);
                }
            }
            "cbc" => {
                let mut prev = v;
                for b in sector.chunks_mut(16) {
                    if encrypt {
                        xor16(b, &prev);
                        data.enc(b);
                        prev.copy_from_slice(b);
                    } else {
                        let c: [u8; 16] = b.try_into().unwrap();
                        data.dec(b);
                        xor16(b, &prev);
                        prev = c;
                    }
                }
            }
            _ => {
                for b in sector.chunks_mut(16) {
                    if encrypt {
                        data.enc(b);
                    } else {
                        data.dec(b);
                    }
                }
            }
        }
    }
}

fn crypt(spec: &str, key: &[u8], sector_size: u32, iv_offset: u64, p: Provider) -> SectorCrypt {
    SectorCrypt::with_provider(
        &CryptConfig {
            cipher: spec.into(),
            key: Zeroizing::new(key.to_vec()),
            iv_offset,
            sector_size,
            iv_large_sectors: false,
        },
        p,
    )
    .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn every_key_size_sector_size_and_iv_matches_rustcrypto() {
    let mut rng = Rng::new(0x5e1f);
    for cipher in ["serpent", "twofish", "camellia"] {
        for (chain, iv, klen) in [
            ("xts", "plain64", 32),
            ("xts", "plain64", 48),
            ("xts", "plain64", 64),
            ("xts", "essiv:sha256", 64),
            ("xts", "plain", 32),
            ("cbc", "plain64", 16),
            ("cbc", "essiv:sha256", 24),
            ("cbc", "plain64", 32),
            ("ecb", "", 16),
            ("ecb", "", 24),
            ("ecb", "", 32),
        ] {
            let spec = if chain == "ecb" {
                format!("{cipher}-ecb")
            } else {
                format!("{cipher}-{chain}-{iv}")
            };
            for provider in [Provider::Auto, Provider::Rust] {
                for sector_size in [512usize, 1024, 4096] {
                    let key = rng.bytes(klen);
                    let step = sector_size as u64 / 512;
                    let iv_offset = rng.below(1 << 20) * step;
                    let c = crypt(&spec, &key, sector_size as u32, iv_offset, provider);
                    assert!(c.implementation().contains(cipher), "{spec}");
                    // Many sectors per call (fewer of the large ones, the
                    // block-at-a-time references are slow), at an unaligned
                    // place in a larger buffer.
                    let count = 1 + rng.below_usize(if sector_size == 4096 { 6 } else { 40 });
                    let offset = rng.below_usize(16);
                    let start = rng.below(1 << 30) * step;
                    let len = count * sector_size;
                    let mut space = rng.bytes(len + offset + 7);
                    let plain = space[offset..offset + len].to_vec();
                    let mut want = plain.clone();
                    let what = format!(
                        "{spec} key {klen} {provider:?} ss {sector_size} x{count} at {start}+{iv_offset} (seed {:#x})",
                        rng.seed()
                    );
                    let iv_sector = if chain == "ecb" { 0 } else { start + iv_offset };
                    reference(
                        cipher,
                        chain,
                        iv,
                        &key,
                        sector_size,
                        iv_sector,
                        true,
                        &mut want,
                    );
                    c.encrypt(start, &mut space[offset..offset + len]);
                    assert!(space[offset..offset + len] == want[..], "{what}: encrypt");
                    let mut back = want.clone();
                    reference(
                        cipher,
                        chain,
                        iv,
                        &key,
                        sector_size,
                        iv_sector,
                        false,
                        &mut back,
                    );
                    assert!(back == plain, "{what}: reference decrypt");
                    c.decrypt(start, &mut space[offset..offset + len]);
                    assert!(space[offset..offset + len] == plain[..], "{what}: decrypt");
                    // Out of place and appended.
                    let mut dst = vec![0u8; len + 3];
                    c.encrypt_to(start, &plain, &mut dst[3..]);
                    assert!(dst[3..] == want[..], "{what}: encrypt_to");
                    let mut out = vec![0xa5u8; 5];
                    c.decrypt_append(start, &want, &mut out);
                    assert!(out[5..] == plain[..], "{what}: decrypt_append");
                }
            }
        }
    }
}

/// The system OpenSSL's Camellia over `data` with `key` (ECB or CBC, no
/// padding; the vendored OpenSSL is built without Camellia).
fn openssl_camellia(mode: &str, key: &[u8], iv: &[u8], data: &mut [u8]) {
    let alg = format!("-camellia-{}-{mode}", key.len() * 8);
    let (k, iv) = (hex::encode(key), hex::encode(iv));
    let mut args = vec!["enc", "-e", &alg, "-nopad", "-K", &k];
    if mode == "cbc" {
        args.extend(["-iv", &iv]);
    }
    let out = testutil::run("openssl", &args, Some(data));
    assert!(out.status.success(), "openssl enc {alg}: {out:?}");
    data.copy_from_slice(&out.stdout);
}

#[test]
fn camellia_matches_openssl() {
    if !testutil::require_tool("cipher_refs::camellia_matches_openssl", "openssl") {
        return;
    }
    let mut rng = Rng::new(0xca3e);
    for klen in [16usize, 24, 32] {
        for sector_size in [512usize, 4096] {
            let count = 1 + rng.below_usize(8);
            let plain = rng.bytes(count * sector_size);
            let start = rng.below(1 << 40) * (sector_size as u64 / 512);
            let step = sector_size as u64 / 512;
            let plain64 = |i: usize| {
                let mut v = [0u8; 16];
                v[..8].copy_from_slice(&(start + i as u64 * step).to_le_bytes());
                v
            };
            // ECB: the whole buffer in one OpenSSL call.
            let key = rng.bytes(klen);
            let c = crypt("camellia-ecb", &key, sector_size as u32, 0, Provider::Auto);
            let mut want = plain.clone();
            openssl_camellia("ecb", &key, &[], &mut want);
            let mut got = plain.clone();
            c.encrypt(start, &mut got);
            assert!(got == want, "ecb key {klen} ss {sector_size}");
            c.decrypt(start, &mut got);
            assert!(got == plain, "ecb key {klen} ss {sector_size}: decrypt");
            // CBC, plain64: one OpenSSL call per sector.
            let c = crypt(
                "camellia-cbc-plain64",
                &key,
                sector_size as u32,
                0,
                Provider::Auto,
            );
            let mut want = plain.clone();
            for (i, s) in want.chunks_mut(sector_size).enumerate() {
                openssl_camellia("cbc", &key, &plain64(i), s);
            }
            let mut got = plain.clone();
            c.encrypt(start, &mut got);
            assert!(got == want, "cbc key {klen} ss {sector_size}");
            c.decrypt(start, &mut got);
            assert!(got == plain, "cbc key {klen} ss {sector_size}: decrypt");
            // XTS by hand: T = E_k2(iv), the tweaks XORed around one ECB
            // call per sector with k1.
            let key = rng.bytes(2 * klen);
            let (k1, k2) = key.split_at(klen);
            let c = crypt(
                "camellia-xts-plain64",
                &key,
                sector_size as u32,
                0,
                Provider::Auto,
            );
            let mut want = plain.clone();
            for (i, s) in want.chunks_mut(sector_size).enumerate() {
                let mut t = plain64(i);
                openssl_camellia("ecb", k2, &[], &mut t);
                let mut tweaks = Vec::with_capacity(sector_size);
                for _ in 0..sector_size / 16 {
                    tweaks.extend_from_slice(&t);
                    t = mul_alpha(t);
                }
                xor16(s, &tweaks);
                openssl_camellia("ecb", k1, &[], s);
                xor16(s, &tweaks);
            }
            let mut got = plain.clone();
            c.encrypt(start, &mut got);
            assert!(got == want, "xts key {} ss {sector_size}", 2 * klen);
            c.decrypt(start, &mut got);
            assert!(
                got == plain,
                "xts key {} ss {sector_size}: decrypt",
                2 * klen
            );
        }
    }
}
