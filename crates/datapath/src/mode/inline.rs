//! Inline execution: the whole request in the submitting context.
//!
//! Hand-written. This is what dm-crypt does with `no_read_workqueue` (the
//! read is decrypted in its completion context; the backend is synchronous
//! so that is the submitter, right after the read) and `no_write_workqueue`
//! (`kcryptd_crypt_write_convert` and the submit run in `crypt_map`'s
//! context); [`CryptMode::Inline`](crate::CryptMode::Inline) is both
//! (`force_inline`). It is also the adaptive mode's path for requests too
//! small to be worth a hop.
//!
//! The path is allocation-light: a read allocates its result buffer and
//! nothing else; a write encrypts the caller's buffer in place (the engine
//! owns it, so dm-crypt's bounce buffer, needed there because the bio's
//! pages belong to the caller, is a copy this path can skip).
//!
//! Bytes meet the backend in one of two ways ([`Pass`]). Inline and classic
//! keep dm-crypt's over brd: the device copies (`read_at`/`write_at`) and
//! crypto is a pass of its own, so they cost what dm-crypt would. The
//! adaptive mode fuses the two when the backend lends its memory
//! ([`backend::Direct`], the ramdisk): a write is encrypted straight from
//! the caller's buffer into the device's pages, a read decrypted straight
//! out of them, one pass over the data instead of two. dm-crypt cannot do
//! that: the crypt target and the device are separate drivers.
//!
//! Write-zeroes, discard and flush take this path in every mode: dm-crypt
//! remaps flush and discard bios straight to the device (`crypt_map` returns
//! `DM_MAPIO_REMAPPED`), and it has no write-zeroes support, so the block
//! layer turns them into writes of zero pages; here those zero writes are
//! encrypted and written in [`ZERO_CHUNK`]-byte pieces.

use std::time::Instant;

use backend::Direct;

use crate::check::{SectorRange, Work};
use crate::segments::Cipher;
use crate::stats::{Dir, Path};
use crate::{Completion, Ctx, Error};

/// Largest piece write-zeroes encrypts at once.
const ZERO_CHUNK: u64 = 1 << 20;

/// How a request's bytes meet the backend (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// dm-crypt's way: the backend copies, crypto is a pass of its own.
    Two,
    /// Crypto straight between the request's buffer and the backend's
    /// memory when the backend lends it; otherwise as [`Pass::Two`].
    Fused,
}

impl Pass {
    /// The adaptive mode's choice: fused unless switched off.
    pub(crate) fn adaptive(ctx: &Ctx) -> Self {
        if ctx.core.no_fuse.load(std::sync::atomic::Ordering::Relaxed) {
            Pass::Two
        } else {
            Pass::Fused
        }
    }
}

/// The cipher and the backend's memory when `pass` is fused and the
/// backend lends it. Pieces are lent cut on [`backend::DIRECT_ALIGN`]
/// device boundaries; those fall between sectors only when the volume's
/// data offset is a whole number of sectors (LUKS and every usual table
/// have that), so otherwise the request takes two passes.
fn fused(ctx: &Ctx, pass: Pass) -> Option<(&Cipher, &dyn Direct)> {
    if pass != Pass::Fused {
        return None;
    }
    let c = ctx.crypt.as_ref()?;
    if ctx.data_offset % c.sector_size() as u64 != 0 {
        return None;
    }
    Some((c, ctx.backend.direct()?))
}

/// True when the adaptive mode's requests run fused on this volume (the
/// backend lends its memory and fusing is on).
pub(crate) fn lends(ctx: &Ctx) -> bool {
    fused(ctx, Pass::adaptive(ctx)).is_some()
}

/// Runs `w` to completion in this thread and completes it.
pub(crate) fn run(ctx: &Ctx, w: Work, t0: Instant, pass: Pass, done: impl FnOnce(Completion)) {
    let (dir, bytes, res) = exec(ctx, w, pass);
    ctx.complete(dir, Path::Inline, bytes, t0, res, done);
}

/// Executes `w`; returns its stats direction, byte count and result.
pub(crate) fn exec(ctx: &Ctx, w: Work, pass: Pass) -> (Dir, u64, Completion) {
    let dir = w.dir();
    match w {
        Work::Read(r) => (dir, r.len(), read(ctx, r, pass).map(Some)),
        Work::Write(r, mut data, fua) => {
            let res = write_from(ctx, r, &mut data, fua, pass).map(|_| None);
            crate::bufpool::give(data);
            (dir, r.len(), res)
        }
        Work::Zero(r, fua) => (dir, r.len(), write_zeroes(ctx, r, fua).map(|_| None)),
        Work::Discard(r) => (
            dir,
            r.len(),
            ctx.backend
                .discard(r.at(), r.len())
                .map(|_| None)
                .map_err(Error::Io),
        ),
        Work::Flush => (dir, 0, ctx.backend.flush().map(|_| None).map_err(Error::Io)),
    }
}

