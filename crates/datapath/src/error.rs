//! The engine's one error type, and the one table that turns it into an
//! errno, with NBD's codes next to it.
//!
//! Every frontend answers a failed request through [`Error::errno`]: FUSE and
//! ublk reply with it directly, vhost-user-blk picks its status by it
//! (`vhost_blk::request::status_of`), NBD reduces it to the protocol's
//! smaller set of codes ([`Error::nbd_error`], [`nbd_error_of`]). The table
//! follows nbdkit's
//! `server/protocol.c` (`validate_request`) and the NBD protocol document's
//! "Error values", which agree with what the Linux block layer returns for
//! the same requests:
//!
//! | error                                 | errno        | NBD code   |
//! |---------------------------------------|--------------|------------|
//! | [`Error::ReadOnly`]                   | `EROFS`      | `EPERM`    |
//! | [`Error::OutOfRange`], write / zeroes | `ENOSPC`     | `ENOSPC`   |
//! | [`Error::OutOfRange`], read / discard | `EINVAL`     | `EINVAL`   |
//! | [`Error::Misaligned`]                 | `EINVAL`     | `EINVAL`   |
//! | [`Error::TooLarge`]                   | `EINVAL`     | `EINVAL`   |
//! | [`Error::FuaOnRead`]                  | `EINVAL`     | `EINVAL`   |
//! | [`Error::DiscardDisabled`]            | `EOPNOTSUPP` | `EINVAL`   |
//! | [`Error::Shutdown`]                   | `ESHUTDOWN`  | `ESHUTDOWN`|
//! | [`Error::Io`]                         | the OS error in its source chain, else `EIO` | by errno |
//! | [`Error::Invalid`]                    | `EINVAL`     | `EINVAL`   |
//!
//! (NBD has no `EROFS` or `EOPNOTSUPP` for these: the protocol says a write
//! to a read-only export is `NBD_EPERM`, and that `NBD_ENOTSUP` is only for
//! fast zeroes; an unsupported command is `NBD_EINVAL`.)
//!
//! An errno from the backend reaches NBD through [`nbd_error_of`]
//! (proto.md "Error values"): the codes the protocol has pass through;
//! `EROFS` and `EACCES` are `EPERM`, `EDQUOT` and `EFBIG` are `ENOSPC`;
//! `EOPNOTSUPP` and `EOVERFLOW` are `EINVAL` (the protocol keeps
//! `NBD_ENOTSUP` for fast zeroes and `NBD_EOVERFLOW` for
//! `NBD_CMD_FLAG_DF`, neither of which is offered); anything else is
//! `EIO`.

use std::io;

use crate::request::OpKind;

