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
//! are dropped.
//!
//! The log's `mode` says what runs: 0 a reencryption (`--keep-key`: the
//! new header holds the old key and no data moves), 1 an encryption (the
//! files are named by cryptsetup's [`NO_UUID`], the old side is a
//! `cipher_null` fake header at offset 0, the device is not marked and
//! the new header lands on it, or in the detached `--header`, at the
//! end), 2 a decryption (the new side is the fake header: the plaintext
//! goes to offset 0 over the header, the old data's tail is zeroed; once
//! the first block is written only `--uuid` names the files, as in
//! cryptsetup's tool). `direction` 1 (`--reduce-device-size`) moves the
//! data up, last block first; a block then never exceeds the shift, so a
//! crash before its log moved redoes it from untouched source. The gap a
//! shift leaves below the new data is zeroed (cryptsetup leaves the
//! plaintext's old head there). Hand-written: no crate implements this
//! format.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::KdfRequest;
use crate::volume::io::{device_size, open_ro, open_rw, read_exact_at, sync, write_at};
use crate::volume::{format, FormatOptions, Volume};
use crate::DeviceAccess;
use crate::Header;

use super::luks1_fake::{self, NO_UUID};
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
    /// Reencryption, encryption or decryption.
    pub mode: Luks1Mode,
    /// `--reduce-device-size` (bytes, a multiple of 512): the data moves
    /// up by this much (encryption: the new header goes below it).
    pub reduce: u64,
    /// `--keep-key`: a new header with the old volume key, no data moved.
    pub keep_key: bool,
    /// The detached header (`--header`).
    pub header: Option<PathBuf>,
    /// `--uuid`: resume the decryption of the volume with this UUID
    /// whose header the plaintext already overwrote.
    pub uuid: Option<String>,
    /// How the device and the headers are opened (locking, Ceph).
    pub access: DeviceAccess,
    /// `--volume-key-file`: a reencryption's new volume key is this
    /// file's first key-size bytes (cryptsetup 2.6.1's LUKS1 tool reads
    /// it there only: an encryption or a decryption ignores it).
    pub volume_key_file: Option<PathBuf>,
}

/// The UUID of a LUKS1 device marked as in reencryption (magic
/// [`NOMAGIC`], version 1); `None` when it is not so marked. `device`
/// is opened as `access` says.
pub fn in_progress(device: &Path, access: &DeviceAccess) -> Result<Option<String>> {
    let mut f = open_ro(device, access)?;
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

/// What a LUKS1 run does, numbered as the log's `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Luks1Mode {
    /// A new volume key (or `--keep-key`: a new header only).
    #[default]
    Reencrypt,
    /// A plaintext device gains LUKS1 (`--encrypt`).
    Encrypt,
    /// The data becomes plaintext (`--decrypt`); the header goes.
    Decrypt,
}

impl Luks1Mode {
    fn number(self) -> u64 {
        match self {
            Luks1Mode::Reencrypt => 0,
            Luks1Mode::Encrypt => 1,
            Luks1Mode::Decrypt => 2,
        }
    }
}

/// The log's state: direction (backward when the data moves to a higher
/// offset, `--reduce-device-size`), mode and offset (bytes of data done
/// going forward; going backward, where the part still to do ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Log {
    pub(crate) backward: bool,
    pub(crate) mode: Luks1Mode,
    pub(crate) offset: u64,
}

impl Log {
    /// What cryptsetup's tool writes before it knows the mode and
    /// direction (a run stopped there has moved nothing).
    fn is_initial(&self) -> bool {
        *self
            == Log {
                backward: false,
                mode: Luks1Mode::Reencrypt,
                offset: 0,
            }
    }
}

