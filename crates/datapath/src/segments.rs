//! Multi-target mappings: one device made of several dm targets (crypt,
//! linear or zero), as cryptsetup maps a LUKS2 volume in mid-reencryption
//! or a BitLocker volume (its metadata areas as dm-zero targets).
//!
//! ```text
//!  mapping sectors  0 ─────────── A ─────────────── B ───────── end
//!  target           crypt, key 1   crypt, key 2      linear
//!  cipher           SectorCrypt 1  SectorCrypt 2     (none)
//!                   (sector - 0)   (sector - A)
//!  device           offset₁ + s    offset₂ + (s - A)  offset₃ + (s - B)
//! ```
//!
//! Hand-written. Two seams carry it, so the modes stay as they are:
//!
//! - **Crypto**: a generation's cipher is a [`Cipher`]: `One` (a single
//!   target: exactly today's path behind one predictable branch) or `Many`,
//!   which cuts every buffer it is given at target boundaries and runs each
//!   piece with its target's `SectorCrypt` at `sector - start` (the
//!   target's `iv_offset`, `sector_size` and `iv_large_sectors` applied
//!   inside, as dm-crypt does per target), or leaves it alone for a linear
//!   target. The modes, their chunking and the fused paths call the same
//!   methods on either, with sectors relative to the mapping.
//! - **Device position**: when every target keeps the same distance
//!   between its mapping sectors and its device sectors (a reencryption
//!   without data shift) the mapping is one run on the device and the
//!   choke point's `data_offset + offset` is right everywhere. Otherwise
//!   ([`Segs::uniform`] false) the choke point looks the position up per
//!   request, and a request that crosses from one run to another is cut
//!   into pieces that run one after the other in the submitter, unfused,
//!   two passes each ([`run_split`]); requests inside one run take the
//!   mode's usual path.
//! - **Zero targets** are runs of their own that never reach a mode or
//!   the backend: any request touching one takes [`run_split`], which
//!   answers a zero piece's read with zeros and drops its writes, as
//!   dm-zero does. A mapping with one is never uniform.
//!
//! Every target boundary is a multiple of the mapping's logical block
//! size (the largest target sector size, as dm stacks limits), so every
//! request and every chunk a mode cuts falls on whole sectors of each
//! target.

use std::sync::Arc;

use crypto::SectorCrypt;

use crate::check::{SectorRange, Work};
use crate::{Error, Target};

/// A generation's cipher.
#[derive(Clone)]
pub(crate) enum Cipher {
    /// One crypt target over the whole mapping.
    One(Arc<SectorCrypt>),
    /// Several targets.
    Many(Arc<Segs>),
}

/// One target, positioned.
pub(crate) struct Seg {
    /// First 512-byte sector in the mapping.
    start: u64,
    /// One past the last sector.
    end: u64,
    /// Device byte offset of the target's first sector.
    dev: u64,
    crypt: Option<Arc<SectorCrypt>>,
    /// A dm-zero target.
    zero: bool,
}

/// A multi-target mapping's targets, sorted and contiguous from 0.
pub(crate) struct Segs {
    segs: Box<[Seg]>,
    /// Every target at the same device distance (one run on the device).
    pub(crate) uniform: bool,
    sector_size: usize,
    null: bool,
}

impl Segs {
    /// Checks and positions `targets` (lengths and offsets in bytes).
    /// Returns the list, the mapping's size and its logical block size.
    pub(crate) fn build(targets: &[Target], backend_size: u64) -> Result<(Segs, u64), Error> {
        let ss = targets
            .iter()
            .map(|t| t.crypt.as_ref().map_or(512, |c| c.sector_size()))
            .max()
            .unwrap_or(512);
        let mut segs = Vec::with_capacity(targets.len());
        let mut at = 0u64;
        for (i, t) in targets.iter().enumerate() {
            let own = t.crypt.as_ref().map_or(512, |c| c.sector_size()) as u64;
            if t.len == 0 || t.len % ss as u64 != 0 || t.offset % own != 0 {
                return Err(Error::Invalid(format!(
                    "Target {} ({} bytes at device offset {}) is not a non-empty multiple of the mapping's {ss}-byte blocks at an offset aligned to its own sectors",
                    i + 1,
                    t.len,
                    t.offset
                )));
            }
            let fits = t.zero
                || t.offset
                    .checked_add(t.len)
                    .is_some_and(|e| e <= backend_size);
            if !fits {
                return Err(Error::Invalid(format!(
                    "Target {} ({} bytes at offset {}) does not fit the {backend_size}-byte backend",
                    i + 1,
                    t.len,
                    t.offset
                )));
            }
            let end = at
                .checked_add(t.len)
                .ok_or_else(|| Error::Invalid("Mapping size overflows".into()))?;
            segs.push(Seg {
                start: at / 512,
                end: end / 512,
                dev: if t.zero { 0 } else { t.offset },
                crypt: if t.zero { None } else { t.crypt.clone() },
                zero: t.zero,
            });
            at = end;
        }
        let delta = |s: &Seg| i128::from(s.dev) - i128::from(s.start) * 512;
        let uniform =
            !segs.iter().any(|s| s.zero) && segs.windows(2).all(|w| delta(&w[0]) == delta(&w[1]));
        let null = segs
            .iter()
            .all(|s| s.crypt.as_ref().is_none_or(|c| c.is_null()));
        Ok((
            Segs {
                segs: segs.into_boxed_slice(),
                uniform,
                sector_size: ss,
                null,
            },
            at,
        ))
    }

