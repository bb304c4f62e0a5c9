//! `systemd-tpm2`: unsealing the token's secret as systemd 252's
//! `tpm2_unseal` does, through the `tss-esapi` crate over tpm2-tss.
//!
//! ```text
//!  CreatePrimary (systemd's ECC P-256 or RSA 2048 template, owner hierarchy)
//!   ├─ HMAC session salted with the primary (parameter encryption)
//!   ├─ policy session, in systemd 252's order:
//!   │     [signed: PolicyPCR(tpm2_pubkey_pcrs) → PolicyGetDigest → the
//!   │      signature JSON's entry for it → LoadExternal(tpm2_pubkey, owner)
//!   │      → VerifySignature → PolicyAuthorize(digest, key name, ticket)]
//!   │     [PolicyPCR(tpm2-pcrs, bank)] [PolicyAuthValue with a PIN]
//!   │     PolicyGetDigest ≠ tpm2-policy-hash → refused before Unseal
//!   ├─ Load(tpm2-blob: TPM2B_PRIVATE ‖ TPM2B_PUBLIC) [+ auth = SHA-256(PIN)]
//!   └─ Unseal → secret; the keyslot passphrase is its base64
//! ```
//!
//! The TPM is chosen as systemd chooses it (`--tpm2-device=`): `auto` (the
//! one `/sys/class/tpmrm` entry), a device path, or a TCTI spec such as
//! `swtpm:host=127.0.0.1,port=2321`. A signed PCR policy (`tpm2_pubkey`,
//! enrolled by `systemd-cryptenroll --tpm2-public-key=`) needs the
//! signature JSON of `systemd-measure sign` ([`crate::signature`]): a
//! missing file, no entry for this state and key, or a signature the TPM
//! refuses skip the token.

use std::path::Path;
use std::str::FromStr;

use crypto::Secret;
use sha2::{Digest as _, Sha256};
use tss_esapi::attributes::{ObjectAttributesBuilder, SessionAttributesBuilder};
use tss_esapi::constants::SessionType;
use tss_esapi::handles::{KeyHandle, ObjectHandle, SessionHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    Auth, Digest, EccPoint, EccScheme, KeyDerivationFunctionScheme, Nonce, PcrSelectionListBuilder,
    PcrSlot, Private, Public, PublicBuilder, PublicEccParametersBuilder, PublicKeyRsa,
    PublicRsaParametersBuilder, RsaExponent, RsaScheme, RsaSignature, Signature,
    SymmetricDefinition, SymmetricDefinitionObject,
};
use tss_esapi::traits::UnMarshall;
use tss_esapi::{Context, TctiNameConf};

use crate::signature::{self, PublicKey};
use crate::token::{PcrBank, PrimaryAlg, Tpm2Token};
use crate::Error;

/// Why unsealing failed, in systemd's words where it has them.
fn fail(what: &str, e: impl std::fmt::Display) -> Error {
    Error::failed(format!("{what}: {e}"))
}

/// The TCTI for `--tpm2-device=` (`None`: `auto`).
pub fn tcti(device: Option<&str>) -> Result<TctiNameConf, Error> {
    let spec = match device {
        None | Some("auto") => auto_device()?,
        Some(p) if p.starts_with('/') => format!("device:{p}"),
        Some(s) => s.to_string(),
    };
    TctiNameConf::from_str(&spec)
        .map_err(|_| Error::failed(format!("Cannot use TPM2 device \"{spec}\"")))
}

