//! `reencrypt --encrypt`: a plaintext device gains LUKS2 encryption in
//! place, its header in a detached file or, with `--reduce-device-size`,
//! at the start of the device (the data shifted), in cryptsetup 2.6.1's
//! metadata.
//!
//! With a detached header:
//!
//! ```text
//!   format the header (data offset 0, keyslot 0, the new volume key)
//!   → rewrite it as an encryption in progress:
//!     keyslots: 0 the passphrase, 1 reencrypt {mode encrypt, direction forward}
//!     segments: 0 linear [0, dynamic)                  the data, plaintext
//!               1 linear [0, dynamic) backup-previous  the old layout
//!               2 crypt  [0, dynamic) backup-final     the new layout
//!     digests:  0 the volume key → keyslot 0, segment 2
//!               1 verification   → keyslot 1
//!     config.requirements.mandatory: [online-reencrypt-v2]
//! ```
//!
//! With `--reduce-device-size R` on a device of D bytes (the last R
//! bytes unused by the data; shift S = R/2, the data L = D - R bytes):
//!
//! ```text
//!   before   [ data 0..S | data S..L |        free R        ]
//!   init     the header is built in a temporary file; data 0..S is
//!            copied to D-S..D (the moved segment); the header (S bytes)
//!            is copied over 0..S
//!   steps    backward, one hotzone of S at a time: plaintext at x is
//!            encrypted to S + x; the last hotzone reads the moved segment
//!   after    [ header S | encrypted data L | rest ]   (D-S..D wiped)
//!
//!   segments: 0 linear D-S (S)  1 linear S (L-S)  2 backup-moved-segment
//!             3 backup-previous linear 0 (L)  4 backup-final crypt S dynamic
//!   keyslot 1: reencrypt {mode encrypt, direction backward,
//!              area {type datashift, shift_size S, 4096 bytes}}
//! ```
//!
//! [`run`](super::run) then moves the data as for any reencryption (the
//! plaintext side has no cipher). The layout was read off cryptsetup
//! 2.6.1's `--init-only` output on this machine and its
//! `src/utils_reencrypt.c` (`encrypt_luks2_init`), read as documentation.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crypto::Secret;
use serde_json::json;
use zeroize::{Zeroize, Zeroizing};

use super::header::RawHeader;
use super::state::{requirement, State};
use super::{free_digest, largest_gap, new_digest, read_header, MIN_ALIGNMENT};
use crate::error::{corrupt, invalid, unsupported, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::KdfRequest;
use crate::keyslot;
use crate::volume::keyslots::area_size_v2;
use crate::volume::{self, io, FormatOptions};
use crate::DeviceAccess;

/// What `--encrypt` creates (cryptsetup's `reencrypt --encrypt` options).
#[derive(Debug, Clone)]
pub struct EncryptRequest {
    /// Data cipher (default `aes-xts-plain64`).
    pub cipher: Option<String>,
    /// Volume key size in bits (default: 512 for XTS, 256 otherwise).
    pub key_bits: Option<u32>,
    /// Encryption sector size (default 512, as cryptsetup's `--encrypt`).
    pub sector_size: Option<u32>,
    /// `checksum` (default), `journal` or `none`.
    pub resilience: Option<String>,
    /// Checksum hash (default sha256).
    pub resilience_hash: Option<String>,
    /// Hash for the AF splitter and the digest (`--hash`).
    pub hash: Hash,
    /// The keyslot's KDF.
    pub kdf: KdfRequest,
    /// Keyslot of the passphrase (default 0).
    pub key_slot: Option<u32>,
    /// UUID (random if `None`).
    pub uuid: Option<String>,
    /// The detached header file (created when missing); `None`: the
    /// header goes inside the device, which needs `reduce`.
    pub header: Option<PathBuf>,
    /// `--reduce-device-size` in bytes: the data shifts by half of it.
    pub reduce: Option<u64>,
    /// How the device and the header are opened (locking, Ceph).
    pub access: DeviceAccess,
    /// With a detached `header`: the data offset in bytes (`--offset`;
    /// the data before it is left as it is). `None`: 0.
    pub offset: Option<u64>,
    /// The volume key from this file (its first key-size bytes, as
    /// cryptsetup's `luksFormat --volume-key-file`) instead of a random
    /// one.
    pub volume_key_file: Option<PathBuf>,
}

/// LUKS2 metadata size (one copy) cryptsetup uses for an encryption with
/// a data shift.
const SHIFT_METADATA: u64 = 16 << 10;

/// Starts the encryption of the plaintext `device`: formats the header
/// with `pass` in one keyslot and writes cryptsetup's metadata of an
/// encryption in progress, in the detached `header` (nothing of `device`
/// is written) or, with `reduce`, at the start of the device (its first
/// bytes moved to its end first). [`run`](super::run) moves the data.
pub fn init_encrypt(device: &Path, pass: &[u8], req: &EncryptRequest) -> Result<State> {
    let header = match (&req.header, req.reduce) {
        (Some(h), None) => h.clone(),
        (None, Some(r)) => return init_shift(device, pass, req, r),
        (None, None) => {
            return Err(invalid(
                "Encryption without detached header (--header) is not possible without data \
                 device size reduction (--reduce-device-size).",
            ))
        }
        (Some(_), Some(_)) => return Err(unsupported(
            "LUKS2 encryption with a detached header and a data shift is not supported by ucrypt.",
        )),
    };
    let resilience = match req.resilience.as_deref().unwrap_or("checksum") {
        r @ ("checksum" | "journal" | "none") => r,
        r if r.starts_with("datashift") => return Err(invalid(
            "Requested --resilience option cannot be applied to current reencryption operation.",
        )),
        r => return Err(invalid(format!("Unsupported resilience mode {r}"))),
    };
    let rhash = Hash::parse(req.resilience_hash.as_deref().unwrap_or("sha256"))?;
    let access = &req.access;
    refuse_luks(device, access)?;
    if header.exists() {
        refuse_luks(&header, access)?;
    }
    let sector_size = req.sector_size.unwrap_or(512);
    let offset = req.offset.unwrap_or(0);
    let (opts, vk) = plan(req, sector_size, offset)?;
    check_room(offset, vk.len())?;
    {
        // The header file exists before it is claimed (claims open it).
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&header)
            .map_err(|e| {
                Error::io(
                    format!("Cannot create header file {}.", header.display()),
                    e,
                )
            })?;
    }
    let _claim = io::claim(&[device, &header])?;
    volume::format(device, Some(&header), &opts, pass)?;
    let (mut h, _) = read_header(&header, access)?;
    encrypt_layout(&mut h, &vk, resilience, rhash, sector_size)?;
    let mut f = io::open_rw(&header, access)?;
    h.write(&mut *f)?;
    State::load(&h)?.ok_or_else(|| corrupt("Reencryption state vanished after init"))
}

