//! What an export allows: the view a frontend (NBD, FUSE, ublk,
//! vhost-user-blk) asks instead of copying flags.
//!
//! ```text
//!   daemon / test ──Export::new(engine)[.with_read_only(..)][.with_discards(..)]
//!                        │ built once per export
//!                        ▼
//!   frontend: advertise  read_only() · allows_discards() · sector_size()
//!                        preferred_block_size() · max_request() · size()
//!             refuse     check_op(op, len) · check(op, offset, len)
//!                        ──► the engine's own refusals (check.rs)
//! ```
//!
//! An export can be narrower than its engine (read-only over a read-write
//! engine, discards off where the engine allows them), never wider: what
//! the export advertises the engine also accepts. Its refusals are the
//! engine's, built by the functions the engine's choke point uses, in the
//! same order, so a frontend that refuses a request before submitting it
//! answers exactly what the engine would have: every frontend gets the
//! same [`Error`] (and so the same errno, [`Error::errno`]) for the same
//! bad request. Hand-written.

use std::sync::Arc;

use crate::check::{refuse_at, refuse_op};
use crate::{Engine, Error, OpKind, MAX_REQUEST_BYTES};

/// One export of an engine: what it allows and its refusals.
#[derive(Clone)]
pub struct Export {
    engine: Arc<Engine>,
    read_only: bool,
    allow_discards: bool,
    sector_size: u32,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("read_only", &self.read_only)
            .field("allow_discards", &self.allow_discards)
            .field("sector_size", &self.sector_size)
            .finish_non_exhaustive()
    }
}

impl Export {
    /// The export of `engine` as its configuration stands: read-only and
    /// `allow_discards` as configured, its sector size.
    pub fn new(engine: Arc<Engine>) -> Self {
        let cfg = engine.config();
        let sector_size = engine.sector_size();
        Self {
            engine,
            read_only: cfg.read_only,
            allow_discards: cfg.allow_discards,
            sector_size,
        }
    }

    /// Also read-only when `on` (a read-only export of a read-write
    /// engine); never makes a read-only engine writable.
    pub fn with_read_only(mut self, on: bool) -> Self {
        self.read_only |= on;
        self
    }

    /// Discards off unless `on`; never allows discards the engine refuses.
    pub fn with_discards(mut self, on: bool) -> Self {
        self.allow_discards &= on;
        self
    }

    /// The engine behind the export.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Writes, write-zeroes and discards are refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Discards reach the engine (allowed, and the export is writable):
    /// what a frontend advertises.
    pub fn allows_discards(&self) -> bool {
        self.allow_discards && !self.read_only
    }

    /// The logical sector size: offsets and lengths are multiples of it.
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    /// The block size a client should prefer (at least a page, 4096
    /// bytes, so a 512-byte volume is not written in sub-page pieces): NBD's
    /// preferred block size, ublk's physical block and optimal IO size.
    pub fn preferred_block_size(&self) -> u32 {
        self.sector_size.max(4096)
    }

    /// The largest read or write accepted ([`MAX_REQUEST_BYTES`]);
    /// discards and write-zeroes have no such limit.
    pub fn max_request(&self) -> u64 {
        MAX_REQUEST_BYTES
    }

    /// The device size now (it follows a live resize).
    pub fn size(&self) -> u64 {
        self.engine.size()
    }

    /// The refusals that need no position, as the engine applies them:
    /// read-only, discards off, a read or write longer than
    /// [`Export::max_request`]. A flush always passes. Cheap (no look at
    /// the engine), so a frontend may ask it for every request.
    pub fn check_op(&self, op: OpKind, len: u64) -> Result<(), Error> {
        if op == OpKind::Flush {
            return Ok(());
        }
        refuse_op(self.read_only, self.allow_discards, op, len, false)
    }

