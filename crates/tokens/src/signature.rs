//! Signed PCR policies: the signature JSON that `systemd-measure sign`
//! writes (`/run/systemd/tpm2-pcr-signature.json`, crypttab's
//! `tpm2-signature=`), and the token's public key as the TPM sees it.
//!
//! ```text
//!  { "sha256": [ { "pcrs": [11],            the signed PCRs
//!                  "pkfp": "<hex>",         SHA-256 of the key's PKCS#1 DER
//!                  "pol":  "<hex>",         the PolicyPCR digest signed
//!                  "sig":  "<base64>" } ],  RSASSA-PKCS1-v1_5 over SHA-256(pol)
//!    "sha1": [ ... ] }
//! ```
//!
//! [`find`] picks the entry for a bank, PCR mask, key and policy digest as
//! systemd 252's `find_signature` does (an entry lacking a field is
//! passed over; one that is not an object, or a field that does not
//! decode, refuses the document). The JSON walk is hand-written over
//! `serde_json` values; the PEM key is read by OpenSSL, as systemd reads it.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::token::pcr_array;
use crate::Error;

/// Where systemd looks for `tpm2-pcr-signature.json` when crypttab names
/// none, or names a bare file name (its configuration search path).
pub const SEARCH_DIRS: &[&str] = &[
    "/etc/systemd",
    "/run/systemd",
    "/usr/local/lib/systemd",
    "/usr/lib/systemd",
];

/// The file name systemd looks for.
pub const DEFAULT_NAME: &str = "tpm2-pcr-signature.json";

/// Reads the signature JSON: `path` when absolute (or relative with a
/// directory part), else the name (default [`DEFAULT_NAME`]) in
/// [`SEARCH_DIRS`], as systemd's `tpm2_load_pcr_signature`.
pub fn load(path: Option<&Path>) -> Result<(PathBuf, Vec<u8>), Error> {
    let name = path.unwrap_or(Path::new(DEFAULT_NAME));
    let candidates: Vec<PathBuf> = if name.components().count() > 1 {
        vec![name.to_path_buf()]
    } else {
        SEARCH_DIRS
            .iter()
            .map(|d| Path::new(d).join(name))
            .collect()
    };
    for c in &candidates {
        match std::fs::read(c) {
            Ok(b) => return Ok((c.clone(), b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(Error::unavailable(format!(
                    "Failed to read TPM PCR signature file '{}': {e}",
                    c.display()
                )))
            }
        }
    }
    Err(Error::unavailable(format!(
        "Failed to find TPM PCR signature file '{}': No such file or directory",
        name.display()
    )))
}

/// The signature in `json` for PCR `bank` (`"sha256"`, `"sha1"`), the
/// PCRs of `mask`, the key whose fingerprint is `fingerprint` and the
/// policy digest `policy`. No such entry is
/// [`ErrorKind::Policy`](crate::ErrorKind::Policy) (the system's state is
/// not one the key signed); a document that is not what systemd writes is
/// [`ErrorKind::Malformed`](crate::ErrorKind::Malformed).
pub fn find(
    json: &[u8],
    bank: &str,
    mask: u32,
    fingerprint: &[u8],
    policy: &[u8],
) -> Result<Vec<u8>, Error> {
    let bad = |w: &str| Error::malformed(w.to_string());
    let v: Value = serde_json::from_slice(json)
        .map_err(|e| Error::malformed(format!("Failed to parse TPM PCR signature JSON: {e}")))?;
    let v = v
        .as_object()
        .ok_or_else(|| bad("Signature is not a JSON object."))?;
    let entries = v
        .get(bank)
        .ok_or_else(|| Error::policy(format!("Signature lacks data for PCR bank '{bank}'.")))?;
    let entries = entries
        .as_array()
        .ok_or_else(|| bad("Bank data is not a JSON array."))?;
    for e in entries {
        let e = e
            .as_object()
            .ok_or_else(|| bad("Bank data element is not a JSON object"))?;
        let Some(pcrs) = e.get("pcrs") else { continue };
        let parsed = pcr_array(pcrs)
            .map_err(|w| Error::malformed(format!("Failed to parse JSON PCR mask: {w}")))?;
        if parsed != mask {
            continue;
        }
        let Some(fp) = e.get("pkfp") else { continue };
        if unhex(fp).ok_or_else(|| bad("Failed to decode fingerprint in JSON data"))? != fingerprint
        {
            continue;
        }
        let Some(pol) = e.get("pol") else { continue };
        if unhex(pol).ok_or_else(|| bad("Failed to decode policy hash JSON data"))? != policy {
            continue;
        }
        let Some(sig) = e.get("sig") else { continue };
        return sig
            .as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .ok_or_else(|| bad("Failed to decode signature in JSON data"));
    }
    Err(Error::policy(
        "Couldn't find signature for this PCR bank, PCR index and public key.".into(),
    ))
}

fn unhex(v: &Value) -> Option<Vec<u8>> {
    hex::decode(v.as_str()?).ok()
}

/// The token's RSA public key: what the TPM's `LoadExternal` takes and
/// the fingerprint the signature JSON names it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The modulus, big-endian, without leading zeros.
    pub modulus: Vec<u8>,
    /// The public exponent as systemd 252 stores it in
    /// `TPMS_RSA_PARMS.exponent` (its big-endian bytes copied into the
    /// field's first bytes, read in host order: 65537 stays 65537).
    pub exponent: u32,
    /// SHA-256 of the key's PKCS#1 `RSAPublicKey` DER (OpenSSL's
    /// `i2d_PublicKey`), the `pkfp` of the signature JSON.
    pub fingerprint: Vec<u8>,
}

