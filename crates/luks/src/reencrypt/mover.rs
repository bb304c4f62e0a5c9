//! The data mover: reads a hotzone of the data area, protects it as the
//! resilience mode asks (checksum or journal in the reencrypt keyslot's
//! area, then the header naming the hotzone), reencrypts it with the old
//! and the new sector cipher and writes it back; and repairs a hotzone a
//! crash tore.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use zeroize::{Zeroize, Zeroizing};

use super::header::{self, RawHeader};
use super::state::{Resilience, State};
use super::{crash, data_size, make_segments, DEFAULT_NONE_HOTZONE, MAX_HOTZONE, MIN_ALIGNMENT};
use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::luks2::json::Segment;
use crate::volume::io::{open_ro, open_rw, read_exact_at, sync, write_at};

/// Builds a segment's sector crypto from its volume key (`None`: a
/// `linear` segment, plaintext).
type MakeCrypt<'a> = dyn Fn(&Segment, &[u8]) -> Result<Option<crypto::SectorCrypt>> + 'a;

/// Moves the data: the old and the new sector ciphers, the device, the
/// hotzone size.
pub(super) struct Mover {
    data: File,
    meta_path: PathBuf,
    /// `None`: that side is plaintext (a `linear` segment).
    old: Option<crypto::SectorCrypt>,
    new: Option<crypto::SectorCrypt>,
    backward: bool,
    /// Where the data area starts before and after (they differ by the
    /// shift of a data shift).
    base: u64,
    target: u64,
    /// A data shift: where the data's first `shift` bytes wait.
    moved: Option<u64>,
    shift: u64,
    pub(super) size: u64,
    pub(super) hotzone: u64,
    buf: Vec<u8>,
}

impl Drop for Mover {
    fn drop(&mut self) {
        // The buffer held plaintext between the two ciphers.
        self.buf.zeroize();
    }
}

impl Mover {
    pub(super) fn new(
        device: &Path,
        meta: &Path,
        dev_size: u64,
        st: &State,
        old_vk: &[u8],
        new_vk: &[u8],
        want: u64,
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
            // (`--hotzone-size` does not apply).
            let _ = want;
            return Self::open(device, meta, dev_size, st, old_vk, new_vk, shift, &mk);
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
        Self::open(device, meta, dev_size, st, old_vk, new_vk, hotzone, &mk)
    }

    #[allow(clippy::too_many_arguments)]
    fn open(
        device: &Path,
        meta: &Path,
        dev_size: u64,
        st: &State,
        old_vk: &[u8],
        new_vk: &[u8],
        hotzone: u64,
        mk: &MakeCrypt<'_>,
    ) -> Result<Self> {
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .map_err(|e| Error::io(format!("Cannot open {} for writing", device.display()), e))?;
        let size = data_size(dev_size, st)?;
        Ok(Mover {
            data,
            meta_path: meta.to_path_buf(),
            old: mk(&st.old, old_vk)?,
            new: mk(&st.new, new_vk)?,
            backward: st.backward,
            base: st.old.offset,
            target: st.new.offset,
            moved: st.moved.as_ref().map(|m| m.offset),
            shift: match st.resilience {
                Resilience::Datashift { shift } => shift,
                _ => 0,
            },
            size,
            hotzone,
            buf: Vec::new(),
        })
    }

    /// The length of the hotzone after `done` bytes. With a data shift
    /// the data's first `shift` bytes (read from the moved segment) are
    /// one hotzone of their own, the last, as cryptsetup cuts them.
    pub(super) fn next_len(&self, done: u64) -> u64 {
        let left = self.size - done;
        if self.moved.is_none() {
            return self.hotzone.min(left);
        }
        match left.checked_sub(self.shift) {
            Some(0) | None => left,
            Some(rest) if rest < self.shift => rest,
            Some(_) => self.shift,
        }
    }

    /// Where the old bytes at `off` of the data area are: in place, or
    /// for a data shift's first hotzone in the moved segment.
    fn source(&self, off: u64) -> u64 {
        match self.moved {
            Some(m) if off == 0 => m,
            _ => self.base + off,
        }
    }

    fn read(&mut self, off: u64, len: u64) -> Result<()> {
        self.buf.resize(len as usize, 0);
        let at = self.source(off);
        self.data
            .read_exact_at(&mut self.buf, at)
            .map_err(|e| Error::io(format!("Failed to read hotzone area starting at {off}."), e))
    }

    /// Writes `buf[from..to]` back at its place, in pieces (each a crash
    /// point for the tests).
    fn write(&mut self, off: u64, from: usize, to: usize) -> Result<()> {
        const PIECE: usize = 1 << 20;
        let mut at = from;
        while at < to {
            let end = (at + PIECE).min(to);
            self.data
                .write_all_at(&self.buf[at..end], self.target + off + at as u64)
                .map_err(|e| {
                    Error::io(
                        format!("Failed to write hotzone area starting at {off}."),
                        e,
                    )
                })?;
            crash::point();
            at = end;
        }
        Ok(())
    }

