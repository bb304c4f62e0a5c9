//! TrueCrypt and VeraCrypt volumes as cryptsetup 2.6.1 opens them
//! (`--type tcrypt`, `tcryptDump`), written from cryptsetup's
//! `lib/tcrypt/tcrypt.c` and VeraCrypt's volume format documentation.
//!
//! ```text
//!  passphrase ─┐                                        ┌─ magic TRUE/VERA, CRCs ─► Header
//!  keyfiles ── pool (keyfile.rs) ─► PBKDF2 (kdf.rs) ──► │ chains tried (algs.rs)
//!  512-byte sector: salt | 448 encrypted bytes ─────────┘           │
//!                                                                   ▼
//!                 Volume: header + hash + chain ─► offsets, tables (one crypt layer per cipher)
//! ```
//!
//! There is no plaintext marker on a TrueCrypt header: every hash's KDF
//! (per the PIM and VeraCrypt switches) is run and every cipher chain
//! tried on the decrypted bytes until one shows the magic. The KDFs run
//! on all cores ([`kdf::derive_all`]); the first match in cryptsetup's
//! order wins, as there.
//!
//! The volume is mapped as cryptsetup maps it: one dm-crypt layer per
//! cipher of the chain (`name_2` on the device, `name_1` on it, `name`
//! on top); here those layers are one [`crypto::table::Table`] carrying
//! its lower layers, which the engine runs as a stacked `SectorCrypt`
//! ([`Volume::table`]).
//!
//! Parsers never panic: every read of header bytes is bounds-checked,
//! `parse` takes any bytes (fuzzed by `fuzz/fuzz_targets/tcrypt_header.rs`).
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crypto::table::{Options, Table};
use crypto::{CipherSpec, Secret};
use zeroize::Zeroizing;

pub mod algs;
pub mod kdf;
mod keyfile;

pub use algs::Mode;

/// Bytes of salt before the encrypted header.
pub const SALT_LEN: usize = 64;
/// Bytes of the encrypted header.
pub const HDR_LEN: usize = 448;
/// Bytes of the derived header key (enough for three XTS ciphers).
pub const HDR_KEY_LEN: usize = 192;
/// Bytes of the key area inside the header.
pub const KEY_AREA_LEN: usize = 256;
/// The whole on-disk header sector.
pub const SECTOR: usize = 512;

/// Offset of the hidden volume's header (TrueCrypt 6+, VeraCrypt).
const HIDDEN_OFFSET: i64 = 65536;
/// Offset of the hidden volume's header before TrueCrypt 6, from the end.
const HIDDEN_OFFSET_OLD: i64 = -1536;
/// Backup header of the hidden volume, from the end.
const HIDDEN_OFFSET_BCK: i64 = -65536;
/// Backup header, from the end.
const OFFSET_BCK: i64 = -131072;
/// System encryption header (in the boot track).
const SYSTEM_OFFSET: i64 = 31744;

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No header decrypts with this passphrase, keyfiles and PIM
    /// (cryptsetup: -EPERM, "No device header detected with this
    /// passphrase.").
    NoHeader,
    /// The options ask for something that cannot be (an unknown cipher,
    /// an over-long passphrase, a legacy mode with no mapping).
    Invalid,
    /// The device or a keyfile could not be read.
    Io,
    /// The mode has no mapping (cryptsetup: -ENOTSUP).
    NotSupported,
}

/// An error with cryptsetup's wording where it has one, in the
/// workspace's shape (docs/ARCHITECTURE.md, "Errors").
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<std::io::Error>,
}

