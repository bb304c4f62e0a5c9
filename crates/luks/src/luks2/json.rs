//! LUKS2 JSON metadata (spec section 3) as serde types, plus the checks
//! that make a parsed [`Metadata`] safe to act on: ids in range, areas
//! inside the keyslots area and not overlapping, KDF costs within limits,
//! digests pointing at existing objects. Unknown fields are preserved so a
//! header written back keeps what cryptsetup put there.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{corrupt, json_error, unsupported, Result};
use crate::hash::Hash;
use crate::kdf::{Argon2Variant, Kdf};
use crate::ErrorKind;

mod check;
pub(crate) use check::check_reencrypt_requirement;

/// Largest keyslots area cryptsetup accepts (128 MiB).
pub const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;
/// LUKS2 keyslot ids are 0..32.
pub const MAX_KEYSLOTS: u32 = 32;
/// Largest accepted volume / area key (bytes).
pub const MAX_KEY_SIZE: u32 = 128;
/// Largest accepted salt or digest (bytes, decoded).
pub const MAX_SALT: usize = 64;
/// Shortest accepted volume key digest (bytes): LUKS1's fixed digest
/// size, and what every cryptsetup writes at least (a 1-byte digest
/// would let one wrong passphrase in 256 through).
pub const MIN_DIGEST_LEN: usize = 20;

/// The whole JSON object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Metadata {
    /// Keyslots by id ("0".."31").
    pub keyslots: BTreeMap<String, Keyslot>,
    /// Tokens, kept verbatim (written with `type` and `keyslots` first, as
    /// cryptsetup creates them).
    #[serde(serialize_with = "tokens_in_cryptsetup_order")]
    pub tokens: BTreeMap<String, Value>,
    /// Data segments by id.
    pub segments: BTreeMap<String, Segment>,
    /// Volume key digests by id.
    pub digests: BTreeMap<String, DigestJson>,
    /// Sizes, flags, requirements.
    pub config: Config,
}

/// A `luks2` keyslot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Keyslot {
    /// Always `luks2` here.
    #[serde(rename = "type")]
    pub kind: String,
    /// Volume key size in bytes.
    pub key_size: u32,
    /// Anti-forensic splitter.
    pub af: Af,
    /// Where the encrypted material is.
    pub area: Area,
    /// Passphrase KDF.
    pub kdf: KdfJson,
    /// Other fields (e.g. `priority`), kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `af` object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Af {
    /// Always `luks1`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Stripe count (4000).
    pub stripes: u32,
    /// AF hash.
    pub hash: String,
}

/// `area` object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Area {
    /// Always `raw`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Byte offset from the device start.
    #[serde(with = "u64_string")]
    pub offset: u64,
    /// Byte length.
    #[serde(with = "u64_string")]
    pub size: u64,
    /// Area cipher (dm-crypt form).
    pub encryption: String,
    /// Area cipher key size.
    pub key_size: u32,
}

/// `kdf` object (pbkdf2 or argon2i/id fields).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KdfJson {
    /// `pbkdf2`, `argon2i`, `argon2id`.
    #[serde(rename = "type")]
    pub kind: String,
    /// PBKDF2 hash.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hash: Option<String>,
    /// PBKDF2 iterations.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub iterations: Option<u32>,
    /// Argon2 time cost.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub time: Option<u32>,
    /// Argon2 memory in KiB.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory: Option<u32>,
    /// Argon2 lanes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cpus: Option<u32>,
    /// Base64 salt.
    pub salt: String,
}

/// A `crypt` segment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Segment {
    /// Always `crypt` here.
    #[serde(rename = "type")]
    pub kind: String,
    /// Data start in bytes.
    #[serde(with = "u64_string")]
    pub offset: u64,
    /// `dynamic` or a byte count.
    pub size: String,
    /// IV offset in 512-byte sectors (`crypt` segments; 0 elsewhere).
    #[serde(with = "u64_string", default)]
    pub iv_tweak: u64,
    /// dm-crypt cipher spec (`crypt` segments; empty elsewhere).
    #[serde(default)]
    pub encryption: String,
    /// Encryption sector size (`crypt` segments; 0 elsewhere).
    #[serde(default)]
    pub sector_size: u32,
    /// Other fields (`flags`), kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A `pbkdf2` digest of the volume key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DigestJson {
    /// Always `pbkdf2`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Keyslot ids this digest verifies.
    pub keyslots: Vec<String>,
    /// Segment ids this key encrypts.
    pub segments: Vec<String>,
    /// PBKDF2 hash.
    pub hash: String,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// Base64 salt.
    pub salt: String,
    /// Base64 digest.
    pub digest: String,
}

