//! The reencryption state as cryptsetup stores it in a LUKS2 header,
//! loaded strictly, and its verification digest.
//!
//! ```text
//! keyslots: {.., "N": {type: reencrypt, key_size: 1, mode, direction,
//!                      area: {type: checksum|journal|none|datashift|
//!                             datashift-checksum|datashift-journal, offset, size,
//!                             [hash, sector_size], [shift_size]}}}
//! segments: data segments (new | [in-reencryption] | old), then
//!           backup-previous (old layout) and backup-final (new layout);
//!           an encryption with a data shift: moved | plaintext |
//!           [in-reencryption] | new, and a backup-moved-segment; a
//!           decryption with a data shift: moved (crypt, at 0) | plaintext
//!           | [in-reencryption] | old, and a backup-moved-segment
//!           (`decrypt_shift.rs`)
//! digests:  old key → old segments + backup-previous; new key → new
//!           segments + backup-final; a hotzone segment → both;
//!           verification digest → the reencrypt keyslot only
//! config.requirements.mandatory: ["online-reencrypt-v2"] (v3: a
//!           decryption with a data shift)
//! ```
//!
//! The verification digest is a PBKDF2 digest (as of a volume key) over
//! `0x76, 0x30 + version, old key, new key, mode, direction, area type,
//! area offset and size (big-endian u64), [hash, sector_size (u32)] or
//! [shift_size (u64)]`, then the backup-previous, backup-final and (if
//! any) backup-moved-segment segments (type, offset, size or `dynamic`,
//! iv_tweak, encryption, sector_size) — the layout of
//! cryptsetup's `luks2_reencrypt_digest.c`, written here from that
//! description. A header whose digest does not match the unlocked keys
//! was changed by someone without them and is refused.

use serde_json::Value;

use crate::error::{corrupt, unsupported, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::keyslot;
use crate::luks2::json::{self, Segment};

use super::header::RawHeader;

/// How a hotzone is protected against a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resilience {
    /// Per-block hashes of the hotzone's old ciphertext in the area.
    Checksum {
        /// Hash of each block.
        hash: Hash,
        /// Block size in bytes.
        block: u32,
    },
    /// The hotzone's old ciphertext copied to the area.
    Journal,
    /// Nothing: a crash mid-hotzone loses that hotzone's data.
    None,
    /// The data moves by `shift` bytes toward the end of the device while
    /// it is encrypted (`--reduce-device-size`), or toward its start while
    /// it is decrypted (`datashift-checksum`, `datashift-journal`: see
    /// [`State::moved_resilience`]): a hotzone's source is never its
    /// target, so a torn hotzone is simply done again.
    Datashift {
        /// `shift_size`: the distance in bytes (the new data offset).
        shift: u64,
    },
}

impl Resilience {
    /// cryptsetup's name (`--resilience`).
    pub fn name(&self) -> &'static str {
        match self {
            Resilience::Checksum { .. } => "checksum",
            Resilience::Journal => "journal",
            Resilience::None => "none",
            Resilience::Datashift { .. } => "datashift",
        }
    }
}

/// What a reencryption does (the reencrypt keyslot's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Old key to new key (direction forward).
    Reencrypt,
    /// Plaintext (a `linear` segment) to a new key: with a detached
    /// header (direction forward, no data shift), or with the header
    /// inside the device (direction backward, resilience `datashift`, the
    /// first `shift` bytes moved to the end of the device first).
    Encrypt,
    /// Old key to plaintext (a `linear` segment): with a detached header
    /// (direction backward, no data shift), or with the header exported
    /// from the device (direction forward, resilience
    /// `datashift-checksum` or `datashift-journal`, the data moved down
    /// by its offset).
    Decrypt,
}

impl Mode {
    /// cryptsetup's name (the keyslot's `mode`).
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Reencrypt => "reencrypt",
            Mode::Encrypt => "encrypt",
            Mode::Decrypt => "decrypt",
        }
    }
}

