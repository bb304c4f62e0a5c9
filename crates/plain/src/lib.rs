//! Plain dm-crypt volumes built as `cryptsetup open --type plain` builds
//! them (cryptsetup 2.6.1: `src/cryptsetup.c` `action_open_plain`,
//! `lib/setup.c` `process_key`, `lib/crypt_plain.c`), so a user never has
//! to write a table line:
//!
//! ```text
//!  --cipher  (aes-cbc-essiv:sha256)  NAME-MODE, "NAME" alone = NAME-cbc-plain
//!  --key-size (256 bits)             the volume key length
//!  key material:
//!    --key-file FILE    raw bytes at --keyfile-offset, exactly key-size long;
//!                       never hashed (--hash and --keyfile-size are ignored)
//!    --key-file -       stdin, --keyfile-offset/--keyfile-size applied, hashed
//!                       (raw key-size bytes with --hash plain)
//!    none               passphrase prompt (or one line of piped stdin), hashed
//!  --hash (ripemd160)   HASH[:LEN]: round i hashes "A"*i ‖ passphrase until
//!                       the key is full; LEN bytes of it, the rest zeros.
//!                       `plain` copies the passphrase (cropped / zero-padded)
//!  --offset, --skip, --size (sectors), --sector-size, --iv-large-sectors
//! ```
//!
//! The result is the [`Table`] dm-crypt would get:
//! `0 SIZE crypt CIPHER KEY SKIP DEVICE OFFSET [sector_size:N iv_large_sectors]`.
//!
//! A volume format beside `luks`, `tcrypt`, `bitlk` and `fvault2`: the
//! daemon's `resolve` turns `open --type plain`'s options into
//! [`PlainOptions`] and serves the table. The key stays in a [`Secret`].
#![forbid(unsafe_code)]

use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crypto::spec::CipherSpec;
use crypto::table::{Options, Table};
use crypto::Secret;
use luks::passphrase::KeyfileRange;

mod error;

pub use error::{Error, ErrorKind};

use error::{invalid, Result};

/// cryptsetup 2.6's plain-mode cipher.
pub const DEFAULT_CIPHER: &str = "aes-cbc-essiv:sha256";
/// cryptsetup 2.6's plain-mode key size, in bits.
pub const DEFAULT_KEY_BITS: u32 = 256;
/// cryptsetup 2.6's plain-mode passphrase hash.
pub const DEFAULT_HASH: &str = "ripemd160";

/// `open --type plain`'s options, as cryptsetup names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlainOptions {
    /// `--cipher` (default [`DEFAULT_CIPHER`]).
    pub cipher: Option<String>,
    /// `--key-size` in bits (default [`DEFAULT_KEY_BITS`]).
    pub key_bits: Option<u32>,
    /// `--hash` (default [`DEFAULT_HASH`]; `plain` = no hashing).
    pub hash: Option<String>,
    /// `--offset`: data start on the device, 512-byte sectors.
    pub offset: u64,
    /// `--skip`: IV offset, 512-byte sectors.
    pub skip: u64,
    /// `--size` in 512-byte sectors (0 or `None`: the rest of the device).
    pub size: Option<u64>,
    /// `--sector-size` in bytes (default 512).
    pub sector_size: Option<u32>,
    /// `--iv-large-sectors`.
    pub iv_large_sectors: bool,
    /// `--key-file` (`-` = stdin).
    pub key_file: Option<PathBuf>,
    /// `--keyfile-offset` and `--keyfile-size`.
    pub keyfile: KeyfileRange,
    /// How a passphrase typed at the terminal is asked for (`--timeout`, `-y`).
    pub prompting: luks::passphrase::Prompting,
    /// How an `rbd:` device reaches its cluster (its size is asked).
    pub ceph: backend::rbd::RbdConfig,
}

/// Where the key material comes from, and how it becomes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPlan {
    /// The key file (`-` = stdin), or `None` for the passphrase prompt.
    pub key_file: Option<PathBuf>,
    /// What part of it is read.
    pub range: KeyfileRange,
    /// The hash applied (`None`: the bytes are the key, cropped or padded).
    pub hash: Option<String>,
    /// Key length in bytes.
    pub key_len: usize,
}

impl PlainOptions {
    /// Key size in bytes.
    pub fn key_len(&self) -> Result<usize> {
        let bits = self.key_bits.unwrap_or(DEFAULT_KEY_BITS);
        // cryptsetup: volume_key_size > 1024 bytes is "Invalid key size."
        if bits & 7 != 0 || bits / 8 > 1024 {
            return Err(invalid("Invalid key size."));
        }
        Ok(bits as usize / 8)
    }

