//! Where a new volume's metadata, keyslots and data go, by cryptsetup
//! 2.6's rules (`_crypt_format_luks1/2`, `LUKS_generate_phdr`,
//! `LUKS2_generate_hdr`): `--offset`, `--align-payload`,
//! `--luks2-metadata-size`, `--luks2-keyslots-size`, a detached header,
//! and the encryption sector size picked when none is given.
//!
//! ```text
//!   attached header:  data = round_up(metadata end, alignment)
//!                     alignment = --align-payload sectors, else 1 MiB
//!   detached header:  data = --align-payload sectors (0 if none)
//!   --offset:         data = offset (alignment not used)
//! ```
//!
//! Everything here is decided before the first byte is written.

use crate::error::{invalid, Result};

/// Alignment of the data area when none is given: cryptsetup's
/// `DEFAULT_DISK_ALIGNMENT` on a device with no topology hints (files).
const DEFAULT_ALIGNMENT: u64 = 1 << 20;
/// LUKS2 binary header plus JSON area size (each copy) by default.
pub(super) const LUKS2_HDR_SIZE: u64 = 16384;
/// Default end of the LUKS2 metadata (header copies and keyslots area).
const LUKS2_DEFAULT_END: u64 = 16 << 20;
/// Largest LUKS2 keyslots area cryptsetup makes.
const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;
/// The LUKS2 metadata sizes (one header copy) cryptsetup allows.
const LUKS2_METADATA_SIZES: [u64; 9] = [
    0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000, 0x100000, 0x200000, 0x400000,
];
/// Below this many bytes of keyslots area cryptsetup warns that few
/// keyslots fit (4 MiB less two 16 KiB header copies).
const SMALL_KEYSLOTS_AREA: u64 = (4 << 20) - 2 * LUKS2_HDR_SIZE;

