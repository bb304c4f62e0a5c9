//! Chain modes over whole sectors: hand-written XTS, CBC and ECB over the
//! RustCrypto `aes` block primitive and this crate's own Serpent, Twofish
//! and Camellia (batched `encrypt_blocks`), the OpenSSL path, and an AES-NI
//! XTS that converts many sectors per call. Everything behind the small
//! [`SectorCipher`] trait.
//!
//! ```text
//!   SectorCrypt ──(one per key part)──▶ dyn SectorCipher
//!                                         ├─ XtsAesni, wide (x86-64 with VAES + AVX2: XTS at
//!                                         │      every sector size, two blocks per AES instruction;
//!                                         │      with AVX-512 OpenSSL's own VAES loop takes 4 KiB)
//!                                         ├─ XtsAesni (x86-64 with AES-NI only: XTS with sectors
//!                                         │      below 4096 bytes; OpenSSL is ahead on 4 KiB ones)
//!                                         │     └─ XtsRust for data units that are not whole
//!                                         │        groups of 8 blocks (never a dm-crypt sector)
//!                                         ├─ Evp (vendored OpenSSL 3: xts/cbc/ecb; VAES/AVX-512
//!                                         │      or AES-NI picked by OpenSSL at runtime)
//!                                         │     └─ falls back to the Rust mode below for keys
//!                                         │        OpenSSL refuses (XTS halves equal, AES-192-XTS)
//!                                         ├─ XtsRust     (256 blocks per primitive call)
//!                                         ├─ Cbc, Ecb
//!                                         │     over Prim: aes, or serpent.rs (bitsliced:
//!                                         │     16 blocks per AVX2 pass, 8 per SSE2 pass),
//!                                         │     twofish.rs, camellia.rs (tables, 4 blocks
//!                                         │     interleaved)
//!                                         └─ NullCipher
//! ```
//!
//! XTS is IEEE 1619-2007 restricted to whole 16-byte blocks (dm-crypt sectors
//! are 512..4096 bytes, so ciphertext stealing never happens). The tweak is
//! the sector IV encrypted with the second key half, multiplied by alpha in
//! GF(2^128) (little-endian, polynomial x^128 + x^7 + x^2 + x + 1) per block.
//!
//! Why a third XTS: OpenSSL re-initialises its context with every sector's
//! IV and encrypts that IV serially before the first block, ~60 ns a sector
//! whatever its size, so 512-byte sectors ran at ~0.6 of 4096-byte ones.
//! `aesni.rs` encrypts the IVs of many sectors in one batch and streams all
//! their blocks through one interleaved AES-NI loop; `vaes.rs` is that loop
//! on 256-bit registers, which is what lets 512-byte sectors reach 0.9 of
//! the 4096-byte speed of the best path (OpenSSL's AES-NI loop on CPUs
//! without AVX-512 reaches only about half of it).
//!
//! ```text
//!   mod.rs    SectorCipher, Provider, new_mode (the one place that picks an
//!             implementation), NullCipher
//!   aesni.rs  XtsAesni (x86-64 only; unsafe: target_feature kernels)
//!   vaes.rs   its 256-bit VAES kernels (x86-64 only; unsafe likewise)
//!   rust.rs   the pure-Rust provider: Prim (AES, Serpent, Twofish,
//!             Camellia), XtsRust, Cbc, Ecb; the only one for the non-AES
//!             ciphers (vendored OpenSSL has no Serpent, Twofish or Camellia)
//!   serpent.rs  Serpent bitsliced across 16 (AVX2) or 8 (SSE2) blocks
//!             (x86-64; plain u32 words elsewhere; unsafe: intrinsics)
//!   twofish.rs  Twofish with key-dependent tables, 4 blocks interleaved
//!   camellia.rs Camellia with S-box/P tables, 4 blocks interleaved
//!   evp.rs    the OpenSSL EVP provider (and one unsafe function)
//!   legacy.rs TrueCrypt's legacy modes: LRW over Prim, CBC/ECB over the
//!             8-byte CAST5 and Triple DES
//! ```

#[cfg(target_arch = "x86_64")]
mod aesni;
mod camellia;
mod evp;
mod legacy;
mod rust;
mod serpent;
mod twofish;
#[cfg(target_arch = "x86_64")]
mod vaes;

pub(crate) use rust::Prim;
use rust::{Cbc, Ecb, XtsRust};