/// Waits, as systemd-cryptsetup does for crypttab's `token-timeout=`, for
/// a TPM2 to show up in `/sys/class/tpmrm` (at most `timeout`; zero: for
/// ever). Returns at once when one is there, and without waiting on an
/// EFI system whose firmware saw no TPM2 either (systemd's check: no
/// ACPI `TPM2` table and no `tpm0` event log). systemd watches udev for
/// the device; this looks at the class directory every 100 ms, which
/// needs no udev. Says what it does on stderr in systemd's words; returns
/// whether a device is there.
pub fn wait_for_device(volume: &str, timeout: std::time::Duration) -> bool {
    let present = || !tpmrm_entries().is_empty();
    if present() {
        return true;
    }
    let efi = std::path::Path::new("/sys/firmware/efi").exists();
    let firmware_tpm2 = std::path::Path::new("/sys/firmware/acpi/tables/TPM2").exists()
        || std::path::Path::new("/sys/kernel/security/tpm0/binary_bios_measurements").exists();
    if efi && !firmware_tpm2 {
        eprintln!("No TPM2 hardware discovered and EFI firmware does not see it either, falling back to traditional unlocking.");
        return false;
    }
    eprintln!(
        "TPM2 device not present for unlocking {volume}, waiting for it to become available."
    );
    let deadline = (!timeout.is_zero()).then(|| std::time::Instant::now() + timeout);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if present() {
            return true;
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            eprintln!("Timed out waiting for security device, aborting security device based authentication attempt.");
            return false;
        }
    }
}

