//! The dm table cryptsetup loads for an open BitLocker volume
//! (`_activate` in `lib/bitlk/bitlk.c`):
//!
//! - `zero` targets over the three 64 KiB FVE metadata areas and over the
//!   place the original volume header (boot sectors) was moved to;
//! - a `crypt` target at sector 0, as long as that header, reading it from
//!   where it was moved (device offset and IV offset both its position);
//! - `crypt` targets over every gap between them up to the device's end,
//!   each at its own position (device offset = IV offset = start);
//! - `iv_large_sectors` when the volume's sectors are 4096 bytes.
//!
//! cryptsetup fills the gaps with a search loop capped at 10 targets;
//! here the intervals are sorted and walked once, and overlapping areas
//! (which dm would refuse) are refused.

use crypto::spec::CipherSpec;
use crypto::table::{Options, Table, Target, Targets, Zero};
use crypto::Secret;

use crate::error::invalid;
use crate::metadata::{Metadata, FVE_METADATA_SIZE};
use crate::Result;

impl Metadata {
    /// The table over `device` (`device_size` bytes) with volume key `key`.
    pub fn targets(&self, device: &str, device_size: u64, key: &Secret) -> Result<Targets> {
        let dev = device_size / 512;
        let bad = |m: String| invalid(format!("Cannot map the BITLK device: {m}"));
        let hdr = (
            self.volume_header_offset / 512,
            self.volume_header_size / 512,
        );
        // (start, len, header?) of the areas that are not plain gaps.
        let mut areas: Vec<(u64, u64, bool)> = self
            .metadata_offsets
            .iter()
            .map(|o| (o / 512, FVE_METADATA_SIZE / 512, false))
            .collect();
        areas.push((hdr.0, hdr.1, false));
        if hdr.1 == 0 {
            return Err(bad("the volume header entry is missing".into()));
        }
        areas.push((0, hdr.1, true));
        areas.sort_unstable();
        let spec = CipherSpec::parse(&self.cipher_spec()).map_err(|e| bad(e.to_string()))?;
        let options = Options {
            sector_size: self.sector_size,
            iv_large_sectors: self.sector_size != 512,
            ..Options::default()
        };
        let crypt = |start: u64, len: u64, at: u64| {
            Table::from_parts(
                start,
                len,
                spec.clone(),
                key.clone(),
                at,
                device.to_owned(),
                at,
                options,
            )
            .map(Target::Crypt)
            .map_err(|e| bad(e.to_string()))
        };
        let mut out = Vec::with_capacity(2 * areas.len() + 1);
        let mut pos = 0u64;
        for &(start, len, header) in &areas {
            let end = start
                .checked_add(len)
                .filter(|&e| e <= dev)
                .ok_or_else(|| bad(format!("an area at sector {start} ends past the device")))?;
            if start < pos {
                return Err(bad(format!("areas overlap at sector {start}")));
            }
            if start > pos {
                out.push(crypt(pos, start - pos, pos)?);
            }
            out.push(if header {
                crypt(0, len, hdr.0)?
            } else {
                Target::Zero(Zero::new(start, len).map_err(|e| bad(e.to_string()))?)
            });
            pos = end;
        }
        if pos < dev {
            out.push(crypt(pos, dev - pos, pos)?);
        }
        Targets::new(out).map_err(|e| bad(e.to_string()))
    }
}