/// Direction of a conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Encrypt,
    Decrypt,
}

/// Encrypts or decrypts whole sectors in place with caller-supplied IVs.
pub(crate) trait SectorCipher: Send + Sync {
    /// Converts `buf` as consecutive `unit`-byte sectors (`unit` a multiple
    /// of 16); sector `i` uses `ivs[i]`, and `ivs.len() == buf.len() / unit`.
    fn crypt_run(&self, dir: Dir, buf: &mut [u8], unit: usize, ivs: &[[u8; 16]]);

    /// Like [`SectorCipher::crypt_run`], reading `src` and writing `dst`
    /// (same length): one pass over the data instead of a copy and a pass.
    /// Provided: copy, then convert in place.
    fn crypt_run_to(&self, dir: Dir, src: &[u8], dst: &mut [u8], unit: usize, ivs: &[[u8; 16]]) {
        dst.copy_from_slice(src);
        self.crypt_run(dir, dst, unit, ivs);
    }

    /// Like [`SectorCipher::crypt_run_to`], appending the output to `out`:
    /// written straight into its spare capacity where the implementation
    /// can (OpenSSL XTS), so no buffer has to be zeroed first. Provided:
    /// append a copy, then convert it in place.
    fn crypt_run_append(
        &self,
        dir: Dir,
        src: &[u8],
        out: &mut Vec<u8>,
        unit: usize,
        ivs: &[[u8; 16]],
    ) {
        let base = out.len();
        out.extend_from_slice(src);
        self.crypt_run(dir, &mut out[base..], unit, ivs);
    }

    /// Converts one sector (`buf`, a multiple of 16 bytes) with `iv`
    /// (the known-answer entry points in `internal` and unit tests).
    #[cfg(any(test, feature = "testing"))]
    fn crypt(&self, dir: Dir, buf: &mut [u8], iv: &[u8; 16]) {
        let unit = buf.len();
        if unit > 0 {
            self.crypt_run(dir, buf, unit, std::slice::from_ref(iv));
        }
    }

    /// Implementation name for `benchmark`/`status`.
    fn name(&self) -> &'static str;
}

/// Which implementation family builds the chain modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Provider {
    /// For XTS: [`Provider::Vaes`] where the CPU has VAES, VPCLMULQDQ and AVX2 (on
    /// CPUs with AVX-512 too, only below 4096-byte sectors: OpenSSL's
    /// 512-bit loop takes those); else the AES-NI implementation below
    /// 4096-byte sectors where the CPU has AES-NI; otherwise vendored
    /// OpenSSL when it accepts the key, else pure Rust. For the other modes
    /// OpenSSL, else Rust. The environment variable
    /// `UCRYPT_CRYPTO=vaes|aesni|openssl|rust` overrides it.
    #[default]
    Auto,
    /// Vendored OpenSSL EVP (falls back to Rust for keys OpenSSL refuses,
    /// such as XTS keys with equal halves, or AES-192-XTS which it lacks).
    OpenSsl,
    /// Hand-made modes over the `aes` crate's batched block functions.
    Rust,
    /// XTS over many sectors per call with AES-NI ([`AESNI_XTS_NAME`]),
    /// what `Auto` picks for XTS below 4096-byte sectors on x86-64 CPUs with
    /// AES-NI; where there is none, as [`Provider::OpenSsl`]. Other chain
    /// modes as `OpenSsl`.
    AesNi,
    /// [`Provider::AesNi`] with its 256-bit VAES kernels ([`VAES_XTS_NAME`])
    /// where the CPU has VAES, VPCLMULQDQ and AVX2; where not, as `AesNi`.
    Vaes,
}

/// Name of the pure-Rust XTS implementation.
pub const RUST_XTS_NAME: &str = "rust-aes-xts (hand-made XTS over aes 0.9 encrypt_blocks)";
/// Name of the AES-NI XTS implementation.
pub const AESNI_XTS_NAME: &str =
    "aesni-xts (many sectors per call: tweaks batched, tweak XOR folded into AES-NI rounds)";
/// Name of the AES-NI XTS implementation running its VAES kernels.
pub const VAES_XTS_NAME: &str =
    "vaes-xts (many sectors per call: tweaks batched, two blocks per VAES instruction)";
