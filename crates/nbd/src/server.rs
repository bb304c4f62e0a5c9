//! The NBD server: listener, negotiation, and the pipelined transmission loop.
//!
//! Hand-written server side of the protocol (see [`crate::proto`]). Threads:
//!
//! ```text
//!   accept thread ──► one reader thread per connection
//!                        │ reads a request (and its write payload)
//!                        │ Engine::submit(req, completion)
//!                        ▼
//!                     engine (any mode) ──► completion callback
//!                                            └─ locks the connection's writer,
//!                                               sends the simple reply (+ data)
//! ```
//!
//! Requests are pipelined: the reader never waits for a reply, so replies may
//! go out of order, which NBD allows (the client matches cookies). A client
//! that breaks the protocol (bad magic, truncated request, oversized payload)
//! is disconnected; invalid but well-framed requests get an error reply.
//! Either way only that client is affected and nothing is written.

use std::collections::HashMap;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use datapath::{Engine, Op, Request};

use crate::proto::{self, RequestHeader};
use crate::{nbd_errno, Error};

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// What the export looks like to clients.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Export name; clients may also use the default (empty) name.
    pub name: String,
    /// Human-readable description (`NBD_INFO_DESCRIPTION`, `NBD_OPT_LIST`).
    pub description: String,
    /// Advertise `NBD_FLAG_READ_ONLY` and refuse writes with `EPERM`.
    pub read_only: bool,
    /// Advertise `NBD_FLAG_SEND_TRIM` (the volume allows discards).
    pub allow_trim: bool,
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
}

/// A running NBD server. Dropping it without [`Server::shutdown`] leaves the
/// threads running until the process exits.
pub struct Server {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    engine: Arc<Engine>,
    export: ExportConfig,
    stopping: AtomicBool,
    next_id: AtomicU64,
    accepted: AtomicU64,
    protocol_errors: AtomicU64,
    /// Open connections: a handle to shut each one down, and its thread.
    conns: Mutex<HashMap<u64, ConnEntry>>,
}

impl Server {
    /// Binds `endpoint` and starts accepting clients for `engine`.
    ///
    /// A unix socket path left behind by a dead server is replaced; one that
    /// still accepts connections is an error (`AddrInUse`).
    pub fn start(
        engine: Arc<Engine>,
        export: ExportConfig,
        endpoint: Endpoint,
    ) -> Result<Self, Error> {
        let (listener, endpoint) = match endpoint {
            Endpoint::Unix(path) => {
                remove_stale_socket(&path)?;
                let l = UnixListener::bind(&path)
                    .map_err(|e| Error::bind(&path.display().to_string(), e))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| Error::bind(&path.display().to_string(), e))?;
                (Listener::Unix(l), Endpoint::Unix(path))
            }
            Endpoint::Tcp(addr) => {
                let l = TcpListener::bind(addr).map_err(|e| Error::bind(&addr.to_string(), e))?;
                let local = l.local_addr()?;
                (Listener::Tcp(l), Endpoint::Tcp(local))
            }
        };
        let shared = Arc::new(Shared {
            engine,
            export,
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(Self {
            shared,
            endpoint,
            accept: Some(accept),
        })
    }

    /// The bound endpoint (with the real port for `Tcp(…:0)`).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Connection counters.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            connections: lock(&self.shared.conns).len() as u64,
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            protocol_errors: self.shared.protocol_errors.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, lets every connection finish the requests it has in
    /// flight (new requests are no longer read), closes them, and removes the
    /// unix socket. Does not flush the engine: the caller owns it.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept() with a throwaway connection.
        let _ = match &self.endpoint {
            Endpoint::Unix(p) => UnixStream::connect(p).map(drop),
            Endpoint::Tcp(a) => {
                let mut a = *a;
                if a.ip().is_unspecified() {
                    a.set_ip(if a.is_ipv4() {
                        std::net::Ipv4Addr::LOCALHOST.into()
                    } else {
                        std::net::Ipv6Addr::LOCALHOST.into()
                    });
                }
                TcpStream::connect(a).map(drop)
            }
        };
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        // Stop reading requests; readers then drain their in-flight replies.
        let handles: Vec<JoinHandle<()>> = {
            let mut conns = lock(&self.shared.conns);
            conns
                .values_mut()
                .filter_map(|(s, h)| {
                    s.shutdown(Shutdown::Read);
                    h.take()
                })
                .collect()
        };
        for h in handles {
            let _ = h.join();
        }
        if let Endpoint::Unix(p) = &self.endpoint {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.stop();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of our locks leaves plain data behind
    // (connection table, socket writer): still safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(Error::bind(
                    &path.display().to_string(),
                    io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another server is listening there",
                    ),
                ));
            }
            std::fs::remove_file(path).map_err(|e| Error::bind(&path.display().to_string(), e))
        }
        Ok(_) => Err(Error::bind(
            &path.display().to_string(),
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                "path exists and is not a socket",
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::bind(&path.display().to_string(), e)),
    }
}