/// The placement options of one format.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request {
    /// The header lives in a separate file.
    pub detached: bool,
    /// `--offset`, bytes.
    pub data_offset: Option<u64>,
    /// `--align-payload`, 512-byte sectors (0 = not given).
    pub align_sectors: Option<u32>,
    /// `--luks2-metadata-size`, bytes (0 = not given).
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size`, bytes (0 = not given).
    pub keyslots_size: Option<u64>,
    /// Size of the data device, bytes.
    pub data_size: u64,
}

impl Request {
    fn align(&self) -> u64 {
        u64::from(self.align_sectors.unwrap_or(0)) * 512
    }

    /// cryptsetup's `cd->data_offset`: `--offset`, or with a detached
    /// header the alignment taken as the data offset (0 if none).
    fn fixed_offset(&self) -> u64 {
        match self.data_offset {
            Some(o) if o != 0 => o,
            _ if self.detached => self.align(),
            _ => 0,
        }
    }

    /// The alignment the data start is rounded up to when no offset is
    /// fixed: `--align-payload`, else 1 MiB (none with a detached header).
    fn required_alignment(&self) -> u64 {
        match self.align() {
            0 if self.detached => 0,
            0 => DEFAULT_ALIGNMENT,
            a => a,
        }
    }

    /// Refuses option values cryptsetup refuses before touching the
    /// device: `--offset` and `--align-payload` together, an offset that
    /// is not a multiple of 4096 bytes, LUKS2 metadata and keyslots area
    /// sizes it does not make.
    pub fn check(&self, version: u32) -> Result<()> {
        if self.data_offset.is_some() && self.align_sectors.is_some() {
            return Err(invalid(
                "Options --align-payload and --offset cannot be combined.",
            ));
        }
        if self.data_offset.is_some_and(|o| o % 4096 != 0) {
            return Err(invalid("Data offset is not multiple of 4096 bytes."));
        }
        let md = self.metadata_size.filter(|&m| m != 0);
        let ks = self.keyslots_size.filter(|&k| k != 0);
        if (self.metadata_size.is_some() || self.keyslots_size.is_some()) && version != 2 {
            return Err(invalid("Unsupported LUKS2 metadata size options."));
        }
        if md.is_some_and(|m| !LUKS2_METADATA_SIZES.contains(&m))
            || ks.is_some_and(|k| k % 4096 != 0 || k > MAX_KEYSLOTS_SIZE)
        {
            return Err(invalid("Unsupported LUKS2 metadata size options."));
        }
        Ok(())
    }

    /// The encryption sector size cryptsetup picks when none is given:
    /// 4096 (a file's block size) unless the fixed data offset or the
    /// device size less the alignment is not 4096-aligned.
    pub fn auto_sector_size(&self) -> u32 {
        let off = self.fixed_offset();
        let rest = self.data_size.wrapping_sub(self.required_alignment());
        if off % 4096 != 0 || rest % 4096 != 0 {
            512
        } else {
            4096
        }
    }
}

/// A LUKS2 volume's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Luks2Layout {
    /// One header copy (binary header and JSON area), bytes.
    pub hdr_size: u64,
    /// Keyslots area, bytes.
    pub keyslots_size: u64,
    /// Data start, bytes.
    pub data_offset: u64,
    /// cryptsetup's format warnings about the layout, in its order.
    pub warnings: Vec<String>,
}

/// `LUKS2_generate_hdr`'s placement: the keyslots area grows to a fixed
/// data offset (at most 128 MiB) or shrinks to fit before it, and with
/// no fixed offset the data starts at the metadata end rounded up to the
/// alignment.
pub(super) fn luks2(req: &Request) -> Result<Luks2Layout> {
    let hdr_size = req
        .metadata_size
        .filter(|&m| m != 0)
        .unwrap_or(LUKS2_HDR_SIZE);
    let min = 2 * hdr_size;
    let fixed = req.fixed_offset();
    if fixed != 0 && fixed < min {
        return Err(invalid("Requested data offset is too small."));
    }
    let asked = req.keyslots_size.filter(|&k| k != 0);
    let mut ks = match asked {
        Some(k) => k,
        None if fixed != 0 => fixed - min,
        None => 0,
    };
    ks -= ks % 4096;
    ks = ks.min(MAX_KEYSLOTS_SIZE);
    if ks == 0 {
        ks = LUKS2_DEFAULT_END - min;
    }
    if fixed != 0 && ks + min > fixed {
        ks = fixed - min;
    }
    let data_offset = match req.required_alignment() {
        a if fixed == 0 && a != 0 => (min + ks).div_ceil(a) * a,
        _ => fixed,
    };
    let mut warnings = Vec::new();
    if ks < SMALL_KEYSLOTS_AREA {
        warnings.push(format!(
            "keyslots area ({ks} bytes) is very small, available LUKS2 keyslot count is very limited."
        ));
    }
    if asked.is_some_and(|k| k != ks) {
        warnings.push(format!("LUKS2 keyslots area size changed to {ks} bytes."));
    }
    Ok(Luks2Layout {
        hdr_size,
        keyslots_size: ks,
        data_offset,
        warnings,
    })
}

/// `LUKS_generate_phdr`'s payload offset in sectors, given where the
/// keyslot areas end (`header_sectors`): the fixed offset, else the
/// areas' end rounded up to the alignment, else 0.
pub(super) fn luks1_payload(req: &Request, header_sectors: u64) -> Result<u32> {
    let fixed = req.fixed_offset();
    let payload = match req.required_alignment() {
        _ if fixed != 0 => fixed / 512,
        0 => 0,
        a => header_sectors.div_ceil(a / 512) * (a / 512),
    };
    if payload != 0 && payload < header_sectors {
        return Err(invalid(
            "Data offset for LUKS header must be either 0 or higher than header size.",
        ));
    }
    u32::try_from(payload).map_err(|_| invalid("Data offset is too large for LUKS1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(detached: bool) -> Request {
        Request {
            detached,
            data_offset: None,
            align_sectors: None,
            metadata_size: None,
            keyslots_size: None,
            data_size: 40 << 20,
        }
    }

    #[test]
    fn luks2_defaults_and_alignment() {
        let l = luks2(&req(false)).unwrap();
        assert_eq!(
            (l.hdr_size, l.keyslots_size, l.data_offset),
            (16384, (16 << 20) - 32768, 16 << 20)
        );
        assert!(l.warnings.is_empty());
        // A 3-sector alignment: the metadata end rounded up to 1536.
        let r = Request {
            align_sectors: Some(3),
            ..req(false)
        };
        assert_eq!(luks2(&r).unwrap().data_offset, 16777728);
        assert_eq!(r.auto_sector_size(), 512);
        // Detached: the alignment is the data offset, the keyslots area
        // grows to it.
        let r = Request {
            align_sectors: Some(4096),
            ..req(true)
        };
        let l = luks2(&r).unwrap();
        assert_eq!(
            (l.data_offset, l.keyslots_size),
            (2 << 20, (2 << 20) - 32768)
        );
        // A bigger metadata area and a given keyslots area.
        let r = Request {
            metadata_size: Some(0x10000),
            keyslots_size: Some(1 << 20),
            ..req(false)
        };
        let l = luks2(&r).unwrap();
        assert_eq!(
            (l.hdr_size, l.keyslots_size, l.data_offset),
            (0x10000, 1 << 20, 2 << 20)
        );
        assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    }

    #[test]
    fn luks2_offset_shrinks_or_grows_the_keyslots_area() {
        let r = Request {
            data_offset: Some(1 << 20),
            keyslots_size: Some(2 << 20),
            ..req(false)
        };
        let l = luks2(&r).unwrap();
        assert_eq!(l.keyslots_size, (1 << 20) - 32768);
        assert!(
            l.warnings[1].contains("changed to 1015808"),
            "{:?}",
            l.warnings
        );
        let r = Request {
            data_offset: Some(32 << 20),
            ..req(false)
        };
        assert_eq!(luks2(&r).unwrap().keyslots_size, (32 << 20) - 32768);
        let r = Request {
            data_offset: Some(16384),
            ..req(true)
        };
        assert!(luks2(&r).is_err());
    }

    #[test]
    fn checks_refuse_what_cryptsetup_refuses() {
        let bad = [
            Request {
                data_offset: Some(4096),
                align_sectors: Some(8),
                ..req(false)
            },
            Request {
                data_offset: Some(1536),
                ..req(false)
            },
            Request {
                metadata_size: Some(12345),
                ..req(false)
            },
            Request {
                keyslots_size: Some(4097),
                ..req(false)
            },
            Request {
                keyslots_size: Some(MAX_KEYSLOTS_SIZE + 4096),
                ..req(false)
            },
        ];
        for r in bad {
            assert!(r.check(2).is_err(), "{r:?}");
        }
        let md = Request {
            metadata_size: Some(0x8000),
            ..req(false)
        };
        assert!(md.check(2).is_ok());
        assert!(md.check(1).is_err());
    }

    #[test]
    fn luks1_payload_rules() {
        // 512-bit key: areas end at sector 4040.
        assert_eq!(luks1_payload(&req(false), 4040).unwrap(), 4096);
        let r = Request {
            align_sectors: Some(1000),
            ..req(false)
        };
        assert_eq!(luks1_payload(&r, 4040).unwrap(), 5000);
        assert_eq!(luks1_payload(&req(true), 4040).unwrap(), 0);
        let r = Request {
            align_sectors: Some(8),
            ..req(true)
        };
        assert!(luks1_payload(&r, 4040).is_err());
    }
}
