//! dm-crypt cipher specifications, parsed the way `drivers/md/dm-crypt.c`
//! parses them (hand-written parser, never panics on any input).
//!
//! Two forms exist:
//!
//! ```text
//! legacy:  cipher[:keycount]-chainmode-ivmode[:ivopts]   aes-xts-plain64, aes:2-cbc-essiv:sha256
//! capi:    capi:chainmode(cipher)[-ivmode[:ivopts]]      capi:xts(aes)-plain64, capi:ecb(cipher_null)
//! ```
//!
//! Kernel quirks kept on purpose: a bare cipher name (`aes`) or `aes-plain`
//! means `aes-cbc-plain`; every chain mode except ECB needs an IV mode; ECB
//! has no IV, so an IV mode given with it is ignored (the kernel only warns);
//! `ivopts` of IV modes other than ESSIV are ignored.

use std::fmt;

use crate::error;
use crate::Error;

/// The block cipher under the chain mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockCipher {
    /// AES; the key length picks AES-128/192/256.
    Aes,
    /// Serpent (the kernel's `serpent`, NESSIE byte order); 128-, 192- or
    /// 256-bit keys.
    Serpent,
    /// Twofish; 128-, 192- or 256-bit keys.
    Twofish,
    /// Camellia (RFC 3713); 128-, 192- or 256-bit keys.
    Camellia,
    /// Kuznyechik (GOST R 34.12-2015); 256-bit keys only.
    Kuznyechik,
    /// CAST5 (RFC 2144), 8-byte blocks, 40- to 128-bit keys: TrueCrypt's
    /// legacy `cbc-tcw` volumes; CBC and ECB only.
    Cast5,
    /// Triple DES (EDE, three keys), 8-byte blocks: TrueCrypt's legacy
    /// `cbc-tcw` volumes; CBC and ECB only.
    Des3Ede,
    /// `cipher_null`: no key, data is copied unchanged.
    Null,
}

impl BlockCipher {
    /// The name in a cipher spec (`aes`, `serpent`, …, `cipher_null`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Aes => "aes",
            Self::Serpent => "serpent",
            Self::Twofish => "twofish",
            Self::Camellia => "camellia",
            Self::Kuznyechik => "kuznyechik",
            Self::Cast5 => "cast5",
            Self::Des3Ede => "des3_ede",
            Self::Null => "cipher_null",
        }
    }

    /// Block size in bytes (8 for CAST5 and Triple DES, else 16;
    /// `cipher_null` has none).
    pub fn block_size(self) -> usize {
        match self {
            Self::Cast5 | Self::Des3Ede => 8,
            Self::Null => 0,
            _ => 16,
        }
    }

    /// The name in prose (`AES`, `Serpent`, `Twofish`, `Camellia`, `cipher_null`).
    pub fn title(self) -> &'static str {
        match self {
            Self::Aes => "AES",
            Self::Serpent => "Serpent",
            Self::Twofish => "Twofish",
            Self::Camellia => "Camellia",
            Self::Kuznyechik => "Kuznyechik",
            Self::Cast5 => "CAST5",
            Self::Des3Ede => "Triple DES",
            Self::Null => "cipher_null",
        }
    }
}

/// How blocks inside one sector are chained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainMode {
    /// XTS (IEEE 1619); the key holds the data key then the tweak key.
    Xts,
    /// CBC with the sector IV.
    Cbc,
    /// ECB: no IV at all.
    Ecb,
    /// LRW (the kernel's `lrw`): the key holds the data key then a 16-byte
    /// tweak key; the IV is the big-endian index of the sector's first
    /// block (with `benbi`, as TrueCrypt 4 volumes use it).
    Lrw,
}

/// Hash used by ESSIV to derive the IV key from the volume key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EssivHash {
    /// MD5 (16-byte digest: an AES-128 IV key).
    Md5,
    /// SHA-1 (20 bytes: not a valid AES key, refused as by the kernel).
    Sha1,
    /// SHA-224 (28 bytes: refused with AES).
    Sha224,
    /// SHA-256 (32 bytes: an AES-256 IV key).
    Sha256,
    /// SHA-384 (48 bytes: refused with AES).
    Sha384,
    /// SHA-512 (64 bytes: refused with AES).
    Sha512,
}