/// The loaded reencryption state.
#[derive(Debug, Clone)]
pub struct State {
    /// Requirement version (2 for `online-reencrypt-v2`; 1 for the old
    /// `online-reencrypt`, which needs [`State::needs_repair`]).
    pub version: u8,
    /// What the reencryption does.
    pub mode: Mode,
    /// Hotzones go from the end of the data toward its start (`decrypt`).
    pub backward: bool,
    /// Id of the reencrypt keyslot.
    pub keyslot: String,
    /// Hotzone protection.
    pub resilience: Resilience,
    /// Reencrypt keyslot area: offset and size in bytes.
    pub area: (u64, u64),
    /// The layout before (backup-previous segment).
    pub old: Segment,
    /// The layout after (backup-final segment).
    pub new: Segment,
    /// Digest ids of the old and the new volume key; empty for the
    /// plaintext side (`linear`) of an encryption or decryption.
    pub old_digest: String,
    /// See `old_digest`.
    pub new_digest: String,
    /// The verification digest's id; empty when the header has none
    /// (metadata of cryptsetup before 2.4, [`State::needs_repair`]).
    pub verify_digest: String,
    /// Data segments in id order (no backups).
    pub data: Vec<(String, Segment)>,
    /// The `backup-moved-segment` (a data shift only): where the data's
    /// first `shift` bytes wait, plaintext, until the last hotzone.
    pub moved: Option<Segment>,
    /// Every byte is under the new key (the run stopped before its
    /// final header write).
    pub all_new: bool,
    /// A decryption with a data shift (`datashift-checksum` or
    /// `datashift-journal`): the protection of its last hotzone, the
    /// moved segment decrypted in place (`Checksum` or `Journal`);
    /// `None` otherwise.
    pub moved_resilience: Option<Resilience>,
    /// The bytes a reencryption in cryptsetup's fixed-length mode covers
    /// (`--device-size`; recorded mid-way as data segments of fixed
    /// sizes only, which this is the sum of on load, what the mapping
    /// of such a volume covers; a run without `--device-size` resets it
    /// and goes to the device's end, as cryptsetup's resume does);
    /// `None`: up to the device's end.
    pub fixed_size: Option<u64>,
}

/// Which segment a flag marks.
fn flagged<'a>(segs: &'a [(String, Segment)], flag: &str) -> Vec<&'a (String, Segment)> {
    segs.iter()
        .filter(|(_, s)| {
            s.extra
                .get("flags")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(flag)))
        })
        .collect()
}

/// The id of the `backup-moved-segment` (empty when there is none).
fn moved_id(segs: &[(String, Segment)]) -> String {
    flagged(segs, "backup-moved-segment")
        .first()
        .map(|x| x.0.clone())
        .unwrap_or_default()
}

pub(crate) fn is_backup(s: &Segment) -> bool {
    s.extra
        .get("flags")
        .and_then(Value::as_array)
        .is_some_and(|f| {
            f.iter()
                .any(|x| x.as_str().is_some_and(|x| x.starts_with("backup-")))
        })
}

/// Whether the segment is the hotzone of a step a crash interrupted.
pub fn in_reencryption(s: &Segment) -> bool {
    s.extra
        .get("flags")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("in-reencryption")))
}

/// The requirement version the header carries, `None` when it is not in
/// reencryption.
pub(crate) fn requirement(h: &RawHeader) -> Result<Option<u8>> {
    let Some(m) = h
        .obj("config")
        .get("requirements")
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
    else {
        return Ok(None);
    };
    for r in m.iter().filter_map(Value::as_str) {
        match r {
            "online-reencrypt-v2" => return Ok(Some(2)),
            "online-reencrypt-v3" => return Ok(Some(3)),
            // cryptsetup 2.2's metadata: no verification digest yet;
            // `repair` with the passphrase upgrades it (`upgrade.rs`).
            "online-reencrypt" => return Ok(Some(1)),
            _ => {}
        }
    }
    Ok(None)
}

/// The digests bound to segment `id`.
fn digests_of<'a>(h: &'a RawHeader, id: &str) -> Vec<&'a String> {
    h.meta
        .digests
        .iter()
        .filter(|(_, d)| d.segments.iter().any(|x| x == id))
        .map(|(k, _)| k)
        .collect()
}

/// A segment that breaks a data shift's layout.
fn not_continued(id: &str) -> Error {
    corrupt(format!(
        "LUKS2 segment {id} does not continue the reencryption layout"
    ))
}

