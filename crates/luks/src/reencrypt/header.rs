//! The LUKS2 header of a volume in reencryption, kept as its JSON value
//! (the reencrypt keyslot, flagged segments and the verification digest
//! are fields the typed [`Metadata`] of the ordinary verbs refuses), and
//! written back as both copies with seqid + 1, secondary first.
//!
//! Everything but the reencryption parts is validated by the ordinary
//! loader: the value without the reencrypt keyslot, its digest and the
//! `online-reencrypt-*` requirement goes through [`Metadata::parse`].

use serde_json::{Map, Value};

use crate::error::{corrupt, json_error, random_error, Error, ErrorKind, Result};
use crate::luks2::binary::{self, BinHeader, BIN_LEN, HDR_SIZES};
use crate::luks2::Metadata;
use crate::volume::io::{read_exact_at, sync, write_at, Device};

/// One header (the newer valid copy) as raw JSON.
#[derive(Debug, Clone)]
pub(crate) struct RawHeader {
    pub(crate) bin: BinHeader,
    pub(crate) json: Value,
    /// The ordinary view of the same header (reencryption parts removed).
    pub(crate) meta: Metadata,
}

impl RawHeader {
    /// Reads both copies from `f` (`size` bytes) and keeps the valid one
    /// with the higher seqid.
    pub(crate) fn read(f: &mut dyn Device, size: u64) -> Result<Self> {
        let primary = read_copy(f, size, 0, true);
        let mut offsets = Vec::new();
        if let Ok(p) = &primary {
            offsets.push(p.bin.hdr_size);
        }
        for o in HDR_SIZES {
            if !offsets.contains(&o) {
                offsets.push(o);
            }
        }
        let mut secondary = Err(Error::new(ErrorKind::NotLuks, "No secondary header"));
        for off in offsets {
            secondary = read_copy(f, size, off, false);
            if !matches!(&secondary, Err(e) if e.kind() == ErrorKind::NotLuks) {
                break;
            }
        }
        match (primary, secondary) {
            (Ok(p), Ok(s)) => Ok(if s.bin.seqid > p.bin.seqid { s } else { p }),
            (Ok(h), Err(_)) | (Err(_), Ok(h)) => Ok(h),
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Writes both copies with seqid + 1: secondary, sync, primary, sync.
    /// The JSON is validated again first (nothing invalid is written).
    pub(crate) fn write(&mut self, f: &mut dyn Device) -> Result<()> {
        self.meta = ordinary_view(&self.json, self.bin.hdr_size)?;
        let json = serde_json::to_vec(&self.json)
            .map_err(|e| json_error(ErrorKind::Corrupt, "Cannot serialize LUKS2 metadata", e))?;
        let hdr_size = self.bin.hdr_size as usize;
        if json.len() >= hdr_size - BIN_LEN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "LUKS2 JSON metadata does not fit its area",
            ));
        }
        self.bin.seqid += 1;
        for primary in [false, true] {
            let mut bin = self.bin.clone();
            bin.primary = primary;
            bin.hdr_offset = if primary { 0 } else { self.bin.hdr_size };
            getrandom::fill(&mut bin.salt)
                .map_err(|e| random_error(ErrorKind::Corrupt, "No randomness", e))?;
            let mut area = bin.to_bytes();
            area.extend_from_slice(&json);
            area.resize(hdr_size, 0);
            binary::seal(&mut area);
            write_at(f, bin.hdr_offset, &area)?;
            sync(f)?;
            super::crash::point();
        }
        Ok(())
    }

    /// Keyslots area: `[start, end)` in bytes.
    pub(crate) fn keyslots_area(&self) -> (u64, u64) {
        let lo = 2 * self.bin.hdr_size;
        (lo, lo + self.meta.config.keyslots_size)
    }

    /// A top-level object (`keyslots`, `segments`, `digests`, `config`).
    pub(crate) fn obj(&self, name: &str) -> &Map<String, Value> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        self.json
            .get(name)
            .and_then(Value::as_object)
            .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
    }

    /// A top-level object to change (created when missing).
    pub(crate) fn obj_mut(&mut self, name: &str) -> &mut Map<String, Value> {
        if !self.json.is_object() {
            self.json = Value::Object(Map::new());
        }
        let Value::Object(top) = &mut self.json else {
            unreachable!("made an object above")
        };
        let v = top
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !v.is_object() {
            *v = Value::Object(Map::new());
        }
        match v {
            Value::Object(m) => m,
            _ => unreachable!("made an object above"),
        }
    }
}

