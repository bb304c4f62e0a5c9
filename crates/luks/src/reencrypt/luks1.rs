//! LUKS1 reencryption offline (a new volume key, optionally a new cipher,
//! key size or hash), in the files and header marks of cryptsetup 2.6.1's
//! LUKS1 reencryption (`src/utils_reencrypt_luks1.c`, read as
//! documentation), so an interrupted run of either tool is recognised by
//! the other.
//!
//! ```text
//!   cwd/LUKS-<uuid>.log   512 bytes of text: version, UUID, direction,
//!                         mode, offset (bytes of data done), shift
//!   cwd/LUKS-<uuid>.org   the old header (luksHeaderBackup format)
//!   cwd/LUKS-<uuid>.new   the new header: same UUID, data offset and
//!                         passphrases in the same keyslots, a new key
//!   cwd/LUKS-<uuid>.sum   ucrypt's: the old ciphertext's sector digests
//!                         of the block being rewritten (below)
//!   device                magic "LUKS\xde\xad" while in progress (no
//!                         LUKS tool opens it), the new header at the end
//! ```
//!
//! The data goes forward in blocks (cryptsetup's `--block-size`, 4 MiB):
//! read, decrypted with the old key, encrypted with the new one, written
//! and synced, then the log's offset moves past it (synced). The log
//! alone cannot tell, after a crash between a block's write and its log
//! write, which of the block's sectors already hold the new ciphertext
//! (cryptsetup's LUKS1 tool has that window and would decrypt them again
//! with the old key). So before a block is written, ucrypt syncs a fourth
//! file beside cryptsetup's, `LUKS-<uuid>.sum`: the block's offset and a
//! SHA-256 of each of its 512-byte sectors as they were (the old
//! ciphertext), sealed by a digest of the whole. A resume at that offset
//! reencrypts only the sectors that still match; a sealed-but-stale or
//! torn sum (the block not yet written) changes nothing. Every active
//! keyslot is carried over in its own number, each with its passphrase
//! ([`run_slots`]), as cryptsetup asks for them; with `--key-slot` (or a
//! key file, which cryptsetup allows only for a volume with one active
//! keyslot or with `--key-slot`) only that keyslot is, and the others
//! are dropped. Data shifts (`--reduce-device-size`),
//! `--encrypt`, `--decrypt` and `--keep-key` of the LUKS1 tool are not
//! implemented. Hand-written: no crate implements this format.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::KdfRequest;
use crate::volume::io::{device_size, open_ro, open_rw, read_exact_at, sync, write_at};
use crate::volume::{format, FormatOptions, Volume};
use crate::Header;

use super::{crash, Outcome};

/// The magic of a LUKS1 device in reencryption.
pub const NOMAGIC: [u8; 6] = *b"LUKS\xde\xad";
/// cryptsetup's default `--block-size` (MiB) of the LUKS1 tool.
pub const BLOCK: u64 = 4 << 20;
/// UUID field of the LUKS1 header (40 bytes).
const UUID_AT: usize = 0xa8;

/// What the new header changes.
#[derive(Debug, Clone, Default)]
pub struct Luks1Request {
    /// New cipher (`--cipher`, default: the old one).
    pub cipher: Option<String>,
    /// New key size in bits (`--key-size`, default: the old one).
    pub key_bits: Option<u32>,
    /// New header hash (`--hash`, default: sha256 as cryptsetup's LUKS1).
    pub hash: Option<Hash>,
    /// The new keyslot's KDF (pbkdf2).
    pub kdf: KdfRequest,
}

/// The UUID of a LUKS1 device marked as in reencryption (magic
/// [`NOMAGIC`], version 1); `None` when it is not so marked.
pub fn in_progress(device: &Path) -> Result<Option<String>> {
    let mut f = open_ro(device)?;
    let size = device_size(&mut *f, device)?;
    if size < 4096 {
        return Ok(None);
    }
    let mut buf = [0u8; 4096];
    read_exact_at(&mut *f, 0, &mut buf)?;
    if buf[..6] != NOMAGIC || buf[6..8] != [0, 1] {
        return Ok(None);
    }
    let raw = &buf[UUID_AT..UUID_AT + 40];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let uuid = std::str::from_utf8(&raw[..end])
        .ok()
        .filter(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
        .ok_or_else(|| invalid("Device is not a valid LUKS device."))?;
    Ok(Some(uuid.to_string()))
}

/// The three files of the reencryption of the volume `uuid` in `dir`.
struct Files {
    log: PathBuf,
    org: PathBuf,
    new: PathBuf,
    sum: PathBuf,
}

impl Files {
    fn of(dir: &Path, uuid: &str) -> Files {
        Files {
            log: dir.join(format!("LUKS-{uuid}.log")),
            org: dir.join(format!("LUKS-{uuid}.org")),
            new: dir.join(format!("LUKS-{uuid}.new")),
            sum: dir.join(format!("LUKS-{uuid}.sum")),
        }
    }
}

/// Magic of `LUKS-<uuid>.sum`.
const SUM_MAGIC: &[u8; 16] = b"ucrypt-luks1-sum";
/// Sector the sums are taken over (LUKS1's).
const SUM_SECTOR: usize = 512;

/// The sum file of the block at data offset `offset` as it is now (its
/// old ciphertext): magic, offset and length (u64 LE), a SHA-256 per
/// 512-byte sector, then a SHA-256 of everything before it.
fn sum_bytes(offset: u64, block: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let sectors = block.len() / SUM_SECTOR;
    let mut out = Vec::with_capacity(32 + 32 * (sectors + 1));
    out.extend_from_slice(SUM_MAGIC);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(block.len() as u64).to_le_bytes());
    for sector in block.chunks_exact(SUM_SECTOR) {
        out.extend_from_slice(&Sha256::digest(sector));
    }
    let seal = Sha256::digest(&out);
    out.extend_from_slice(&seal);
    out
}

