//! LUKS1 and LUKS2 volumes, compatible with cryptsetup in both directions.
//!
//! ```text
//!   CLI / coordinator
//!        │  Volume::load / format / add_key / kill_slot …     open() -> Opened
//!        ▼                                                          │
//!   Header { V1(luks1::Header) | V2(luks2::Header) }                │ cipher, key,
//!        │  keyslot: kdf -> area cipher (crypto::SectorCrypt) -> af │ sector size,
//!        ▼                                                          ▼ offsets
//!   header device (the data device or a detached header file)   datapath
//! ```
//!
//! On-disk structures are parsed from bytes through a bounds-checked cursor
//! and validated (offsets, sizes, JSON shape) before anything is allocated
//! from them; `internal::fuzzing` (the `fuzzing` feature) feeds arbitrary
//! bytes through the same path. A LUKS2 header loads when cryptsetup 2.6's would, except where
//! ucrypt is stricter on purpose (a digest under 20 bytes, KDF costs
//! beyond cryptsetup's own limits; `luks2/json/check.rs` lists every check
//! and its reason): what cryptsetup leaves to activation (a keyslot's KDF
//! kind, the data area against the device, segments ucrypt cannot map) is
//! checked at unlock, before any key derivation, and fails only that
//! keyslot or the mapping. The code is hand-written from the LUKS1 and LUKS2 on-disk
//! format specifications; interop tests against cryptsetup, and
//! cryptsetup's own LUKS2 validation suite, check it.
// Unsafe only in `passphrase/tty/signals.rs` (sigaction), which allows it.
#![deny(unsafe_code)]
// `u64::is_multiple_of` needs Rust 1.87; the workspace MSRV is 1.85.
#![allow(clippy::manual_is_multiple_of)]

pub mod af;
mod codec;
pub mod dump;
mod error;
pub mod hash;
pub mod kdf;
pub mod keyslot;
mod lockfile;
pub mod luks1;
pub mod luks2;
pub mod ops;
pub mod passphrase;
pub mod reencrypt;
pub mod summary;
mod volume;

use std::io::{Cursor, Read, Seek, SeekFrom};

pub use error::{Error, ErrorKind, Result};
pub use hash::Hash;
pub use kdf::{Kdf, KdfRequest};
pub use volume::{format, open, DeviceAccess, FormatOptions, Opened, Volume};
pub use volume::{token_text, Priority, Repair, TokenPlacement, KEYRING_TOKEN, MAX_LABEL_LEN};

use error::corrupt;

/// A parsed LUKS header of either version.
///
/// Deliberately exhaustive (no `#[non_exhaustive]`): the set is the LUKS
/// on-disk versions this crate reads, and callers (the daemon's volume
/// type, dump, convert) match both; a new version must be handled by
/// each of them, which a compile error at every match makes sure of.
#[derive(Debug, Clone, PartialEq)]
pub enum Header {
    /// LUKS1.
    V1(luks1::Header),
    /// LUKS2.
    V2(luks2::Header),
}

