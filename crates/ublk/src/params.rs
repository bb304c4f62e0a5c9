//! The block device's parameters (size, logical block size, discard,
//! write-zeroes, read-only, FUA), derived from the export view and checked
//! against the [`Options`].

use datapath::Export;
use libublk::sys;

use crate::{Error, ErrorKind, Options};

/// Block-device parameters derived from the export view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceParams {
    /// Device size in bytes.
    pub size: u64,
    /// log2 of the logical block size (the volume's sector size).
    pub logical_shift: u8,
    /// Largest read/write in 512-byte sectors.
    pub max_sectors: u32,
    /// Advertise discard.
    pub discard: bool,
    /// Advertise read-only.
    pub read_only: bool,
}

/// Largest discard / write-zeroes the device advertises (1 GiB; the engine
/// takes u32 lengths).
const MAX_DISCARD_SECTORS: u32 = (1 << 30) >> 9;

impl DeviceParams {
    /// Checks `opts` against what the export allows and derives the
    /// parameters.
    pub fn new(view: &Export, opts: &Options) -> Result<Self, Error> {
        Self::from_parts(
            view.size(),
            view.sector_size(),
            view.allows_discards(),
            view.read_only(),
            opts,
        )
    }

    fn from_parts(
        size: u64,
        sector: u32,
        discard: bool,
        read_only: bool,
        opts: &Options,
    ) -> Result<Self, Error> {
        let bad = |m: String| Err(Error::new(ErrorKind::InvalidOptions(m)));
        if !sector.is_power_of_two() || !(512..=4096).contains(&sector) {
            return bad(format!(
                "sector size {sector} is not 512..4096 and a power of two"
            ));
        }
        if opts.queues == 0 || opts.depth == 0 {
            return bad("queues and depth must be at least 1".into());
        }
        // `sector` is a power of two (checked above).
        if opts.max_io_bytes < sector || opts.max_io_bytes & (sector - 1) != 0 {
            return bad(format!(
                "max IO size {} is not a multiple of the sector size {sector}",
                opts.max_io_bytes
            ));
        }
        if size & (u64::from(sector) - 1) != 0 {
            return bad(format!(
                "device size {size} is not a multiple of the sector size {sector}"
            ));
        }
        Ok(Self {
            size,
            logical_shift: sector.trailing_zeros() as u8,
            max_sectors: opts.max_io_bytes >> 9,
            discard,
            read_only,
        })
    }

    /// Writes these parameters into the driver's parameter block.
    pub fn apply(&self, p: &mut sys::ublk_params) {
        p.types |= sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD;
        let b = &mut p.basic;
        b.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
        if self.read_only {
            b.attrs |= sys::UBLK_ATTR_READ_ONLY;
        }
        b.logical_bs_shift = self.logical_shift;
        b.physical_bs_shift = self.logical_shift.max(12);
        b.io_min_shift = self.logical_shift;
        b.io_opt_shift = self.logical_shift.max(12);
        b.max_sectors = self.max_sectors;
        b.dev_sectors = self.size >> 9;
        let d = &mut p.discard;
        d.discard_alignment = 0;
        d.discard_granularity = 1 << self.logical_shift;
        d.max_discard_segments = 1;
        d.max_discard_sectors = if self.discard && !self.read_only {
            MAX_DISCARD_SECTORS
        } else {
            0
        };
        d.max_write_zeroes_sectors = if self.read_only {
            0
        } else {
            MAX_DISCARD_SECTORS
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_params_follow_the_volume() {
        let o = Options::default();
        let p = DeviceParams::from_parts(1 << 30, 4096, true, false, &o).unwrap();
        let mut raw = sys::ublk_params::default();
        p.apply(&mut raw);
        assert_eq!(raw.basic.logical_bs_shift, 12);
        assert_eq!(raw.basic.dev_sectors, (1 << 30) >> 9);
        assert_eq!(raw.basic.max_sectors, 1024);
        assert_ne!(raw.basic.attrs & sys::UBLK_ATTR_FUA, 0);
        assert_ne!(raw.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0);
        assert_eq!(raw.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(
            (
                raw.discard.discard_granularity,
                raw.discard.max_discard_segments
            ),
            (4096, 1)
        );
        assert!(raw.discard.max_discard_sectors > 0);

        let p = DeviceParams::from_parts(1 << 20, 512, false, true, &o).unwrap();
        let mut raw = sys::ublk_params::default();
        p.apply(&mut raw);
        assert_eq!(raw.basic.logical_bs_shift, 9);
        assert_ne!(raw.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(
            (
                raw.discard.max_discard_sectors,
                raw.discard.max_write_zeroes_sectors
            ),
            (0, 0)
        );

        for (size, sector, opts) in [
            (1 << 20, 1024 + 512, o.clone()),
            (1 << 20, 8192, o.clone()),
            (1000, 512, o.clone()),
            (
                1 << 20,
                4096,
                Options {
                    max_io_bytes: 6000,
                    ..o.clone()
                },
            ),
            (
                1 << 20,
                512,
                Options {
                    depth: 0,
                    ..o.clone()
                },
            ),
        ] {
            let e = DeviceParams::from_parts(size, sector, false, false, &opts).unwrap_err();
            assert!(e.to_string().starts_with("Invalid ublk options"), "{e}");
        }
    }
}
