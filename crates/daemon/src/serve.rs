//! The daemon's lifecycle: build the engine over the backing device, start
//! one frontend (NBD, FUSE, ublk or vhost-user-blk), answer the control socket, and shut
//! down cleanly on `close` or SIGTERM/SIGINT.
//!
//! ```text
//!   control thread ──┐  (ping/status/table/refresh answered directly;
//!   signal thread ───┼─► events ─► run(): close = stop frontend,
//!                    │                     drain + flush engine,
//!                    │                     remove socket/pid, return
//!   frontend threads (nbd accept/conn, fuse session, ublk queues) ─► Engine
//! ```
//!
//! Under a service manager (`$NOTIFY_SOCKET`) the daemon reports
//! readiness, status and stopping ([`notify`]).
//!
//! Messages for the daemon's own log (the detached daemon's stderr is
//! `NAME.log`) go to stderr prefixed `ucrypt: `.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend::FileOptions;
use crypto::table::Targets;
use datapath::{Engine, EngineConfig};

use crate::control::{self, Flags, Handled, Ping, Reply, Request, Status};
use crate::error::{flat, Error, ErrorKind, Result};
use crate::resolve::VolumeType;
use crate::runtime::{self, NameLock, Paths, SocketFile};
use crate::tls::TlsSpec;

mod dshift;
mod frontend;
mod live;
pub mod notify;
mod reencrypt;

pub use crate::export::{ExportSpec, FuseUring};
use frontend::{start_frontend, Frontend};
pub use reencrypt::DEFAULT_HOTZONE;

/// Everything the daemon needs, resolved by the caller.
pub struct Spec {
    /// Volume name (checked with [`runtime::check_name`]).
    pub name: String,
    /// The volume type, for `status`.
    pub volume_type: VolumeType,
    /// The mapping (one or more targets), with the keys.
    pub table: Targets,
    /// The frontend.
    pub export: ExportSpec,
    /// NBD over TLS (off unless asked for).
    pub tls: TlsSpec,
    /// Initial engine configuration.
    pub engine: EngineConfig,
    /// How the backing file is accessed.
    pub io_engine: backend::IoEngine,
    /// O_DIRECT policy for the backing file.
    pub direct: backend::DirectIo,
    /// The detached LUKS header, if any (online reencryption writes its
    /// progress there).
    pub header: Option<std::path::PathBuf>,
    /// The volume's name, already claimed ([`runtime::claim`]); `None`:
    /// [`run`] claims it (refused while anyone holds it).
    pub lock: Option<Arc<NameLock>>,
    /// How the device and a LUKS header are reached (metadata locking,
    /// the Ceph cluster of an `rbd:` device).
    pub access: luks::DeviceAccess,
}

/// Serves `spec` until `close` or SIGTERM/SIGINT. `ready` gets the ping
/// answer (where clients connect) once the frontend and the control socket
/// are up and the pid file is written. The volume's name is held
/// throughout, and let go (its lock file removed) only after every other
/// runtime file is gone.
pub fn run(spec: Spec, ready: impl FnOnce(&Ping)) -> Result<()> {
    runtime::check_name(&spec.name)?;
    let lock = match &spec.lock {
        Some(l) => Arc::clone(l),
        None => Arc::new(runtime::claim(&spec.name, false)?.lock),
    };
    let result = serve(spec, ready);
    // Released only by its last holder (a caller may keep a clone).
    if let Ok(lock) = Arc::try_unwrap(lock) {
        lock.release();
    }
    result
}

