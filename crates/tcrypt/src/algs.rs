//! The cipher chains TrueCrypt and VeraCrypt write, in the order
//! cryptsetup 2.6.1 tries them (`lib/tcrypt/tcrypt.c`), and the
//! decryption of the 448-byte encrypted header with each.
//!
//! XTS headers (data unit 0) are decrypted by `crypto::unit`, the data
//! path's own XTS. The legacy modes, which `crypto` does not have, are
//! hand-written here over RustCrypto block ciphers, one block per call
//! (the header is 28 blocks, decrypted once per candidate): LRW (the
//! kernel's `lrw`, block index 1 for the header), CBC with TrueCrypt's
//! whitening, and the "outer" CBC of old cascades (each block through
//! every cipher, then one chaining XOR).

use aes::cipher::{BlockCipherDecrypt, KeyInit};
use zeroize::Zeroizing;

use crate::{HDR_KEY_LEN, HDR_LEN};

/// The chain mode of a cipher chain, as cryptsetup names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `xts-plain64` (TrueCrypt 5+, VeraCrypt).
    Xts,
    /// `lrw-benbi` (TrueCrypt 4.1 to 4.3).
    Lrw,
    /// `cbc-tcw`: CBC with an IV seed and whitening (TrueCrypt before 4.1).
    CbcTcw,
    /// `cbci-tcrypt`: cascades in "inner" CBC; no kernel mapping exists.
    CbciTcrypt,
    /// `cbc-tcrypt`: Blowfish (little-endian) chains; no kernel mapping.
    CbcTcrypt,
}

impl Mode {
    /// The mode as cryptsetup prints it (`Cipher mode:`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Xts => "xts-plain64",
            Self::Lrw => "lrw-benbi",
            Self::CbcTcw => "cbc-tcw",
            Self::CbciTcrypt => "cbci-tcrypt",
            Self::CbcTcrypt => "cbc-tcrypt",
        }
    }

    /// True for the modes only TrueCrypt before 5.0 wrote.
    pub fn legacy(self) -> bool {
        matches!(self, Self::CbcTcw | Self::CbciTcrypt | Self::CbcTcrypt)
    }
}

/// One cipher of a chain and where its key material sits in the header's
/// key area.
#[derive(Clone, Copy, Debug)]
pub struct Alg {
    /// Cipher name (`aes`, `serpent`, …, `blowfish_le`).
    pub name: &'static str,
    /// Key bytes the mapping's cipher takes (both XTS halves, LRW key +
    /// tweak key, or the CBC key).
    pub key_size: usize,
    /// Block size.
    pub block: usize,
    /// Offset of the (first) key in the key area.
    pub key_offset: usize,
    /// XTS: offset of the tweak key; CBC: offset of the IV seed.
    pub iv_offset: usize,
    /// CBC: IV seed + whitening bytes copied after the key.
    pub key_extra: usize,
}

/// A cipher chain: one to three ciphers applied in order on write.
#[derive(Clone, Copy, Debug)]
pub struct Chain {
    /// Only tried with legacy modes allowed (cryptsetup's CLI always does).
    pub legacy: bool,
    /// The chain's name (`aes`, `serpent-twofish-aes`, …).
    pub name: &'static str,
    /// Its mode.
    pub mode: Mode,
    /// Bytes of key material the chain uses (`MK bits` / 8).
    pub key_size: usize,
    /// The ciphers, first applied on write first.
    pub ciphers: &'static [Alg],
}

const fn a(
    name: &'static str,
    key_size: usize,
    block: usize,
    key_offset: usize,
    iv_offset: usize,
) -> Alg {
    Alg {
        name,
        key_size,
        block,
        key_offset,
        iv_offset,
        key_extra: 0,
    }
}

const fn ax(
    name: &'static str,
    key_size: usize,
    block: usize,
    key_offset: usize,
    key_extra: usize,
) -> Alg {
    Alg {
        name,
        key_size,
        block,
        key_offset,
        iv_offset: 0,
        key_extra,
    }
}

const fn c(
    legacy: bool,
    name: &'static str,
    mode: Mode,
    key_size: usize,
    ciphers: &'static [Alg],
) -> Chain {
    Chain {
        legacy,
        name,
        mode,
        key_size,
        ciphers,
    }
}

