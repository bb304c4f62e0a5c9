//! Reading the Core Storage metadata, unlocking, the dump and the table.

use std::fmt::Write as _;
use std::io;

use aes_kw::KeyInit;
use crypto::spec::CipherSpec;
use crypto::table::{Options, Table, Targets};
use crypto::Secret;
use sha2::{Digest, Sha256};

use crate::Result;

const CORE_STORAGE_MAGIC: u16 = 0x4353;
const VOL_HEADER_SIZE: usize = 512;
const MD_BLOCK_SIZE: usize = 8192;
/// cryptsetup reads no metadata past 1 GiB.
const MAX_OFF: u64 = 1 << 30;
const PWK_SIZE: usize = 284;
const KWVK_SIZE: usize = 256;
const WRAPPED_KEY_SIZE: usize = 24;
const SALT_SIZE: usize = 16;

/// What went wrong, in cryptsetup's errno terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Not a FileVault 2 volume, or metadata cryptsetup would not load.
    Invalid,
    /// The passphrase unwraps no key (`-EPERM`).
    WrongKey,
    /// Reading the device failed.
    Io,
}

/// An error with cryptsetup's message where it has one, in the
/// workspace's shape (docs/ARCHITECTURE.md, "Errors"; it has no source).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

fn invalid(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, m)
}

/// CRC32C (Castagnoli, reflected) from `seed`, without a final inversion.
fn crc32c(seed: u32, data: &[u8]) -> u32 {
    let mut crc = seed;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    crc
}

