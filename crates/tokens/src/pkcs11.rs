//! `systemd-pkcs11`: the token's `pkcs11-key` decrypted (RSA PKCS#1 v1.5,
//! as systemd 252 encrypts it to the certificate's public key) by the
//! private key its `pkcs11-uri` names, through the `cryptoki` crate. The
//! keyslot passphrase is the decrypted secret's base64, as systemd's.
//!
//! The module is the one given (`--pkcs11-module`, or `module-path=` in
//! the URI), else p11-kit's proxy module, which offers every module p11-kit
//! has registered (`/usr/share/p11-kit/modules/*.module`), as systemd's
//! `p11_kit_modules_load_and_initialize` does. The URI (RFC 7512) is parsed
//! here (hand-written: only the path attributes systemd matches on).

use std::path::{Path, PathBuf};

use crypto::Secret;
use cryptoki::context::{CInitializeArgs, Pkcs11};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass};
use cryptoki::session::UserType;
use cryptoki::types::RawAuthPin;

use crate::token::Pkcs11Token;
use crate::Error;

/// Where p11-kit's proxy module is on common distributions.
const PROXY_MODULES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/p11-kit-proxy.so",
    "/usr/lib/aarch64-linux-gnu/p11-kit-proxy.so",
    "/usr/lib64/p11-kit-proxy.so",
    "/usr/lib/p11-kit-proxy.so",
];

/// The attributes of a PKCS#11 URI that select a token and an object.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Uri {
    /// `token=` (the token label).
    pub token: Option<String>,
    /// `manufacturer=`.
    pub manufacturer: Option<String>,
    /// `model=`.
    pub model: Option<String>,
    /// `serial=`.
    pub serial: Option<String>,
    /// `object=` (the object label).
    pub object: Option<String>,
    /// `id=` (the object id, percent-decoded bytes).
    pub id: Option<Vec<u8>>,
    /// `module-path=` (query attribute).
    pub module_path: Option<PathBuf>,
}