/// The log as cryptsetup writes it: one 512-byte sector of text (its
/// `shift` is always 0: cryptsetup 2.6.1 never sets it).
fn log_text(uuid: &str, log: &Log) -> [u8; 512] {
    let text = format!(
        "# LUKS reencryption log, DO NOT EDIT OR DELETE.\nversion = 2\nUUID = {uuid}\n\
         direction = {}\nmode = {}\noffset = {}\nshift = 0\n# EOF\n",
        u8::from(log.backward),
        log.mode.number(),
        log.offset
    );
    let mut out = [0u8; 512];
    let n = text.len().min(511);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

fn write_log(path: &Path, access: &DeviceAccess, uuid: &str, log: &Log) -> Result<()> {
    let mut f = open_rw(path, access)?;
    write_at(&mut *f, 0, &log_text(uuid, log))?;
    crash::point();
    sync(&*f)
}

/// Parses a log sector for `uuid`: direction 0 or 1, mode 0–2, the
/// offset; a nonzero `shift` (never written by cryptsetup 2.6.1) is
/// refused.
pub(crate) fn parse_log(bytes: &[u8], uuid: &str) -> Result<Log> {
    let bad = || invalid("Wrong log format.");
    let text = &bytes[..bytes.len().min(512)];
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let text = std::str::from_utf8(&text[..end]).map_err(|_| bad())?;
    let mut offset = None;
    let (mut backward, mut mode) = (false, Luks1Mode::Reencrypt);
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once(" = ").ok_or_else(bad)?;
        let num = || v.trim().parse::<u64>().map_err(|_| bad());
        match k {
            "version" if matches!(num()?, 1 | 2) => {}
            "UUID" if v.trim() == uuid => {}
            "direction" => {
                backward = match num()? {
                    0 => false,
                    1 => true,
                    _ => return Err(bad()),
                }
            }
            "mode" => {
                mode = match num()? {
                    0 => Luks1Mode::Reencrypt,
                    1 => Luks1Mode::Encrypt,
                    2 => Luks1Mode::Decrypt,
                    _ => return Err(bad()),
                }
            }
            "shift" if num()? == 0 => {}
            "shift" => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "LUKS1 reencryption log with a nonzero shift is not supported by ucrypt.",
                ))
            }
            "offset" => offset = Some(num()?),
            _ => return Err(bad()),
        }
    }
    Ok(Log {
        backward,
        mode,
        offset: offset.ok_or_else(bad)?,
    })
}