    /// Number of targets.
    pub(crate) fn count(&self) -> usize {
        self.segs.len()
    }

    /// True when no target encrypts (all linear or `cipher_null`).
    pub(crate) fn is_plain(&self) -> bool {
        self.segs.iter().all(|s| s.crypt.is_none())
    }

    /// Index of the target holding 512-byte sector `sector`.
    fn find(&self, sector: u64) -> usize {
        self.segs
            .partition_point(|s| s.end <= sector)
            .min(self.segs.len() - 1)
    }

    /// Device byte position of mapping byte `offset`.
    pub(crate) fn at(&self, offset: u64) -> u64 {
        let s = &self.segs[self.find(offset / 512)];
        s.dev + (offset - s.start * 512)
    }

    /// Whether mapping byte `offset` lies in a zero target.
    fn zero_at(&self, offset: u64) -> bool {
        self.segs[self.find(offset / 512)].zero
    }

    /// Where the run of targets holding `offset` ends on the mapping (in
    /// bytes): the next target whose device distance differs, or that is
    /// a zero target where this one is not (or the reverse), starts there.
    fn run_end(&self, offset: u64) -> u64 {
        let mut i = self.find(offset / 512);
        let d = |s: &Seg| (s.zero, i128::from(s.dev) - i128::from(s.start) * 512);
        while i + 1 < self.segs.len() && d(&self.segs[i + 1]) == d(&self.segs[i]) {
            i += 1;
        }
        self.segs[i].end * 512
    }

    /// Runs `f(target, target-relative sector, piece range)` for every
    /// target piece of `len` bytes from mapping sector `sector`.
    fn each(&self, sector: u64, len: usize, mut f: impl FnMut(&Seg, u64, std::ops::Range<usize>)) {
        let mut i = self.find(sector);
        let mut off = 0usize;
        while off < len && i < self.segs.len() {
            let s = &self.segs[i];
            let here = sector + (off / 512) as u64;
            let n = (((s.end - here) * 512).min((len - off) as u64)) as usize;
            f(s, here - s.start, off..off + n);
            off += n;
            i += 1;
        }
    }
}

impl Cipher {
    /// Encryption sector size (for `Many`, the largest of its targets').
    pub(crate) fn sector_size(&self) -> usize {
        match self {
            Cipher::One(c) => c.sector_size(),
            Cipher::Many(s) => s.sector_size,
        }
    }

    /// True for `cipher_null` (every target's, or linear).
    pub(crate) fn is_null(&self) -> bool {
        match self {
            Cipher::One(c) => c.is_null(),
            Cipher::Many(s) => s.null,
        }
    }

    /// Encrypts `buf` in place; `sector` is the mapping's.
    pub(crate) fn encrypt(&self, sector: u64, buf: &mut [u8]) {
        match self {
            Cipher::One(c) => c.encrypt(sector, buf),
            Cipher::Many(s) => s.each(sector, buf.len(), |seg, rel, r| {
                if let Some(c) = &seg.crypt {
                    c.encrypt(rel, &mut buf[r]);
                }
            }),
        }
    }

    /// Decrypts `buf` in place; `sector` is the mapping's.
    pub(crate) fn decrypt(&self, sector: u64, buf: &mut [u8]) {
        match self {
            Cipher::One(c) => c.decrypt(sector, buf),
            Cipher::Many(s) => s.each(sector, buf.len(), |seg, rel, r| {
                if let Some(c) = &seg.crypt {
                    c.decrypt(rel, &mut buf[r]);
                }
            }),
        }
    }

