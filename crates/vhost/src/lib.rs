//! vhost-user-blk frontend: serves a [`datapath::Engine`] to virtual
//! machines (qemu, cloud-hypervisor, crosvm) over a vhost-user socket.
//!
//! ```text
//!   hypervisor ── unix socket (vhost-user protocol: rust-vmm `vhost`)
//!       │ SET_MEM_TABLE (guest memory fds, mmapped here), vrings, kick/call eventfds
//!       ▼
//!   accept thread: one VhostUserDaemon per connection (vhost-user-backend)
//!       │ queue thread i (one per virtqueue): kick ─► pop chains
//!       │   request::parse ─► engine.submit(Request, callback) ─► datapath::Engine
//!       │   ◄── callback on any engine thread: data + status into guest memory,
//!       │       used ring, call eventfd (if the guest wants an interrupt; small
//!       │       requests completed on the queue thread: once per batch)
//!       ▼
//!   hypervisor gone: the daemon ends, the accept thread waits for the next
//!   connection with a fresh device (guest reboot, qemu `reconnect=`).
//! ```
//!
//! None of the protocol is hand-written: the vhost-user messages are the
//! `vhost` crate's, the vrings and their threads `vhost-user-backend`'s,
//! descriptor chains `virtio-queue`'s and guest memory `vm-memory`'s.
//! This crate adds the virtio-blk device: feature bits and config space
//! (`config`), request parsing and answering (`request`), the backend
//! (`backend`) and per-queue counters (`stats`).
//!
//! The device offers FLUSH, BLK_SIZE and TOPOLOGY (the volume's sector
//! size), SIZE_MAX/SEG_MAX (a request never exceeds the engine's limit),
//! MQ (up to [`MAX_QUEUES`], by default all of them, so a hypervisor's
//! default of one queue per vCPU fits; queue `q` runs on thread
//! `q % T`, T = min(queues, host CPUs), submitting to the engine, whose
//! mode decides where the crypto runs; vhost-user-backend starts the
//! threads with the connection, before the guest enables any queue, so
//! a guest using fewer queues than T leaves threads idle in epoll), CONFIG_WCE (write-through turns every
//! write into FUA), DISCARD when discards are allowed, WRITE_ZEROES unless
//! read-only, RO for a read-only export (what its [`datapath::Export`]
//! allows), EVENT_IDX and INDIRECT_DESC; the
//! vhost-user protocol features CONFIG, REPLY_ACK, MQ and
//! CONFIGURE_MEM_SLOTS (libblkio requires it). GET_ID answers
//! the serial given in [`Options::serial`] (the daemon passes the LUKS
//! UUID; virtio-blk IDs are 20 bytes, so it is cut there).
//!
//! A guest cannot make the daemon hold more than
//! [`request::MAX_INFLIGHT_BYTES`] of request payloads (plus the buffer
//! pool's): a chain's buffer is allocated only once it fits under that
//! cap, and past it the queue threads wait for completions ([`Stats`]
//! shows the bytes in flight and their peak).
//!
//! The socket file is the caller's: [`Server::start_on`] serves on a
//! listener bound elsewhere (the daemon binds it with its path rules) and
//! never touches the path; [`Server::start`] binds a path that must not
//! exist and removes only that socket, checked by inode, at shutdown.
//! rust-vmm's `Listener` is built from the bound listener, so it has no
//! path to unlink.
//!
//! Failed requests are answered through the engine's one typed error
//! ([`datapath::Error::errno`]): "not supported" becomes
//! `VIRTIO_BLK_S_UNSUPP`, anything else `VIRTIO_BLK_S_IOERR`.
#![deny(unsafe_code)]

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use datapath::Export;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

mod backend;
pub mod config;
pub mod request;
mod stats;

pub use config::DeviceConfig;
pub use stats::{QueueStats, Stats};

use backend::{Conn, Device};
use stats::Shared;

/// Most queues a device may have (vhost-user-backend maps queues to
/// threads with a 64-bit mask). It is also the default: qemu's
/// `vhost-user-blk-pci` asks for one queue per vCPU unless given
/// `num-queues`, and refuses a backend whose `GET_QUEUE_NUM` answers
/// fewer, so offering the most lets any guest of up to 64 vCPUs attach
/// as qemu defaults it.
pub const MAX_QUEUES: u16 = 64;