/// The format options of the new volume (data offset `offset`; with a
/// data shift, no detached header, the header's size as cryptsetup sets
/// it) and its volume key (random, or read from `--volume-key-file`),
/// checked before anything is written.
fn plan(req: &EncryptRequest, sector_size: u32, offset: u64) -> Result<(FormatOptions, Secret)> {
    let mut opts = FormatOptions {
        version: 2,
        cipher: req
            .cipher
            .clone()
            .unwrap_or_else(|| "aes-xts-plain64".into()),
        key_bits: req.key_bits,
        sector_size: Some(sector_size),
        hash: req.hash,
        kdf: req.kdf.clone(),
        uuid: req.uuid.clone(),
        key_slot: req.key_slot,
        data_offset: Some(offset),
        access: req.access.clone(),
        ..Default::default()
    };
    if offset > 0 && req.header.is_none() {
        opts.metadata_size = Some(SHIFT_METADATA);
        opts.keyslots_size = Some(offset.saturating_sub(2 * SHIFT_METADATA));
    }
    // Everything that needs no device is refused before the first write.
    opts.check(true)?;
    let xts = opts
        .cipher
        .split('-')
        .nth(1)
        .is_some_and(|m| m.starts_with("xts"));
    let key_len = match opts.key_bits {
        Some(b) => (b / 8) as usize,
        None if xts => 64,
        None => 32,
    };
    let vk = match &req.volume_key_file {
        Some(f) => super::volume_key::read(f, key_len)?,
        None => Secret::from_slice(&keyslot::random(key_len)?),
    };
    opts.volume_key = Some(Zeroizing::new(vk.to_vec()));
    Ok((opts, vk))
}