/// A connection's socket (for shutdown) and its thread (for joining).
type ConnEntry = (Stream, Option<JoinHandle<()>>);

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// A connected client socket of either family.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// True once a byte can be read without blocking (or the peer closed,
    /// or the socket failed: the blocking read then reports which).
    fn readable_now(&self) -> bool {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        let mut b = [0u8; 1];
        // SAFETY: `fd` is this stream's open socket for the whole call and
        // `b` is a valid 1-byte buffer; MSG_PEEK | MSG_DONTWAIT neither
        // consumes data nor blocks, and affects only this call (unlike
        // O_NONBLOCK, which the reply writer's dup of the socket shares).
        let n = unsafe {
            libc::recv(
                fd,
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n != -1 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    loop {
        let stream = match &listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("ucrypt nbd: accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let Ok(ctl) = stream.try_clone() else {
            continue;
        };
        let s = Arc::clone(&shared);
        // Hold the table lock across spawn so the thread's own removal of
        // its entry cannot run before the entry exists.
        let mut conns = lock(&shared.conns);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                let r = serve_client(stream, &s);
                if let Err(Error::Protocol(why)) = &r {
                    s.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("ucrypt nbd: client {id} disconnected: {why}");
                }
                // Detach our join handle unless shutdown() already took it.
                lock(&s.conns).remove(&id);
            });
        if let Ok(h) = spawned {
            conns.insert(id, (ctl, Some(h)));
        }
    }
}

/// The state negotiation ends in.
struct Negotiated {
    flags: u16,
}

fn serve_client(stream: Stream, shared: &Shared) -> Result<(), Error> {
    // Replies are written from engine completion callbacks: a client that
    // stops reading must not pin an engine thread for long.
    let w = stream.try_clone()?;
    match &w {
        Stream::Unix(s) => s.set_write_timeout(Some(REPLY_TIMEOUT))?,
        Stream::Tcp(s) => s.set_write_timeout(Some(REPLY_TIMEOUT))?,
    }
    let writer = Arc::new(Mutex::new(w));
    let mut reader = BufReader::with_capacity(256 << 10, stream);
    let Some(neg) = negotiate(&mut reader, &mut lock(&writer), shared)? else {
        return Ok(());
    };
    let conn = Arc::new(Conn {
        writer,
        inflight: Mutex::new(Inflight::default()),
        idle: Condvar::new(),
        dead: AtomicBool::new(false),
    });
    let r = transmit(&mut reader, &conn, shared, neg);
    // Soft or hard disconnect: first finish what is in flight (NBD requires
    // replies to every request received before DISC).
    conn.wait_idle();
    lock(&conn.writer).shutdown(Shutdown::Both);
    r
}

fn write_all(w: &mut Stream, buf: &[u8]) -> Result<(), Error> {
    w.write_all(buf).map_err(Error::Io)
}

/// Reads exactly `buf.len()` bytes; a short read is a protocol violation.
fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<(), Error> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => Error::Protocol(format!("Truncated {what}")),
        _ => Error::Io(e),
    })
}