/// How to serve the device.
#[derive(Debug, Clone)]
pub struct Options {
    /// The vhost-user socket: bound by [`Server::start`] (it must not
    /// exist; 0600), or where [`Server::start_on`]'s listener is.
    pub socket: PathBuf,
    /// Request queues offered (`GET_QUEUE_NUM` and the config space's
    /// `num_queues`): the most the guest may use; it may use fewer.
    /// Served by one thread per queue up to the host's CPU count.
    pub num_queues: u16,
    /// Largest virtqueue the hypervisor may set up.
    pub queue_size: u16,
    /// GET_ID answer (cut to 20 bytes).
    pub serial: String,
}

impl Options {
    /// [`MAX_QUEUES`] queues of up to 1024 entries on `socket`, no serial.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            num_queues: MAX_QUEUES,
            queue_size: 1024,
            serial: String::new(),
        }
    }
}

/// Errors of the vhost-user-blk frontend, in the workspace's shape
/// (docs/ARCHITECTURE.md, "Errors"): a stable [`ErrorKind`], the message
/// `Display` shows and the OS error that caused it as the source. A failed
/// request is not one of these: it is answered through
/// [`datapath::Error::errno`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<std::io::Error>,
}

/// What went wrong; stable for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The options cannot describe a valid device.
    InvalidOptions,
    /// The socket could not be created.
    Listen,
    /// The serving thread could not start.
    Thread,
}

impl Error {
    /// [`ErrorKind::InvalidOptions`]: `what` is wrong with them.
    fn invalid_options(what: String) -> Self {
        Self {
            kind: ErrorKind::InvalidOptions,
            message: format!("Invalid vhost-user-blk options: {what}"),
            source: None,
        }
    }

    /// [`ErrorKind::Listen`] on the socket `path`.
    fn listen(path: &Path, source: std::io::Error) -> Self {
        Self {
            kind: ErrorKind::Listen,
            message: format!("Cannot listen on vhost-user socket {}", path.display()),
            source: Some(source),
        }
    }