fn u16le(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The block's checksum: value and seed (0xffffffff) in its first 8 bytes.
fn check_crc(block: &[u8]) -> Result<()> {
    let (value, seed) = u32le(block, 0)
        .zip(u32le(block, 4))
        .ok_or_else(|| invalid("Invalid FVAULT2 metadata checksum."))?;
    if seed != 0xffff_ffff || crc32c(seed, &block[8..]) != value {
        return Err(invalid("Invalid FVAULT2 metadata checksum."));
    }
    Ok(())
}

/// 16 bytes as a lower-case UUID, in order.
fn uuid_text(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// A UUID's text to its 16 bytes (`uuid_parse`: 36 characters, dashes
/// at 8, 13, 18, 23, hex digits elsewhere, either case).
fn uuid_parse(t: &str) -> Option<[u8; 16]> {
    let t = t.as_bytes();
    if t.len() != 36 || [8, 13, 18, 23].iter().any(|&i| t[i] != b'-') {
        return None;
    }
    let hex: Vec<u8> = t.iter().copied().filter(|&c| c != b'-').collect();
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
        let s = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// cryptsetup's `<key>KEY</key><TYPE[^>]*>([^<]+)</TYPE>` search: the first
/// place in `xml` (up to a NUL) where it matches, its captured value.
fn search_xml<'a>(xml: &'a str, key: &str, ty: &str) -> Option<&'a str> {
    let xml = xml.split('\0').next().unwrap_or_default();
    let head = format!("<key>{key}</key><{ty}");
    let close = format!("</{ty}>");
    let mut from = 0;
    while let Some(i) = xml[from..].find(&head) {
        let at = from + i + head.len();
        from = from + i + 1;
        let rest = &xml[at..];
        let Some(gt) = rest.find('>') else { continue };
        let value = &rest[gt + 1..];
        let end = value.find('<').unwrap_or(value.len());
        if end > 0 && value[end..].starts_with(&close) {
            return Some(&value[..end]);
        }
    }
    None
}

/// `strtoull(s, NULL, 16)`: blanks, a sign, an optional `0x`, hex digits.
fn strtoull16(s: &str) -> u64 {
    let s = s.trim_start();
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    let digits: String = s.chars().take_while(char::is_ascii_hexdigit).collect();
    let v = if digits.is_empty() {
        0
    } else {
        u64::from_str_radix(&digits, 16).unwrap_or(u64::MAX)
    };
    if neg && v != u64::MAX {
        v.wrapping_neg()
    } else {
        v
    }
}

/// Reads `len` bytes at `offset`.
pub trait ReadAt {
    /// Fills `buf` from byte `offset`; a short read is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

fn read(dev: &(impl ReadAt + ?Sized), offset: u64, len: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    dev.read_at(offset, &mut v)
        .map_err(|e| Error::new(ErrorKind::Io, format!("Cannot read FVAULT2 metadata: {e}")))?;
    Ok(v)
}

/// A FileVault 2 volume's metadata.
#[derive(Clone, Debug)]
pub struct Metadata {
    /// The physical volume UUID.
    pub ph_vol_uuid: String,
    /// The logical volume family UUID.
    pub family_uuid: String,
    /// Where the logical volume starts on the device, in bytes.
    pub log_vol_off: u64,
    /// Its size in bytes.
    pub log_vol_size: u64,
    /// PBKDF2-SHA256 iterations of the passphrase.
    pub pbkdf2_iters: u32,
    /// Its salt.
    pub pbkdf2_salt: [u8; SALT_SIZE],
    wrapped_kek: [u8; WRAPPED_KEY_SIZE],
    wrapped_vk: [u8; WRAPPED_KEY_SIZE],
}

impl Metadata {
    /// Reads the metadata (cryptsetup's `FVAULT2_read_metadata`); `path`
    /// names the device in messages.
    pub fn read(dev: &(impl ReadAt + ?Sized), path: &str) -> Result<Self> {
        let not = || invalid(format!("Device {path} is not a valid FVAULT2 device."));
        // Volume header.
        let h = read(dev, 0, VOL_HEADER_SIZE).map_err(|_| not())?;
        check_crc(&h).map_err(|_| not())?;
        let version = u16le(&h, 8).unwrap_or(0);
        if version != 1 {
            return Err(invalid(format!("Unsupported FVAULT2 version {version}.")));
        }
        let magic = u16::from_be_bytes([h[88], h[89]]);
        if magic != CORE_STORAGE_MAGIC || u32le(&h, 168) != Some(16) {
            return Err(not());
        }
        let block_size = u64::from(u32le(&h, 96).unwrap_or(0));
        let disklbl_blkoff = u64le(&h, 104).unwrap_or(0);
        let mut ph_uuid = [0u8; 16];
        ph_uuid.copy_from_slice(&h[304..320]);
        let mut md_key = zeroize::Zeroizing::new([0u8; 32]);
        md_key[..16].copy_from_slice(&h[176..192]);
        md_key[16..].copy_from_slice(&ph_uuid);

        // Disk label and the volume groups descriptor.
        let off = disklbl_blkoff
            .checked_mul(block_size)
            .filter(|&o| o <= MAX_OFF)
            .ok_or_else(not)?;
        let label = read(dev, off, MD_BLOCK_SIZE)?;
        check_crc(&label)?;
        let vgd_off = off + u64::from(u32le(&label, 220).unwrap_or(0));
        if vgd_off > MAX_OFF {
            return Err(not());
        }
        let vgd = read(dev, vgd_off, 40)?;
        let blocks_n = u64le(&vgd, 8).unwrap_or(0);
        let enc_md_blkoff = u64le(&vgd, 32).unwrap_or(0);

        // Encrypted metadata.
        let start = enc_md_blkoff
            .checked_mul(block_size)
            .filter(|&o| o <= MAX_OFF)
            .ok_or_else(not)?;
        let mut found = (None, None, None);
        for i in 0..blocks_n {
            let at = (i as u128) * MD_BLOCK_SIZE as u128 + u128::from(start);
            if at > u128::from(MAX_OFF) {
                return Err(not());
            }
            let mut b = read(dev, at as u64, MD_BLOCK_SIZE)?;
            if b.iter().all(|&x| x == 0) {
                break;
            }
            let tweak = u128::from(i).to_le_bytes();
            crypto::unit::decrypt("aes-xts-plain64", &md_key[..], tweak, &mut b).ok_or_else(not)?;
            check_crc(&b)?;
            match u16le(&b, 10).unwrap_or(0) {
                0x0019 => found.0 = Some(parse_0019(&b).ok_or_else(not)?),
                0x001a => found.1 = Some(parse_001a(&b).ok_or_else(not)?),
                0x0305 => {
                    let blk = u64::from(u32le(&b, 104).unwrap_or(0));
                    found.2 = Some(blk.checked_mul(block_size).ok_or_else(not)?);
                }
                _ => {}
            }
        }
        let (Some(keys), Some((log_vol_size, family_uuid)), Some(log_vol_off)) = found else {
            return Err(not());
        };
        Ok(Metadata {
            ph_vol_uuid: uuid_text(&ph_uuid),
            family_uuid,
            log_vol_off,
            log_vol_size,
            pbkdf2_iters: keys.iters,
            pbkdf2_salt: keys.salt,
            wrapped_kek: keys.kek,
            wrapped_vk: keys.vk,
        })
    }

    /// The 32-byte AES-XTS volume key from `pass` (cryptsetup's
    /// `FVAULT2_get_volume_key`).
    pub fn volume_key(&self, pass: &[u8]) -> Result<Secret> {
        let wrong = || {
            Error::new(
                ErrorKind::WrongKey,
                "No key available with this passphrase.",
            )
        };
        let family = uuid_parse(&self.family_uuid).ok_or_else(|| invalid(""))?;
        let mut pk = zeroize::Zeroizing::new([0u8; 16]);
        pbkdf2::pbkdf2_hmac::<Sha256>(pass, &self.pbkdf2_salt, self.pbkdf2_iters, &mut pk[..]);
        let mut kek = zeroize::Zeroizing::new([0u8; 16]);
        aes_kw::KwAes128::new_from_slice(&pk[..])
            .map_err(|_| invalid(""))?
            .unwrap_key(&self.wrapped_kek, &mut kek[..])
            .map_err(|_| wrong())?;
        let mut vk = Secret::zeroed(32);
        aes_kw::KwAes128::new_from_slice(&kek[..])
            .map_err(|_| invalid(""))?
            .unwrap_key(&self.wrapped_vk, &mut vk[..16])
            .map_err(|_| wrong())?;
        let mut h = Sha256::new();
        h.update(&vk[..16]);
        h.update(family);
        let tweak = h.finalize();
        vk[16..].copy_from_slice(&tweak[..16]);
        Ok(vk)
    }

    /// The `fvault2Dump` text for the device `path`.
    pub fn dump(&self, path: &str) -> String {
        // cryptsetup's crypt_log_hex puts the separator after every byte.
        let salt: String = self
            .pbkdf2_salt
            .iter()
            .map(|b| format!("{b:02x} "))
            .collect();
        format!(
            "Header information for FVAULT2 device {path}.\n\
             Physical volume UUID: \t{}\n\
             Family UUID:          \t{}\n\
             Logical volume offset:\t{} [bytes]\n\
             Logical volume size:  \t{} [bytes]\n\
             Cipher:               \taes\n\
             Cipher mode:          \txts-plain64\n\
             PBKDF2 iterations:    \t{}\n\
             PBKDF2 salt:          \t{}\n",
            self.ph_vol_uuid,
            self.family_uuid,
            self.log_vol_off,
            self.log_vol_size,
            self.pbkdf2_iters,
            salt
        )
    }

    /// `fvault2Dump --dump-volume-key`'s text: the dump, then the key.
    pub fn dump_volume_key(&self, path: &str, key: &[u8]) -> Secret {
        let mut o = Secret::with_capacity(1024);
        o.extend_from_slice(self.dump(path).as_bytes());
        o.extend_from_slice(b"Volume key:       \t");
        for b in key {
            o.push_hex(&[*b]);
            o.push(b' ');
        }
        o.push(b'\n');
        o
    }

    /// The table over `device` (`device_size` bytes) with volume key `key`:
    /// one `aes-xts-plain64` target over the logical volume.
    pub fn targets(&self, device: &str, device_size: u64, key: &Secret) -> Result<Targets> {
        let len = self.log_vol_size / 512;
        let off = self.log_vol_off / 512;
        if off.checked_add(len).is_none_or(|e| e > device_size / 512) {
            return Err(invalid(format!(
                "Device {device} is too small for its FVAULT2 logical volume."
            )));
        }
        let spec = CipherSpec::parse("aes-xts-plain64").map_err(|e| invalid(e.to_string()))?;
        let t = Table::from_parts(
            0,
            len,
            spec,
            key.clone(),
            0,
            device.to_owned(),
            off,
            Options::default(),
        )
        .map_err(|e| invalid(e.to_string()))?;
        Ok(t.into())
    }
}

/// Block 0x0019's passphrase data.
struct Keys {
    iters: u32,
    salt: [u8; SALT_SIZE],
    kek: [u8; WRAPPED_KEY_SIZE],
    vk: [u8; WRAPPED_KEY_SIZE],
}

/// Block 0x0019: the PBKDF2 parameters and the two wrapped keys.
fn parse_0019(b: &[u8]) -> Option<Keys> {
    use base64::Engine as _;
    let off = u32le(b, 112)? as usize;
    let size = u32le(b, 116)? as usize;
    let xml = b.get(off..off.checked_add(size)?)?;
    let xml = String::from_utf8_lossy(xml);
    let b64 = |k: &str| -> Option<Vec<u8>> {
        let v = search_xml(&xml, k, "data")?;
        let clean: String = v.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD.decode(clean).ok()
    };
    let pwk = b64("PassphraseWrappedKEKStruct").filter(|v| v.len() == PWK_SIZE)?;
    let kwvk = b64("KEKWrappedVolumeKeyStruct").filter(|v| v.len() == KWVK_SIZE)?;
    let iters = u32le(&pwk, 168)?;
    let salt = pwk.get(8..24)?.try_into().ok()?;
    let kek = pwk.get(32..56)?.try_into().ok()?;
    let vk = kwvk.get(8..32)?.try_into().ok()?;
    Some(Keys {
        iters,
        salt,
        kek,
        vk,
    })
}

/// Block 0x001a: (logical volume size, family UUID).
fn parse_001a(b: &[u8]) -> Option<(u64, String)> {
    let off = u32le(b, 128)? as usize;
    let size = u32le(b, 132)? as usize;
    let xml = b.get(off..off.checked_add(size)?)?;
    let xml = String::from_utf8_lossy(xml);
    let size = strtoull16(search_xml(
        &xml,
        "com.apple.corestorage.lv.size",
        "integer",
    )?);
    if size == 0 || size == u64::MAX {
        return None;
    }
    let fam = search_xml(&xml, "com.apple.corestorage.lv.familyUUID", "string")?;
    Some((size, uuid_text(&uuid_parse(fam)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_search_as_the_regex() {
        let x = "<key>a</key><data>no</dat><key>a</key><data id=\"1\">yes</data>";
        assert_eq!(search_xml(x, "a", "data"), Some("yes"));
        assert_eq!(search_xml("<key>a</key><data></data>", "a", "data"), None);
        assert_eq!(strtoull16("0xA000000"), 0xa00_0000);
        assert_eq!(strtoull16("zz"), 0);
    }

    #[test]
    fn uuid_roundtrip() {
        let t = "33a76caa-1481-4bc5-8d04-1ac1707c19c0";
        assert_eq!(uuid_text(&uuid_parse(t).unwrap()), t);
        assert_eq!(uuid_text(&uuid_parse(&t.to_uppercase()).unwrap()), t);
        assert!(uuid_parse("33a76caa14814bc58d041ac1707c19c0").is_none());
    }

    #[test]
    fn never_panics_on_random_or_truncated_bytes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let n = (next() % 20_000) as usize;
            let mut b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            if b.len() >= 512 {
                // Often a valid header CRC, so the later steps run too.
                b[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
                b[8] = 1;
                b[9] = 0;
                b[88] = 0x43;
                b[89] = 0x53;
                let c = crc32c(0xffff_ffff, &b[8..512]);
                b[..4].copy_from_slice(&c.to_le_bytes());
            }
            let _ = Metadata::read(&b[..], "x");
        }
    }
}