    /// The cipher spec after cryptsetup's `crypt_parse_name_and_mode`:
    /// `NAME-MODE`; a bare `NAME` or a `plain` mode is `cbc-plain`; `null`
    /// is `cipher_null-ecb`.
    pub fn cipher_spec(&self) -> Result<String> {
        let s = self.cipher.as_deref().unwrap_or(DEFAULT_CIPHER);
        if s == "null" || s == "cipher_null" {
            return Ok("cipher_null-ecb".into());
        }
        let (name, mode) = match s.split_once('-') {
            Some((n, m)) if !n.is_empty() && !m.is_empty() => {
                (n, if m == "plain" { "cbc-plain" } else { m })
            }
            None if !s.is_empty() => (s, "cbc-plain"),
            _ => return Err(invalid("No known cipher specification pattern detected.")),
        };
        Ok(format!("{name}-{mode}"))
    }

    /// Warnings cryptsetup prints for these options (without --batch-mode).
    pub fn warnings(&self) -> Vec<&'static str> {
        let mut w = Vec::new();
        if self.key_file_is_file() {
            if self.hash.is_some() {
                w.push(
                    "WARNING: The --hash parameter is being ignored in plain mode with keyfile specified.",
                );
            }
            if self.keyfile.size.is_some() {
                w.push(
                    "WARNING: The --keyfile-size option is being ignored, the read size is the same as the encryption key size.",
                );
            }
        }
        w
    }

    fn key_file_is_file(&self) -> bool {
        self.key_file
            .as_deref()
            .is_some_and(|p| p != Path::new("-"))
    }

    /// How the key is obtained (cryptsetup's `action_open_plain`).
    pub fn key_plan(&self) -> Result<KeyPlan> {
        let key_len = self.key_len()?;
        let hash = if self.key_file_is_file() {
            None
        } else {
            Some(self.hash.as_deref().unwrap_or(DEFAULT_HASH)).filter(|h| *h != "plain")
        };
        let size = if self.key_file_is_file() || (self.key_file.is_some() && hash.is_none()) {
            Some(key_len as u64)
        } else {
            self.keyfile.size.filter(|&n| n > 0)
        };
        Ok(KeyPlan {
            key_file: self.key_file.clone(),
            range: KeyfileRange {
                offset: self.keyfile.offset,
                size,
            },
            hash: hash.map(str::to_owned),
            key_len,
        })
    }

    /// Reads the key material ([`KeyPlan`]): the key file's range, or the
    /// passphrase (`Enter passphrase for DEVICE: ` on a terminal).
    pub fn read_material(&self, device: &Path) -> Result<Secret> {
        let plan = self.key_plan()?;
        let prompt = format!("Enter passphrase for {}: ", device.display());
        // A piped passphrase takes the range too; a terminal refuses an
        // offset (luks::passphrase::Prompting::read_range), as cryptsetup does.
        self.prompting
            .read_range(plan.key_file.as_deref(), plan.range, &prompt, false)
            .map_err(Error::key)
    }

    /// The volume key from the key material (cryptsetup's `process_key`).
    pub fn derive_key(&self, material: &[u8]) -> Result<Secret> {
        let plan = self.key_plan()?;
        match plan.hash.as_deref() {
            Some(h) => plain_hash(h, plan.key_len, material),
            None => {
                let mut key = vec_secret(plan.key_len);
                let n = material.len().min(plan.key_len);
                key[..n].copy_from_slice(&material[..n]);
                Ok(key)
            }
        }
    }

    /// The table for `device` with `key`, checking the device is large
    /// enough and aligned as cryptsetup does.
    pub fn table(&self, device: &Path, key: Secret) -> Result<Table> {
        let spec = self.cipher_spec()?;
        let cipher = CipherSpec::parse(&spec).map_err(|e| {
            invalid(format!(
                "Cipher {spec} (key size {} bits) is not available",
                key.len() * 8
            ))
            .with_source(e)
        })?;
        let sector_size = self.sector_size.unwrap_or(512);
        if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(invalid("Unsupported encryption sector size."));
        }
        if self.iv_large_sectors && sector_size <= 512 {
            return Err(invalid(
                "Large IV sectors option is supported only for opening plain type device with sector size larger than 512 bytes.",
            ));
        }
        let dev_bytes = device_bytes(device, &self.ceph)?;
        let dev_sectors = dev_bytes / 512;
        if self.offset >= dev_sectors {
            return Err(invalid(format!(
                "Requested offset is beyond real size of device {}.",
                device.display()
            )));
        }
        if sector_size > 512 && (dev_bytes - self.offset * 512) & (u64::from(sector_size) - 1) != 0
        {
            return Err(invalid(
                "Device size is not aligned to requested sector size.",
            ));
        }
        let size = match self.size {
            Some(s) if s > 0 => {
                if dev_sectors - self.offset < s {
                    return Err(invalid(format!(
                        "Device {} is too small.",
                        device.display()
                    )));
                }
                s
            }
            _ => dev_sectors - self.offset,
        };
        let options = Options {
            sector_size,
            iv_large_sectors: self.iv_large_sectors,
            ..Options::default()
        };
        let device = device
            .to_str()
            .ok_or_else(|| invalid("The device path is not UTF-8"))?
            .to_owned();
        Table::from_parts(
            0,
            size,
            cipher,
            key,
            self.skip,
            device,
            self.offset,
            options,
        )
        .map_err(|e| invalid("Invalid plain crypt parameters").with_source(e))
    }

    /// Reads the key material, derives the key and builds the table.
    pub fn open(&self, device: &Path) -> Result<Table> {
        // Option errors come before any prompt, as in cryptsetup.
        self.cipher_spec()?;
        self.key_plan()?;
        let material = self.read_material(device)?;
        let key = self.derive_key(&material)?;
        self.table(device, key)
    }
}