fn serve(spec: Spec, ready: impl FnOnce(&Ping)) -> Result<()> {
    non_dumpable("the daemon")?;
    let paths = Paths::new(&runtime::ensure_dir()?, &spec.name);
    let Spec {
        name,
        volume_type,
        table,
        export,
        tls,
        engine: cfg,
        io_engine,
        direct,
        header,
        lock,
        access,
    } = spec;
    drop(lock);

    let (engine, backend) = build_engine(&table, &cfg, io_engine, direct, &access.ceph)?;
    let engine = Arc::new(engine);
    // Dropped last: the export's socket file goes once the frontend stopped.
    let (frontend, export_kind, endpoint, _export_socket) =
        start_frontend(&engine, &name, &cfg, export, &tls, &paths, &table, &access)?;

    let (tx, rx) = mpsc::channel();
    let daemon = Arc::new(Daemon {
        ping: Ping {
            name: name.clone(),
            pid: std::process::id(),
            export: export_kind,
            endpoint,
        },
        volume_type,
        table: Mutex::new(table),
        engine: Arc::clone(&engine),
        backend,
        frontend: Mutex::new(Some(frontend)),
        started: Instant::now(),
        events: tx.clone(),
        header: Mutex::new(header),
        access,
        reencryption: Mutex::new(None),
    });

    // Control socket: 0600 from the start, in the 0700 runtime dir.
    let (ctl, ctl_file) = SocketFile::bind(&paths.ctl)?;
    // The control thread holds the daemon weakly: it never ends (it blocks
    // in accept), so a strong reference would keep the engine and its
    // backend alive past `close` until the process exits, and a backend's
    // release (an rbd image's watch and exclusive lock) would then wait
    // for the cluster's timeout instead of happening at close.
    let d = Arc::downgrade(&daemon);
    spawn("ctl", move || {
        control::serve(ctl, |req| match d.upgrade() {
            Some(d) => d.handle(req),
            None => Reply::from(Error::new(ErrorKind::Io, "Daemon is already stopping")).into(),
        })
    })?;

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| Error::new(ErrorKind::Io, "Cannot install signal handlers").with_source(e))?;
    let sig_tx = tx.clone();
    spawn("signals", move || {
        for s in signals.forever() {
            if sig_tx.send(Event::Signal(s)).is_err() {
                return;
            }
        }
    })?;

    runtime::create_file(&paths.pid, 0o644)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(format!("{}\n", std::process::id()).as_bytes())
        })
        .map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::AlreadyExists {
                ErrorKind::Busy
            } else {
                ErrorKind::PermissionDenied
            };
            Error::new(kind, format!("Cannot write {}", paths.pid.display())).with_source(e)
        })?;
    ready(&daemon.ping);
    notify::notify(&format!(
        "READY=1\nSTATUS={}\nMAINPID={}",
        daemon.ping,
        std::process::id()
    ));

    let result = daemon.wait(&rx);
    // The last strong reference (see the control thread above): the
    // engine and the backend drop here, so files, locks and an rbd image
    // are released before the process exits.
    drop(daemon);
    drop(ctl_file);
    let _ = std::fs::remove_file(&paths.pid);
    // Our default mountpoint goes; a mountpoint the user named stays.
    let _ = std::fs::remove_dir(&paths.fuse);
    result
}

/// Makes the process non-dumpable before it holds a volume key (the
/// daemon, `map`): no core dumps, and no ptrace or /proc/PID/mem reads by
/// other processes of the same uid. For the rest of the process's life,
/// which ends soon after the key goes. `who` names it in the error.
pub fn non_dumpable(who: &str) -> Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| {
        Error::new(ErrorKind::Io, format!("Cannot make {who} non-dumpable"))
            .with_source(std::io::Error::from(e))
    })
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| {
            Error::new(ErrorKind::Io, format!("Cannot start {name} thread")).with_source(e)
        })
}