/// Name of the Serpent XTS on its AVX2 kernel.
pub const SERPENT_AVX2_XTS_NAME: &str =
    "serpent-avx2-xts (bitsliced, 16 blocks per AVX2 pass, many sectors per call)";
/// Name of the Serpent XTS without AVX2 (SSE2 on x86-64, else one block
/// at a time).
pub const SERPENT_XTS_NAME: &str =
    "serpent-xts (bitsliced, 8 blocks per SSE2 pass on x86-64, many sectors per call)";
/// Name of the Twofish XTS.
pub const TWOFISH_XTS_NAME: &str =
    "twofish-xts (key-dependent tables, 4 blocks interleaved, many sectors per call)";
/// Name of the Camellia XTS.
pub const CAMELLIA_XTS_NAME: &str =
    "camellia-xts (64-bit S-box/P tables, 4 blocks interleaved, many sectors per call)";
/// Name of the Kuznyechik XTS.
pub const KUZNYECHIK_XTS_NAME: &str =
    "kuznyechik-xts (RustCrypto kuznyechik under the hand-written XTS, many sectors per call)";
/// Name of the OpenSSL XTS implementation.
pub const OPENSSL_XTS_NAME: &str = "openssl-xts (vendored OpenSSL 3 EVP, per-sector IV re-init)";

/// Builds a chain mode over `cipher` (not cipher_null) for `key`: AES
/// through [`new_mode`], the other ciphers through this crate's own
/// Serpent, Twofish and Camellia (`choice` only matters for Serpent:
/// [`Provider::Rust`], or `UCRYPT_CRYPTO=rust` with `Auto`, keeps it on its
/// baseline kernel where the CPU has AVX2).
pub(crate) fn new_mode_for(
    cipher: crate::spec::BlockCipher,
    chain: crate::spec::ChainMode,
    key: &[u8],
    choice: Provider,
    unit: usize,
) -> Option<Box<dyn SectorCipher>> {
    use crate::spec::{BlockCipher, ChainMode};
    if cipher.block_size() == 8 {
        let p = legacy::Prim64::new(cipher, key)?;
        return match chain {
            ChainMode::Cbc => Some(Box::new(legacy::Cbc64(p))),
            ChainMode::Ecb => Some(Box::new(legacy::Ecb64(p))),
            ChainMode::Xts | ChainMode::Lrw => None,
        };
    }
    if cipher == BlockCipher::Aes {
        return new_mode(chain, key, choice, unit);
    }
    let portable = match choice {
        Provider::Rust => true,
        Provider::Auto => std::env::var("UCRYPT_CRYPTO").as_deref() == Ok("rust"),
        _ => false,
    };
    Some(match chain {
        ChainMode::Xts => Box::new(XtsRust::with(cipher, key, portable)?),
        ChainMode::Cbc => Box::new(Cbc(Prim::with(cipher, key, portable)?)),
        ChainMode::Ecb => Box::new(Ecb(Prim::with(cipher, key, portable)?)),
        ChainMode::Lrw => Box::new(legacy::Lrw::new(cipher, key, portable)?),
    })
}

