//! What an engine serves, checked: one [`Volume`] or a [`Mapping`] of
//! several targets, as the layout a generation is built on (backend,
//! cipher, data offset, targets, size, sector size).

use std::sync::Arc;

use crate::segments::{Cipher, Segs};
use crate::{Error, Mapping, Volume};

/// What a generation serves: a [`Volume`] or a [`Mapping`], checked.
#[derive(Clone)]
pub(crate) struct Layout {
    pub(crate) backend: Arc<dyn backend::Backend>,
    pub(crate) crypt: Option<Cipher>,
    pub(crate) data_offset: u64,
    pub(crate) segs: Option<Arc<Segs>>,
    pub(crate) size: u64,
    pub(crate) sector_size: u32,
}

impl Layout {
    /// A one-target volume, checked.
    pub(crate) fn volume(vol: Volume) -> Result<Layout, Error> {
        check_volume(&vol)?;
        Ok(Layout {
            backend: vol.backend,
            crypt: vol.crypt.map(Cipher::One),
            data_offset: vol.data_offset,
            segs: None,
            size: vol.size,
            sector_size: vol.sector_size,
        })
    }

    /// A mapping, checked: one target is exactly a [`Volume`].
    pub(crate) fn mapping(m: Mapping) -> Result<Layout, Error> {
        match m.targets.as_slice() {
            [] => Err(Error::Invalid("A mapping needs at least one target".into())),
            [t] => Self::volume(Volume {
                backend: m.backend,
                crypt: t.crypt.clone(),
                data_offset: t.offset,
                size: t.len,
                sector_size: t.crypt.as_ref().map_or(512, |c| c.sector_size() as u32),
            }),
            targets => {
                let (segs, size) = Segs::build(targets, m.backend.size())?;
                let sector_size = segs_sector_size(targets);
                let segs = Arc::new(segs);
                Ok(Layout {
                    data_offset: targets[0].offset,
                    crypt: (!segs.is_plain()).then(|| Cipher::Many(segs.clone())),
                    segs: Some(segs),
                    backend: m.backend,
                    size,
                    sector_size,
                })
            }
        }
    }
}

fn segs_sector_size(targets: &[crate::Target]) -> u32 {
    targets
        .iter()
        .map(|t| t.crypt.as_ref().map_or(512, |c| c.sector_size() as u32))
        .max()
        .unwrap_or(512)
}

fn check_volume(vol: &Volume) -> Result<(), Error> {
    let ss = vol.sector_size;
    if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
        return Err(Error::Invalid(format!(
            "Sector size {ss} is not a power of two in 512..=4096"
        )));
    }
    if let Some(c) = &vol.crypt {
        if c.sector_size() != ss as usize {
            return Err(Error::Invalid(format!(
                "Cipher sector size {} differs from the volume sector size {ss}",
                c.sector_size()
            )));
        }
    }
    if vol.size % ss as u64 != 0 {
        return Err(Error::Invalid(format!(
            "Volume size {} is not a multiple of the sector size {ss}",
            vol.size
        )));
    }
    if vol.data_offset % 512 != 0 {
        return Err(Error::Invalid(format!(
            "Data offset {} is not a multiple of 512",
            vol.data_offset
        )));
    }
    let end = vol.data_offset.checked_add(vol.size);
    if end.is_none_or(|e| e > vol.backend.size()) {
        return Err(Error::Invalid(format!(
            "Volume ({} bytes at offset {}) does not fit the {}-byte backend",
            vol.size,
            vol.data_offset,
            vol.backend.size()
        )));
    }
    Ok(())
}