impl Uri {
    /// Parses `pkcs11:attr=value;...[?query]`; values are percent-decoded.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = |w: &str| Error::malformed(format!("PKCS#11 URI \"{s}\": {w}"));
        let rest = s
            .strip_prefix("pkcs11:")
            .ok_or_else(|| bad("does not start with pkcs11:"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut uri = Uri::default();
        let attrs = path.split(';').chain(query.split('&'));
        for a in attrs.filter(|a| !a.is_empty()) {
            let (k, v) = a
                .split_once('=')
                .ok_or_else(|| bad("attribute without '='"))?;
            let v = percent_decode(v).ok_or_else(|| bad("bad percent-encoding"))?;
            let text = || String::from_utf8(v.clone()).map_err(|_| bad("value is not UTF-8"));
            match k {
                "token" => uri.token = Some(text()?),
                "manufacturer" => uri.manufacturer = Some(text()?),
                "model" => uri.model = Some(text()?),
                "serial" => uri.serial = Some(text()?),
                "object" => uri.object = Some(text()?),
                "id" => uri.id = Some(v),
                "module-path" => uri.module_path = Some(PathBuf::from(text()?)),
                _ => {}
            }
        }
        Ok(uri)
    }
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The module to load: `given`, the URI's `module-path`, or p11-kit's proxy.
fn module(given: Option<&Path>, uri: &Uri) -> Result<PathBuf, Error> {
    if let Some(p) = given.or(uri.module_path.as_deref()) {
        return Ok(p.to_path_buf());
    }
    PROXY_MODULES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| {
            Error::unavailable("No PKCS#11 module: p11-kit's proxy module is not installed".into())
        })
}

/// Decrypts `t`'s key on the token its URI names; `pin` is asked for
/// (with the token's label) only when a matching token is present (none:
/// [`ErrorKind::Absent`](crate::ErrorKind::Absent)). The module is loaded
/// and initialised for this call alone, so a token plugged in since the
/// last call is seen. Returns the keyslot passphrase.
pub fn decrypt(
    t: &Pkcs11Token,
    uri_override: Option<&str>,
    module_path: Option<&Path>,
    pin: &mut dyn FnMut(&str) -> Result<Secret, Error>,
) -> Result<Secret, Error> {
    let uri = Uri::parse(uri_override.unwrap_or(&t.uri))?;
    let path = module(module_path, &uri)?;
    let p11 = Pkcs11::new(&path).map_err(|e| {
        Error::unavailable(format!(
            "Cannot load PKCS#11 module {}: {e}",
            path.display()
        ))
    })?;
    p11.initialize(CInitializeArgs::OsThreads)
        .map_err(|e| Error::unavailable(format!("Cannot initialise PKCS#11 module: {e}")))?;
    let slots = p11
        .get_slots_with_token()
        .map_err(|e| Error::unavailable(format!("Cannot list PKCS#11 slots: {e}")))?;
    let matches =
        |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have.trim_end());
    let slot = slots
        .into_iter()
        .find(|s| {
            p11.get_token_info(*s).is_ok_and(|i| {
                matches(&uri.token, i.label())
                    && matches(&uri.manufacturer, i.manufacturer_id())
                    && matches(&uri.model, i.model())
                    && matches(&uri.serial, i.serial_number())
            })
        })
        .ok_or_else(|| Error::absent("No matching PKCS#11 token present".into()))?;
    let label = p11
        .get_token_info(slot)
        .map(|i| i.label().trim_end().to_string())
        .unwrap_or_default();
    let session = p11
        .open_ro_session(slot)
        .map_err(|e| Error::failed(format!("Failed to open PKCS#11 session: {e}")))?;
    let pin = pin(&label)?;
    session
        .login_with_raw(UserType::User, &RawAuthPin::new(pin.to_vec()))
        .map_err(|e| {
            let s = e.to_string();
            if s.contains("PinIncorrect") || s.contains("PIN_INCORRECT") {
                Error::wrong_pin(format!("PIN for token '{label}' is incorrect"))
            } else {
                Error::failed(format!("Failed to log into security token '{label}': {s}"))
            }
        })?;
    let mut template = vec![Attribute::Class(ObjectClass::PRIVATE_KEY)];
    if let Some(id) = &uri.id {
        template.push(Attribute::Id(id.clone()));
    }
    if let Some(label) = &uri.object {
        template.push(Attribute::Label(label.as_bytes().to_vec()));
    }
    let keys = session
        .find_objects(&template)
        .map_err(|e| Error::failed(format!("Failed to find private key: {e}")))?;
    let key = match keys.as_slice() {
        [k] => *k,
        [] => return Err(Error::failed("Failed to find private key on token".into())),
        _ => {
            return Err(Error::failed(
                "Found more than one matching private key on token".into(),
            ))
        }
    };
    let plain = session
        .decrypt(&Mechanism::RsaPkcs, key, &t.encrypted)
        .map_err(|e| Error::failed(format!("Failed to decrypt key on security token: {e}")))?;
    let plain = zeroize::Zeroizing::new(plain);
    Ok(crate::encode_passphrase(&plain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_attributes() {
        let u = Uri::parse("pkcs11:model=SoftHSM%20v2;manufacturer=SoftHSM%20project;serial=5f8c;token=ucrypt;id=%01%02;object=k?module-path=/x.so").unwrap();
        assert_eq!(u.model.as_deref(), Some("SoftHSM v2"));
        assert_eq!(u.token.as_deref(), Some("ucrypt"));
        assert_eq!(u.id, Some(vec![1, 2]));
        assert_eq!(u.object.as_deref(), Some("k"));
        assert_eq!(u.module_path, Some(PathBuf::from("/x.so")));
        for bad in [
            "pkcs12:x=1",
            "pkcs11:id=%0",
            "pkcs11:token",
            "pkcs11:id=%zz",
        ] {
            assert!(Uri::parse(bad).is_err(), "{bad}");
        }
    }
}
