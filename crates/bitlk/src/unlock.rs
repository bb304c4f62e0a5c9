//! From a passphrase, a recovery password or a startup key (`.BEK` file)
//! to the FVEK, as cryptsetup's `BITLK_get_volume_key` does: every VMK is
//! tried in order; the first that unwraps gives the key that unwraps the
//! FVEK.
//!
//! - passphrase: SHA-256 of SHA-256 of its UTF-16LE form (cryptsetup hashes
//!   twice the UTF-8 length in bytes, zero-padded, which is the same for
//!   ASCII), then 2^20 rounds of SHA-256 over `last ‖ initial ‖ salt ‖
//!   u64 count`;
//! - recovery password: 8 groups of 6 digits, each a multiple of 11; the
//!   quotients as 8 little-endian u16 are hashed once, then the same loop;
//! - startup key: the `.BEK` file's external key entry, used as it is.
//!
//! The wrapped keys are AES-256-CCM (12-byte nonce, 16-byte tag); the
//! plaintext starts with its own u16 size and 12 bytes of metadata.

use ccm::aead::{AeadInOut, KeyInit};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::error::{invalid, unsupported, Error, ErrorKind};
use crate::metadata::{
    entries, Cursor, Metadata, Protection, Vmk, Wrapped, TYPE_PROPERTY, TYPE_STARTUP_KEY,
    TYPE_VOLUME_GUID, VALUE_EXTERNAL_KEY, VALUE_GUID, VALUE_KEY, VALUE_STRING,
};
use crate::Result;
use crypto::Secret;

const KDF_ROUNDS: u64 = 0x10_0000;
const RECOVERY_LEN: usize = 55;
const KEY_METADATA_LEN: usize = 12;
const BEK_HEADER_LEN: usize = 48;
const STARTUP_KEY_HEADER_LEN: usize = 24;

type Aes256Ccm = ccm::Ccm<aes::Aes256, ccm::consts::U16, ccm::consts::U12>;

/// The stretch loop over an initial hash.
fn stretch(initial: &[u8; 32], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    // last (32) ‖ initial (32) ‖ salt (16) ‖ count (8, little-endian)
    let mut state = Zeroizing::new([0u8; 88]);
    state[32..64].copy_from_slice(initial);
    state[64..80].copy_from_slice(salt);
    for count in 0..KDF_ROUNDS {
        state[80..88].copy_from_slice(&count.to_le_bytes());
        let h = Sha256::digest(&state[..]);
        state[..32].copy_from_slice(&h);
    }
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&state[..32]);
    out
}

/// A user passphrase's key.
fn passphrase_key(pass: &[u8], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    // cryptsetup converts to UTF-16 (lossily here for invalid UTF-8) in a
    // zeroed buffer of one unit per input byte and hashes all of it.
    let text = String::from_utf8_lossy(pass);
    let mut units = Zeroizing::new(vec![0u8; pass.len() * 2]);
    for (i, u) in text.encode_utf16().take(pass.len()).enumerate() {
        units[2 * i..2 * i + 2].copy_from_slice(&u.to_le_bytes());
    }
    let once = Sha256::digest(&units[..]);
    let mut initial = Zeroizing::new([0u8; 32]);
    initial.copy_from_slice(&Sha256::digest(once));
    stretch(&initial, salt)
}

/// `strtol(s, NULL, 10)` over a 6-character group: leading blanks, a sign,
/// then digits.
fn strtol6(s: &[u8]) -> i64 {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let mut n = 0i64;
    while let Some(d) = s.get(i).filter(|c| c.is_ascii_digit()) {
        n = n * 10 + i64::from(d - b'0');
        i += 1;
    }
    if neg {
        -n
    } else {
        n
    }
}

