//! The shape checks cryptsetup's `LUKS2_hdr_validate` makes on the untyped
//! JSON before anything reads it: which objects and fields must exist with
//! which JSON types (non-empty strings, integers, arrays of strings),
//! numbers-in-strings that are decimal, and segment ids without gaps with
//! backup segments last. They decide whether the *header* loads, with the
//! value checks of `json/check.rs` (which lists them all); an unknown KDF
//! kind is left to unlock, which fails only that keyslot.

use serde_json::{Map, Value};

use crate::error::{corrupt, Result};

/// Checks `v` (the whole JSON object) the way cryptsetup 2.6 does.
pub(super) fn check(v: &Value) -> Result<()> {
    let top = v
        .as_object()
        .ok_or_else(|| corrupt("LUKS2 JSON metadata is not an object"))?;
    for section in ["keyslots", "tokens", "segments", "digests", "config"] {
        object(top, section, "JSON area")?;
    }
    let keyslots = object(top, "keyslots", "JSON area")?;
    let segments = object(top, "segments", "JSON area")?;
    for (id, ks) in keyslots {
        keyslot(id, as_object(ks, "keyslot", id)?)?;
    }
    for (id, t) in object(top, "tokens", "JSON area")? {
        let t = as_object(t, "token", id)?;
        string(t, "type", "token")?;
        string_array(t, "keyslots", "token")?;
    }
    for (id, d) in object(top, "digests", "JSON area")? {
        let d = as_object(d, "digest", id)?;
        string(d, "type", "digest")?;
        for k in string_array(d, "keyslots", "digest")? {
            if !keyslots.contains_key(k) {
                return Err(corrupt(format!(
                    "LUKS2 digest {id} names missing keyslot {k:?}"
                )));
            }
        }
        for sg in string_array(d, "segments", "digest")? {
            if !segments.contains_key(sg) {
                return Err(corrupt(format!(
                    "LUKS2 digest {id} names missing segment {sg:?}"
                )));
            }
        }
    }
    segments_shape(segments)?;
    let config = object(top, "config", "JSON area")?;
    number(string(config, "json_size", "config")?, "config json_size")?;
    number(
        string(config, "keyslots_size", "config")?,
        "config keyslots_size",
    )?;
    if config.contains_key("flags") {
        string_array(config, "flags", "config")?;
    }
    Ok(())
}

/// One keyslot: `type` and `key_size` always; for `luks2` the kdf, af and
/// area objects with their fields.
fn keyslot(id: &str, ks: &Map<String, Value>) -> Result<()> {
    let what = "keyslot";
    let kind = string(ks, "type", what)?;
    uint32(ks, "key_size", what)?;
    if kind != "luks2" {
        return Ok(());
    }
    let kdf = object(ks, "kdf", what)?;
    match string(kdf, "type", "keyslot kdf")? {
        "pbkdf2" => {
            string(kdf, "hash", "pbkdf2 kdf")?;
            integer(kdf, "iterations", "pbkdf2 kdf")?;
            string(kdf, "salt", "pbkdf2 kdf")?;
        }
        "argon2i" | "argon2id" => {
            for f in ["time", "memory", "cpus"] {
                integer(kdf, f, "argon2 kdf")?;
            }
            string(kdf, "salt", "argon2 kdf")?;
        }
        // Another KDF (e.g. the legacy "argon2"): unlock decides.
        _ => {}
    }
    let af = object(ks, "af", what)?;
    if string(af, "type", "keyslot af")? != "luks1" {
        return Err(corrupt(format!("LUKS2 keyslot {id} AF type is not luks1")));
    }
    string(af, "hash", "keyslot af")?;
    integer(af, "stripes", "keyslot af")?;
    let area = object(ks, "area", what)?;
    if string(area, "type", "keyslot area")? != "raw" {
        return Err(corrupt(format!("LUKS2 keyslot {id} area type is not raw")));
    }
    string(area, "encryption", "keyslot area")?;
    uint32(area, "key_size", "keyslot area")?;
    number(
        string(area, "offset", "keyslot area")?,
        "keyslot area offset",
    )?;
    number(string(area, "size", "keyslot area")?, "keyslot area size")?;
    Ok(())
}