impl State {
    /// Loads the state from a header in reencryption; `Ok(None)` when it
    /// is not. Metadata ucrypt cannot act on is refused with the reason.
    pub(crate) fn load(h: &RawHeader) -> Result<Option<State>> {
        let Some(version) = requirement(h)? else {
            if h.obj("keyslots")
                .values()
                .any(|k| k.get("type").and_then(Value::as_str) == Some("reencrypt"))
            {
                return Err(corrupt(
                    "LUKS2 reencrypt keyslot without the reencryption requirement",
                ));
            }
            return Ok(None);
        };
        let reenc: Vec<(&String, &Value)> = h
            .obj("keyslots")
            .iter()
            .filter(|(_, k)| k.get("type").and_then(Value::as_str) == Some("reencrypt"))
            .collect();
        let [(kid, ks)] = reenc[..] else {
            return Err(corrupt(format!(
                "LUKS2 reencryption needs exactly one reencrypt keyslot ({} found)",
                reenc.len()
            )));
        };
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        if ks.get("key_size").and_then(Value::as_u64) != Some(1) {
            return Err(corrupt("LUKS2 reencrypt keyslot key_size must be 1"));
        }
        let mode = s(ks, "mode").ok_or_else(|| corrupt("LUKS2 reencrypt keyslot has no mode"))?;
        let direction = s(ks, "direction")
            .ok_or_else(|| corrupt("LUKS2 reencrypt keyslot has no direction"))?;
        let mode = match mode.as_str() {
            "reencrypt" => Mode::Reencrypt,
            "encrypt" => Mode::Encrypt,
            "decrypt" => Mode::Decrypt,
            _ => return Err(corrupt(format!("Illegal reencrypt mode {mode}"))),
        };
        let backward = match direction.as_str() {
            "forward" => false,
            "backward" => true,
            _ => return Err(corrupt(format!("Illegal reencrypt direction {direction}"))),
        };
        let area_type = ks
            .get("area")
            .and_then(|a| a.get("type"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let datashift = area_type == "datashift";
        let shift_decrypt = matches!(area_type, "datashift-checksum" | "datashift-journal");
        // The combinations ucrypt runs: reencrypt and encrypt forward,
        // decrypt either way (cryptsetup's own starts go backward; a
        // forward one is metadata of cryptsetup 2.2), encrypt backward
        // with a data shift, and decrypt forward with a data shift (the
        // header exported).
        let ok = if shift_decrypt {
            mode == Mode::Decrypt && !backward
        } else if mode == Mode::Decrypt {
            !datashift
        } else {
            backward == (mode == Mode::Encrypt && datashift)
                && (!datashift || mode == Mode::Encrypt)
        };
        if !ok {
            return Err(unsupported(format!(
                "LUKS2 reencryption mode {} with direction {direction} is not supported by ucrypt",
                mode.name()
            )));
        }
        let area = ks
            .get("area")
            .filter(|a| a.is_object())
            .ok_or_else(|| corrupt("LUKS2 reencrypt keyslot has no area"))?;
        let num = |k: &str| -> Result<u64> {
            s(area, k)
                .filter(|x| !x.is_empty() && x.len() <= 20 && x.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|x| x.parse().ok())
                .ok_or_else(|| corrupt(format!("LUKS2 reencrypt keyslot area {k} is invalid")))
        };
        let (offset, size) = (num("offset")?, num("size")?);
        let kind = s(area, "type").unwrap_or_default();
        let checksum = || -> Result<Resilience> {
            let hash = Hash::parse(&s(area, "hash").unwrap_or_default())?;
            let block = area
                .get("sector_size")
                .and_then(Value::as_u64)
                .filter(|b| *b >= 512 && b.is_power_of_two() && *b <= 1 << 20)
                .ok_or_else(|| corrupt("Invalid sector_size for checksum resilience mode"))?
                as u32;
            Ok(Resilience::Checksum { hash, block })
        };
        let moved_resilience = match kind.as_str() {
            "datashift-checksum" => Some(checksum()?),
            "datashift-journal" => Some(Resilience::Journal),
            _ => None,
        };
        let resilience = match kind.as_str() {
            "checksum" => checksum()?,
            "journal" => Resilience::Journal,
            "none" => Resilience::None,
            "datashift" | "datashift-checksum" | "datashift-journal" => {
                let shift = num("shift_size")?;
                if shift == 0 || shift % 4096 != 0 {
                    return Err(corrupt("LUKS2 reencrypt keyslot shift_size is invalid"));
                }
                Resilience::Datashift { shift }
            }
            t if t.starts_with("datashift") => {
                return Err(unsupported(format!(
                    "LUKS2 reencryption resilience {t} is not supported by ucrypt"
                )))
            }
            t => return Err(corrupt(format!("Unsupported resilience mode {t}"))),
        };
        let (lo, hi) = h.keyslots_area();
        if resilience != Resilience::None || size != 0 {
            let end = offset.saturating_add(size);
            if offset % 512 != 0 || offset < lo || end > hi || size == 0 {
                return Err(corrupt(format!(
                    "LUKS2 reencrypt keyslot area {offset}+{size} lies outside the keyslots area"
                )));
            }
            for (id, k) in &h.meta.keyslots {
                let (o, l) = (k.area.offset, k.area.size);
                if o < end && offset < o + l {
                    return Err(corrupt(format!(
                        "LUKS2 reencrypt keyslot area overlaps keyslot {id}"
                    )));
                }
            }
        }
        let mut segs: Vec<(String, Segment)> = h
            .meta
            .segments
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        segs.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(u32::MAX));
        let one = |flag: &str, kind: &str| -> Result<(String, Segment)> {
            match flagged(&segs, flag)[..] {
                [x] if x.1.kind == kind => Ok(x.clone()),
                [x] => Err(unsupported(format!(
                    "LUKS2 reencryption mode {} is not supported by ucrypt with a {} {flag} segment",
                    mode.name(),
                    x.1.kind
                ))),
                _ => Err(corrupt(format!(
                    "LUKS2 reencryption needs one {flag} segment"
                ))),
            }
        };
        let kind = |plain: bool| if plain { "linear" } else { "crypt" };
        let (old_id, old) = one("backup-previous", kind(mode == Mode::Encrypt))?;
        let (new_id, new) = one("backup-final", kind(mode == Mode::Decrypt))?;
        let moved_kind = kind(mode == Mode::Encrypt);
        let moved = match (resilience, &flagged(&segs, "backup-moved-segment")[..]) {
            (Resilience::Datashift { .. }, [x]) if x.1.kind == moved_kind => Some(x.1.clone()),
            (_, []) if !matches!(resilience, Resilience::Datashift { .. }) => None,
            _ => {
                return Err(unsupported(
                    "LUKS2 reencryption with this moved segment is not supported by ucrypt",
                ))
            }
        };
        let digest_of = |sid: &str, linear: bool| -> Result<String> {
            let d: Vec<&String> = h
                .meta
                .digests
                .iter()
                .filter(|(_, d)| d.segments.iter().any(|s| s == sid))
                .map(|(id, _)| id)
                .collect();
            match d[..] {
                [] if linear => Ok(String::new()),
                [x] if !linear => Ok(x.clone()),
                _ if linear => Err(corrupt(format!(
                    "LUKS2 linear segment {sid} is bound to a digest"
                ))),
                _ => Err(corrupt(format!("LUKS2 segment {sid} needs one digest"))),
            }
        };
        let old_digest = digest_of(&old_id, old.kind == "linear")?;
        let new_digest = digest_of(&new_id, new.kind == "linear")?;
        if mode == Mode::Reencrypt && old_digest == new_digest {
            return Err(unsupported(
                "LUKS2 reencryption without a volume key change is not supported by ucrypt",
            ));
        }
        let verify: Vec<(&String, &Value)> = h
            .obj("digests")
            .iter()
            .filter(|(_, d)| {
                d.get("keyslots")
                    .and_then(Value::as_array)
                    .is_some_and(|k| k.iter().any(|k| k.as_str() == Some(kid)))
            })
            .collect();
        let verify_digest = match verify[..] {
            [(id, d)]
                if d.get("segments")
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty)
                    && d.get("type").and_then(Value::as_str) == Some("pbkdf2") =>
            {
                id.clone()
            }
            // No digest: old metadata, upgraded by `repair`.
            [] => String::new(),
            _ => {
                return Err(corrupt(
                    "LUKS2 reencryption metadata has no valid verification digest",
                ))
            }
        };
        let shift = match resilience {
            Resilience::Datashift { shift } => shift,
            _ => 0,
        };
        let shifted = if mode == Mode::Decrypt {
            new.offset + shift == old.offset
        } else {
            old.offset + shift == new.offset
        };
        if !shifted {
            return Err(unsupported(
                "LUKS2 reencryption with this data shift is not supported by ucrypt",
            ));
        }
        if let (Some(m), Mode::Decrypt) = (&moved, mode) {
            // The data's first bytes (at most `shift`), still encrypted,
            // moved to the start of the device; bound to the old key.
            let mid = moved_id(&segs);
            if new.offset != 0
                || m.offset != 0
                || m.fixed_size()?.is_none_or(|s| s == 0 || s > shift)
                || m.encryption != old.encryption
                || m.sector_size != old.sector_size
                || m.iv_tweak != old.iv_tweak
                || digest_of(&mid, false).ok().as_ref() != Some(&old_digest)
            {
                return Err(unsupported(
                    "LUKS2 decryption with this moved segment is not supported by ucrypt",
                ));
            }
        } else if let Some(m) = &moved {
            // The first `shift` bytes wait at the end of the device.
            let size = old.fixed_size()?.unwrap_or(0);
            if old.offset != 0
                || m.fixed_size()? != Some(shift)
                || size < shift
                || m.offset < new.offset + size
                || !digest_of(&moved_id(&segs), true).is_ok_and(|d| d.is_empty())
            {
                return Err(unsupported(
                    "LUKS2 encryption with this moved segment is not supported by ucrypt",
                ));
            }
        }
        let data: Vec<(String, Segment)> =
            segs.into_iter().filter(|(_, s)| !is_backup(s)).collect();
        let all_new = data.len() == 1
            && data[0].1.kind == new.kind
            && !in_reencryption(&data[0].1)
            && (new_digest.is_empty()
                || h.meta
                    .digests
                    .get(&new_digest)
                    .is_some_and(|d| d.segments.contains(&data[0].0)));
        // cryptsetup's `LUKS2_get_data_size`: no dynamic data segment
        // means a fixed-length run stopped mid-way.
        let fixed_size = if moved.is_none() && old.fixed_size()?.is_none() {
            let mut sum = Some(0u64);
            for (_, s) in &data {
                sum = match (sum, s.fixed_size()?) {
                    (Some(a), Some(b)) => Some(a + b),
                    _ => None,
                };
            }
            sum.filter(|&s| s > 0)
        } else {
            None
        };
        let st = State {
            fixed_size,
            all_new,
            version,
            mode,
            backward,
            keyslot: kid.clone(),
            resilience,
            area: (offset, size),
            old,
            new,
            old_digest,
            new_digest,
            verify_digest,
            data,
            moved,
            moved_resilience,
        };
        st.check_layout(h)?;
        Ok(Some(st))
    }