/// The UUID naming the files of a LUKS1 run in progress on `device`
/// (header on it, or in `req.header`) for `req`, when one is: the
/// header's mark; for `--encrypt`, cryptsetup's encryption log
/// (`LUKS-`[`NO_UUID`]`.log`) in `dir`; for `--decrypt` with `--uuid`
/// (the header already overwritten by plaintext), that UUID's log.
pub fn resumable(device: &Path, dir: &Path, req: &Luks1Request) -> Result<Option<String>> {
    if req.mode == Luks1Mode::Encrypt {
        let files = Files::of(dir, NO_UUID);
        return Ok(files.log.exists().then(|| NO_UUID.to_string()));
    }
    let hdr = req.header.as_deref().unwrap_or(device);
    if let Some(u) = in_progress(hdr, &req.access)? {
        return Ok(Some(u));
    }
    if let (Luks1Mode::Decrypt, Some(u)) = (req.mode, &req.uuid) {
        if Files::of(dir, u).log.exists() {
            return Ok(Some(u.clone()));
        }
    }
    Ok(None)
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

/// One side of the data copy: the cipher (none for plaintext) and where
/// the data starts on the device.
struct Side {
    crypt: Option<crypto::SectorCrypt>,
    base: u64,
}

impl Side {
    /// The side a header file describes: `cipher_null` is plaintext at
    /// its data offset, anything else is opened with `pass`.
    fn open(
        device: &Path,
        hdr: &Path,
        access: &DeviceAccess,
        pass: &[u8],
        key_slot: Option<u32>,
    ) -> Result<(Side, u64)> {
        let vol = Volume::load(device, Some(hdr), access)?;
        let Header::V1(h) = vol.header() else {
            return Err(invalid("The new LUKS1 header is not LUKS1."));
        };
        let base = u64::from(h.payload_offset) * 512;
        let size = vol.data_size().saturating_sub(base) / 512 * 512;
        if h.cipher_name == "cipher_null" {
            return Ok((Side { crypt: None, base }, size));
        }
        let opened = vol.unlock(pass, key_slot)?;
        let crypt = crypto::SectorCrypt::new(&opened.crypt_config()).map_err(|e| {
            Error::crypto(ErrorKind::InvalidArgument, "Cannot set up the cipher", e)
        })?;
        Ok((
            Side {
                crypt: Some(crypt),
                base,
            },
            size,
        ))
    }

    fn is_null(hdr: &Path) -> Result<bool> {
        let bytes = std::fs::read(hdr)
            .map_err(|e| Error::io(format!("Cannot read {}", hdr.display()), e))?;
        match Header::from_bytes(&bytes)? {
            Header::V1(h) => Ok(h.cipher_name == "cipher_null"),
            Header::V2(_) => Err(invalid("The LUKS1 reencryption header is not LUKS1.")),
        }
    }
}

/// Old ciphertext (or plaintext) to new, in place, sector by sector from
/// data sector `at`.
fn convert(old: &Side, new: &Side, at: u64, b: &mut [u8]) {
    if let Some(c) = &old.crypt {
        c.decrypt(at, b);
    }
    if let Some(c) = &new.crypt {
        c.encrypt(at, b);
    }
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
    let hdr_dev = req.header.as_deref().unwrap_or(device);
    let _claim = crate::volume::io::claim(&[device])?;
    let (uuid, files, log, fresh) = match resumable(device, dir, req)? {
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
            let log = parse_log(&log, &uuid)?;
            (uuid, files, log, false)
        }
        None => {
            if req.uuid.is_some() {
                return Err(invalid(
                    "No decryption in progress, provided UUID can be used only to resume \
                     suspended decryption process.",
                ));
            }
            let (uuid, files, log) = init(device, dir, pass, key_slot, slots, req)?;
            (uuid, files, log, true)
        }
    };
    // The headers say what the run does: a cipher_null side is the
    // plaintext (cryptsetup's log says mode 0 until its data copy starts).
    let mode = match (Side::is_null(&files.org)?, Side::is_null(&files.new)?) {
        (true, false) => Luks1Mode::Encrypt,
        (false, true) => Luks1Mode::Decrypt,
        (false, false) => Luks1Mode::Reencrypt,
        (true, true) => return Err(invalid("Wrong log format.")),
    };
    let (old, old_size) = Side::open(device, &files.org, &req.access, pass, key_slot)?;
    let (new, new_size) = Side::open(device, &files.new, &req.access, pass, key_slot)?;
    let backward = new.base > old.base;
    let total = if mode == Luks1Mode::Decrypt {
        old_size
    } else {
        new_size
    };
    let mut done = log.offset;
    if !log.is_initial() && (log.mode != mode || log.backward != backward) {
        return Err(invalid("Wrong log format."));
    }
    if backward && !log.backward {
        // Nothing moved yet: a backward run starts at the end.
        done = total;
    }
    if done > total || done % 512 != 0 {
        return Err(invalid("Wrong log format."));
    }
    let log = Log {
        backward,
        mode,
        offset: done,
    };
    let mut f = open_rw(device, &req.access)?;
    // `--keep-key` moves no data; neither does a resumed run whose two
    // headers share the key at the same offset.
    if !(fresh && req.keep_key) {
        copy(
            &mut *f,
            &files,
            &req.access,
            &uuid,
            &old,
            &new,
            log,
            total,
            stop,
            progress,
        )?;
        if stop.load(Ordering::Relaxed) {
            return Ok(Outcome::Interrupted);
        }
    }
    finish(
        &mut *f, device, hdr_dev, &files, mode, &old, &new, total, req,
    )?;
    Ok(Outcome::Finished)
}