/// The entries of `/sys/class/tpmrm` (`tpmrm0`, ...).
fn tpmrm_entries() -> Vec<String> {
    std::fs::read_dir("/sys/class/tpmrm")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// systemd's `tpm2_find_device_auto`: the one entry of `/sys/class/tpmrm`.
fn auto_device() -> Result<String, Error> {
    let mut found: Vec<String> = tpmrm_entries()
        .into_iter()
        .map(|e| format!("device:/dev/{e}"))
        .collect();
    match found.len() {
        0 => Err(Error::unavailable("No TPM2 (tpmrm) device found.".into())),
        1 => Ok(found.remove(0)),
        _ => Err(Error::unavailable(
            "More than one TPM2 (tpmrm) device found.".into(),
        )),
    }
}

/// Unseals `t`'s secret on the TPM `device`, with `pin` when the policy
/// has one and the signature JSON at `signature` (systemd's search when
/// `None`) when the policy is signed. Returns the keyslot passphrase
/// (the secret's base64).
pub fn unseal(
    t: &Tpm2Token,
    device: Option<&str>,
    pin: Option<&Secret>,
    signature: Option<&Path>,
) -> Result<Secret, Error> {
    let signed = match (&t.pubkey, t.pubkey_pcr_mask) {
        (Some(pem), mask) if mask != 0 => Some(Signed {
            key: PublicKey::from_pem(pem)?,
            mask,
            json: signature::load(signature)?.1,
        }),
        _ => None,
    };
    let (private, public) = split_blob(&t.blob)?;
    // tpm2-tss logs every TPM error response to stderr; the reason is
    // reported here instead (a user's own TSS2_LOG wins).
    if std::env::var_os("TSS2_LOG").is_none() {
        std::env::set_var("TSS2_LOG", "all+NONE");
    }
    let mut ctx = Context::new(tcti(device)?)
        .map_err(|e| Error::unavailable(format!("Failed to connect to the TPM2: {e}")))?;
    let primary = primary(&mut ctx, t.primary_alg)?;
    let result = unseal_under(&mut ctx, primary, t, signed.as_ref(), private, public, pin);
    let _ = ctx.flush_context(primary.into());
    Ok(crate::encode_passphrase(&result?))
}

/// A signed policy's inputs: the key, its PCRs, the signature JSON.
struct Signed {
    key: PublicKey,
    mask: u32,
    json: Vec<u8>,
}

fn unseal_under(
    ctx: &mut Context,
    primary: KeyHandle,
    t: &Tpm2Token,
    signed: Option<&Signed>,
    private: Private,
    public: Public,
    pin: Option<&Secret>,
) -> Result<Secret, Error> {
    let hmac = start_session(ctx, primary, SessionType::Hmac)?;
    let (attrs, mask) = SessionAttributesBuilder::new()
        .with_decrypt(true)
        .with_encrypt(true)
        .with_continue_session(true)
        .build();
    ctx.tr_sess_set_attributes(hmac, attrs, mask)
        .map_err(|e| fail("Failed to configure TPM session", e))?;
    let session = start_session(ctx, primary, SessionType::Policy)?;
    let result = (|| {
        let policy = PolicySession::try_from(session)
            .map_err(|e| fail("Failed to open session in TPM", e))?;
        let (bank, bank_name) = match t.pcr_bank {
            Some(PcrBank::Sha1) => (HashingAlgorithm::Sha1, "sha1"),
            _ => (HashingAlgorithm::Sha256, "sha256"),
        };
        if let Some(s) = signed {
            authorize(ctx, policy, bank, bank_name, s)?;
        }
        // systemd adds the literal PCR policy only for a non-empty mask (a
        // signed-only token has none; an empty PolicyPCR would change the
        // digest).
        if t.pcr_mask != 0 {
            policy_pcr(ctx, policy, bank, t.pcr_mask)?;
        }
        if t.pin {
            ctx.execute_without_session(|c| c.policy_auth_value(policy))
                .map_err(|e| fail("Failed to add authValue policy to TPM", e))?;
        }
        let digest = ctx
            .execute_without_session(|c| c.policy_get_digest(policy))
            .map_err(|e| fail("Failed to get policy digest from TPM", e))?;
        if !t.policy_hash.is_empty() && digest.value() != t.policy_hash.as_slice() {
            return Err(Error::policy(
                "Current policy digest does not match stored policy digest, cancelling TPM2 authentication attempt.".into(),
            ));
        }
        let key = ctx
            .execute_with_sessions((Some(AuthSession::Password), None, None), |c| {
                c.load(primary, private, public)
            })
            .map_err(|e| fail("Failed to load HMAC key in TPM", e))?;
        let out = (|| {
            if t.pin {
                let pin = pin.ok_or_else(|| Error::unavailable("A TPM2 PIN is needed".into()))?;
                let auth = Auth::try_from(Sha256::digest(&pin[..]).to_vec())
                    .map_err(|e| fail("Failed to load PIN in TPM", e))?;
                ctx.tr_set_auth(ObjectHandle::from(key), auth)
                    .map_err(|e| fail("Failed to load PIN in TPM", e))?;
            }
            let data = ctx
                .execute_with_sessions((Some(session), Some(hmac), None), |c| c.unseal(key.into()))
                .map_err(|e| {
                    let s = e.to_string();
                    if t.pin
                        && (s.contains("authorization HMAC check failed")
                            || s.contains("authorization failure"))
                    {
                        Error::wrong_pin(format!("Failed to unseal HMAC key in TPM: {s}"))
                    } else {
                        fail("Failed to unseal HMAC key in TPM", s)
                    }
                })?;
            Ok(Secret::from_slice(data.value()))
        })();
        let _ = ctx.flush_context(key.into());
        out
    })();
    let _ = ctx.flush_context(SessionHandle::from(session).into());
    let _ = ctx.flush_context(SessionHandle::from(hmac).into());
    result
}

/// PolicyPCR over the PCRs of `mask` in `bank`.
fn policy_pcr(
    ctx: &mut Context,
    policy: PolicySession,
    bank: HashingAlgorithm,
    mask: u32,
) -> Result<(), Error> {
    let slots: Vec<PcrSlot> = (0..24)
        .filter(|i| mask & (1 << i) != 0)
        .filter_map(|i| PcrSlot::try_from(1u32 << i).ok())
        .collect();
    let selection = PcrSelectionListBuilder::new()
        .with_selection(bank, &slots)
        .build()
        .map_err(|e| fail("Failed to add PCR policy to TPM", e))?;
    ctx.execute_without_session(|c| c.policy_pcr(policy, Digest::default(), selection))
        .map_err(|e| fail("Failed to add PCR policy to TPM", e))
}

/// The signed part of the policy, as systemd 252's
/// `tpm2_make_policy_session`: PolicyPCR over the signed PCRs, its digest
/// looked up in the signature JSON, the signature checked by the TPM
/// against the public key (loaded under the owner hierarchy, so the
/// ticket is a real one), then PolicyAuthorize with that ticket.
fn authorize(
    ctx: &mut Context,
    policy: PolicySession,
    bank: HashingAlgorithm,
    bank_name: &str,
    s: &Signed,
) -> Result<(), Error> {
    policy_pcr(ctx, policy, bank, s.mask)?;
    let approved = ctx
        .execute_without_session(|c| c.policy_get_digest(policy))
        .map_err(|e| fail("Failed to get policy digest from TPM", e))?;
    let sig = signature::find(
        &s.json,
        bank_name,
        s.mask,
        &s.key.fingerprint,
        approved.value(),
    )?;
    let public = rsa_public(&s.key)?;
    let key = ctx
        .execute_without_session(|c| c.load_external_public(public, Hierarchy::Owner))
        .map_err(|e| fail("Failed to load public key into TPM", e))?;
    let result = (|| {
        let name = ctx
            .tr_get_name(key.into())
            .map_err(|e| fail("Failed to get name of public key from TPM", e))?;
        let hash = Digest::try_from(Sha256::digest(approved.value()).to_vec())
            .map_err(|e| fail("Failed to validate signature in TPM", e))?;
        let sig = PublicKeyRsa::try_from(sig)
            .and_then(|sig| RsaSignature::create(HashingAlgorithm::Sha256, sig))
            .map_err(|_| Error::failed("Signature larger than buffer.".into()))?;
        let ticket = ctx
            .execute_without_session(|c| c.verify_signature(key, hash, Signature::RsaSsa(sig)))
            .map_err(|e| fail("Failed to validate signature in TPM", e))?;
        ctx.execute_without_session(|c| {
            c.policy_authorize(policy, approved, Nonce::default(), &name, ticket)
        })
        .map_err(|e| fail("Failed to push Authorize policy into TPM", e))
    })();
    let _ = ctx.flush_context(key.into());
    result
}

/// systemd 252's TPM2B_PUBLIC for a PEM key: RSA, SHA-256 name,
/// decrypt + sign + user-with-auth, no scheme, no symmetric algorithm.
/// Its name goes into the policy, so every field must be systemd's.
fn rsa_public(key: &PublicKey) -> Result<Public, Error> {
    let bad = |e: tss_esapi::Error| fail("Failed to load public key into TPM", e);
    let bits = u16::try_from(key.modulus.len() * 8)
        .ok()
        .and_then(|b| RsaKeyBits::try_from(b).ok())
        .ok_or_else(|| Error::malformed("RSA key size not supported by the TPM".into()))?;
    let attrs = ObjectAttributesBuilder::new()
        .with_decrypt(true)
        .with_sign_encrypt(true)
        .with_user_with_auth(true)
        .build()
        .map_err(bad)?;
    let params = PublicRsaParametersBuilder::new()
        .with_symmetric(SymmetricDefinitionObject::Null)
        .with_scheme(RsaScheme::Null)
        .with_key_bits(bits)
        .with_exponent(RsaExponent::create(key.exponent).map_err(bad)?)
        .with_is_signing_key(true)
        .with_is_decryption_key(true)
        .with_restricted(false)
        .build()
        .map_err(bad)?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Rsa)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attrs)
        .with_rsa_parameters(params)
        .with_rsa_unique_identifier(PublicKeyRsa::try_from(key.modulus.clone()).map_err(bad)?)
        .build()
        .map_err(bad)
}

