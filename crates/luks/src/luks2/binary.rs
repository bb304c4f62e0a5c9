//! The LUKS2 binary header (4096 bytes, big-endian), hand-written from
//! cryptsetup's "LUKS2 On-Disk Format Specification" section 2.
//!
//! ```text
//! 0 magic[6] ("LUKS\xba\xbe" primary, "SKUL\xba\xbe" secondary)  6 version=2
//! 8 hdr_size  16 seqid  24 label[48]  72 checksum_alg[32]  104 salt[64]
//! 168 uuid[40]  208 subsystem[48]  256 hdr_offset  264 _pad[184]
//! 448 csum[64]  512 _pad[3584]      then the JSON area (hdr_size - 4096)
//! ```
//! The checksum covers the binary header (csum zeroed) and the JSON area.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::codec::{put_cstr, Reader};
use crate::error::{corrupt, unsupported, Error, ErrorKind, Result};

/// Primary header magic.
pub const MAGIC_PRIMARY: [u8; 6] = *b"LUKS\xba\xbe";
/// Secondary header magic.
pub const MAGIC_SECONDARY: [u8; 6] = *b"SKUL\xba\xbe";
/// Size of the binary part.
pub const BIN_LEN: usize = 4096;
/// Metadata (binary + JSON) sizes the spec allows.
pub const HDR_SIZES: [u64; 9] = [
    0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000, 0x100000, 0x200000, 0x400000,
];

/// Parsed binary header fields (the raw struct is never exposed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinHeader {
    /// True for the primary copy ("LUKS" magic).
    pub primary: bool,
    /// Size of binary header + JSON area.
    pub hdr_size: u64,
    /// Update counter; the higher valid copy wins.
    pub seqid: u64,
    /// Label (may be empty).
    pub label: String,
    /// Checksum algorithm (only `sha256` supported).
    pub checksum_alg: String,
    /// Salt (random, per copy).
    pub salt: [u8; 64],
    /// Volume UUID.
    pub uuid: String,
    /// Subsystem (may be empty).
    pub subsystem: String,
    /// Offset of this copy from the device start.
    pub hdr_offset: u64,
}

impl BinHeader {
    /// Parses the first 4096 bytes (magic, version, sizes), no checksum.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let mut r = Reader::new(buf, "LUKS2 binary header");
        let magic: [u8; 6] = r.array()?;
        let primary = match magic {
            MAGIC_PRIMARY => true,
            MAGIC_SECONDARY => false,
            _ => return Err(Error::new(ErrorKind::NotLuks, "No LUKS signature")),
        };
        let version = r.u16()?;
        if version != 2 {
            return Err(unsupported(format!("LUKS version {version} is not LUKS2")));
        }
        let hdr_size = r.u64()?;
        if !HDR_SIZES.contains(&hdr_size) {
            return Err(corrupt(format!(
                "LUKS2 header size {hdr_size} is not allowed"
            )));
        }
        let seqid = r.u64()?;
        let label = text(r.take(48)?, "label")?;
        let checksum_alg = r.cstr(32, "checksum_alg")?;
        let salt = r.array()?;
        let uuid = r.cstr(40, "uuid")?;
        let subsystem = text(r.take(48)?, "subsystem")?;
        let hdr_offset = r.u64()?;
        r.take(184)?;
        r.take(64)?; // csum, checked by verify_checksum
        r.take(BIN_LEN - 512)?;
        if checksum_alg != "sha256" {
            return Err(unsupported(format!(
                "LUKS2 checksum {checksum_alg:?} is not supported"
            )));
        }
        Ok(Self {
            primary,
            hdr_size,
            seqid,
            label,
            checksum_alg,
            salt,
            uuid,
            subsystem,
            hdr_offset,
        })
    }

    /// Serializes the binary part with a zero checksum.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BIN_LEN);
        out.extend_from_slice(if self.primary {
            &MAGIC_PRIMARY
        } else {
            &MAGIC_SECONDARY
        });
        out.extend_from_slice(&2u16.to_be_bytes());
        out.extend_from_slice(&self.hdr_size.to_be_bytes());
        out.extend_from_slice(&self.seqid.to_be_bytes());
        put_cstr(&mut out, &self.label, 48);
        put_cstr(&mut out, &self.checksum_alg, 32);
        out.extend_from_slice(&self.salt);
        put_cstr(&mut out, &self.uuid, 40);
        put_cstr(&mut out, &self.subsystem, 48);
        out.extend_from_slice(&self.hdr_offset.to_be_bytes());
        out.resize(BIN_LEN, 0);
        out
    }
}

/// Checks the sha256 checksum of a whole header area (`hdr_size` bytes).
pub fn verify_checksum(area: &[u8]) -> Result<()> {
    if area.len() < BIN_LEN {
        return Err(corrupt("LUKS2 header is truncated"));
    }
    let computed = checksum(area);
    let stored = &area[448..448 + 32];
    if bool::from(computed.ct_eq(stored)) && area[448 + 32..512].iter().all(|&b| b == 0) {
        Ok(())
    } else {
        Err(corrupt("LUKS2 header checksum mismatch"))
    }
}

/// sha256 over the area with the csum field zeroed.
pub fn checksum(area: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(&area[..448]);
    h.update([0u8; 64]);
    h.update(&area[512..]);
    h.finalize().into()
}

/// The label or subsystem in a NUL-padded field: any text up to the first
/// NUL, as cryptsetup stores what `--label` was given (control characters
/// included: the luksDump text escapes them). Not UTF-8 is refused.
fn text(raw: &[u8], field: &str) -> Result<String> {
    let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8(raw[..len].to_vec())
        .map_err(|_| corrupt(format!("LUKS2 header field {field} is not UTF-8 text")))
}

/// Writes the checksum into an assembled area.
pub fn seal(area: &mut [u8]) {
    area[448..512].fill(0);
    let c = checksum(area);
    area[448..480].copy_from_slice(&c);
}