impl EssivHash {
    /// Parses the kernel crypto API hash name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "md5" => Self::Md5,
            "sha1" => Self::Sha1,
            "sha224" => Self::Sha224,
            "sha256" => Self::Sha256,
            "sha384" => Self::Sha384,
            "sha512" => Self::Sha512,
            _ => return None,
        })
    }

    /// The kernel crypto API name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Md5 => "md5",
            Self::Sha1 => "sha1",
            Self::Sha224 => "sha224",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }

    /// Digest length in bytes (the ESSIV cipher's key length).
    pub fn digest_len(self) -> usize {
        match self {
            Self::Md5 => 16,
            Self::Sha1 => 20,
            Self::Sha224 => 28,
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }
}

/// IV generator (see the table in dm-crypt.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IvMode {
    /// No IV (ECB, or a cipher without IVs).
    None,
    /// 32-bit little-endian sector number.
    Plain,
    /// 64-bit little-endian sector number.
    Plain64,
    /// 64-bit big-endian sector number in the last 8 IV bytes.
    Plain64Be,
    /// plain64 encrypted with a key hashed from the volume key.
    Essiv(EssivHash),
    /// 64-bit big-endian count of cipher blocks, starting at 1.
    Benbi,
    /// All-zero IV.
    Null,
    /// Encrypted byte offset (BitLocker).
    Eboiv,
    /// `eboiv` plus BitLocker's Elephant diffuser: the second half of the
    /// key keys the sector key, the first half the chain mode.
    Elephant,
    /// TrueCrypt's legacy CBC (dm-crypt's `tcw`): the key ends with an IV
    /// seed (one block) and 16 whitening bytes; the IV is the seed XOR
    /// the sector number, and the ciphertext is XORed with a whitening
    /// value made from the sector number and CRC-32 (512-byte sectors,
    /// one key, CBC only).
    Tcw,
}

/// A parsed cipher spec. `Display` gives back the text it was parsed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CipherSpec {
    /// Block cipher.
    pub cipher: BlockCipher,
    /// Number of keys (`cipher:N`); the key is split into this many parts
    /// and sector `s` uses part `s & (N - 1)`.
    pub key_count: u32,
    /// Chain mode.
    pub chain: ChainMode,
    /// IV generator (already [`IvMode::None`] where the mode has no IV).
    pub iv: IvMode,
    /// Whether the spec used the `capi:` form.
    pub capi: bool,
    text: String,
}

