//! A LUKS2 token's JSON, parsed into what unlocking needs. Parsing never
//! panics on any input: a token that is not what its type says is an
//! [`Error`] naming the field, and that token is skipped.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::Error;

/// A token of the LUKS2 header, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Its id in the header.
    pub id: u32,
    /// The keyslots it opens, in the header's order.
    pub keyslots: Vec<u32>,
    /// What it holds.
    pub kind: Kind,
}

/// The token types ucrypt knows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// `systemd-tpm2`: a secret sealed by a TPM2 under a PCR policy.
    Tpm2(Tpm2Token),
    /// `systemd-pkcs11`: a secret encrypted to a PKCS#11 token's key.
    Pkcs11(Pkcs11Token),
    /// `luks2-keyring`: the passphrase is in the kernel keyring.
    Keyring {
        /// The key's description (`key_description`).
        description: String,
    },
    /// `systemd-fido2`: recognised, not supported (no FIDO2 stack here).
    Fido2,
    /// `clevis`: recognised, not supported (its pins are clevis' own).
    Clevis,
    /// Any other type (its name).
    Other(String),
}

/// The fields of a `systemd-tpm2` token (systemd 252's enrollment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tpm2Token {
    /// `tpm2-blob`: TPM2B_PRIVATE then TPM2B_PUBLIC, as marshalled.
    pub blob: Vec<u8>,
    /// `tpm2-pcrs`: the PCR indexes of the policy (bit mask).
    pub pcr_mask: u32,
    /// `tpm2-pcr-bank`: `sha256` or `sha1`; `None` when absent (tokens
    /// from systemd before 250; SHA-256 is used then).
    pub pcr_bank: Option<PcrBank>,
    /// `tpm2-primary-alg`: `ecc` or `rsa`; `None`: ECC, then RSA.
    pub primary_alg: Option<PrimaryAlg>,
    /// `tpm2-policy-hash`: the policy digest at enrollment.
    pub policy_hash: Vec<u8>,
    /// `tpm2-pin`: the policy includes the PIN (PolicyAuthValue).
    pub pin: bool,
    /// `tpm2_pubkey`: the PEM public key (SubjectPublicKeyInfo, RSA) whose
    /// signatures authorize a PCR policy (systemd-measure's key).
    pub pubkey: Option<Vec<u8>>,
    /// `tpm2_pubkey_pcrs`: the PCR indexes of the signed policy (bit
    /// mask); zero: no signed policy.
    pub pubkey_pcr_mask: u32,
}

/// A PCR bank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcrBank {
    /// `sha1`.
    Sha1,
    /// `sha256`.
    Sha256,
}

/// The TPM2 primary key's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimaryAlg {
    /// NIST P-256.
    Ecc,
    /// RSA 2048.
    Rsa,
}

/// The fields of a `systemd-pkcs11` token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkcs11Token {
    /// `pkcs11-uri`: where the key pair is (RFC 7512).
    pub uri: String,
    /// `pkcs11-key`: the secret encrypted to the public key.
    pub encrypted: Vec<u8>,
}

impl Kind {
    /// The token type as the header spells it.
    pub fn type_name(&self) -> &str {
        match self {
            Kind::Tpm2(_) => "systemd-tpm2",
            Kind::Pkcs11(_) => "systemd-pkcs11",
            Kind::Keyring { .. } => "luks2-keyring",
            Kind::Fido2 => "systemd-fido2",
            Kind::Clevis => "clevis",
            Kind::Other(t) => t,
        }
    }
}

/// Parses token `id`'s JSON text (as `token export` prints it).
pub fn parse(id: u32, json: &[u8]) -> Result<Token, Error> {
    let v: Value = serde_json::from_slice(json)
        .map_err(|e| Error::malformed(format!("token {id}: not JSON ({e})")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| Error::malformed(format!("token {id}: not a JSON object")))?;
    let bad = |what: &str| Error::malformed(format!("token {id}: {what}"));
    let ty = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no \"type\" string"))?;
    let keyslots = obj
        .get("keyslots")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"keyslots\" array"))?
        .iter()
        .map(|k| k.as_str().and_then(|s| s.parse::<u32>().ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| bad("a keyslot that is not a number string"))?;
    let kind = match ty {
        "systemd-tpm2" => Kind::Tpm2(tpm2_fields(obj).map_err(|w| bad(&w))?),
        "systemd-pkcs11" => Kind::Pkcs11(Pkcs11Token {
            uri: string(obj, "pkcs11-uri").map_err(|w| bad(&w))?,
            encrypted: base64(obj, "pkcs11-key").map_err(|w| bad(&w))?,
        }),
        "luks2-keyring" => Kind::Keyring {
            description: string(obj, "key_description").map_err(|w| bad(&w))?,
        },
        "systemd-fido2" => Kind::Fido2,
        "clevis" => Kind::Clevis,
        other => Kind::Other(other.to_string()),
    };
    Ok(Token { id, keyslots, kind })
}