/// Every chain, in cryptsetup's order (the first one whose header
/// decrypts to a valid magic wins).
pub static CHAINS: &[Chain] = &[
    // XTS: each cipher's data key then, after all data keys, its tweak key.
    c(false, "aes", Mode::Xts, 64, &[a("aes", 64, 16, 0, 32)]),
    c(
        false,
        "serpent",
        Mode::Xts,
        64,
        &[a("serpent", 64, 16, 0, 32)],
    ),
    c(
        false,
        "twofish",
        Mode::Xts,
        64,
        &[a("twofish", 64, 16, 0, 32)],
    ),
    c(
        false,
        "twofish-aes",
        Mode::Xts,
        128,
        &[a("twofish", 64, 16, 0, 64), a("aes", 64, 16, 32, 96)],
    ),
    c(
        false,
        "serpent-twofish-aes",
        Mode::Xts,
        192,
        &[
            a("serpent", 64, 16, 0, 96),
            a("twofish", 64, 16, 32, 128),
            a("aes", 64, 16, 64, 160),
        ],
    ),
    c(
        false,
        "aes-serpent",
        Mode::Xts,
        128,
        &[a("aes", 64, 16, 0, 64), a("serpent", 64, 16, 32, 96)],
    ),
    c(
        false,
        "aes-twofish-serpent",
        Mode::Xts,
        192,
        &[
            a("aes", 64, 16, 0, 96),
            a("twofish", 64, 16, 32, 128),
            a("serpent", 64, 16, 64, 160),
        ],
    ),
    c(
        false,
        "serpent-twofish",
        Mode::Xts,
        128,
        &[a("serpent", 64, 16, 0, 64), a("twofish", 64, 16, 32, 96)],
    ),
    c(
        false,
        "camellia",
        Mode::Xts,
        64,
        &[a("camellia", 64, 16, 0, 32)],
    ),
    c(
        false,
        "kuznyechik",
        Mode::Xts,
        64,
        &[a("kuznyechik", 64, 16, 0, 32)],
    ),
    c(
        false,
        "kuznyechik-camellia",
        Mode::Xts,
        128,
        &[
            a("kuznyechik", 64, 16, 0, 64),
            a("camellia", 64, 16, 32, 96),
        ],
    ),
    c(
        false,
        "twofish-kuznyechik",
        Mode::Xts,
        128,
        &[a("twofish", 64, 16, 0, 64), a("kuznyechik", 64, 16, 32, 96)],
    ),
    c(
        false,
        "serpent-camellia",
        Mode::Xts,
        128,
        &[a("serpent", 64, 16, 0, 64), a("camellia", 64, 16, 32, 96)],
    ),
    c(
        false,
        "aes-kuznyechik",
        Mode::Xts,
        128,
        &[a("aes", 64, 16, 0, 64), a("kuznyechik", 64, 16, 32, 96)],
    ),
    c(
        false,
        "camellia-serpent-kuznyechik",
        Mode::Xts,
        192,
        &[
            a("camellia", 64, 16, 0, 96),
            a("serpent", 64, 16, 32, 128),
            a("kuznyechik", 64, 16, 64, 160),
        ],
    ),
    // LRW: the key after the first 32 bytes, the tweak key the area's
    // first 16 bytes.
    c(false, "aes", Mode::Lrw, 48, &[a("aes", 48, 16, 32, 0)]),
    c(
        false,
        "serpent",
        Mode::Lrw,
        48,
        &[a("serpent", 48, 16, 32, 0)],
    ),
    c(
        false,
        "twofish",
        Mode::Lrw,
        48,
        &[a("twofish", 48, 16, 32, 0)],
    ),
    c(
        false,
        "twofish-aes",
        Mode::Lrw,
        96,
        &[a("twofish", 48, 16, 32, 0), a("aes", 48, 16, 64, 0)],
    ),
    c(
        false,
        "serpent-twofish-aes",
        Mode::Lrw,
        144,
        &[
            a("serpent", 48, 16, 32, 0),
            a("twofish", 48, 16, 64, 0),
            a("aes", 48, 16, 96, 0),
        ],
    ),
    c(
        false,
        "aes-serpent",
        Mode::Lrw,
        96,
        &[a("aes", 48, 16, 32, 0), a("serpent", 48, 16, 64, 0)],
    ),
    c(
        false,
        "aes-twofish-serpent",
        Mode::Lrw,
        144,
        &[
            a("aes", 48, 16, 32, 0),
            a("twofish", 48, 16, 64, 0),
            a("serpent", 48, 16, 96, 0),
        ],
    ),
    c(
        false,
        "serpent-twofish",
        Mode::Lrw,
        96,
        &[a("serpent", 48, 16, 32, 0), a("twofish", 48, 16, 64, 0)],
    ),
    // CBC: key, then IV seed + whitening (the last cipher of a chain
    // carries them).
    c(true, "aes", Mode::CbcTcw, 64, &[ax("aes", 32, 16, 32, 32)]),
    c(
        true,
        "serpent",
        Mode::CbcTcw,
        64,
        &[ax("serpent", 32, 16, 32, 32)],
    ),
    c(
        true,
        "twofish",
        Mode::CbcTcw,
        64,
        &[ax("twofish", 32, 16, 32, 32)],
    ),
    c(
        true,
        "twofish-aes",
        Mode::CbciTcrypt,
        96,
        &[ax("twofish", 32, 16, 32, 0), ax("aes", 32, 16, 64, 32)],
    ),
    c(
        true,
        "serpent-twofish-aes",
        Mode::CbciTcrypt,
        128,
        &[
            ax("serpent", 32, 16, 32, 0),
            ax("twofish", 32, 16, 64, 0),
            ax("aes", 32, 16, 96, 32),
        ],
    ),
    c(
        true,
        "aes-serpent",
        Mode::CbciTcrypt,
        96,
        &[ax("aes", 32, 16, 32, 0), ax("serpent", 32, 16, 64, 32)],
    ),
    c(
        true,
        "aes-twofish-serpent",
        Mode::CbciTcrypt,
        128,
        &[
            ax("aes", 32, 16, 32, 0),
            ax("twofish", 32, 16, 64, 0),
            ax("serpent", 32, 16, 96, 32),
        ],
    ),
    c(
        true,
        "serpent-twofish",
        Mode::CbciTcrypt,
        96,
        &[ax("serpent", 32, 16, 32, 0), ax("twofish", 32, 16, 64, 32)],
    ),
    c(
        true,
        "cast5",
        Mode::CbcTcw,
        40,
        &[ax("cast5", 16, 8, 32, 24)],
    ),
    c(
        true,
        "des3_ede",
        Mode::CbcTcw,
        48,
        &[ax("des3_ede", 24, 8, 32, 24)],
    ),
    c(
        true,
        "blowfish_le",
        Mode::CbcTcrypt,
        80,
        &[ax("blowfish_le", 56, 8, 32, 24)],
    ),
    c(
        true,
        "blowfish_le-aes",
        Mode::CbcTcrypt,
        120,
        &[ax("blowfish_le", 56, 8, 32, 0), ax("aes", 32, 16, 88, 32)],
    ),
    c(
        true,
        "serpent-blowfish_le-aes",
        Mode::CbcTcrypt,
        152,
        &[
            ax("serpent", 32, 16, 32, 0),
            ax("blowfish_le", 56, 8, 64, 0),
            ax("aes", 32, 16, 120, 32),
        ],
    ),
];