/// The header without its reencryption parts, loaded as the ordinary
/// verbs load a header (every check of `luks2/json/check.rs`).
pub(crate) fn ordinary_view(json: &Value, hdr_size: u64) -> Result<Metadata> {
    crate::luks2::json::check_reencrypt_requirement(json)?;
    let mut v = json.clone();
    let reenc: Vec<String> = v
        .get("keyslots")
        .and_then(Value::as_object)
        .map(|ks| {
            ks.iter()
                .filter(|(_, k)| k.get("type").and_then(Value::as_str) == Some("reencrypt"))
                .map(|(id, _)| id.clone())
                .collect()
        })
        .unwrap_or_default();
    if let Some(ks) = v.get_mut("keyslots").and_then(Value::as_object_mut) {
        for id in &reenc {
            ks.remove(id);
        }
    }
    if let Some(ds) = v.get_mut("digests").and_then(Value::as_object_mut) {
        ds.retain(|_, d| {
            !d.get("keyslots")
                .and_then(Value::as_array)
                .is_some_and(|k| k.iter().any(|k| reenc.iter().any(|r| k == r.as_str())))
        });
    }
    if let Some(cfg) = v.get_mut("config").and_then(Value::as_object_mut) {
        let mut empty = false;
        if let Some(m) = cfg
            .get_mut("requirements")
            .and_then(|r| r.get_mut("mandatory"))
            .and_then(Value::as_array_mut)
        {
            m.retain(|r| {
                !matches!(
                    r.as_str(),
                    Some("online-reencrypt" | "online-reencrypt-v2" | "online-reencrypt-v3")
                )
            });
            empty = m.is_empty();
        }
        if empty {
            cfg.remove("requirements");
        }
    }
    let mut bytes = serde_json::to_vec(&v)
        .map_err(|e| json_error(ErrorKind::Corrupt, "Cannot serialize LUKS2 metadata", e))?;
    bytes.push(0);
    Metadata::parse(&bytes, hdr_size)
}

fn read_copy(f: &mut dyn Device, size: u64, offset: u64, primary: bool) -> Result<RawHeader> {
    if offset + BIN_LEN as u64 > size {
        return Err(Error::new(
            ErrorKind::NotLuks,
            "Device too small for a LUKS2 header",
        ));
    }
    let mut bin = vec![0u8; BIN_LEN];
    read_exact_at(f, offset, &mut bin)?;
    let parsed = BinHeader::parse(&bin)?;
    if parsed.primary != primary {
        return Err(Error::new(ErrorKind::NotLuks, "No LUKS2 header copy here"));
    }
    if parsed.hdr_offset != offset {
        return Err(corrupt(format!(
            "LUKS2 header at {offset} claims offset {}",
            parsed.hdr_offset
        )));
    }
    if offset + parsed.hdr_size > size {
        return Err(corrupt("LUKS2 header is truncated"));
    }
    // hdr_size is one of HDR_SIZES (<= 4 MiB): a bounded allocation.
    let mut area = vec![0u8; parsed.hdr_size as usize];
    read_exact_at(f, offset, &mut area)?;
    binary::verify_checksum(&area)?;
    let text = &area[BIN_LEN..];
    let end = text
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| corrupt("LUKS2 JSON area is not NUL-terminated"))?;
    let json: Value = serde_json::from_slice(&text[..end])
        .map_err(|e| json_error(ErrorKind::Corrupt, "LUKS2 JSON metadata is invalid", e))?;
    let meta = ordinary_view(&json, parsed.hdr_size)?;
    Ok(RawHeader {
        bin: parsed,
        json,
        meta,
    })
}
