//! LUKS2: two header copies (binary header + JSON area each), chosen by
//! checksum and seqid, and written back crash-safely.
//!
//! ```text
//! 0            hdr_size        2*hdr_size                 segment offset
//! | primary    | secondary     | keyslots area ...        | data ...
//! | bin | JSON | bin | JSON    | ks0 | ks1 | ...          |
//! ```

pub mod binary;
pub mod json;
mod shape;

use std::io::{Read, Seek, SeekFrom};

use crate::error::{corrupt, random_error, Error, ErrorKind, Result};
use binary::{BinHeader, BIN_LEN, HDR_SIZES};
pub use json::Metadata;

/// A parsed, validated LUKS2 header (the copy with the highest valid seqid).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Binary header fields of the chosen copy.
    pub bin: BinHeader,
    /// JSON metadata.
    pub meta: Metadata,
    /// Non-fatal findings while loading (e.g. "primary header corrupted").
    pub warnings: Vec<String>,
}

impl Header {
    /// Metadata size (binary + JSON area) of each copy.
    pub fn hdr_size(&self) -> u64 {
        self.bin.hdr_size
    }

    /// End of the keyslots area (bytes): what a detached header file holds.
    pub fn metadata_end(&self) -> u64 {
        2 * self.bin.hdr_size + self.meta.config.keyslots_size
    }

    /// Loads from a seekable device of `dev_size` bytes, trying the primary
    /// copy and then the secondary (at `hdr_size`, or at every offset the
    /// spec allows when the primary is unreadable).
    pub fn read<R: Read + Seek>(dev: &mut R, dev_size: u64) -> Result<Self> {
        let primary = read_copy(dev, dev_size, 0, true);
        let mut offsets: Vec<u64> = Vec::new();
        if let Ok(p) = &primary {
            offsets.push(p.bin.hdr_size);
        }
        for o in HDR_SIZES {
            if !offsets.contains(&o) {
                offsets.push(o);
            }
        }
        let mut secondary: Option<Result<Header>> = None;
        for off in offsets {
            let r = read_copy(dev, dev_size, off, false);
            let found = !matches!(&r, Err(e) if e.kind() == ErrorKind::NotLuks);
            if found {
                secondary = Some(r);
                break;
            }
        }
        let secondary =
            secondary.unwrap_or_else(|| Err(Error::new(ErrorKind::NotLuks, "No secondary header")));
        match (primary, secondary) {
            (Ok(mut p), Ok(s)) => {
                if s.bin.seqid > p.bin.seqid {
                    let mut s = s;
                    s.warnings.push(format!(
                        "Primary LUKS2 header is older (seqid {}) than the secondary ({}); using the secondary",
                        p.bin.seqid, s.bin.seqid
                    ));
                    Ok(s)
                } else {
                    if s.bin.seqid != p.bin.seqid || s.meta != p.meta {
                        p.warnings.push(format!(
                            "Secondary LUKS2 header (seqid {}) differs from the primary ({}); using the primary",
                            s.bin.seqid, p.bin.seqid
                        ));
                    }
                    Ok(p)
                }
            }
            (Ok(mut p), Err(e)) => {
                p.warnings
                    .push(format!("Secondary LUKS2 header is unusable: {e}"));
                Ok(p)
            }
            (Err(e), Ok(mut s)) => {
                // A primary ucrypt cannot act on (a reencryption in
                // progress) stands unless the secondary is newer (a run
                // that finished between the two copies' writes).
                if e.kind() == ErrorKind::Unsupported && primary_seqid(dev) >= Some(s.bin.seqid) {
                    return Err(e);
                }
                s.warnings.push(format!(
                    "Primary LUKS2 header is corrupted ({e}); using the secondary copy"
                ));
                Ok(s)
            }
            (Err(pe), Err(se)) => {
                if pe.kind() == ErrorKind::Unsupported && pe.message() == se.message() {
                    // Both copies are fine but name something ucrypt does
                    // not do (a reencryption in progress): say that, not
                    // "unusable".
                    Err(pe)
                } else if pe.kind() == ErrorKind::NotLuks && se.kind() == ErrorKind::NotLuks {
                    Err(pe)
                } else if pe.kind() == se.kind() && pe.message() == se.message() {
                    // One lie, written to both copies: say it once.
                    Err(Error::new(
                        pe.kind(),
                        format!("Both LUKS2 header copies are unusable: {pe}"),
                    ))
                } else if pe.kind() == ErrorKind::NotLuks {
                    Err(Error::new(
                        se.kind(),
                        format!("Both LUKS2 header copies are unusable: secondary: {se}"),
                    ))
                } else {
                    Err(Error::new(
                        pe.kind(),
                        format!(
                            "Both LUKS2 header copies are unusable: primary: {pe}; secondary: {se}"
                        ),
                    ))
                }
            }
        }
    }