impl CipherSpec {
    /// Parses a dm-crypt cipher spec. Errors use the kernel's reason text
    /// where the kernel has one.
    pub fn parse(text: &str) -> Result<Self, Error> {
        if text.is_empty() {
            return Err(error::spec("Bad cipher specification: empty cipher"));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(error::spec(format!(
                "Bad cipher specification {:?}: contains whitespace",
                text
            )));
        }
        let parts = if let Some(rest) = text.strip_prefix("capi:") {
            parse_capi(text, rest)?
        } else {
            parse_legacy(text)?
        };
        let Parts {
            cipher,
            key_count,
            chain,
            ivmode,
            ivopts,
            capi,
        } = parts;
        let cipher = match cipher {
            "aes" => BlockCipher::Aes,
            "serpent" => BlockCipher::Serpent,
            "twofish" => BlockCipher::Twofish,
            "camellia" => BlockCipher::Camellia,
            "kuznyechik" => BlockCipher::Kuznyechik,
            "cast5" => BlockCipher::Cast5,
            "des3_ede" => BlockCipher::Des3Ede,
            "cipher_null" => BlockCipher::Null,
            "" => return Err(alloc_error(text, "empty cipher name")),
            other => {
                if KNOWN_KERNEL_CIPHERS.contains(&other) {
                    return Err(error::unsupported(format!(
                        "Cipher {other:?} (in {text:?}) is not supported yet; use aes, serpent, twofish, camellia, kuznyechik or cipher_null"
                    )));
                }
                return Err(alloc_error(text, &format!("unknown cipher {other:?}")));
            }
        };
        let chain = match chain {
            "xts" => ChainMode::Xts,
            "cbc" => ChainMode::Cbc,
            "ecb" => ChainMode::Ecb,
            "lrw" => ChainMode::Lrw,
            "" => return Err(alloc_error(text, "empty chain mode")),
            other => {
                if KNOWN_KERNEL_MODES.contains(&other) {
                    return Err(error::unsupported(format!(
                        "Chain mode {other:?} (in {text:?}) is not supported yet; use xts, cbc, ecb or lrw"
                    )));
                }
                return Err(alloc_error(text, &format!("unknown chain mode {other:?}")));
            }
        };
        if cipher == BlockCipher::Null && chain != ChainMode::Ecb {
            return Err(error::unsupported(format!(
                "Cipher {text:?}: cipher_null is supported with ecb only"
            )));
        }
        // XTS and LRW are defined over 16-byte blocks only (the kernel's
        // templates refuse other ciphers).
        if cipher.block_size() == 8 && matches!(chain, ChainMode::Xts | ChainMode::Lrw) {
            return Err(alloc_error(
                text,
                &format!("{} has 8-byte blocks", cipher.title()),
            ));
        }
        let has_iv = cipher != BlockCipher::Null && chain != ChainMode::Ecb;
        // ESSIV is built as the essiv(chain(cipher),hash) template, which
        // needs an IV as wide as the cipher block: ECB cannot have one.
        if ivmode == Some("essiv") {
            let Some(hash) = ivopts else {
                return Err(error::spec(format!(
                    "Digest algorithm missing for ESSIV mode in {text:?}"
                )));
            };
            if !has_iv {
                return Err(alloc_error(text, "ESSIV needs a chain mode with an IV"));
            }
            let Some(h) = EssivHash::from_name(hash) else {
                return Err(alloc_error(text, &format!("unknown ESSIV hash {hash:?}")));
            };
            // essiv(): the digest must fit the cipher's key size range.
            if h.digest_len() < 16 || h.digest_len() > 32 {
                return Err(alloc_error(
                    text,
                    &format!(
                        "the {}-byte {} digest is no valid {} key for ESSIV",
                        h.digest_len(),
                        h.name(),
                        cipher.title()
                    ),
                ));
            }
        }
        let iv = if !has_iv {
            // "Selected cipher does not support IVs": the kernel ignores it.
            IvMode::None
        } else {
            match ivmode {
                None => {
                    return Err(error::spec(format!("IV mechanism required in {text:?}")));
                }
                Some("plain") => IvMode::Plain,
                Some("plain64") => IvMode::Plain64,
                Some("plain64be") => IvMode::Plain64Be,
                Some("essiv") => {
                    // Checked above: ivopts is present and a known hash.
                    match ivopts.and_then(EssivHash::from_name) {
                        Some(h) => IvMode::Essiv(h),
                        None => return Err(error::spec("Invalid IV mode")),
                    }
                }
                Some("benbi") => IvMode::Benbi,
                Some("null") => IvMode::Null,
                Some("eboiv") => IvMode::Eboiv,
                Some("elephant") => {
                    // The kernel keys its sector-key cipher as ecb(aes).
                    if cipher != BlockCipher::Aes || key_count != 1 {
                        return Err(error::unsupported(format!(
                            "IV mode \"elephant\" (in {text:?}) needs aes with one key"
                        )));
                    }
                    IvMode::Elephant
                }
                Some("tcw") => {
                    if chain != ChainMode::Cbc || key_count != 1 {
                        return Err(error::unsupported(format!(
                            "IV mode \"tcw\" (in {text:?}) needs cbc with one key"
                        )));
                    }
                    IvMode::Tcw
                }
                Some(m @ ("lmk" | "random")) => {
                    return Err(error::unsupported(format!(
                        "IV mode {m:?} (in {text:?}) is not supported yet"
                    )));
                }
                Some(other) => {
                    return Err(error::spec(format!(
                        "Invalid IV mode {other:?} in {text:?}"
                    )));
                }
            }
        };
        // The 8-byte-block ciphers take the IV modes whose 8-byte IV is
        // the 16-byte one cut short (the others scale with the block size
        // or key a second cipher).
        if cipher.block_size() == 8
            && !matches!(
                iv,
                IvMode::None | IvMode::Plain | IvMode::Plain64 | IvMode::Null | IvMode::Tcw
            )
        {
            return Err(error::unsupported(format!(
                "{} (in {text:?}) is supported with the plain, plain64, null and tcw IV modes only",
                cipher.title()
            )));
        }
        Ok(Self {
            cipher,
            key_count,
            chain,
            iv,
            capi,
            text: text.to_owned(),
        })
    }

    /// The spec text as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// IV size in bytes: the cipher's block size with an IV-taking chain
    /// mode, else 0.
    pub fn iv_size(&self) -> usize {
        if self.chain != ChainMode::Ecb {
            self.cipher.block_size()
        } else {
            0
        }
    }