/// Fixed newstyle negotiation. `Ok(None)` when the client aborted.
fn negotiate(
    r: &mut impl Read,
    w: &mut Stream,
    shared: &Shared,
) -> Result<Option<Negotiated>, Error> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&proto::NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    write_all(w, &hello)?;

    let mut cf = [0u8; 4];
    read_exact(r, &mut cf, "client flags")?;
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
        return Err(Error::Protocol(format!(
            "Unknown client flags {client_flags:#x}"
        )));
    }
    let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
    let flags = transmission_flags(shared);

    loop {
        let mut hdr = [0u8; 16];
        read_exact(r, &mut hdr, "option header")?;
        let mut rd = proto::Reader::new(&hdr);
        let (magic, opt, len) = match (rd.u64(), rd.u32(), rd.u32()) {
            (Some(m), Some(o), Some(l)) => (m, o, l),
            _ => return Err(Error::Protocol("Short option header".into())),
        };
        if magic != proto::IHAVEOPT {
            return Err(Error::Protocol(format!("Bad option magic {magic:#x}")));
        }
        if len > proto::MAX_OPTION_LEN {
            return Err(Error::Protocol(format!(
                "Option {opt} length {len} too large"
            )));
        }
        let mut data = vec![0u8; len as usize];
        read_exact(r, &mut data, "option data")?;
        let stopping = shared.stopping.load(Ordering::SeqCst);
        match opt {
            proto::OPT_EXPORT_NAME => {
                if stopping || !name_matches(&data, shared) {
                    // This option cannot carry an error: the spec says close.
                    return Err(Error::Protocol(
                        "Unknown export name in NBD_OPT_EXPORT_NAME".into(),
                    ));
                }
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&shared.engine.size().to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                write_all(w, &b)?;
                return Ok(Some(Negotiated { flags }));
            }
            proto::OPT_ABORT => {
                // The client may already have closed; ignore a failed ACK.
                let _ = write_all(w, &proto::option_reply(opt, proto::REP_ACK, &[]));
                return Ok(None);
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    write_all(
                        w,
                        &proto::option_reply(
                            opt,
                            proto::REP_ERR_INVALID,
                            b"NBD_OPT_LIST takes no data",
                        ),
                    )?;
                    continue;
                }
                let name = shared.export.name.as_bytes();
                let mut d = Vec::with_capacity(4 + name.len() + shared.export.description.len());
                d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                d.extend_from_slice(name);
                d.extend_from_slice(shared.export.description.as_bytes());
                write_all(w, &proto::option_reply(opt, proto::REP_SERVER, &d))?;
                write_all(w, &proto::option_reply(opt, proto::REP_ACK, &[]))?;
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let Some(req) = proto::InfoRequest::decode(&data) else {
                    write_all(
                        w,
                        &proto::option_reply(
                            opt,
                            proto::REP_ERR_INVALID,
                            b"Malformed info request",
                        ),
                    )?;
                    continue;
                };
                if stopping {
                    write_all(
                        w,
                        &proto::option_reply(
                            opt,
                            proto::REP_ERR_SHUTDOWN,
                            b"Server is shutting down",
                        ),
                    )?;
                    continue;
                }
                if !name_matches(&req.name, shared) {
                    write_all(
                        w,
                        &proto::option_reply(opt, proto::REP_ERR_UNKNOWN, b"No such export"),
                    )?;
                    continue;
                }
                for item in info_items(&req, flags, shared) {
                    write_all(w, &proto::option_reply(opt, proto::REP_INFO, &item))?;
                }
                write_all(w, &proto::option_reply(opt, proto::REP_ACK, &[]))?;
                if opt == proto::OPT_GO {
                    return Ok(Some(Negotiated { flags }));
                }
            }
            proto::OPT_STARTTLS => {
                write_all(
                    w,
                    &proto::option_reply(opt, proto::REP_ERR_POLICY, b"TLS is not supported"),
                )?;
            }
            _ => {
                // Structured replies, meta contexts, extended headers, …:
                // not offered; clients fall back to simple replies.
                write_all(w, &proto::option_reply(opt, proto::REP_ERR_UNSUP, &[]))?;
            }
        }
    }
}

fn name_matches(name: &[u8], shared: &Shared) -> bool {
    name.is_empty() || name == shared.export.name.as_bytes()
}

fn transmission_flags(shared: &Shared) -> u16 {
    let mut f = proto::FLAG_HAS_FLAGS
        | proto::FLAG_SEND_FLUSH
        | proto::FLAG_SEND_FUA
        | proto::FLAG_SEND_WRITE_ZEROES
        | proto::FLAG_CAN_MULTI_CONN;
    if shared.export.read_only {
        f |= proto::FLAG_READ_ONLY;
    }
    if shared.export.allow_trim && !shared.export.read_only {
        f |= proto::FLAG_SEND_TRIM;
    }
    f
}