/// The per-sector digests of a sum file for the block at `offset` of
/// `len` bytes; `None` if it is for another block, torn or not ours.
fn parse_sum(bytes: &[u8], offset: u64, len: usize) -> Option<Vec<[u8; 32]>> {
    use sha2::{Digest, Sha256};
    let sectors = len / SUM_SECTOR;
    if bytes.len() != 32 + 32 * (sectors + 1) || &bytes[..16] != SUM_MAGIC {
        return None;
    }
    let (body, seal) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != seal
        || body[16..24] != offset.to_le_bytes()
        || body[24..32] != (len as u64).to_le_bytes()
    {
        return None;
    }
    Some(
        body[32..]
            .chunks_exact(32)
            .map(|d| d.try_into().unwrap_or([0; 32]))
            .collect(),
    )
}

fn write_sum(path: &Path, offset: u64, block: &[u8]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::io(format!("Cannot write {}", path.display()), e))?;
    f.write_all(&sum_bytes(offset, block))
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(format!("Cannot write {}", path.display()), e))?;
    crash::point();
    Ok(())
}

/// The log as cryptsetup writes it: one 512-byte sector of text.
fn log_text(uuid: &str, offset: u64) -> [u8; 512] {
    let text = format!(
        "# LUKS reencryption log, DO NOT EDIT OR DELETE.\nversion = 2\nUUID = {uuid}\n\
         direction = 0\nmode = 0\noffset = {offset}\nshift = 0\n# EOF\n"
    );
    let mut out = [0u8; 512];
    let n = text.len().min(511);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

fn write_log(path: &Path, uuid: &str, offset: u64) -> Result<()> {
    let mut f = open_rw(path)?;
    write_at(&mut *f, 0, &log_text(uuid, offset))?;
    crash::point();
    sync(&*f)
}

/// Parses a log sector: the offset, if the log is for `uuid`, a forward
/// reencryption (direction 0, mode 0) and without a data shift.
pub(crate) fn parse_log(bytes: &[u8], uuid: &str) -> Result<u64> {
    let bad = || invalid("Wrong log format.");
    let text = &bytes[..bytes.len().min(512)];
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let text = std::str::from_utf8(&text[..end]).map_err(|_| bad())?;
    let mut offset = None;
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once(" = ").ok_or_else(bad)?;
        let num = || v.trim().parse::<u64>().map_err(|_| bad());
        match k {
            "version" if matches!(num()?, 1 | 2) => {}
            "UUID" if v.trim() == uuid => {}
            "direction" | "mode" | "shift" if num()? == 0 => {}
            "direction" | "mode" | "shift" => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "LUKS1 reencryption with a data shift, encryption or decryption is not \
                     supported by ucrypt.",
                ))
            }
            "offset" => offset = Some(num()?),
            _ => return Err(bad()),
        }
    }
    offset.ok_or_else(bad)
}