    /// Bytes at the end of the key that key the IV generator, not the
    /// cipher (dm-crypt's `key_extra_size` for `tcw`: IV seed and
    /// whitening; `elephant`'s half is counted in
    /// [`CipherSpec::subkey_sizes`]).
    pub fn key_extra_size(&self) -> usize {
        if self.iv == IvMode::Tcw {
            self.iv_size() + TCW_WHITENING_SIZE
        } else {
            0
        }
    }

    /// Valid lengths of one key part (one `keycount` share) in bytes.
    pub fn subkey_sizes(&self) -> Vec<usize> {
        if self.iv == IvMode::Elephant {
            // Chain-mode key and Elephant key of the same size.
            return vec![32, 48, 64];
        }
        let cipher: Vec<usize> = match (self.cipher, self.chain) {
            (BlockCipher::Null, _) => vec![0],
            (BlockCipher::Kuznyechik, ChainMode::Xts) => vec![64],
            (BlockCipher::Kuznyechik, ChainMode::Lrw) => vec![48],
            (BlockCipher::Kuznyechik, _) => vec![32],
            (BlockCipher::Cast5, _) => (5..=16).collect(),
            (BlockCipher::Des3Ede, _) => vec![24],
            (_, ChainMode::Xts) => vec![32, 48, 64],
            // The cipher key, then LRW's 16-byte tweak key.
            (_, ChainMode::Lrw) => vec![32, 40, 48],
            (_, _) => vec![16, 24, 32],
        };
        let extra = self.key_extra_size();
        cipher.into_iter().map(|k| k + extra).collect()
    }

    /// Checks a whole key's length against the spec; the message explains
    /// what would fit.
    pub fn check_key_len(&self, len: usize) -> Result<(), Error> {
        let n = self.key_count as usize;
        let sizes = self.subkey_sizes();
        if len % n == 0 && sizes.contains(&(len / n)) {
            return Ok(());
        }
        let fit: Vec<String> = sizes.iter().map(|s| (s * n * 8).to_string()).collect();
        Err(error::key(format!(
            "Error decoding and setting key: {} needs a key of {} bits, got {} bits",
            self.text,
            fit.join(", "),
            len * 8
        )))
    }
}

impl fmt::Display for CipherSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for CipherSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

/// Bytes of `tcw`'s whitening value at the end of the key (dm-crypt's
/// `TCW_WHITENING_SIZE`).
pub const TCW_WHITENING_SIZE: usize = 16;

/// Ciphers the kernel knows but ucrypt does not implement (clearer error).
const KNOWN_KERNEL_CIPHERS: &[&str] = &["cast6", "des", "blowfish", "sm4", "aria", "adiantum"];
/// Chain modes the kernel knows but ucrypt does not implement.
const KNOWN_KERNEL_MODES: &[&str] = &["ctr", "cts", "pcbc", "ofb", "cfb", "gcm", "ccm", "hctr2"];

struct Parts<'a> {
    cipher: &'a str,
    key_count: u32,
    chain: &'a str,
    ivmode: Option<&'a str>,
    ivopts: Option<&'a str>,
    capi: bool,
}

fn alloc_error(text: &str, why: &str) -> Error {
    error::spec(format!("Error allocating crypto tfm for {text:?}: {why}"))
}

/// `cipher[:keycount]-chainmode-ivmode[:ivopts]`, split like crypt_ctr_cipher_old.
fn parse_legacy(text: &str) -> Result<Parts<'_>, Error> {
    if text.contains('(') {
        return Err(error::spec(format!("Bad cipher specification {text:?}")));
    }
    let (head, tail) = split_once_opt(text, '-');
    let (cipher, keycount) = split_once_opt(head, ':');
    let key_count = match keycount {
        None => 1,
        Some(k) => parse_key_count(k).ok_or_else(|| {
            error::spec(format!("Bad cipher key count specification in {text:?}"))
        })?,
    };
    let (chain, tail) = match tail {
        None => (None, None),
        Some(t) => {
            let (c, rest) = split_once_opt(t, '-');
            (Some(c), rest)
        }
    };
    let (mut ivmode, ivopts) = match tail {
        None => (None, None),
        Some(t) => {
            let (m, o) = split_once_opt(t, ':');
            (Some(m), o)
        }
    };
    let chain = match chain {
        None => {
            ivmode = Some("plain");
            "cbc"
        }
        Some("plain") if ivmode.is_none() => {
            ivmode = Some("plain");
            "cbc"
        }
        Some(c) => c,
    };
    Ok(Parts {
        cipher,
        key_count,
        chain,
        ivmode,
        ivopts,
        capi: false,
    })
}