/// Builds an AES chain mode for `key` (for XTS: data key || tweak key) that
/// will mostly see `unit`-byte sectors; `None` when the key length does not
/// fit the mode.
pub(crate) fn new_mode(
    chain: crate::spec::ChainMode,
    key: &[u8],
    choice: Provider,
    unit: usize,
) -> Option<Box<dyn SectorCipher>> {
    use crate::spec::ChainMode;
    if chain == ChainMode::Lrw {
        // No OpenSSL or AES-NI LRW: the hand-written one over `aes`.
        let l = legacy::Lrw::new(crate::spec::BlockCipher::Aes, key, false)?;
        return Some(Box::new(l));
    }
    let choice = match choice {
        Provider::Auto => match std::env::var("UCRYPT_CRYPTO").as_deref() {
            Ok("rust") => Provider::Rust,
            Ok("openssl") => Provider::OpenSsl,
            Ok("aesni") => Provider::AesNi,
            Ok("vaes") => Provider::Vaes,
            // On whole 4 KiB sectors OpenSSL's own XTS loop is as fast as
            // the 128-bit AES-NI kernel or faster (~5-8%), and with AVX-512
            // it runs 512-bit VAES; below 4 KiB its per-sector EVP cost
            // makes it lose. The 256-bit VAES kernel beats its AES-NI loop
            // at every size.
            _ if unit >= 4096 && (!wide_available() || avx512_available()) => Provider::OpenSsl,
            _ => Provider::Vaes,
        },
        c => c,
    };
    #[cfg(target_arch = "x86_64")]
    if chain == ChainMode::Xts && matches!(choice, Provider::AesNi | Provider::Vaes) {
        let fallback = Box::new(XtsRust::new(key)?);
        let x = match choice {
            Provider::Vaes => aesni::XtsAesni::new_wide(key, fallback)
                .or_else(|| aesni::XtsAesni::new(key, Box::new(XtsRust::new(key)?))),
            _ => aesni::XtsAesni::new(key, fallback),
        };
        if let Some(x) = x {
            return Some(Box::new(x));
        }
    }
    let choice = match choice {
        Provider::AesNi | Provider::Vaes => Provider::OpenSsl,
        c => c,
    };
    let (rust, mode): (Box<dyn SectorCipher>, evp::EvpMode) = match chain {
        ChainMode::Xts => (Box::new(XtsRust::new(key)?), evp::EvpMode::Xts),
        ChainMode::Cbc => (Box::new(Cbc(Prim::aes(key)?)), evp::EvpMode::Cbc),
        ChainMode::Ecb => (Box::new(Ecb(Prim::aes(key)?)), evp::EvpMode::Ecb),
        ChainMode::Lrw => return None,
    };
    if choice == Provider::OpenSsl {
        // `Evp::new` takes the fallback; rebuild it if OpenSSL declines.
        if let Some(e) = evp::Evp::new(mode, key, rust) {
            return Some(Box::new(e));
        }
        return new_mode(chain, key, Provider::Rust, unit);
    }
    Some(rust)
}

/// Whether the 256-bit VAES XTS kernels can run here.
fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return vaes::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether OpenSSL's AVX-512 XTS loop can run here (it needs VAES too).
fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("vaes");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `cipher_null`: copies data unchanged.
pub(crate) struct NullCipher;

impl SectorCipher for NullCipher {
    fn crypt_run(&self, _dir: Dir, _buf: &mut [u8], _unit: usize, _ivs: &[[u8; 16]]) {}

    fn name(&self) -> &'static str {
        "cipher_null"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openssl_and_rust_agree_and_roundtrip() {
        use crate::spec::ChainMode;
        for (chain, klen) in [
            (ChainMode::Xts, 64),
            (ChainMode::Xts, 32),
            (ChainMode::Cbc, 24),
            (ChainMode::Ecb, 16),
        ] {
            let key: Vec<u8> = (0..klen as u8).collect();
            let ossl = new_mode(chain, &key, Provider::OpenSsl, 4096).unwrap();
            assert!(
                ossl.name().starts_with("openssl"),
                "{chain:?}: {}",
                ossl.name()
            );
            let rust = new_mode(chain, &key, Provider::Rust, 4096).unwrap();
            assert!(rust.name().starts_with("rust"));
            let mut a: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
            let orig = a.clone();
            let mut b = a.clone();
            let ivs: Vec<[u8; 16]> = (0..2u64)
                .map(|i| {
                    let mut iv = [0u8; 16];
                    iv[..8].copy_from_slice(&(i + 9).to_le_bytes());
                    iv
                })
                .collect();
            ossl.crypt_run(Dir::Encrypt, &mut a, 4096, &ivs);
            rust.crypt_run(Dir::Encrypt, &mut b, 4096, &ivs);
            assert_eq!(a, b, "{chain:?}");
            assert_ne!(a, orig);
            rust.crypt_run(Dir::Decrypt, &mut b, 4096, &ivs);
            ossl.crypt_run(Dir::Decrypt, &mut a, 4096, &ivs);
            assert_eq!(a, orig);
            assert_eq!(b, orig);
        }
    }

    #[test]
    fn openssl_refuses_equal_halves_so_rust_is_used() {
        let key = [0x11u8; 64];
        let c = new_mode(crate::spec::ChainMode::Xts, &key, Provider::OpenSsl, 512).unwrap();
        assert_eq!(c.name(), RUST_XTS_NAME);
        let c = new_mode(
            crate::spec::ChainMode::Xts,
            &[3u8; 48],
            Provider::OpenSsl,
            512,
        )
        .unwrap();
        assert_eq!(c.name(), RUST_XTS_NAME, "OpenSSL has no AES-192-XTS");
    }
}
