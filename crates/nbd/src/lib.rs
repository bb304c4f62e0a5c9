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
//! [`nbd_errno`]: the engine's errno ([`datapath::Error::errno`], whose
//! table is the one every frontend shares) reduced to the protocol's codes
//! by [`proto::error_code`].
//!
//! Modules: `server` (listener, connections, shutdown), `handshake` (the
//! option phase), `transmit` (the request loop and replies), `stream` (the
//! socket, and the crate's only unsafe call).

#![deny(unsafe_code)]

use std::io;

mod handshake;
pub mod proto;
mod server;
#[allow(unsafe_code)] // recv(MSG_PEEK), with its SAFETY note
mod stream;
mod transmit;

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

/// Maps an engine error to the NBD error code sent to the client: its
/// errno ([`datapath::Error::errno`]) in the protocol's vocabulary
/// ([`proto::error_code`]). The one place this translation lives.
pub fn nbd_errno(err: &datapath::Error) -> u32 {
    proto::error_code(err.errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        use datapath::{Error as E, OpKind};
        let oor = |op| E::OutOfRange {
            op,
            offset: 0,
            len: 1,
            size: 0,
        };
        // proto.md "Error values": ENOSPC for writes past the end, EINVAL
        // for reads and trims past the end and for misaligned requests,
        // EPERM for writes to a read-only export.
        assert_eq!(nbd_errno(&oor(OpKind::Read)), proto::EINVAL);
        assert_eq!(nbd_errno(&oor(OpKind::Discard)), proto::EINVAL);
        assert_eq!(nbd_errno(&oor(OpKind::Write)), proto::ENOSPC);
        assert_eq!(nbd_errno(&oor(OpKind::WriteZeroes)), proto::ENOSPC);
        assert_eq!(
            nbd_errno(&E::Misaligned { sector_size: 4096 }),
            proto::EINVAL
        );
        for op in [OpKind::Write, OpKind::WriteZeroes, OpKind::Discard] {
            assert_eq!(nbd_errno(&E::ReadOnly { op }), proto::EPERM);
        }
        assert_eq!(nbd_errno(&E::DiscardDisabled), proto::EINVAL);
        assert_eq!(nbd_errno(&E::FuaOnRead), proto::EINVAL);
        assert_eq!(nbd_errno(&E::Shutdown), proto::ESHUTDOWN);
        let nospc = E::Io(io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(nbd_errno(&nospc), proto::ENOSPC);
        let quota = E::Io(io::Error::from_raw_os_error(libc::EDQUOT));
        assert_eq!(nbd_errno(&quota), proto::ENOSPC);
        let denied = E::Io(io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(nbd_errno(&denied), proto::EPERM);
        assert_eq!(nbd_errno(&E::Io(io::Error::other("x"))), proto::EIO);
    }
}