impl Header {
    /// Reads the header from a seekable device/file of `size` bytes.
    pub fn read<R: Read + Seek>(dev: &mut R, size: u64) -> Result<Self> {
        let mut head = [0u8; 8];
        let n = (size.min(8)) as usize;
        dev.seek(SeekFrom::Start(0))
            .map_err(|e| Error::io("Cannot seek the header device", e))?;
        dev.read_exact(&mut head[..n])
            .map_err(|e| Error::io("Cannot read the header device", e))?;
        if n == 8 && head[..6] == luks1::MAGIC && head[6..8] == [0, 1] {
            if size < luks1::HEADER_LEN as u64 {
                return Err(corrupt("LUKS1 header is truncated"));
            }
            let mut buf = vec![0u8; luks1::HEADER_LEN];
            dev.seek(SeekFrom::Start(0))
                .map_err(|e| Error::io("Cannot seek the header device", e))?;
            dev.read_exact(&mut buf)
                .map_err(|e| Error::io("Cannot read the header device", e))?;
            let h = luks1::Header::parse(&buf)?;
            if h.metadata_end() > size {
                return Err(corrupt(
                    "LUKS1 keyslot areas extend beyond the device (truncated)",
                ));
            }
            return Ok(Header::V1(h));
        }
        if n == 8 && head[..6] == luks1::MAGIC && head[6..8] != [0, 2] {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "LUKS version {} is not supported",
                    u16::from_be_bytes([head[6], head[7]])
                ),
            ));
        }
        let h = luks2::Header::read(dev, size)?;
        if h.metadata_end() > size {
            return Err(corrupt(
                "LUKS2 keyslots area extends beyond the device (truncated)",
            ));
        }
        Ok(Header::V2(h))
    }

    /// Parses a header from an in-memory image (header backup, fuzzing).
    pub fn from_bytes(image: &[u8]) -> Result<Self> {
        Self::read(&mut Cursor::new(image), image.len() as u64)
    }

    /// 1 or 2.
    pub fn version(&self) -> u32 {
        match self {
            Header::V1(_) => 1,
            Header::V2(_) => 2,
        }
    }

    /// Volume UUID.
    pub fn uuid(&self) -> &str {
        match self {
            Header::V1(h) => &h.uuid,
            Header::V2(h) => &h.bin.uuid,
        }
    }

    /// Label (LUKS2 only; empty otherwise).
    pub fn label(&self) -> &str {
        match self {
            Header::V1(_) => "",
            Header::V2(h) => &h.bin.label,
        }
    }

    /// Data cipher in dm-crypt form, e.g. `aes-xts-plain64`.
    pub fn cipher(&self) -> String {
        match self {
            Header::V1(h) => h.cipher(),
            Header::V2(h) => h.meta.segment().1.encryption.clone(),
        }
    }

    /// Volume key size in bytes.
    pub fn key_size(&self) -> usize {
        match self {
            Header::V1(h) => h.key_bytes as usize,
            Header::V2(h) => h
                .meta
                .segment_keyslots()
                .first()
                .and_then(|k| h.meta.keyslots.get(&k.to_string()))
                .map(|k| k.key_size as usize)
                .unwrap_or(0),
        }
    }

    /// Encryption sector size.
    pub fn sector_size(&self) -> u32 {
        match self {
            Header::V1(_) => 512,
            Header::V2(h) => h.meta.segment().1.sector_size,
        }
    }

    /// Data start in bytes.
    pub fn payload_offset(&self) -> u64 {
        match self {
            Header::V1(h) => u64::from(h.payload_offset) * 512,
            Header::V2(h) => h.meta.segment().1.offset,
        }
    }

    /// Bytes of metadata (headers + keyslot areas) from the device start.
    pub fn metadata_end(&self) -> u64 {
        match self {
            Header::V1(h) => h.metadata_end(),
            Header::V2(h) => h.metadata_end(),
        }
    }

    /// Active keyslot ids.
    pub fn active_slots(&self) -> Vec<u32> {
        match self {
            Header::V1(h) => (0..8u32).filter(|&i| h.slots[i as usize].active).collect(),
            Header::V2(h) => {
                let mut v: Vec<u32> = h
                    .meta
                    .keyslots
                    .keys()
                    .filter_map(|k| k.parse().ok())
                    .collect();
                v.sort_unstable();
                v
            }
        }
    }

    /// Warnings collected while loading (corrupted copy, seqid mismatch).
    pub fn warnings(&self) -> &[String] {
        match self {
            Header::V1(_) => &[],
            Header::V2(h) => &h.warnings,
        }
    }
}

/// Entry points for fuzzers and the never-panics tests. Not a stable API:
/// built only with the `fuzzing` feature (`fuzz/` and this crate's tests).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod internal {
    /// Fuzzing entry points.
    pub mod fuzzing {
        use crate::Header;

        /// Parses `data` as a header image (LUKS1, LUKS2 with both copies,
        /// or garbage) through every parser layer and, when one succeeds,
        /// checks that re-serializing gives the same value. Must never panic.
        pub fn header(data: &[u8]) {
            if let Ok(h) = Header::from_bytes(data) {
                let _ = (
                    h.uuid(),
                    h.cipher(),
                    h.key_size(),
                    h.sector_size(),
                    h.payload_offset(),
                );
                let _ = (
                    h.metadata_end(),
                    h.active_slots(),
                    h.warnings().len(),
                    h.label(),
                );
            }
            if let Ok(v1) = crate::luks1::Header::parse(data) {
                let again = crate::luks1::Header::parse(&v1.to_bytes());
                assert_eq!(again.ok().as_ref(), Some(&v1), "LUKS1 round trip");
            }
            // Both LUKS2 copies without the keyslots-area size check, so
            // header-only seeds reach the JSON layer.
            let mut cur = std::io::Cursor::new(data);
            if let Ok(v2) = crate::luks2::Header::read(&mut cur, data.len() as u64) {
                let _ = v2.meta.segment_keyslots();
                if let Ok((p, s)) = v2.to_copies() {
                    let again = crate::luks2::Header::parse_copy(&p, true, 0);
                    assert_eq!(
                        again.ok().map(|x| x.meta).as_ref(),
                        Some(&v2.meta),
                        "LUKS2 round trip"
                    );
                    let again = crate::luks2::Header::parse_copy(&s, false, v2.bin.hdr_size);
                    assert!(again.is_ok(), "LUKS2 secondary round trip");
                }
            }
            // The JSON parser on its own.
            let _ = crate::luks2::Metadata::parse(data, 16384);
        }

        /// Parses `data` as the header image of a volume in reencryption
        /// (both copies) and loads its reencryption state, as `reencrypt`
        /// and `open` do before anything else. Must never panic.
        pub fn reencrypt_state(data: &[u8]) {
            crate::reencrypt::fuzz_state(data);
        }

        /// Parses `data` as the log of a LUKS1 reencryption
        /// (`LUKS-<uuid>.log`). Must never panic.
        pub fn reencrypt_luks1_log(data: &[u8]) {
            let _ =
                crate::reencrypt::luks1::parse_log(data, "cafecafe-cafe-cafe-cafe-cafecafeeeee");
        }
    }
}
