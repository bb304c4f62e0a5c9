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
//! What the export allows (read-only, trim, block sizes, the request size
//! limit) is the [`datapath::Export`] it serves: advertised in the
//! handshake, and every refusal before submission is the view's
//! ([`datapath::Export::check_op`]), so it is the engine's own. Errors
//! become NBD error codes by [`datapath::Error::nbd_error`], next to the
//! errno table every frontend shares.
//!
//! Modules: `server` (listener, connections, shutdown), `handshake` (the
//! option phase), `tls` (credentials, handshake, the TLS pump), `transmit`
//! (the request loop and replies), `stream` (the socket, and the crate's
//! only unsafe calls).

#![deny(unsafe_code)]

use std::io;

mod handshake;
pub mod proto;
mod reuse;
mod server;
mod session;
#[allow(unsafe_code)] // recv(MSG_PEEK) and poll(2), with their SAFETY notes
mod stream;
mod tls;
mod transmit;

pub use server::{serve_connection, Endpoint, Server, ServerStats};
pub use session::{ExportConfig, Limits, ServerOptions};
pub use tls::{TlsConfig, TlsMode};

/// Entry points for the cargo-fuzz targets in `fuzz/` (not a stable API):
/// built only with the `fuzzing` feature (`fuzz/` and this crate's tests).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod internal {
    /// Whole client sessions fed from bytes, in process.
    pub mod fuzzing {
        use std::io::{Read, Write};
        use std::net::Shutdown;
        use std::os::fd::AsRawFd;
        use std::os::unix::net::UnixStream;
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::{Arc, Mutex, Once};
        use std::time::Duration;

        use datapath::Engine;

        use crate::server::serve_one;
        use crate::session::lock;
        use crate::{proto, ExportConfig, ServerOptions, TlsConfig};

        /// Plays `data[1..]` as everything a client sends after the
        /// greeting (flags, options, and requests if it gets that far)
        /// against `engine`, and returns what the server sent. `data[0]`
        /// picks the export: bit 0 read-only, bit 1 trim (where the engine
        /// allows discards), bit 2 `tls`
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
            };
            let view = datapath::Export::new(Arc::clone(engine))
                .with_read_only(sel & 1 != 0)
                .with_discards(sel & 2 != 0);
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
            // buffer; a thread writes any rest); the replies pile up in
            // the socket, which the process's reply reader empties only
            // when a session fills it (see `Drain`); the connection's reply
            // writer runs on a reused thread. Spawning a thread per
            // session, or waking one per reply, cost more than the
            // session itself.
            let sent = prewrite(&peer, client);
            if sent == client.len() {
                let _ = peer.shutdown(Shutdown::Write);
                let d = Drain::register(peer);
                let _ = serve_one(view, export, opts, server, true);
                return d.finish();
            }
            // Rare (an input larger than the socket buffer): a thread
            // writes the rest and another reads the replies, blocking.
            let mut w = peer.try_clone().expect("dup");
            let rest = client[sent..].to_vec();
            let writer = std::thread::spawn(move || {
                let _ = w.write_all(&rest);
                let _ = w.shutdown(Shutdown::Write);
            });
            let mut r = peer;
            let reader = std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = r.read_to_end(&mut out);
                out
            });
            let _ = serve_one(view, export, opts, server, true);
            let _ = writer.join();
            reader.join().unwrap_or_default()
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

        /// A session's replies: the client end of its socket, registered
        /// with the process's reply reader until the session is over.
        struct Drain {
            id: u64,
        }

        /// Sessions being served: id, client end (non-blocking), replies
        /// read so far.
        type Active = Vec<(u64, UnixStream, Vec<u8>)>;
        static ACTIVE: Mutex<Active> = Mutex::new(Vec::new());

        /// How often the reply reader looks at the registered sockets
        /// when they are quiet. A session that fills its socket waits at
        /// most this long; most sessions end before the reader ever looks.
        const TICK: Duration = Duration::from_millis(1);

        impl Drain {
            fn register(peer: UnixStream) -> Self {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                static READER: Once = Once::new();
                READER.call_once(|| {
                    std::thread::spawn(Drain::reader);
                });
                peer.set_nonblocking(true).expect("non-blocking");
                let id = NEXT.fetch_add(1, Ordering::Relaxed);
                lock(&ACTIVE).push((id, peer, Vec::new()));
                Drain { id }
            }

            /// The reply reader: empties the registered sockets every
            /// [`TICK`], or as they fill while a session sends a lot.
            fn reader() {
                loop {
                    let mut got = 0;
                    let mut fds = Vec::new();
                    for (_, s, out) in lock(&ACTIVE).iter_mut() {
                        let before = out.len();
                        let _ = s.read_to_end(out);
                        got += out.len() - before;
                        fds.push((s.as_raw_fd(), libc::POLLIN));
                    }
                    if got >= 64 << 10 {
                        // A session is sending a lot: follow it closely. (A
                        // descriptor closed meanwhile only ends the wait.)
                        let _ = crate::stream::poll(&fds, Some(TICK));
                    } else {
                        std::thread::sleep(TICK);
                    }
                }
            }

            /// Everything the server sent, once it has closed its end.
            fn finish(self) -> Vec<u8> {
                let mut a = lock(&ACTIVE);
                let i = a.iter().position(|e| e.0 == self.id).expect("registered");
                let (_, mut s, mut out) = a.swap_remove(i);
                drop(a);
                let _ = s.set_nonblocking(false);
                let _ = s.read_to_end(&mut out);
                out
            }
        }
    }
}

/// Errors of the NBD frontend, in the workspace's shape
/// (docs/ARCHITECTURE.md, "Errors"): a stable [`ErrorKind`], the message
/// `Display` shows and the socket's OS error as the source. A failed
/// request is not one of these: it is answered through
/// [`datapath::Error::nbd_error`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<io::Error>,
}

/// What went wrong; stable for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Could not listen on the requested endpoint.
    Bind,
    /// TLS credentials could not be loaded (path and reason in the message).
    TlsSetup,
    /// A client broke the protocol and was disconnected.
    Protocol,
    /// Socket IO failed.
    Io,
}

/// What a [`ErrorKind::Protocol`] message starts with.
const PROTOCOL_VIOLATION: &str = "Protocol violation: ";

impl Error {
    fn bind(endpoint: &str, source: io::Error) -> Self {
        Self {
            kind: ErrorKind::Bind,
            message: format!("Cannot listen on {endpoint}"),
            source: Some(source),
        }
    }

    /// [`ErrorKind::TlsSetup`]: `why` says which file and what is wrong.
    fn tls_setup(why: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::TlsSetup,
            message: format!("Cannot set up TLS: {}", why.into()),
            source: None,
        }
    }

    /// [`ErrorKind::Protocol`]: `why` says what the client did.
    fn protocol(why: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Protocol,
            message: format!("{PROTOCOL_VIOLATION}{}", why.into()),
            source: None,
        }
    }

    /// [`ErrorKind::Io`].
    fn io(source: io::Error) -> Self {
        Self {
            kind: ErrorKind::Io,
            message: "NBD socket IO failed".into(),
            source: Some(source),
        }
    }

    /// For [`ErrorKind::Protocol`]: what the client did (the message
    /// without its "Protocol violation: ").
    fn protocol_reason(&self) -> Option<&str> {
        (self.kind == ErrorKind::Protocol)
            .then(|| self.message.strip_prefix(PROTOCOL_VIOLATION))
            .flatten()
    }

    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message (what `Display` shows; the source is apart).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Self::io(e)
    }
}