/// Segments: mandatory fields, `crypt` fields, flags, and ids 0..n with
/// the backup segments (a `backup-*` flag) after all regular ones.
fn segments_shape(segments: &Map<String, Value>) -> Result<()> {
    let mut first_backup: Option<u64> = None;
    let mut last_regular: Option<u64> = None;
    for (id, sg) in segments {
        let n = number(id, "segment id")?;
        let sg = as_object(sg, "segment", id)?;
        let what = "segment";
        let kind = string(sg, "type", what)?;
        number(string(sg, "offset", what)?, "segment offset")?;
        let size = string(sg, "size", what)?;
        if size != "dynamic" {
            number(size, "segment size")?;
        }
        let mut backup = false;
        if sg.contains_key("flags") {
            backup = string_array(sg, "flags", what)?
                .iter()
                .any(|f| f.starts_with("backup-"));
        }
        if backup {
            first_backup = Some(first_backup.map_or(n, |b| b.min(n)));
        } else {
            last_regular = Some(last_regular.map_or(n, |r| r.max(n)));
        }
        if kind == "crypt" {
            number(string(sg, "iv_tweak", what)?, "segment iv_tweak")?;
            string(sg, "encryption", what)?;
            let ss = uint32(sg, "sector_size", what)?;
            if ss == 0 || ss % 512 != 0 {
                return Err(corrupt(format!(
                    "LUKS2 segment sector size {ss} is invalid"
                )));
            }
        }
    }
    if first_backup == Some(0) {
        return Err(corrupt("LUKS2 metadata has no regular segment"));
    }
    if let (Some(b), Some(r)) = (first_backup, last_regular) {
        if r > b {
            return Err(corrupt("LUKS2 regular segment follows a backup segment"));
        }
    }
    for i in 0..segments.len() {
        if !segments.contains_key(&i.to_string()) {
            return Err(corrupt(format!("LUKS2 segments have a gap at {i}")));
        }
    }
    Ok(())
}

fn as_object<'a>(v: &'a Value, what: &str, id: &str) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| corrupt(format!("LUKS2 {what} {id} is not an object")))
}

fn object<'a>(m: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a Map<String, Value>> {
    m.get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| corrupt(format!("LUKS2 {what} has no {key:?} object")))
}

/// A non-empty string field (cryptsetup's `json_contains_string`).
fn string<'a>(m: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a str> {
    m.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| corrupt(format!("LUKS2 {what} has no {key:?} string")))
}

fn integer(m: &Map<String, Value>, key: &str, what: &str) -> Result<i64> {
    m.get(key)
        .and_then(Value::as_i64)
        .ok_or_else(|| corrupt(format!("LUKS2 {what} has no {key:?} integer")))
}

fn uint32(m: &Map<String, Value>, key: &str, what: &str) -> Result<u32> {
    u32::try_from(integer(m, key, what)?)
        .map_err(|_| corrupt(format!("LUKS2 {what} {key:?} is out of range")))
}

/// An array whose members are all strings.
fn string_array<'a>(m: &'a Map<String, Value>, key: &str, what: &str) -> Result<Vec<&'a str>> {
    let a = m
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt(format!("LUKS2 {what} has no {key:?} array")))?;
    a.iter()
        .map(|x| {
            x.as_str()
                .ok_or_else(|| corrupt(format!("LUKS2 {what} {key:?} holds a non-string")))
        })
        .collect()
}

/// A decimal `u64` in a string (cryptsetup's `numbered` plus
/// `json_str_to_uint64`).
fn number(s: &str, what: &str) -> Result<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(corrupt(format!(
            "LUKS2 {what} {s:?} is not a decimal number"
        )));
    }
    s.parse()
        .map_err(|_| corrupt(format!("LUKS2 {what} {s:?} is out of range")))
}