impl Error {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    fn io(message: impl Into<String>, e: std::io::Error) -> Self {
        Self {
            kind: ErrorKind::Io,
            message: message.into(),
            source: Some(e),
        }
    }

    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

/// The message cryptsetup prints when nothing decrypts.
pub const NO_HEADER: &str = "No device header detected with this passphrase.";

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// How to look for the header: cryptsetup's `crypt_params_tcrypt`.
#[derive(Debug, Clone)]
pub struct Request {
    /// Keyfiles mixed into the password pool (`--key-file`, repeatable).
    pub keyfiles: Vec<PathBuf>,
    /// Only this PBKDF2 hash (`--hash`).
    pub hash: Option<String>,
    /// Only chains whose name contains this (`--cipher`).
    pub cipher: Option<String>,
    /// VeraCrypt PIM (`--veracrypt-pim`; 0: none).
    pub pim: u32,
    /// Try VeraCrypt's KDFs and magic (off with `--disable-veracrypt`).
    pub veracrypt: bool,
    /// Try TrueCrypt's pre-5.0 modes (cryptsetup's CLI always does).
    pub legacy: bool,
    /// The hidden volume's header (`--tcrypt-hidden`).
    pub hidden: bool,
    /// The system encryption header (`--tcrypt-system`).
    pub system: bool,
    /// The backup header at the device's end (`--tcrypt-backup`).
    pub backup: bool,
}

impl Default for Request {
    fn default() -> Self {
        Self {
            keyfiles: Vec::new(),
            hash: None,
            cipher: None,
            pim: 0,
            veracrypt: true,
            legacy: true,
            hidden: false,
            system: false,
            backup: false,
        }
    }
}

/// The decrypted header's fields (big-endian on disk), with cryptsetup's
/// defaults applied (`mk_offset` 0 → 512, `sector_size` 0 → 512).
#[derive(Clone)]
pub struct Header {
    /// `TRUE` or `VERA`.
    pub magic: [u8; 4],
    /// Header format version.
    pub version: u16,
    /// Minimum program version to open it (`Driver req.`).
    pub version_tc: u16,
    /// Size of the hidden volume inside (bytes; 0 if none).
    pub hidden_volume_size: u64,
    /// Size of this volume (bytes).
    pub volume_size: u64,
    /// Byte offset of the encrypted data ("master key" area scope).
    pub mk_offset: u64,
    /// Bytes of the encrypted area.
    pub mk_size: u64,
    /// Header flags (bit 0: system encryption).
    pub flags: u32,
    /// Sector size.
    pub sector_size: u32,
    keys: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Header")
            .field("magic", &String::from_utf8_lossy(&self.magic))
            .field("version", &self.version)
            .field("version_tc", &self.version_tc)
            .field("hidden_volume_size", &self.hidden_volume_size)
            .field("volume_size", &self.volume_size)
            .field("mk_offset", &self.mk_offset)
            .field("mk_size", &self.mk_size)
            .field("flags", &self.flags)
            .field("sector_size", &self.sector_size)
            .finish_non_exhaustive()
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]))
}
fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}
fn be64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// CRC-32 (IEEE) of `b`, as cryptsetup's `crypt_crc32(~0, …) ^ ~0`.
fn crc32(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

/// Whether decrypted bytes carry an accepted magic.
fn has_magic(d: &[u8], veracrypt: bool) -> bool {
    d.starts_with(b"TRUE") || (veracrypt && d.starts_with(b"VERA"))
}

impl Header {
    /// Parses the decrypted 448 bytes: the magic, then the key-area CRC
    /// and (version 4 and later) the header CRC, as cryptsetup checks
    /// them. Any bytes: `None` unless all of that holds.
    pub fn parse(d: &[u8], veracrypt: bool) -> Option<Self> {
        if d.len() != HDR_LEN || !has_magic(d, veracrypt) {
            return None;
        }
        let version = be16(d, 4);
        if version > 3 && crc32(&d[..188]) != be32(d, 188) {
            return None;
        }
        if crc32(&d[192..]) != be32(d, 8) {
            return None;
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&d[..4]);
        let mk_offset = match be64(d, 44) {
            0 => 512,
            o => o,
        };
        let sector_size = match be32(d, 64) {
            0 => 512,
            s => s,
        };
        Some(Self {
            magic,
            version,
            version_tc: be16(d, 6),
            hidden_volume_size: be64(d, 28),
            volume_size: be64(d, 36),
            mk_offset,
            mk_size: be64(d, 52),
            flags: be32(d, 60),
            sector_size,
            keys: Zeroizing::new(d[192..].to_vec()),
        })
    }

    /// True for a VeraCrypt header.
    pub fn is_veracrypt(&self) -> bool {
        &self.magic == b"VERA"
    }
}

/// A volume whose header decrypted.
#[derive(Debug, Clone)]
pub struct Volume {
    /// The header.
    pub header: Header,
    /// The PBKDF2 hash that derived its key.
    pub hash: &'static str,
    /// Its cipher chain.
    pub chain: &'static algs::Chain,
    /// Where it was found.
    pub request: Request,
    /// The device's (or image file's) size in bytes.
    pub device_size: u64,
}

/// Tries `sector` (salt + encrypted header) with the password pool
/// `pool` under `req`: every KDF cryptsetup would run, on all cores.
/// `Ok(None)` if nothing decrypts.
pub fn decrypt_sector(
    sector: &[u8],
    pool: &[u8],
    req: &Request,
) -> Result<Option<(Header, &'static str, &'static algs::Chain)>> {
    if sector.len() < SECTOR {
        return Ok(None);
    }
    let salt = &sector[..SALT_LEN];
    let enc = &sector[SALT_LEN..SECTOR];
    let chains: Vec<&'static algs::Chain> = algs::CHAINS
        .iter()
        .filter(|c| {
            req.cipher
                .as_ref()
                .is_none_or(|f| c.name.contains(f.as_str()))
        })
        .filter(|c| req.legacy || !c.legacy)
        .collect();
    if chains.is_empty() {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "No TCRYPT cipher chain matches {}.",
                req.cipher.as_deref().unwrap_or("")
            ),
        ));
    }
    let try_key = |key: &[u8]| -> Option<(Header, &'static algs::Chain)> {
        let mut buf = Zeroizing::new(vec![0u8; HDR_LEN]);
        for c in &chains {
            buf.copy_from_slice(enc);
            if !algs::decrypt_header(c, key, &mut buf) {
                continue;
            }
            if has_magic(&buf, req.veracrypt) {
                // cryptsetup stops at the first magic; bad CRCs then fail.
                return Some((Header::parse(&buf, req.veracrypt)?, c));
            }
        }
        None
    };
    let found = kdf::derive_all(&kdf::candidates(req), pool, salt, |k| try_key(k).is_some());
    Ok(found.and_then(|(variant, key)| try_key(&key).map(|(h, c)| (h, variant.hash, c))))
}