/// Finds a chain by name and mode.
pub fn find(name: &str, mode: Mode) -> Option<&'static Chain> {
    CHAINS.iter().find(|c| c.name == name && c.mode == mode)
}

/// The key of `alg` as its mapping takes it, cut from the key area `key`
/// (cryptsetup's `TCRYPT_copy_key`): XTS data key half + tweak key half,
/// LRW key + the area's first 16 bytes, CBC key + IV seed and whitening.
pub fn mapping_key(alg: &Alg, mode: Mode, key: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(alg.key_size + alg.key_extra));
    let take = |from: usize, n: usize| key.get(from..from + n).unwrap_or(&[]);
    match mode {
        Mode::Xts => {
            let half = alg.key_size / 2;
            out.extend_from_slice(take(alg.key_offset, half));
            out.extend_from_slice(take(alg.iv_offset, half));
        }
        Mode::Lrw => {
            out.extend_from_slice(take(alg.key_offset, alg.key_size - 16));
            out.extend_from_slice(take(0, 16));
        }
        Mode::CbcTcw | Mode::CbciTcrypt | Mode::CbcTcrypt => {
            out.extend_from_slice(take(alg.key_offset, alg.key_size));
            out.extend_from_slice(take(alg.iv_offset, alg.key_extra));
        }
    }
    out
}