/// `--reduce-device-size reduce`: the header inside the device, the data
/// shifted by `reduce / 2` (see the module comment).
fn init_shift(device: &Path, pass: &[u8], req: &EncryptRequest, reduce: u64) -> Result<State> {
    let sector_size = req.sector_size.unwrap_or(512);
    let shift = reduce / 2;
    let access = &req.access;
    refuse_luks(device, access)?;
    let dev_size = {
        let mut f = io::open_ro(device, access)?;
        io::device_size(&mut *f, device)?
    };
    if dev_size <= reduce {
        return Err(Error::new(
            ErrorKind::DeviceSize,
            format!("Device {} is too small.", device.display()),
        ));
    }
    let data = dev_size - reduce;
    if shift % u64::from(sector_size) != 0 {
        return Err(invalid(format!(
            "Data shift value is not aligned to encryption sector size ({sector_size} bytes)."
        )));
    }
    if shift % 4096 != 0 || data < shift || data % u64::from(sector_size) != 0 {
        return Err(unsupported(format!(
            "LUKS2 encryption with --reduce-device-size {reduce} on a device of {dev_size} bytes \
             is not supported by ucrypt (it needs a multiple of 8 KiB, at most the data left, \
             and data in whole sectors)."
        )));
    }
    let (opts, vk) = plan(req, sector_size, shift)?;
    let key_len = vk.len();
    if shift < 2 * SHIFT_METADATA + area_size_v2(key_len) + 4096 {
        return Err(Error::new(ErrorKind::SlotBusy, "No space for new keyslot."));
    }
    let _claim = io::claim(&[device])?;
    // The header is built in a temporary file (as cryptsetup does), so
    // nothing of the device is written before it is complete.
    let tmp = TempHeader::create(device)?;
    volume::format(device, Some(&tmp.0), &opts, pass)?;
    let (mut h, _) = read_header(&tmp.0, access)?;
    shift_layout(&mut h, &vk, dev_size, data, shift)?;
    h.write(&mut *io::open_rw(&tmp.0, access)?)?;
    let mut image = vec![0u8; shift as usize];
    io::read_exact_at(&mut *io::open_ro(&tmp.0, access)?, 0, &mut image)?;
    // The data's first `shift` bytes go to the end of the device, then
    // the header over them.
    let mut f = io::open_rw(device, access)?;
    let mut buf = vec![0u8; (1 << 20).min(shift as usize)];
    let mut at = 0;
    while at < shift {
        let n = (buf.len() as u64).min(shift - at) as usize;
        io::read_exact_at(&mut *f, at, &mut buf[..n])?;
        io::write_at(&mut *f, dev_size - shift + at, &buf[..n])?;
        at += n as u64;
    }
    buf.zeroize();
    io::sync(&*f)?;
    super::crash::point();
    io::write_at(&mut *f, 0, &image)?;
    io::sync(&*f)?;
    drop(f);
    let (h, _) = read_header(device, access)?;
    State::load(&h)?.ok_or_else(|| corrupt("Reencryption state vanished after init"))
}

/// With a detached header and a data offset (`--offset`), the room
/// cryptsetup's format leaves before it (two 16 KiB header copies, then
/// the keyslots area up to the offset) must hold the offset's minimum
/// and the new keyslot; refused here, before the header file is written,
/// in cryptsetup's words (cryptsetup writes the header first).
fn check_room(offset: u64, key_len: usize) -> Result<()> {
    const MIN: u64 = 2 * 16384;
    if offset == 0 {
        return Ok(());
    }
    if offset < MIN {
        return Err(invalid("Requested data offset is too small."));
    }
    if offset - MIN < area_size_v2(key_len) {
        return Err(Error::new(ErrorKind::SlotBusy, "No space for new keyslot."));
    }
    Ok(())
}

/// The temporary header file of an encryption with a data shift, removed
/// when dropped.
struct TempHeader(PathBuf);

impl TempHeader {
    fn create(device: &Path) -> Result<Self> {
        let uuid = keyslot::random_uuid()?;
        let path = std::env::temp_dir().join(format!("LUKS2-temp-{uuid}.new"));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                Error::io(
                    format!(
                        "Cannot create temporary header file {} for {}.",
                        path.display(),
                        device.display()
                    ),
                    e,
                )
            })?;
        Ok(TempHeader(path))
    }
}

