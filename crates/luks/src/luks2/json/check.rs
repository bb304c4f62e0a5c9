//! Parsing the LUKS2 JSON area into a [`Metadata`] and the checks that make
//! it safe to act on, plus writing it back.
//!
//! What a LUKS2 header must satisfy to load, and the cryptsetup source
//! each check mirrors (`lib/luks2/luks2_json_metadata.c` unless named;
//! "further" marks where ucrypt is stricter, and why):
//!
//! | check | cryptsetup |
//! |---|---|
//! | binary header: magic, version 2, `hdr_size` one of the allowed sizes, checksum over the whole area, its offset matches where it was found | `luks2_disk_metadata.c` `hdr_checksum_check`, `hdr_read_disk` (in `binary.rs`, `mod.rs`) |
//! | JSON: an object from the first byte, NUL-terminated, only NULs after it | `hdr_read_disk` / `LUKS2_hdr_validate` |
//! | objects and field types (strings, decimal numbers in strings, string arrays), segment ids without gaps | `hdr_validate_json_size`, `hdr_validate_keyslots`, `hdr_validate_segments`, `hdr_validate_digests`, `hdr_validate_tokens` (in `shape.rs`) |
//! | mandatory requirements unknown to ucrypt refuse the header | `LUKS2_config_get_requirements` / `LUKS2_unmet_requirements` |
//! | at most one reencryption requirement (`online-reencrypt`, `online-reencrypt-vN`), and a reencrypt keyslot only with one (else not a LUKS2 header) | `hdr_validate_requirements`, `LUKS2_keyslots_validate` (`luks2_keyslot.c`) |
//! | `config.json_size` = header size − 4096; `keyslots_size` 4 KiB-aligned, at most 128 MiB | `hdr_validate_config`, `validate_keyslots_size` |
//! | ids: keyslots and tokens 0..32, digests and segments numeric | `numbered`, `LUKS2_KEYSLOTS_MAX`, `LUKS2_TOKENS_MAX` |
//! | keyslot type `luks2`, area type `raw` (others: unsupported) | `LUKS2_keyslot_validate` → `luks2_keyslot_validate` (`luks2_keyslot_luks2.c`) |
//! | keyslot `key_size` and area `key_size` 1..=128 bytes, area cipher named | `luks2_keyslot_validate`; further: a bound so nothing large is allocated from it |
//! | AF `luks1` with 4000 stripes and a known hash | `luks2_keyslot_validate`, `AF_split` (cryptsetup accepts other stripe counts at load and fails at unlock; further: refused at load) |
//! | area 512-aligned, inside the keyslots area, no two overlapping, large enough for key × stripes | `hdr_validate_areas`, `LUKS2_keyslot_area` |
//! | each keyslot bound to exactly one digest | `hdr_validate_digests` / `LUKS2_digest_by_keyslot` |
//! | KDF costs within cryptsetup's maxima (Argon2 memory ≤ 4 GiB, 1..4 lanes) and runnable (PBKDF2 and Argon2 time ≥ 1, ≥ 8 KiB a lane) | `crypt_pbkdf_get_limits` (`pbkdf_check.c`), which cryptsetup applies when it writes a keyslot; further: refused at load, before any work, since no cryptsetup writes beyond them (an unknown KDF kind still fails only its keyslot, at unlock). Its minimums (1000 iterations, time 4, 32 KiB) are not applied to what is read: cryptsetup loads cheaper keyslots, its validation suite's valid header among them |
//! | at least one segment; offsets 512-aligned and past the keyslots area; sizes non-zero multiples of the sector size; a `crypt` segment has a digest, a sector size of 512..4096 (a power of two) and a cipher | `hdr_validate_segments`, `hdr_validate_crypt_segment` |
//! | digest type `pbkdf2` with a known hash, non-zero iterations, base64 salt and digest no longer than the hash | `hdr_validate_digests`, `PBKDF2_digest_verify` (`luks2_digest_pbkdf2.c`) |
//! | digest at least 20 bytes | further: cryptsetup 2.6 loads a 1-byte digest (and a 1-byte digest lets one wrong passphrase in 256 unlock a garbage key); every cryptsetup writes the whole hash, and LUKS1's digest is a fixed 20 bytes |
//! | digests and tokens name only existing keyslots and segments | `hdr_validate_digests`, `LUKS2_token_validate` |
//!
//! Left to unlock, as in cryptsetup: the data area against the device
//! size, segments ucrypt cannot map, a keyslot salt of other than 32 bytes
//! (`luks2_keyslot_get_key`), and an Argon2 memory cost above this
//! machine's memory. The estimate of an expensive but legal KDF (a notice
//! before unlocking) is in [`crate::kdf`].

