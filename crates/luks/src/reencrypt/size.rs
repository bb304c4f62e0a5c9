//! `--device-size`: a run over the data's first bytes only, cryptsetup
//! 2.6.1's fixed-length mode. Mid-way the data segments get fixed sizes
//! (the rest of the device is in none of them); the finished volume's
//! segment is the one recorded at init (`backup-final`), so bytes past
//! the size are left as they were, still under the old key, as
//! cryptsetup leaves them. A run stopped mid-way and resumed without
//! `--device-size` goes on to the device's end, as cryptsetup's does.

use std::path::Path;

use super::{data_size, read_header_of, Resilience, State, MIN_ALIGNMENT};
use crate::error::{invalid, ErrorKind, Result};
use crate::volume::io::{self, open_ro};
use crate::DeviceAccess;

/// `size` checked against the reencryption `st` on a device of
/// `dev_size` bytes as cryptsetup checks `--device-size` on a run
/// (`reencrypt_load_by_passphrase`, then `reencrypt_context_init`), in
/// its words; returns it.
pub(super) fn check(st: &State, dev_size: u64, size: u64) -> Result<u64> {
    let mut minimal = 0u64;
    let mut dynamic = false;
    for (_, s) in &st.data {
        match s.fixed_size()? {
            Some(l) => minimal += l,
            None => dynamic = true,
        }
    }
    let area = dev_size.saturating_sub(st.old.offset);
    let old_ss = u64::from(st.old.sector_size);
    let new_ss = u64::from(st.new.sector_size);
    if (minimal > 0 && size < minimal)
        || size > area
        || (!dynamic && size != minimal)
        // (A plaintext side, `linear`, has no sector size.)
        || (old_ss > 0 && size % old_ss != 0)
        || (new_ss > 0 && size % new_ss != 0)
    {
        return Err(invalid(
            "Illegal device size requested in reencryption parameters.",
        ));
    }
    let align = match st.resilience {
        Resilience::Checksum { block, .. } => u64::from(block),
        _ => MIN_ALIGNMENT,
    }
    .max(old_ss.max(new_ss));
    if size % align != 0 {
        return Err(invalid(format!(
            "Device size must be multiple of calculated zone alignment ({align} bytes)."
        )));
    }
    Ok(size)
}

/// `size` checked as cryptsetup checks `--device-size` when it starts a
/// reencryption, before anything is written (cryptsetup's init writes
/// the header first): at most the data area of `device` (whose header,
/// if any yet, is on `meta`), a multiple of the larger of the old and
/// the new (`new_sector_size`, default the old one; 512 for an
/// encryption) sector size.
pub fn check_device_size(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    size: u64,
    new_sector_size: Option<u32>,
) -> Result<()> {
    let (area, old_ss) = match read_header_of(meta, device, access) {
        Ok((h, dev_size)) => {
            let seg = h.meta.segment().1;
            let area = if meta == device || seg.offset > 0 {
                dev_size.saturating_sub(seg.offset)
            } else {
                dev_size
            };
            (area, seg.sector_size)
        }
        // No header yet (an encryption): the whole device, plaintext.
        Err(e) if e.kind() == ErrorKind::NotLuks || !meta.exists() => {
            let mut f = open_ro(device, access)?;
            (io::device_size(&mut *f, device)?, 512)
        }
        Err(e) => return Err(e),
    };
    if size > area {
        return Err(invalid(
            "Reduced data size is larger than real device size.",
        ));
    }
    let ss = new_sector_size.unwrap_or(old_ss).max(old_ss);
    if size % u64::from(ss) != 0 {
        return Err(invalid(format!(
            "Data device is not aligned to encryption sector size ({ss} bytes)."
        )));
    }
    Ok(())
}

/// The fixed length an online run of `device` (its header on `meta`)
/// takes when the active volume serves `served` bytes, cryptsetup 2.6.1's
/// rule (`reencrypt_load`: the mapping's size is the reencryption's
/// size; `--device-size`, `asked`, must equal it), checked before
/// anything is written: `None` when `served` is the whole data area and
/// no size was asked (the run goes to the device's end; cryptsetup
/// records that as fixed sizes, which moves the same bytes). A start
/// (`init`: nothing in progress yet; `new_sector_size` its sector size)
/// is checked against the zone alignment it will record; a resume as
/// [`check`] checks it. `init_only`: only `asked` against `served`, as
/// cryptsetup's `--init-only` checks nothing more.
pub fn online_size(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    served: u64,
    asked: Option<u64>,
    new_sector_size: Option<u32>,
    init_only: bool,
) -> Result<Option<u64>> {
    if asked.is_some_and(|a| a != served) {
        return Err(invalid(
            "Active device size and requested reencryption size don't match.",
        ));
    }
    if init_only {
        return Ok(None);
    }
    let (h, dev_size) = read_header_of(meta, device, access)?;
    match State::load(&h)? {
        Some(st) => {
            let whole = State {
                fixed_size: None,
                ..st.clone()
            };
            if asked.is_none() && st.fixed_size.is_none() && served == data_size(dev_size, &whole)?
            {
                return Ok(None);
            }
            check(&st, dev_size, served).map(Some)
        }
        None => {
            let seg = h.meta.segment().1;
            let old_ss = u64::from(seg.sector_size);
            let new_ss = new_sector_size.map_or(old_ss, u64::from);
            let area = dev_size.saturating_sub(seg.offset);
            let area = area - area % old_ss.max(new_ss).max(512);
            if asked.is_none() && served == area {
                return Ok(None);
            }
            if served > area || served % old_ss.max(new_ss).max(512) != 0 {
                return Err(invalid(
                    "Illegal device size requested in reencryption parameters.",
                ));
            }
            let align = MIN_ALIGNMENT.max(old_ss).max(new_ss);
            if served % align != 0 {
                return Err(invalid(format!(
                    "Device size must be multiple of calculated zone alignment ({align} bytes)."
                )));
            }
            Ok(Some(served))
        }
    }
}