/// The data copy from `log` on, in blocks: forward, or backward when
/// the data moves up (a data shift). A block whose source and target
/// overlap is protected by the sum file; a shifting block is never
/// longer than the shift, so its source survives its own write and a
/// crash before the log moved redoes it from intact data.
#[allow(clippy::too_many_arguments)]
fn copy(
    f: &mut dyn crate::volume::io::Device,
    files: &Files,
    access: &DeviceAccess,
    uuid: &str,
    old: &Side,
    new: &Side,
    log: Log,
    total: u64,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let in_place = old.base == new.base;
    let block = if in_place {
        BLOCK
    } else {
        BLOCK.min(old.base.abs_diff(new.base))
    };
    let mut buf = vec![0u8; block.min(total.max(512)) as usize];
    let mut done = log.offset;
    let shown = |d: u64| if log.backward { total - d } else { d };
    progress(shown(done), total);
    // A block written (wholly or in part) before a crash, its log not
    // yet moved: the sectors that no longer match its sum are new already.
    let mut written: Option<Vec<[u8; 32]>> = if in_place {
        std::fs::read(&files.sum)
            .ok()
            .and_then(|b| parse_sum(&b, done, (total - done).min(block) as usize))
    } else {
        None
    };
    loop {
        let (at, len) = if log.backward {
            if done == 0 {
                break;
            }
            let at = done.saturating_sub(block);
            (at, (done - at) as usize)
        } else {
            if done >= total {
                break;
            }
            (done, (total - done).min(block) as usize)
        };
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let b = &mut buf[..len];
        read_exact_at(f, old.base + at, b)?;
        match written.take() {
            Some(sums) => {
                use sha2::{Digest, Sha256};
                for (i, sector) in b.chunks_exact_mut(SUM_SECTOR).enumerate() {
                    if Sha256::digest(&*sector).as_slice() == sums[i] {
                        convert(old, new, (at + (i * SUM_SECTOR) as u64) / 512, sector);
                    }
                }
            }
            None => {
                if in_place {
                    write_sum(&files.sum, at, b)?;
                }
                convert(old, new, at / 512, b);
            }
        }
        write_at(f, new.base + at, b)?;
        crash::point();
        sync(f)?;
        done = if log.backward { at } else { at + len as u64 };
        write_log(
            &files.log,
            access,
            uuid,
            &Log {
                offset: done,
                ..log
            },
        )?;
        progress(shown(done), total);
    }
    buf.iter_mut().for_each(|b| *b = 0);
    Ok(())
}

/// After the data: a decryption zeroes what follows the plaintext (the
/// old data's tail, as cryptsetup wipes it); an encryption or
/// reencryption zeroes the gap a data shift leaves below the new data and
/// writes the new header over the marked one (or into the detached
/// header file). Then the files go.
#[allow(clippy::too_many_arguments)]
fn finish(
    f: &mut dyn crate::volume::io::Device,
    device: &Path,
    hdr_dev: &Path,
    files: &Files,
    mode: Luks1Mode,
    old: &Side,
    new: &Side,
    total: u64,
    req: &Luks1Request,
) -> Result<()> {
    if mode == Luks1Mode::Decrypt {
        let end = device_size(f, device)? / 512 * 512;
        if end > total {
            crate::volume::io::zero_range(f, total, end - total)?;
            crash::point();
            sync(f)?;
        }
    } else {
        let hdr = std::fs::read(&files.new)
            .map_err(|e| Error::io(format!("Cannot read {}", files.new.display()), e))?;
        let Header::V1(h) = Header::from_bytes(&hdr)? else {
            return Err(invalid("The new LUKS1 header is not LUKS1."));
        };
        let meta_end = h.metadata_end();
        // What a shift leaves below the data (the plaintext's old head,
        // for an encryption) does not outlive the run.
        let gap = if req.header.is_none() {
            meta_end
        } else {
            old.base
        };
        if new.base > old.base && new.base > gap {
            crate::volume::io::zero_range(f, gap, new.base - gap)?;
            sync(f)?;
        }
        let end = (meta_end as usize).min(hdr.len());
        if req.header.is_some() {
            write_detached(hdr_dev, &hdr[..end], &req.access)?;
        } else {
            // Through the device's own (locked) handle.
            write_at(f, 0, &hdr[..end])?;
            crash::point();
            sync(f)?;
        }
    }
    for p in [&files.log, &files.org, &files.new, &files.sum] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// The new header's write to the detached `--header` file (created if
/// missing), under the metadata lock as every header write
/// ([`open_rw`]): a cryptsetup or ucrypt reading or writing it
/// meanwhile is waited for.
fn write_detached(path: &Path, bytes: &[u8], access: &DeviceAccess) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io(format!("Cannot open {}", path.display()), e))?;
    let mut h = open_rw(path, access)?;
    write_at(&mut *h, 0, bytes)?;
    crash::point();
    sync(&*h)
}

