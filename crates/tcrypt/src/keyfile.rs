//! The password pool: TrueCrypt's keyfile mixing (a running CRC-32 of each
//! keyfile's first MiB added into the pool byte by byte), then the
//! passphrase added on top, as cryptsetup's `TCRYPT_pool_keyfile` and
//! `TCRYPT_init_hdr` do.

use std::io::Read;
use std::path::PathBuf;

use zeroize::Zeroizing;

use crate::{Error, ErrorKind, Result};

/// TrueCrypt's pool (and longest passphrase).
const POOL: usize = 64;
/// VeraCrypt's, used when the passphrase is longer than 64 bytes.
const POOL_VERA: usize = 128;
/// Bytes of a keyfile that count.
const KEYFILE_MAX: u64 = 1 << 20;

/// One step of the CRC-32 (IEEE) register without the final inversion,
/// as cryptsetup's `crypt_crc32(crc, &byte, 1)`: `crc32fast` keeps the
/// inverted register, hence the inversions around it.
fn crc_step(crc: u32, byte: u8) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!crc);
    h.update(&[byte]);
    !h.finalize()
}

/// The PBKDF2 password: the keyfiles' pool with the passphrase added;
/// its length is the pool's when keyfiles are given, else the
/// passphrase's.
pub(crate) fn pool(
    passphrase: &[u8],
    keyfiles: &[PathBuf],
    veracrypt: bool,
) -> Result<Zeroizing<Vec<u8>>> {
    let len = if veracrypt && passphrase.len() > POOL {
        POOL_VERA
    } else {
        POOL
    };
    if passphrase.len() > len {
        return Err(Error::new(
            ErrorKind::NoHeader,
            format!("Maximum TCRYPT passphrase length ({len}) exceeded."),
        ));
    }
    let mut pool = Zeroizing::new(vec![0u8; POOL_VERA]);
    for kf in keyfiles {
        let f = std::fs::File::open(kf).map_err(|e| Error::io("Failed to open key file.", e))?;
        let mut data = Zeroizing::new(Vec::new());
        f.take(KEYFILE_MAX)
            .read_to_end(&mut data)
            .map_err(|e| Error::io(format!("Error reading keyfile {}.", kf.display()), e))?;
        let (mut j, mut crc) = (0usize, !0u32);
        for &b in data.iter() {
            crc = crc_step(crc, b);
            for s in [24, 16, 8, 0] {
                pool[j] = pool[j].wrapping_add((crc >> s) as u8);
                j += 1;
            }
            j %= len;
        }
    }
    for (p, &c) in pool.iter_mut().zip(passphrase) {
        *p = p.wrapping_add(c);
    }
    pool.truncate(if keyfiles.is_empty() {
        passphrase.len()
    } else {
        len
    });
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_steps_make_the_ieee_crc() {
        let crc = b"123456789".iter().fold(!0u32, |c, &b| crc_step(c, b));
        assert_eq!(!crc, 0xcbf4_3926);
    }

    #[test]
    fn passphrase_alone_is_itself_and_length_limits_hold() {
        assert_eq!(&pool(b"abc", &[], true).expect("pool")[..], b"abc");
        assert!(pool(&[b'a'; 72], &[], true).is_ok());
        assert!(pool(&[b'a'; 72], &[], false).is_err());
        assert!(pool(&[b'a'; 129], &[], true).is_err());
    }

    #[test]
    fn a_missing_keyfile_is_an_io_error() {
        let e = pool(b"x", &[PathBuf::from("/nonexistent/kf")], true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
    }
}