/// The `NBD_REP_INFO` payloads for a GO/INFO: always export and block size,
/// name and description when asked.
fn info_items(req: &proto::InfoRequest, flags: u16, shared: &Shared) -> Vec<Vec<u8>> {
    let mut items = Vec::new();
    let mut export = Vec::with_capacity(12);
    export.extend_from_slice(&proto::INFO_EXPORT.to_be_bytes());
    export.extend_from_slice(&shared.engine.size().to_be_bytes());
    export.extend_from_slice(&flags.to_be_bytes());
    items.push(export);

    let ss = shared.engine.sector_size();
    let mut bs = Vec::with_capacity(14);
    bs.extend_from_slice(&proto::INFO_BLOCK_SIZE.to_be_bytes());
    bs.extend_from_slice(&ss.to_be_bytes()); // minimum: the volume's sector size
    bs.extend_from_slice(&ss.max(4096).to_be_bytes()); // preferred
    bs.extend_from_slice(&proto::MAX_PAYLOAD.to_be_bytes()); // maximum
    items.push(bs);

    if req.requests.contains(&proto::INFO_NAME) {
        let mut n = proto::INFO_NAME.to_be_bytes().to_vec();
        n.extend_from_slice(shared.export.name.as_bytes());
        items.push(n);
    }
    if req.requests.contains(&proto::INFO_DESCRIPTION) {
        let mut d = proto::INFO_DESCRIPTION.to_be_bytes().to_vec();
        d.extend_from_slice(shared.export.description.as_bytes());
        items.push(d);
    }
    items
}

/// How long a reply may wait for a client that does not read.
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Payload bytes one connection may have inside the engine; beyond it the
/// reader stops reading requests until some complete (bounds memory).
const MAX_INFLIGHT_BYTES: u64 = 128 << 20;

#[derive(Default)]
struct Inflight {
    requests: u64,
    bytes: u64,
}

/// Per-connection state shared with completion callbacks.
struct Conn {
    writer: Arc<Mutex<Stream>>,
    inflight: Mutex<Inflight>,
    idle: Condvar,
    /// Set once a reply could not be sent; further replies are dropped.
    dead: AtomicBool,
}

