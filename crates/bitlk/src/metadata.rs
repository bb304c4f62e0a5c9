//! The BitLocker metadata cryptsetup reads (`BITLK_read_sb`): the boot
//! sector's signature and sector size, the three FVE metadata offsets, the
//! first FVE metadata block's header and its entries.
//!
//! ```text
//!  sector 0    boot code (eb 58 90), "-FVE-FS-" (or "MSWIN4.1": To Go),
//!              u16 sector size; at 160 (To Go: 424) the volume GUID and
//!              three u64 FVE metadata offsets
//!  FVE block   "-FVE-FS-", size, version (2), states, volume size, header
//!              size, offsets … (64 bytes) + metadata header (48 bytes:
//!              size, GUID, encryption method, creation time), then entries
//!  entry       u16 size, u16 type, u16 value, u16 version, data
//! ```
//!
//! Every field is little-endian. Every read goes through [`Cursor`],
//! which checks bounds: parsing returns an error, never panics.

use std::fmt;
use std::io;

use crate::error::{invalid, unsupported, Error, ErrorKind};
use crate::Result;

const BOOTCODE_V1: [u8; 3] = [0xeb, 0x52, 0x90];
const BOOTCODE_V2: [u8; 3] = [0xeb, 0x58, 0x90];
const SIGNATURE: &[u8; 8] = b"-FVE-FS-";
const SIGNATURE_TOGO: &[u8; 8] = b"MSWIN4.1";
const SB_OFFSET: u64 = 160;
const SB_OFFSET_TOGO: u64 = 424;
/// FVE block header (64) + FVE metadata header (48).
const FVE_HEADERS_LEN: u64 = 112;
const FVE_METADATA_HEADER_LEN: u32 = 48;
/// Each FVE metadata area's size, as cryptsetup maps it.
pub(crate) const FVE_METADATA_SIZE: u64 = 64 * 1024;
const ENTRY_HEADER_LEN: usize = 8;
const VMK_HEADER_LEN: usize = 28;
pub(crate) const NONCE_LEN: usize = 12;
pub(crate) const TAG_LEN: usize = 16;
const STATE_NORMAL: u16 = 4;

const GUID_NORMAL: [u8; 16] = [
    0x3b, 0xd6, 0x67, 0x49, 0x29, 0x2e, 0xd8, 0x4a, 0x83, 0x99, 0xf6, 0xa3, 0x39, 0xe3, 0xd0, 0x01,
];
const GUID_EOW: [u8; 16] = [
    0x3b, 0x4d, 0xa8, 0x92, 0x80, 0xdd, 0x0e, 0x4d, 0x9e, 0x4e, 0xb1, 0xe3, 0x28, 0x4e, 0xae, 0xd8,
];

// Entry types and values (cryptsetup's bitlk.h names).
pub(crate) const TYPE_PROPERTY: u16 = 0x0000;
const TYPE_VMK: u16 = 0x0002;
const TYPE_FVEK: u16 = 0x0003;
pub(crate) const TYPE_STARTUP_KEY: u16 = 0x0006;
const TYPE_DESCRIPTION: u16 = 0x0007;
const TYPE_VOLUME_HEADER: u16 = 0x000f;
pub(crate) const TYPE_VOLUME_GUID: u16 = 0x0019;
pub(crate) const VALUE_KEY: u16 = 0x0001;
pub(crate) const VALUE_STRING: u16 = 0x0002;
const VALUE_STRETCH_KEY: u16 = 0x0003;
const VALUE_USE_KEY: u16 = 0x0004;
const VALUE_ENCRYPTED_KEY: u16 = 0x0005;
pub(crate) const VALUE_EXTERNAL_KEY: u16 = 0x0009;
const VALUE_RECOVERY_TIME: u16 = 0x0015;
pub(crate) const VALUE_GUID: u16 = 0x0017;

/// A GUID as stored (mixed-endian, as Windows writes it).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Guid(pub [u8; 16]);

