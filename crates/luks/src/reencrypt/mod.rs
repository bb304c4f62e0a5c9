//! LUKS2 reencryption (a new volume key, optionally a new cipher, key
//! size or sector size), decryption (`--decrypt`: detached header, or
//! the header inside the device exported and the data moved down,
//! `decrypt_shift.rs`) and
//! encryption (`--encrypt`: detached header, or the header inside the
//! device with the data shifted, `encrypt.rs`) offline, in cryptsetup's
//! own metadata format, so either tool resumes what the other started.
//!
//! ```text
//!   status()  header → Option<State>          (state.rs: strict load,
//!   run()     init → [recover] → steps → finalize  verification digest)
//!   tables()  a header mid-reencryption → one dm-crypt table per segment
//!   fence     the same loop online: a `Fence` told around each hotzone
//!   test_passphrase()  the keys in use checked, nothing resolved (test_key.rs)
//! ```
//!
//! `--device-size` runs over the data's first bytes only (`size.rs`,
//! cryptsetup's fixed-length mode); `--volume-key-file` gives the new
//! key (`volume_key.rs`).
//!
//! One step reencrypts a hotzone of the data area, from the start
//! (direction forward; a decryption goes backward, from the end, and so
//! does an encryption with a data shift, each hotzone written `shift`
//! bytes further on than it was read, its first `shift` bytes read from
//! the moved segment at the end of the device; a decryption with a data
//! shift goes forward from its moved segment's end, each hotzone written
//! `shift` bytes before it was read, the moved segment last, in place,
//! protected as checksum or journal): read
//! the old ciphertext; protect it (checksum: a hash per block in the
//! reencrypt keyslot's area; journal: the ciphertext itself there; none:
//! nothing; datashift: nothing, the source stays intact), write the
//! header naming the hotzone (`in-reencryption`),
//! decrypt with the old key and encrypt with the new one (a `linear`
//! side, plaintext, skips its cipher), write and sync the data, then
//! write the header that moves the boundary past it. Every header write
//! is both copies, each synced (`header.rs`). A crash between the two
//! header writes leaves the hotzone segment in the header; the next run
//! repairs it first ([`recover`]) exactly as cryptsetup's
//! `reencrypt_recover_segment` decides which blocks are still old. With
//! `none` the header is written only when the run stops (cryptsetup's
//! behaviour: fast, unsafe).
//!
//! The data mover (`mover.rs`) moves a hotzone in 1 MiB pieces spread
//! over the cores (positioned reads and writes on the data device, the
//! hashing and [`crypto::SectorCrypt`] per piece), each phase above done
//! for every piece before the next begins. Hand-written from
//! cryptsetup's on-disk format (`docs/on-disk-format-luks2.pdf`,
//! `lib/luks2/luks2_reencrypt*.c` read as documentation); no crate
//! implements it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crypto::table::{Linear, Table, Target};
use crypto::Secret;
use serde_json::{json, Value};
use zeroize::Zeroizing;

use crate::error::{corrupt, invalid, unsupported, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::{Kdf, KdfRequest};
use crate::keyslot::{self, material_len};
use crate::luks2::json::{self, Segment};
use crate::volume::io::{self, open_ro, open_rw, read_exact_at, sync};
use crate::volume::keyslots::{allocate_area, area_size_v2, SealV2};
use crate::DeviceAccess;

pub(crate) mod crash;
mod decrypt_shift;
mod encrypt;
pub mod fence;
mod header;
mod lock;
pub mod luks1;
mod luks1_fake;
mod mover;
mod resilience;
mod size;
mod state;
mod test_key;
mod upgrade;
mod volume_key;

pub use decrypt_shift::{init_decrypt_shift, init_decrypt_shift_held, DecryptShiftRequest};
pub use encrypt::{init_encrypt, EncryptRequest};
pub use fence::{Fence, Online, Unfenced};
use header::RawHeader;
use mover::Mover;
pub use resilience::{set_resilience, set_resilience_held};
pub use size::{check_device_size, online_size};
pub use state::{Mode, Resilience, State};
pub use test_key::{check_data_device, test_passphrase};
pub use upgrade::{needs_upgrade, upgrade};

/// cryptsetup's largest hotzone (1 GiB).
pub const MAX_HOTZONE: u64 = 1 << 30;
/// cryptsetup's hotzone with resilience `none` (20 MiB) when no
/// `--hotzone-size` is given.
pub const DEFAULT_NONE_HOTZONE: u64 = 20 << 20;
/// The block the checksum resilience hashes and every hotzone aligns to,
/// at least: the file system / device block cryptsetup finds on an image
/// file (4096), or a larger encryption sector.
const MIN_ALIGNMENT: u64 = 4096;

/// What a new reencryption changes (`--cipher`, `--key-size`,
/// `--sector-size`, `--resilience`, `--resilience-hash`, the new
/// keyslots' KDF).
#[derive(Debug, Clone, Default)]
pub struct InitRequest {
    /// New data cipher (default: the current one).
    pub cipher: Option<String>,
    /// New volume key size in bits (default: the current one; with a new
    /// cipher, cryptsetup's default for that cipher).
    pub key_bits: Option<u32>,
    /// New encryption sector size (default: the current one).
    pub sector_size: Option<u32>,
    /// `checksum` (default), `journal` or `none`.
    pub resilience: Option<String>,
    /// Checksum hash (default sha256).
    pub resilience_hash: Option<String>,
    /// The new keyslots' KDF; `None` copies each old keyslot's KDF, as
    /// cryptsetup does without `--pbkdf*` options.
    pub kdf: Option<KdfRequest>,
    /// `--decrypt`: the data becomes plaintext (a detached header only,
    /// data offset 0, as cryptsetup 2.6.1 requires); the default is a
    /// reencryption.
    pub decrypt: bool,
    /// The detached header (`--header`); `None`: on the device.
    pub header: Option<PathBuf>,
    /// `--volume-key-file`: the new volume key from this file
    /// (`volume_key.rs`); `None`: a random one.
    pub volume_key_file: Option<PathBuf>,
    /// How the header and data devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// How to run the data steps.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `--hotzone-size` in bytes (0: the resilience's maximum).
    pub hotzone: u64,
    /// The detached header (`--header`); `None`: on the device.
    pub header: Option<PathBuf>,
    /// `--device-size` in bytes: only the data's first bytes are
    /// reencrypted (cryptsetup's fixed-length mode, [`State::fixed_size`]);
    /// `None`: up to the device's end.
    pub device_size: Option<u64>,
    /// How the header and data devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Initialized only.
    Initialized,
    /// Every byte reencrypted, the old key and its keyslots removed.
    Finished,
    /// Stopped between two hotzones (`stop` set); resumable.
    Interrupted,
}

/// The fuzzing entry point: `data` as a header image, its reencryption
/// state loaded (and its progress and hotzone asked).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_state(data: &[u8]) {
    let mut c = std::io::Cursor::new(data.to_vec());
    if let Ok(h) = RawHeader::read(&mut c, data.len() as u64) {
        if let Ok(Some(st)) = State::load(&h) {
            let total = st.old.fixed_size().ok().flatten().unwrap_or(1 << 20);
            let _ = (st.progress_of(total), st.hotzone(), st.progress());
        }
    }
}

