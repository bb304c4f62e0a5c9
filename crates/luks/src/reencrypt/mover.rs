//! The data mover: reads a hotzone of the data area, protects it as the
//! resilience mode asks (checksum or journal in the reencrypt keyslot's
//! area, then the header naming the hotzone), reencrypts it with the old
//! and the new sector cipher and writes it back; and repairs a hotzone a
//! crash tore.
//!
//! A hotzone moves in pieces of [`PIECE`] bytes spread over a few
//! threads (one per core, at most [`MAX_WORKERS`]), each thread taking
//! the next piece and doing all of that piece's work (read, hash or
//! reencrypt, write), so the reads, the hashing and the crypto of one
//! hotzone run on every core. The phases of a hotzone stay in order:
//!
//! ```text
//!   checksum, journal:  pieces read (hashed)  ─┐ all of them, then
//!                       area written, synced, header (in-reencryption)
//!                       pieces reencrypted, written ─┐ all of them, then
//!                       data synced, header past the hotzone
//!   none, datashift:    pieces read, reencrypted, written
//! ```
//!
//! Within a phase the pieces finish in any order, which every resilience
//! mode allows: a checksum repair decides block by block, a journal or a
//! data shift redoes the whole hotzone. A hotzone up to [`HELD_MAX`] (and
//! a journal's, which its area bounds) stays in memory between its
//! protection and its write; a larger one (a checksum hotzone reaches
//! 1 GiB) is read a second time for the write, so the memory is one
//! piece per thread, not the hotzone. The buffers are allocated once per
//! run and wiped when the mover is dropped (they held plaintext between
//! the two ciphers).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use zeroize::Zeroizing;

use super::header::{self, RawHeader};
use super::state::{Resilience, State};
use super::{crash, data_size, make_segments, DEFAULT_NONE_HOTZONE, MAX_HOTZONE, MIN_ALIGNMENT};
use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::luks2::json::Segment;
use crate::volume::io::{open_ro, open_rw, read_exact_at, sync, write_at};
use crate::DeviceAccess;

/// Bytes one thread moves at a time: a multiple of every checksum block
/// (at most 1 MiB) and sector size; each written piece is a crash point.
const PIECE: usize = 1 << 20;
/// The most threads one hotzone is spread over.
const MAX_WORKERS: usize = 8;
/// The largest hotzone kept in memory between its protection and its
/// write (a journal's always is: it is written whole to its area).
const HELD_MAX: u64 = 4 << 20;
/// The crypto goes through a piece in steps of this size, decrypting and
/// then encrypting each while it is in the cache (a multiple of every
/// sector size).
const CRYPT_STEP: usize = 64 << 10;

/// Builds a segment's sector crypto from its volume key (`None`: a
/// `linear` segment, plaintext).
type MakeCrypt<'a> = dyn Fn(&Segment, &[u8]) -> Result<Option<crypto::SectorCrypt>> + 'a;

/// Moves the data: the device and where its bytes are, the old and the
/// new sector ciphers (shared by the threads of a hotzone).
struct Data {
    file: File,
    /// `None`: that side is plaintext (a `linear` segment).
    old: Option<crypto::SectorCrypt>,
    new: Option<crypto::SectorCrypt>,
    /// Where the data area starts before and after (they differ by the
    /// shift of a data shift).
    base: u64,
    target: u64,
    /// A data shift: where the data's first `shift` bytes wait.
    moved: Option<u64>,
}

/// What the threads do to each piece of a hotzone.
#[derive(Clone, Copy)]
enum Job {
    /// Read it (into the held hotzone).
    Read,
    /// Read it and hash each block into the piece's checksums.
    Hash { hash: Hash, block: usize },
    /// Reencrypt and write it, read first unless it is held.
    Move { read: bool },
    /// A torn hotzone: read it, and reencrypt and write each block whose
    /// hash is the piece's checksum (still old).
    Repair { hash: Hash, block: usize },
}