/// A block cipher keyed once, one block per call (8 or 16 bytes); the
/// legacy header modes only decrypt.
trait Block {
    fn decrypt(&self, b: &mut [u8]);
}

struct Rc<C>(C);

fn decrypt_with<C: BlockCipherDecrypt>(c: &C, b: &mut [u8]) {
    if let Ok(mut blk) = aes::cipher::Block::<C>::try_from(&b[..]) {
        c.decrypt_block(&mut blk);
        b.copy_from_slice(&blk);
    }
}

impl<C: BlockCipherDecrypt> Block for Rc<C> {
    fn decrypt(&self, b: &mut [u8]) {
        decrypt_with(&self.0, b);
    }
}

/// Blowfish as TrueCrypt wrote it: each 32-bit half little-endian (the
/// kernel and RustCrypto read them big-endian).
struct BlowfishLe(blowfish::Blowfish);

fn swab(b: &mut [u8]) {
    b[..4].reverse();
    b[4..8].reverse();
}

impl Block for BlowfishLe {
    fn decrypt(&self, b: &mut [u8]) {
        swab(b);
        decrypt_with(&self.0, b);
        swab(b);
    }
}

fn keyed<C: KeyInit + BlockCipherDecrypt + 'static>(key: &[u8]) -> Option<Box<dyn Block>> {
    Some(Box::new(Rc(C::new_from_slice(key).ok()?)))
}

/// `name` keyed with `key`; `None` for an unknown name or key length.
fn block_cipher(name: &str, key: &[u8]) -> Option<Box<dyn Block>> {
    match (name, key.len()) {
        ("aes", 16) => keyed::<aes::Aes128>(key),
        ("aes", 24) => keyed::<aes::Aes192>(key),
        ("aes", 32) => keyed::<aes::Aes256>(key),
        ("serpent", _) => keyed::<serpent::Serpent>(key),
        ("twofish", _) => keyed::<twofish::Twofish>(key),
        ("camellia", 16) => keyed::<camellia::Camellia128>(key),
        ("camellia", 24) => keyed::<camellia::Camellia192>(key),
        ("camellia", 32) => keyed::<camellia::Camellia256>(key),
        ("kuznyechik", 32) => keyed::<kuznyechik::Kuznyechik>(key),
        ("cast5", _) => keyed::<cast5::Cast5>(key),
        ("des3_ede", 24) => keyed::<des::TdesEde3>(key),
        ("blowfish_le", _) => Some(Box::new(BlowfishLe(
            blowfish::Blowfish::new_from_slice(key).ok()?,
        ))),
        _ => None,
    }
}

/// Multiplies by x in GF(2^128), little-endian (XTS's alpha).
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ if t >> 127 != 0 { 0x87 } else { 0 }
}

/// Multiplies in GF(2^128) with the kernel's `gf128mul_bbe` convention
/// (big-endian bytes, x^0 the lowest bit of the last byte), LRW's field.
fn gf_mul_bbe(a: u128, b: u128) -> u128 {
    let (mut r, mut a) = (0u128, a);
    for i in 0..128 {
        if (b >> i) & 1 != 0 {
            r ^= a;
        }
        a = mul_alpha(a);
    }
    r
}

/// Decrypts the header's encrypted part (`buf`, [`HDR_LEN`] bytes) with
/// `chain` keyed from the derived header key `key` (192 bytes). False
/// for a shorter key or a cipher refusing its key (never for the table
/// above).
pub fn decrypt_header(chain: &Chain, key: &[u8], buf: &mut [u8]) -> bool {
    if buf.len() != HDR_LEN || key.len() < HDR_KEY_LEN {
        return false;
    }
    if chain.mode == Mode::CbciTcrypt {
        return decrypt_cbci(chain, key, buf);
    }
    // One layer after another, the last-applied cipher first (CBC
    // layers each remove the whitening, as cryptsetup does).
    for alg in chain.ciphers.iter().rev() {
        if !decrypt_one(alg, chain.mode, key, buf) {
            return false;
        }
    }
    true
}