/// `capi:mode(cipher)[-ivmode[:ivopts]]`, split like crypt_ctr_cipher_new
/// (IV options after the last ':', IV mode after the last '-').
fn parse_capi<'a>(text: &'a str, rest: &'a str) -> Result<Parts<'a>, Error> {
    let (rest, ivopts) = match rest.rfind(':') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let (api, ivmode) = match rest.rfind('-') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if ivmode.is_none() && ivopts.is_some() {
        return Err(alloc_error(text, "IV options without an IV mode"));
    }
    let Some(inner) = api.strip_suffix(')') else {
        return Err(alloc_error(
            text,
            &format!("{api:?} is not of the form mode(cipher)"),
        ));
    };
    let Some((chain, cipher)) = inner.split_once('(') else {
        return Err(alloc_error(
            text,
            &format!("{api:?} is not of the form mode(cipher)"),
        ));
    };
    if cipher.contains(['(', ')', ',']) || chain.contains(['(', ')', ',']) {
        return Err(error::unsupported(format!(
            "Crypto API spec {api:?} (in {text:?}) is not supported yet; use xts(C), cbc(C), ecb(C) with C one of aes, serpent, twofish, camellia, kuznyechik, or ecb(cipher_null)"
        )));
    }
    Ok(Parts {
        cipher,
        key_count: 1,
        chain,
        ivmode,
        ivopts,
        capi: true,
    })
}

fn split_once_opt(s: &str, c: char) -> (&str, Option<&str>) {
    match s.split_once(c) {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    }
}