/// The engine over the table's device, and that device (for `resize`).
fn build_engine(
    table: &Targets,
    cfg: &EngineConfig,
    io_engine: backend::IoEngine,
    direct: backend::DirectIo,
    ceph: &backend::rbd::RbdConfig,
) -> Result<(Engine, Arc<dyn backend::Backend>)> {
    let opts = FileOptions {
        read_only: cfg.read_only,
        allow_discard: cfg.allow_discards,
        min_size: table.device_end_bytes(),
        // Each engine thread runs one request at a time to completion, so a
        // blocking pread/pwrite is the cheapest path; io_uring adds a ring
        // round trip (and an io-wq hop where the filesystem cannot do
        // nowait IO, e.g. buffered tmpfs: ~14 us vs ~1.6 us per 4 KiB read).
        engine: Some(io_engine),
        direct,
        // A block device is claimed as dm-crypt's table load claims it,
        // read-only or not: refused while mounted, mapped or served by
        // another daemon, and keeping header rewrites out meanwhile.
        exclusive: true,
        ..FileOptions::default()
    };
    let backend: Arc<dyn backend::Backend> = Arc::from(
        backend::open_device(std::path::Path::new(table.device()), &opts, ceph)
            .map_err(crate::error::backend_error)?,
    );
    let engine =
        crate::targets::engine(table, backend.clone(), cfg.clone()).map_err(|e| match e {
            crate::targets::EngineError::Table(e) => e,
            crate::targets::EngineError::Engine(e) => Error::transparent(ErrorKind::NoDevice, e),
        })?;
    Ok((engine, backend))
}

enum Event {
    Signal(i32),
    /// Close: the result goes back on the first channel; the main thread
    /// then waits on the second until the reply has been written.
    Close(mpsc::Sender<Result<()>>, mpsc::Receiver<()>),
}

/// How long stopping the NBD frontend may take before `close` or a
/// signal goes on without it (see `Daemon::stop_nbd`).
const NBD_STOP_TIMEOUT: Duration = Duration::from_secs(5);

struct Daemon {
    ping: Ping,
    volume_type: VolumeType,
    table: Mutex<Targets>,
    engine: Arc<Engine>,
    /// The backing device, whose size `resize` re-reads.
    backend: Arc<dyn backend::Backend>,
    frontend: Mutex<Option<Frontend>>,
    started: Instant,
    events: mpsc::Sender<Event>,
    /// The detached LUKS header, if any (a decryption with a data shift
    /// started here exports the header inside the device to one).
    header: Mutex<Option<std::path::PathBuf>>,
    /// How the device and the header are reached (online reencryption).
    access: luks::DeviceAccess,
    /// The online reencryption started here, if any.
    reencryption: Mutex<Option<reencrypt::Running>>,
}

impl Daemon {
    /// The main thread's loop: waits for close or a signal and shuts down.
    fn wait(&self, rx: &mpsc::Receiver<Event>) -> Result<()> {
        loop {
            match rx.recv() {
                Ok(Event::Close(reply, written)) => {
                    notify::notify(&format!("STOPPING=1\nSTATUS=Closing {}", self.ping.name));
                    let stopped = self.stop_frontend(self.fail_suspended());
                    match stopped {
                        Ok(()) => {
                            let r = self
                                .engine
                                .shutdown()
                                .map_err(|e| Error::transparent(ErrorKind::Io, e));
                            // Answer only after the flush: `close` returning
                            // means the data is durable.
                            let failed = r.is_err();
                            let _ = reply.send(r);
                            let _ = written.recv_timeout(Duration::from_secs(5));
                            return if failed {
                                Err(Error::new(ErrorKind::Io, "Flush failed during close"))
                            } else {
                                Ok(())
                            };
                        }
                        Err(f) => {
                            // The close was refused (a client holds the
                            // export): serving goes on.
                            notify::notify(&format!("READY=1\nSTATUS={}", self.ping));
                            let _ = reply.send(Err(f));
                        }
                    }
                }
                Ok(Event::Signal(s)) => {
                    notify::notify(&format!(
                        "STOPPING=1\nSTATUS=Signal {s}: draining and flushing {}",
                        self.ping.name
                    ));
                    eprintln!(
                        "ucrypt: {}: signal {s}, draining and flushing",
                        self.ping.name
                    );
                    self.stop_reencryption();
                    self.fail_suspended();
                    let _ = self.stop_frontend(true);
                    return self
                        .engine
                        .shutdown()
                        .map_err(|e| Error::transparent(ErrorKind::Io, e));
                }
                Err(_) => return Ok(()),
            }
        }
    }