/// Backend read, then decrypt.
pub(crate) fn read(ctx: &Ctx, r: SectorRange, pass: Pass) -> Result<Vec<u8>, Error> {
    if let Some((c, direct)) = fused(ctx, pass) {
        // Decrypted straight into the (pooled) buffer's spare capacity:
        // not even a zeroing pass.
        let mut buf = crate::bufpool::take_empty(r.len() as usize);
        direct.read_with(r.at(), r.len(), &mut |at, piece| {
            if at == buf.len() {
                c.decrypt_append(r.sector() + (at / 512) as u64, piece, &mut buf);
            }
        })?;
        if buf.len() as u64 != r.len() {
            // Pieces lent out of order: a backend bug, not data.
            return Err(Error::Io(std::io::Error::other(
                "backend lent its memory out of order",
            )));
        }
        return Ok(buf);
    }
    // Stale bytes of a pooled buffer are all overwritten, or the read fails
    // and the buffer is dropped (see crate::bufpool).
    let mut buf = crate::bufpool::take(r.len() as usize);
    read_into(ctx, r, &mut buf, pass)?;
    Ok(buf)
}

/// Reads `r` into `buf` and decrypts it: a backend copy and a pass in
/// place, or one pass out of the backend's memory ([`Pass::Fused`]).
pub(crate) fn read_into(
    ctx: &Ctx,
    r: SectorRange,
    buf: &mut [u8],
    pass: Pass,
) -> Result<(), Error> {
    if let Some((c, direct)) = fused(ctx, pass) {
        // `buf` may hold stale bytes (a pooled buffer): count what the
        // backend lent, so a lender that skips a piece fails the read.
        let mut covered = 0;
        direct.read_with(r.at(), r.len(), &mut |at, piece| {
            // Pieces are cut on 4 KiB device boundaries, so between sectors.
            let sector = r.sector() + (at / 512) as u64;
            c.decrypt_to(sector, piece, &mut buf[at..at + piece.len()]);
            if at == covered {
                covered += piece.len();
            }
        })?;
        if covered != buf.len() {
            return Err(Error::Io(std::io::Error::other(
                "backend lent its memory out of order",
            )));
        }
        return Ok(());
    }
    ctx.backend.read_at(buf, r.at())?;
    if let Some(c) = &ctx.crypt {
        c.decrypt(r.sector(), buf);
    }
    Ok(())
}

/// Encrypts `buf` (the plaintext of `r`) and writes it: in place and then
/// a backend copy (`buf` is left encrypted), or one pass into the
/// backend's memory ([`Pass::Fused`], `buf` left alone).
pub(crate) fn write_from(
    ctx: &Ctx,
    r: SectorRange,
    buf: &mut [u8],
    fua: bool,
    pass: Pass,
) -> Result<(), Error> {
    // cipher_null: a write is one copy either way, and the backend's own
    // (page at a time) measured faster than one lent batch (grid, null
    // write j1: 0.91-0.95 of inline fused).
    if let Some((c, direct)) = fused(ctx, pass).filter(|(c, _)| !c.is_null()) {
        let plain = &*buf;
        direct.write_with(r.at(), r.len(), fua, &mut |at, piece| {
            let sector = r.sector() + (at / 512) as u64;
            c.encrypt_to(sector, &plain[at..at + piece.len()], piece);
        })?;
        return Ok(());
    }
    if let Some(c) = &ctx.crypt {
        c.encrypt(r.sector(), buf);
    }
    ctx.backend.write_at(buf, r.at(), fua)?;
    Ok(())
}

fn write_zeroes(ctx: &Ctx, r: SectorRange, fua: bool) -> Result<(), Error> {
    let Some(c) = &ctx.crypt else {
        // No encryption: plaintext zeroes are ciphertext zeroes.
        ctx.backend.write_zeroes(r.at(), r.len())?;
        if fua {
            ctx.backend.flush()?;
        }
        return Ok(());
    };
    let mut buf = vec![0u8; r.len().min(ZERO_CHUNK) as usize];
    let mut off = 0;
    while off < r.len() {
        let n = (r.len() - off).min(ZERO_CHUNK);
        let piece = r.sub(off, n);
        let b = &mut buf[..n as usize];
        if off > 0 {
            b.fill(0);
        }
        c.encrypt(piece.sector(), b);
        ctx.backend.write_at(b, piece.at(), fua)?;
        off += n;
    }
    Ok(())
}