    /// The data segments tile the data area: new ones, at most one
    /// hotzone, then old ones (backward: old, hotzone, new), each with
    /// its layout's type, cipher and IVs and bound to its layout's digest
    /// (a `linear` one to none; a `crypt` hotzone to every key's).
    fn check_layout(&self, h: &RawHeader) -> Result<()> {
        if let (Some(m), Mode::Decrypt) = (&self.moved, self.mode) {
            return self.check_decrypt_shift_layout(h, m);
        }
        if let Some(m) = &self.moved {
            return self.check_shift_layout(h, m);
        }
        let base = self.old.offset;
        let mut at = base;
        // Forward: 0 new, 1 after the hotzone, 2 old. Backward: 0 old,
        // 1 after the hotzone, 2 new.
        let mut phase = 0;
        let n = self.data.len();
        if n == 0 || n > 3 {
            return Err(corrupt(format!(
                "LUKS2 reencryption with {n} data segments"
            )));
        }
        let keys: Vec<&String> = [&self.old_digest, &self.new_digest]
            .into_iter()
            .filter(|d| !d.is_empty())
            .collect();
        fn bound<'a>(like: &Segment, digest: &'a String) -> Vec<&'a String> {
            if like.kind == "linear" {
                Vec::new()
            } else {
                vec![digest]
            }
        }
        for (i, (id, s)) in self.data.iter().enumerate() {
            let hot = in_reencryption(s);
            let mut digests: Vec<&String> = h
                .meta
                .digests
                .iter()
                .filter(|(_, d)| d.segments.iter().any(|x| x == id))
                .map(|(k, _)| k)
                .collect();
            digests.sort();
            let as_new = s.kind == self.new.kind && digests == bound(&self.new, &self.new_digest);
            let as_old = s.kind == self.old.kind && digests == bound(&self.old, &self.old_digest);
            let is_new = if hot {
                if phase != 0 {
                    return Err(corrupt("LUKS2 reencryption has two hotzones"));
                }
                phase = 1;
                let mut want = if self.new.kind == "linear" {
                    Vec::new()
                } else {
                    keys.clone()
                };
                want.sort();
                // cryptsetup 2.2's metadata binds a hotzone to the new
                // key only (the mangle suite's old reencryptions).
                let new_only = bound(&self.new, &self.new_digest);
                if s.kind != self.new.kind || (digests != want && digests != new_only) {
                    return Err(corrupt(format!(
                        "LUKS2 hotzone segment {id} must be bound to both digests"
                    )));
                }
                true
            } else if (n == 1 && as_new) || (!self.backward && as_new && phase == 0 && i + 1 < n) {
                true
            } else if !self.backward && as_old {
                phase = 2;
                false
            } else if self.backward && as_old && i == 0 {
                false
            } else if self.backward && as_new && i > 0 {
                phase = 2;
                true
            } else {
                return Err(corrupt(format!(
                    "LUKS2 segment {id} is bound to the wrong digest for its place"
                )));
            };
            let like = if is_new { &self.new } else { &self.old };
            let crypt_ok = s.kind == "linear"
                || (s.encryption == like.encryption
                    && s.sector_size == like.sector_size
                    && s.iv_tweak == like.iv_tweak + (at - base) / 512);
            if s.kind != like.kind || s.offset != at || !crypt_ok {
                return Err(corrupt(format!(
                    "LUKS2 segment {id} does not continue the reencryption layout"
                )));
            }
            match s.fixed_size()? {
                Some(sz) => at += sz,
                None if i + 1 == n => {}
                None => {
                    return Err(corrupt(format!(
                        "LUKS2 segment {id} is dynamic but not last"
                    )))
                }
            }
        }
        Ok(())
    }

    /// The data segments of a decryption with a data shift, in the order
    /// cryptsetup writes them: the moved segment (the data's first `M`
    /// bytes, still encrypted, at the start of the device; or, in its
    /// own last hotzone, plaintext), the plaintext decrypted so far at
    /// `M`, at most one hotzone, then the ciphertext still `shift` bytes
    /// further on; when all is done one plaintext segment.
    fn check_decrypt_shift_layout(&self, h: &RawHeader, moved: &Segment) -> Result<()> {
        let shift = self.old.offset;
        let m = moved.fixed_size()?.unwrap_or(0);
        let n = self.data.len();
        if n == 0 || n > 4 {
            return Err(corrupt(format!(
                "LUKS2 reencryption with {n} data segments"
            )));
        }
        let mut at = 0u64; // logical position in the data
        let mut phase = 0; // 0 moved, 1 plaintext, 2 hotzone, 3 old
        for (i, (id, s)) in self.data.iter().enumerate() {
            let bad = || not_continued(id);
            let digests = digests_of(h, id);
            let hot = in_reencryption(s);
            let size = s.fixed_size()?;
            let last = i + 1 == n;
            if s.kind == "crypt" {
                let place = if i == 0 { 0 } else { shift + at };
                if hot
                    || digests != [&self.old_digest]
                    || s.offset != place
                    || s.encryption != self.old.encryption
                    || s.sector_size != self.old.sector_size
                    || s.iv_tweak != self.old.iv_tweak + at / 512
                    || (i == 0 && size != Some(m))
                    || (i > 0 && phase >= 3)
                    || (size.is_none() && !last)
                {
                    return Err(bad());
                }
                phase = if i == 0 { 1 } else { 3 };
            } else {
                let first_hot = i == 0 && hot && size == Some(m);
                let single = n == 1 && !hot && size.is_none();
                let plain = i > 0 && !hot && phase == 1 && at == m;
                let hot_zone = i > 0 && hot && phase <= 1 && at >= m;
                if !digests.is_empty()
                    || s.offset != at
                    || !(first_hot || single || plain || hot_zone)
                    || (size.is_none() && !last)
                {
                    return Err(bad());
                }
                phase = if hot_zone { 2 } else { 1 };
            }
            if let Some(sz) = size {
                at += sz;
            }
        }
        Ok(())
    }

    /// The data segments of an encryption with a data shift, in the
    /// order cryptsetup writes them: the moved segment (the data's first
    /// `shift` bytes, plaintext, at the end of the device), the rest of
    /// the plaintext in place, at most one hotzone, then the encrypted
    /// part `shift` bytes further on, each bound to its key's digest.
    fn check_shift_layout(&self, h: &RawHeader, moved: &Segment) -> Result<()> {
        let shift = self.new.offset;
        let total = self.old.fixed_size()?.unwrap_or(0);
        let mut at = 0u64; // logical position in the plaintext
        let mut phase = 0; // 0 linear, 1 after the hotzone / encrypted
        let n = self.data.len();
        if n == 0 || n > 4 {
            return Err(corrupt(format!(
                "LUKS2 reencryption with {n} data segments"
            )));
        }
        for (i, (id, s)) in self.data.iter().enumerate() {
            let bad = || not_continued(id);
            let digests = digests_of(h, id);
            let size = s.fixed_size()?;
            if s.kind == "linear" {
                let place = if at == 0 { moved.offset } else { at };
                let want = if at == 0 { Some(shift) } else { size };
                if phase != 0 || !digests.is_empty() || s.offset != place || size != want {
                    return Err(bad());
                }
            } else {
                let hot = in_reencryption(s);
                if (hot && phase != 0)
                    || digests != [&self.new_digest]
                    || s.kind != "crypt"
                    || s.offset != shift + at
                    || s.encryption != self.new.encryption
                    || s.sector_size != self.new.sector_size
                    || s.iv_tweak != self.new.iv_tweak + at / 512
                {
                    return Err(bad());
                }
                phase = 1;
            }
            match size {
                Some(sz) => at += sz,
                None if i + 1 == n && s.kind == "crypt" && at == 0 => at = total,
                None => return Err(bad()),
            }
        }
        if at != total {
            return Err(corrupt("LUKS2 reencryption segments do not cover the data"));
        }
        Ok(())
    }

    /// The hotzone segment a crash left: `(offset from the data start,
    /// length)` in bytes.
    pub fn hotzone(&self) -> Option<(u64, u64)> {
        self.data
            .iter()
            .find(|(_, s)| in_reencryption(s))
            .map(|(_, s)| {
                (
                    s.offset.saturating_sub(self.new.offset),
                    s.fixed_size().ok().flatten().unwrap_or(0),
                )
            })
    }

    /// Bytes already reencrypted of `total`, when clean (forward: from
    /// the data start; backward: from its end).
    pub fn progress_of(&self, total: u64) -> u64 {
        if self.moved.is_some() && self.mode == Mode::Decrypt {
            // A decryption with a data shift: the plaintext after the
            // moved segment (its last hotzone), then all of it.
            return match &self.data[..] {
                [(_, s)] if s.kind == "linear" => total,
                [_, (_, s), ..] if s.kind == "linear" => match s.fixed_size() {
                    Ok(Some(p)) => p,
                    _ => total.saturating_sub(self.moved_len()),
                },
                _ => 0,
            };
        }
        if self.moved.is_some() {
            // A data shift: what is not plaintext any more.
            let plain: u64 = self
                .data
                .iter()
                .filter(|(_, s)| s.kind == "linear")
                .filter_map(|(_, s)| s.fixed_size().ok().flatten())
                .sum();
            return total.saturating_sub(plain);
        }
        let first = match &self.data[..] {
            [] | [_] => return if self.all_new { total } else { 0 },
            [(_, first), ..] => first.fixed_size().ok().flatten().unwrap_or(0),
        };
        if self.backward {
            total.saturating_sub(first)
        } else {
            first
        }
    }

    /// The moved segment's length (0 without one).
    pub(crate) fn moved_len(&self) -> u64 {
        self.moved
            .as_ref()
            .and_then(|m| m.fixed_size().ok().flatten())
            .unwrap_or(0)
    }

    /// Bytes already reencrypted (from the data start), when clean and
    /// forward; see [`State::progress_of`].
    pub fn progress(&self) -> u64 {
        match &self.data[..] {
            [_] => 0,
            [(_, first), ..] => first.fixed_size().ok().flatten().unwrap_or(0),
            [] => 0,
        }
    }

    /// cryptsetup's verification data for `old`/`new` keys over `h`.
    pub(crate) fn verification_data(
        h: &RawHeader,
        kid: &str,
        version: u8,
        old_vk: &[u8],
        new_vk: &[u8],
    ) -> Result<Vec<u8>> {
        let bad = || corrupt("LUKS2 reencryption metadata cannot be serialized for its digest");
        // A plaintext side has no key (`old_vk`/`new_vk` empty).
        let mut out = vec![0x76, 0x30 + version];
        out.extend_from_slice(old_vk);
        out.extend_from_slice(new_vk);
        let ks = h.obj("keyslots").get(kid).ok_or_else(bad)?;
        let area = ks.get("area").ok_or_else(bad)?;
        let sstr = |out: &mut Vec<u8>, v: &Value, k: &str| -> Result<()> {
            let t = v.get(k).and_then(Value::as_str).ok_or_else(bad)?;
            if t.is_empty() || t.len() > 64 {
                return Err(bad());
            }
            out.extend_from_slice(t.as_bytes());
            Ok(())
        };
        let su64 = |out: &mut Vec<u8>, v: &Value, k: &str, dynamic: bool| -> Result<()> {
            let t = v.get(k).and_then(Value::as_str).ok_or_else(bad)?;
            if dynamic && t == "dynamic" {
                out.extend_from_slice(b"dynamic");
                return Ok(());
            }
            let n: u64 = t.parse().map_err(|_| bad())?;
            out.extend_from_slice(&n.to_be_bytes());
            Ok(())
        };
        let su32 = |out: &mut Vec<u8>, v: &Value, k: &str| -> Result<()> {
            let n = v
                .get(k)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad)?;
            out.extend_from_slice(&n.to_be_bytes());
            Ok(())
        };
        sstr(&mut out, ks, "mode")?;
        sstr(&mut out, ks, "direction")?;
        sstr(&mut out, area, "type")?;
        su64(&mut out, area, "offset", false)?;
        su64(&mut out, area, "size", false)?;
        let atype = area.get("type").and_then(Value::as_str);
        if matches!(atype, Some("checksum" | "datashift-checksum")) {
            sstr(&mut out, area, "hash")?;
            su32(&mut out, area, "sector_size")?;
        }
        if atype.is_some_and(|t| t.starts_with("datashift")) {
            su64(&mut out, area, "shift_size", false)?;
        }
        for flag in ["backup-previous", "backup-final", "backup-moved-segment"] {
            let found = h.obj("segments").values().find(|s| {
                s.get("flags")
                    .and_then(Value::as_array)
                    .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(flag)))
            });
            let seg = match found {
                Some(seg) => seg,
                None if flag == "backup-moved-segment" => continue,
                None => return Err(bad()),
            };
            sstr(&mut out, seg, "type")?;
            su64(&mut out, seg, "offset", false)?;
            su64(&mut out, seg, "size", true)?;
            // A linear segment: type, offset and size only.
            if seg.get("type").and_then(Value::as_str) == Some("crypt") {
                su64(&mut out, seg, "iv_tweak", false)?;
                sstr(&mut out, seg, "encryption")?;
                su32(&mut out, seg, "sector_size")?;
            }
        }
        Ok(out)
    }

    /// Metadata no cryptsetup since 2.4 acts on before `repair` upgrades
    /// it (`LUKS2_reencrypt_get_params`' `CRYPT_REENCRYPT_REPAIR_NEEDED`):
    /// the old `online-reencrypt` requirement, or no verification digest.
    pub fn needs_repair(&self) -> bool {
        self.version < 2 || self.verify_digest.is_empty()
    }

    /// Checks the verification digest against the unlocked keys: a
    /// mismatch is a header changed without the keys, refused, and so is
    /// metadata that [`State::needs_repair`].
    pub(crate) fn verify(&self, h: &RawHeader, old_vk: &[u8], new_vk: &[u8]) -> Result<()> {
        if self.needs_repair() {
            return Err(super::upgrade::invalid_metadata());
        }
        let data = Self::verification_data(h, &self.keyslot, self.version, old_vk, new_vk)?;
        let d = h
            .meta_digest(&self.verify_digest)
            .ok_or_else(|| corrupt("LUKS2 reencryption verification digest is missing"))?;
        let hash = Hash::parse(&d.hash)?;
        let salt = json::b64_decode(&d.salt, "digest salt")?;
        let dig = json::b64_decode(&d.digest, "digest")?;
        if dig.len() < json::MIN_DIGEST_LEN
            || !keyslot::digest_matches(hash, &data, &salt, d.iterations, &dig)
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                "Reencryption metadata is invalid (the verification digest does not match); \
                 refusing to touch the device",
            ));
        }
        Ok(())
    }
}

impl RawHeader {
    /// A digest of the raw JSON, typed (the verification digest is not
    /// in the ordinary view).
    pub(crate) fn meta_digest(&self, id: &str) -> Option<json::DigestJson> {
        serde_json::from_value(self.obj("digests").get(id)?.clone()).ok()
    }
}