    /// [`ErrorKind::Thread`].
    fn thread(source: std::io::Error) -> Self {
        Self {
            kind: ErrorKind::Thread,
            message: "Cannot start the vhost-user-blk thread".into(),
            source: Some(source),
        }
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

/// A running vhost-user-blk export; [`Server::shutdown`] stops it.
pub struct Server {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<ShutdownHandle>>>,
    shared: Arc<Shared>,
    /// A second descriptor of the listening socket, owned here, to wake a
    /// blocked accept on shutdown whatever the accept thread did with its
    /// own.
    wake: UnixListener,
    /// The socket file [`Server::start`] bound (device, inode), removed at
    /// shutdown if the path still names it; `None` for [`Server::start_on`].
    socket_file: Option<(u64, u64)>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds `opts.socket` (which must not exist: nothing is removed to
    /// make room) with mode 0600 and serves `view` (an [`Export`], or an
    /// engine exported as configured) on it
    /// ([`Server::start_on`]); the socket is removed at shutdown if the
    /// path still names it.
    pub fn start(view: impl Into<Export>, opts: &Options) -> Result<Self, Error> {
        let listen_err = |source| Error::listen(&opts.socket, source);
        let listener = UnixListener::bind(&opts.socket).map_err(listen_err)?;
        std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(0o600))
            .map_err(listen_err)?;
        let mut s = Self::start_on(view, listener, opts)?;
        s.socket_file = std::fs::symlink_metadata(&opts.socket)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        Ok(s)
    }

    /// Serves `view` on `listener` (bound by the caller, who owns its
    /// file; `opts.socket` only names it) to one hypervisor at a time,
    /// accepting the next when one disconnects, until [`Server::shutdown`].
    pub fn start_on(
        view: impl Into<Export>,
        listener: UnixListener,
        opts: &Options,
    ) -> Result<Self, Error> {
        let view = view.into();
        let config = DeviceConfig {
            size: view.size(),
            sector_size: view.sector_size(),
            num_queues: opts.num_queues,
            discard: view.allows_discards(),
            read_only: view.read_only(),
        };
        validate(&config, opts)?;
        let mut serial = [0u8; 20];
        let s = opts.serial.as_bytes();
        let n = s.len().min(serial.len());
        serial[..n].copy_from_slice(&s[..n]);
        let shared = Arc::new(Shared::new(opts.num_queues));
        let dev = Arc::new(Device {
            engine: Arc::clone(view.engine()),
            config,
            serial,
            queue_size: opts.queue_size,
            shared: Arc::clone(&shared),
            threads: backend::threads_for(opts.num_queues),
        });
        let listen_err = |source| Error::listen(&opts.socket, source);
        let wake = listener.try_clone().map_err(listen_err)?;
        // From a bound listener: no path, so rust-vmm never unlinks one.
        let listener = Listener::from(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let conn = Arc::new(Mutex::new(None));
        let (s2, c2) = (Arc::clone(&stop), Arc::clone(&conn));
        let thread = std::thread::Builder::new()
            .name("vhost-accept".into())
            .spawn(move || accept_loop(listener, dev, &s2, &c2))
            .map_err(Error::thread)?;
        Ok(Self {
            socket: opts.socket.clone(),
            stop,
            conn,
            shared,
            wake,
            socket_file: None,
            thread: Some(thread),
        })
    }

    /// The socket hypervisors connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The counters (per queue, across connections).
    pub fn stats(&self) -> Stats {
        self.shared.snapshot()
    }

    /// Disconnects the hypervisor (if any), stops listening and removes
    /// the socket [`Server::start`] bound (if it is still there; a
    /// [`Server::start_on`] socket stays with its owner). Requests still inside the engine complete into the
    /// void; the caller flushes and shuts the engine down afterwards.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        {
            let h = self.conn.lock().unwrap_or_else(|e| e.into_inner());
            self.stop.store(true, Ordering::SeqCst);
            if let Some(h) = h.as_ref() {
                h.shutdown();
            }
        }
        // Wake an accept in progress (even if the socket file is gone);
        // the accept thread sees `stop` and ends.
        shutdown_listener(&self.wake);
        let _ = thread.join();
        if let Some(id) = self.socket_file {
            let now = std::fs::symlink_metadata(&self.socket).map(|m| (m.dev(), m.ino()));
            if now.ok() == Some(id) {
                let _ = std::fs::remove_file(&self.socket);
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// `shutdown(2)` on the listening socket (through `wake`, a descriptor
/// of it the [`Server`] owns): a blocked `accept` returns.
#[allow(unsafe_code)]
fn shutdown_listener(wake: &UnixListener) {
    // SAFETY: the descriptor is `wake`'s, borrowed for the call: it stays
    // open (owned by the Server) whether or not the accept thread has
    // closed its own; shutdown takes no pointers.
    unsafe {
        libc::shutdown(wake.as_raw_fd(), libc::SHUT_RDWR);
    }
}

fn validate(c: &DeviceConfig, opts: &Options) -> Result<(), Error> {
    let bad = |m: String| Err(Error::invalid_options(m));
    if !c.sector_size.is_power_of_two() || !(512..=4096).contains(&c.sector_size) {
        return bad(format!(
            "sector size {} is not 512..4096 and a power of two",
            c.sector_size
        ));
    }
    if opts.num_queues == 0 || opts.num_queues > MAX_QUEUES {
        return bad(format!("{} queues: use 1 to {MAX_QUEUES}", opts.num_queues));
    }
    if !opts.queue_size.is_power_of_two() || opts.queue_size < 2 || opts.queue_size > 32768 {
        return bad(format!(
            "queue size {} is not a power of two in 2..32768",
            opts.queue_size
        ));
    }
    Ok(())
}

/// Serves one connection after another until `stop`.
fn accept_loop(
    mut listener: Listener,
    dev: Arc<Device>,
    stop: &AtomicBool,
    conn: &Mutex<Option<ShutdownHandle>>,
) {
    while !stop.load(Ordering::SeqCst) {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let backend = Arc::new(Conn::new(Arc::clone(&dev), mem.clone()));
        let mut daemon = match VhostUserDaemon::new("vhost-user-blk".into(), backend, mem) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("ucrypt: vhost-user-blk: cannot set up the device: {e}");
                return;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            if !stop.load(Ordering::SeqCst) {
                eprintln!("ucrypt: vhost-user-blk: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            stop_workers(&daemon);
            continue;
        }
        {
            let mut h = conn.lock().unwrap_or_else(|e| e.into_inner());
            if stop.load(Ordering::SeqCst) {
                daemon.request_shutdown();
            } else {
                dev.shared.connections.fetch_add(1, Ordering::Relaxed);
                *h = daemon.shutdown_handle();
            }
        }
        let r = daemon.wait();
        *conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        stop_workers(&daemon);
        if let Err(e) = r {
            use vhost::vhost_user::Error as V;
            let hung_up = matches!(
                e,
                vhost_user_backend::Error::HandleRequest(V::Disconnected | V::PartialMessage)
            );
            if !hung_up && !stop.load(Ordering::SeqCst) {
                eprintln!("ucrypt: vhost-user-blk: connection ended: {e}");
            }
        }
    }
}

/// Ends the connection's queue threads.
fn stop_workers(daemon: &VhostUserDaemon<Arc<Conn>>) {
    for h in daemon.get_epoll_handlers() {
        h.send_exit_event();
    }
}
