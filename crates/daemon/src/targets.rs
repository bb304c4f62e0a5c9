//! A table's targets as the engine serves them: one crypt line is the
//! [`datapath::Volume`] it always was; several lines (or a linear one)
//! become a [`datapath::Mapping`], one cipher per crypt target (a zero
//! target reads zeros and drops writes).

use std::sync::Arc;

use crypto::table::{Target, Targets};
use crypto::SectorCrypt;
use datapath::{Engine, EngineConfig, Mapping, Volume};

use crate::error::{Error, ErrorKind, Result};

/// The engine's mapping of `table` over `backend` (every cipher built).
pub(crate) fn mapping(table: &Targets, backend: Arc<dyn backend::Backend>) -> Result<Mapping> {
    let mut targets = Vec::with_capacity(table.count());
    for t in table.targets() {
        let crypt = match t {
            Target::Crypt(c) => Some(Arc::new(cipher(c)?)),
            Target::Linear(_) | Target::Zero(_) => None,
        };
        targets.push(datapath::Target {
            len: t.len().saturating_mul(512),
            offset: t.offset().saturating_mul(512),
            crypt,
            zero: matches!(t, Target::Zero(_)),
        });
    }
    Ok(Mapping { backend, targets })
}

/// An engine serving `table` over `backend`.
pub fn engine(
    table: &Targets,
    backend: Arc<dyn backend::Backend>,
    cfg: EngineConfig,
) -> std::result::Result<Engine, EngineError> {
    if let Some(t) = table.as_single() {
        let vol = Volume {
            backend,
            crypt: Some(Arc::new(cipher(t).map_err(EngineError::Table)?)),
            data_offset: t.offset_bytes(),
            size: t.len_bytes(),
            sector_size: t.options.sector_size,
        };
        return Engine::new(vol, cfg).map_err(EngineError::Engine);
    }
    let m = mapping(table, backend).map_err(EngineError::Table)?;
    Engine::with_mapping(m, cfg).map_err(EngineError::Engine)
}

/// Why [`engine`] failed: the table (a cipher that does not build) or the
/// engine (the mapping does not fit the device, …).
pub enum EngineError {
    /// A crypt line whose cipher does not build.
    Table(Error),
    /// The engine refused the mapping.
    Engine(datapath::Error),
}

pub(crate) fn cipher(t: &crypto::table::Table) -> Result<SectorCrypt> {
    t.sector_crypt()
        .map_err(|e| Error::transparent(ErrorKind::InvalidInput, e))
}
