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
//! Write-zeroes, discard and flush take this path in every mode: dm-crypt
//! remaps flush and discard bios straight to the device (`crypt_map` returns
//! `DM_MAPIO_REMAPPED`), and it has no write-zeroes support, so the block
//! layer turns them into writes of zero pages; here those zero writes are
//! encrypted and written in [`ZERO_CHUNK`]-byte pieces.

use std::time::Instant;

use crate::check::{SectorRange, Work};
use crate::stats::{Dir, Path};
use crate::{Completion, Ctx, Error};

/// Largest piece write-zeroes encrypts at once.
const ZERO_CHUNK: u64 = 1 << 20;

/// Runs `w` to completion in this thread and completes it.
pub(crate) fn run(ctx: &Ctx, w: Work, t0: Instant, done: impl FnOnce(Completion)) {
    let (dir, bytes, res) = exec(ctx, w);
    ctx.complete(dir, Path::Inline, bytes, t0, res, done);
}

/// Executes `w`; returns its stats direction, byte count and result.
pub(crate) fn exec(ctx: &Ctx, w: Work) -> (Dir, u64, Completion) {
    let dir = w.dir();
    match w {
        Work::Read(r) => (dir, r.len(), read(ctx, r).map(Some)),
        Work::Write(r, data, fua) => (dir, r.len(), write(ctx, r, data, fua).map(|_| None)),
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

/// Backend read, then decrypt in place.
pub(crate) fn read(ctx: &Ctx, r: SectorRange) -> Result<Vec<u8>, Error> {
    let mut buf = vec![0u8; r.len() as usize];
    read_into(ctx, r, &mut buf)?;
    Ok(buf)
}

/// Backend read of `r` into `buf`, then decrypt.
pub(crate) fn read_into(ctx: &Ctx, r: SectorRange, buf: &mut [u8]) -> Result<(), Error> {
    ctx.backend.read_at(buf, r.at())?;
    if let Some(c) = &ctx.crypt {
        c.decrypt(r.sector(), buf);
    }
    Ok(())
}

/// Encrypt in place, then backend write.
pub(crate) fn write(ctx: &Ctx, r: SectorRange, mut data: Vec<u8>, fua: bool) -> Result<(), Error> {
    write_from(ctx, r, &mut data, fua)
}

/// Encrypts `buf` (the plaintext of `r`) in place and writes it.
pub(crate) fn write_from(
    ctx: &Ctx,
    r: SectorRange,
    buf: &mut [u8],
    fua: bool,
) -> Result<(), Error> {
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