/// `config` object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Config {
    /// JSON area size (hdr_size - 4096).
    #[serde(with = "u64_string")]
    pub json_size: u64,
    /// Keyslots area size.
    #[serde(with = "u64_string")]
    pub keyslots_size: u64,
    /// Persistent flags, kept verbatim.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flags: Option<Vec<String>>,
    /// Requirements; unknown `mandatory` entries refuse the volume.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub requirements: Option<Value>,
    /// Other fields, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Serializes tokens with `type` and `keyslots` before their other fields
/// (a parsed `Value` keeps its keys sorted).
fn tokens_in_cryptsetup_order<S: serde::Serializer>(
    tokens: &BTreeMap<String, Value>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;

    struct Token<'a>(&'a Value);
    impl Serialize for Token<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let Some(obj) = self.0.as_object() else {
                return self.0.serialize(s);
            };
            let mut m = s.serialize_map(Some(obj.len()))?;
            for k in ["type", "keyslots"] {
                if let Some(v) = obj.get(k) {
                    m.serialize_entry(k, v)?;
                }
            }
            for (k, v) in obj.iter().filter(|(k, _)| *k != "type" && *k != "keyslots") {
                m.serialize_entry(k, v)?;
            }
            m.end()
        }
    }
    let mut m = s.serialize_map(Some(tokens.len()))?;
    for (id, t) in tokens {
        m.serialize_entry(id, &Token(t))?;
    }
    m.end()
}

/// Serde helper: u64 stored as a decimal string.
mod u64_string {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(D::Error::custom("expected a decimal number in a string"));
        }
        s.parse().map_err(D::Error::custom)
    }
}

/// Base64 (standard, padded) decode with a length cap, as cryptsetup writes.
pub fn b64_decode(s: &str, what: &str) -> Result<Vec<u8>> {
    if s.len() > MAX_SALT * 2 {
        return Err(corrupt(format!("LUKS2 {what} is too long")));
    }
    let v = base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| corrupt(format!("LUKS2 {what} is not valid base64")))?;
    if v.is_empty() || v.len() > MAX_SALT {
        return Err(corrupt(format!(
            "LUKS2 {what} has invalid length {}",
            v.len()
        )));
    }
    Ok(v)
}

/// Base64 encode.
pub fn b64_encode(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn parse_id(id: &str, what: &str, max: u32) -> Result<u32> {
    if id.is_empty() || id.len() > 3 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(corrupt(format!("LUKS2 {what} id {id:?} is invalid")));
    }
    let n: u32 = id
        .parse()
        .map_err(|_| corrupt(format!("LUKS2 {what} id {id:?} is invalid")))?;
    if n >= max {
        return Err(corrupt(format!("LUKS2 {what} id {n} is out of range")));
    }
    Ok(n)
}

impl KdfJson {
    /// Typed KDF (costs checked against the limits).
    pub fn kdf(&self) -> Result<Kdf> {
        let kdf = match self.kind.as_str() {
            "pbkdf2" => Kdf::Pbkdf2 {
                hash: Hash::parse(
                    self.hash
                        .as_deref()
                        .ok_or_else(|| corrupt("LUKS2 pbkdf2 KDF has no hash"))?,
                )?,
                iterations: self
                    .iterations
                    .ok_or_else(|| corrupt("LUKS2 pbkdf2 KDF has no iterations"))?,
            },
            // "argon2" is a legacy spelling of argon2i cryptsetup still reads.
            "argon2" | "argon2i" | "argon2id" => Kdf::Argon2 {
                variant: if self.kind != "argon2id" {
                    Argon2Variant::I
                } else {
                    Argon2Variant::Id
                },
                time: self
                    .time
                    .ok_or_else(|| corrupt("LUKS2 argon2 KDF has no time cost"))?,
                memory_kib: self
                    .memory
                    .ok_or_else(|| corrupt("LUKS2 argon2 KDF has no memory cost"))?,
                parallel: self
                    .cpus
                    .ok_or_else(|| corrupt("LUKS2 argon2 KDF has no cpus"))?,
            },
            other => return Err(unsupported(format!("LUKS2 KDF {other:?} is not supported"))),
        };
        kdf.check_limits()?;
        Ok(kdf)
    }

    /// JSON form of `kdf` with `salt`.
    pub fn from_kdf(kdf: &Kdf, salt: &[u8]) -> Self {
        let salt = b64_encode(salt);
        match *kdf {
            Kdf::Pbkdf2 { hash, iterations } => KdfJson {
                kind: "pbkdf2".into(),
                hash: Some(hash.name().into()),
                iterations: Some(iterations),
                time: None,
                memory: None,
                cpus: None,
                salt,
            },
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => KdfJson {
                kind: variant.name().into(),
                hash: None,
                iterations: None,
                time: Some(time),
                memory: Some(memory_kib),
                cpus: Some(parallel),
                salt,
            },
        }
    }
}