/// Moves the data: the device, the ciphers, the hotzone size and the
/// buffers of a run.
pub(super) struct Mover {
    data: Data,
    meta_path: PathBuf,
    /// How the header is opened (locking, Ceph).
    access: DeviceAccess,
    backward: bool,
    /// A data shift's size (0 otherwise).
    shift: u64,
    /// A decryption with a data shift: the moved segment's length and
    /// the protection of its hotzone, the last (see [`Mover::place`]).
    dshift: Option<(u64, Resilience)>,
    /// The data device's size.
    dev_size: u64,
    pub(super) size: u64,
    pub(super) hotzone: u64,
    /// Threads per hotzone.
    workers: usize,
    /// Whether a hotzone stays in `buf` between its protection and its
    /// write.
    held: bool,
    /// A held hotzone, or one piece per thread (at least that either
    /// way): allocated at the first hotzone, wiped on drop.
    buf: Zeroizing<Vec<u8>>,
    /// The checksums of a hotzone's blocks (hashes of ciphertext).
    sums: Vec<u8>,
}

impl Mover {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        device: &Path,
        meta: &Path,
        dev_size: u64,
        st: &State,
        old_vk: &[u8],
        new_vk: &[u8],
        want: u64,
        access: &DeviceAccess,
    ) -> Result<Self> {
        let mk = |s: &Segment, k: &[u8]| {
            if s.kind == "linear" {
                return Ok(None);
            }
            crypto::SectorCrypt::new(&crypto::CryptConfig {
                cipher: s.encryption.clone(),
                key: Zeroizing::new(k.to_vec()),
                iv_offset: s.iv_tweak,
                sector_size: s.sector_size,
                iv_large_sectors: false,
            })
            .map_err(|e| {
                Error::crypto(
                    ErrorKind::Unsupported,
                    format!("Cipher {} is not supported", s.encryption),
                    e,
                )
            })
            .map(Some)
        };
        let align = match st.resilience {
            Resilience::Checksum { block, .. } => u64::from(block),
            _ => MIN_ALIGNMENT,
        }
        .max(u64::from(st.old.sector_size.max(st.new.sector_size)));
        if let Resilience::Datashift { shift } = st.resilience {
            // cryptsetup's hotzone with a data shift is the shift itself
            // (`--hotzone-size` does not apply; for a decryption it sized
            // the moved segment at the init).
            let _ = want;
            return Self::open(
                device, meta, access, dev_size, st, old_vk, new_vk, shift, &mk,
            );
        }
        let max = match st.resilience {
            Resilience::Checksum { hash, block } => {
                st.area.1 / hash.digest_len() as u64 * u64::from(block)
            }
            Resilience::Journal => st.area.1,
            Resilience::None => {
                if want > 0 {
                    want
                } else {
                    DEFAULT_NONE_HOTZONE
                }
            }
            Resilience::Datashift { shift } => shift,
        }
        .min(MAX_HOTZONE);
        if want % align != 0 {
            return Err(invalid(format!(
                "Hotzone size must be multiple of calculated zone alignment ({align} bytes)."
            )));
        }
        let mut hotzone = if want > 0 { want.min(max) } else { max };
        hotzone -= hotzone % align;
        if hotzone == 0 {
            return Err(invalid("Invalid reencryption length."));
        }
        Self::open(
            device, meta, access, dev_size, st, old_vk, new_vk, hotzone, &mk,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        device: &Path,
        meta: &Path,
        access: &DeviceAccess,
        dev_size: u64,
        st: &State,
        old_vk: &[u8],
        new_vk: &[u8],
        hotzone: u64,
        mk: &MakeCrypt<'_>,
    ) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .map_err(|e| Error::io(format!("Cannot open {} for writing", device.display()), e))?;
        let size = data_size(dev_size, st)?;
        let workers = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, MAX_WORKERS);
        let dshift = st
            .moved_resilience
            .filter(|_| st.moved.is_some())
            .map(|r| (st.moved_len(), r));
        let held = match st.resilience {
            // The moved segment's hotzone (checksum or journal) is held.
            Resilience::Datashift { .. } if dshift.is_some() => true,
            Resilience::Journal => true,
            Resilience::Checksum { .. } => hotzone <= HELD_MAX,
            // Read, reencrypted and written piece by piece: nothing is
            // kept between two phases.
            Resilience::None | Resilience::Datashift { .. } => false,
        };
        Ok(Mover {
            data: Data {
                file,
                old: mk(&st.old, old_vk)?,
                new: mk(&st.new, new_vk)?,
                base: st.old.offset,
                target: st.new.offset,
                moved: st.moved.as_ref().map(|m| m.offset),
            },
            meta_path: meta.to_path_buf(),
            access: access.clone(),
            backward: st.backward,
            shift: match st.resilience {
                Resilience::Datashift { shift } => shift,
                _ => 0,
            },
            dshift,
            dev_size,
            size,
            hotzone,
            workers,
            held,
            buf: Zeroizing::new(Vec::new()),
            sums: Vec::new(),
        })
    }

    /// The length of the hotzone after `done` bytes. With a data shift
    /// the data's first `shift` bytes (read from the moved segment) are
    /// one hotzone of their own, the last, as cryptsetup cuts them.
    pub(super) fn next_len(&self, done: u64) -> u64 {
        let left = self.size - done;
        if let Some((m, _)) = self.dshift {
            // A decryption with a data shift: hotzones of `shift` bytes
            // after the moved segment, then the moved segment itself.
            let rest = self.size.saturating_sub(m);
            return if done < rest {
                self.shift.min(rest - done)
            } else {
                m
            };
        }
        if self.data.moved.is_none() {
            return self.hotzone.min(left);
        }
        match left.checked_sub(self.shift) {
            Some(0) | None => left,
            Some(rest) if rest < self.shift => rest,
            Some(_) => self.shift,
        }
    }

    /// Grows the buffer to hold `len` bytes held, or one piece per
    /// thread (`len == 0`). It grows only to the largest hotzone the run
    /// moves: once, in a run of equal hotzones.
    fn reserve(&mut self, len: u64) {
        let want = (self.workers * PIECE).max(len as usize);
        if self.buf.len() < want {
            // The old contents are wiped with the old allocation.
            let mut grown = Zeroizing::new(vec![0u8; want]);
            std::mem::swap(&mut self.buf, &mut grown);
        }
    }

    /// Runs `job` over the pieces of the hotzone `[off, off+len)` of the
    /// data area on the mover's threads; `held`: the hotzone is (or is
    /// to be) in the buffer, else each thread reads its pieces into a
    /// piece of its own. A job with checksums finds each piece's in
    /// `self.sums`. Returns the first error; the other threads stop at
    /// their next piece.
    fn pieces(&mut self, off: u64, len: u64, held: bool, job: Job) -> Result<()> {
        self.reserve(if held { len } else { 0 });
        let data = &self.data;
        let len = len as usize;
        let per_sums = match job {
            Job::Hash { hash, block } | Job::Repair { hash, block } => {
                PIECE / block * hash.digest_len()
            }
            Job::Read | Job::Move { .. } => 0,
        };
        // Each piece's place in the hotzone, its bytes when held, its
        // checksums when the job has any.
        type Item<'a> = (usize, Option<&'a mut [u8]>, &'a mut [u8]);
        let (mut held_bufs, scratch): (Vec<&mut [u8]>, Vec<&mut [u8]>) = if held {
            (self.buf[..len].chunks_mut(PIECE).collect(), Vec::new())
        } else {
            (Vec::new(), self.buf.chunks_mut(PIECE).collect())
        };
        let sums: &mut [u8] = if per_sums > 0 {
            &mut self.sums
        } else {
            &mut []
        };
        let mut sums = sums.chunks_mut(per_sums.max(1));
        let items: Vec<Item<'_>> = (0..len)
            .step_by(PIECE)
            .enumerate()
            .map(|(i, at)| {
                let b = (i < held_bufs.len()).then(|| std::mem::take(&mut held_bufs[i]));
                (at, b, sums.next().unwrap_or_default())
            })
            .collect();
        let queue = Mutex::new(items.into_iter());
        let failed = AtomicBool::new(false);
        let worker = |scratch: Option<&mut [u8]>| -> Result<()> {
            let mut scratch = scratch;
            loop {
                if failed.load(Ordering::Relaxed) {
                    return Ok(());
                }
                // A poisoned lock means another thread panicked; the
                // scope re-raises its panic.
                let Some((at, b, sums)) = queue.lock().ok().and_then(|mut q| q.next()) else {
                    return Ok(());
                };
                let n = PIECE.min(len - at);
                let buf: &mut [u8] = match (b, scratch.as_deref_mut()) {
                    (Some(b), _) => b,
                    (None, Some(s)) => &mut s[..n],
                    // Invariant: not held, every thread has a scratch piece.
                    (None, None) => unreachable!("a thread without a buffer"),
                };
                if let Err(e) = data.piece(off, at as u64, buf, sums, job) {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        };
        let threads = self.workers.min(len.div_ceil(PIECE)).max(1);
        let mut scratch = scratch.into_iter();
        let worker = &worker;
        std::thread::scope(|s| {
            let others: Vec<_> = (1..threads)
                .map(|_| {
                    let mine = scratch.next();
                    s.spawn(move || worker(mine))
                })
                .collect();
            let mut res = worker(scratch.next());
            for t in others {
                // A thread's panic is this thread's.
                let r = t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                res = res.and(r);
            }
            res
        })
    }

    /// Where the hotzone of `len` bytes after `done` bytes lies in the
    /// data area: forward from its start, backward from its end; a
    /// decryption with a data shift does the data after its moved
    /// segment (`M` bytes, at the start of the device) forward, then the
    /// moved segment in place.
    pub(super) fn place(&self, done: u64, len: u64) -> u64 {
        match self.dshift {
            Some((m, _)) if done + m >= self.size => 0,
            Some((m, _)) => m + done,
            None if self.backward => self.size - done - len,
            None => done,
        }
    }

    /// The bytes done once the hotzone `[off, off+len)` is (the inverse
    /// of [`Mover::place`]).
    pub(super) fn done_after(&self, off: u64, len: u64) -> u64 {
        match self.dshift {
            Some(_) if off == 0 => self.size,
            Some((m, _)) => (off + len).saturating_sub(m),
            None if self.backward => self.size.saturating_sub(off),
            None => off + len,
        }
    }

    /// The protection of the hotzone at `off`: a decryption with a data
    /// shift protects its moved segment, decrypted in place, as
    /// `datashift-checksum` or `datashift-journal` say.
    fn protection(&self, st: &State, off: u64) -> Resilience {
        match self.dshift {
            Some((_, r)) if off == 0 => r,
            _ => st.resilience,
        }
    }

    /// Overwrites the moved segment (plaintext) with random bytes, as
    /// cryptsetup does once an encryption with a data shift is done;
    /// after a decryption with a data shift, the last `shift` bytes of
    /// the device (ciphertext left behind).
    pub(super) fn wipe_moved(&mut self) -> Result<()> {
        let Some(m) = self.data.moved else {
            return Ok(());
        };
        let m = if self.dshift.is_some() {
            self.dev_size.saturating_sub(self.shift)
        } else {
            m
        };
        let mut left = self.shift;
        let mut at = m;
        let mut chunk = vec![0u8; (1 << 20).min(self.shift as usize)];
        while left > 0 {
            let n = (chunk.len() as u64).min(left) as usize;
            getrandom::fill(&mut chunk[..n])
                .map_err(|e| crate::error::random_error(ErrorKind::Corrupt, "No randomness", e))?;
            self.data
                .file
                .write_all_at(&chunk[..n], at)
                .map_err(|e| Error::io("Failed to wipe unused data device area.", e))?;
            at += n as u64;
            left -= n as u64;
        }
        self.data.sync()
    }

    /// One hotzone of `len` bytes next to the `done` bytes already
    /// reencrypted (forward: from the data start; backward: from its end).
    pub(super) fn step(
        &mut self,
        h: &mut RawHeader,
        st: &State,
        done: u64,
        len: u64,
    ) -> Result<()> {
        let off = self.place(done, len);
        let held = self.held;
        let resilience = self.protection(st, off);
        let protect = resilience != Resilience::None;
        if protect {
            let mut f = open_rw(&self.meta_path, &self.access)?;
            match resilience {
                Resilience::Checksum { hash, block } => {
                    // A last hotzone shorter than a whole number of
                    // blocks (a data area in smaller sectors) hashes its
                    // short last block as it is.
                    let n = len.div_ceil(u64::from(block)) as usize * hash.digest_len();
                    self.sums.resize(n, 0);
                    let block = block as usize;
                    self.pieces(off, len, held, Job::Hash { hash, block })?;
                    write_at(&mut *f, st.area.0, &self.sums[..n])?;
                }
                Resilience::Journal => {
                    self.pieces(off, len, true, Job::Read)?;
                    write_at(&mut *f, st.area.0, &self.buf[..len as usize])?;
                }
                // The source stays where it is: the header naming the
                // hotzone is the whole protection.
                Resilience::None | Resilience::Datashift { .. } => {}
            }
            sync(&*f)?;
            crash::point();
            make_segments(h, st, done, Some(len), self.size)?;
            h.write(&mut *f)?;
        }
        match resilience {
            Resilience::Checksum { .. } => {
                self.pieces(off, len, held, Job::Move { read: !held })?
            }
            Resilience::Journal => self.pieces(off, len, true, Job::Move { read: false })?,
            Resilience::None | Resilience::Datashift { .. } => {
                self.pieces(off, len, false, Job::Move { read: true })?
            }
        }
        if protect {
            self.data.sync()?;
            make_segments(h, st, done + len, None, self.size)?;
            // After the last hotzone the next header is the final one
            // (`finalize`): a header with every byte new but still in
            // reencryption is never written, as cryptsetup 2.6.1 would
            // resume such a header from the start.
            if done + len < self.size {
                h.write(&mut *open_rw(&self.meta_path, &self.access)?)?;
            } else {
                h.meta = header::ordinary_view(&h.json, h.bin.hdr_size)?;
            }
        }
        Ok(())
    }

    /// Repairs the hotzone `[off, off+len)` a crash interrupted.
    pub(super) fn recover(&mut self, _h: &RawHeader, st: &State, off: u64, len: u64) -> Result<()> {
        if len == 0 || off + len > self.size {
            return Err(corrupt("LUKS2 hotzone segment lies outside the data area"));
        }
        match self.protection(st, off) {
            Resilience::Checksum { hash, block } => {
                let dl = hash.digest_len();
                let whole = (len / u64::from(block)) as usize;
                if (whole * dl) as u64 > st.area.1 {
                    return Err(corrupt("LUKS2 hotzone is larger than its checksum area"));
                }
                // A short last block has a checksum when the area holds
                // one more (ucrypt's: its own bytes hashed). cryptsetup
                // hashes a whole block from its buffer there, which never
                // matches, and repairs whole blocks only: such a block is
                // left as it is, as cryptsetup leaves it.
                let count = match len.div_ceil(u64::from(block)) as usize {
                    c if (c * dl) as u64 <= st.area.1 => c,
                    _ => whole,
                };
                self.sums.resize(count * dl, 0);
                read_exact_at(
                    &mut *open_ro(&self.meta_path, &self.access)?,
                    st.area.0,
                    &mut self.sums[..count * dl],
                )?;
                let block = block as usize;
                self.pieces(off, len, false, Job::Repair { hash, block })?;
            }
            Resilience::Journal => {
                if len > st.area.1 {
                    return Err(corrupt("LUKS2 hotzone is larger than its journal"));
                }
                self.reserve(len);
                read_exact_at(
                    &mut *open_ro(&self.meta_path, &self.access)?,
                    st.area.0,
                    &mut self.buf[..len as usize],
                )?;
                self.pieces(off, len, true, Job::Move { read: false })?;
            }
            Resilience::None => {
                return Err(corrupt(
                    "LUKS2 hotzone with resilience none cannot be recovered",
                ))
            }
            Resilience::Datashift { shift } => {
                // The hotzone's source is untouched (its target lies
                // `shift` bytes further on): do it again.
                if len > shift {
                    return Err(corrupt("LUKS2 hotzone is larger than its data shift"));
                }
                self.pieces(off, len, false, Job::Move { read: true })?;
            }
        }
        self.data.sync()
    }
}

impl Data {
    /// `job` on the piece at `at` of the hotzone at `off` of the data
    /// area, `buf` its bytes (held) or room for them, `sums` its blocks'
    /// checksums.
    fn piece(&self, off: u64, at: u64, buf: &mut [u8], sums: &mut [u8], job: Job) -> Result<()> {
        match job {
            Job::Read => self.read(off, at, buf),
            Job::Hash { hash, block } => {
                self.read(off, at, buf)?;
                let dl = hash.digest_len();
                for (b, sum) in buf.chunks(block).zip(sums.chunks_mut(dl)) {
                    hash.digest_into(&[b], sum);
                }
                Ok(())
            }
            Job::Move { read } => {
                if read {
                    self.read(off, at, buf)?;
                }
                self.reencrypt(off + at, buf);
                self.write(off, at, buf)
            }
            Job::Repair { hash, block } => {
                self.read(off, at, buf)?;
                let dl = hash.digest_len();
                let mut got = [0u8; 64];
                let got = &mut got[..dl];
                for (i, (b, sum)) in buf.chunks_mut(block).zip(sums.chunks(dl)).enumerate() {
                    hash.digest_into(&[b], got);
                    if got == sum {
                        let from = at + (i * block) as u64;
                        self.reencrypt(off + from, b);
                        self.write(off, from, b)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Reads the old bytes at `at` of the hotzone at `off`: in place, or
    /// for a data shift's first hotzone from the moved segment.
    fn read(&self, off: u64, at: u64, buf: &mut [u8]) -> Result<()> {
        let from = match self.moved {
            Some(m) if off == 0 => m,
            _ => self.base + off,
        };
        self.file
            .read_exact_at(buf, from + at)
            .map_err(|e| Error::io(format!("Failed to read hotzone area starting at {off}."), e))
    }

    /// Writes `buf` back at `at` of the hotzone at `off` (a crash point
    /// for the tests).
    fn write(&self, off: u64, at: u64, buf: &[u8]) -> Result<()> {
        self.file
            .write_all_at(buf, self.target + off + at)
            .map_err(|e| {
                Error::io(
                    format!("Failed to write hotzone area starting at {off}."),
                    e,
                )
            })?;
        crash::point();
        Ok(())
    }

    /// Decrypts `buf` (the bytes at `pos` of the data area) with the old
    /// cipher and encrypts it with the new one, step by step while each
    /// step is in the cache.
    fn reencrypt(&self, pos: u64, buf: &mut [u8]) {
        let mut sector = pos / 512;
        for part in buf.chunks_mut(CRYPT_STEP) {
            // A plaintext side (`linear`) has no cipher.
            if let Some(o) = &self.old {
                o.decrypt(sector, part);
            }
            if let Some(n) = &self.new {
                n.encrypt(sector, part);
            }
            sector += (part.len() / 512) as u64;
        }
    }

    fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io("Failed to sync data.", e))
    }
}
