//! `ucrypt dump --json`: the header as a stable serde document for
//! scripts (schema in docs/JSON.md). Unlike `--dump-json-metadata` (the
//! raw LUKS2 JSON area), it has one shape for LUKS1 and LUKS2, numbers as
//! numbers, and no salts or digests.

use serde::Serialize;

use crate::Header;

/// Schema version of [`Summary`]; bumped on any incompatible change.
pub const SCHEMA: u32 = 1;

/// The header, as `dump --json` prints it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// [`SCHEMA`].
    pub schema: u32,
    /// LUKS version (1 or 2).
    pub version: u32,
    /// Volume UUID.
    pub uuid: String,
    /// LUKS2 label (null for LUKS1 or none).
    pub label: Option<String>,
    /// LUKS2 subsystem (null for LUKS1 or none).
    pub subsystem: Option<String>,
    /// Data cipher, dm-crypt form.
    pub cipher: String,
    /// Volume key size in bits.
    pub key_bits: usize,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Data start in bytes.
    pub data_offset: u64,
    /// Bytes of metadata (header copies and keyslot areas).
    pub metadata_end: u64,
    /// Active keyslots, by id.
    pub keyslots: Vec<KeyslotSummary>,
    /// LUKS2 tokens, by id (empty for LUKS1).
    pub tokens: Vec<TokenSummary>,
    /// Findings while loading (a damaged or older copy).
    pub warnings: Vec<String>,
}

/// One active keyslot.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KeyslotSummary {
    /// Keyslot id.
    pub id: u32,
    /// `normal`, `preferred` or `ignored` (always `normal` for LUKS1).
    pub priority: &'static str,
    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub pbkdf: String,
    /// PBKDF2 hash (null for Argon2).
    pub hash: Option<String>,
    /// PBKDF2 iterations (null for Argon2).
    pub iterations: Option<u32>,
    /// Argon2 time cost (null for PBKDF2).
    pub time: Option<u32>,
    /// Argon2 memory in KiB (null for PBKDF2).
    pub memory_kib: Option<u32>,
    /// Argon2 threads (null for PBKDF2).
    pub threads: Option<u32>,
    /// Keyslot area cipher.
    pub area_cipher: String,
    /// Keyslot area start in bytes.
    pub area_offset: u64,
}

/// One LUKS2 token.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenSummary {
    /// Token id.
    pub id: u32,
    /// Token type, e.g. `luks2-keyring`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Keyslots it opens.
    pub keyslots: Vec<u32>,
}

impl Summary {
    /// The summary of `h`.
    pub fn of(h: &Header) -> Self {
        let mut keyslots = Vec::new();
        let mut tokens = Vec::new();
        let (label, subsystem) = match h {
            Header::V1(v1) => {
                for (i, s) in v1.slots.iter().enumerate().filter(|(_, s)| s.active) {
                    keyslots.push(KeyslotSummary {
                        id: i as u32,
                        priority: "normal",
                        pbkdf: "pbkdf2".into(),
                        hash: Some(v1.hash.name().into()),
                        iterations: Some(s.iterations),
                        time: None,
                        memory_kib: None,
                        threads: None,
                        area_cipher: v1.cipher(),
                        area_offset: u64::from(s.key_material_offset) * 512,
                    });
                }
                (None, None)
            }
            Header::V2(v2) => {
                for id in h.active_slots() {
                    let Some(k) = v2.meta.keyslots.get(&id.to_string()) else {
                        continue;
                    };
                    keyslots.push(KeyslotSummary {
                        id,
                        priority: match k.extra.get("priority").and_then(|p| p.as_i64()) {
                            Some(0) => "ignored",
                            Some(2) => "preferred",
                            _ => "normal",
                        },
                        pbkdf: k.kdf.kind.clone(),
                        hash: k.kdf.hash.clone(),
                        iterations: k.kdf.iterations,
                        time: k.kdf.time,
                        memory_kib: k.kdf.memory,
                        threads: k.kdf.cpus,
                        area_cipher: k.area.encryption.clone(),
                        area_offset: k.area.offset,
                    });
                }
                let mut ids: Vec<(u32, &serde_json::Value)> = v2
                    .meta
                    .tokens
                    .iter()
                    .filter_map(|(k, v)| k.parse().ok().map(|n| (n, v)))
                    .collect();
                ids.sort_by_key(|(n, _)| *n);
                for (id, t) in ids {
                    tokens.push(TokenSummary {
                        id,
                        kind: t["type"].as_str().unwrap_or_default().to_string(),
                        keyslots: t["keyslots"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|k| k.as_str().and_then(|k| k.parse().ok()))
                            .collect(),
                    });
                }
                let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
                (nonempty(&v2.bin.label), nonempty(&v2.bin.subsystem))
            }
        };
        Summary {
            schema: SCHEMA,
            version: h.version(),
            uuid: h.uuid().to_string(),
            label,
            subsystem,
            cipher: h.cipher(),
            key_bits: h.key_size() * 8,
            sector_size: h.sector_size(),
            data_offset: h.payload_offset(),
            metadata_end: h.metadata_end(),
            keyslots,
            tokens,
            warnings: h.warnings().to_vec(),
        }
    }

    /// Pretty JSON text with a trailing newline.
    pub fn to_json(&self) -> String {
        // Invariant: plain strings, numbers and lists always serialize.
        let s = serde_json::to_string_pretty(self).unwrap_or_default();
        // serde_json escapes C0 controls; DEL and C1 (which only strings
        // can hold) are escaped here, so no header string reaches a
        // terminal raw.
        let mut out = String::with_capacity(s.len() + 1);
        for c in s.chars() {
            if c.is_control() && !c.is_ascii_whitespace() {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            } else {
                out.push(c);
            }
        }
        out.push('\n');
        out
    }
}
