//! The pure half of the frontend: an IO descriptor from the driver becomes
//! an engine [`Request`], and a [`Completion`] becomes the value the command
//! completes with. Errors are the engine's, in its one errno table.

use datapath::{Completion, Op, Request};
use libublk::sys;

/// One IO descriptor as the driver hands it over (`ublksrv_io_desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation in bits 0-7, `UBLK_IO_F_*` flags above.
    pub op_flags: u32,
    /// Length in 512-byte sectors.
    pub nr_sectors: u32,
    /// Start in 512-byte sectors.
    pub start_sector: u64,
}

/// Translates an IO descriptor into an engine request; `data` is the tag
/// buffer (write payload source). `Err(errno)` completes the command at once.
pub fn translate(d: &IoDesc, data: &[u8]) -> Result<Request, i32> {
    let op = d.op_flags & 0xff;
    let fua = d.op_flags & sys::UBLK_IO_F_FUA != 0;
    if op == sys::UBLK_IO_OP_FLUSH {
        // A flush has no position: the block layer's flush request carries
        // sector -1 (found by the guest suite: mkfs's fsync failed with
        // EINVAL when the offset overflowed below), so neither field is read.
        return Ok(Request {
            op: Op::Flush,
            offset: 0,
            fua,
        });
    }
    let offset = d.start_sector.checked_mul(512).ok_or(libc::EINVAL)?;
    let len = u64::from(d.nr_sectors) * 512;
    let len32 = u32::try_from(len).map_err(|_| libc::EINVAL)?;
    let op = match op {
        sys::UBLK_IO_OP_READ => {
            if len > data.len() as u64 {
                return Err(libc::EINVAL);
            }
            Op::Read { len: len32 }
        }
        sys::UBLK_IO_OP_WRITE => {
            let src = data.get(..len as usize).ok_or(libc::EINVAL)?;
            Op::Write { data: src.to_vec() }
        }
        sys::UBLK_IO_OP_DISCARD => Op::Discard { len: len32 },
        sys::UBLK_IO_OP_WRITE_ZEROES => Op::WriteZeroes { len: len32 },
        _ => return Err(libc::EOPNOTSUPP),
    };
    Ok(Request { op, offset, fua })
}

/// The value a command completes with: bytes done, or `-errno` from
/// [`datapath::Error::errno`] (the block layer turns it into a
/// `blk_status_t`: `EOPNOTSUPP` → not supported, `ENOSPC` → no space, the
/// rest → IO error).
pub fn completion_result(req_len: u32, c: &Completion) -> i32 {
    match c {
        Ok(_) => i32::try_from(req_len).unwrap_or(i32::MAX),
        Err(e) => -e.errno(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(op: u32, flags: u32, start: u64, sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: op | flags,
            nr_sectors: sectors,
            start_sector: start,
        }
    }

    #[test]
    fn translates_reads_and_writes_with_fua() {
        let buf: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let r = translate(&desc(sys::UBLK_IO_OP_READ, 0, 8, 4), &buf).unwrap();
        assert!(matches!(r.op, Op::Read { len: 2048 }) && r.offset == 4096 && !r.fua);
        let w = translate(&desc(sys::UBLK_IO_OP_WRITE, sys::UBLK_IO_F_FUA, 1, 3), &buf).unwrap();
        assert!(w.fua && w.offset == 512);
        match w.op {
            Op::Write { data } => assert_eq!(data, buf[..1536]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn translates_flush_discard_zeroes() {
        let r = translate(&desc(sys::UBLK_IO_OP_FLUSH, 0, 0, 0), &[]).unwrap();
        assert!(matches!(r.op, Op::Flush));
        // The kernel's flush request has sector -1 (blk_rq_pos of a request
        // without a bio): still a flush, not an overflow error.
        let r = translate(&desc(sys::UBLK_IO_OP_FLUSH, 0, u64::MAX, 0), &[]).unwrap();
        assert!(matches!(r.op, Op::Flush) && r.offset == 0);
        let r = translate(&desc(sys::UBLK_IO_OP_DISCARD, 0, 100, 2048), &[]).unwrap();
        assert!(matches!(r.op, Op::Discard { len: 1_048_576 }) && r.offset == 51_200);
        let r = translate(
            &desc(sys::UBLK_IO_OP_WRITE_ZEROES, sys::UBLK_IO_F_NOUNMAP, 7, 1),
            &[],
        )
        .unwrap();
        assert!(matches!(r.op, Op::WriteZeroes { len: 512 }) && r.offset == 3584);
    }

    #[test]
    fn rejects_unknown_ops_and_oversized_or_overflowing_requests() {
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_WRITE_SAME, 0, 0, 1), &[0; 512]).unwrap_err(),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_ZONE_APPEND, 0, 0, 1), &[0; 512]).unwrap_err(),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            translate(&desc(0xff, 0, 0, 1), &[0; 512]).unwrap_err(),
            libc::EOPNOTSUPP
        );
        // Larger than the tag buffer.
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_READ, 0, 0, 3), &[0; 1024]).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_WRITE, 0, 0, 3), &[0; 1024]).unwrap_err(),
            libc::EINVAL
        );
        // Byte offset overflow and lengths beyond u32.
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_READ, 0, u64::MAX / 256, 1), &[0; 512]).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_DISCARD, 0, 0, u32::MAX), &[]).unwrap_err(),
            libc::EINVAL
        );
    }

    #[test]
    fn completes_with_bytes_or_the_engine_errno() {
        use datapath::{Error as E, OpKind};
        assert_eq!(completion_result(4096, &Ok(None)), 4096);
        let oor = E::OutOfRange {
            op: OpKind::Write,
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(completion_result(4096, &Err(oor)), -libc::ENOSPC);
        assert_eq!(
            completion_result(512, &Err(E::DiscardDisabled)),
            -libc::EOPNOTSUPP
        );
        assert_eq!(completion_result(512, &Err(E::Shutdown)), -libc::ESHUTDOWN);
    }
}