/// Why a request (or an engine reconfiguration) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request reaches beyond the end of the device.
    #[error("{op} out of range: offset {offset} length {len} device size {size}")]
    OutOfRange {
        /// What the request did.
        op: OpKind,
        /// Byte offset requested.
        offset: u64,
        /// Length requested.
        len: u64,
        /// Device size.
        size: u64,
    },
    /// Offset or length not a multiple of the sector size.
    #[error("Request not aligned to the {sector_size}-byte sector size")]
    Misaligned {
        /// The volume's sector size.
        sector_size: u32,
    },
    /// A write, write-zeroes or discard on a read-only engine.
    #[error("{op} refused: the device is read-only")]
    ReadOnly {
        /// What the request did.
        op: OpKind,
    },
    /// A discard while discards are off (`allow_discards`).
    #[error("Discard refused: allow_discards is off")]
    DiscardDisabled,
    /// A read or write longer than [`MAX_REQUEST_BYTES`](crate::MAX_REQUEST_BYTES).
    #[error("{op} of {len} bytes exceeds the {max}-byte request limit")]
    TooLarge {
        /// What the request did.
        op: OpKind,
        /// Length requested.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Forced unit access asked of a read.
    #[error("FUA is not valid on a read")]
    FuaOnRead,
    /// The backend failed.
    #[error("Backend IO error")]
    Io(#[from] io::Error),
    /// Engine shutting down.
    #[error("Engine is shut down")]
    Shutdown,
    /// The volume or configuration is inconsistent (reported by
    /// [`Engine::new`](crate::Engine::new),
    /// [`Engine::reconfigure`](crate::Engine::reconfigure),
    /// [`Engine::reload`](crate::Engine::reload)).
    #[error("Invalid volume or configuration: {0}")]
    Invalid(String),
}

impl Error {
    /// The errno a frontend answers this error with: the table in the
    /// module documentation, the one place it lives.
    pub fn errno(&self) -> i32 {
        match self {
            Error::ReadOnly { .. } => libc::EROFS,
            Error::OutOfRange { op, .. } if op.writes_data() => libc::ENOSPC,
            Error::OutOfRange { .. }
            | Error::Misaligned { .. }
            | Error::TooLarge { .. }
            | Error::FuaOnRead
            | Error::Invalid(_) => libc::EINVAL,
            Error::DiscardDisabled => libc::EOPNOTSUPP,
            Error::Shutdown => libc::ESHUTDOWN,
            Error::Io(e) => os_errno(e).unwrap_or(libc::EIO),
        }
    }

    /// The NBD error code a frontend answers this error with: its
    /// [`errno`](Error::errno) in the protocol's vocabulary
    /// ([`nbd_error_of`]).
    pub fn nbd_error(&self) -> u32 {
        nbd_error_of(self.errno())
    }
}

/// The NBD error code for an errno (the table in the module
/// documentation). The values are the protocol's (`NBD_EPERM` = 1, ...),
/// which are Linux's numbers.
pub fn nbd_error_of(errno: i32) -> u32 {
    const EPERM: u32 = 1;
    const EIO: u32 = 5;
    const ENOMEM: u32 = 12;
    const EINVAL: u32 = 22;
    const ENOSPC: u32 = 28;
    const ESHUTDOWN: u32 = 108;
    match errno {
        libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
        libc::EIO => EIO,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL | libc::EOPNOTSUPP | libc::EOVERFLOW => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// The errno carried by an io::Error or by any error in its source chain
/// (backend errors wrap the OS error in their own type).
fn os_errno(e: &io::Error) -> Option<i32> {
    if let Some(n) = e.raw_os_error() {
        return Some(n).filter(|&n| n > 0);
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|x| x as _);
    while let Some(err) = cur {
        if let Some(n) = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(n).filter(|&n| n > 0);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table() {
        let oor = |op| Error::OutOfRange {
            op,
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(oor(OpKind::Write).errno(), libc::ENOSPC);
        assert_eq!(oor(OpKind::WriteZeroes).errno(), libc::ENOSPC);
        assert_eq!(oor(OpKind::Read).errno(), libc::EINVAL);
        assert_eq!(oor(OpKind::Discard).errno(), libc::EINVAL);
        assert_eq!(
            Error::Misaligned { sector_size: 4096 }.errno(),
            libc::EINVAL
        );
        let ro = Error::ReadOnly { op: OpKind::Write };
        assert_eq!(ro.errno(), libc::EROFS);
        assert_eq!(Error::DiscardDisabled.errno(), libc::EOPNOTSUPP);
        assert_eq!(Error::FuaOnRead.errno(), libc::EINVAL);
        let big = Error::TooLarge {
            op: OpKind::Read,
            len: 1 << 30,
            max: 1 << 25,
        };
        assert_eq!(big.errno(), libc::EINVAL);
        assert_eq!(Error::Shutdown.errno(), libc::ESHUTDOWN);
        let nospc = Error::Io(io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(nospc.errno(), libc::ENOSPC);
        // An errno wrapped inside a custom error (as backend errors are).
        let wrapped = io::Error::other(io::Error::from_raw_os_error(libc::EROFS));
        assert_eq!(Error::Io(wrapped).errno(), libc::EROFS);
        assert_eq!(Error::Io(io::Error::other("no errno")).errno(), libc::EIO);
    }

    #[test]
    fn nbd_codes() {
        let oor = |op| Error::OutOfRange {
            op,
            offset: 0,
            len: 1,
            size: 0,
        };
        // proto.md "Error values": ENOSPC for writes past the end, EINVAL
        // for reads and trims past the end and for misaligned requests,
        // EPERM for writes to a read-only export.
        assert_eq!(oor(OpKind::Read).nbd_error(), 22);
        assert_eq!(oor(OpKind::Discard).nbd_error(), 22);
        assert_eq!(oor(OpKind::Write).nbd_error(), 28);
        assert_eq!(oor(OpKind::WriteZeroes).nbd_error(), 28);
        assert_eq!(Error::Misaligned { sector_size: 4096 }.nbd_error(), 22);
        for op in [OpKind::Write, OpKind::WriteZeroes, OpKind::Discard] {
            assert_eq!(Error::ReadOnly { op }.nbd_error(), 1);
        }
        assert_eq!(Error::DiscardDisabled.nbd_error(), 22);
        assert_eq!(Error::FuaOnRead.nbd_error(), 22);
        assert_eq!(Error::Shutdown.nbd_error(), 108);
        let os = |n| Error::Io(io::Error::from_raw_os_error(n)).nbd_error();
        assert_eq!(os(libc::ENOSPC), 28);
        assert_eq!(os(libc::EDQUOT), 28);
        assert_eq!(os(libc::EFBIG), 28);
        assert_eq!(os(libc::EACCES), 1);
        assert_eq!(os(libc::ENOMEM), 12);
        assert_eq!(os(libc::EOVERFLOW), 22);
        assert_eq!(os(libc::ENXIO), 5);
        assert_eq!(Error::Io(io::Error::other("x")).nbd_error(), 5);
    }

    #[test]
    fn messages_name_the_operation() {
        let e = Error::OutOfRange {
            op: OpKind::Write,
            offset: 4096,
            len: 512,
            size: 4096,
        };
        assert_eq!(
            e.to_string(),
            "Write out of range: offset 4096 length 512 device size 4096"
        );
        assert_eq!(
            Error::ReadOnly {
                op: OpKind::Discard
            }
            .to_string(),
            "Discard refused: the device is read-only"
        );
    }
}