fn vec_secret(len: usize) -> Secret {
    Secret::zeroed(len)
}

/// Size of a file or block device (or an `rbd:` image, its cluster
/// reached as `ceph` says) in bytes.
fn device_bytes(device: &Path, ceph: &backend::rbd::RbdConfig) -> Result<u64> {
    if backend::rbd::is_rbd(device) {
        let ro = backend::FileOptions {
            read_only: true,
            ..backend::FileOptions::default()
        };
        return backend::open_device(device, &ro, ceph)
            .map(|b| b.size())
            .map_err(Error::backend);
    }
    std::fs::File::open(device)
        .and_then(|mut f| f.seek(SeekFrom::End(0)))
        .map_err(|e| {
            Error::new(
                ErrorKind::NoDevice,
                format!("Cannot use device {}", device.display()),
            )
            .with_source(e)
        })
}

/// cryptsetup's `crypt_plain_hash`: `hash_spec` is `HASH` or `HASH:LEN`
/// (LEN bytes hashed, the rest of the `key_len`-byte key zeros); `plain`
/// copies the passphrase. Each digest-sized piece of the key is the hash
/// of `round` letters `A` followed by the passphrase.
pub fn plain_hash(hash_spec: &str, key_len: usize, passphrase: &[u8]) -> Result<Secret> {
    let processing = || invalid(format!("Key processing error (using hash {hash_spec})."));
    let (name, hashed_len) = match hash_spec.split_once(':') {
        Some((n, l)) => {
            let l: usize = l.parse().map_err(|_| processing())?;
            if l > key_len {
                return Err(processing());
            }
            (n, l)
        }
        None => (hash_spec, key_len),
    };
    let mut key = vec_secret(key_len);
    if name == "plain" {
        if passphrase.len() < hashed_len {
            return Err(processing());
        }
        key[..hashed_len].copy_from_slice(&passphrase[..hashed_len]);
        return Ok(key);
    }
    let hash = luks::Hash::parse(name)
        .map_err(|_| invalid(format!("Hash algorithm {hash_spec} not supported.")))?;
    let prefix = vec![b'A'; hashed_len.div_ceil(hash.digest_len().max(1))];
    let mut done = 0;
    let mut round = 0;
    while done < hashed_len {
        let n = hash.digest_len().min(hashed_len - done);
        hash.digest_into(&[&prefix[..round], passphrase], &mut key[done..done + n]);
        done += n;
        round += 1;
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> PlainOptions {
        PlainOptions::default()
    }

    #[test]
    fn cipher_names_as_crypt_parse_name_and_mode() {
        for (given, want) in [
            (None, "aes-cbc-essiv:sha256"),
            (Some("aes"), "aes-cbc-plain"),
            (Some("aes-plain"), "aes-cbc-plain"),
            (Some("aes-xts-plain64"), "aes-xts-plain64"),
            (Some("null"), "cipher_null-ecb"),
        ] {
            let o = PlainOptions {
                cipher: given.map(str::to_owned),
                ..opts()
            };
            assert_eq!(o.cipher_spec().unwrap(), want, "{given:?}");
        }
        for bad in ["", "-xts", "aes-"] {
            let o = PlainOptions {
                cipher: Some(bad.into()),
                ..opts()
            };
            assert_eq!(o.cipher_spec().unwrap_err().kind(), ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn key_files_are_raw_and_stdin_is_hashed() {
        let file = PlainOptions {
            key_file: Some("/k".into()),
            hash: Some("sha256".into()),
            keyfile: KeyfileRange {
                offset: 3,
                size: Some(7),
            },
            ..opts()
        };
        let p = file.key_plan().unwrap();
        assert_eq!((p.hash, p.range.offset, p.range.size), (None, 3, Some(32)));
        assert_eq!(file.warnings().len(), 2);

        let stdin = PlainOptions {
            key_file: Some("-".into()),
            ..opts()
        };
        let p = stdin.key_plan().unwrap();
        assert_eq!((p.hash.as_deref(), p.range.size), (Some("ripemd160"), None));
        let raw_stdin = PlainOptions {
            hash: Some("plain".into()),
            ..stdin
        };
        let p = raw_stdin.key_plan().unwrap();
        assert_eq!((p.hash, p.range.size), (None, Some(32)));
        assert!(raw_stdin.warnings().is_empty());
    }

    #[test]
    fn hashing_rounds_prefix_the_letter_a() {
        // 64 bytes of key from a 20-byte digest: 4 rounds.
        let k = plain_hash("ripemd160", 64, b"pass").unwrap();
        let mut want = Vec::new();
        for round in 0..4 {
            let mut d = [0u8; 20];
            let a = vec![b'A'; round];
            luks::Hash::Ripemd160.digest_into(&[&a, b"pass"], &mut d);
            want.extend_from_slice(&d);
        }
        assert_eq!(&k[..], &want[..64]);
        // A published value: RIPEMD-160("abc").
        let k = plain_hash("ripemd160", 20, b"abc").unwrap();
        assert_eq!(hex(&k), "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc");
        // HASH:LEN hashes LEN bytes and zero-pads.
        let k = plain_hash("sha256:16", 32, b"abc").unwrap();
        assert_eq!(hex(&k[..16]), "ba7816bf8f01cfea414140de5dae2223");
        assert!(k[16..].iter().all(|&b| b == 0));
        // plain crops; too short fails; HASH:LEN > key fails; unknown hash fails.
        assert_eq!(&plain_hash("plain", 3, b"abcd").unwrap()[..], b"abc");
        for (spec, len) in [
            ("plain", 8),
            ("sha256:40", 32),
            ("sha256:x", 32),
            ("md4", 32),
        ] {
            let e = plain_hash(spec, len, b"abcd").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{spec}");
        }
    }

    #[test]
    fn unhashed_keys_are_cropped_or_zero_padded() {
        let o = PlainOptions {
            hash: Some("plain".into()),
            key_bits: Some(64),
            ..opts()
        };
        assert_eq!(&o.derive_key(b"abc").unwrap()[..], b"abc\0\0\0\0\0");
        assert_eq!(&o.derive_key(b"0123456789").unwrap()[..], b"01234567");
    }

    #[test]
    fn tables_fit_the_device() {
        let dir = testutil::TempDir::new("plain");
        let dev = dir.join("dev");
        std::fs::write(&dev, vec![0u8; 64 * 512]).unwrap();
        let o = PlainOptions {
            offset: 8,
            skip: 16,
            ..opts()
        };
        let t = o.table(&dev, vec_secret(32)).unwrap();
        assert_eq!(
            t.format(false),
            format!(
                "0 56 crypt aes-cbc-essiv:sha256 {} 16 {} 8",
                "0".repeat(64),
                dev.display()
            )
        );
        let o = PlainOptions {
            cipher: Some("aes-xts-plain64".into()),
            key_bits: Some(512),
            sector_size: Some(4096),
            iv_large_sectors: true,
            size: Some(16),
            ..opts()
        };
        let t = o.table(&dev, vec_secret(64)).unwrap();
        assert!(t.format(false).starts_with("0 16 crypt aes-xts-plain64 "));
        assert!(t
            .format(false)
            .ends_with(" 0 2 sector_size:4096 iv_large_sectors"));
        for (o, msg) in [
            (
                PlainOptions {
                    offset: 64,
                    ..opts()
                },
                "beyond real size",
            ),
            (
                PlainOptions {
                    size: Some(65),
                    ..opts()
                },
                "is too small",
            ),
            (
                PlainOptions {
                    offset: 1,
                    sector_size: Some(4096),
                    ..opts()
                },
                "not aligned",
            ),
            (
                PlainOptions {
                    sector_size: Some(1000),
                    ..opts()
                },
                "sector size",
            ),
            (
                PlainOptions {
                    iv_large_sectors: true,
                    ..opts()
                },
                "Large IV",
            ),
        ] {
            let e = o.table(&dev, vec_secret(32)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.chain().contains(msg), "{}", e.chain());
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