    fn reencrypt_buf(&mut self, off: u64, from: usize, to: usize) {
        let sector = (off + from as u64) / 512;
        // A plaintext side (`linear`) has no cipher.
        if let Some(o) = &self.old {
            o.decrypt(sector, &mut self.buf[from..to]);
        }
        if let Some(n) = &self.new {
            n.encrypt(sector, &mut self.buf[from..to]);
        }
    }

    /// Overwrites the moved segment (plaintext) with random bytes, as
    /// cryptsetup does once an encryption with a data shift is done.
    pub(super) fn wipe_moved(&mut self) -> Result<()> {
        let Some(m) = self.moved else {
            return Ok(());
        };
        let mut left = self.shift;
        let mut at = m;
        let mut chunk = vec![0u8; (1 << 20).min(self.shift as usize)];
        while left > 0 {
            let n = (chunk.len() as u64).min(left) as usize;
            getrandom::fill(&mut chunk[..n])
                .map_err(|e| crate::error::random_error(ErrorKind::Corrupt, "No randomness", e))?;
            self.data
                .write_all_at(&chunk[..n], at)
                .map_err(|e| Error::io("Failed to wipe unused data device area.", e))?;
            at += n as u64;
            left -= n as u64;
        }
        self.sync()
    }

    fn sync(&self) -> Result<()> {
        self.data
            .sync_data()
            .map_err(|e| Error::io("Failed to sync data.", e))
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
        let off = if self.backward {
            self.size - done - len
        } else {
            done
        };
        self.read(off, len)?;
        let protect = st.resilience != Resilience::None;
        if protect {
            let mut f = open_rw(&self.meta_path)?;
            match st.resilience {
                Resilience::Checksum { hash, block } => {
                    let dl = hash.digest_len();
                    let mut sums = vec![0u8; (len / u64::from(block)) as usize * dl];
                    for (i, chunk) in self.buf.chunks(block as usize).enumerate() {
                        hash.digest_into(&[chunk], &mut sums[i * dl..(i + 1) * dl]);
                    }
                    write_at(&mut *f, st.area.0, &sums)?;
                }
                Resilience::Journal => write_at(&mut *f, st.area.0, &self.buf)?,
                // The source stays where it is: the header naming the
                // hotzone is the whole protection.
                Resilience::None | Resilience::Datashift { .. } => {}
            }
            sync(&*f)?;
            crash::point();
            make_segments(h, st, done, Some(len), self.size)?;
            h.write(&mut *f)?;
        }
        let n = self.buf.len();
        self.reencrypt_buf(off, 0, n);
        self.write(off, 0, n)?;
        if protect {
            self.sync()?;
            make_segments(h, st, done + len, None, self.size)?;
            // After the last hotzone the next header is the final one
            // (`finalize`): a header with every byte new but still in
            // reencryption is never written, as cryptsetup 2.6.1 would
            // resume such a header from the start.
            if done + len < self.size {
                h.write(&mut *open_rw(&self.meta_path)?)?;
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
        match st.resilience {
            Resilience::Checksum { hash, block } => {
                let dl = hash.digest_len();
                let count = (len / u64::from(block)) as usize;
                if (count * dl) as u64 > st.area.1 {
                    return Err(corrupt("LUKS2 hotzone is larger than its checksum area"));
                }
                let mut sums = vec![0u8; count * dl];
                read_exact_at(&mut *open_ro(&self.meta_path)?, st.area.0, &mut sums)?;
                self.read(off, len)?;
                let mut got = vec![0u8; dl];
                for i in 0..count {
                    let (a, b) = (i * block as usize, (i + 1) * block as usize);
                    hash.digest_into(&[&self.buf[a..b]], &mut got);
                    if got == sums[i * dl..(i + 1) * dl] {
                        self.reencrypt_buf(off, a, b);
                        self.write(off, a, b)?;
                    }
                }
            }
            Resilience::Journal => {
                if len > st.area.1 {
                    return Err(corrupt("LUKS2 hotzone is larger than its journal"));
                }
                self.buf.resize(len as usize, 0);
                read_exact_at(&mut *open_ro(&self.meta_path)?, st.area.0, &mut self.buf)?;
                let n = self.buf.len();
                self.reencrypt_buf(off, 0, n);
                self.write(off, 0, n)?;
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
                self.read(off, len)?;
                let n = self.buf.len();
                self.reencrypt_buf(off, 0, n);
                self.write(off, 0, n)?;
            }
        }
        self.sync()
    }
}