impl Drop for TempHeader {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The freshly formatted header's one crypt segment (its JSON, to become
/// the final segment) and the id of the digest bound to it.
fn formatted_segment(h: &RawHeader) -> Result<(String, serde_json::Value)> {
    let did = h
        .meta
        .segment_digest()
        .map(|(i, _)| i.clone())
        .ok_or_else(|| corrupt("LUKS2 segment has no digest"))?;
    let fin = h
        .obj("segments")
        .get(h.meta.segment().0.as_str())
        .cloned()
        .ok_or_else(|| corrupt("segment"))?;
    Ok((did, fin))
}

/// Rewrites a header formatted with data offset `shift` as an
/// encryption with a data shift in progress (cryptsetup's layout).
fn shift_layout(
    h: &mut RawHeader,
    vk: &Secret,
    dev_size: u64,
    data: u64,
    shift: u64,
) -> Result<()> {
    let (did, mut fin) = formatted_segment(h)?;
    let rslot = free_slot(h)?;
    let (alo, asz) = largest_gap(h);
    if asz < 4096 {
        return Err(Error::new(ErrorKind::SlotBusy, "No space for new keyslot."));
    }
    h.obj_mut("keyslots").insert(
        rslot.to_string(),
        json!({"area": {"offset": alo.to_string(), "size": "4096", "type": "datashift",
                        "shift_size": shift.to_string()},
               "type": "reencrypt", "key_size": 1, "mode": "encrypt",
               "direction": "backward", "priority": 0}),
    );
    fin["flags"] = json!(["backup-final"]);
    let moved = (dev_size - shift).to_string();
    let mut segs = vec![json!({"type": "linear", "offset": moved, "size": shift.to_string()})];
    if data > shift {
        segs.push(json!({"type": "linear", "offset": shift.to_string(),
                         "size": (data - shift).to_string()}));
    }
    segs.push(
        json!({"type": "linear", "offset": moved, "size": shift.to_string(),
                     "flags": ["backup-moved-segment"]}),
    );
    segs.push(
        json!({"type": "linear", "offset": "0", "size": data.to_string(),
                     "flags": ["backup-previous"]}),
    );
    segs.push(fin);
    let fin_id = (segs.len() - 1).to_string();
    let m = h.obj_mut("segments");
    m.clear();
    for (i, v) in segs.into_iter().enumerate() {
        m.insert(i.to_string(), v);
    }
    super::set_digest_segments(h, &did, &[fin_id.as_str()]);
    finish_layout(h, rslot, vk)
}

/// The requirement and the verification digest every encryption's
/// metadata ends with.
fn finish_layout(h: &mut RawHeader, rslot: u32, vk: &Secret) -> Result<()> {
    h.obj_mut("config").insert(
        "requirements".into(),
        json!({"mandatory": ["online-reencrypt-v2"]}),
    );
    let vdata = Zeroizing::new(State::verification_data(h, &rslot.to_string(), 2, &[], vk)?);
    let vid = free_digest(h);
    h.obj_mut("digests")
        .insert(vid, new_digest(&vdata, &[rslot.to_string()], &[])?);
    Ok(())
}

/// The first free keyslot id.
fn free_slot(h: &RawHeader) -> Result<u32> {
    (0..crate::luks2::json::MAX_KEYSLOTS)
        .find(|s| !h.obj("keyslots").contains_key(&s.to_string()))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::SlotBusy,
                "Not enough free keyslots for reencryption.",
            )
        })
}

/// Refuses a `device` that already carries a LUKS header as cryptsetup
/// does.
fn refuse_luks(device: &Path, access: &DeviceAccess) -> Result<()> {
    let name = device;
    let Ok((h, _)) = read_header(device, access) else {
        return match crate::ops::probe(device, access) {
            Ok(_) => Err(Error::new(
                ErrorKind::AlreadyLuks,
                format!(
                    "Device {} is already LUKS device. Aborting operation.",
                    name.display()
                ),
            )),
            Err(_) => Ok(()),
        };
    };
    let in_reenc = requirement(&h).ok().flatten().is_some();
    Err(Error::new(
        ErrorKind::AlreadyLuks,
        if in_reenc {
            format!(
                "Device {} is already in LUKS reencryption. Aborting operation.",
                name.display()
            )
        } else {
            format!(
                "Device {} is already LUKS device. Aborting operation.",
                name.display()
            )
        },
    ))
}

/// Rewrites a freshly formatted header (one crypt segment at offset 0
/// bound to digest 0) as an encryption in progress.
fn encrypt_layout(
    h: &mut RawHeader,
    vk: &Secret,
    resilience: &str,
    rhash: Hash,
    sector_size: u32,
) -> Result<()> {
    let (did, mut fin) = formatted_segment(h)?;
    let offset = h.meta.segment().1.offset.to_string();
    let rslot = free_slot(h)?;
    let (alo, asz) = largest_gap(h);
    if asz == 0 && resilience != "none" {
        return Err(Error::new(
            ErrorKind::SlotBusy,
            "No space left in the LUKS2 keyslots area",
        ));
    }
    let mut area = json!({"offset": alo.to_string(), "size": asz.to_string(), "type": resilience});
    if resilience == "checksum" {
        area["hash"] = json!(rhash.name());
        area["sector_size"] = json!(MIN_ALIGNMENT.max(u64::from(sector_size)));
    }
    h.obj_mut("keyslots").insert(
        rslot.to_string(),
        json!({"area": area, "type": "reencrypt", "key_size": 1, "mode": "encrypt",
               "direction": "forward", "priority": 0}),
    );
    fin["flags"] = json!(["backup-final"]);
    let segs = h.obj_mut("segments");
    segs.clear();
    segs.insert(
        "0".into(),
        json!({"type": "linear", "offset": offset, "size": "dynamic"}),
    );
    segs.insert(
        "1".into(),
        json!({"type": "linear", "offset": offset, "size": "dynamic", "flags": ["backup-previous"]}),
    );
    segs.insert("2".into(), fin);
    super::set_digest_segments(h, &did, &["2"]);
    finish_layout(h, rslot, vk)
}