impl fmt::Display for Guid {
    /// Lower-case `8-4-4-4-12`, the first three groups byte-swapped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-",
            b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9]
        )?;
        for x in &b[10..] {
            write!(f, "{x:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// How a VMK is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protection {
    /// Stored in the clear (a volume being decrypted or suspended).
    ClearKey,
    /// TPM.
    Tpm,
    /// Startup key (a `.BEK` file).
    StartupKey,
    /// TPM and PIN.
    TpmPin,
    /// The 48-digit recovery password.
    RecoveryPassphrase,
    /// A user password.
    Passphrase,
    /// A smart card.
    SmartCard,
    /// Anything else.
    Unknown,
}

impl Protection {
    fn from_raw(v: u16) -> Self {
        match v {
            0x0000 => Self::ClearKey,
            0x0100 => Self::Tpm,
            0x0200 => Self::StartupKey,
            0x0500 => Self::TpmPin,
            0x0800 => Self::RecoveryPassphrase,
            0x1000 => Self::SmartCard,
            0x2000 => Self::Passphrase,
            _ => Self::Unknown,
        }
    }

    /// cryptsetup's description.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ClearKey => "VMK protected with clear key",
            Self::Tpm => "VMK protected with TPM",
            Self::StartupKey => "VMK protected with startup key",
            Self::TpmPin => "VMK protected with TPM and PIN",
            Self::Passphrase => "VMK protected with passphrase",
            Self::RecoveryPassphrase => "VMK protected with recovery passphrase",
            Self::SmartCard => "VMK protected with smart card",
            Self::Unknown => "VMK with unknown protection",
        }
    }

    /// Protectors ucrypt (like cryptsetup) can unlock.
    fn supported(self) -> bool {
        matches!(
            self,
            Self::Passphrase | Self::RecoveryPassphrase | Self::StartupKey
        )
    }
}

/// The encryption "type" from the boot sector's GUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncryptionType {
    /// An ordinary, fully encrypted volume.
    Normal,
    /// Encrypt-on-write ("used space only" while in progress).
    EncryptOnWrite,
    /// Anything else.
    Unknown,
}

impl EncryptionType {
    /// cryptsetup's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::EncryptOnWrite => "encrypt-on-write",
            Self::Unknown => "unknown",
        }
    }
}

/// An AES-CCM wrapped key: nonce, tag, ciphertext.
#[derive(Clone, Debug)]
pub(crate) struct Wrapped {
    pub(crate) nonce: [u8; NONCE_LEN],
    pub(crate) tag: [u8; TAG_LEN],
    pub(crate) data: Vec<u8>,
}

/// One volume master key entry.
#[derive(Clone, Debug)]
pub struct Vmk {
    /// The protector's GUID.
    pub guid: Guid,
    /// Its name (e.g. `ExternalKey`), if the entry has one.
    pub name: Option<String>,
    /// How it is protected.
    pub protection: Protection,
    /// The stretch key's salt (zeros when there is none).
    pub salt: [u8; 16],
    /// The wrapped keys, in entry order (cryptsetup unwraps the first).
    pub(crate) keys: Vec<Wrapped>,
}

impl Vmk {
    /// Sizes of the wrapped keys' data in bytes (the dump's "Key data size").
    pub fn key_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.keys.iter().map(|k| k.data.len())
    }
}

/// A BitLocker volume's metadata.
#[derive(Clone, Debug)]
pub struct Metadata {
    /// BitLocker To Go (FAT boot sector).
    pub togo: bool,
    /// Encryption sector size (512 or 4096).
    pub sector_size: u32,
    /// Volume size from the FVE block.
    pub volume_size: u64,
    /// Current and next state both "normal" (fully encrypted).
    pub state_normal: bool,
    /// Encryption type from the boot sector's GUID.
    pub kind: EncryptionType,
    /// Cipher name (`aes`).
    pub cipher: &'static str,
    /// Cipher mode as a dm-crypt spec suffix (`xts-plain64`, `cbc-eboiv`,
    /// `cbc-elephant`).
    pub cipher_mode: &'static str,
    /// Key size in bits as dm-crypt takes it.
    pub key_bits: u32,
    /// The volume GUID.
    pub guid: Guid,
    /// Creation time, Unix seconds.
    pub creation_time: i64,
    /// The description entry.
    pub description: Option<String>,
    /// The three FVE metadata areas' byte offsets.
    pub metadata_offsets: [u64; 3],
    /// FVE metadata version (2).
    pub metadata_version: u16,
    /// Where the original volume header (boot sectors) was moved, in bytes.
    pub volume_header_offset: u64,
    /// Its size in bytes.
    pub volume_header_size: u64,
    /// The VMK entries, in order.
    pub vmks: Vec<Vmk>,
    pub(crate) fvek: Option<Wrapped>,
}

/// A bounds-checked little-endian reader over a byte slice.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn bytes(&self, at: usize, n: usize) -> Option<&'a [u8]> {
        self.buf.get(at..at.checked_add(n)?)
    }

    pub(crate) fn u16(&self, at: usize) -> Option<u16> {
        self.bytes(at, 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&self, at: usize) -> Option<u32> {
        let b = self.bytes(at, 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&self, at: usize) -> Option<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(at, 8)?);
        Some(u64::from_le_bytes(a))
    }

    pub(crate) fn guid(&self, at: usize) -> Option<Guid> {
        let mut g = [0u8; 16];
        g.copy_from_slice(self.bytes(at, 16)?);
        Some(Guid(g))
    }
}