/// The recovery key if `pass` has a recovery password's form.
fn recovery_key(pass: &[u8]) -> Option<Zeroizing<[u8; 16]>> {
    let pass = match pass.len() {
        RECOVERY_LEN => pass,
        // An extra newline, e.g. from a key file.
        56 if pass[55] == b'\n' => &pass[..55],
        _ => return None,
    };
    if (6..RECOVERY_LEN).step_by(7).any(|i| pass[i] != b'-') {
        return None;
    }
    let mut key = Zeroizing::new([0u8; 16]);
    for (j, group) in pass.chunks(7).enumerate() {
        let n = strtol6(&group[..6]);
        if n % 11 != 0 {
            return None;
        }
        // cryptsetup stores the quotient in a u16 (truncating, as here).
        key[2 * j..2 * j + 2].copy_from_slice(&((n / 11) as u16).to_le_bytes());
    }
    Some(key)
}

fn recovery_kdf(key: &[u8; 16], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    let mut initial = Zeroizing::new([0u8; 32]);
    initial.copy_from_slice(&Sha256::digest(key));
    stretch(&initial, salt)
}

/// A startup key from a `.BEK` file meant for `vmk` (cryptsetup's
/// `get_startup_key`): `WrongKey` when the file is for another VMK.
fn startup_key(bek: &[u8], vmk: &Vmk, volume: &Metadata) -> Result<Secret> {
    let wrong = || Error::new(ErrorKind::WrongKey, "");
    let c = Cursor::new(bek);
    if bek.len() < BEK_HEADER_LEN + 6 {
        return Err(wrong());
    }
    if c.guid(16) != Some(vmk.guid) {
        return Err(wrong());
    }
    let version = c.u32(4).unwrap_or(0);
    if version != 1 {
        return Err(unsupported(format!(
            "Unsupported BEK metadata version {version}"
        )));
    }
    let size = c.u32(0).unwrap_or(0);
    if size as usize != bek.len() {
        return Err(invalid(format!(
            "Unexpected BEK metadata size {size} does not match BEK file length"
        )));
    }
    let entry_size = c.u16(BEK_HEADER_LEN).unwrap_or(0);
    if (entry_size as usize) < 8 {
        return Err(invalid(""));
    }
    let (kind, value) = (
        c.u16(BEK_HEADER_LEN + 2).unwrap_or(0),
        c.u16(BEK_HEADER_LEN + 4).unwrap_or(0),
    );
    if kind != TYPE_STARTUP_KEY || value != VALUE_EXTERNAL_KEY {
        return Err(invalid(
            "Unexpected metadata entry found when parsing startup key.",
        ));
    }
    let list = bek
        .get(BEK_HEADER_LEN + 8 + STARTUP_KEY_HEADER_LEN..)
        .ok_or_else(|| invalid(""))?;
    let mut key = None;
    entries(list, 6, |e| {
        if e.kind != TYPE_PROPERTY && e.kind != TYPE_VOLUME_GUID {
            return Err(invalid(format!(
                "Unexpected metadata entry type '{}' found when parsing external key.",
                e.kind
            )));
        }
        match e.value {
            VALUE_KEY => {
                let k = e.data.get(12..).ok_or_else(|| invalid(""))?;
                key = Some(Secret::from_slice(k));
                Ok(false)
            }
            VALUE_STRING => Ok(true),
            VALUE_GUID => {
                let g = Cursor::new(e.rest).guid(8).ok_or_else(|| invalid(""))?;
                if g != volume.guid {
                    return Err(invalid(format!(
                        "BEK file GUID '{g}' does not match GUID of the volume."
                    )));
                }
                Ok(true)
            }
            v => Err(invalid(format!(
                "Unexpected metadata entry value '{v}' found when parsing external key."
            ))),
        }
    })?;
    key.ok_or_else(|| invalid(""))
}

