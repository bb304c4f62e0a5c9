//! What a server's connections share: the export's name, the server's
//! options and limits, and the state every session reads ([`Shared`]:
//! engine, export view, TLS, stop flag, counters, the connection table).
//! The accept loop (`server`), the option phase (`handshake`), the
//! transmission loop (`transmit`) and the reply writers (`reuse`) all
//! build on it; it depends on none of them.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use datapath::{Engine, Export};

use crate::stream::Stream;
use crate::tls::TlsConfig;

/// What the export is called. What it allows (read-only, trim, sizes) is
/// the [`datapath::Export`] it serves.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Export name; clients may also use the default (empty) name.
    pub name: String,
    /// Human-readable description (`NBD_INFO_DESCRIPTION`, `NBD_OPT_LIST`).
    pub description: String,
}

/// How the server runs: TLS and limits. `Default` is plaintext with the
/// default [`Limits`].
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// NBD over TLS (`NBD_OPT_STARTTLS`); off by default.
    pub tls: TlsConfig,
    /// Bounds on what clients can make the server hold.
    pub limits: Limits,
}

/// Bounds on what clients can make the server hold. Memory for request
/// payloads is at most about `max_connections × (max_inflight_bytes +`
/// [`proto::MAX_PAYLOAD`](crate::proto::MAX_PAYLOAD)`)`.
///
/// The defaults: 16 connections; the option phase (TLS handshake
/// included) within 10 s; at most 4 of those 16 in the option phase from
/// one TCP peer address; 32 MiB of payload in flight per connection. So a
/// peer that never authenticates holds at most 4 connection slots for
/// 10 s at a time, and the other 12 stay open to everyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once (in negotiation or transmission); one
    /// more is closed right after `accept`, before the greeting.
    pub max_connections: usize,
    /// Longest the option phase may take, TLS handshake included; a client
    /// that has not reached transmission by then is disconnected.
    pub handshake_timeout: std::time::Duration,
    /// Connections one TCP peer address (an IPv4-mapped IPv6 address
    /// counts as its IPv4 one) may have in the option phase at once,
    /// TLS handshake included; one more from that address is closed right
    /// after `accept`, like one past [`Limits::max_connections`]. Before
    /// the option phase ends nobody knows who the peer is, so this is
    /// what bounds the slots an unauthenticated peer can hold: a peer
    /// that stalls its handshakes holds at most this many slots, each
    /// for at most [`Limits::handshake_timeout`]. Unix socket clients
    /// (already vetted by the socket's mode) are not counted.
    pub max_handshakes_per_peer: usize,
    /// Payload bytes (read lengths and write payloads) one connection may
    /// have inside the engine or waiting to be sent; beyond it (or beyond
    /// 1024 requests) the server stops reading that client's requests
    /// until replies have left. One request larger than this still runs,
    /// alone. This is what a client that does not read its replies can
    /// make the server hold; it stalls no one else.
    pub max_inflight_bytes: u64,
}

impl Limits {
    /// Default [`Limits::max_connections`]: enough for multi-conn clients
    /// (nbdcopy opens 4, qemu 1 per drive).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 16;
    /// Default [`Limits::max_handshakes_per_peer`]: nbdcopy's 4
    /// connections, which it opens together, negotiate at once; a quarter
    /// of the default connection slots.
    pub const DEFAULT_MAX_HANDSHAKES_PER_PEER: usize = 4;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            // qemu-nbd's default handshake limit.
            handshake_timeout: std::time::Duration::from_secs(10),
            max_handshakes_per_peer: Self::DEFAULT_MAX_HANDSHAKES_PER_PEER,
            // One maximum-size request, or 128 pipelined 256 KiB ones.
            max_inflight_bytes: u64::from(crate::proto::MAX_PAYLOAD),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) engine: Arc<Engine>,
    /// What the export allows: advertised in the handshake, asked for
    /// every request's refusals.
    pub(crate) view: Export,
    pub(crate) export: ExportConfig,
    pub(crate) tls: TlsConfig,
    pub(crate) limits: Limits,
    pub(crate) stopping: AtomicBool,
    pub(crate) next_id: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) refused: AtomicU64,
    /// Payload bytes in flight, all connections (see `Conn::begin`).
    pub(crate) inflight_bytes: Arc<AtomicU64>,
    /// Open connections: a handle to shut each one down, and its thread.
    pub(crate) conns: Mutex<HashMap<u64, ConnEntry>>,
    /// Signalled when a connection leaves `conns`.
    pub(crate) left: Condvar,
    /// Reply writers run on reused threads (see `reuse`); only the fuzz
    /// entry points set it.
    pub(crate) reuse_threads: bool,
}

impl Shared {
    pub(crate) fn new(view: Export, export: ExportConfig, opts: ServerOptions) -> Self {
        Self {
            engine: Arc::clone(view.engine()),
            view,
            export,
            tls: opts.tls,
            limits: opts.limits,
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            inflight_bytes: Arc::new(AtomicU64::new(0)),
            conns: Mutex::new(HashMap::new()),
            left: Condvar::new(),
            reuse_threads: false,
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of our locks leaves plain data behind
    // (connection table, socket writer): still safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An open connection, as [`Server::shutdown`] and the accept loop's
/// limits need it.
pub(crate) struct ConnEntry {
    /// The socket the session reads and replies on (after STARTTLS, the
    /// session's end of the TLS pump's socketpair).
    pub(crate) session: Stream,
    /// After STARTTLS, the client's own socket, which the pump owns.
    pub(crate) raw: Option<Stream>,
    /// The connection's thread, until shutdown takes it to join.
    pub(crate) thread: Option<JoinHandle<()>>,
    /// The TCP peer's address (`None` on a unix socket).
    pub(crate) peer: Option<IpAddr>,
    /// Still in the option phase (greeting, options, TLS handshake):
    /// counted against [`Limits::max_handshakes_per_peer`].
    pub(crate) negotiating: bool,
}

impl ConnEntry {
    /// Closes the connection at once: its reader, its reply writer and any
    /// TLS pump see the sockets shut.
    pub(crate) fn cut(&self) {
        self.session.shutdown(Shutdown::Both);
        if let Some(r) = &self.raw {
            r.shutdown(Shutdown::Both);
        }
    }
}