fn start_session(
    ctx: &mut Context,
    primary: KeyHandle,
    ty: SessionType,
) -> Result<AuthSession, Error> {
    ctx.start_auth_session(
        Some(primary),
        None,
        None,
        ty,
        SymmetricDefinition::AES_128_CFB,
        HashingAlgorithm::Sha256,
    )
    .map_err(|e| fail("Failed to open session in TPM", e))?
    .ok_or_else(|| Error::failed("Failed to open session in TPM".into()))
}

/// `tpm2-blob`: a TPM2B_PRIVATE then a TPM2B_PUBLIC, each a big-endian
/// 16-bit size and that many bytes (tpm2-tss's marshalling).
fn split_blob(blob: &[u8]) -> Result<(Private, Public), Error> {
    let bad = || Error::malformed("tpm2-blob is not a TPM2B_PRIVATE and a TPM2B_PUBLIC".into());
    let take = |b: &[u8]| -> Option<(Vec<u8>, usize)> {
        let n = usize::from(u16::from_be_bytes([*b.first()?, *b.get(1)?]));
        Some((b.get(2..2 + n)?.to_vec(), 2 + n))
    };
    let (private, used) = take(blob).ok_or_else(bad)?;
    let (public, used2) = take(&blob[used..]).ok_or_else(bad)?;
    if used + used2 != blob.len() {
        return Err(bad());
    }
    let private = Private::try_from(private).map_err(|_| bad())?;
    let public = Public::unmarshall(&public).map_err(|_| bad())?;
    Ok((private, public))
}