/// Whether the first bytes of `path` are a LUKS header or one marked by
/// a LUKS1 reencryption: `Some(true)` for a header, `Some(false)` for a
/// mark, `None` for neither (or no such file).
fn luks_magic(path: &Path) -> Option<bool> {
    let mut head = [0u8; 6];
    let f = std::fs::File::open(path).ok()?;
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut head, 0).ok()?;
    match head {
        [b'L', b'U', b'K', b'S', 0xba, 0xbe] => Some(true),
        h if h == NOMAGIC => Some(false),
        _ => None,
    }
}

/// Starts an encryption: refuses a device (or detached header) that is
/// already LUKS and a device too small for the reduction; writes the log,
/// the plaintext's fake header and the new header (its data at the
/// reduction, or at 0 with a detached header). The device itself is not
/// touched (cryptsetup's order: the plaintext stays readable until the
/// header is written at the end).
fn init_encrypt(
    device: &Path,
    dir: &Path,
    pass: &[u8],
    key_slot: Option<u32>,
    req: &Luks1Request,
) -> Result<(String, Files, Log)> {
    for p in std::iter::once(device).chain(req.header.as_deref()) {
        match luks_magic(p) {
            Some(true) => {
                return Err(invalid(format!(
                    "Device {} is already LUKS device. Aborting operation.",
                    p.display()
                )))
            }
            Some(false) => {
                return Err(invalid(format!(
                    "Device {} is already in LUKS reencryption. Aborting operation.",
                    p.display()
                )))
            }
            None => {}
        }
    }
    let key_bits = req.key_bits.unwrap_or(256);
    let hash = req.hash.unwrap_or(Hash::Sha256);
    let slot = key_slot.unwrap_or(0);
    let mut dev = open_ro(device, &req.access)?;
    let size = device_size(&mut *dev, device)? / 512 * 512;
    drop(dev);
    let reduce = req.reduce;
    if reduce >= size {
        return Err(Error::new(
            ErrorKind::DeviceSize,
            format!("Device {} is too small.", device.display()),
        ));
    }
    let meta_end = crate::luks1::keyslot_layout(key_bits / 8).1 * 512;
    if req.header.is_none() && meta_end > reduce {
        return Err(invalid(format!(
            "Reduce size {reduce} is smaller than the LUKS1 header ({meta_end} bytes): use \
             --reduce-device-size {meta_end} or more."
        )));
    }
    let cipher = req
        .cipher
        .clone()
        .unwrap_or_else(|| "aes-xts-plain64".into());
    let opts = FormatOptions {
        version: 1,
        cipher,
        key_bits: Some(key_bits),
        hash,
        kdf: req.kdf.clone(),
        key_slot: Some(slot),
        data_offset: Some(reduce),
        force: true,
        access: req.access.clone(),
        ..FormatOptions::default()
    };
    // Checked before anything is written.
    opts.check(true)?;
    let uuid = NO_UUID.to_string();
    let files = Files::of(dir, &uuid);
    let log = Log {
        backward: reduce > 0,
        mode: Luks1Mode::Encrypt,
        offset: if reduce > 0 { size - reduce } else { 0 },
    };
    create_log(&files, &uuid, &log)?;
    let headers = luks1_fake::write(&files.org, key_bits, hash, slot)
        .and_then(|_| format(device, Some(files.new.as_path()), &opts, pass).map(drop));
    abandon_on_error(&files, headers)?;
    crash::point();
    Ok((uuid, files, log))
}

