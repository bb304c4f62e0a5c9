//! NBD server frontend for the ucrypt engine.
//!
//! The server side of the Network Block Device protocol is hand-written here
//! (no NBD server crate is used); the wire format follows the protocol
//! document `doc/proto.md` of the NetworkBlockDevice project:
//!
//! * fixed newstyle negotiation with `NBD_OPT_GO`, `NBD_OPT_INFO`,
//!   `NBD_OPT_LIST`, `NBD_OPT_ABORT` and `NBD_OPT_EXPORT_NAME`;
//!   `NBD_INFO_BLOCK_SIZE` advertises the volume's sector size as minimum;
//! * `NBD_OPT_STARTTLS` with X.509 or PSK credentials ([`TlsConfig`],
//!   modes off/on/require as nbdkit's `--tls`);
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
//! option phase), `tls` (credentials, handshake, the TLS pump), `transmit`
//! (the request loop and replies), `stream` (the socket, and the crate's
//! only unsafe calls).

#![deny(unsafe_code)]

use std::io;

mod handshake;
pub mod proto;
mod server;
#[allow(unsafe_code)] // recv(MSG_PEEK) and poll(2), with their SAFETY notes
mod stream;
mod tls;
mod transmit;

pub use server::{
    serve_connection, Endpoint, ExportConfig, Limits, Server, ServerOptions, ServerStats,
};
pub use tls::{TlsConfig, TlsMode};

/// Entry points for the cargo-fuzz targets in `fuzz/` (not a stable API).
#[doc(hidden)]
pub mod internal {
    /// Whole client sessions fed from bytes, in process.
    pub mod fuzzing {
        use std::io::{Read, Write};
        use std::net::Shutdown;
        use std::os::unix::net::UnixStream;
        use std::sync::{mpsc, Arc, Mutex, OnceLock};

        use datapath::Engine;

        use crate::{proto, serve_connection, ExportConfig, ServerOptions, TlsConfig};

        /// Plays `data[1..]` as everything a client sends after the
        /// greeting (flags, options, and requests if it gets that far)
        /// against `engine`, and returns what the server sent. `data[0]`
        /// picks the export: bit 0 read-only, bit 1 trim, bit 2 `tls`
        /// (whose mode is then in force) instead of plaintext.
        pub fn session(engine: &Arc<Engine>, tls: &TlsConfig, data: &[u8]) -> Vec<u8> {
            let Some((&sel, client)) = data.split_first() else {
                return Vec::new();
            };
            run(engine, tls, sel, client)
        }

        /// Like [`session`], but first negotiates the default export with
        /// `NBD_OPT_GO`, so `data[1..]` is the transmission phase.
        pub fn transmission(engine: &Arc<Engine>, data: &[u8]) -> Vec<u8> {
            let Some((&sel, requests)) = data.split_first() else {
                return Vec::new();
            };
            let flags = proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES;
            let mut client = flags.to_be_bytes().to_vec();
            client.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
            client.extend_from_slice(&proto::OPT_GO.to_be_bytes());
            client.extend_from_slice(&6u32.to_be_bytes());
            client.extend_from_slice(&[0; 6]);
            client.extend_from_slice(requests);
            run(engine, &TlsConfig::off(), sel & 3, &client)
        }

        fn run(engine: &Arc<Engine>, tls: &TlsConfig, sel: u8, client: &[u8]) -> Vec<u8> {
            let (server, peer) = UnixStream::pair().expect("socketpair");
            let export = ExportConfig {
                name: "fuzz".into(),
                description: "fuzz".into(),
                read_only: sel & 1 != 0,
                allow_trim: sel & 2 != 0,
            };
            let opts = ServerOptions {
                tls: if sel & 4 != 0 {
                    tls.clone()
                } else {
                    TlsConfig::off()
                },
                ..ServerOptions::default()
            };
            // The server runs on this thread. What the client sends is
            // queued in the socket up front (a fuzz input fits in its
            // buffer; a thread writes any rest), and one long-lived thread
            // reads the replies: a thread or two spawned per session cost
            // more than the session itself.
            let sent = prewrite(&peer, client);
            let writer = (sent < client.len()).then(|| {
                let mut w = peer.try_clone().expect("dup");
                let rest = client[sent..].to_vec();
                std::thread::spawn(move || {
                    let _ = w.write_all(&rest);
                    let _ = w.shutdown(Shutdown::Write);
                })
            });
            if writer.is_none() {
                let _ = peer.shutdown(Shutdown::Write);
            }
            let replies = drain(peer);
            let _ = serve_connection(Arc::clone(engine), export, opts, server);
            if let Some(w) = writer {
                let _ = w.join();
            }
            replies.recv().unwrap_or_default()
        }

        /// Writes as much of `data` to `s` as fits without blocking.
        fn prewrite(s: &UnixStream, data: &[u8]) -> usize {
            let mut sent = 0;
            if s.set_nonblocking(true).is_err() {
                return 0;
            }
            let mut w = s;
            while sent < data.len() {
                match w.write(&data[sent..]) {
                    Ok(0) => break,
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            s.set_nonblocking(false).expect("blocking again");
            sent
        }

        /// Hands `peer` to the process's reply reader, which reads it to
        /// EOF (the server side closed) and sends back what it read.
        /// Sessions run at once (tests) are drained one after another;
        /// none waits on another's, so that cannot deadlock.
        fn drain(peer: UnixStream) -> mpsc::Receiver<Vec<u8>> {
            type Job = (UnixStream, mpsc::Sender<Vec<u8>>);
            static READER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
            let jobs = READER.get_or_init(|| {
                let (tx, rx) = mpsc::channel::<Job>();
                std::thread::spawn(move || {
                    for (mut s, done) in rx {
                        let mut out = Vec::new();
                        let _ = s.read_to_end(&mut out);
                        let _ = done.send(out);
                    }
                });
                Mutex::new(tx)
            });
            let (tx, rx) = mpsc::channel();
            jobs.lock()
                .unwrap_or_else(|e| e.into_inner())
                .send((peer, tx))
                .expect("reply reader runs");
            rx
        }
    }
}

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
    /// TLS credentials could not be loaded (path and reason in the message).
    #[error("Cannot set up TLS: {0}")]
    TlsSetup(String),
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