/// systemd's primary key: ECC NIST P-256 (or RSA 2048) storage key under
/// the owner hierarchy, AES-128-CFB, no scheme, empty unique field.
fn primary(ctx: &mut Context, alg: Option<PrimaryAlg>) -> Result<KeyHandle, Error> {
    let attrs = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_decrypt(true)
        .with_restricted(true)
        .build()
        .map_err(|e| fail("Failed to generate primary key in TPM", e))?;
    let ecc = || {
        PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::Ecc)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attrs)
            .with_ecc_parameters(
                PublicEccParametersBuilder::new()
                    .with_symmetric(SymmetricDefinitionObject::AES_128_CFB)
                    .with_ecc_scheme(EccScheme::Null)
                    .with_curve(EccCurve::NistP256)
                    .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                    .with_is_decryption_key(true)
                    .with_restricted(true)
                    .build()?,
            )
            .with_ecc_unique_identifier(EccPoint::default())
            .build()
    };
    let rsa = || {
        PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::Rsa)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attrs)
            .with_rsa_parameters(
                PublicRsaParametersBuilder::new()
                    .with_symmetric(SymmetricDefinitionObject::AES_128_CFB)
                    .with_scheme(RsaScheme::Null)
                    .with_key_bits(RsaKeyBits::Rsa2048)
                    .with_exponent(RsaExponent::default())
                    .with_is_decryption_key(true)
                    .with_restricted(true)
                    .build()?,
            )
            .with_rsa_unique_identifier(PublicKeyRsa::default())
            .build()
    };
    let mut create = |public: tss_esapi::Result<Public>| {
        let public = public.map_err(|e| fail("Failed to generate primary key in TPM", e))?;
        ctx.execute_with_session(Some(AuthSession::Password), |c| {
            c.create_primary(Hierarchy::Owner, public, None, None, None, None)
        })
        .map(|r| r.key_handle)
        .map_err(|e| fail("Failed to generate primary key in TPM", e))
    };
    match alg {
        Some(PrimaryAlg::Ecc) => create(ecc()),
        Some(PrimaryAlg::Rsa) => create(rsa()),
        None => create(ecc()).or_else(|_| create(rsa())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_must_be_two_sized_parts() {
        for blob in [
            &[][..],
            &[0, 5, 1],
            &[0, 0],
            &[0, 0, 0, 1],
            &[0, 0, 0, 0, 9],
        ] {
            assert!(
                split_blob(blob).err().map(|e| e.kind()) == Some(crate::ErrorKind::Malformed),
                "{blob:?}"
            );
        }
    }

    #[test]
    fn device_spellings() {
        assert!(matches!(
            tcti(Some("/dev/tpmrm0")),
            Ok(TctiNameConf::Device(_))
        ));
        assert!(matches!(
            tcti(Some("swtpm:host=127.0.0.1,port=2321")),
            Ok(TctiNameConf::Swtpm(_))
        ));
        assert!(tcti(Some("nonsense")).is_err());
    }
}