use super::*;

impl Metadata {
    /// Parses the JSON area text (up to its NUL) and validates it for a
    /// header of `hdr_size` bytes. Unsupported features are refused with a
    /// message naming them.
    pub fn parse(json_area: &[u8], hdr_size: u64) -> Result<Self> {
        let end = json_area
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| corrupt("LUKS2 JSON area is not NUL-terminated"))?;
        // cryptsetup: the object starts at the first byte and nothing but
        // NULs follows it.
        if json_area.first() != Some(&b'{') {
            return Err(corrupt("LUKS2 JSON area does not start with an object"));
        }
        if json_area[end..].iter().any(|&b| b != 0) {
            return Err(corrupt("LUKS2 JSON area has data beyond the metadata"));
        }
        let value: Value = serde_json::from_slice(&json_area[..end])
            .map_err(|e| json_error(ErrorKind::Corrupt, "LUKS2 JSON metadata is invalid", e))?;
        precheck(&value)?;
        crate::luks2::shape::check(&value)?;
        let mut meta: Metadata = serde_json::from_value(value).map_err(|e| {
            json_error(
                ErrorKind::Corrupt,
                "LUKS2 JSON metadata has a wrong shape",
                e,
            )
        })?;
        meta.drop_leftover_kdf_params();
        meta.validate(hdr_size)?;
        Ok(meta)
    }

    /// cryptsetup's in-memory keyslot repair: KDF parameters of the other
    /// KDF kind (left by an old version) are dropped.
    fn drop_leftover_kdf_params(&mut self) {
        for ks in self.keyslots.values_mut() {
            let k = &mut ks.kdf;
            match k.kind.as_str() {
                "pbkdf2" => (k.time, k.memory, k.cpus) = (None, None, None),
                "argon2i" | "argon2id" => (k.hash, k.iterations) = (None, None),
                _ => {}
            }
        }
    }

    /// Serializes to the JSON text (no NUL).
    pub fn to_json(&self) -> Vec<u8> {
        // Invariant: every field is a plain string/number/map, which
        // serde_json always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Keyslots area start: right after both header copies.
    pub fn keyslots_start(hdr_size: u64) -> u64 {
        2 * hdr_size
    }

    /// The default (lowest id) segment: the data segment ucrypt maps. It
    /// may be of a type ucrypt cannot map; unlocking checks that.
    pub fn segment(&self) -> (&String, &Segment) {
        // Invariant: validate() requires at least one segment.
        self.segments
            .iter()
            .min_by_key(|(id, _)| id.parse::<u32>().unwrap_or(u32::MAX))
            .unwrap_or_else(|| unreachable!("validated: a segment"))
    }

    /// Why ucrypt cannot map this volume's data, if it cannot: more than one
    /// segment, or a segment that is not `crypt`.
    pub fn unmappable(&self) -> Option<String> {
        if self.segments.len() != 1 {
            return Some(format!(
                "LUKS2 volumes with {} segments are not supported (only one crypt segment)",
                self.segments.len()
            ));
        }
        let seg = self.segment().1;
        (seg.kind != "crypt").then(|| format!("LUKS2 segment type {:?} is not supported", seg.kind))
    }

    /// Id of the digest that covers the segment.
    pub fn segment_digest(&self) -> Option<(&String, &DigestJson)> {
        let (sid, _) = self.segment();
        self.digests
            .iter()
            .find(|(_, d)| d.segments.iter().any(|s| s == sid))
    }

    /// Ids of keyslots bound to the segment's digest, ascending.
    pub fn segment_keyslots(&self) -> Vec<u32> {
        let mut v: Vec<u32> = match self.segment_digest() {
            Some((_, d)) => d.keyslots.iter().filter_map(|k| k.parse().ok()).collect(),
            None => Vec::new(),
        };
        v.sort_unstable();
        v
    }

    /// A keyslot's priority (0 ignore, 1 normal, 2 prefer; normal when
    /// unset or absent).
    pub fn keyslot_priority(&self, slot: u32) -> i64 {
        self.keyslots
            .get(&slot.to_string())
            .and_then(|k| k.extra.get("priority"))
            .and_then(|p| p.as_i64())
            .unwrap_or(1)
    }

    /// `slots` in cryptsetup's try order: higher priority first, then by
    /// number; priority 0 ("ignore") left out.
    pub fn in_try_order(&self, slots: impl IntoIterator<Item = u32>) -> Vec<u32> {
        let mut v: Vec<u32> = slots
            .into_iter()
            .filter(|&s| self.keyslot_priority(s) != 0)
            .collect();
        v.sort_by_key(|&s| (std::cmp::Reverse(self.keyslot_priority(s)), s));
        v
    }

    /// Full validation (everything except the device size).
    pub fn validate(&self, hdr_size: u64) -> Result<()> {
        let c = &self.config;
        if c.json_size != hdr_size - 4096 {
            return Err(corrupt(format!(
                "LUKS2 config json_size {} does not match the header size {hdr_size}",
                c.json_size
            )));
        }
        if c.keyslots_size % 4096 != 0 || c.keyslots_size > MAX_KEYSLOTS_SIZE {
            return Err(corrupt(format!(
                "LUKS2 keyslots_size {} is invalid",
                c.keyslots_size
            )));
        }
        let area_lo = Self::keyslots_start(hdr_size);
        let area_hi = area_lo + c.keyslots_size;
        let mut areas: Vec<(u64, u64, u32)> = Vec::new();
        for (id, ks) in &self.keyslots {
            let n = parse_id(id, "keyslot", MAX_KEYSLOTS)?;
            if ks.kind != "luks2" {
                return Err(unsupported(format!(
                    "LUKS2 keyslot {n} type {:?} is not supported",
                    ks.kind
                )));
            }
            if ks.key_size == 0 || ks.key_size > MAX_KEY_SIZE {
                return Err(corrupt(format!(
                    "LUKS2 keyslot {n} key size {} is invalid",
                    ks.key_size
                )));
            }
            if ks.af.kind != "luks1" || ks.af.stripes != crate::af::STRIPES {
                return Err(corrupt(format!(
                    "LUKS2 keyslot {n} AF must be luks1 with 4000 stripes"
                )));
            }
            Hash::parse(&ks.af.hash)?;
            let a = &ks.area;
            if a.kind != "raw" {
                return Err(unsupported(format!(
                    "LUKS2 keyslot {n} area type {:?} is not supported",
                    a.kind
                )));
            }
            if a.key_size == 0 || a.key_size > MAX_KEY_SIZE || a.encryption.is_empty() {
                return Err(corrupt(format!("LUKS2 keyslot {n} area cipher is invalid")));
            }
            let need = (u64::from(ks.key_size) * u64::from(ks.af.stripes)).div_ceil(512) * 512;
            let end = a
                .offset
                .checked_add(a.size)
                .ok_or_else(|| corrupt("LUKS2 keyslot area overflows"))?;
            if a.offset % 512 != 0 || a.offset < area_lo || end > area_hi {
                return Err(corrupt(format!(
                    "LUKS2 keyslot {n} area {}+{} lies outside the keyslots area {area_lo}..{area_hi}",
                    a.offset, a.size
                )));
            }
            if a.size < need {
                return Err(corrupt(format!(
                    "LUKS2 keyslot {n} area is smaller than its key material"
                )));
            }
            for &(s, e, m) in &areas {
                if a.offset < e && s < end {
                    return Err(corrupt(format!("LUKS2 keyslot areas {m} and {n} overlap")));
                }
            }
            areas.push((a.offset, end, n));
            // Costs beyond cryptsetup's hard limits: no cryptsetup wrote
            // them, refused before any work. An unknown KDF kind fails
            // only that keyslot, at unlock (as in cryptsetup).
            match ks.kdf.kdf() {
                Err(e) if e.kind() == ErrorKind::Unsupported => {}
                Err(e) => {
                    return Err(corrupt(format!("LUKS2 keyslot {n}: {}", e.message())));
                }
                Ok(_) => {}
            }
            let digests = self
                .digests
                .values()
                .filter(|d| d.keyslots.iter().any(|k| k == id))
                .count();
            if digests != 1 {
                return Err(corrupt(format!(
                    "LUKS2 keyslot {n} is bound to {digests} digests (must be one)"
                )));
            }
        }
        if self.segments.is_empty() {
            return Err(corrupt("LUKS2 metadata has no segment"));
        }
        // Only the lowest segment offset counts, and 0 is a detached
        // header (cryptsetup's hdr_validate_areas, json_segments_get_minimal_offset):
        // with a detached header a segment of a volume mid-decryption may
        // start anywhere.
        let lowest = self.segments.values().map(|s| s.offset).min().unwrap_or(0);
        if lowest != 0 && lowest < area_hi {
            return Err(corrupt(
                "LUKS2 segment offset overlaps the metadata and keyslots area",
            ));
        }
        for (id, seg) in &self.segments {
            parse_id(id, "segment", 1000)?;
            if seg.offset % 512 != 0 {
                return Err(corrupt("LUKS2 segment offset is not aligned to 512 bytes"));
            }
            if seg.fixed_size()?.is_some_and(|sz| sz == 0 || sz % 512 != 0) {
                return Err(corrupt("LUKS2 segment size is invalid"));
            }
            if seg.kind != "crypt" {
                // Other types need only type, offset and size (checked
                // by shape::check); mapping them is refused at unlock.
                continue;
            }
            if !self.digests.values().any(|d| d.segments.contains(id)) {
                return Err(corrupt(format!("LUKS2 crypt segment {id} has no digest")));
            }
            if seg.extra.contains_key("integrity") {
                return Err(unsupported(
                    "LUKS2 segments with integrity protection are not supported",
                ));
            }
            if ![512, 1024, 2048, 4096].contains(&seg.sector_size) {
                return Err(corrupt(format!(
                    "LUKS2 segment sector size {} is invalid",
                    seg.sector_size
                )));
            }
            let ss = u64::from(seg.sector_size);
            if seg.offset % ss != 0 {
                return Err(corrupt(
                    "LUKS2 segment offset is not aligned to its sector size",
                ));
            }
            if seg.fixed_size()?.is_some_and(|sz| sz % ss != 0) {
                return Err(corrupt("LUKS2 segment size is invalid"));
            }
            if seg.encryption.is_empty() {
                return Err(corrupt("LUKS2 segment has no encryption"));
            }
        }
        for (id, d) in &self.digests {
            parse_id(id, "digest", 1000)?;
            if d.kind != "pbkdf2" {
                return Err(unsupported(format!(
                    "LUKS2 digest type {:?} is not supported",
                    d.kind
                )));
            }
            let hash = Hash::parse(&d.hash)?;
            if d.iterations == 0 {
                return Err(corrupt("LUKS2 digest iteration count is zero"));
            }
            b64_decode(&d.salt, "digest salt")?;
            let dig = b64_decode(&d.digest, "digest")?;
            if dig.len() > hash.digest_len() {
                return Err(corrupt("LUKS2 digest is longer than its hash"));
            }
            if dig.len() < MIN_DIGEST_LEN {
                return Err(corrupt(format!(
                    "LUKS2 digest {id} is {} bytes long; at least {MIN_DIGEST_LEN} are needed \
                     to tell a wrong passphrase from the right one",
                    dig.len()
                )));
            }
            for k in &d.keyslots {
                if !self.keyslots.contains_key(k) {
                    return Err(corrupt(format!(
                        "LUKS2 digest {id} names missing keyslot {k:?}"
                    )));
                }
            }
            for s in &d.segments {
                if !self.segments.contains_key(s) {
                    return Err(corrupt(format!(
                        "LUKS2 digest {id} names missing segment {s:?}"
                    )));
                }
            }
        }
        for (id, t) in &self.tokens {
            parse_id(id, "token", MAX_KEYSLOTS)?;
            // Type and keyslots array are checked by shape::check; the
            // keyslots must exist (cryptsetup's LUKS2_token_validate).
            for k in t["keyslots"].as_array().into_iter().flatten() {
                let k = k.as_str().unwrap_or_default();
                if !self.keyslots.contains_key(k) {
                    return Err(corrupt(format!(
                        "LUKS2 token {id} names missing keyslot {k:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A name cryptsetup counts as a reencryption requirement
/// (`reencrypt_candidate_flag`): `online-reencrypt`, or
/// `online-reencrypt-v` and digits.
fn reencrypt_candidate(r: &str) -> bool {
    r == "online-reencrypt"
        || r.strip_prefix("online-reencrypt-v")
            .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
}

/// The reencryption requirement and keyslot as cryptsetup validates them
/// (`hdr_validate_requirements`, `LUKS2_keyslots_validate`): at most one
/// reencryption requirement, and a reencrypt keyslot only with one. A
/// header that fails is no LUKS2 header to cryptsetup ("Device … is not
/// a valid LUKS device."), so [`ErrorKind::NotLuks`] here.
pub(crate) fn check_reencrypt_requirement(v: &Value) -> Result<()> {
    let candidates = v
        .get("config")
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
        .map_or(0, |m| {
            m.iter()
                .filter(|r| r.as_str().is_some_and(reencrypt_candidate))
                .count()
        });
    if candidates > 1 {
        return Err(crate::Error::new(
            ErrorKind::NotLuks,
            "LUKS2 header has more than one reencryption requirement",
        ));
    }
    let reencrypt_slot = v
        .get("keyslots")
        .and_then(Value::as_object)
        .is_some_and(|ks| {
            ks.values()
                .any(|k| k.get("type").and_then(Value::as_str) == Some("reencrypt"))
        });
    if reencrypt_slot && candidates == 0 {
        return Err(crate::Error::new(
            ErrorKind::NotLuks,
            "LUKS2 reencrypt keyslot without the reencryption requirement",
        ));
    }
    Ok(())
}

/// Checks on the untyped value that give better messages than a shape error:
/// mandatory requirements and non-luks2 keyslots.
fn precheck(v: &Value) -> Result<()> {
    let obj = v
        .as_object()
        .ok_or_else(|| corrupt("LUKS2 JSON metadata is not an object"))?;
    check_reencrypt_requirement(v)?;
    if let Some(req) = obj.get("config").and_then(|c| c.get("requirements")) {
        if let Some(m) = req.get("mandatory").and_then(Value::as_array) {
            let names: Vec<String> = m
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| x.to_string())
                })
                .collect();
            if let Some(r) = names.iter().find(|n| n.starts_with("online-reencrypt")) {
                return Err(unsupported(format!(
                    "LUKS2 reencryption is in progress on this volume (requirement {r}); \
                     finish it with cryptsetup reencrypt before using the volume with ucrypt"
                )));
            }
            if !names.is_empty() {
                return Err(unsupported(format!(
                    "LUKS2 volume has unmet mandatory requirements: {} (refusing to open it)",
                    names.join(", ")
                )));
            }
        }
    }
    if let Some(ks) = obj.get("keyslots").and_then(Value::as_object) {
        for (id, k) in ks {
            if let Some(t) = k.get("type").and_then(Value::as_str) {
                if t != "luks2" {
                    return Err(unsupported(format!(
                        "LUKS2 keyslot {id} of type {t:?} is not supported"
                    )));
                }
            }
        }
    }
    Ok(())
}