/// UTF-16LE bytes to a string, up to the first NUL (invalid units become
/// U+FFFD); `None` for an odd length.
pub(crate) fn utf16(b: &[u8]) -> Option<String> {
    if b.len() % 2 != 0 {
        return None;
    }
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    Some(String::from_utf16_lossy(&units))
}

/// One entry of an entry list: `(size, type, value, whole entry)`.
pub(crate) struct Entry<'a> {
    pub(crate) kind: u16,
    pub(crate) value: u16,
    pub(crate) data: &'a [u8],
    /// Bytes from the entry's start to the end of the list (cryptsetup
    /// checks some lengths against this rather than the entry's size).
    pub(crate) rest: &'a [u8],
}

/// Walks the entries of `list` as cryptsetup does: stops at a zero size or
/// when fewer than `min_header` bytes remain; an entry longer than what
/// is left is an error.
pub(crate) fn entries(
    list: &[u8],
    min_header: usize,
    mut f: impl FnMut(Entry<'_>) -> Result<bool>,
) -> Result<()> {
    let mut at = 0usize;
    while list.len() - at >= min_header {
        let c = Cursor::new(&list[at..]);
        let size = c.u16(0).unwrap_or(0) as usize;
        if size == 0 {
            break;
        }
        if size > list.len() - at {
            return Err(invalid(""));
        }
        let entry = Entry {
            kind: c.u16(2).unwrap_or(0),
            value: c.u16(4).unwrap_or(0),
            data: &list[at..at + size],
            rest: &list[at..],
        };
        if !f(entry)? {
            break;
        }
        at += size;
    }
    Ok(())
}

fn parse_wrapped(data: &[u8]) -> Option<Wrapped> {
    let c = Cursor::new(data);
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(c.bytes(ENTRY_HEADER_LEN, NONCE_LEN)?);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(c.bytes(ENTRY_HEADER_LEN + NONCE_LEN, TAG_LEN)?);
    let data = data.get(ENTRY_HEADER_LEN + NONCE_LEN + TAG_LEN..)?.to_vec();
    Some(Wrapped { nonce, tag, data })
}

/// A VMK entry's own entries (cryptsetup's `parse_vmk_entry`).
fn parse_vmk(list: &[u8], vmk: &mut Vmk) -> Result<()> {
    let supported = vmk.protection.supported();
    entries(list, 6, |e| {
        if e.kind != TYPE_PROPERTY && supported {
            return Err(invalid(format!(
                "Unexpected metadata entry type '{}' found when parsing supported Volume Master Key.",
                e.kind
            )));
        }
        match e.value {
            VALUE_STRETCH_KEY => {
                let c = Cursor::new(e.rest);
                let salt = c
                    .bytes(ENTRY_HEADER_LEN + 4, 16)
                    .ok_or_else(|| invalid(""))?;
                vmk.salt.copy_from_slice(salt);
            }
            VALUE_ENCRYPTED_KEY => {
                let w = parse_wrapped(e.data).ok_or_else(|| invalid(""))?;
                vmk.keys.push(w);
            }
            // A clear key of a partially decrypted volume: not kept, as
            // cryptsetup does not open such volumes.
            VALUE_KEY | VALUE_RECOVERY_TIME => {}
            VALUE_STRING => {
                let body = e.data.get(ENTRY_HEADER_LEN..).ok_or_else(|| invalid(""))?;
                let s = utf16(body).ok_or_else(|| {
                    invalid("Invalid string found when parsing Volume Master Key.")
                })?;
                if vmk.name.is_some() {
                    if supported {
                        return Err(invalid(format!(
                            "Unexpected string ('{s}') found when parsing supported Volume Master Key."
                        )));
                    }
                } else {
                    vmk.name = Some(s);
                }
            }
            VALUE_USE_KEY if vmk.protection == Protection::StartupKey => {}
            v => {
                if supported {
                    return Err(invalid(format!(
                        "Unexpected metadata entry value '{v}' found when parsing supported Volume Master Key."
                    )));
                }
            }
        }
        Ok(true)
    })
}

/// Reads `len` bytes at `offset`, as the parser asks for them.
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

fn read(dev: &(impl ReadAt + ?Sized), offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    dev.read_at(offset, &mut v)?;
    Ok(v)
}

impl Metadata {
    /// Reads and parses the metadata of the device `path` names in
    /// messages (cryptsetup's `BITLK_read_sb`).
    pub fn read(dev: &(impl ReadAt + ?Sized), path: &str) -> Result<Self> {
        let not_bitlk = || {
            Error::new(
                ErrorKind::NotBitlk,
                format!("Device {path} is not a valid BITLK device."),
            )
        };
        let sig = read(dev, 0, 13).map_err(|_| not_bitlk())?;
        let c = Cursor::new(&sig);
        let (togo, sb_offset) = match c.bytes(3, 8) {
            Some(s) if s == SIGNATURE => (false, SB_OFFSET),
            Some(s) if s == SIGNATURE_TOGO => (true, SB_OFFSET_TOGO),
            _ => return Err(not_bitlk()),
        };
        match c.bytes(0, 3) {
            Some(b) if b == BOOTCODE_V1 => {
                return Err(unsupported("BITLK version 1 is currently not supported."))
            }
            Some(b) if b == BOOTCODE_V2 => {}
            _ => {
                return Err(invalid(
                    "Invalid or unknown boot signature for BITLK device.",
                ))
            }
        }
        let sector_size = match c.u16(11).unwrap_or(0) {
            0 => 512,
            n @ (512 | 4096) => u32::from(n),
            n => return Err(invalid(format!("Unsupported sector size {n}."))),
        };
        let hdr_err = || invalid(format!("Failed to read BITLK header from {path}."));
        let sb = read(dev, sb_offset, 40).map_err(|_| hdr_err())?;
        let c = Cursor::new(&sb);
        let kind = match c.bytes(0, 16) {
            Some(g) if g == GUID_NORMAL => EncryptionType::Normal,
            Some(g) if g == GUID_EOW => EncryptionType::EncryptOnWrite,
            _ => EncryptionType::Unknown,
        };
        let mut metadata_offsets = [0u64; 3];
        for (i, o) in metadata_offsets.iter_mut().enumerate() {
            *o = c.u64(16 + 8 * i).ok_or_else(hdr_err)?;
        }
        let fve_err = || invalid(format!("Failed to read BITLK FVE metadata from {path}."));
        let fve =
            read(dev, metadata_offsets[0], FVE_HEADERS_LEN as usize).map_err(|_| fve_err())?;
        let c = Cursor::new(&fve);
        let metadata_version = c.u16(10).ok_or_else(fve_err)?;
        if c.bytes(0, 8) != Some(&SIGNATURE[..]) || metadata_version != 2 {
            return Err(fve_err());
        }
        let f = |o: Option<u64>| o.ok_or_else(fve_err);
        let state_normal = c.u16(12) == Some(STATE_NORMAL) && c.u16(14) == Some(STATE_NORMAL);
        let volume_size = f(c.u64(16))?;
        let (key_bits, cipher_mode) = match c.u16(100).unwrap_or(0) {
            0x8000 => (256, "cbc-elephant"),
            0x8001 => (512, "cbc-elephant"),
            0x8002 => (128, "cbc-eboiv"),
            0x8003 => (256, "cbc-eboiv"),
            0x8004 => (256, "xts-plain64"),
            0x8005 => (512, "xts-plain64"),
            _ => return Err(unsupported("Unknown or unsupported encryption type.")),
        };
        let guid = c.guid(80).ok_or_else(fve_err)?;
        // Windows FILETIME: 100 ns units since 1601.
        let ft = f(c.u64(104))?;
        let creation_time = (ft.wrapping_sub(116_444_736_000_000_000) / 10_000_000) as i64;
        let metadata_size = c.u32(64).ok_or_else(fve_err)?;
        if metadata_size < FVE_METADATA_HEADER_LEN + 4
            || u64::from(metadata_size) > FVE_METADATA_SIZE
        {
            return Err(invalid(""));
        }
        let entries_len = (metadata_size - FVE_METADATA_HEADER_LEN) as usize;
        let list = read(
            dev,
            metadata_offsets[0].saturating_add(FVE_HEADERS_LEN),
            entries_len,
        )
        .map_err(|_| {
            invalid(format!(
                "Failed to read BITLK metadata entries from {path}."
            ))
        })?;

        let mut m = Metadata {
            togo,
            sector_size,
            volume_size,
            state_normal,
            kind,
            cipher: "aes",
            cipher_mode,
            key_bits,
            guid,
            creation_time,
            description: None,
            metadata_offsets,
            metadata_version,
            volume_header_offset: 0,
            volume_header_size: 0,
            vmks: Vec::new(),
            fvek: None,
        };
        entries(&list, 4, |e| {
            match e.kind {
                TYPE_VMK => {
                    let c = Cursor::new(e.data);
                    let guid = c.guid(ENTRY_HEADER_LEN).ok_or_else(|| invalid(""))?;
                    let protection = c
                        .u16(ENTRY_HEADER_LEN + 26)
                        .map(Protection::from_raw)
                        .ok_or_else(|| invalid(""))?;
                    let mut vmk = Vmk {
                        guid,
                        name: None,
                        protection,
                        salt: [0; 16],
                        keys: Vec::new(),
                    };
                    parse_vmk(&e.data[ENTRY_HEADER_LEN + VMK_HEADER_LEN..], &mut vmk)?;
                    m.vmks.push(vmk);
                }
                TYPE_FVEK if m.fvek.is_none() => {
                    m.fvek = Some(parse_wrapped(e.data).ok_or_else(|| invalid(""))?);
                }
                TYPE_VOLUME_HEADER => {
                    let c = Cursor::new(e.rest);
                    let (o, s) = c
                        .u64(ENTRY_HEADER_LEN)
                        .zip(c.u64(ENTRY_HEADER_LEN + 8))
                        .ok_or_else(|| invalid(""))?;
                    m.volume_header_offset = o;
                    m.volume_header_size = s;
                }
                TYPE_DESCRIPTION if m.description.is_none() => {
                    let body = e.data.get(ENTRY_HEADER_LEN..).ok_or_else(|| invalid(""))?;
                    let s = utf16(body)
                        .ok_or_else(|| invalid("Failed to convert BITLK volume description"))?;
                    m.description = Some(s);
                }
                _ => {}
            }
            Ok(true)
        })?;
        Ok(m)
    }

    /// The dm-crypt cipher spec (`aes-xts-plain64`, …).
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher, self.cipher_mode)
    }

    /// The volume key's size in bytes.
    pub fn key_len(&self) -> usize {
        (self.key_bits / 8) as usize
    }

    /// The FVEK entry's wrapped data size (the dump's FVEK "Key data size").
    pub fn fvek_size(&self) -> Option<usize> {
        self.fvek.as_ref().map(|k| k.data.len())
    }

    /// What cryptsetup checks before it activates (`_activate_check`).
    pub fn activate_check(&self) -> Result<()> {
        if !self.state_normal {
            return Err(unsupported(
                "This BITLK device is in an unsupported state and cannot be activated.",
            ));
        }
        if self.kind != EncryptionType::Normal {
            return Err(unsupported(format!(
                "BITLK devices with type '{}' cannot be activated.",
                self.kind.name()
            )));
        }
        if self
            .vmks
            .iter()
            .any(|v| v.protection == Protection::ClearKey)
        {
            return Err(unsupported(
                "Activation of partially decrypted BITLK device is not supported.",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_text_swaps_the_first_three_groups() {
        let g = Guid([
            0x09, 0x52, 0x59, 0x8f, 0xb9, 0xf5, 0xa0, 0x49, 0x85, 0xd4, 0xcb, 0x8f, 0x80, 0x25,
            0x8c, 0x27,
        ]);
        assert_eq!(g.to_string(), "8f595209-f5b9-49a0-85d4-cb8f80258c27");
    }

    /// Any bytes: an error or metadata, never a panic (the fuzz target's
    /// property, here on seeded random and truncated inputs).
    #[test]
    fn never_panics_on_random_or_truncated_bytes() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut img = vec![0u8; 4096];
        img[..3].copy_from_slice(&BOOTCODE_V2);
        img[3..11].copy_from_slice(SIGNATURE);
        img[176..184].copy_from_slice(&1024u64.to_le_bytes());
        img[1024..1032].copy_from_slice(SIGNATURE);
        img[1034] = 2;
        img[1088..1092].copy_from_slice(&600u32.to_le_bytes());
        img[1124] = 0x04;
        img[1125] = 0x80;
        for round in 0..3000 {
            let mut b = img.clone();
            for _ in 0..(next() % 64) {
                let at = (next() % b.len() as u64) as usize;
                b[at] = next() as u8;
            }
            // Entries: random bytes after the headers.
            if round % 2 == 0 {
                for v in &mut b[1136..1700] {
                    *v = next() as u8;
                }
            }
            let cut = (next() % b.len() as u64) as usize;
            let _ = Metadata::read(&b[..], "x");
            let _ = Metadata::read(&b[..cut], "x");
        }
        let e = Metadata::read(&[0u8; 100][..], "/d").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotBitlk);
        assert_eq!(e.to_string(), "Device /d is not a valid BITLK device.");
    }
}