    /// Encrypts `src` into `dst` (same length).
    pub(crate) fn encrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) {
        match self {
            Cipher::One(c) => c.encrypt_to(sector, src, dst),
            Cipher::Many(s) => s.each(sector, src.len(), |seg, rel, r| match &seg.crypt {
                Some(c) => c.encrypt_to(rel, &src[r.clone()], &mut dst[r]),
                None => dst[r.clone()].copy_from_slice(&src[r]),
            }),
        }
    }

    /// Decrypts `src` into `dst` (same length).
    pub(crate) fn decrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) {
        match self {
            Cipher::One(c) => c.decrypt_to(sector, src, dst),
            Cipher::Many(s) => s.each(sector, src.len(), |seg, rel, r| match &seg.crypt {
                Some(c) => c.decrypt_to(rel, &src[r.clone()], &mut dst[r]),
                None => dst[r.clone()].copy_from_slice(&src[r]),
            }),
        }
    }

    /// Decrypts `src` onto the end of `out`.
    pub(crate) fn decrypt_append(&self, sector: u64, src: &[u8], out: &mut Vec<u8>) {
        match self {
            Cipher::One(c) => c.decrypt_append(sector, src, out),
            Cipher::Many(s) => s.each(sector, src.len(), |seg, rel, r| match &seg.crypt {
                Some(c) => c.decrypt_append(rel, &src[r], out),
                None => out.extend_from_slice(&src[r]),
            }),
        }
    }
}

/// True when `w` crosses from one device run of `segs` to another, or
/// touches a zero target (only possible when the targets are not
/// [`Segs::uniform`]).
pub(crate) fn crosses(segs: &Segs, w: &Work) -> bool {
    match range_of(w) {
        Some(r) => {
            let off = r.sector() * 512;
            off + r.len() > segs.run_end(off) || segs.zero_at(off)
        }
        None => false,
    }
}

fn range_of(w: &Work) -> Option<SectorRange> {
    match w {
        Work::Read(r) | Work::Write(r, ..) | Work::Zero(r, _) | Work::Discard(r) => Some(*r),
        Work::Flush => None,
    }
}

/// Cuts `w` at the device runs of `segs` and hands each piece to `run`
/// in order (the first error stops it); a read's pieces are joined into
/// one buffer. Returns the stats direction, bytes and result as
/// [`crate::mode::inline::exec`] does.
pub(crate) fn run_split(
    segs: &Segs,
    w: Work,
    mut run: impl FnMut(Work) -> crate::Completion,
) -> crate::Completion {
    let Some(r) = range_of(&w) else {
        return run(w);
    };
    let mut out = matches!(w, Work::Read(_)).then(|| crate::bufpool::take_empty(r.len() as usize));
    let (fua, kind) = match &w {
        Work::Write(_, _, f) => (*f, 1),
        Work::Zero(_, f) => (*f, 2),
        Work::Discard(_) => (false, 3),
        _ => (false, 0),
    };
    let mut data = match w {
        Work::Write(_, d, _) => Some(d),
        _ => None,
    };
    let mut off = 0u64;
    while off < r.len() {
        let abs = r.sector() * 512 + off;
        let n = (segs.run_end(abs) - abs).min(r.len() - off);
        if segs.zero_at(abs) {
            // dm-zero: zeros read, writes dropped, the backend untouched.
            if let Some(o) = out.as_mut() {
                o.resize(o.len() + n as usize, 0);
            }
            off += n;
            continue;
        }
        let piece = r.remap(off, n, segs.at(abs));
        let pw = match kind {
            0 => Work::Read(piece),
            1 => {
                let d = data
                    .as_ref()
                    .map_or(&[][..], |d| &d[off as usize..(off + n) as usize]);
                let mut buf = crate::bufpool::take(d.len());
                buf.copy_from_slice(d);
                Work::Write(piece, buf, fua)
            }
            2 => Work::Zero(piece, fua),
            _ => Work::Discard(piece),
        };
        match run(pw) {
            Ok(Some(b)) => {
                if let Some(o) = out.as_mut() {
                    o.extend_from_slice(&b);
                }
                crate::bufpool::give(b);
            }
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        off += n;
    }
    if let Some(d) = data.take() {
        crate::bufpool::give(d);
    }
    Ok(out)
}
