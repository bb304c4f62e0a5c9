//! `reencrypt --decrypt --header NEWFILE DEVICE` of a volume whose header
//! is inside the device: the header is exported to the new file and the
//! data moves down by the data offset `D` while it is decrypted, in
//! cryptsetup 2.6.1's metadata (requirement `online-reencrypt-v3`).
//!
//! ```text
//!   before   [ header D | ciphertext 0..L                  ]
//!   init     the header copied to NEWFILE; the device's signatures
//!            wiped; ciphertext 0..M copied to the device start (the
//!            moved segment, M = min(D, 20 MiB, L) or --hotzone-size);
//!            the metadata written to NEWFILE
//!   steps    forward from M, one hotzone of D at a time: ciphertext at
//!            D + x decrypted to x (source and target never overlap);
//!            last, the moved segment decrypted in place, protected by
//!            checksums (or a journal) in the reencrypt keyslot's area
//!   after    [ plaintext 0..L | last D bytes wiped ]
//!
//!   segments: 0 crypt 0 (M)  1 crypt D+M dynamic  2 backup-moved-segment
//!             (a copy of 0)  3 backup-previous crypt D dynamic
//!             4 backup-final linear 0 dynamic
//!   keyslot:  reencrypt {mode decrypt, direction forward, area {type
//!             datashift-checksum (hash, sector_size) | datashift-journal,
//!             the largest free gap, shift_size D}}
//! ```
//!
//! [`run`](super::run) (or [`super::Online::run`], the daemon serving the
//! volume: [`init_decrypt_shift_held`] with its clients held from the
//! first write) moves the data (the mover's `place` orders the
//! hotzones); [`make_segments`] writes the segments of each point. The
//! layout was read off cryptsetup 2.6.1's `--init-only` output on this
//! machine and its `lib/luks2/luks2_reencrypt.c`
//! (`reencrypt_decrypt_with_datashift_init`,
//! `reencrypt_make_hot_segments_decrypt_shift`,
//! `_dec_create_segments_shift_after`), read as documentation.