    /// Parses one copy from bytes starting at its binary header.
    pub fn parse_copy(area: &[u8], expect_primary: bool, offset: u64) -> Result<Self> {
        let bin = BinHeader::parse(area)?;
        if bin.primary != expect_primary {
            return Err(Error::new(
                ErrorKind::NotLuks,
                "Header copy has the other copy's magic",
            ));
        }
        if bin.hdr_offset != offset {
            return Err(corrupt(format!(
                "LUKS2 header at {offset} claims offset {}",
                bin.hdr_offset
            )));
        }
        let size = bin.hdr_size as usize;
        if area.len() < size {
            return Err(corrupt("LUKS2 header area is truncated"));
        }
        binary::verify_checksum(&area[..size])?;
        let meta = Metadata::parse(&area[BIN_LEN..size], bin.hdr_size)?;
        Ok(Header {
            bin,
            meta,
            warnings: Vec::new(),
        })
    }

    /// Both copies (primary, secondary) with a new seqid, ready to write.
    /// Fails if the JSON does not fit its area.
    pub fn to_copies(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        if let Some((id, sg)) = self.meta.segments.iter().find(|(_, s)| s.kind != "crypt") {
            // Only crypt segments are kept field for field.
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "LUKS2 segment {id} of type {:?} cannot be written back by ucrypt",
                    sg.kind
                ),
            ));
        }
        let json = self.meta.to_json();
        let json_size = (self.bin.hdr_size as usize) - BIN_LEN;
        if json.len() >= json_size {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "LUKS2 JSON metadata does not fit its area",
            ));
        }
        let mut copies = Vec::new();
        for primary in [true, false] {
            let mut bin = self.bin.clone();
            bin.primary = primary;
            bin.hdr_offset = if primary { 0 } else { self.bin.hdr_size };
            getrandom::fill(&mut bin.salt)
                .map_err(|e| random_error(ErrorKind::Corrupt, "No randomness", e))?;
            let mut area = bin.to_bytes();
            area.extend_from_slice(&json);
            area.resize(self.bin.hdr_size as usize, 0);
            binary::seal(&mut area);
            copies.push(area);
        }
        let s = copies.pop().unwrap_or_default();
        let p = copies.pop().unwrap_or_default();
        Ok((p, s))
    }
}

fn read_copy<R: Read + Seek>(
    dev: &mut R,
    dev_size: u64,
    offset: u64,
    primary: bool,
) -> Result<Header> {
    if offset + BIN_LEN as u64 > dev_size {
        if primary && dev_size >= 6 {
            // Fall through to read the magic at least.
        } else {
            return Err(Error::new(
                ErrorKind::NotLuks,
                "Device too small for a LUKS2 header copy",
            ));
        }
    }
    let mut bin = vec![0u8; BIN_LEN.min((dev_size.saturating_sub(offset)) as usize)];
    if bin.len() < 8 {
        return Err(Error::new(
            ErrorKind::NotLuks,
            "Device too small for a LUKS header",
        ));
    }
    read_at(dev, offset, &mut bin)?;
    let parsed = BinHeader::parse(&bin)?;
    if parsed.primary != primary {
        return Err(Error::new(ErrorKind::NotLuks, "No LUKS2 header copy here"));
    }
    // hdr_size is one of HDR_SIZES (<= 4 MiB): bounded allocation.
    if offset + parsed.hdr_size > dev_size {
        return Err(corrupt(format!(
            "LUKS2 header at {offset} extends beyond the device (truncated)"
        )));
    }
    let mut area = vec![0u8; parsed.hdr_size as usize];
    read_at(dev, offset, &mut area)?;
    Header::parse_copy(&area, primary, offset)
}

/// The primary binary header's seqid, when it parses.
fn primary_seqid<R: Read + Seek>(dev: &mut R) -> Option<u64> {
    let mut bin = vec![0u8; BIN_LEN];
    read_at(dev, 0, &mut bin).ok()?;
    BinHeader::parse(&bin).ok().map(|b| b.seqid)
}

fn read_at<R: Read + Seek>(dev: &mut R, offset: u64, buf: &mut [u8]) -> Result<()> {
    dev.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    dev.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt("LUKS2 header is truncated")
        } else {
            Error::io("Cannot read the header device", e)
        }
    })
}