fn tpm2_fields(obj: &Map<String, Value>) -> Result<Tpm2Token, String> {
    let blob = base64(obj, "tpm2-blob")?;
    let pcr_mask = pcr_array(obj.get("tpm2-pcrs").ok_or("no \"tpm2-pcrs\" array")?)?;
    let pcr_bank = match obj.get("tpm2-pcr-bank").map(Value::as_str) {
        None => None,
        Some(Some("sha256")) => Some(PcrBank::Sha256),
        Some(Some("sha1")) => Some(PcrBank::Sha1),
        Some(_) => return Err("unknown \"tpm2-pcr-bank\"".into()),
    };
    let primary_alg = match obj.get("tpm2-primary-alg").map(Value::as_str) {
        None => None,
        Some(Some("ecc")) => Some(PrimaryAlg::Ecc),
        Some(Some("rsa")) => Some(PrimaryAlg::Rsa),
        Some(_) => return Err("unknown \"tpm2-primary-alg\"".into()),
    };
    let policy_hash = match obj.get("tpm2-policy-hash") {
        None => Vec::new(),
        Some(v) => v
            .as_str()
            .and_then(|h| hex::decode(h).ok())
            .ok_or("\"tpm2-policy-hash\" is not hex")?,
    };
    let pin = match obj.get("tpm2-pin") {
        None => false,
        Some(v) => v.as_bool().ok_or("\"tpm2-pin\" is not a boolean")?,
    };
    let pubkey = match obj.get("tpm2_pubkey") {
        None => None,
        Some(_) => Some(base64(obj, "tpm2_pubkey")?),
    };
    let pubkey_pcr_mask = match obj.get("tpm2_pubkey_pcrs") {
        None => 0,
        Some(v) => pcr_array(v)?,
    };
    if pubkey_pcr_mask != 0 && pubkey.is_none() {
        return Err("\"tpm2_pubkey_pcrs\" without \"tpm2_pubkey\"".into());
    }
    Ok(Tpm2Token {
        blob,
        pcr_mask,
        pcr_bank,
        primary_alg,
        policy_hash,
        pin,
        pubkey,
        pubkey_pcr_mask,
    })
}

/// A JSON array of PCR indexes (0…23) as a bit mask.
pub(crate) fn pcr_array(v: &Value) -> Result<u32, String> {
    let mut mask = 0u32;
    for p in v.as_array().ok_or("PCRs are not a JSON array")? {
        match p.as_u64() {
            Some(n) if n < 24 => mask |= 1 << n,
            _ => return Err("a PCR index that is not 0…23".into()),
        }
    }
    Ok(mask)
}

fn string(obj: &Map<String, Value>, key: &str) -> Result<String, String> {
    obj.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("no \"{key}\" string"))
}

fn base64(obj: &Map<String, Value>, key: &str) -> Result<Vec<u8>, String> {
    let s = string(obj, key)?;
    base64::engine::general_purpose::STANDARD
        .decode(s.as_bytes())
        .map_err(|_| format!("\"{key}\" is not base64"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TPM2: &str = r#"{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AAEC","tpm2-pcrs":[7,9],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc","tpm2-policy-hash":"0aff","tpm2-pin":true}"#;

    #[test]
    fn tpm2_token_fields() {
        let t = parse(3, TPM2.as_bytes()).unwrap();
        assert_eq!(t.id, 3);
        assert_eq!(t.keyslots, vec![1]);
        let Kind::Tpm2(t) = t.kind else {
            panic!("not tpm2")
        };
        assert_eq!(t.blob, vec![0, 1, 2]);
        assert_eq!(t.pcr_mask, (1 << 7) | (1 << 9));
        assert_eq!(t.pcr_bank, Some(PcrBank::Sha256));
        assert_eq!(t.primary_alg, Some(PrimaryAlg::Ecc));
        assert_eq!(t.policy_hash, vec![0x0a, 0xff]);
        assert!(t.pin && t.pubkey.is_none() && t.pubkey_pcr_mask == 0);
    }

    #[test]
    fn signed_policy_fields() {
        let json = TPM2.replace(
            "\"tpm2-pin\":true",
            "\"tpm2-pin\":false,\"tpm2_pubkey\":\"UEVN\",\"tpm2_pubkey_pcrs\":[11]",
        );
        let Kind::Tpm2(t) = parse(0, json.as_bytes()).unwrap().kind else {
            panic!("not tpm2")
        };
        assert_eq!(t.pubkey.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(t.pubkey_pcr_mask, 1 << 11);
        let json = TPM2.replace("\"tpm2-pin\":true", "\"tpm2_pubkey_pcrs\":[11]");
        assert!(parse(0, json.as_bytes()).is_err());
    }

    #[test]
    fn malformed_tokens_name_the_field() {
        for (json, what) in [
            (r#"{"type":"systemd-tpm2","keyslots":["1"]}"#, "tpm2-blob"),
            (
                r#"{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"AAEC","tpm2-pcrs":[24]}"#,
                "PCR",
            ),
            (r#"{"type":"luks2-keyring","keyslots":["x"]}"#, "keyslot"),
            (r#"{"type":"systemd-pkcs11","keyslots":[]}"#, "pkcs11-uri"),
            (r#"[1]"#, "object"),
            (r#"{"type":"a""#, "JSON"),
        ] {
            let e = parse(0, json.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(what), "{json}: {e}");
        }
    }

    #[test]
    fn other_types_are_kept_by_name() {
        let t = parse(0, br#"{"type":"clevis","keyslots":["0"]}"#).unwrap();
        assert_eq!(t.kind, Kind::Clevis);
        let t = parse(0, br#"{"type":"x-mine","keyslots":[]}"#).unwrap();
        assert_eq!(t.kind.type_name(), "x-mine");
    }

    #[test]
    fn truncated_and_random_bytes_never_panic() {
        let mut rng = testutil::Rng::new(36);
        for n in 0..TPM2.len() {
            let _ = parse(0, &TPM2.as_bytes()[..n]);
        }
        for _ in 0..2000 {
            let len = rng.below_usize(200);
            let mut b = rng.bytes(len);
            if len > 2 {
                b[0] = b'{';
            }
            let _ = parse(0, &b);
        }
    }
}