use std::io::ErrorKind as IoKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::header::{self, RawHeader};
use super::state::State;
use super::{
    free_digest, largest_gap, new_digest, no_key, read_header, set_digest_segments,
    set_shift_segments, unlock_any, DEFAULT_NONE_HOTZONE, MIN_ALIGNMENT,
};
use crate::error::{corrupt, invalid, unsupported, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::luks2::json as lj;
use crate::volume::io;
use crate::DeviceAccess;

/// What `--decrypt --header NEWFILE` takes from the options.
#[derive(Debug, Clone, Default)]
pub struct DecryptShiftRequest {
    /// `--resilience`: `checksum` (default) or `journal` (cryptsetup's
    /// `datashift-checksum`/`datashift-journal`, also accepted by name).
    pub resilience: Option<String>,
    /// `--resilience-hash` (default sha256).
    pub resilience_hash: Option<String>,
    /// `--hotzone-size`: the moved segment's size (0: the data offset,
    /// at most 20 MiB).
    pub hotzone: u64,
    /// `--key-slot`: the keyslot the passphrase opens.
    pub key_slot: Option<u32>,
    /// How the device and the header are opened (locking, Ceph).
    pub access: DeviceAccess,
}

/// Starts the decryption of `device` (its header inside it) with the
/// header exported to `header`, which must not exist: checks `pass`,
/// copies the header there, wipes the device's signatures, moves the
/// data's first bytes to the start of the device and writes
/// cryptsetup's metadata of a decryption with a data shift into the
/// file. [`run`](super::run) with `header` moves the data.
pub fn init_decrypt_shift(
    device: &Path,
    header: &Path,
    pass: &[u8],
    req: &DecryptShiftRequest,
) -> Result<State> {
    let _claim = io::claim(&[device])?;
    init_decrypt_shift_held(device, header, pass, req, &mut || Ok(()))
}

/// [`init_decrypt_shift`] on a device its caller holds (the daemon
/// serving it): `before_write` is called once everything is checked and
/// the passphrase opened the key, just before the first write (the
/// header's export), so the caller can stop its clients' IO there; an
/// error from it ends the init with nothing written.
pub fn init_decrypt_shift_held(
    device: &Path,
    header: &Path,
    pass: &[u8],
    req: &DecryptShiftRequest,
    before_write: &mut dyn FnMut() -> Result<()>,
) -> Result<State> {
    if header.exists() {
        return Err(invalid(format!(
            "Header file {} exists already.",
            header.display()
        )));
    }
    let access = &req.access;
    let (mut h, dev_size) = read_header(device, access)?;
    if State::load(&h)?.is_some() {
        return Err(invalid(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    let (sid, seg) = {
        let (i, s) = h.meta.segment();
        (i.clone(), s.clone())
    };
    if h.meta.segments.len() != 1 || seg.kind != "crypt" {
        return Err(unsupported(
            "LUKS2 reencryption needs a volume with one crypt segment",
        ));
    }
    let shift = seg.offset;
    if shift == 0 || shift % 512 != 0 {
        return Err(invalid("Invalid reencryption resilience parameters."));
    }
    if seg.fixed_size()?.is_some() {
        return Err(unsupported(
            "LUKS2 decryption with a data shift of a fixed-size segment is not supported by ucrypt.",
        ));
    }
    let resilience = match req.resilience.as_deref().unwrap_or("checksum") {
        "checksum" | "datashift-checksum" => "datashift-checksum",
        "journal" | "datashift-journal" => "datashift-journal",
        "datashift" | "none" => return Err(invalid(
            "Requested --resilience option cannot be applied to current reencryption operation.",
        )),
        r => return Err(invalid(format!("Unsupported resilience mode {r}"))),
    };
    let rhash = Hash::parse(req.resilience_hash.as_deref().unwrap_or("sha256"))?;
    let data = dev_size
        .checked_sub(shift)
        .filter(|d| *d > 0)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::DeviceSize,
                format!("Device {} is too small.", device.display()),
            )
        })?;
    let check = u64::from(seg.sector_size.max(512));
    if data % check != 0 {
        return Err(invalid(format!(
            "Data device is not aligned to encryption sector size ({check} bytes)."
        )));
    }
    if req.hotzone > shift {
        return Err(invalid(
            "Moved segment size can not be greater than data shift value.",
        ));
    }
    let moved = match req.hotzone {
        0 => shift.min(DEFAULT_NONE_HOTZONE),
        z => z,
    }
    .min(data);

    // The passphrase opens the data segment's key.
    let (old_did, _) = h
        .meta
        .segment_digest()
        .map(|(i, d)| (i.clone(), d.clone()))
        .ok_or_else(|| corrupt("LUKS2 segment has no digest"))?;
    let candidates = match req.key_slot {
        Some(s) => vec![s],
        None => h.meta.segment_keyslots(),
    };
    let (_, (_, old_vk)) = unlock_any(&h, device, access, pass, &candidates, &[old_did.as_str()])
        .map_err(|e| if req.key_slot.is_none() { no_key(e) } else { e })?;

    // The reencrypt keyslot in the largest free gap of the keyslots area.
    let rslot = (0..lj::MAX_KEYSLOTS)
        .find(|s| !h.obj("keyslots").contains_key(&s.to_string()))
        .ok_or_else(|| invalid("All key slots full."))?;
    let (alo, asz) = largest_gap(&h);
    let align = MIN_ALIGNMENT.max(u64::from(seg.sector_size));
    let room = if resilience == "datashift-checksum" {
        asz / rhash.digest_len() as u64 * align
    } else {
        asz
    };
    if moved > room {
        return Err(invalid(format!(
            "Moved segment too large. Requested size {moved}, available space for: {room}."
        )));
    }
    let mut area = json!({"offset": alo.to_string(), "size": asz.to_string(), "type": resilience});
    if resilience == "datashift-checksum" {
        area["hash"] = json!(rhash.name());
        area["sector_size"] = json!(align);
    }
    area["shift_size"] = json!(shift.to_string());
    h.obj_mut("keyslots").insert(
        rslot.to_string(),
        json!({"area": area, "type": "reencrypt", "key_size": 1, "mode": "decrypt",
               "direction": "forward", "priority": 0}),
    );

    // Segments: the moved one, the rest in place, then the backups.
    let old_v = h
        .obj("segments")
        .get(&sid)
        .cloned()
        .ok_or_else(|| corrupt("segment"))?;
    let crypt = |offset: u64, start: u64, size: Option<u64>| {
        let mut v = old_v.clone();
        v["offset"] = json!(offset.to_string());
        v["iv_tweak"] = json!((seg.iv_tweak + start / 512).to_string());
        v["size"] = json!(size.map_or("dynamic".to_string(), |s| s.to_string()));
        if let Some(o) = v.as_object_mut() {
            o.remove("flags");
        }
        v
    };
    let mut segs = vec![crypt(0, 0, Some(moved))];
    if data > moved {
        segs.push(crypt(shift + moved, moved, None));
    }
    let mut mv = segs[0].clone();
    mv["flags"] = json!(["backup-moved-segment"]);
    let mut prev = crypt(shift, 0, None);
    prev["flags"] = json!(["backup-previous"]);
    segs.push(mv);
    segs.push(prev);
    segs.push(json!({"type": "linear", "offset": "0", "size": "dynamic",
                     "flags": ["backup-final"]}));
    let fin_id = segs.len() - 1;
    let m = h.obj_mut("segments");
    m.clear();
    for (i, v) in segs.into_iter().enumerate() {
        m.insert(i.to_string(), v);
    }
    let old_ids: Vec<String> = (0..fin_id).map(|i| i.to_string()).collect();
    let old_ids: Vec<&str> = old_ids.iter().map(String::as_str).collect();
    set_digest_segments(&mut h, &old_did, &old_ids);
    h.obj_mut("config").insert(
        "requirements".into(),
        json!({"mandatory": ["online-reencrypt-v3"]}),
    );
    h.meta = header::ordinary_view(&h.json, h.bin.hdr_size)?;
    let vdata = Zeroizing::new(State::verification_data(
        &h,
        &rslot.to_string(),
        3,
        &old_vk,
        &[],
    )?);
    let vid = free_digest(&h);
    h.obj_mut("digests")
        .insert(vid, new_digest(&vdata, &[rslot.to_string()], &[])?);
    h.meta = header::ordinary_view(&h.json, h.bin.hdr_size)?;
    // The metadata must load before anything is written.
    State::load(&h)?.ok_or_else(|| corrupt("Reencryption state vanished after init"))?;

    before_write()?;
    export(device, header, access, &h)?;
    let moved_ok = move_first(device, access, &h, shift, moved);
    if let Err(e) = moved_ok {
        return Err(Error::new(
            e.kind(),
            format!(
                "{e} Reencryption initialization failed. Header backup is available in {}.",
                header.display()
            ),
        ));
    }
    let mut f = io::open_rw(header, access)?;
    h.write(&mut *f)?;
    State::load(&h)?.ok_or_else(|| corrupt("Reencryption state vanished after init"))
}

/// Copies the device's header and keyslots area (the old header as it
/// is) to the new file `header`, created with mode 0600.
fn export(device: &Path, header: &Path, access: &DeviceAccess, h: &RawHeader) -> Result<()> {
    let len = 2 * h.bin.hdr_size + h.meta.config.keyslots_size;
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(header)
        .map_err(|e| match e.kind() {
            IoKind::AlreadyExists => {
                invalid(format!("Header file {} exists already.", header.display()))
            }
            _ => Error::io(
                format!("Cannot create header backup file {}.", header.display()),
                e,
            ),
        })?;
    let res = (|| -> Result<()> {
        let mut src = io::open_ro(device, access)?;
        let mut buf = Zeroizing::new(vec![0u8; 1 << 20]);
        let mut at = 0u64;
        while at < len {
            let n = (buf.len() as u64).min(len - at) as usize;
            io::read_exact_at(&mut *src, at, &mut buf[..n])?;
            std::os::unix::fs::FileExt::write_all_at(&out, &buf[..n], at)
                .map_err(|e| Error::io("Cannot write header backup file.", e))?;
            at += n as u64;
        }
        out.sync_all()
            .map_err(|e| Error::io("Cannot write header backup file.", e))
    })();
    drop(out);
    if res.is_err() {
        let _ = std::fs::remove_file(header);
    }
    res
}

/// Wipes the LUKS signatures of both header copies on the device and
/// copies the ciphertext `[shift, shift + moved)` to `[0, moved)`.
fn move_first(
    device: &Path,
    access: &DeviceAccess,
    h: &RawHeader,
    shift: u64,
    moved: u64,
) -> Result<()> {
    let mut f = io::open_rw(device, access)?;
    for off in [0, h.bin.hdr_size] {
        io::write_at(&mut *f, off, &[0u8; 6])?;
    }
    io::sync(&*f)?;
    super::crash::point();
    let mut buf = Zeroizing::new(vec![0u8; (1 << 20).min(moved as usize)]);
    let mut at = 0u64;
    while at < moved {
        let n = (buf.len() as u64).min(moved - at) as usize;
        io::read_exact_at(&mut *f, shift + at, &mut buf[..n])?;
        io::write_at(&mut *f, at, &buf[..n])?;
        at += n as u64;
    }
    io::sync(&*f)?;
    super::crash::point();
    Ok(())
}

/// The segments of a decryption with a data shift after `done` bytes
/// (the data after the moved segment first, then the moved segment:
/// `done` reaches `total - M` before the moved segment's hotzone) and,
/// while a step is in progress, its hotzone of `hot` bytes, as
/// cryptsetup orders them; the backups (previous, final, moved) after.
pub(super) fn make_segments(
    h: &mut RawHeader,
    st: &State,
    done: u64,
    hot: Option<u64>,
    total: u64,
) -> Result<()> {
    let m = st.moved_len();
    let shift = st.old.offset;
    let o = &st.old;
    let size = |s: Option<u64>| s.map_or("dynamic".to_string(), |s| s.to_string());
    let crypt = |offset: u64, start: u64, sz: Option<u64>| {
        json!({"type": "crypt", "offset": offset.to_string(), "size": size(sz),
               "iv_tweak": (o.iv_tweak + start / 512).to_string(),
               "encryption": o.encryption, "sector_size": o.sector_size})
    };
    let linear = |offset: u64, sz: Option<u64>, hot: bool| {
        let mut v = json!({"type": "linear", "offset": offset.to_string(), "size": size(sz)});
        if hot {
            v["flags"] = json!(["in-reencryption"]);
        }
        v
    };
    let rest = total.saturating_sub(m);
    // (segment, bound to the old key)
    let mut out: Vec<(Value, bool)> = Vec::new();
    if done >= total {
        out.push((linear(0, None, false), false));
    } else if done >= rest && hot.is_some() {
        out.push((linear(0, Some(m), true), false));
        if rest > 0 {
            out.push((linear(m, None, false), false));
        }
    } else {
        out.push((crypt(0, 0, Some(m)), true));
        let hl = hot.unwrap_or(0);
        let end = m + done + hl;
        if done > 0 {
            let fixed = hot.is_some() || end < total;
            out.push((linear(m, fixed.then_some(done), false), false));
        }
        if let Some(len) = hot {
            out.push((linear(m + done, Some(len), true), false));
        }
        if end < total {
            out.push((crypt(shift + end, end, None), true));
        }
    }
    // The previous and the moved backup segments are under the old key.
    set_shift_segments(h, out, &st.old_digest, &[0, 2])
}
