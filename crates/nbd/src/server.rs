//! The NBD server: listener, negotiation, and the pipelined transmission loop.
//!
//! Hand-written server side of the protocol (see [`crate::proto`]). Threads:
//!
//! ```text
//!   accept thread ──► per connection: a reader thread and a writer thread
//!    (poll: listener     │ reads a request (and its write payload)
//!     + wake socket)     │ Engine::submit(req, completion)
//!                        ▼
//!                     engine (any mode) ──► completion callback
//!                                            └─ Conn::reply: sends without
//!                                               waiting, or queues for the
//!                                               connection's writer thread
//! ```
//!
//! A client that does not read its replies stalls only its own connection
//! (see `transmit`): no engine thread ever waits on a client's socket.
//!
//! Requests are pipelined: the reader never waits for a reply, so replies may
//! go out of order, which NBD allows (the client matches cookies). A client
//! that breaks the protocol (bad magic, truncated request, oversized payload)
//! is disconnected; invalid but well-framed requests get an error reply.
//! Either way only that client is affected and nothing is written.
//!
//! With TLS ([`ServerOptions::tls`]) the option phase starts in plaintext;
//! after `NBD_OPT_STARTTLS` the connection's socket is handed to the TLS
//! pump (see `tls`) and the rest of the session runs on the plaintext end of
//! a socketpair, which then also becomes the handle shutdown acts on.
//!
//! [`Server::shutdown`] wakes the accept loop through a socketpair of its
//! own (the loop polls it beside the listener), never through the socket
//! path, so it is prompt whatever happened to the socket file; it then
//! gives connections [`STOP_GRACE`] to send their last replies before it
//! cuts them.

use std::io::{self, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use datapath::Export;

use crate::handshake::{greet, options, Outcome};
use crate::reuse::Writer;
use crate::session::{lock, ConnEntry, ExportConfig, ServerOptions, Shared};
use crate::stream::{self, Deadline, Stream};
use crate::tls::upgrade;
use crate::transmit::{transmit, Conn, REPLY_SNDBUF, REPLY_TIMEOUT};
use crate::Error;

/// Where the server listens (an open set: e.g. vsock could join).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// A unix socket path (the default; created 0600).
    Unix(PathBuf),
    /// A TCP address. NBD is unencrypted on the wire.
    Tcp(SocketAddr),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "nbd+unix:///?socket={}", p.display()),
            Endpoint::Tcp(a) => write!(f, "nbd://{a}"),
        }
    }
}

/// Counters for `status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections open now.
    pub connections: u64,
    /// Connections accepted since start.
    pub accepted: u64,
    /// Clients disconnected for protocol violations.
    pub protocol_errors: u64,
    /// Connections closed at once because [`crate::Limits::max_connections`]
    /// were open, or their peer already had
    /// [`crate::Limits::max_handshakes_per_peer`] in the option phase.
    pub refused: u64,
    /// Payload bytes in flight now, all connections together.
    pub inflight_bytes: u64,
}

/// How long [`Server::shutdown`] lets connections finish sending the
/// replies of requests already read before it closes them (a client that
/// reads nothing would otherwise hold shutdown for [`REPLY_TIMEOUT`]).
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// A running NBD server. Dropping it without [`Server::shutdown`] leaves the
/// threads running until the process exits.
pub struct Server {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    accept: Option<JoinHandle<()>>,
    /// Dropped to wake the accept loop (its peer polls readable: EOF).
    wake: Option<UnixStream>,
    /// The unix socket file we bound (device, inode), so shutdown removes
    /// it only if nobody replaced it since.
    socket_file: Option<(u64, u64)>,
}

/// Serves one client already connected on `stream`, on the calling thread,
/// exactly as a [`Server`] serves each of its connections (greeting,
/// options, TLS, transmission); returns when the client has left and
/// every reply is sent. For a socket handed over by a supervisor, and for
/// the fuzz targets.
pub fn serve_connection(
    view: impl Into<Export>,
    export: ExportConfig,
    opts: ServerOptions,
    stream: UnixStream,
) -> Result<(), Error> {
    serve_one(view.into(), export, opts, stream, false)
}

/// [`serve_connection`], with the reply writer on a reused thread when
/// `reuse_threads` (the fuzz entry points).
pub(crate) fn serve_one(
    view: Export,
    export: ExportConfig,
    opts: ServerOptions,
    stream: UnixStream,
    reuse_threads: bool,
) -> Result<(), Error> {
    let mut shared = Shared::new(view, export, opts);
    shared.reuse_threads = reuse_threads;
    serve_client(Stream::Unix(stream), &shared, 0)
}

impl Server {
    /// Binds `endpoint` and starts accepting clients for `view` (an
    /// [`Export`], or an engine exported as configured), in plaintext with
    /// the default [`crate::Limits`].
    ///
    /// A unix socket path must not exist (`AddrInUse` otherwise: nothing is
    /// ever removed to make room); the socket is removed at shutdown if the
    /// path still names it. The daemon binds its sockets itself, with their
    /// final mode and its stale-socket rules, and uses [`Server::start_on`].
    pub fn start(
        view: impl Into<Export>,
        export: ExportConfig,
        endpoint: Endpoint,
    ) -> Result<Self, Error> {
        Self::start_with(view, export, endpoint, ServerOptions::default())
    }