/// The reencryption state of `device`'s header, `None` when not in
/// reencryption (the header opened as `access` says). Refuses metadata
/// ucrypt cannot act on, with the reason.
pub fn status(device: &Path, access: &DeviceAccess) -> Result<Option<State>> {
    let (h, _) = read_header(device, access)?;
    State::load(&h)
}

/// Starts a reencryption of `device` with the passphrase `pass` (the
/// keyslot it opens — `key_slot` only, when given — gets a twin for the
/// new key with the same passphrase), writing cryptsetup's metadata.
/// Without `key_slot` a reencryption needs exactly one active keyslot
/// (a decryption opens any): [`init_slots`] renews several.
/// Nothing is reencrypted yet; [`run`] does that.
pub fn init(device: &Path, pass: &[u8], key_slot: Option<u32>, req: &InitRequest) -> Result<State> {
    let meta = req.header.as_deref().unwrap_or(device);
    let _claim = io::claim(&[device, meta])?;
    init_held(device, pass, key_slot, req)
}

/// [`init`] on a device its caller holds (the daemon serving it).
pub fn init_held(
    device: &Path,
    pass: &[u8],
    key_slot: Option<u32>,
    req: &InitRequest,
) -> Result<State> {
    init_with(device, Unlock::One { pass, key_slot }, req)
}

/// The passphrase of one keyslot a reencryption renews.
#[derive(Clone, Copy)]
pub struct SlotPassphrase<'a> {
    /// The keyslot.
    pub slot: u32,
    /// Its passphrase.
    pub pass: &'a [u8],
}

