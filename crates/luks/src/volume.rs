//! Operations on a LUKS volume stored in files or block devices: load,
//! unlock ([`open`]), [`format`], add/remove/change keys, kill slots,
//! header backup/restore.
//!
//! Write ordering (crash safety): new keyslot material is written and
//! synced before the header that points at it; a removed keyslot leaves the
//! header first and is wiped afterwards; LUKS2 header updates write the
//! secondary copy, sync, then the primary, sync, so a crash at any point
//! leaves at least one valid copy (the reader takes the highest seqid).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::{Kdf, KdfRequest, MIN_PBKDF2_ITERATIONS};
use crate::keyslot::{self, material_len};
use crate::luks1;
use crate::luks2::{self, binary::BinHeader, json};
use crate::{af, Header};

/// An unlocked volume: everything the data path needs.
pub struct Opened {
    /// The volume key (zeroized on drop, never printed).
    pub volume_key: Zeroizing<Vec<u8>>,
    /// Keyslot that opened it.
    pub keyslot: u32,
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64`.
    pub cipher: String,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// IV offset in 512-byte sectors (LUKS2 `iv_tweak`; 0 for LUKS1).
    pub iv_offset: u64,
    /// IVs count in 512-byte units (cryptsetup never sets
    /// `iv_large_sectors` for LUKS), so always false.
    pub iv_large_sectors: bool,
    /// Data start on the data device, bytes.
    pub payload_offset: u64,
    /// Data size in bytes (a multiple of `sector_size`).
    pub size: u64,
    /// Volume UUID.
    pub uuid: String,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("volume_key", &"<redacted>")
            .field("keyslot", &self.keyslot)
            .field("cipher", &self.cipher)
            .field("sector_size", &self.sector_size)
            .field("iv_offset", &self.iv_offset)
            .field("payload_offset", &self.payload_offset)
            .field("size", &self.size)
            .field("uuid", &self.uuid)
            .finish()
    }
}

impl Opened {
    /// The sector-cipher configuration dm-crypt would use.
    pub fn crypt_config(&self) -> crypto::CryptConfig {
        crypto::CryptConfig {
            cipher: self.cipher.clone(),
            key: self.volume_key.clone(),
            iv_offset: self.iv_offset,
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
        }
    }

    /// The dm table line cryptsetup loads for this volume (contains the key
    /// in hex: treat as secret):
    /// `0 <sectors> crypt <cipher> <key> <iv_offset> <dev> <offset> [1 sector_size:N]`.
    pub fn table_line(&self, device: &Path) -> Zeroizing<String> {
        let key: String = self.volume_key.iter().map(|b| format!("{b:02x}")).collect();
        let key = Zeroizing::new(key);
        let mut line = format!(
            "0 {} crypt {} {} {} {} {}",
            self.size / 512,
            self.cipher,
            key.as_str(),
            self.iv_offset,
            device.display(),
            self.payload_offset / 512
        );
        if self.sector_size != 512 {
            line.push_str(&format!(" 1 sector_size:{}", self.sector_size));
        }
        Zeroizing::new(line)
    }
}

impl Opened {
    /// The dm-crypt table cryptsetup would load, as a parsed
    /// [`crypto::table::Table`] for the data path.
    pub fn to_table(&self, device: &Path) -> Result<crypto::table::Table> {
        crypto::table::Table::parse(&self.table_line(device))
            .map_err(|e| invalid(format!("Cannot build the dm-crypt table: {e}")))
    }
}

/// Unlocks the volume on `device` (header on `device` or the detached
/// `header`) with `passphrase`, trying `key_slot` only if given.
pub fn open(
    device: &Path,
    header: Option<&Path>,
    passphrase: &[u8],
    key_slot: Option<u32>,
) -> Result<Opened> {
    let vol = Volume::load(device, header)?;
    vol.unlock(passphrase, key_slot)
}

/// What `format` creates (cryptsetup's luksFormat options). `Debug`
/// never shows the volume key.
#[derive(Clone)]
pub struct FormatOptions {
    /// 1 or 2.
    pub version: u32,
    /// dm-crypt cipher spec.
    pub cipher: String,
    /// Volume key size in bits (default: 512 for XTS, 256 otherwise).
    pub key_bits: Option<u32>,
    /// Encryption sector size (LUKS2; default 4096 when the data size allows).
    pub sector_size: Option<u32>,
    /// Hash for AF, digest (and PBKDF2).
    pub hash: Hash,
    /// Keyslot KDF request.
    pub kdf: KdfRequest,
    /// LUKS2 label.
    pub label: Option<String>,
    /// LUKS2 subsystem.
    pub subsystem: Option<String>,
    /// UUID (random if `None`).
    pub uuid: Option<String>,
    /// Keyslot for the first key (default 0).
    pub key_slot: Option<u32>,
    /// Use this volume key instead of a random one.
    pub volume_key: Option<Zeroizing<Vec<u8>>>,
    /// Data offset in bytes (default: 16 MiB LUKS2, 2 MiB LUKS1, 0 detached).
    pub data_offset: Option<u64>,
    /// Overwrite an existing LUKS header.
    pub force: bool,
}

impl std::fmt::Debug for FormatOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FormatOptions")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .field("key_bits", &self.key_bits)
            .field("sector_size", &self.sector_size)
            .field("hash", &self.hash)
            .field("kdf", &self.kdf)
            .field("label", &self.label)
            .field("subsystem", &self.subsystem)
            .field("uuid", &self.uuid)
            .field("key_slot", &self.key_slot)
            .field(
                "volume_key",
                &self.volume_key.as_ref().map(|_| "<redacted>"),
            )
            .field("data_offset", &self.data_offset)
            .field("force", &self.force)
            .finish()
    }
}

impl Default for FormatOptions {
    fn default() -> Self {
        Self {
            version: 2,
            cipher: "aes-xts-plain64".into(),
            key_bits: None,
            sector_size: None,
            hash: Hash::Sha256,
            kdf: KdfRequest::default(),
            label: None,
            subsystem: None,
            uuid: None,
            key_slot: None,
            volume_key: None,
            data_offset: None,
            force: false,
        }
    }
}

/// A LUKS volume: its header and where header and data live.
#[derive(Debug)]
pub struct Volume {
    header: Header,
    meta_path: PathBuf,
    detached: bool,
    meta_size: u64,
    data_size: u64,
}

fn device_size(f: &mut File, path: &Path) -> Result<u64> {
    f.seek(SeekFrom::End(0))
        .map_err(|e| Error::io(format!("Cannot size {}", path.display()), e))
}

fn open_ro(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io(format!("Cannot open {}", path.display()), e))
}

fn open_rw(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("Cannot open {} for writing", path.display()), e))
}

fn write_at(f: &mut File, off: u64, buf: &[u8]) -> Result<()> {
    f.seek(SeekFrom::Start(off))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    f.write_all(buf)
        .map_err(|e| Error::io("Cannot write the header device", e))
}

fn read_exact_at(f: &mut File, off: u64, buf: &mut [u8]) -> Result<()> {
    f.seek(SeekFrom::Start(off))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    f.read_exact(buf)
        .map_err(|e| Error::io("Cannot read keyslot material", e))
}

fn sync(f: &File) -> Result<()> {
    f.sync_all()
        .map_err(|e| Error::io("Cannot flush the header device", e))
}

/// Overwrites `[off, off+len)` with zeros in 1 MiB chunks.
fn zero_range(f: &mut File, off: u64, len: u64) -> Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        write_at(f, off + done, &chunk[..n])?;
        done += n as u64;
    }
    Ok(())
}

impl Volume {
    /// Reads the header of `device` (or of the detached `header` file).
    pub fn load(device: &Path, header: Option<&Path>) -> Result<Self> {
        let meta_path = header.unwrap_or(device).to_path_buf();
        let mut data = open_ro(device)?;
        let data_size = device_size(&mut data, device)?;
        let (mut meta, meta_size) = if header.is_some() {
            let mut m = open_ro(&meta_path)?;
            let s = device_size(&mut m, &meta_path)?;
            (m, s)
        } else {
            (data, data_size)
        };
        let h = Header::read(&mut meta, meta_size)?;
        let vol = Volume {
            header: h,
            meta_path,
            detached: header.is_some(),
            meta_size,
            data_size,
        };
        vol.check_data_device()?;
        Ok(vol)
    }

    fn check_data_device(&self) -> Result<()> {
        let off = self.header.payload_offset();
        if !self.detached && off != 0 && off < self.header.metadata_end() {
            return Err(corrupt("Data offset lies inside the LUKS metadata"));
        }
        if !self.detached && off == 0 {
            return Err(corrupt(
                "Data offset 0 on a device that holds its own header",
            ));
        }
        if off > self.data_size {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                format!(
                    "Data offset {off} lies beyond the device size {}",
                    self.data_size
                ),
            ));
        }
        if let Header::V2(h) = &self.header {
            if let Some(sz) = h.meta.segment().1.fixed_size()? {
                if off + sz > self.data_size {
                    return Err(Error::new(
                        ErrorKind::DeviceSize,
                        "LUKS2 segment extends beyond the device",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Where the header lives.
    pub fn header_path(&self) -> &Path {
        &self.meta_path
    }

    /// Size of the data device in bytes.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// Tries the passphrase on one slot: `Ok(None)` when it does not fit.
    fn try_slot(&self, f: &mut File, slot: u32, pass: &[u8]) -> Result<Option<Zeroizing<Vec<u8>>>> {
        match &self.header {
            Header::V1(h) => {
                let s = h
                    .slots
                    .get(slot as usize)
                    .ok_or_else(|| invalid(format!("Keyslot {slot} is invalid")))?;
                if !s.active {
                    return Err(Error::new(
                        ErrorKind::SlotInactive,
                        format!("Keyslot {slot} is not active"),
                    ));
                }
                let mut mat =
                    Zeroizing::new(vec![0u8; material_len(h.key_bytes as usize, s.stripes)]);
                read_exact_at(f, u64::from(s.key_material_offset) * 512, &mut mat)?;
                let kdf = Kdf::Pbkdf2 {
                    hash: h.hash,
                    iterations: s.iterations,
                };
                let cipher = h.cipher();
                let params = keyslot::SlotParams {
                    kdf,
                    salt: &s.salt,
                    cipher: &cipher,
                    area_key_size: h.key_bytes as usize,
                    key_size: h.key_bytes as usize,
                    stripes: s.stripes,
                    af_hash: h.hash,
                };
                let vk = keyslot::open_material(pass, &params, &mut mat)?;
                let ok = keyslot::digest_matches(
                    h.hash,
                    &vk,
                    &h.mk_digest_salt,
                    h.mk_digest_iterations,
                    &h.mk_digest,
                );
                Ok(ok.then_some(vk))
            }
            Header::V2(h) => {
                let ks = h.meta.keyslots.get(&slot.to_string()).ok_or_else(|| {
                    Error::new(
                        ErrorKind::SlotInactive,
                        format!("Keyslot {slot} is not active"),
                    )
                })?;
                let (_, dg) = h
                    .meta
                    .digests
                    .iter()
                    .find(|(_, d)| d.keyslots.iter().any(|k| k == &slot.to_string()))
                    .ok_or_else(|| corrupt(format!("Keyslot {slot} has no digest")))?;
                let mut mat =
                    Zeroizing::new(vec![0u8; material_len(ks.key_size as usize, ks.af.stripes)]);
                read_exact_at(f, ks.area.offset, &mut mat)?;
                let salt = json::b64_decode(&ks.kdf.salt, "keyslot salt")?;
                let params = keyslot::SlotParams {
                    kdf: ks.kdf.kdf()?,
                    salt: &salt,
                    cipher: &ks.area.encryption,
                    area_key_size: ks.area.key_size as usize,
                    key_size: ks.key_size as usize,
                    stripes: ks.af.stripes,
                    af_hash: Hash::parse(&ks.af.hash)?,
                };
                let vk = keyslot::open_material(pass, &params, &mut mat)?;
                let dhash = Hash::parse(&dg.hash)?;
                let dsalt = json::b64_decode(&dg.salt, "digest salt")?;
                let ddig = json::b64_decode(&dg.digest, "digest")?;
                let ok = keyslot::digest_matches(dhash, &vk, &dsalt, dg.iterations, &ddig);
                Ok(ok.then_some(vk))
            }
        }
    }

    /// Finds the keyslot `pass` opens: `(slot, volume key)`.
    pub fn unlock_key(
        &self,
        pass: &[u8],
        key_slot: Option<u32>,
    ) -> Result<(u32, Zeroizing<Vec<u8>>)> {
        let mut f = open_ro(&self.meta_path)?;
        let slots: Vec<u32> = match key_slot {
            Some(s) => vec![s],
            None => self.unlock_order(),
        };
        if slots.is_empty() {
            return Err(Error::new(ErrorKind::WrongPassphrase, "No usable keyslot"));
        }
        for s in slots {
            if let Some(vk) = self.try_slot(&mut f, s, pass)? {
                return Ok((s, vk));
            }
        }
        Err(Error::new(
            ErrorKind::WrongPassphrase,
            match key_slot {
                Some(s) => format!("No key available with this passphrase in keyslot {s}"),
                None => "No key available with this passphrase".to_string(),
            },
        ))
    }

    /// Active slots in cryptsetup's try order (LUKS2: high priority first,
    /// priority 0 "ignore" skipped).
    fn unlock_order(&self) -> Vec<u32> {
        match &self.header {
            Header::V1(_) => self.header.active_slots(),
            Header::V2(h) => {
                let bound = h.meta.segment_keyslots();
                let prio = |s: u32| {
                    h.meta
                        .keyslots
                        .get(&s.to_string())
                        .and_then(|k| k.extra.get("priority"))
                        .and_then(|p| p.as_i64())
                        .unwrap_or(1)
                };
                let mut v: Vec<u32> = bound.into_iter().filter(|&s| prio(s) != 0).collect();
                v.sort_by_key(|&s| (std::cmp::Reverse(prio(s)), s));
                v
            }
        }
    }

    /// Unlocks and returns everything the data path needs.
    pub fn unlock(&self, pass: &[u8], key_slot: Option<u32>) -> Result<Opened> {
        let (slot, vk) = self.unlock_key(pass, key_slot)?;
        self.opened(slot, vk)
    }

    /// Builds [`Opened`] from a verified volume key.
    pub fn opened(&self, keyslot: u32, volume_key: Zeroizing<Vec<u8>>) -> Result<Opened> {
        let off = self.header.payload_offset();
        let ss = u64::from(self.header.sector_size());
        let (size, iv_offset) = match &self.header {
            Header::V1(_) => ((self.data_size - off) / 512 * 512, 0),
            Header::V2(h) => {
                let seg = h.meta.segment().1;
                let size = match seg.fixed_size()? {
                    Some(s) => s,
                    None => (self.data_size - off) / ss * ss,
                };
                (size, seg.iv_tweak)
            }
        };
        if size == 0 {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                "The LUKS data area is empty (device too small)",
            ));
        }
        Ok(Opened {
            volume_key,
            keyslot,
            cipher: self.header.cipher(),
            sector_size: ss as u32,
            iv_offset,
            iv_large_sectors: false,
            payload_offset: off,
            size,
            uuid: self.header.uuid().to_string(),
        })
    }

    /// Checks that `vk` is this volume's key (constant time).
    pub fn verify_volume_key(&self, vk: &[u8]) -> bool {
        match &self.header {
            Header::V1(h) => {
                vk.len() == h.key_bytes as usize
                    && keyslot::digest_matches(
                        h.hash,
                        vk,
                        &h.mk_digest_salt,
                        h.mk_digest_iterations,
                        &h.mk_digest,
                    )
            }
            Header::V2(h) => match h.meta.segment_digest() {
                Some((_, dg)) => {
                    let (Ok(hash), Ok(salt), Ok(d)) = (
                        Hash::parse(&dg.hash),
                        json::b64_decode(&dg.salt, "digest salt"),
                        json::b64_decode(&dg.digest, "digest"),
                    ) else {
                        return false;
                    };
                    (self.header.key_size() == 0 || vk.len() == self.header.key_size())
                        && keyslot::digest_matches(hash, vk, &salt, dg.iterations, &d)
                }
                None => false,
            },
        }
    }

    /// Adds `new_pass` for the (already verified) volume key `vk` into
    /// `slot` or the first free one. Returns the slot used.
    pub fn add_key(
        &mut self,
        vk: &[u8],
        new_pass: &[u8],
        slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        if !self.verify_volume_key(vk) {
            return Err(Error::new(
                ErrorKind::WrongPassphrase,
                "Volume key does not match the volume",
            ));
        }
        let mut f = open_rw(&self.meta_path)?;
        match &mut self.header {
            Header::V1(h) => {
                if kdf.kind != "pbkdf2" {
                    return Err(invalid("LUKS1 keyslots support only the pbkdf2 KDF"));
                }
                let slot = match slot {
                    Some(s) if s as usize >= luks1::SLOTS => {
                        return Err(invalid(format!("Keyslot {s} is invalid")))
                    }
                    Some(s) if h.slots[s as usize].active => {
                        return Err(Error::new(
                            ErrorKind::SlotBusy,
                            format!("Keyslot {s} is already in use"),
                        ))
                    }
                    Some(s) => s,
                    None => (0..8u32)
                        .find(|&s| !h.slots[s as usize].active)
                        .ok_or_else(|| Error::new(ErrorKind::SlotBusy, "All keyslots are full"))?,
                };
                let req = KdfRequest {
                    hash: h.hash,
                    ..kdf.clone()
                };
                let k = req.resolve(h.key_bytes as usize)?;
                let Kdf::Pbkdf2 { iterations, .. } = k else {
                    unreachable!("pbkdf2 requested")
                };
                let salt = keyslot::random(luks1::SALT_LEN)?;
                let cipher = h.cipher();
                let s = &mut h.slots[slot as usize];
                let params = keyslot::SlotParams {
                    kdf: k,
                    salt: &salt,
                    cipher: &cipher,
                    area_key_size: vk.len(),
                    key_size: vk.len(),
                    stripes: s.stripes,
                    af_hash: h.hash,
                };
                let mat = keyslot::seal_material(new_pass, &params, vk)?;
                write_at(&mut f, u64::from(s.key_material_offset) * 512, &mat)?;
                sync(&f)?;
                s.active = true;
                s.iterations = iterations;
                s.salt.copy_from_slice(&salt);
                write_at(&mut f, 0, &h.to_bytes())?;
                sync(&f)?;
                Ok(slot)
            }
            Header::V2(h) => {
                let slot = match slot {
                    Some(s) if s >= json::MAX_KEYSLOTS => {
                        return Err(invalid(format!("Keyslot {s} is invalid")))
                    }
                    Some(s) if h.meta.keyslots.contains_key(&s.to_string()) => {
                        return Err(Error::new(
                            ErrorKind::SlotBusy,
                            format!("Keyslot {s} is already in use"),
                        ))
                    }
                    Some(s) => s,
                    None => (0..json::MAX_KEYSLOTS)
                        .find(|s| !h.meta.keyslots.contains_key(&s.to_string()))
                        .ok_or_else(|| Error::new(ErrorKind::SlotBusy, "All keyslots are full"))?,
                };
                let af_hash = h
                    .meta
                    .keyslots
                    .values()
                    .next()
                    .map(|k| k.af.hash.clone())
                    .unwrap_or_else(|| "sha256".to_string());
                let area_size = (material_len(vk.len(), af::STRIPES) as u64).div_ceil(4096) * 4096;
                let offset = allocate_area(&h.meta, h.bin.hdr_size, area_size)?;
                let cipher = h.meta.segment().1.encryption.clone();
                let k = kdf.resolve(vk.len())?;
                let salt = keyslot::random(32)?;
                let params = keyslot::SlotParams {
                    kdf: k,
                    salt: &salt,
                    cipher: &cipher,
                    area_key_size: vk.len(),
                    key_size: vk.len(),
                    stripes: af::STRIPES,
                    af_hash: Hash::parse(&af_hash)?,
                };
                let mat = keyslot::seal_material(new_pass, &params, vk)?;
                write_at(&mut f, offset, &mat)?;
                sync(&f)?;
                let id = slot.to_string();
                h.meta.keyslots.insert(
                    id.clone(),
                    json::Keyslot {
                        kind: "luks2".into(),
                        key_size: vk.len() as u32,
                        af: json::Af {
                            kind: "luks1".into(),
                            stripes: af::STRIPES,
                            hash: af_hash,
                        },
                        area: json::Area {
                            kind: "raw".into(),
                            offset,
                            size: area_size,
                            encryption: cipher,
                            key_size: vk.len() as u32,
                        },
                        kdf: json::KdfJson::from_kdf(&k, &salt),
                        extra: Default::default(),
                    },
                );
                let sid = h.meta.segment().0.clone();
                if let Some(d) = h
                    .meta
                    .digests
                    .values_mut()
                    .find(|d| d.segments.contains(&sid))
                {
                    d.keyslots.push(id);
                }
                write_luks2(&mut f, h)?;
                Ok(slot)
            }
        }
    }

    /// Disables `slot` and wipes its material. Refuses the last active slot
    /// unless `allow_last`.
    pub fn kill_slot(&mut self, slot: u32, allow_last: bool) -> Result<()> {
        let active = self.header.active_slots();
        if !active.contains(&slot) {
            return Err(Error::new(
                ErrorKind::SlotInactive,
                format!("Keyslot {slot} is not active"),
            ));
        }
        if active.len() == 1 && !allow_last {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("Keyslot {slot} is the last one; the volume would become unusable"),
            ));
        }
        let mut f = open_rw(&self.meta_path)?;
        match &mut self.header {
            Header::V1(h) => {
                let s = &mut h.slots[slot as usize];
                s.active = false;
                s.iterations = 0;
                s.salt = [0; luks1::SALT_LEN];
                let (off, len) = (
                    u64::from(s.key_material_offset) * 512,
                    material_len(h.key_bytes as usize, s.stripes),
                );
                write_at(&mut f, 0, &h.to_bytes())?;
                sync(&f)?;
                zero_range(&mut f, off, len as u64)?;
                sync(&f)?;
            }
            Header::V2(h) => {
                let id = slot.to_string();
                let ks = h
                    .meta
                    .keyslots
                    .remove(&id)
                    .ok_or_else(|| invalid("Keyslot vanished"))?;
                for d in h.meta.digests.values_mut() {
                    d.keyslots.retain(|k| k != &id);
                }
                write_luks2(&mut f, h)?;
                zero_range(&mut f, ks.area.offset, ks.area.size)?;
                sync(&f)?;
            }
        }
        Ok(())
    }

    /// Replaces the volume UUID (cryptsetup luksUUID --uuid).
    pub fn set_uuid(&mut self, uuid: Option<&str>) -> Result<String> {
        let uuid = match uuid {
            Some(u) => checked_uuid(u)?,
            None => keyslot::random_uuid()?,
        };
        let mut f = open_rw(&self.meta_path)?;
        match &mut self.header {
            Header::V1(h) => {
                h.uuid = uuid.clone();
                write_at(&mut f, 0, &h.to_bytes())?;
                sync(&f)?;
            }
            Header::V2(h) => {
                h.bin.uuid = uuid.clone();
                write_luks2(&mut f, h)?;
            }
        }
        Ok(uuid)
    }

    /// Writes a header backup file (headers and keyslot areas, byte for
    /// byte what cryptsetup's luksHeaderBackup writes). Refuses to
    /// overwrite `path`.
    pub fn header_backup(&self, path: &Path) -> Result<()> {
        // cryptsetup saves the headers and keyslot areas, not the gap
        // up to the payload.
        let len = self.header.metadata_end().min(self.meta_size);
        let mut src = open_ro(&self.meta_path)?;
        let mut buf = vec![0u8; len as usize];
        read_exact_at(&mut src, 0, &mut buf)?;
        let mut opts = OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o400); // read-only, as cryptsetup creates it
        }
        let mut out = opts
            .open(path)
            .map_err(|e| Error::io(format!("Cannot create {}", path.display()), e))?;
        out.write_all(&buf)
            .map_err(|e| Error::io("Cannot write the header backup", e))?;
        sync(&out)
    }

    /// Restores a backup made by [`Volume::header_backup`] (or cryptsetup)
    /// onto `device` (or the detached `header`). A different UUID on the
    /// target needs `force`.
    pub fn header_restore(
        device: &Path,
        header: Option<&Path>,
        backup: &Path,
        force: bool,
    ) -> Result<Header> {
        let img = std::fs::read(backup)
            .map_err(|e| Error::io(format!("Cannot read {}", backup.display()), e))?;
        let new = Header::from_bytes(&img)?;
        let target = header.unwrap_or(device);
        let mut f = open_rw(target)?;
        let size = device_size(&mut f, target)?;
        if (img.len() as u64) > size && header.is_none() {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                "The backup is larger than the device",
            ));
        }
        if header.is_none()
            && new.payload_offset() != 0
            && (img.len() as u64) > new.payload_offset()
        {
            return Err(corrupt("The backup extends into its own data area"));
        }
        match Header::read(&mut f, size) {
            Ok(old) if old.uuid() != new.uuid() && !force => {
                return Err(Error::new(
                    ErrorKind::AlreadyLuks,
                    format!(
                        "Device has a different LUKS header (UUID {}); use force to replace it",
                        old.uuid()
                    ),
                ))
            }
            Ok(old) if old.payload_offset() != new.payload_offset() && header.is_none() => {
                return Err(invalid(
                    "The backup's data offset differs from the device's header",
                ));
            }
            _ => {}
        }
        write_at(&mut f, 0, &img)?;
        sync(&f)?;
        Ok(new)
    }
}

fn checked_uuid(u: &str) -> Result<String> {
    let ok = u.len() == 36
        && u.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    if !ok {
        return Err(invalid(format!("UUID {u:?} is invalid")));
    }
    Ok(u.to_ascii_lowercase())
}

/// First-fit 4 KiB aligned gap of `size` bytes in the keyslots area.
fn allocate_area(meta: &json::Metadata, hdr_size: u64, size: u64) -> Result<u64> {
    let lo = json::Metadata::keyslots_start(hdr_size);
    let hi = lo + meta.config.keyslots_size;
    let mut used: Vec<(u64, u64)> = meta
        .keyslots
        .values()
        .map(|k| (k.area.offset, k.area.offset + k.area.size))
        .collect();
    used.sort_unstable();
    let mut pos = lo;
    for (s, e) in used {
        if pos + size <= s {
            break;
        }
        pos = pos.max(e.div_ceil(4096) * 4096);
    }
    if pos + size > hi {
        return Err(Error::new(
            ErrorKind::SlotBusy,
            "No space left in the LUKS2 keyslots area",
        ));
    }
    Ok(pos)
}

/// Writes both LUKS2 copies with seqid + 1: secondary, sync, primary, sync.
fn write_luks2(f: &mut File, h: &mut luks2::Header) -> Result<()> {
    h.bin.seqid += 1;
    h.meta.validate(h.bin.hdr_size)?;
    let (p, s) = h.to_copies()?;
    write_at(f, h.bin.hdr_size, &s)?;
    sync(f)?;
    write_at(f, 0, &p)?;
    sync(f)
}

/// The common end of `format` for both versions: with the fresh header on
/// disk (no active slot), add the first passphrase and reload the volume the
/// way any other reader would.
fn add_first_key(
    mut vol: Volume,
    vk: &[u8],
    passphrase: &[u8],
    slot: u32,
    opts: &FormatOptions,
    device: &Path,
    header: Option<&Path>,
) -> Result<Volume> {
    let req = KdfRequest {
        hash: opts.hash,
        ..opts.kdf.clone()
    };
    vol.add_key(vk, passphrase, Some(slot), &req)?;
    Volume::load(device, header)
}

/// Formats `device` (header on it, or in the detached `header` file, which
/// is created if missing). Returns the loaded volume.
pub fn format(
    device: &Path,
    header: Option<&Path>,
    opts: &FormatOptions,
    passphrase: &[u8],
) -> Result<Volume> {
    let (cipher_name, cipher_mode) = opts.cipher.split_once('-').ok_or_else(|| {
        invalid(format!(
            "Cipher {:?} is not in cipher-mode-iv form",
            opts.cipher
        ))
    })?;
    let key_bits = opts.key_bits.unwrap_or(if cipher_mode.starts_with("xts") {
        512
    } else {
        256
    });
    if key_bits == 0 || key_bits % 8 != 0 || key_bits / 8 > json::MAX_KEY_SIZE {
        return Err(invalid(format!("Key size {key_bits} bits is invalid")));
    }
    let key_len = (key_bits / 8) as usize;
    let vk = match &opts.volume_key {
        Some(k) if k.len() != key_len => {
            return Err(invalid("Volume key length does not match the key size"))
        }
        Some(k) => k.clone(),
        None => keyslot::random(key_len)?,
    };
    // Refuse ciphers/key sizes the sector cipher cannot do, before writing.
    crypto::SectorCrypt::new(&crypto::CryptConfig {
        cipher: opts.cipher.clone(),
        key: vk.clone(),
        iv_offset: 0,
        sector_size: 512,
        iv_large_sectors: false,
    })
    .map_err(|e| {
        invalid(format!(
            "Cipher {} with a {key_bits}-bit key is not usable: {e}",
            opts.cipher
        ))
    })?;

    let mut data = open_ro(device)?;
    let data_size = device_size(&mut data, device)?;
    drop(data);
    let meta_path = header.unwrap_or(device);
    let mut f = match header {
        Some(h) => OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(h)
            .map_err(|e| Error::io(format!("Cannot open {}", h.display()), e))?,
        None => open_rw(device)?,
    };
    let meta_size = device_size(&mut f, meta_path)?;
    if !opts.force {
        match Header::read(&mut f, meta_size) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::AlreadyLuks,
                    format!("{} already contains a LUKS header", meta_path.display()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotLuks => {}
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::AlreadyLuks,
                    format!("{} contains a damaged LUKS header", meta_path.display()),
                ))
            }
        }
    }
    let uuid = match &opts.uuid {
        Some(u) => checked_uuid(u)?,
        None => keyslot::random_uuid()?,
    };
    let digest_iterations = match opts.kdf.force_iterations {
        Some(_) => MIN_PBKDF2_ITERATIONS,
        None => (crate::kdf::calibrate_pbkdf2(opts.hash, key_len, 125)).max(MIN_PBKDF2_ITERATIONS),
    };
    let digest_salt = keyslot::random(32)?;

    match opts.version {
        1 => {
            if opts.sector_size.is_some_and(|s| s != 512) {
                return Err(invalid("LUKS1 supports only 512-byte sectors"));
            }
            if opts.label.is_some() || opts.subsystem.is_some() {
                return Err(invalid("LUKS1 has no label or subsystem"));
            }
            if opts.kdf.kind != "pbkdf2" {
                return Err(invalid("LUKS1 supports only the pbkdf2 KDF"));
            }
            if cipher_name.len() >= 32 || cipher_mode.len() >= 32 {
                return Err(invalid("Cipher name or mode is too long for LUKS1"));
            }
            let slot = opts.key_slot.unwrap_or(0);
            if slot as usize >= luks1::SLOTS {
                return Err(invalid(format!("Keyslot {slot} is invalid for LUKS1")));
            }
            let (offs, default_payload) = luks1::default_layout(key_len as u32);
            let payload_sectors = match (opts.data_offset, header.is_some()) {
                (Some(o), _) if o % 512 != 0 => {
                    return Err(invalid("Data offset must be a multiple of 512"))
                }
                (Some(o), _) => (o / 512) as u32,
                (None, true) => 0,
                (None, false) => default_payload,
            };
            let mut mk_digest = [0u8; luks1::DIGEST_LEN];
            mk_digest.copy_from_slice(&keyslot::digest(
                opts.hash,
                &vk,
                &digest_salt,
                digest_iterations,
                20,
            ));
            let mut h = luks1::Header {
                cipher_name: cipher_name.to_string(),
                cipher_mode: cipher_mode.to_string(),
                hash: opts.hash,
                payload_offset: payload_sectors,
                key_bytes: key_len as u32,
                mk_digest,
                mk_digest_salt: [0; 32],
                mk_digest_iterations: digest_iterations,
                uuid,
                slots: [luks1::Slot {
                    active: false,
                    iterations: 0,
                    salt: [0; 32],
                    key_material_offset: 0,
                    stripes: 4000,
                }; luks1::SLOTS],
            };
            h.mk_digest_salt.copy_from_slice(&digest_salt);
            for (s, o) in h.slots.iter_mut().zip(offs) {
                s.key_material_offset = o;
            }
            let meta_end = h.metadata_end();
            if payload_sectors != 0 && u64::from(payload_sectors) * 512 < meta_end {
                return Err(invalid("Data offset is inside the keyslot areas"));
            }
            let data_start = u64::from(payload_sectors) * 512;
            if data_size <= data_start {
                return Err(Error::new(
                    ErrorKind::DeviceSize,
                    format!("Device {} is too small", device.display()),
                ));
            }
            let wipe = if header.is_some() {
                meta_end
            } else {
                data_start.max(meta_end)
            };
            zero_range(&mut f, 0, wipe)?;
            // Write the header with no active slot, then add the key.
            write_at(&mut f, 0, &h.to_bytes())?;
            sync(&f)?;
            drop(f);
            let vol = Volume {
                header: Header::V1(h),
                meta_path: meta_path.to_path_buf(),
                detached: header.is_some(),
                meta_size: meta_size.max(wipe),
                data_size,
            };
            add_first_key(vol, &vk, passphrase, slot, opts, device, header)
        }
        2 => {
            let hdr_size: u64 = 16384;
            let default_end: u64 = 16 << 20;
            let data_offset = match (opts.data_offset, header.is_some()) {
                (Some(o), _) => o,
                (None, true) => 0,
                (None, false) => default_end,
            };
            let keyslots_size = if header.is_some() || data_offset == 0 {
                default_end - 2 * hdr_size
            } else {
                if data_offset < 2 * hdr_size + 1024 * 1024 {
                    return Err(invalid("Data offset leaves too little room for keyslots"));
                }
                (data_offset - 2 * hdr_size) / 4096 * 4096
            }
            .min(json::MAX_KEYSLOTS_SIZE);
            if data_size <= data_offset {
                return Err(Error::new(
                    ErrorKind::DeviceSize,
                    format!("Device {} is too small", device.display()),
                ));
            }
            let avail = data_size - data_offset;
            let sector_size = match opts.sector_size {
                Some(s) if ![512, 1024, 2048, 4096].contains(&s) => {
                    return Err(invalid(format!(
                        "Sector size {s} is invalid (512, 1024, 2048 or 4096)"
                    )))
                }
                Some(s) => s,
                None if avail % 4096 == 0 => 4096,
                None => 512,
            };
            if data_offset % u64::from(sector_size) != 0 {
                return Err(invalid("Data offset is not aligned to the sector size"));
            }
            if avail < u64::from(sector_size) {
                return Err(Error::new(
                    ErrorKind::DeviceSize,
                    format!("Device {} is too small", device.display()),
                ));
            }
            let label = opts.label.clone().unwrap_or_default();
            let subsystem = opts.subsystem.clone().unwrap_or_default();
            if label.len() >= 48 || subsystem.len() >= 48 {
                return Err(invalid("Label and subsystem must be shorter than 48 bytes"));
            }
            let slot = opts.key_slot.unwrap_or(0);
            if slot >= json::MAX_KEYSLOTS {
                return Err(invalid(format!("Keyslot {slot} is invalid for LUKS2")));
            }
            let dg = keyslot::digest(
                opts.hash,
                &vk,
                &digest_salt,
                digest_iterations,
                opts.hash.digest_len(),
            );
            let mut digests = std::collections::BTreeMap::new();
            digests.insert(
                "0".to_string(),
                json::DigestJson {
                    kind: "pbkdf2".into(),
                    keyslots: vec![],
                    segments: vec!["0".into()],
                    hash: opts.hash.name().into(),
                    iterations: digest_iterations,
                    salt: json::b64_encode(&digest_salt),
                    digest: json::b64_encode(&dg),
                },
            );
            let mut segments = std::collections::BTreeMap::new();
            segments.insert(
                "0".to_string(),
                json::Segment {
                    kind: "crypt".into(),
                    offset: data_offset,
                    size: "dynamic".into(),
                    iv_tweak: 0,
                    encryption: opts.cipher.clone(),
                    sector_size,
                    extra: Default::default(),
                },
            );
            let meta = json::Metadata {
                keyslots: Default::default(),
                tokens: Default::default(),
                segments,
                digests,
                config: json::Config {
                    json_size: hdr_size - 4096,
                    keyslots_size,
                    flags: None,
                    requirements: None,
                    extra: Default::default(),
                },
            };
            let mut h = luks2::Header {
                bin: BinHeader {
                    primary: true,
                    hdr_size,
                    seqid: 0,
                    label,
                    checksum_alg: "sha256".into(),
                    salt: [0; 64],
                    uuid,
                    subsystem,
                    hdr_offset: 0,
                },
                meta,
                warnings: Vec::new(),
            };
            let meta_end = h.metadata_end();
            let wipe = if header.is_some() {
                meta_end
            } else {
                data_offset.max(meta_end)
            };
            zero_range(&mut f, 0, wipe)?;
            write_luks2(&mut f, &mut h)?;
            drop(f);
            let vol = Volume {
                header: Header::V2(h),
                meta_path: meta_path.to_path_buf(),
                detached: header.is_some(),
                meta_size: meta_size.max(wipe),
                data_size,
            };
            add_first_key(vol, &vk, passphrase, slot, opts, device, header)
        }
        v => Err(invalid(format!(
            "LUKS version {v} is not supported (1 or 2)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_keys() {
        let key = Zeroizing::new(vec![0xabu8; 32]);
        let opts = FormatOptions {
            volume_key: Some(key.clone()),
            ..FormatOptions::default()
        };
        let o = Opened {
            volume_key: key,
            keyslot: 0,
            cipher: "aes-xts-plain64".into(),
            sector_size: 512,
            iv_offset: 0,
            iv_large_sectors: false,
            payload_offset: 0,
            size: 512,
            uuid: String::new(),
        };
        for text in [format!("{opts:?}"), format!("{o:?}")] {
            assert!(
                !text.contains("171") && !text.contains("ab, ab") && !text.contains("abab"),
                "{text}"
            );
            assert!(text.contains("redacted"), "{text}");
        }
        assert!(o.table_line(Path::new("/dev/x")).contains(&"ab".repeat(32)));
    }

    #[test]
    fn allocate_area_first_fit() {
        let json = r#"{"keyslots":{},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512}},"digests":{},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;
        let mut meta: json::Metadata = serde_json::from_str(json).unwrap();
        assert_eq!(allocate_area(&meta, 16384, 258048).unwrap(), 32768);
        let ks: json::Keyslot = serde_json::from_value(serde_json::json!({
            "type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},
            "area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},
            "kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"AAAA"}}))
        .unwrap();
        meta.keyslots.insert("0".into(), ks.clone());
        assert_eq!(allocate_area(&meta, 16384, 258048).unwrap(), 32768 + 258048);
        let mut far = ks;
        far.area.offset = 32768 + 2 * 258048;
        meta.keyslots.insert("2".into(), far);
        assert_eq!(
            allocate_area(&meta, 16384, 258048).unwrap(),
            32768 + 258048,
            "fills the gap"
        );
        assert!(allocate_area(&meta, 16384, 1 << 30).is_err());
    }
}
