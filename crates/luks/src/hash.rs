//! Hash algorithms named in LUKS headers (`hashSpec`, `af.hash`, `kdf.hash`,
//! digest `hash`): plain digests for the AF splitter and HMAC-based PBKDF2.

use sha1::Sha1;
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

use crate::error::{unsupported, Result};

/// A hash named in a LUKS header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hash {
    /// `sha1` (LUKS1 default before cryptsetup 1.7).
    Sha1,
    /// `sha224`.
    Sha224,
    /// `sha256` (today's default).
    Sha256,
    /// `sha384`.
    Sha384,
    /// `sha512`.
    Sha512,
    /// `ripemd160`.
    Ripemd160,
}

impl Hash {
    /// Parses a header's hash name (case-insensitive, as cryptsetup).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "sha1" => Hash::Sha1,
            "sha224" => Hash::Sha224,
            "sha256" => Hash::Sha256,
            "sha384" => Hash::Sha384,
            "sha512" => Hash::Sha512,
            "ripemd160" => Hash::Ripemd160,
            _ => return Err(unsupported(format!("Hash {name:?} is not supported"))),
        })
    }

    /// The name written to headers.
    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha1 => "sha1",
            Hash::Sha224 => "sha224",
            Hash::Sha256 => "sha256",
            Hash::Sha384 => "sha384",
            Hash::Sha512 => "sha512",
            Hash::Ripemd160 => "ripemd160",
        }
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Hash::Sha1 | Hash::Ripemd160 => 20,
            Hash::Sha224 => 28,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// Digest of the concatenation of `parts`, truncated/written into `out`
    /// (`out.len() <= self.digest_len()`).
    pub fn digest_into(self, parts: &[&[u8]], out: &mut [u8]) {
        fn run<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            let full = d.finalize();
            out.copy_from_slice(&full[..out.len()]);
        }
        match self {
            Hash::Sha1 => run::<Sha1>(parts, out),
            Hash::Sha224 => run::<Sha224>(parts, out),
            Hash::Sha256 => run::<Sha256>(parts, out),
            Hash::Sha384 => run::<Sha384>(parts, out),
            Hash::Sha512 => run::<Sha512>(parts, out),
            Hash::Ripemd160 => run::<ripemd::Ripemd160>(parts, out),
        }
    }

    /// PBKDF2-HMAC with this hash.
    pub fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        use pbkdf2::pbkdf2_hmac;
        match self {
            Hash::Sha1 => pbkdf2_hmac::<Sha1>(password, salt, iterations, out),
            Hash::Sha224 => pbkdf2_hmac::<Sha224>(password, salt, iterations, out),
            Hash::Sha256 => pbkdf2_hmac::<Sha256>(password, salt, iterations, out),
            Hash::Sha384 => pbkdf2_hmac::<Sha384>(password, salt, iterations, out),
            Hash::Sha512 => pbkdf2_hmac::<Sha512>(password, salt, iterations, out),
            Hash::Ripemd160 => pbkdf2_hmac::<ripemd::Ripemd160>(password, salt, iterations, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbkdf2_rfc6070_vector() {
        let mut out = [0u8; 20];
        Hash::Sha1.pbkdf2(b"password", b"salt", 2, &mut out);
        assert_eq!(hex::encode(out), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
    }

    #[test]
    fn names_round_trip() {
        for h in [
            Hash::Sha1,
            Hash::Sha224,
            Hash::Sha256,
            Hash::Sha384,
            Hash::Sha512,
            Hash::Ripemd160,
        ] {
            assert_eq!(Hash::parse(h.name()).unwrap(), h);
        }
        assert!(Hash::parse("md4").is_err());
    }
}