impl std::fmt::Debug for SlotPassphrase<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPassphrase")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// Starts a reencryption renewing each keyslot of `slots` (in their
/// order; the first is the one cryptsetup records as the old one): each
/// passphrase must open its keyslot, and each gets a twin in a free
/// keyslot sealing the new key with that passphrase (the old keyslot's
/// KDF, priority and tokens), as cryptsetup does for every active
/// keyslot without `--key-slot`. The keyslots of the old key go when the
/// reencryption finishes, renewed or not. Not for a decryption.
pub fn init_slots(device: &Path, slots: &[SlotPassphrase<'_>], req: &InitRequest) -> Result<State> {
    let meta = req.header.as_deref().unwrap_or(device);
    let _claim = io::claim(&[device, meta])?;
    init_slots_held(device, slots, req)
}

/// [`init_slots`] on a device its caller holds (the daemon serving it).
pub fn init_slots_held(
    device: &Path,
    slots: &[SlotPassphrase<'_>],
    req: &InitRequest,
) -> Result<State> {
    if req.decrypt {
        return Err(invalid("A decryption renews no keyslot"));
    }
    init_with(device, Unlock::Each(slots), req)
}

/// The keyslots a reencryption of the volume whose header is on `meta`
/// asks a passphrase for when all are renewed: those bound to the data
/// segment's key (cryptsetup's `CRYPT_SLOT_ACTIVE`), in slot order.
pub fn active_slots(meta: &Path, access: &DeviceAccess) -> Result<Vec<u32>> {
    let (h, _) = read_header(meta, access)?;
    Ok(h.meta.segment_keyslots())
}

/// The keyslots of the new volume key of the reencryption the header on
/// `meta` records, in slot order (none when it records none): what its
/// start created.
pub fn new_key_slots(meta: &Path, access: &DeviceAccess) -> Result<Vec<u32>> {
    let (h, _) = read_header(meta, access)?;
    let Some(st) = State::load(&h)? else {
        return Ok(Vec::new());
    };
    let mut slots: Vec<u32> = h
        .meta
        .digests
        .get(&st.new_digest)
        .map(|d| d.keyslots.iter().filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_default();
    slots.sort_unstable();
    Ok(slots)
}

/// Whether `pass` opens keyslot `slot` of the volume whose header is on
/// `meta`, to the data segment's key (cryptsetup's check before it takes
/// the passphrase of a keyslot to renew). A wrong one is
/// [`ErrorKind::WrongPassphrase`].
pub fn check_slot(meta: &Path, access: &DeviceAccess, slot: u32, pass: &[u8]) -> Result<()> {
    let (h, _) = read_header(meta, access)?;
    let did = h
        .meta
        .segment_digest()
        .map(|(i, _)| i.clone())
        .ok_or_else(|| corrupt("LUKS2 segment has no digest"))?;
    unlock_any(&h, meta, access, pass, &[slot], &[did.as_str()])
        .map(|_| ())
        .map_err(no_key)
}

/// A wrong passphrase in cryptsetup's words (`tools_passphrase_msg`).
fn no_key(e: Error) -> Error {
    match e.kind() {
        ErrorKind::WrongPassphrase => Error::new(
            ErrorKind::WrongPassphrase,
            "No key available with this passphrase.",
        ),
        _ => e,
    }
}

/// The passphrases a new reencryption opens the old key with.
enum Unlock<'a> {
    /// One passphrase: for `key_slot`, or the only active keyslot (any
    /// keyslot for a decryption).
    One {
        pass: &'a [u8],
        key_slot: Option<u32>,
    },
    /// One passphrase per keyslot, each renewed.
    Each(&'a [SlotPassphrase<'a>]),
}

fn init_with(device: &Path, unlock: Unlock<'_>, req: &InitRequest) -> Result<State> {
    let meta = req.header.as_deref().unwrap_or(device);
    let access = &req.access;
    let (mut h, _) = read_header(meta, access)?;
    if State::load(&h)?.is_some() {
        return Err(invalid(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    let seg = h.meta.segment().1.clone();
    if h.meta.segments.len() != 1 || seg.kind != "crypt" {
        return Err(unsupported(
            "LUKS2 reencryption needs a volume with one crypt segment",
        ));
    }
    if req.decrypt && req.header.is_none() {
        return Err(invalid("LUKS2 decryption requires --header option."));
    }
    if req.decrypt && seg.offset != 0 {
        return Err(invalid(
            "LUKS2 decryption is supported with detached header device only (with data offset set to 0).",
        ));
    }
    let sid = h.meta.segment().0.clone();
    let (old_did, _) = h
        .meta
        .segment_digest()
        .map(|(i, d)| (i.clone(), d.clone()))
        .ok_or_else(|| corrupt("LUKS2 segment has no digest"))?;
    let bound = h.meta.segment_keyslots();
    // The keyslots renewed, with their passphrases, and the old key.
    let (renewed, old_vk): (Vec<SlotPassphrase<'_>>, Secret) = match unlock {
        Unlock::One { pass, key_slot } => {
            let candidates: Vec<u32> = match key_slot {
                Some(s) => vec![s],
                None => bound.clone(),
            };
            if key_slot.is_none() && bound.len() > 1 && !req.decrypt {
                return Err(invalid(
                    "Key file can be used only with --key-slot or with exactly one key slot active.",
                ));
            }
            let (slot, (_, vk)) =
                unlock_any(&h, meta, access, pass, &candidates, &[old_did.as_str()])
                    .map_err(|e| if key_slot.is_none() { no_key(e) } else { e })?;
            if !req.decrypt {
                check_free_slots(&h, 1)?;
            }
            (vec![SlotPassphrase { slot, pass }], vk)
        }
        Unlock::Each(slots) => {
            let mut vk = None;
            for s in slots {
                let (_, (_, k)) =
                    unlock_any(&h, meta, access, s.pass, &[s.slot], &[old_did.as_str()])
                        .map_err(no_key)?;
                vk = Some(k);
            }
            let vk = vk.ok_or_else(|| invalid("No keyslot to renew"))?;
            check_free_slots(&h, slots.len())?;
            (slots.to_vec(), vk)
        }
    };

    // The new layout (a decryption has none: plaintext).
    let (cipher, sector_size, new_vk) = if req.decrypt {
        (String::new(), seg.sector_size, Secret::from_slice(&[]))
    } else {
        new_layout(&seg, old_vk.len(), req)?
    };
    if req.volume_key_file.is_some() {
        let changed = cipher != seg.encryption
            || new_vk.len() != old_vk.len()
            || sector_size != seg.sector_size;
        volume_key::check_new(&old_vk, &new_vk, changed)?;
    }
    let resilience = match req.resilience.as_deref().unwrap_or("checksum") {
        "checksum" => "checksum",
        "journal" => "journal",
        "none" => "none",
        r if r.starts_with("datashift") => return Err(invalid(
            "Requested --resilience option cannot be applied to current reencryption operation.",
        )),
        r => return Err(invalid(format!("Unsupported resilience mode {r}"))),
    };
    let rhash = Hash::parse(req.resilience_hash.as_deref().unwrap_or("sha256"))?;

    let mut f = open_rw(meta, access)?;
    let new_did = if req.decrypt {
        String::new()
    } else {
        let mut new_slots = Vec::new();
        for s in &renewed {
            let old_ks = meta_slot(&h, s.slot)?;
            new_slots.push(new_keyslot(
                &mut h, &mut *f, old_ks, s.slot, s.pass, &new_vk, req,
            )?);
        }
        // One digest binds every twin, as cryptsetup's
        // `CRYPT_VOLUME_KEY_DIGEST_REUSE` does.
        let new_did = free_digest(&h);
        h.obj_mut("digests")
            .insert(new_did.clone(), new_digest(&new_vk, &new_slots, &[])?);
        new_did
    };
    let free_slot = |h: &RawHeader| {
        (0..json::MAX_KEYSLOTS)
            .find(|s| !h.obj("keyslots").contains_key(&s.to_string()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::SlotBusy,
                    "Not enough free keyslots for reencryption.",
                )
            })
    };

    // The reencrypt keyslot: the largest free gap of the keyslots area.
    let rslot = free_slot(&h)?;
    let (alo, asz) = largest_gap(&h);
    if asz == 0 && resilience != "none" {
        return Err(Error::new(
            ErrorKind::SlotBusy,
            "No space left in the LUKS2 keyslots area",
        ));
    }
    let align = MIN_ALIGNMENT
        .max(u64::from(seg.sector_size))
        .max(u64::from(sector_size));
    let mut area = json!({"offset": alo.to_string(), "size": asz.to_string(), "type": resilience});
    if resilience == "checksum" {
        area["hash"] = json!(rhash.name());
        area["sector_size"] = json!(align);
    }
    h.obj_mut("keyslots").insert(
        rslot.to_string(),
        json!({"area": area, "type": "reencrypt", "key_size": 1,
               "mode": if req.decrypt { "decrypt" } else { "reencrypt" },
               "direction": if req.decrypt { "backward" } else { "forward" }, "priority": 0}),
    );

    // Segments: 0 the data (old), 1 backup-previous, 2 backup-final.
    let old_v = h
        .obj("segments")
        .get(&sid)
        .cloned()
        .ok_or_else(|| corrupt("segment"))?;
    let mut prev = old_v.clone();
    prev["flags"] = json!(["backup-previous"]);
    let fin = if req.decrypt {
        json!({"type": "linear", "offset": seg.offset.to_string(), "size": seg.size,
               "flags": ["backup-final"]})
    } else {
        let mut fin = old_v.clone();
        fin["encryption"] = json!(cipher);
        fin["sector_size"] = json!(sector_size);
        fin["flags"] = json!(["backup-final"]);
        fin
    };
    let segs = h.obj_mut("segments");
    segs.clear();
    segs.insert("0".into(), old_v);
    segs.insert("1".into(), prev);
    segs.insert("2".into(), fin);
    set_digest_segments(&mut h, &old_did, &["0", "1"]);
    set_digest_segments(&mut h, &new_did, &["2"]);
    let cfg = h.obj_mut("config");
    let req_obj = cfg.entry("requirements").or_insert_with(|| json!({}));
    if !req_obj.is_object() {
        *req_obj = json!({});
    }
    let mand = req_obj
        .as_object_mut()
        .map(|o| o.entry("mandatory").or_insert_with(|| json!([])));
    if let Some(m) = mand {
        if !m.is_array() {
            *m = json!([]);
        }
        if let Some(a) = m.as_array_mut() {
            a.push(json!("online-reencrypt-v2"));
        }
    }
    // The verification digest over keys and metadata.
    let vdata = Zeroizing::new(State::verification_data(
        &h,
        &rslot.to_string(),
        2,
        &old_vk,
        &new_vk,
    )?);
    let vid = free_digest(&h);
    h.obj_mut("digests")
        .insert(vid, new_digest(&vdata, &[rslot.to_string()], &[])?);
    h.write(&mut *f)?;
    State::load(&h)?.ok_or_else(|| corrupt("Reencryption state vanished after init"))
}

/// The new cipher, sector size and a fresh volume key of a reencryption.
fn new_layout(seg: &Segment, old_len: usize, req: &InitRequest) -> Result<(String, u32, Secret)> {
    let cipher = req.cipher.clone().unwrap_or_else(|| seg.encryption.clone());
    let key_len = match req.key_bits {
        Some(b) if b % 8 != 0 || b == 0 || b > json::MAX_KEY_SIZE * 8 => {
            return Err(invalid(format!("Invalid key size {b}.")))
        }
        Some(b) => (b / 8) as usize,
        // A new cipher without `--key-size` gets cryptsetup's default
        // size for it (`get_adjusted_key_size`: 256 bits, 512 for XTS),
        // not the old key's size.
        None if cipher != seg.encryption => {
            if cipher
                .split('-')
                .nth(1)
                .is_some_and(|m| m.starts_with("xts"))
            {
                64
            } else {
                32
            }
        }
        None => old_len,
    };
    let sector_size = req.sector_size.unwrap_or(seg.sector_size);
    if ![512, 1024, 2048, 4096].contains(&sector_size) || seg.offset % u64::from(sector_size) != 0 {
        return Err(invalid(format!(
            "Unsupported encryption sector size {sector_size}."
        )));
    }
    let new_vk = match &req.volume_key_file {
        Some(f) => volume_key::read(f, key_len)?,
        None => Secret::from_slice(&keyslot::random(key_len)?),
    };
    // The new cipher must be one the data path can run.
    crypto::SectorCrypt::new(&crypto::CryptConfig {
        cipher: cipher.clone(),
        key: Zeroizing::new(new_vk.to_vec()),
        iv_offset: 0,
        sector_size,
        iv_large_sectors: false,
    })
    .map_err(|e| {
        Error::crypto(
            ErrorKind::InvalidArgument,
            format!("Cipher {cipher} is not supported"),
            e,
        )
    })?;
    Ok((cipher, sector_size, new_vk))
}

/// The keyslot `slot` opened, as the new keyslot's model.
fn meta_slot(h: &RawHeader, slot: u32) -> Result<json::Keyslot> {
    h.meta
        .keyslots
        .get(&slot.to_string())
        .cloned()
        .ok_or_else(|| corrupt(format!("Keyslot {slot} vanished")))
}

/// Seals `new_vk` with `pass` in a free keyslot like `old_ks` (slot
/// `slot`; its tokens name the new one too), bound to no digest yet;
/// returns the new keyslot's id.
fn new_keyslot(
    h: &mut RawHeader,
    f: &mut dyn io::Device,
    old_ks: json::Keyslot,
    slot: u32,
    pass: &[u8],
    new_vk: &Secret,
    req: &InitRequest,
) -> Result<String> {
    let key_len = new_vk.len();
    let kdf = match &req.kdf {
        Some(k) => k.clone(),
        None => copy_kdf(&old_ks.kdf.kdf()?, Hash::parse(&old_ks.af.hash)?),
    };
    let free_slot = |h: &RawHeader, skip: &[u32]| {
        (0..json::MAX_KEYSLOTS)
            .find(|s| !skip.contains(s) && !h.obj("keyslots").contains_key(&s.to_string()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::SlotBusy,
                    "Not enough free keyslots for reencryption.",
                )
            })
    };
    let new_slot = free_slot(h, &[])?;
    let area_size = area_size_v2(key_len);
    let offset = allocate_area(&h.meta, h.bin.hdr_size, area_size)?;
    // The area cipher is the unlocked keyslot's, as cryptsetup's
    // `set_keyslot_params` takes it (`crypt_keyslot_get_encryption` of
    // that keyslot), not the new data cipher; `cipher_null` becomes the
    // default keyslot cipher.
    let (area_cipher, area_key_size) = if old_ks.area.encryption.starts_with("cipher_null") {
        ("aes-xts-plain64".to_string(), 64)
    } else {
        (
            old_ks.area.encryption.clone(),
            old_ks.area.key_size as usize,
        )
    };
    let sealed = SealV2 {
        vk: new_vk,
        af_hash: kdf.hash.name().to_string(),
        cipher: area_cipher,
        area_key_size,
        offset,
        area_size,
    };
    let ks = sealed.write(f, pass, &kdf, old_ks.extra.clone())?;
    let ks_value = serde_json::to_value(&ks)
        .map_err(|e| crate::error::json_error(ErrorKind::Corrupt, "Cannot serialize keyslot", e))?;
    h.obj_mut("keyslots").insert(new_slot.to_string(), ks_value);
    h.meta.keyslots.insert(new_slot.to_string(), ks);
    for t in h.obj_mut("tokens").values_mut() {
        if let Some(k) = t.get_mut("keyslots").and_then(Value::as_array_mut) {
            if k.iter().any(|x| x.as_str() == Some(&slot.to_string())) {
                k.push(Value::String(new_slot.to_string()));
            }
        }
    }
    Ok(new_slot.to_string())
}

/// cryptsetup's count of keyslots a reencryption renewing `renewed`
/// keyslots needs (`_check_luks2_keyslots`): every keyslot there is, a
/// twin for each renewed one and the reencrypt keyslot must fit.
fn check_free_slots(h: &RawHeader, renewed: usize) -> Result<()> {
    let used = h.obj("keyslots").len();
    if used + renewed + 1 > json::MAX_KEYSLOTS as usize {
        return Err(Error::new(
            ErrorKind::SlotBusy,
            "Not enough free keyslots for reencryption.",
        ));
    }
    Ok(())
}

/// Resumes (or runs from its start) the reencryption of `device`,
/// unlocking the old and the new key with `pass`: repairs a hotzone a
/// crash left, reencrypts hotzone after hotzone until done or until
/// `stop` is set (checked between hotzones), then finalizes as cryptsetup
/// does. `progress(done, total)` is called after each hotzone.
pub fn run(
    device: &Path,
    pass: &[u8],
    key_slot: Option<u32>,
    opts: &RunOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Outcome> {
    let meta = opts.header.as_deref().unwrap_or(device);
    let _claim = io::claim(&[device, meta])?;
    Online::unlock_at(device, meta, &opts.access, pass, key_slot)?.run(
        opts,
        stop,
        progress,
        &mut Unfenced,
    )
}

/// [`run`]'s loop over an unlocked reencryption, `fence` told around each
/// hotzone (see [`fence`]).
fn run_loop(
    o: Online,
    opts: &RunOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
    fence: &mut dyn Fence,
) -> Result<Outcome> {
    let mut o = o;
    // Without --device-size a run goes to the device's end, even one a
    // fixed-size run stopped (cryptsetup resumes it so).
    o.state.fixed_size = match opts.device_size {
        Some(size) => Some(size::check(&o.state, o.dev_size, size)?),
        None => None,
    };
    let device = o.device.as_path();
    let meta = o.meta.as_path();
    let access = &o.access;
    let st = &o.state;
    let mut h = o.header.clone();
    let mut m = Mover::new(
        device,
        meta,
        o.dev_size,
        st,
        &o.old_key,
        &o.new_key,
        opts.hotzone,
        access,
    )?;
    let mut done = st.progress_of(m.size);
    if let Some((off, len)) = st.hotzone() {
        fence.hold(off, len)?;
        m.recover(&h, st, off, len)?;
        done = m.done_after(off, len);
        post_segments_mem(&mut h, st, done, m.size)?;
        if done < m.size {
            h.write(&mut *open_rw(meta, access)?)?;
            advance(fence, &o, done, m.size)?;
        }
    }
    progress(done, m.size);
    let mut dirty = false;
    while done < m.size {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let len = m.next_len(done);
        let off = m.place(done, len);
        fence.hold(off, len)?;
        m.step(&mut h, st, done, len)?;
        done += len;
        if st.resilience == Resilience::None {
            dirty = true;
            post_segments_mem(&mut h, st, done, m.size)?;
        }
        if done < m.size {
            advance(fence, &o, done, m.size)?;
        }
        progress(done, m.size);
    }
    if done < m.size {
        if dirty {
            h.write(&mut *open_rw(meta, access)?)?;
        }
        return Ok(Outcome::Interrupted);
    }
    if dirty {
        post_segments_mem(&mut h, st, done, m.size)?;
    }
    finalize(meta, access, &mut h, st)?;
    m.wipe_moved()?;
    advance(fence, &o, done, m.size)?;
    Ok(Outcome::Finished)
}

/// Tells `fence` that the header now shows `done` of `total` bytes moved,
/// with the mapping that serves this when the fence serves the volume.
fn advance(fence: &mut dyn Fence, o: &Online, done: u64, total: u64) -> Result<()> {
    let tables = if fence.serves() {
        o.tables(done)?
    } else {
        Vec::new()
    };
    fence.advanced(done, total, tables)
}

/// The mapping a volume mid-reencryption, mid-encryption or
/// mid-decryption needs, as cryptsetup 2.6.1 activates it
/// (`LUKS2_assembly_multisegment_dmd`): one target per data segment, in
/// segment order, each starting where the previous one ends — a `crypt`
/// segment as dm-crypt with its key (the old one, or the new one for a
/// new or hotzone segment), its IV tweak and offset; a `linear` one
/// (plaintext) as dm-linear at its offset, which for an encryption with
/// a data shift is the moved segment at the end of the device or the
/// plaintext still in place. Start, length and offset are in 512-byte
/// sectors. `pass` must unlock every key the segments use; the
/// verification digest is checked first. The device is opened as
/// `access` says.
pub fn tables(
    device: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
) -> Result<Vec<Target>> {
    tables_at(device, device, access, pass, key_slot)
}

/// [`tables`] with the header in `meta` (a detached header file, or
/// `device` itself).
pub fn tables_at(
    device: &Path,
    meta: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
) -> Result<Vec<Target>> {
    let (h, dev_size) = read_header_of(meta, device, access)?;
    let st = State::load(&h)?.ok_or_else(|| invalid("Device reencryption not in progress."))?;
    if st.hotzone().is_some() {
        // A crash tore a hotzone: some of its blocks are old, some new,
        // and only the resilience data says which. cryptsetup refuses to
        // activate such a volume as well.
        return Err(invalid(format!(
            "Device {} requires reencryption recovery: run ucrypt reencrypt --resume-only \
             (or cryptsetup repair) first.",
            device.display()
        )));
    }
    let (old_vk, new_vk) = upgrade::unlock_keys(&h, meta, access, pass, key_slot, &st)?;
    st.verify(&h, &old_vk, &new_vk)?;
    let total = data_size(dev_size, &st)?;
    segment_targets(&h, &st, device, total, &old_vk, &new_vk)
}

/// The targets of the data segments `h` names (see [`tables`]), the
/// last one's `dynamic` size running to `total`.
fn segment_targets(
    h: &RawHeader,
    st: &State,
    device: &Path,
    total: u64,
    old_vk: &[u8],
    new_vk: &[u8],
) -> Result<Vec<Target>> {
    let mut segs: Vec<(&String, &Segment)> = h
        .meta
        .segments
        .iter()
        .filter(|(_, s)| !state::is_backup(s))
        .collect();
    segs.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(u32::MAX));
    let table_err = |e| {
        Error::crypto(
            ErrorKind::InvalidArgument,
            "Cannot build the dm-crypt table",
            e,
        )
    };
    let dev = device.display().to_string();
    let mut start = 0u64;
    let mut out = Vec::new();
    for (id, s) in segs {
        let len = match s.fixed_size()? {
            Some(l) => l,
            None => total.saturating_sub(start),
        };
        if len == 0 {
            continue;
        }
        if start % 512 != 0 || len % 512 != 0 || s.offset % 512 != 0 {
            return Err(corrupt(format!(
                "LUKS2 segment {id} is not aligned to 512-byte sectors"
            )));
        }
        if s.kind == "linear" {
            let l = Linear::new(start / 512, len / 512, dev.clone(), s.offset / 512)
                .map_err(table_err)?;
            out.push(Target::Linear(l));
            start += len;
            continue;
        }
        let is_old = !st.old_digest.is_empty()
            && h.meta
                .digests
                .get(&st.old_digest)
                .is_some_and(|d| d.segments.contains(id))
            && !state::in_reencryption(s);
        let key = if is_old { old_vk } else { new_vk };
        let mut line = Secret::with_capacity(512);
        use std::fmt::Write as _;
        let _ = write!(
            line,
            "{} {} crypt {} ",
            start / 512,
            len / 512,
            s.encryption
        );
        line.push_hex(key);
        let _ = write!(line, " {} {} {}", s.iv_tweak, dev, s.offset / 512);
        if s.sector_size != 512 {
            let _ = write!(line, " 1 sector_size:{}", s.sector_size);
        }
        let t = Table::parse(line.as_str().unwrap_or_default()).map_err(table_err)?;
        out.push(Target::Crypt(t));
        start += len;
    }
    if start != total {
        return Err(corrupt(format!(
            "LUKS2 data segments cover {start} bytes of {total}"
        )));
    }
    Ok(out)
}

/// The header on `meta` and the size of the data device `data` (the
/// same path without a detached header), both opened as `access` says.
fn read_header_of(meta: &Path, data: &Path, access: &DeviceAccess) -> Result<(RawHeader, u64)> {
    let (h, size) = read_header(meta, access)?;
    if meta == data {
        return Ok((h, size));
    }
    let mut f = open_ro(data, access)?;
    Ok((h, io::device_size(&mut *f, data)?))
}

fn read_header(device: &Path, access: &DeviceAccess) -> Result<(RawHeader, u64)> {
    let mut f = open_ro(device, access)?;
    let size = io::device_size(&mut *f, device)?;
    let h = RawHeader::read(&mut *f, size)?;
    Ok((h, size))
}

/// Bytes of the data area being reencrypted.
fn data_size(dev_size: u64, st: &State) -> Result<u64> {
    let align = u64::from(st.old.sector_size.max(st.new.sector_size));
    if let Some(size) = st.fixed_size {
        return Ok(size / align * align);
    }
    let size = match st.old.fixed_size()? {
        Some(s) => s,
        None => dev_size.checked_sub(st.old.offset).ok_or_else(|| {
            Error::new(
                ErrorKind::DeviceSize,
                "Device is smaller than its data offset",
            )
        })?,
    };
    Ok(size / align * align)
}

/// The first unused digest id.
fn free_digest(h: &RawHeader) -> String {
    (0..1000u32)
        .find(|d| !h.obj("digests").contains_key(&d.to_string()))
        .unwrap_or(999)
        .to_string()
}

/// The KDF of an existing keyslot as a request that reproduces it.
fn copy_kdf(k: &Kdf, af_hash: Hash) -> KdfRequest {
    match *k {
        Kdf::Pbkdf2 { hash, iterations } => KdfRequest {
            kind: "pbkdf2".into(),
            hash,
            force_iterations: Some(iterations),
            ..Default::default()
        },
        Kdf::Argon2 {
            variant,
            time,
            memory_kib,
            parallel,
        } => KdfRequest {
            kind: variant.name().into(),
            hash: af_hash,
            force_iterations: Some(time),
            memory_kib: Some(memory_kib),
            parallel: Some(parallel),
            ..Default::default()
        },
    }
}

/// A new pbkdf2 digest of `key` as cryptsetup writes one for a
/// reencryption (sha256, 1000 iterations, 32-byte salt).
fn new_digest(key: &[u8], keyslots: &[String], segments: &[&str]) -> Result<Value> {
    let salt = keyslot::random(32)?;
    let d = keyslot::digest(Hash::Sha256, key, &salt, 1000, 32);
    Ok(
        json!({"type": "pbkdf2", "keyslots": keyslots, "segments": segments, "hash": "sha256",
              "iterations": 1000, "salt": json::b64_encode(&salt), "digest": json::b64_encode(&d)}),
    )
}

fn set_digest_segments(h: &mut RawHeader, did: &str, segs: &[&str]) {
    if did.is_empty() {
        return; // the plaintext side: no digest
    }
    if let Some(d) = h.obj_mut("digests").get_mut(did) {
        d["segments"] = json!(segs);
    }
}

/// LUKS2_find_area_max_gap: the largest unused part of the keyslots area.
fn largest_gap(h: &RawHeader) -> (u64, u64) {
    let (lo, hi) = h.keyslots_area();
    let mut used: Vec<(u64, u64)> = h
        .meta
        .keyslots
        .values()
        .map(|k| (k.area.offset, k.area.offset + k.area.size))
        .collect();
    used.sort_unstable();
    let (mut best, mut pos) = ((lo, 0), lo);
    for (s, e) in used.into_iter().chain([(hi, hi)]) {
        if s > pos && s - pos > best.1 {
            best = (pos, s - pos);
        }
        pos = pos.max(e);
    }
    best
}

/// Tries `pass` on `candidates`; returns the slot and `(digest id, key)`
/// of the first one opening a key of one of `digests`.
fn unlock_any(
    h: &RawHeader,
    device: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    candidates: &[u32],
    digests: &[&str],
) -> Result<(u32, (String, Secret))> {
    let mut f = open_ro(device, access)?;
    for &s in candidates {
        let Some(ks) = h.meta.keyslots.get(&s.to_string()) else {
            continue;
        };
        let Some((did, dg)) = h
            .meta
            .digests
            .iter()
            .find(|(_, d)| d.keyslots.iter().any(|k| k == &s.to_string()))
        else {
            continue;
        };
        if !digests.contains(&did.as_str()) {
            continue;
        }
        let mut mat = Secret::zeroed(material_len(ks.key_size as usize, ks.af.stripes));
        read_exact_at(&mut *f, ks.area.offset, &mut mat)?;
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
        if keyslot::digest_matches(dhash, &vk, &dsalt, dg.iterations, &ddig) {
            return Ok((s, (did.clone(), vk)));
        }
    }
    Err(Error::new(
        ErrorKind::WrongPassphrase,
        match candidates {
            [s] => format!("No key available with this passphrase in keyslot {s}"),
            _ => "No key available with this passphrase.".to_string(),
        },
    ))
}

/// The header's keyslot ids in ascending order.
fn keyslot_ids(h: &RawHeader) -> Vec<u32> {
    let mut slots: Vec<u32> = h
        .meta
        .keyslots
        .keys()
        .filter_map(|k| k.parse().ok())
        .collect();
    slots.sort_unstable();
    slots
}

/// Unlocks the old and the new key with one passphrase.
fn unlock_both(
    h: &RawHeader,
    device: &Path,
    access: &DeviceAccess,
    pass: &[u8],
    key_slot: Option<u32>,
    st: &State,
) -> Result<(Secret, Secret)> {
    let slots = keyslot_ids(h);
    // The plaintext side of an encryption or decryption has no key.
    let mut old = st.old_digest.is_empty().then(|| Secret::from_slice(&[]));
    let mut new = st.new_digest.is_empty().then(|| Secret::from_slice(&[]));
    // With --key-slot, that slot opens one key and the slots bound to the
    // other digest are tried with the same passphrase.
    if let Some(s) = key_slot {
        let (_, (d, k)) = unlock_any(
            h,
            device,
            access,
            pass,
            &[s],
            &[&st.old_digest, &st.new_digest],
        )?;
        // (An empty id is no digest: no keyslot opens it.)
        if d == st.old_digest {
            old = Some(k);
        } else {
            new = Some(k);
        }
    }
    if old.is_none() {
        old = Some(
            unlock_any(h, device, access, pass, &slots, &[&st.old_digest])?
                .1
                 .1,
        );
    }
    if new.is_none() {
        new = Some(
            unlock_any(h, device, access, pass, &slots, &[&st.new_digest])?
                .1
                 .1,
        );
    }
    match (old, new) {
        (Some(o), Some(n)) => Ok((o, n)),
        _ => Err(Error::new(
            ErrorKind::WrongPassphrase,
            "No key available with this passphrase.",
        )),
    }
}

/// Segments after `done` bytes (forward: from the data start; backward:
/// from its end) and, while a step is in progress, its hotzone of `hot`
/// bytes next to them, with their digests (a `crypt` segment its key's,
/// a `crypt` hotzone every key's, a `linear` one none); backups kept.
fn make_segments(
    h: &mut RawHeader,
    st: &State,
    done: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<()> {
    if st.moved.is_some() && st.mode == Mode::Decrypt {
        return decrypt_shift::make_segments(h, st, done, hot, total);
    }
    if st.moved.is_some() {
        return make_shift_segments(h, st, done, hot, total);
    }
    let base = st.old.offset;
    let seg = |like: &Segment, start: u64, size: Option<u64>, flags: Option<&str>| -> Value {
        let size = size
            .map(|s| s.to_string())
            .unwrap_or_else(|| "dynamic".into());
        let mut v = if like.kind == "linear" {
            json!({"type": "linear", "offset": (base + start).to_string(), "size": size})
        } else {
            json!({
                "type": "crypt",
                "offset": (base + start).to_string(),
                "size": size,
                "iv_tweak": (like.iv_tweak + start / 512).to_string(),
                "encryption": like.encryption,
                "sector_size": like.sector_size,
            })
        };
        if let Some(f) = flags {
            v["flags"] = json!([f]);
        }
        v
    };
    let fixed = st.old.fixed_size()?.is_some() || st.fixed_size.is_some();
    let keys = |like: &Segment, d: &str| -> Vec<String> {
        if like.kind == "linear" || d.is_empty() {
            Vec::new()
        } else {
            vec![d.to_string()]
        }
    };
    let hot_keys: Vec<String> = if st.new.kind == "linear" {
        Vec::new()
    } else {
        [&st.old_digest, &st.new_digest]
            .into_iter()
            .filter(|d| !d.is_empty())
            .cloned()
            .collect()
    };
    let new_keys = keys(&st.new, &st.new_digest);
    let old_keys = keys(&st.old, &st.old_digest);
    let mut out: Vec<(Value, Vec<String>)> = Vec::new();
    let hl = hot.unwrap_or(0);
    if !st.backward {
        // new [0, done) | hot | old [done + hot, total)
        let end = done + hl;
        if done > 0 || (hot.is_none() && end >= total) {
            let size = if end >= total && hot.is_none() && !fixed {
                None
            } else {
                Some(done)
            };
            out.push((seg(&st.new, 0, size, None), new_keys));
        }
        if let Some(len) = hot {
            out.push((
                seg(&st.new, done, Some(len), Some("in-reencryption")),
                hot_keys,
            ));
        }
        if end < total {
            let size = if fixed { Some(total - end) } else { None };
            out.push((seg(&st.old, end, size, None), old_keys));
        }
    } else {
        // old [0, old_end) | hot | new [total - done, total)
        let old_end = total.saturating_sub(done + hl);
        if old_end > 0 {
            let size = if old_end == total && !fixed {
                None
            } else {
                Some(old_end)
            };
            out.push((seg(&st.old, 0, size, None), old_keys));
        }
        if let Some(len) = hot {
            out.push((
                seg(&st.new, old_end, Some(len), Some("in-reencryption")),
                hot_keys,
            ));
        }
        if done > 0 || old_end + hl == 0 {
            let size = if fixed { Some(done) } else { None };
            out.push((seg(&st.new, total - done, size, None), new_keys));
        }
    }
    let prev = h
        .obj("segments")
        .values()
        .find(|s| has_flag(s, "backup-previous"))
        .cloned()
        .ok_or_else(|| corrupt("backup-previous segment vanished"))?;
    let fin = h
        .obj("segments")
        .values()
        .find(|s| has_flag(s, "backup-final"))
        .cloned()
        .ok_or_else(|| corrupt("backup-final segment vanished"))?;
    let n = out.len();
    let mut old_ids = Vec::new();
    let mut new_ids = Vec::new();
    let segs = h.obj_mut("segments");
    segs.clear();
    for (i, (v, ds)) in out.into_iter().enumerate() {
        segs.insert(i.to_string(), v);
        if ds.contains(&st.old_digest) {
            old_ids.push(i.to_string());
        }
        if ds.contains(&st.new_digest) {
            new_ids.push(i.to_string());
        }
    }
    segs.insert(n.to_string(), prev);
    segs.insert((n + 1).to_string(), fin);
    old_ids.push(n.to_string());
    new_ids.push((n + 1).to_string());
    let o: Vec<&str> = old_ids.iter().map(String::as_str).collect();
    let nn: Vec<&str> = new_ids.iter().map(String::as_str).collect();
    set_digest_segments(h, &st.old_digest, &o);
    set_digest_segments(h, &st.new_digest, &nn);
    Ok(())
}

/// [`make_segments`] for an encryption with a data shift, in
/// cryptsetup's order: the moved segment (the data's first `shift`
/// bytes, plaintext), the rest of the plaintext in place, the hotzone,
/// the encrypted part `shift` bytes further on (fixed size until the
/// end, then one dynamic segment); then backup-previous, backup-final
/// and backup-moved-segment.
fn make_shift_segments(
    h: &mut RawHeader,
    st: &State,
    done: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<()> {
    let moved = st
        .moved
        .as_ref()
        .ok_or_else(|| corrupt("backup-moved-segment vanished"))?;
    let shift = st.new.offset;
    let hl = hot.unwrap_or(0);
    let plain = total.saturating_sub(done + hl);
    let crypt = |start: u64, size: Option<u64>, flag: Option<&str>| {
        let mut v = json!({
            "type": "crypt",
            "offset": (shift + start).to_string(),
            "size": size.map(|s| s.to_string()).unwrap_or_else(|| "dynamic".into()),
            "iv_tweak": (st.new.iv_tweak + start / 512).to_string(),
            "encryption": st.new.encryption,
            "sector_size": st.new.sector_size,
        });
        if let Some(f) = flag {
            v["flags"] = json!([f]);
        }
        v
    };
    let mut out: Vec<(Value, bool)> = Vec::new();
    if plain > 0 {
        out.push((
            json!({"type": "linear", "offset": moved.offset.to_string(),
                   "size": plain.min(shift).to_string()}),
            false,
        ));
    }
    if plain > shift {
        out.push((
            json!({"type": "linear", "offset": shift.to_string(),
                   "size": (plain - shift).to_string()}),
            false,
        ));
    }
    if let Some(len) = hot {
        out.push((crypt(plain, Some(len), Some("in-reencryption")), true));
    }
    if done > 0 {
        let size = (plain + hl > 0 || hot.is_some()).then_some(done);
        out.push((crypt(plain + hl, size, None), true));
    }
    // The final backup segment is under the new key.
    set_shift_segments(h, out, &st.new_digest, &[1])
}

/// Replaces `h`'s segments of a data shift with `data` (each with whether
/// `digest` covers it) followed by the three backup segments (previous,
/// final, moved, found by their flags), and binds `digest` to those data
/// segments and to the backups `bound` names (0 previous, 1 final, 2
/// moved).
pub(super) fn set_shift_segments(
    h: &mut RawHeader,
    data: Vec<(Value, bool)>,
    digest: &str,
    bound: &[usize],
) -> Result<()> {
    let backup = |flag: &str| {
        h.obj("segments")
            .values()
            .find(|s| has_flag(s, flag))
            .cloned()
            .ok_or_else(|| corrupt(format!("{flag} segment vanished")))
    };
    let backups = [
        backup("backup-previous")?,
        backup("backup-final")?,
        backup("backup-moved-segment")?,
    ];
    let n = data.len();
    let mut ids = Vec::new();
    let segs = h.obj_mut("segments");
    segs.clear();
    for (i, (v, covered)) in data.into_iter().enumerate() {
        segs.insert(i.to_string(), v);
        if covered {
            ids.push(i.to_string());
        }
    }
    for (i, b) in backups.into_iter().enumerate() {
        segs.insert((n + i).to_string(), b);
    }
    ids.extend(bound.iter().map(|b| (n + b).to_string()));
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    set_digest_segments(h, digest, &ids);
    Ok(())
}

fn has_flag(s: &Value, flag: &str) -> bool {
    s.get("flags")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x.as_str() == Some(flag)))
}

/// The segments after `done` bytes, in memory only.
fn post_segments_mem(h: &mut RawHeader, st: &State, done: u64, total: u64) -> Result<()> {
    make_segments(h, st, done, None, total)?;
    h.meta = header::ordinary_view(&h.json, h.bin.hdr_size)?;
    Ok(())
}

/// Ends a finished reencryption as cryptsetup does: the keyslots of the
/// old key and its digest, the backup segments, the requirement, the
/// reencrypt keyslot and its digest go; segment 0 covers the data with
/// the new key. The freed keyslot areas are wiped after the header no
/// longer names them.
fn finalize(device: &Path, access: &DeviceAccess, h: &mut RawHeader, st: &State) -> Result<()> {
    let old_slots: Vec<String> = h
        .meta
        .digests
        .get(&st.old_digest)
        .map(|d| d.keyslots.clone())
        .unwrap_or_default();
    let mut wipe: Vec<(u64, u64)> = old_slots
        .iter()
        .filter_map(|s| h.meta.keyslots.get(s))
        .map(|k| (k.area.offset, k.area.size))
        .collect();
    wipe.push(st.area);
    let mut final_seg = h
        .obj("segments")
        .get("0")
        .cloned()
        .ok_or_else(|| corrupt("segment 0 vanished"))?;
    if st.fixed_size.is_some() && st.new.fixed_size()?.is_none() {
        // A fixed-length run ends with the final segment recorded at init,
        // to the device's end (size.rs).
        final_seg["size"] = json!("dynamic");
    }
    let ks = h.obj_mut("keyslots");
    for s in &old_slots {
        ks.remove(s);
    }
    ks.remove(&st.keyslot);
    let ds = h.obj_mut("digests");
    ds.remove(&st.old_digest);
    ds.remove(&st.verify_digest);
    let segs = h.obj_mut("segments");
    segs.clear();
    segs.insert("0".into(), final_seg);
    set_digest_segments(h, &st.new_digest, &["0"]);
    for t in h.obj_mut("tokens").values_mut() {
        if let Some(k) = t.get_mut("keyslots").and_then(Value::as_array_mut) {
            k.retain(|x| !old_slots.iter().any(|s| x.as_str() == Some(s)));
        }
    }
    let cfg = h.obj_mut("config");
    let mut empty = false;
    if let Some(m) = cfg
        .get_mut("requirements")
        .and_then(|r| r.get_mut("mandatory"))
        .and_then(Value::as_array_mut)
    {
        m.retain(|r| {
            !r.as_str()
                .is_some_and(|r| r.starts_with("online-reencrypt"))
        });
        empty = m.is_empty();
    }
    if empty {
        if let Some(r) = cfg.get_mut("requirements").and_then(Value::as_object_mut) {
            r.remove("mandatory");
            if r.is_empty() {
                cfg.remove("requirements");
            }
        }
    }
    let mut f = open_rw(device, access)?;
    h.write(&mut *f)?;
    for (off, len) in wipe {
        io::zero_range(&mut *f, off, len)?;
    }
    sync(&*f)
}