fn decrypt_one(alg: &Alg, mode: Mode, key: &[u8], buf: &mut [u8]) -> bool {
    let k = mapping_key(alg, mode, key);
    match mode {
        Mode::Xts => {
            // One XTS data unit, tweak 0: crypto's own XTS, as for the data.
            let spec = format!("{}-xts-plain64", alg.name);
            crypto::unit::decrypt(&spec, &k[..alg.key_size], [0; 16], buf).is_some()
        }
        Mode::Lrw => {
            let ks = alg.key_size - 16;
            let Some(data) = block_cipher(alg.name, &k[..ks]) else {
                return false;
            };
            let mut t2 = [0u8; 16];
            t2.copy_from_slice(&k[ks..ks + 16]);
            let k2 = u128::from_be_bytes(t2);
            // The header is data unit 1: block index 1, 2, ...
            for (i, b) in buf.chunks_exact_mut(16).enumerate() {
                let t = gf_mul_bbe(k2, i as u128 + 1).to_be_bytes();
                xor(b, &t);
                data.decrypt(b);
                xor(b, &t);
            }
            true
        }
        Mode::CbcTcw | Mode::CbcTcrypt | Mode::CbciTcrypt => {
            remove_whitening(buf, key);
            let Some(cipher) = block_cipher(alg.name, &k[..alg.key_size]) else {
                return false;
            };
            let bs = alg.block;
            let mut iv = Zeroizing::new(key[alg.iv_offset..alg.iv_offset + bs].to_vec());
            let mut prev = Zeroizing::new(vec![0u8; bs]);
            for b in buf.chunks_exact_mut(bs) {
                prev.copy_from_slice(b);
                cipher.decrypt(b);
                xor(b, &iv);
                iv.copy_from_slice(&prev);
            }
            true
        }
    }
}

/// TrueCrypt's whitening: the header XORed with 8 bytes of the key area.
fn remove_whitening(buf: &mut [u8], key: &[u8]) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b ^= key[8 + j % 8];
    }
}

/// The "outer" CBC of old cascades: every block through all ciphers
/// (last-applied first), then one chaining XOR.
fn decrypt_cbci(chain: &Chain, key: &[u8], buf: &mut [u8]) -> bool {
    remove_whitening(buf, key);
    let mut ciphers = Vec::with_capacity(chain.ciphers.len());
    for alg in chain.ciphers {
        match block_cipher(
            alg.name,
            &key[alg.key_offset..alg.key_offset + alg.key_size],
        ) {
            Some(c) => ciphers.push(c),
            None => return false,
        }
    }
    let bs = chain.ciphers[0].block;
    let first = chain.ciphers[0].iv_offset;
    let mut iv = Zeroizing::new(key[first..first + bs].to_vec());
    let mut prev = Zeroizing::new(vec![0u8; bs]);
    for b in buf.chunks_exact_mut(bs) {
        prev.copy_from_slice(b);
        for (alg, c) in chain.ciphers.iter().zip(&ciphers).rev() {
            // A 16-byte block through an 8-byte cipher: both halves.
            for part in b.chunks_exact_mut(alg.block) {
                c.decrypt(part);
            }
        }
        xor(b, &iv);
        iv.copy_from_slice(&prev);
    }
    true
}

fn xor(b: &mut [u8], k: &[u8]) {
    for (x, y) in b.iter_mut().zip(k) {
        *x ^= y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chain_has_its_keys_inside_the_key_area() {
        for c in CHAINS {
            for alg in c.ciphers {
                let key = vec![7u8; crate::KEY_AREA_LEN];
                let k = mapping_key(alg, c.mode, &key);
                assert_eq!(
                    k.len(),
                    alg.key_size + alg.key_extra,
                    "{} {:?}",
                    c.name,
                    c.mode
                );
                assert!(
                    block_cipher(
                        alg.name,
                        &k[..if c.mode == Mode::Xts {
                            alg.key_size / 2
                        } else if c.mode == Mode::Lrw {
                            alg.key_size - 16
                        } else {
                            alg.key_size
                        }]
                    )
                    .is_some(),
                    "{}",
                    alg.name
                );
            }
        }
    }

    #[test]
    fn lrw_field_is_the_kernels() {
        // x * x = x^2; x^127 * x wraps to the polynomial's low terms.
        assert_eq!(gf_mul_bbe(2, 2), 4);
        assert_eq!(gf_mul_bbe(1 << 127, 2), 0x87);
        assert_eq!(gf_mul_bbe(0x1234, 1), 0x1234);
    }
}
