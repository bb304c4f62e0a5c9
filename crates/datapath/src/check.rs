//! The single choke point: every request is checked here, once, before it
//! is dispatched to any mode (nbdkit's `backend_pread` habit).
//!
//! Hand-written. A request that passes comes out as a [`Work`] whose ranges
//! are [`SectorRange`]s, a type only [`check`] can build: range inside the
//! device, offset and length multiples of the volume's sector size, size
//! within [`MAX_REQUEST_BYTES`](crate::MAX_REQUEST_BYTES), flags valid for
//! the operation, writes refused on a read-only engine, discards refused
//! unless `allow_discards`. Nothing past this point re-validates, and no
//! failed check has touched the backend.

use crate::stats::Dir;
use crate::{Ctx, Error, Op, OpKind, Request, MAX_REQUEST_BYTES};

/// A checked byte range of the decrypted device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SectorRange {
    sector: u64,
    at: u64,
    len: u64,
}

impl SectorRange {
    /// 512-byte sector number relative to the mapping start (the IV input).
    pub(crate) fn sector(&self) -> u64 {
        self.sector
    }
    /// Byte offset on the backend (data offset applied).
    pub(crate) fn at(&self) -> u64 {
        self.at
    }
    /// Length in bytes (a multiple of the sector size).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
    /// The sub-range `off..off + len` at device byte `at` (a piece of a
    /// multi-target request in another device run, see `segments`).
    pub(crate) fn remap(&self, off: u64, len: u64, at: u64) -> SectorRange {
        debug_assert!(off % 512 == 0 && off + len <= self.len);
        SectorRange {
            sector: self.sector + off / 512,
            at,
            len,
        }
    }
    /// The sub-range `off..off + len` (both sector-aligned, inside `self`).
    pub(crate) fn sub(&self, off: u64, len: u64) -> SectorRange {
        debug_assert!(off % 512 == 0 && off + len <= self.len);
        SectorRange {
            sector: self.sector + off / 512,
            at: self.at + off,
            len,
        }
    }
}

/// A request that passed the choke point.
pub(crate) enum Work {
    /// Read the range.
    Read(SectorRange),
    /// Write plaintext `data` (exactly `range.len()` bytes).
    Write(SectorRange, Vec<u8>, bool),
    /// Write plaintext zeroes.
    Zero(SectorRange, bool),
    /// Discard the range.
    Discard(SectorRange),
    /// Flush the backend.
    Flush,
}

impl Work {
    /// The stats direction this work counts under.
    pub(crate) fn dir(&self) -> Dir {
        match self {
            Work::Read(_) => Dir::Read,
            Work::Write(..) | Work::Zero(..) => Dir::Write,
            Work::Discard(_) => Dir::Discard,
            Work::Flush => Dir::Flush,
        }
    }
}

/// Checks `req` against the volume and configuration of `ctx`.
pub(crate) fn check(ctx: &Ctx, req: Request) -> Result<Work, (Dir, Error)> {
    let Request { op, offset, fua } = req;
    let kind = op.kind();
    let (dir, len) = match &op {
        Op::Read { len } => (Dir::Read, *len as u64),
        Op::Write { data } => (Dir::Write, data.len() as u64),
        Op::WriteZeroes { len } => (Dir::Write, *len as u64),
        Op::Discard { len } => (Dir::Discard, *len as u64),
        Op::Flush => return Ok(Work::Flush),
    };
    let fail = |e| Err((dir, e));
    if let Err(e) = refuse_op(ctx.cfg.read_only, ctx.cfg.allow_discards, kind, len, fua) {
        return fail(e);
    }
    if let Err(e) = refuse_at(ctx.sector_size, ctx.size, kind, offset, len) {
        return fail(e);
    }
    let range = SectorRange {
        sector: offset / 512,
        at: match &ctx.segs {
            // A multi-target mapping whose targets sit at different
            // distances on the device (see `segments`).
            Some(s) if !s.uniform => s.at(offset),
            _ => ctx.data_offset + offset,
        },
        len,
    };
    Ok(match op {
        Op::Read { .. } => Work::Read(range),
        Op::Write { data } => Work::Write(range, data, fua),
        Op::WriteZeroes { .. } => Work::Zero(range, fua),
        Op::Discard { .. } => Work::Discard(range),
        Op::Flush => Work::Flush,
    })
}

/// The refusals that depend on the operation and its length only, in the
/// order the choke point applies them: read-only, FUA on a read, discards
/// off, too large. Shared with [`Export::check_op`](crate::Export::check_op).
pub(crate) fn refuse_op(
    read_only: bool,
    allow_discards: bool,
    kind: OpKind,
    len: u64,
    fua: bool,
) -> Result<(), Error> {
    if kind.modifies() && read_only {
        return Err(Error::ReadOnly { op: kind });
    }
    if fua && kind == OpKind::Read {
        return Err(Error::FuaOnRead);
    }
    if kind == OpKind::Discard && !allow_discards {
        return Err(Error::DiscardDisabled);
    }
    if matches!(kind, OpKind::Read | OpKind::Write) && len > MAX_REQUEST_BYTES {
        return Err(Error::TooLarge {
            op: kind,
            len,
            max: MAX_REQUEST_BYTES,
        });
    }
    Ok(())
}

/// The refusals that depend on where the request lies, after
/// [`refuse_op`]'s: misaligned, then out of range. Shared with
/// [`Export::check`](crate::Export::check).
pub(crate) fn refuse_at(
    sector_size: u32,
    size: u64,
    kind: OpKind,
    offset: u64,
    len: u64,
) -> Result<(), Error> {
    let ss = u64::from(sector_size);
    if offset % ss != 0 || len % ss != 0 {
        return Err(Error::Misaligned { sector_size });
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::OutOfRange {
            op: kind,
            offset,
            len,
            size,
        });
    }
    Ok(())
}