/// Unwraps `w` with `key` (cryptsetup's `decrypt_key`); returns the key
/// after the 12-byte metadata. A tag mismatch is `Invalid` without a
/// message, as in cryptsetup.
fn unwrap_key(w: &Wrapped, key: &[u8], fvek_of: Option<&Metadata>) -> Result<Secret> {
    let cipher = Aes256Ccm::new_from_slice(key).map_err(|_| invalid(""))?;
    let mut buf = Secret::from_slice(&w.data);
    cipher
        .decrypt_inout_detached(
            (&w.nonce).into(),
            &[],
            (&mut buf[..]).into(),
            (&w.tag).into(),
        )
        .map_err(|_| invalid(""))?;
    let size = Cursor::new(&buf).u16(0).unwrap_or(0) as usize;
    if size != w.data.len() || size < KEY_METADATA_LEN {
        return Err(invalid("Unexpected key data size."));
    }
    let mut end = size;
    if let Some(m) = fvek_of {
        if m.cipher_mode == "cbc-elephant" && m.key_len() == 32 {
            // AES-128 with Elephant: 16 bytes CBC key, 16 unused, 16 bytes
            // Elephant key, 16 unused; dm-crypt takes the two keys joined.
            if size < KEY_METADATA_LEN + 48 {
                return Err(invalid("Unexpected key data size."));
            }
            buf.copy_within(
                KEY_METADATA_LEN + 32..KEY_METADATA_LEN + 48,
                KEY_METADATA_LEN + 16,
            );
            end = KEY_METADATA_LEN + 32;
        }
    }
    Ok(Secret::from_slice(&buf[KEY_METADATA_LEN..end]))
}

impl Metadata {
    /// The volume key (FVEK) from a passphrase, a recovery password or a
    /// `.BEK` file's bytes, trying every VMK as cryptsetup does. Errors:
    /// `WrongKey` ("No key available with this passphrase."), `Invalid`
    /// (often without a message: a key that did not unwrap),
    /// `Unsupported`.
    pub fn volume_key(&self, pass: &[u8]) -> Result<Secret> {
        let no_key = || {
            Error::new(
                ErrorKind::WrongKey,
                "No key available with this passphrase.",
            )
        };
        let fvek = self.fvek.as_ref().ok_or_else(|| invalid(""))?;
        let mut last: Option<Error> = None;
        for vmk in &self.vmks {
            let Some(wrapped) = vmk.keys.first() else {
                last = Some(invalid(""));
                continue;
            };
            let key: Secret = match vmk.protection {
                Protection::Passphrase => Secret::from_slice(&passphrase_key(pass, &vmk.salt)[..]),
                Protection::RecoveryPassphrase => match recovery_key(pass) {
                    Some(k) => Secret::from_slice(&recovery_kdf(&k, &vmk.salt)[..]),
                    None => {
                        last = Some(no_key());
                        continue;
                    }
                },
                Protection::StartupKey => match startup_key(pass, vmk, self) {
                    Ok(k) => k,
                    Err(e) => {
                        last = Some(if e.kind() == ErrorKind::WrongKey {
                            no_key()
                        } else {
                            e
                        });
                        continue;
                    }
                },
                _ => {
                    if last.is_none() {
                        last = Some(unsupported(""));
                    }
                    continue;
                }
            };
            let vmk_key = match unwrap_key(wrapped, &key, None) {
                Ok(k) => k,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match unwrap_key(fvek, &vmk_key, Some(self)) {
                Ok(k) => return Ok(k),
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(no_key);
        // An unsupported protector alone: cryptsetup says no more either.
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_password_form() {
        let ok = b"042647-302313-590458-071500-554323-116567-412181-516978";
        let k = recovery_key(ok).expect("valid recovery password");
        assert_eq!(u16::from_le_bytes([k[0], k[1]]), 42647 / 11);
        let mut nl = ok.to_vec();
        nl.push(b'\n');
        assert!(recovery_key(&nl).is_some());
        assert!(recovery_key(b"anaconda").is_none());
        let mut bad = *ok;
        bad[5] = b'8'; // 042648 is no multiple of 11
        assert!(recovery_key(&bad).is_none());
        let mut dash = *ok;
        dash[6] = b'+';
        assert!(recovery_key(&dash).is_none());
    }

    #[test]
    fn strtol_reads_like_c() {
        assert_eq!(strtol6(b"001234"), 1234);
        assert_eq!(strtol6(b" -0022"), -22);
        assert_eq!(strtol6(b"12ab56"), 12);
        assert_eq!(strtol6(b"abcdef"), 0);
    }
}