    /// [`Server::start`] with TLS and limits.
    pub fn start_with(
        view: impl Into<Export>,
        export: ExportConfig,
        endpoint: Endpoint,
        opts: ServerOptions,
    ) -> Result<Self, Error> {
        let mut socket_file = None;
        let (listener, endpoint) = match endpoint {
            Endpoint::Unix(path) => {
                let l = UnixListener::bind(&path)
                    .map_err(|e| Error::bind(&path.display().to_string(), e))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| Error::bind(&path.display().to_string(), e))?;
                socket_file = file_id(&path);
                (Listener::Unix(l), Endpoint::Unix(path))
            }
            Endpoint::Tcp(addr) => {
                let l = TcpListener::bind(addr).map_err(|e| Error::bind(&addr.to_string(), e))?;
                let local = l.local_addr()?;
                (Listener::Tcp(l), Endpoint::Tcp(local))
            }
        };
        Self::launch(view.into(), export, listener, endpoint, socket_file, opts)
    }

    /// [`Server::start_with`] on a unix socket the caller bound (and owns:
    /// the server never removes its file); `endpoint` is where clients
    /// find it, for [`Server::uri`].
    pub fn start_on(
        view: impl Into<Export>,
        export: ExportConfig,
        listener: UnixListener,
        endpoint: Endpoint,
        opts: ServerOptions,
    ) -> Result<Self, Error> {
        Self::launch(
            view.into(),
            export,
            Listener::Unix(listener),
            endpoint,
            None,
            opts,
        )
    }

    fn launch(
        view: Export,
        export: ExportConfig,
        listener: Listener,
        endpoint: Endpoint,
        socket_file: Option<(u64, u64)>,
        opts: ServerOptions,
    ) -> Result<Self, Error> {
        // Woken by readiness only: accept() itself must never block, or a
        // client that left between poll and accept would hold the loop.
        match &listener {
            Listener::Unix(l) => l.set_nonblocking(true)?,
            Listener::Tcp(l) => l.set_nonblocking(true)?,
        }
        let (wake, woken) = UnixStream::pair()?;
        let shared = Arc::new(Shared::new(view, export, opts));
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept_loop(listener, woken, s))?;
        Ok(Self {
            shared,
            endpoint,
            accept: Some(accept),
            wake: Some(wake),
            socket_file,
        })
    }

    /// The bound endpoint (with the real port for `Tcp(…:0)`).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The URI clients connect to: the endpoint's `nbd+unix://` or
    /// `nbd://`, as `nbds…` when TLS is required.
    pub fn uri(&self) -> String {
        let uri = self.endpoint.to_string();
        if self.shared.tls.mode() == crate::TlsMode::Require {
            uri.replacen("nbd", "nbds", 1)
        } else {
            uri
        }
    }

    /// Connection counters.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            connections: lock(&self.shared.conns).len() as u64,
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            protocol_errors: self.shared.protocol_errors.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
            inflight_bytes: self.shared.inflight_bytes.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, lets every connection finish the requests it has in
    /// flight (new requests are no longer read) and send their replies for
    /// up to [`STOP_GRACE`], closes them, and removes the unix socket it
    /// bound (not one given to [`Server::start_on`]). Does
    /// not flush the engine: the caller owns it. Needs nothing from the
    /// socket file, which may have been removed or replaced.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // The accept loop polls the peer of `wake`: closing it wakes the loop.
        drop(self.wake.take());
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        // Stop reading requests; connections then answer what they read.
        let handles: Vec<JoinHandle<()>> = {
            let mut conns = lock(&self.shared.conns);
            conns
                .values_mut()
                .filter_map(|e| {
                    e.session.shutdown(Shutdown::Read);
                    e.thread.take()
                })
                .collect()
        };
        // Engine completions never wait for clients, so only replies to
        // clients that do not read can still be pending past the grace:
        // cut those connections (their writers see the socket shut).
        let deadline = Instant::now() + STOP_GRACE;
        let mut conns = lock(&self.shared.conns);
        while !conns.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                for e in conns.values() {
                    e.cut();
                }
                break;
            }
            conns = self
                .shared
                .left
                .wait_timeout(conns, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(conns);
        for h in handles {
            let _ = h.join();
        }
        if let Endpoint::Unix(p) = &self.endpoint {
            if self.socket_file.is_some() && file_id(p) == self.socket_file {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// A path's (device, inode), not following a final symlink.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.stop();
        }
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

fn accept_loop(listener: Listener, woken: UnixStream, shared: Arc<Shared>) {
    let lfd = match &listener {
        Listener::Unix(l) => l.as_raw_fd(),
        Listener::Tcp(l) => l.as_raw_fd(),
    };
    loop {
        // Readable: a client is waiting, or `woken`'s peer was closed.
        if let Err(e) = stream::poll(
            &[(lfd, libc::POLLIN), (woken.as_raw_fd(), libc::POLLIN)],
            None,
        ) {
            eprintln!("ucrypt nbd: poll on the listener failed: {e}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match &listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| (Stream::Unix(s), None)),
            Listener::Tcp(l) => l.accept().map(|(s, a)| {
                let _ = s.set_nodelay(true);
                (Stream::Tcp(s), Some(a.ip().to_canonical()))
            }),
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match stream {
            Ok(s) => s,
            // Interrupted, or the client left before we took it.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) => {
                eprintln!("ucrypt nbd: accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        // Hold the table lock across spawn so the thread's own removal of
        // its entry cannot run before the entry exists.
        let mut conns = lock(&shared.conns);
        // At most a few handshakes per peer address (at most
        // `max_connections` entries: counting them is cheap).
        let peer_busy = peer.is_some_and(|ip| {
            let negotiating = conns
                .values()
                .filter(|e| e.negotiating && e.peer == Some(ip));
            negotiating.count() >= shared.limits.max_handshakes_per_peer
        });
        if conns.len() >= shared.limits.max_connections || peer_busy {
            // Closed before the greeting: the client sees EOF at once and
            // costs no thread. Counted, not logged (a flood would fill it).
            shared.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let Ok(ctl) = stream.try_clone() else {
            continue;
        };
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                let r = serve_client(stream, &s, id);
                if let Some(why) = r.as_ref().err().and_then(Error::protocol_reason) {
                    s.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("ucrypt nbd: client {id} disconnected: {why}");
                }
                // Detach our join handle unless shutdown() already took it.
                lock(&s.conns).remove(&id);
                s.left.notify_all();
            });
        if let Ok(h) = spawned {
            let entry = ConnEntry {
                session: ctl,
                raw: None,
                thread: Some(h),
                peer,
                negotiating: true,
            };
            conns.insert(id, entry);
        }
    }
}

fn serve_client(stream: Stream, shared: &Shared, id: u64) -> Result<(), Error> {
    let mut pump = None;
    let r = serve_session(stream, shared, id, &mut pump);
    // The pump ends once the session closed its end of the socketpair and
    // the last reply went out (or the client stopped reading for
    // REPLY_TIMEOUT).
    if let Some(p) = pump {
        let _ = p.join();
    }
    r
}

fn serve_session(
    stream: Stream,
    shared: &Shared,
    id: u64,
    pump: &mut Option<JoinHandle<()>>,
) -> Result<(), Error> {
    // The whole option phase, TLS handshake included, ends by this.
    let until = Some(Instant::now() + shared.limits.handshake_timeout);
    let mut w = Deadline {
        s: stream.try_clone()?,
        until,
    };
    let mut reader = BufReader::with_capacity(256 << 10, Deadline { s: stream, until });
    let mut session = greet(&mut reader, &mut w)?;
    let neg = loop {
        match options(&mut reader, &mut w, shared, &session)? {
            Outcome::Go(neg) => break neg,
            Outcome::Abort => return Ok(()),
            Outcome::StartTls => {
                // Bytes sent after STARTTLS but before the handshake would
                // be plaintext injected into the TLS session: refuse them.
                if !reader.buffer().is_empty() {
                    return Err(Error::protocol(
                        "Data sent between NBD_OPT_STARTTLS and the TLS handshake",
                    ));
                }
                let Some(ctx) = shared.tls.context() else {
                    return Err(Error::protocol("STARTTLS without credentials"));
                };
                drop(w);
                let (local, p) = upgrade(reader.into_inner(), ctx, REPLY_TIMEOUT)?;
                *pump = Some(p);
                let local = Stream::Unix(local);
                // Shutdown now acts on the session's side of the pump.
                if let Some(e) = lock(&shared.conns).get_mut(&id) {
                    e.raw = Some(std::mem::replace(&mut e.session, local.try_clone()?));
                }
                w = Deadline {
                    s: local.try_clone()?,
                    until,
                };
                reader = BufReader::with_capacity(256 << 10, Deadline { s: local, until });
                session.tls_active = true;
            }
        }
    };
    // The peer is through the option phase (authenticated, if TLS is
    // required): it no longer counts against its address's handshakes.
    if let Some(e) = lock(&shared.conns).get_mut(&id) {
        e.negotiating = false;
    }
    // Transmission: idle clients may wait as long as they like. Replies
    // leave through the connection's own path (`Conn::reply` and its
    // writer thread), never blocking the engine thread that completed them.
    reader.get_mut().clear()?;
    w.clear()?;
    w.s.grow_send_buffer(REPLY_SNDBUF);
    let conn = Arc::new(Conn::new(
        w.s,
        shared.limits.max_inflight_bytes,
        Arc::clone(&shared.inflight_bytes),
    ));
    let c = Arc::clone(&conn);
    let writer = Writer::start(format!("nbd-reply-{id}"), shared.reuse_threads, move || {
        c.run_writer()
    })?;
    let r = transmit(&mut reader, &conn, shared, neg);
    // Soft or hard disconnect: first finish what is in flight (NBD requires
    // replies to every request received before DISC).
    conn.wait_idle();
    conn.close_outbox();
    writer.join();
    conn.sock.shutdown(Shutdown::Both);
    r
}
