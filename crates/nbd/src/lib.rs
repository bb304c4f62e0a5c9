//! NBD server frontend for the ucrypt engine.
//!
//! The server side of the Network Block Device protocol is hand-written here
//! (no NBD server crate is used); the wire format follows the protocol
//! document `doc/proto.md` of the NetworkBlockDevice project:
//!
//! * fixed newstyle negotiation with `NBD_OPT_GO`, `NBD_OPT_INFO`,
//!   `NBD_OPT_LIST`, `NBD_OPT_ABORT` and `NBD_OPT_EXPORT_NAME`;
//!   `NBD_INFO_BLOCK_SIZE` advertises the volume's sector size as minimum;
//! * `READ`, `WRITE`, `FLUSH`, `TRIM`, `WRITE_ZEROES`, `DISC`, the `FUA` flag,
//!   simple replies, pipelined requests (replies may be out of order) and
//!   multi-conn (every connection shares one [`datapath::Engine`]).
//!
//! ```text
//!   NBD client ──unix/tcp──► Server ──Engine::submit──► datapath
//!                               ◄──── completion: simple reply ────┘
//! ```
//!
//! Errors from the engine become NBD error codes in one function,
//! [`nbd_errno`].

use std::io;

pub mod proto;
mod server;

pub use server::{Endpoint, ExportConfig, Server, ServerStats};

/// Errors of the NBD frontend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Could not listen on the requested endpoint.
    #[error("Cannot listen on {endpoint}")]
    Bind {
        /// The socket path or address.
        endpoint: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A client broke the protocol and was disconnected.
    #[error("Protocol violation: {0}")]
    Protocol(String),
    /// Socket IO failed.
    #[error("NBD socket IO failed")]
    Io(#[from] io::Error),
}

impl Error {
    fn bind(endpoint: &str, source: io::Error) -> Self {
        Self::Bind {
            endpoint: endpoint.to_owned(),
            source,
        }
    }
}

/// Maps an engine error to the NBD error code sent to the client, for the
/// request type `cmd` (`proto::CMD_*`). The one place this translation lives.
pub fn nbd_errno(err: &datapath::Error, cmd: u16) -> u32 {
    use datapath::Error as E;
    let writes = matches!(
        cmd,
        proto::CMD_WRITE | proto::CMD_WRITE_ZEROES | proto::CMD_TRIM
    );
    match err {
        // proto.md: writes beyond the end SHOULD fail with ENOSPC, other
        // requests beyond the end with EINVAL.
        E::OutOfRange { .. } if writes => proto::ENOSPC,
        E::OutOfRange { .. } | E::Misaligned { .. } => proto::EINVAL,
        E::Unsupported(what) if what.contains("read-only") || what.contains("read only") => {
            proto::EPERM
        }
        E::Unsupported(_) => proto::EINVAL,
        E::Io(e) => match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => proto::ENOSPC,
            Some(libc::ENOMEM) => proto::ENOMEM,
            Some(libc::EPERM) | Some(libc::EROFS) | Some(libc::EACCES) => proto::EPERM,
            _ => proto::EIO,
        },
        E::Shutdown => proto::ESHUTDOWN,
        _ => proto::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        use datapath::Error as E;
        let oor = E::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(nbd_errno(&oor, proto::CMD_READ), proto::EINVAL);
        assert_eq!(nbd_errno(&oor, proto::CMD_WRITE), proto::ENOSPC);
        assert_eq!(
            nbd_errno(&E::Misaligned { sector_size: 4096 }, proto::CMD_READ),
            proto::EINVAL
        );
        assert_eq!(nbd_errno(&E::Shutdown, proto::CMD_READ), proto::ESHUTDOWN);
        let nospc = E::Io(io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(nbd_errno(&nospc, proto::CMD_WRITE), proto::ENOSPC);
        assert_eq!(
            nbd_errno(&E::Io(io::Error::other("x")), proto::CMD_READ),
            proto::EIO
        );
    }
}