impl Segment {
    /// Fixed size in bytes, or `None` for `dynamic`.
    pub fn fixed_size(&self) -> Result<Option<u64>> {
        if self.size == "dynamic" {
            return Ok(None);
        }
        if self.size.is_empty()
            || self.size.len() > 20
            || !self.size.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(corrupt(
                "LUKS2 segment size is neither \"dynamic\" nor a number",
            ));
        }
        self.size
            .parse()
            .map(Some)
            .map_err(|_| corrupt("LUKS2 segment size is out of range"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRYPTSETUP_JSON: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"bHr9qbLgqY8OZqb69K3UoExbdo8hphvD5od6xMvik14="}}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"wjDIIItqMouL/2+YFMfE3B7PCn8XPD/1q+u14uHfG2c=","digest":"E0GWC+jQe6weO8BTwusiu7F/ypdrjVz48CUndF9/wfk="}},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;

    fn area(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    #[test]
    fn parses_cryptsetup_json_and_round_trips_byte_for_byte() {
        let m = Metadata::parse(&area(CRYPTSETUP_JSON), 16384).unwrap();
        assert_eq!(m.segment().1.sector_size, 4096);
        assert_eq!(m.segment_keyslots(), vec![0]);
        assert_eq!(String::from_utf8(m.to_json()).unwrap(), CRYPTSETUP_JSON);
    }

    #[test]
    fn lies_are_refused() {
        let cases = [
            ("\"offset\":\"32768\"", "\"offset\":\"99999999999\""),
            ("\"size\":\"258048\"", "\"size\":\"1024\""),
            ("\"json_size\":\"12288\"", "\"json_size\":\"4096\""),
            ("\"sector_size\":4096", "\"sector_size\":1000"),
            ("\"offset\":\"16777216\"", "\"offset\":\"4096\""),
            ("\"keyslots\":[\"0\"]", "\"keyslots\":[\"5\"]"),
        ];
        for (from, to) in cases {
            let j = CRYPTSETUP_JSON.replacen(from, to, 1);
            assert_ne!(j, CRYPTSETUP_JSON, "{from}");
            assert!(Metadata::parse(&area(&j), 16384).is_err(), "accepted {to}");
        }
        let argon = CRYPTSETUP_JSON.replacen(
            "\"type\":\"pbkdf2\",\"hash\":\"sha256\",\"iterations\":1000,\"salt\":\"bHr9",
            "\"type\":\"argon2id\",\"time\":4,\"memory\":4294967295,\"cpus\":4,\"salt\":\"bHr9",
            1,
        );
        // KDF costs beyond cryptsetup's limits: no cryptsetup wrote them,
        // the header is refused before any work.
        let zero = CRYPTSETUP_JSON.replacen(
            "\"iterations\":1000,\"salt\":\"bHr9",
            "\"iterations\":0,\"salt\":\"bHr9",
            1,
        );
        for j in [argon, zero] {
            let e = Metadata::parse(&area(&j), 16384).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{j}");
            assert!(e.message().starts_with("LUKS2 keyslot 0: "), "{e}");
        }
        // An unknown KDF kind fails only its keyslot, at unlock.
        let unknown = CRYPTSETUP_JSON.replacen(
            "\"type\":\"pbkdf2\",\"hash\"",
            "\"type\":\"scrypt\",\"hash\"",
            1,
        );
        let m = Metadata::parse(&area(&unknown), 16384).unwrap();
        assert_eq!(
            m.keyslots["0"].kdf.kdf().unwrap_err().kind(),
            ErrorKind::Unsupported
        );
        // Digests: at least 20 bytes (cryptsetup 2.6 loads one of 1 byte).
        for (digest, ok) in [
            ("AA==", false),
            ("AAAAAAAAAAAAAAAAAAAAAAAAAA==", false),
            ("AAAAAAAAAAAAAAAAAAAAAAAAAAA=", true),
        ] {
            let j =
                CRYPTSETUP_JSON.replacen("E0GWC+jQe6weO8BTwusiu7F/ypdrjVz48CUndF9/wfk=", digest, 1);
            let r = Metadata::parse(&area(&j), 16384);
            assert_eq!(r.is_ok(), ok, "{digest}: {r:?}");
            if let Err(e) = r {
                assert!(e.message().contains("at least 20 are needed"), "{e}");
            }
        }
        let req = CRYPTSETUP_JSON.replacen(
            "\"keyslots_size\":\"16744448\"",
            "\"keyslots_size\":\"16744448\",\"requirements\":{\"mandatory\":[\"online-reencrypt-v2\"]}",
            1,
        );
        let e = Metadata::parse(&area(&req), 16384).unwrap_err();
        assert!(e.to_string().contains("online-reencrypt-v2"), "{e}");
    }
}