/// Key count: decimal digits only, a power of two, at most 64 (the kernel
/// allocates one transform per key).
fn parse_key_count(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = s.parse().ok()?;
    (n.is_power_of_two() && n <= 64).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms() {
        let s = CipherSpec::parse("aes-xts-plain64").unwrap();
        assert_eq!(
            (s.cipher, s.chain, s.iv, s.key_count),
            (BlockCipher::Aes, ChainMode::Xts, IvMode::Plain64, 1)
        );
        let s = CipherSpec::parse("capi:xts(aes)-plain64").unwrap();
        assert_eq!(
            (s.chain, s.iv, s.capi),
            (ChainMode::Xts, IvMode::Plain64, true)
        );
        let s = CipherSpec::parse("aes:2-cbc-essiv:sha256").unwrap();
        assert_eq!((s.key_count, s.iv), (2, IvMode::Essiv(EssivHash::Sha256)));
        let s = CipherSpec::parse("capi:cbc(aes)-essiv:sha256").unwrap();
        assert_eq!(s.iv, IvMode::Essiv(EssivHash::Sha256));
        let s = CipherSpec::parse("capi:ecb(cipher_null)").unwrap();
        assert_eq!(
            (s.cipher, s.chain, s.iv),
            (BlockCipher::Null, ChainMode::Ecb, IvMode::None)
        );
        let s = CipherSpec::parse("cipher_null-ecb").unwrap();
        assert_eq!(s.cipher, BlockCipher::Null);
        assert_eq!(CipherSpec::parse("aes-ecb").unwrap().iv, IvMode::None);
        // ECB ignores an IV mode, as the kernel does.
        assert_eq!(
            CipherSpec::parse("aes-ecb-plain64").unwrap().iv,
            IvMode::None
        );
        assert_eq!(
            CipherSpec::parse("aes-cbc-plain64be").unwrap().iv,
            IvMode::Plain64Be
        );
        assert_eq!(
            CipherSpec::parse("aes-cbc-benbi").unwrap().iv,
            IvMode::Benbi
        );
        assert_eq!(
            CipherSpec::parse("aes-xts-eboiv").unwrap().iv,
            IvMode::Eboiv
        );
        assert_eq!(CipherSpec::parse("aes-cbc-null").unwrap().iv, IvMode::Null);
        assert_eq!(
            CipherSpec::parse("aes-cbc-plain:ignored").unwrap().iv,
            IvMode::Plain
        );
        assert_eq!(
            CipherSpec::parse("aes-xts-plain64").unwrap().to_string(),
            "aes-xts-plain64"
        );
    }

    #[test]
    fn legacy_defaults_like_the_kernel() {
        for t in ["aes", "aes-plain"] {
            let s = CipherSpec::parse(t).unwrap();
            assert_eq!((s.chain, s.iv), (ChainMode::Cbc, IvMode::Plain), "{t}");
        }
    }

    #[test]
    fn refuses_with_kernel_reasons() {
        let e = |t: &str| CipherSpec::parse(t).unwrap_err().to_string();
        assert!(e("aes-cbc").contains("IV mechanism required"));
        assert!(e("aes:3-cbc-plain").contains("Bad cipher key count"));
        assert!(e("aes:0-cbc-plain").contains("Bad cipher key count"));
        assert!(e("aes-cbc-essiv").contains("Digest algorithm missing"));
        assert!(e("aes-cbc-bogus").contains("Invalid IV mode"));
        assert!(e("xts(aes)-plain64").contains("Bad cipher specification"));
        assert!(e("aes-cbc-essiv:sha512").contains("Error allocating crypto tfm"));
        assert!(e("serpent-cbc-elephant").contains("needs aes with one key"));
        assert!(e("aes:2-cbc-elephant").contains("needs aes with one key"));
        let el = CipherSpec::parse("aes-cbc-elephant").unwrap();
        assert_eq!(el.iv, IvMode::Elephant);
        assert!(el.check_key_len(32).is_ok() && el.check_key_len(64).is_ok());
        assert!(el.check_key_len(16).is_err());
        for m in ["lmk", "random"] {
            assert!(
                e(&format!("aes-cbc-{m}")).contains("not supported yet"),
                "{m}"
            );
        }
        assert!(e("cast6-xts-plain64").contains("not supported yet"));
        assert!(e("capi:gcm(aes)-random").contains("not supported yet"));
        assert!(e("capi:authenc(hmac(sha256),xts(aes))-random").contains("not supported yet"));
    }

    #[test]
    fn truecrypt_legacy_specs() {
        let s = CipherSpec::parse("aes-lrw-benbi").unwrap();
        assert_eq!((s.chain, s.iv), (ChainMode::Lrw, IvMode::Benbi));
        assert!(s.check_key_len(48).is_ok() && s.check_key_len(32).is_ok());
        assert!(s.check_key_len(64).is_err());
        let s = CipherSpec::parse("aes-cbc-tcw").unwrap();
        assert_eq!((s.iv, s.key_extra_size()), (IvMode::Tcw, 32));
        assert!(s.check_key_len(64).is_ok() && s.check_key_len(32).is_err());
        let s = CipherSpec::parse("cast5-cbc-tcw").unwrap();
        assert_eq!((s.iv_size(), s.key_extra_size()), (8, 24));
        assert!(s.check_key_len(40).is_ok() && s.check_key_len(28).is_err());
        let s = CipherSpec::parse("des3_ede-cbc-tcw").unwrap();
        assert!(s.check_key_len(48).is_ok() && s.check_key_len(40).is_err());
        let e = |t: &str| CipherSpec::parse(t).unwrap_err().to_string();
        assert!(e("cast5-xts-plain64").contains("8-byte blocks"));
        assert!(e("des3_ede-lrw-benbi").contains("8-byte blocks"));
        assert!(
            e("cast5-cbc-essiv:sha256").contains("Error allocating")
                || e("cast5-cbc-essiv:sha256").contains("supported with")
        );
        assert!(e("cast5-cbc-benbi").contains("supported with"));
        assert!(e("aes-xts-tcw").contains("needs cbc with one key"));
        assert!(e("aes:2-cbc-tcw").contains("needs cbc with one key"));
    }

    #[test]
    fn key_lengths() {
        let s = CipherSpec::parse("aes-xts-plain64").unwrap();
        assert!(
            s.check_key_len(32).is_ok()
                && s.check_key_len(64).is_ok()
                && s.check_key_len(48).is_ok()
        );
        assert!(s
            .check_key_len(16)
            .unwrap_err()
            .to_string()
            .contains("256, 384, 512 bits"));
        let s = CipherSpec::parse("aes:4-cbc-plain").unwrap();
        assert!(s.check_key_len(64).is_ok());
        assert!(s.check_key_len(32).is_err());
        let s = CipherSpec::parse("cipher_null-ecb").unwrap();
        assert!(s.check_key_len(0).is_ok() && s.check_key_len(1).is_err());
    }
}