/// Reads the 512-byte sector at `offset` (negative: from the end).
fn read_sector(f: &mut std::fs::File, size: u64, offset: i64) -> Option<Zeroizing<Vec<u8>>> {
    let at = if offset < 0 {
        size.checked_sub(offset.unsigned_abs())?
    } else {
        offset as u64
    };
    let mut buf = Zeroizing::new(vec![0u8; SECTOR]);
    f.seek(SeekFrom::Start(at)).ok()?;
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// The size of an open file or block device.
fn device_size(f: &mut std::fs::File) -> std::io::Result<u64> {
    f.seek(SeekFrom::End(0))
}

/// Finds and decrypts the header of `device` as `crypt_load(CRYPT_TCRYPT)`
/// does: the sector `req` selects (hidden, system, backup), the password
/// pool from `passphrase` and the keyfiles, every KDF and chain.
pub fn load(device: &Path, passphrase: &[u8], req: &Request) -> Result<Volume> {
    let pool = keyfile::pool(passphrase, &req.keyfiles, req.veracrypt)?;
    let mut f = std::fs::File::open(device)
        .map_err(|e| Error::io(format!("Cannot open device {}.", device.display()), e))?;
    let size = device_size(&mut f)
        .map_err(|e| Error::io(format!("Cannot open device {}.", device.display()), e))?;
    let offsets: &[i64] = if req.system {
        &[SYSTEM_OFFSET]
    } else if req.hidden && req.backup {
        &[HIDDEN_OFFSET_BCK]
    } else if req.hidden {
        &[HIDDEN_OFFSET, HIDDEN_OFFSET_OLD]
    } else if req.backup {
        &[OFFSET_BCK]
    } else {
        &[0]
    };
    for &off in offsets {
        let Some(sector) = read_sector(&mut f, size, off) else {
            continue;
        };
        if let Some((header, hash, chain)) = decrypt_sector(&sector, &pool, req)? {
            return Ok(Volume {
                header,
                hash,
                chain,
                request: req.clone(),
                device_size: size,
            });
        }
    }
    Err(Error::new(ErrorKind::NoHeader, NO_HEADER))
}

impl Volume {
    /// Start of the data in 512-byte sectors (cryptsetup's
    /// `TCRYPT_get_data_offset` for a whole device or image file).
    pub fn data_offset(&self) -> u64 {
        let h = &self.header;
        let hidden_old = || {
            self.device_size
                .saturating_sub(h.hidden_volume_size)
                .saturating_sub(HIDDEN_OFFSET_OLD.unsigned_abs())
                / 512
        };
        if self.request.system {
            return h.mk_offset / 512;
        }
        if self.chain.mode == Mode::Xts {
            if h.version < 3 {
                return 1;
            }
            if self.request.hidden {
                if h.version > 3 {
                    return h.mk_offset / 512;
                }
                return hidden_old();
            }
        } else if self.request.hidden {
            return hidden_old();
        }
        h.mk_offset / 512
    }

    /// The IV offset of every layer (`TCRYPT_get_iv_offset`).
    pub fn iv_offset(&self) -> u64 {
        match self.chain.mode {
            Mode::Xts => self.data_offset(),
            Mode::Lrw => 0,
            _ => self.header.mk_offset / 512,
        }
    }

    /// Length of the mapping in 512-byte sectors: the header's size, or
    /// the device from the data offset on for system encryption and where
    /// the header's size is 0 (TrueCrypt 1.x to 4.x headers leave it 0;
    /// cryptsetup's `device_block_adjust` then maps the rest of the device).
    pub fn size_sectors(&self) -> u64 {
        let rest = || (self.device_size / 512).saturating_sub(self.data_offset());
        let size = if self.request.system {
            0
        } else if self.request.hidden {
            self.header.hidden_volume_size / 512
        } else {
            self.header.volume_size / 512
        };
        if size == 0 {
            rest()
        } else {
            size
        }
    }

    /// The whole key of the chain as `--dump-volume-key` prints it: each
    /// cipher's mapping key in chain order.
    pub fn volume_key(&self) -> Secret {
        let mut out = Secret::with_capacity(self.chain.key_size);
        for alg in self.chain.ciphers {
            out.extend_from_slice(&algs::mapping_key(alg, self.chain.mode, &self.header.keys));
        }
        out
    }

    /// The mapping as cryptsetup activates it over `device`: the top layer
    /// (the chain's first cipher) carrying the ones below it, each a
    /// dm-crypt line at the same IV offset (`xts-plain64`, `lrw-benbi`,
    /// `cbc-tcw`). Refused, with cryptsetup's message, for the legacy
    /// modes cryptsetup cannot activate: the CBC cascades (`cbci-tcrypt`)
    /// and Blowfish chains (`cbc-tcrypt`).
    pub fn table(&self, device: &str) -> Result<Table> {
        let mode = self.chain.mode;
        if matches!(mode, Mode::CbciTcrypt | Mode::CbcTcrypt) {
            return Err(Error::new(
                ErrorKind::NotSupported,
                "Kernel does not support activation for this TCRYPT legacy mode.",
            ));
        }
        if self.header.sector_size % 512 != 0 {
            return Err(Error::new(
                ErrorKind::NotSupported,
                format!(
                    "Activation is not supported for {} sector size.",
                    self.header.sector_size
                ),
            ));
        }
        let len = self.size_sectors();
        let (offset, iv) = (self.data_offset(), self.iv_offset());
        let mut layers = Vec::with_capacity(self.chain.ciphers.len());
        for alg in self.chain.ciphers {
            let text = format!("{}-{}", alg.name, mode.name());
            let spec = CipherSpec::parse(&text).map_err(|e| {
                Error::new(
                    ErrorKind::NotSupported,
                    format!("Kernel does not support TCRYPT compatible mapping ({text}: {e})."),
                )
            })?;
            let key = algs::mapping_key(alg, mode, &self.header.keys);
            let t = Table::from_parts(
                0,
                len,
                spec,
                Secret::from(&key[..]),
                iv,
                device.to_owned(),
                offset,
                Options::default(),
            )
            .map_err(|e| Error::new(ErrorKind::Invalid, format!("Invalid TCRYPT mapping: {e}")))?;
            layers.push(t);
        }
        Table::stacked(layers)
            .map_err(|e| Error::new(ErrorKind::Invalid, format!("Invalid TCRYPT mapping: {e}")))
    }

    /// `tcryptDump`'s text (cryptsetup's `TCRYPT_dump`) for `device`.
    pub fn dump(&self, device: &str) -> String {
        let h = &self.header;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} header information for {device}",
            if h.magic[0] == b'T' {
                "TCRYPT"
            } else {
                "VERACRYPT"
            }
        );
        let _ = writeln!(s, "Version:       \t{}", h.version);
        let _ = writeln!(
            s,
            "Driver req.:\t{:x}.{:x}",
            h.version_tc >> 8,
            h.version_tc & 0xff
        );
        let _ = writeln!(s, "Sector size:\t{}", h.sector_size);
        let _ = writeln!(s, "MK offset:\t{}", h.mk_offset);
        let _ = writeln!(s, "PBKDF2 hash:\t{}", self.hash);
        let _ = writeln!(s, "Cipher chain:\t{}", self.chain.name);
        let _ = writeln!(s, "Cipher mode:\t{}", self.chain.mode.name());
        let _ = writeln!(s, "MK bits:       \t{}", self.chain.key_size * 8);
        s
    }

    /// `tcryptDump --dump-volume-key`'s text, in locked memory.
    pub fn dump_volume_key(&self, device: &str) -> Secret {
        let key = self.volume_key();
        let mut s = Secret::with_capacity(512 + key.len() * 4);
        let _ = write!(
            s,
            "TCRYPT header information for {device}\nCipher chain:  \t{}\nCipher mode:   \t{}\nPayload offset:\t{}\nMK bits:       \t{}\nMK dump:\t",
            self.chain.name,
            self.chain.mode.name(),
            self.data_offset(),
            key.len() * 8
        );
        for (i, b) in key.iter().enumerate() {
            if i > 0 && i % 16 == 0 {
                let _ = write!(s, "\n\t\t");
            }
            let _ = write!(s, "{b:02x} ");
        }
        let _ = writeln!(s);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_takes_any_bytes() {
        let mut rng = testutil::Rng::new(7);
        for len in [0, 1, 4, 100, 447, 448, 449, 512] {
            for _ in 0..50 {
                let mut b = vec![0u8; len];
                rng.fill(&mut b);
                if len >= 4 {
                    b[..4].copy_from_slice(b"VERA");
                }
                let _ = Header::parse(&b, true);
            }
        }
    }

    #[test]
    fn a_header_with_good_crcs_parses_and_a_flipped_bit_does_not() {
        let mut d = vec![0u8; HDR_LEN];
        d[..4].copy_from_slice(b"VERA");
        d[4..6].copy_from_slice(&5u16.to_be_bytes());
        d[36..44].copy_from_slice(&(1u64 << 20).to_be_bytes());
        for (i, b) in d[192..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let kc = crc32(&d[192..]);
        d[8..12].copy_from_slice(&kc.to_be_bytes());
        let hc = crc32(&d[..188]);
        d[188..192].copy_from_slice(&hc.to_be_bytes());
        let h = Header::parse(&d, true).expect("valid header");
        assert_eq!(
            (h.version, h.volume_size, h.mk_offset, h.sector_size),
            (5, 1 << 20, 512, 512)
        );
        assert!(
            Header::parse(&d, false).is_none(),
            "VERA needs VeraCrypt modes"
        );
        for at in [0usize, 5, 40, 200, 447] {
            let mut e = d.clone();
            e[at] ^= 1;
            assert!(Header::parse(&e, true).is_none(), "bit flip at {at}");
        }
    }

    /// A TrueCrypt 1.x header (version 1, volume size 0) over a 38-sector
    /// image, as the suite's `tc_1-*`/`tc_2-*` images have it: the mapping
    /// runs from sector 1 to the end, `cbc-tcw` counts IVs from the data
    /// offset and `lrw-benbi` from 0, as cryptsetup 2.6.1 maps them.
    #[test]
    fn legacy_headers_of_size_zero_map_the_rest_of_the_device() {
        let mut d = vec![0u8; HDR_LEN];
        d[..4].copy_from_slice(b"TRUE");
        d[4..6].copy_from_slice(&1u16.to_be_bytes());
        for (i, b) in d[192..].iter_mut().enumerate() {
            *b = (i * 13) as u8;
        }
        let kc = crc32(&d[192..]);
        d[8..12].copy_from_slice(&kc.to_be_bytes());
        let header = Header::parse(&d, false).expect("a version 1 header");
        assert_eq!((header.volume_size, header.mk_offset), (0, 512));
        let vol = |name, mode| Volume {
            header: header.clone(),
            hash: "sha1",
            chain: algs::find(name, mode).expect("chain"),
            request: Request::default(),
            device_size: 38 * 512,
        };
        for (name, mode, iv, spec) in [
            ("aes", Mode::CbcTcw, 1, "aes-cbc-tcw"),
            ("cast5", Mode::CbcTcw, 1, "cast5-cbc-tcw"),
            ("aes", Mode::Lrw, 0, "aes-lrw-benbi"),
        ] {
            let v = vol(name, mode);
            assert_eq!(
                (v.data_offset(), v.iv_offset(), v.size_sectors()),
                (1, iv, 37),
                "{spec}"
            );
            let t = v.table("/dev/loop0").expect("table");
            assert_eq!((t.len_bytes(), t.offset_bytes()), (37 * 512, 512), "{spec}");
            assert!(
                t.format(false).contains(spec),
                "{spec}: {}",
                t.format(false)
            );
        }
        // The CBC cascades and Blowfish: cryptsetup's refusal.
        for (name, mode) in [
            ("twofish-aes", Mode::CbciTcrypt),
            ("blowfish_le", Mode::CbcTcrypt),
        ] {
            let v = vol(name, mode);
            let e = v.table("/dev/loop0").expect_err("refused");
            assert!(e.to_string().contains("legacy mode"), "{name}: {e}");
        }
    }

    #[test]
    fn random_sectors_never_decrypt_nor_panic() {
        let mut rng = testutil::Rng::new(11);
        let req = Request {
            hash: Some("sha512".into()),
            veracrypt: false,
            ..Request::default()
        };
        for len in [0usize, 63, 511, 512] {
            let mut b = vec![0u8; len];
            rng.fill(&mut b);
            let r = decrypt_sector(&b, b"pass", &req).expect("no error");
            assert!(r.is_none());
        }
    }
}