impl Conn {
    /// Accounts a request of `bytes` payload (read or write), first waiting
    /// while the connection already has too much in flight.
    fn begin(&self, bytes: u64) {
        let mut n = lock(&self.inflight);
        while n.requests > 0 && n.bytes + bytes > MAX_INFLIGHT_BYTES {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        n.requests += 1;
        n.bytes += bytes;
    }

    fn end(&self, bytes: u64) {
        let mut n = lock(&self.inflight);
        n.requests -= 1;
        n.bytes -= bytes;
        self.idle.notify_all();
    }

    fn wait_idle(&self) {
        let mut n = lock(&self.inflight);
        while n.requests > 0 {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Sends one simple reply, with `data` for successful reads.
    fn reply(&self, error: u32, cookie: u64, data: &[u8]) {
        if self.dead.load(Ordering::Relaxed) {
            return;
        }
        let hdr = proto::simple_reply(error, cookie);
        let mut w = lock(&self.writer);
        if write_all_vectored(&mut w, &hdr, data).is_err() {
            self.dead.store(true, Ordering::Relaxed);
            w.shutdown(Shutdown::Both);
        }
    }
}

fn write_all_vectored(w: &mut Stream, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut bufs = [IoSlice::new(a), IoSlice::new(b)];
    let mut bufs: &mut [IoSlice<'_>] = &mut bufs;
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Longest a connection thread polls for the next request before it
/// sleeps in `recv`. At queue depth 1 the next request follows the reply
/// after one client round trip (~20 µs here); a thread that slept meanwhile
/// costs a cross-CPU wake-up on arrival (on a VM an idle exit, ~10-20 µs,
/// a third of nbdkit's whole 4k QD1 round trip). A short poll keeps the
/// CPU awake instead, like the kernel's `SO_BUSY_POLL` for sockets.
const POLL_WINDOW: std::time::Duration = std::time::Duration::from_micros(50);
/// After this many polls in a row that ran out the window (a slow or idle
/// client), polling pauses for [`POLL_PAUSE`].
const POLL_MISSES: u32 = 8;
const POLL_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
/// Connection threads polling at once, process-wide: at most one per two
/// CPUs, so polling never takes the cores the engine and clients need.
static POLLERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Busy-polls `s` for the next request (see [`POLL_WINDOW`]).
struct Poller {
    misses: u32,
    paused_until: Option<std::time::Instant>,
    max_pollers: usize,
}

impl Poller {
    fn new() -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self {
            misses: 0,
            paused_until: None,
            max_pollers: cpus / 2,
        }
    }

    /// Returns when a request is readable, the window ran out, or polling
    /// is paused or taken; the caller then reads (blocking if need be).
    fn wait(&mut self, s: &Stream) {
        let now = std::time::Instant::now();
        if self.paused_until.is_some_and(|t| now < t) {
            return;
        }
        if POLLERS.fetch_add(1, Ordering::Relaxed) >= self.max_pollers {
            POLLERS.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let deadline = now + POLL_WINDOW;
        let mut hit = false;
        loop {
            if s.readable_now() {
                hit = true;
                break;
            }
            if std::time::Instant::now() >= deadline {
                break;
            }
            std::hint::spin_loop();
        }
        POLLERS.fetch_sub(1, Ordering::Relaxed);
        if hit {
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= POLL_MISSES {
                self.misses = 0;
                self.paused_until = Some(std::time::Instant::now() + POLL_PAUSE);
            }
        }
    }
}

/// The transmission phase: read, check framing, submit, repeat.
fn transmit(
    r: &mut BufReader<Stream>,
    conn: &Arc<Conn>,
    shared: &Shared,
    neg: Negotiated,
) -> Result<(), Error> {
    let read_only = neg.flags & proto::FLAG_READ_ONLY != 0;
    let trim = neg.flags & proto::FLAG_SEND_TRIM != 0;
    let known_flags = proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE;
    let mut poller = Poller::new();
    loop {
        if r.buffer().is_empty() {
            poller.wait(r.get_ref());
        }
        let mut raw = [0u8; proto::REQUEST_LEN];
        // EOF exactly at a request boundary is a hard disconnect by the
        // client (allowed); EOF inside a header is a truncated request.
        let mut got = 0;
        while got < raw.len() {
            match r.read(&mut raw[got..]) {
                Ok(0) if got == 0 => return Ok(()),
                Ok(0) => return Err(Error::Protocol("Truncated request header".into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Io(e)),
            }
        }
        let Some(h) = RequestHeader::decode(&raw) else {
            return Err(Error::Protocol("Bad request magic".into()));
        };
        let fua = h.flags & proto::CMD_FLAG_FUA != 0;

        // Commands with a payload must have it consumed before any reply, or
        // framing is lost: read it first, decide afterwards.
        let payload = if h.kind == proto::CMD_WRITE {
            if h.len > proto::MAX_PAYLOAD {
                return Err(Error::Protocol(format!(
                    "Write payload of {} bytes exceeds the maximum",
                    h.len
                )));
            }
            let mut data = vec![0u8; h.len as usize];
            read_exact(r, &mut data, "write payload")?;
            Some(data)
        } else {
            None
        };

        let err = |e: u32| conn.reply(e, h.cookie, &[]);
        if h.flags & !known_flags != 0 {
            err(proto::EINVAL);
            continue;
        }
        let op = match h.kind {
            proto::CMD_READ => {
                if h.len > proto::MAX_PAYLOAD {
                    err(proto::EOVERFLOW);
                    continue;
                }
                Op::Read { len: h.len }
            }
            proto::CMD_WRITE | proto::CMD_WRITE_ZEROES | proto::CMD_TRIM if read_only => {
                err(proto::EPERM);
                continue;
            }
            proto::CMD_WRITE => Op::Write {
                data: payload.unwrap_or_default(),
            },
            proto::CMD_WRITE_ZEROES => Op::WriteZeroes { len: h.len },
            proto::CMD_TRIM if trim => Op::Discard { len: h.len },
            proto::CMD_FLUSH => Op::Flush,
            proto::CMD_DISC => return Ok(()),
            // TRIM when not advertised, CACHE, BLOCK_STATUS, unknown types.
            _ => {
                err(proto::EINVAL);
                continue;
            }
        };
        if shared.stopping.load(Ordering::Relaxed) {
            err(proto::ESHUTDOWN);
            continue;
        }
        let bytes = match &op {
            Op::Read { len } => u64::from(*len),
            Op::Write { data } => data.len() as u64,
            _ => 0,
        };
        conn.begin(bytes);
        let c = Arc::clone(conn);
        let (cookie, kind) = (h.cookie, h.kind);
        let offset = if kind == proto::CMD_FLUSH {
            0
        } else {
            h.offset
        };
        shared
            .engine
            .submit(Request { op, offset, fua }, move |res| {
                match res {
                    Ok(Some(data)) if kind == proto::CMD_READ => c.reply(0, cookie, &data),
                    // A read without data would desynchronise the stream.
                    Ok(_) if kind == proto::CMD_READ => c.reply(proto::EIO, cookie, &[]),
                    Ok(_) => c.reply(0, cookie, &[]),
                    Err(e) => c.reply(nbd_errno(&e, kind), cookie, &[]),
                }
                c.end(bytes);
            });
    }
}