/// Reencrypts (or resumes reencrypting) the LUKS1 volume on `device`,
/// its reencryption files in `dir` (cryptsetup uses the working
/// directory), until done or `stop` (checked between blocks).
/// `progress(done, total)` after each block.
pub fn run(
    device: &Path,
    dir: &Path,
    pass: &[u8],
    key_slot: Option<u32>,
    req: &Luks1Request,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Outcome> {
    run_with(device, dir, &[], pass, key_slot, req, stop, progress)
}

/// [`run`] renewing each keyslot of `slots` when it starts, as
/// cryptsetup's LUKS1 reencryption does without `--key-slot`: each
/// passphrase must open its keyslot, and the new header holds the new key
/// in the same keyslot numbers, each with its passphrase. A reencryption
/// in progress is resumed with the first passphrase.
pub fn run_slots(
    device: &Path,
    dir: &Path,
    slots: &[super::SlotPassphrase<'_>],
    req: &Luks1Request,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Outcome> {
    let first = slots
        .first()
        .ok_or_else(|| invalid("No keyslot to renew"))?;
    run_with(device, dir, slots, first.pass, None, req, stop, progress)
}

#[allow(clippy::too_many_arguments)]
fn run_with(
    device: &Path,
    dir: &Path,
    slots: &[super::SlotPassphrase<'_>],
    pass: &[u8],
    key_slot: Option<u32>,
    req: &Luks1Request,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Outcome> {
    let _claim = crate::volume::io::claim(&[device])?;
    let (uuid, files, offset) = match in_progress(device)? {
        Some(uuid) => {
            let files = Files::of(dir, &uuid);
            let log = std::fs::read(&files.log).map_err(|e| {
                Error::io_as(
                    ErrorKind::InvalidArgument,
                    format!(
                        "Device {} is in LUKS1 reencryption but its log {} cannot be read",
                        device.display(),
                        files.log.display()
                    ),
                    e,
                )
            })?;
            let offset = parse_log(&log, &uuid)?;
            (uuid, files, offset)
        }
        None => {
            let (uuid, files) = init(device, dir, pass, key_slot, slots, req)?;
            (uuid, files, 0)
        }
    };
    let old = Volume::load(device, Some(files.org.as_path()))?;
    let new = Volume::load(device, Some(files.new.as_path()))?;
    let old = old.unlock(pass, key_slot)?;
    let new = new.unlock(pass, key_slot)?;
    let old_c = crypto::SectorCrypt::new(&old.crypt_config())
        .map_err(|e| Error::crypto(ErrorKind::InvalidArgument, "Cannot set up the cipher", e))?;
    let new_c = crypto::SectorCrypt::new(&new.crypt_config())
        .map_err(|e| Error::crypto(ErrorKind::InvalidArgument, "Cannot set up the cipher", e))?;
    let base = old.payload_offset;
    let total = old.size.min(new.size);
    let align = u64::from(old.sector_size.max(new.sector_size));
    if offset > total || offset % align != 0 {
        return Err(invalid("Wrong log format."));
    }
    let mut f = open_rw(device)?;
    let mut buf = vec![0u8; BLOCK.min(total.max(align)) as usize];
    let mut done = offset;
    progress(done, total);
    // A block written (wholly or in part) before a crash, its log not
    // yet moved: the sectors that no longer match its sum are new already.
    let mut written: Option<Vec<[u8; 32]>> = std::fs::read(&files.sum)
        .ok()
        .and_then(|b| parse_sum(&b, done, (total - done).min(BLOCK) as usize));
    while done < total {
        if stop.load(Ordering::Relaxed) {
            return Ok(Outcome::Interrupted);
        }
        let len = (total - done).min(BLOCK) as usize;
        let b = &mut buf[..len];
        read_exact_at(&mut *f, base + done, b)?;
        match written.take() {
            None => {
                write_sum(&files.sum, done, b)?;
                old_c.decrypt(done / 512, b);
                new_c.encrypt(done / 512, b);
            }
            Some(sums) => {
                use sha2::{Digest, Sha256};
                for (i, sector) in b.chunks_exact_mut(SUM_SECTOR).enumerate() {
                    if Sha256::digest(&*sector).as_slice() == sums[i] {
                        let at = (done + (i * SUM_SECTOR) as u64) / 512;
                        old_c.decrypt(at, sector);
                        new_c.encrypt(at, sector);
                    }
                }
            }
        }
        write_at(&mut *f, base + done, b)?;
        crash::point();
        sync(&*f)?;
        done += len as u64;
        write_log(&files.log, &uuid, done)?;
        progress(done, total);
    }
    buf.iter_mut().for_each(|b| *b = 0);
    // The new header over the marked one, then the files go.
    let hdr = std::fs::read(&files.new)
        .map_err(|e| Error::io(format!("Cannot read {}", files.new.display()), e))?;
    let Header::V1(h) = Header::from_bytes(&hdr)? else {
        return Err(invalid("The new LUKS1 header is not LUKS1."));
    };
    let end = (h.metadata_end() as usize).min(hdr.len());
    write_at(&mut *f, 0, &hdr[..end])?;
    crash::point();
    sync(&*f)?;
    for p in [&files.log, &files.org, &files.new, &files.sum] {
        let _ = std::fs::remove_file(p);
    }
    Ok(Outcome::Finished)
}

/// Starts: checks the volume and the passphrase, writes the log, the
/// old header's backup and the new header, then marks the device.
fn init(
    device: &Path,
    dir: &Path,
    pass: &[u8],
    key_slot: Option<u32>,
    slots: &[super::SlotPassphrase<'_>],
    req: &Luks1Request,
) -> Result<(String, Files)> {
    let vol = Volume::load(device, None)?;
    let Header::V1(h) = vol.header() else {
        return Err(invalid(format!(
            "Device {} is not a valid LUKS1 device.",
            device.display()
        )));
    };
    let active = vol.header().active_slots();
    if slots.is_empty() && key_slot.is_none() && active.len() != 1 {
        return Err(invalid(
            "Key file can be used only with --key-slot or with exactly one key slot active.",
        ));
    }
    // Every renewed keyslot's passphrase is checked before anything is
    // written.
    for s in slots.iter().skip(1) {
        vol.unlock(s.pass, Some(s.slot))
            .map_err(|e| match e.kind() {
                ErrorKind::WrongPassphrase => Error::new(
                    ErrorKind::WrongPassphrase,
                    "No key available with this passphrase.",
                ),
                _ => e,
            })?;
    }
    let key_slot = slots.first().map(|s| s.slot).or(key_slot);
    let opened = vol.unlock(pass, key_slot)?;
    let uuid = h.uuid.clone();
    let files = Files::of(dir, &uuid);
    // The log first (created exclusively: another run's log is refused).
    let mut log = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&files.log)
        .map_err(|e| {
            Error::io_as(
                ErrorKind::InvalidArgument,
                format!("Cannot open reencryption log file {}", files.log.display()),
                e,
            )
        })?;
    log.write_all(&log_text(&uuid, 0))
        .and_then(|_| log.sync_all())
        .map_err(|e| Error::io("Cannot write reencryption log file.", e))?;
    let _ = std::fs::remove_file(&files.org);
    let _ = std::fs::remove_file(&files.new);
    let _ = std::fs::remove_file(&files.sum);
    vol.header_backup(&files.org)?;
    let opts = FormatOptions {
        version: 1,
        cipher: req.cipher.clone().unwrap_or_else(|| opened.cipher.clone()),
        key_bits: Some(req.key_bits.unwrap_or(opened.volume_key.len() as u32 * 8)),
        hash: req.hash.unwrap_or(Hash::Sha256),
        kdf: req.kdf.clone(),
        uuid: Some(uuid.clone()),
        key_slot: Some(opened.keyslot),
        data_offset: Some(opened.payload_offset),
        // The file was just emptied: nothing to protect in it.
        force: true,
        ..FormatOptions::default()
    };
    let key_bits = opts.key_bits.unwrap_or(0);
    let new_vk = crate::keyslot::random((key_bits / 8) as usize)?;
    let opts = FormatOptions {
        volume_key: Some(new_vk.clone()),
        ..opts
    };
    let mut new_vol = format(device, Some(files.new.as_path()), &opts, pass)?;
    // The other renewed keyslots, in their own slot numbers.
    for s in slots.iter().skip(1) {
        new_vol.add_key(&new_vk, s.pass, Some(s.slot), &req.kdf)?;
    }
    crash::point();
    // Marked: no LUKS tool opens the device until the new header is on it.
    let mut f = open_rw(device)?;
    write_at(&mut *f, 0, &NOMAGIC)?;
    crash::point();
    sync(&*f)?;
    Ok((uuid, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_are_for_their_block_only_and_torn_ones_are_ignored() {
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let s = sum_bytes(8192, &block);
        let sums = parse_sum(&s, 8192, block.len()).unwrap();
        assert_eq!(sums.len(), 8);
        assert!(parse_sum(&s, 0, block.len()).is_none(), "another block");
        assert!(parse_sum(&s, 8192, 2048).is_none(), "another length");
        for n in 0..s.len() {
            assert!(
                parse_sum(&s[..n], 8192, block.len()).is_none(),
                "torn at {n}"
            );
        }
        let mut flipped = s.clone();
        flipped[40] ^= 1;
        assert!(parse_sum(&flipped, 8192, block.len()).is_none(), "seal");
    }

    #[test]
    fn the_log_round_trips_and_odd_logs_are_refused() {
        let u = "12345678-1234-1234-1234-123456789abc";
        let l = log_text(u, 4 << 20);
        assert_eq!(parse_log(&l, u).unwrap(), 4 << 20);
        assert!(parse_log(&l, "other").is_err());
        let shifted = String::from_utf8_lossy(&l).replace("shift = 0", "shift = 8");
        assert!(parse_log(shifted.as_bytes(), u).is_err());
        // Truncated and random bytes never panic.
        for n in 0..l.len() {
            let _ = parse_log(&l[..n], u);
        }
        let mut x = 0x1234_5678u64;
        for _ in 0..200 {
            let bytes: Vec<u8> = (0..512)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = parse_log(&bytes, u);
        }
    }
}