    /// Stops the NBD server, waiting at most [`NBD_STOP_TIMEOUT`]. The
    /// server's own shutdown is prompt whatever happened to its socket
    /// file and bounds how long it waits for clients that do not read
    /// (`nbd::Server::shutdown`); this bound is only a safety net, so that
    /// `close` and SIGTERM always finish. Past it the stop goes on in the
    /// background while we flush and exit.
    fn stop_nbd(&self, s: nbd::Server) {
        let (tx, rx) = mpsc::channel();
        let stopper = std::thread::Builder::new()
            .name("nbd-stop".into())
            .spawn(move || {
                s.shutdown();
                let _ = tx.send(());
            });
        if stopper.is_ok() && rx.recv_timeout(NBD_STOP_TIMEOUT).is_err() {
            eprintln!(
                "ucrypt: {}: the NBD server did not stop within {} s (was its socket file removed or replaced?); closing anyway",
                self.ping.name,
                NBD_STOP_TIMEOUT.as_secs()
            );
        }
    }

    /// Stops the frontend. `force` (signals): a busy FUSE mount is detached
    /// lazily; otherwise busy is an error and the daemon keeps serving.
    fn stop_frontend(&self, force: bool) -> Result<()> {
        let mut slot = self.frontend.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_mut() {
            Some(Frontend::Nbd(_)) => {
                if let Some(Frontend::Nbd(s)) = slot.take() {
                    self.stop_nbd(s);
                }
            }
            Some(Frontend::Ublk { id, .. }) => {
                // Without force, a mounted (exclusively opened) device is
                // refused as busy instead of being deleted under the
                // filesystem, like `cryptsetup close` on a device in use.
                let stopped = if force {
                    ublk::stop(*id)
                } else {
                    ublk::stop_if_idle(*id)
                };
                if let Err(e) = stopped {
                    if !force {
                        return Err(flat(ErrorKind::Busy, &e));
                    }
                }
                if let Some(Frontend::Ublk { thread, .. }) = slot.take() {
                    let _ = thread.join();
                }
            }
            Some(Frontend::Vhost(_)) => {
                // A guest still attached loses its disk, as when qemu's
                // vhost-user-blk backend goes away.
                if let Some(Frontend::Vhost(s)) = slot.take() {
                    s.shutdown();
                }
            }
            Some(Frontend::Fuse(f)) => match f.unmount() {
                Ok(()) => {}
                Err(e) if e.kind() == fuse::ErrorKind::Busy && !force => {
                    // Still mounted and serving: refuse, like `cryptsetup
                    // close` on a device that is in use.
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!(
                            "Device {} is still in use: {} is busy (detach the loop device or unmount first)",
                            self.ping.name,
                            f.mountpoint().display()
                        ),
                    ));
                }
                Err(e) if !force => return Err(Error::transparent(ErrorKind::Busy, e)),
                // Forced: dropping the export detaches the mount lazily.
                Err(e) => eprintln!("ucrypt: {}", crate::error::chain(&e)),
            },
            None => {}
        }
        *slot = None;
        Ok(())
    }

    fn status(&self) -> Status {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let cfg = self.engine.config();
        let frontend = self.frontend.lock().unwrap_or_else(|e| e.into_inner());
        let nbd = match &*frontend {
            Some(Frontend::Nbd(s)) => {
                let n = s.stats();
                Some(control::NbdStats {
                    connections: n.connections,
                    accepted: n.accepted,
                    protocol_errors: n.protocol_errors,
                })
            }
            _ => None,
        };
        let vhost = match &*frontend {
            Some(Frontend::Vhost(s)) => Some((&s.stats()).into()),
            _ => None,
        };
        let fuse = match &*frontend {
            Some(Frontend::Fuse(e)) => Some(control::FuseStatus {
                transport: e.transport().as_str().to_owned(),
                ring_requests: e.ring_requests(),
            }),
            _ => None,
        };
        drop(frontend);
        // One target: the fields describe it; several: the first crypt
        // target, the whole mapping's size, and every target listed.
        let first = t.tables().next();
        Status {
            ping: self.ping.clone(),
            volume_type: self.volume_type,
            cipher: first.map_or("", |c| c.cipher.as_str()).to_owned(),
            keysize_bits: first.map_or(0, |c| c.key().len() * 8),
            device: t.device().to_owned(),
            sector_size: t.sector_size(),
            offset_sectors: t.targets()[0].offset(),
            iv_offset: first.map_or(0, |c| c.iv_offset),
            size_sectors: t.len(),
            read_only: cfg.read_only,
            suspended: self.engine.is_suspended(),
            allow_discards: cfg.allow_discards,
            flags: Flags {
                max_read_size: cfg.max_read_size,
                max_write_size: cfg.max_write_size,
                ..cfg.flags.into()
            },
            mode: cfg.mode,
            uptime_s: self.started.elapsed().as_secs(),
            stats: self.engine.stats(),
            nbd,
            vhost,
            fuse,
            io: Some(self.backend.io_path().into()),
            targets: control::TargetStatus::list(&t),
            reencryption: self.reencryption_status(&t),
        }
    }

    fn refresh(&self, mode: Option<datapath::CryptMode>, flags: Flags) -> Result<Reply> {
        let mut cfg = self.engine.config();
        if let Some(m) = mode {
            cfg.mode = m;
        }
        // As `cryptsetup refresh`: the perf flags given replace the old set
        // (and the piece sizes with them).
        cfg.flags = flags.into();
        (cfg.max_read_size, cfg.max_write_size) = (flags.max_read_size, flags.max_write_size);
        self.engine
            .reconfigure(cfg.clone())
            .map_err(|e| Error::transparent(ErrorKind::Io, e))?;
        // Every crypt target shows the flags now in effect.
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for t in table.tables_mut() {
            t.options.perf = cfg.flags;
        }
        Ok(Reply::Refreshed {
            mode: cfg.mode,
            flags: Flags {
                max_read_size: cfg.max_read_size,
                max_write_size: cfg.max_write_size,
                ..cfg.flags.into()
            },
            allow_discards: cfg.allow_discards,
        })
    }

    fn handle(self: &Arc<Self>, req: Request) -> Handled {
        let busy = matches!(
            req,
            Request::Resize { .. }
                | Request::Suspend
                | Request::Resume { .. }
                | Request::Reload { .. }
        );
        if busy && self.reencrypting() {
            return Reply::from(Error::new(
                ErrorKind::Busy,
                format!(
                    "Device {} is in online reencryption (wait for it to finish, or close the volume).",
                    self.ping.name
                ),
            ))
            .into();
        }
        let r = match req {
            Request::Ping => Ok(Reply::Ping(self.ping.clone())),
            Request::Status => Ok(Reply::Status(Box::new(self.status()))),
            Request::Table { showkeys } => {
                let line = self
                    .table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .line(showkeys);
                Ok(Reply::Table { line })
            }
            Request::Refresh { mode, flags } => self.refresh(mode, flags),
            Request::Resize { size_sectors } => self.resize(size_sectors),
            Request::Suspend => self.suspend(),
            Request::Resume { line } => self.resume(line),
            Request::Reload { table } => self.reload(table),
            Request::Reencrypt(start) => self.reencrypt(*start),
            Request::ReencryptSet { action } => self.reencrypt_set(action),
            Request::Close => return self.close(),
        };
        r.unwrap_or_else(Reply::from).into()
    }

    /// Hands the close to the main thread and waits for its flush; a
    /// reencryption stops after its current hotzone first.
    fn close(&self) -> Handled {
        self.stop_reencryption();
        let (tx, rx) = mpsc::channel();
        let (wtx, wrx) = mpsc::channel();
        let r = if self.events.send(Event::Close(tx, wrx)).is_err() {
            Err(Error::new(ErrorKind::Io, "Daemon is already stopping"))
        } else {
            rx.recv().unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Io,
                    "Daemon stopped without answering",
                ))
            })
        };
        let ok = r.is_ok();
        Handled {
            reply: r.map(|()| Reply::Closed).unwrap_or_else(Reply::from),
            after_reply: Some(Box::new(move || {
                let _ = wtx.send(());
            })),
            last: ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fuse_at(dir: Option<&str>, uring: FuseUring) -> ExportSpec {
        ExportSpec::Fuse {
            mountpoint: dir.map(Into::into),
            uring,
        }
    }

    #[test]
    fn exports_parse_as_before() {
        let abs = |p: &str| std::path::absolute(p).unwrap();
        let ok = [
            ("nbd", None, ExportSpec::NbdUnix(None)),
            ("nbd=s.sock", None, ExportSpec::NbdUnix(Some(abs("s.sock")))),
            ("fuse", None, fuse_at(None, FuseUring::Off)),
            ("fuse=/mnt/x", None, fuse_at(Some("/mnt/x"), FuseUring::Off)),
            (
                "fuse=/mnt/x,uring=on",
                None,
                fuse_at(Some("/mnt/x"), FuseUring::On),
            ),
            (
                "fuse=/mnt/a,b,uring=off",
                None,
                fuse_at(Some("/mnt/a,b"), FuseUring::Off),
            ),
            ("fuse,uring=on", None, fuse_at(None, FuseUring::On)),
            ("fuse=uring=auto", None, fuse_at(None, FuseUring::Auto)),
            ("ublk", None, ExportSpec::Ublk),
            (
                "vhost-user-blk=/run/v.sock",
                None,
                ExportSpec::VhostUserBlk {
                    socket: "/run/v.sock".into(),
                    num_queues: vhost_blk::MAX_QUEUES,
                },
            ),
            (
                "nbd",
                Some("10809"),
                ExportSpec::NbdTcp("127.0.0.1:10809".parse().unwrap()),
            ),
            (
                "nbd",
                Some("[::1]:7"),
                ExportSpec::NbdTcp("[::1]:7".parse().unwrap()),
            ),
        ];
        for (e, l, want) in ok {
            assert_eq!(ExportSpec::parse(e, l).unwrap(), want, "{e} {l:?}");
        }
        for (e, l) in [
            ("nbd=s", Some("1")),
            ("fuse", Some("1")),
            ("fuse=/mnt/x,uring=yes", None),
            ("fuse,uring", None),
            ("fuse=/mnt/x,uring=", None),
            ("fusex", None),
            ("ublk=x", None),
            ("vhost", None),
            ("vhost-user-blk", None),
            ("vhost-user-blk=", None),
            ("vhost-user-blk=s", Some("1")),
            ("nbd", Some("host")),
        ] {
            let err = ExportSpec::parse(e, l).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{e} {l:?}");
        }
    }

    #[test]
    fn num_queues_only_for_vhost_user_blk() {
        let v = ExportSpec::parse("vhost-user-blk=/s", None).unwrap();
        let v4 = v.clone().with_num_queues(Some(4)).unwrap();
        assert_eq!(v4.num_queues(), Some(4));
        assert_eq!(
            v.clone().with_num_queues(None).unwrap().num_queues(),
            Some(vhost_blk::MAX_QUEUES),
            "the default offers every queue a guest may ask for"
        );
        for bad in [0, vhost_blk::MAX_QUEUES + 1] {
            let e = v.clone().with_num_queues(Some(bad)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
        }
        let e = ExportSpec::Ublk.with_num_queues(Some(2)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(ExportSpec::Ublk.num_queues(), None);
    }
}