impl PublicKey {
    /// Reads a PEM `PUBLIC KEY` (SubjectPublicKeyInfo) holding an RSA key.
    pub fn from_pem(pem: &[u8]) -> Result<Self, Error> {
        let bad = |w: &str| Error::malformed(w.to_string());
        let key = openssl::pkey::PKey::public_key_from_pem(pem)
            .map_err(|_| bad("Failed to parse PEM public key."))?;
        let rsa = key
            .rsa()
            .map_err(|_| bad("Provided public key is not an RSA key."))?;
        let modulus = rsa.n().to_vec();
        if modulus.is_empty() || modulus.len() > 512 {
            return Err(bad("RSA modulus too large for TPM2 public key object."));
        }
        let e = rsa.e().to_vec();
        if e.is_empty() || e.len() > 4 {
            return Err(bad("RSA exponent too large for TPM2 public key object."));
        }
        let mut field = [0u8; 4];
        field[..e.len()].copy_from_slice(&e);
        let der = rsa
            .public_key_to_der_pkcs1()
            .map_err(|_| bad("Unable to convert public key to DER format"))?;
        Ok(Self {
            modulus,
            exponent: u32::from_le_bytes(field),
            fingerprint: Sha256::digest(&der).to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"sha256":[{"pcrs":[11],"pkfp":"aa","pol":"01","sig":"AAE="},{"pcrs":[11],"pkfp":"bb","pol":"02","sig":"Ag=="}]}"#;

    #[test]
    fn finds_by_bank_mask_key_and_policy() {
        let m = 1 << 11;
        assert_eq!(
            find(DOC.as_bytes(), "sha256", m, &[0xaa], &[1]).map_err(|e| e.to_string()),
            Ok(vec![0, 1])
        );
        assert_eq!(
            find(DOC.as_bytes(), "sha256", m, &[0xbb], &[2]).map_err(|e| e.to_string()),
            Ok(vec![2])
        );
        for (bank, mask, fp, pol) in [
            ("sha1", m, 0xaa, 1),
            ("sha256", m | 1, 0xaa, 1),
            ("sha256", m, 0xbb, 1),
            ("sha256", m, 0xaa, 2),
        ] {
            assert!(
                find(DOC.as_bytes(), bank, mask, &[fp], &[pol])
                    .err()
                    .map(|e| e.kind())
                    == Some(crate::ErrorKind::Policy),
                "{bank} {mask} {fp} {pol}"
            );
        }
    }

    #[test]
    fn malformed_documents_are_refused() {
        for doc in [
            "[]",
            r#"{"sha256":{}}"#,
            r#"{"sha256":[1]}"#,
            r#"{"sha256":[{"pcrs":[99]}]}"#,
            r#"{"sha256":[{"pcrs":[11],"pkfp":"zz"}]}"#,
            r#"{"sha256":[{"pcrs":[11],"pkfp":"aa","pol":"01","sig":"!"}]}"#,
        ] {
            assert!(
                find(doc.as_bytes(), "sha256", 1 << 11, &[0xaa], &[1])
                    .err()
                    .map(|e| e.kind())
                    == Some(crate::ErrorKind::Malformed),
                "{doc}"
            );
        }
    }

    #[test]
    fn truncated_and_random_bytes_never_panic() {
        let mut rng = testutil::Rng::new(11);
        for n in 0..DOC.len() {
            let _ = find(&DOC.as_bytes()[..n], "sha256", 1 << 11, &[0xaa], &[1]);
        }
        for _ in 0..2000 {
            let len = rng.below_usize(120);
            let mut b = rng.bytes(len);
            if len > 2 {
                b[0] = b'{';
            }
            let _ = find(&b, "sha256", 1 << 11, &[0xaa], &[1]);
            let _ = PublicKey::from_pem(&b);
        }
    }

    #[test]
    fn search_path_and_missing_file() {
        let dir = testutil::TempDir::new("sigload");
        let p = dir.join("s.json");
        std::fs::write(&p, DOC).unwrap();
        assert_eq!(load(Some(&p)).unwrap().1, DOC.as_bytes());
        let e = load(Some(&dir.join("absent.json")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Failed to find TPM PCR signature file"), "{e}");
    }
}