    /// Every refusal the engine would give `op` of `len` bytes at `offset`
    /// (FUA aside): [`Export::check_op`]'s, then misaligned, then out of
    /// range against the size now.
    pub fn check(&self, op: OpKind, offset: u64, len: u64) -> Result<(), Error> {
        if op == OpKind::Flush {
            return Ok(());
        }
        self.check_op(op, len)?;
        refuse_at(self.sector_size, self.size(), op, offset, len)
    }
}

impl From<Arc<Engine>> for Export {
    fn from(engine: Arc<Engine>) -> Self {
        Self::new(engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, Op, Request};

    fn engine(read_only: bool, allow_discards: bool) -> Arc<Engine> {
        let cfg = EngineConfig {
            read_only,
            allow_discards,
            ..EngineConfig::default()
        };
        Arc::new(Engine::new(crate::test_volume(false), cfg).expect("engine"))
    }

    /// What the engine answers for the same request.
    fn engine_says(e: &Engine, op: OpKind, offset: u64, len: u64) -> Option<i32> {
        let len32 = u32::try_from(len).expect("test lengths fit");
        let op = match op {
            OpKind::Read => Op::Read { len: len32 },
            OpKind::Write => Op::Write {
                data: vec![0; len as usize],
            },
            OpKind::Discard => Op::Discard { len: len32 },
            OpKind::WriteZeroes => Op::WriteZeroes { len: len32 },
            _ => Op::Flush,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        e.submit(
            Request {
                op,
                offset,
                fua: false,
            },
            move |c| {
                let _ = tx.send(c.err().map(|e| e.errno()));
            },
        );
        rx.recv().expect("completion")
    }

    #[test]
    fn refuses_what_the_engine_refuses_in_the_same_order() {
        let size = 64 << 20;
        let ops = [
            OpKind::Read,
            OpKind::Write,
            OpKind::Discard,
            OpKind::WriteZeroes,
        ];
        // Offsets and lengths that hit each refusal alone and together.
        let places = [
            (0, 4096),
            (512, 4096),
            (100, 4096),
            (size, 512),
            (size - 512, 1024),
            (size + 100, 7),
            (u64::MAX - 511, 1024),
            (0, MAX_REQUEST_BYTES + 512),
            (size - 512, MAX_REQUEST_BYTES + 512),
        ];
        for (ro, disc) in [(false, true), (true, true), (false, false), (true, false)] {
            let e = engine(ro, disc);
            let x = Export::new(Arc::clone(&e));
            assert_eq!((x.read_only(), x.allows_discards()), (ro, disc && !ro));
            for op in ops {
                for (offset, len) in places {
                    let got = x.check(op, offset, len).err().map(|e| e.errno());
                    assert_eq!(
                        got,
                        engine_says(&e, op, offset, len),
                        "{op} at {offset} len {len}, read-only {ro}, discards {disc}"
                    );
                }
            }
            e.shutdown().expect("shutdown");
        }
    }

    #[test]
    fn an_export_narrows_its_engine_and_never_widens_it() {
        let e = engine(false, true);
        let x = Export::new(Arc::clone(&e)).with_read_only(true);
        let err = x.check_op(OpKind::WriteZeroes, 512).unwrap_err();
        assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
        assert_eq!(err.errno(), libc::EROFS);
        x.check_op(OpKind::Read, 512).expect("reads pass");
        let x = Export::new(Arc::clone(&e)).with_discards(false);
        assert!(!x.allows_discards());
        assert!(matches!(
            x.check_op(OpKind::Discard, 512),
            Err(Error::DiscardDisabled)
        ));
        let ro = engine(true, false);
        let x = Export::new(Arc::clone(&ro))
            .with_read_only(false)
            .with_discards(true);
        assert!(x.read_only() && !x.allows_discards());
        assert_eq!(x.sector_size(), 512);
        assert_eq!(x.preferred_block_size(), 4096);
        assert_eq!(x.max_request(), MAX_REQUEST_BYTES);
        assert_eq!(x.size(), 64 << 20);
        x.check(OpKind::Flush, u64::MAX, u64::MAX)
            .expect("a flush has no range");
        e.shutdown().expect("shutdown");
        ro.shutdown().expect("shutdown");
    }
}