/// Creates the log (exclusively: another run's log is refused) and
/// clears the other files of an earlier, abandoned run.
fn create_log(files: &Files, uuid: &str, log: &Log) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
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
    f.write_all(&log_text(uuid, log))
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io("Cannot write reencryption log file.", e))?;
    for p in [&files.org, &files.new, &files.sum] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Starts a reencryption or decryption: checks the volume and the
/// passphrases, writes the log, the old header's backup and the new
/// header (a fake `cipher_null` one for a decryption), then marks the
/// header.
fn init(
    device: &Path,
    dir: &Path,
    pass: &[u8],
    key_slot: Option<u32>,
    slots: &[super::SlotPassphrase<'_>],
    req: &Luks1Request,
) -> Result<(String, Files, Log)> {
    if req.mode == Luks1Mode::Encrypt {
        return init_encrypt(device, dir, pass, key_slot, req);
    }
    let hdr_dev = req.header.as_deref().unwrap_or(device);
    let vol = Volume::load(device, req.header.as_deref(), &req.access)?;
    let Header::V1(h) = vol.header() else {
        return Err(invalid(format!(
            "Device {} is not a valid LUKS1 device.",
            hdr_dev.display()
        )));
    };
    let active = vol.header().active_slots();
    if slots.is_empty() && key_slot.is_none() && active.len() != 1 && req.mode != Luks1Mode::Decrypt
    {
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
    let data_offset = opened.payload_offset + req.reduce;
    let size = vol.data_size() / 512 * 512;
    if data_offset >= size {
        return Err(Error::new(
            ErrorKind::DeviceSize,
            format!("Device {} is too small.", device.display()),
        ));
    }
    let opts = FormatOptions {
        version: 1,
        cipher: req.cipher.clone().unwrap_or_else(|| opened.cipher.clone()),
        key_bits: Some(req.key_bits.unwrap_or(opened.volume_key.len() as u32 * 8)),
        hash: req.hash.unwrap_or(Hash::Sha256),
        kdf: req.kdf.clone(),
        uuid: Some(h.uuid.clone()),
        key_slot: Some(opened.keyslot),
        data_offset: Some(data_offset),
        // The file was just emptied: nothing to protect in it.
        force: true,
        access: req.access.clone(),
        ..FormatOptions::default()
    };
    if req.mode == Luks1Mode::Reencrypt {
        opts.check(true)?;
        let new_meta = crate::luks1::keyslot_layout(opts.key_bits.unwrap_or(0) / 8).1 * 512;
        if req.header.is_none() && new_meta > data_offset {
            return Err(invalid(format!(
                "The new LUKS1 header ({new_meta} bytes) does not fit below the data offset \
                 {data_offset}: use --reduce-device-size."
            )));
        }
    }
    let uuid = h.uuid.clone();
    let files = Files::of(dir, &uuid);
    let backward = req.reduce > 0;
    let log = Log {
        backward,
        mode: req.mode,
        offset: if backward { size - data_offset } else { 0 },
    };
    create_log(&files, &uuid, &log)?;
    let headers = vol
        .header_backup(&files.org)
        .and_then(|_| new_header(device, &files, pass, slots, req, opts, &opened));
    abandon_on_error(&files, headers)?;
    crash::point();
    // Marked: no LUKS tool opens the device until the new header is on it.
    let mut f = open_rw(hdr_dev, &req.access)?;
    write_at(&mut *f, 0, &NOMAGIC)?;
    crash::point();
    sync(&*f)?;
    Ok((uuid, files, log))
}

/// A start refused before the device was touched (a KDF cost out of
/// range, say) leaves no file behind, as cryptsetup's tool removes its own.
fn abandon_on_error(files: &Files, r: Result<()>) -> Result<()> {
    if r.is_err() {
        for p in [&files.log, &files.org, &files.new, &files.sum] {
            let _ = std::fs::remove_file(p);
        }
    }
    r
}

/// The new header of a reencryption (a new key, or the old one with
/// `--keep-key`; every renewed keyslot in its own number) or the fake
/// one of a decryption.
fn new_header(
    device: &Path,
    files: &Files,
    pass: &[u8],
    slots: &[super::SlotPassphrase<'_>],
    req: &Luks1Request,
    opts: FormatOptions,
    opened: &crate::Opened,
) -> Result<()> {
    if req.mode == Luks1Mode::Decrypt {
        let bits = req.key_bits.unwrap_or(256);
        luks1_fake::write(&files.new, bits, opts.hash, opened.keyslot)?;
    } else {
        let len = (opts.key_bits.unwrap_or(0) / 8) as usize;
        let new_vk = if req.keep_key {
            zeroize::Zeroizing::new(opened.volume_key.to_vec())
        } else if let (Some(f), Luks1Mode::Reencrypt) = (&req.volume_key_file, req.mode) {
            zeroize::Zeroizing::new(super::volume_key::read(f, len)?.to_vec())
        } else {
            crate::keyslot::random(len)?
        };
        let opts = FormatOptions {
            volume_key: Some(new_vk.clone()),
            ..opts
        };
        let mut new_vol = format(device, Some(files.new.as_path()), &opts, pass)?;
        // The other renewed keyslots, in their own slot numbers.
        for s in slots.iter().skip(1) {
            new_vol.add_key(&new_vk, s.pass, Some(s.slot), &req.kdf)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detached_header_is_written_under_the_metadata_lock() {
        use rustix::fs::{flock, FlockOperation};
        let dir = std::env::temp_dir().join(format!("luks1-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hdr");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        // Another holder (an open file description of its own, as another
        // process's) has the exclusive lock.
        let holder = std::fs::File::open(&path).unwrap();
        flock(&holder, FlockOperation::LockExclusive).unwrap();
        let p = path.clone();
        let writer =
            std::thread::spawn(move || write_detached(&p, &[0xa5; 512], &DeviceAccess::default()));
        // Not written while the lock is held.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!writer.is_finished(), "the write did not wait for the lock");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            [0u8; 4096],
            "written under the lock"
        );
        drop(holder);
        writer.join().unwrap().unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[..512], [0xa5; 512]);
        let _ = std::fs::remove_dir_all(&dir);
    }

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
        for log in [
            Log {
                backward: false,
                mode: Luks1Mode::Reencrypt,
                offset: 4 << 20,
            },
            Log {
                backward: true,
                mode: Luks1Mode::Encrypt,
                offset: 512,
            },
            Log {
                backward: false,
                mode: Luks1Mode::Decrypt,
                offset: 0,
            },
        ] {
            assert_eq!(parse_log(&log_text(u, &log), u).unwrap(), log);
        }
        let l = log_text(
            u,
            &Log {
                backward: false,
                mode: Luks1Mode::Reencrypt,
                offset: 4 << 20,
            },
        );
        assert!(parse_log(&l, "other").is_err());
        let text = String::from_utf8_lossy(&l).to_string();
        for (from, to) in [
            ("shift = 0", "shift = 8"),
            ("mode = 0", "mode = 3"),
            ("direction = 0", "direction = 2"),
        ] {
            assert!(
                parse_log(text.replace(from, to).as_bytes(), u).is_err(),
                "{to}"
            );
        }
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
