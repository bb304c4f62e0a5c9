//! The daemon's lifecycle: build the engine over the backing device, start
//! one frontend (NBD, FUSE or ublk), answer the control socket, and shut
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
//! Messages for the daemon's own log (the detached daemon's stderr is
//! `NAME.log`) go to stderr prefixed `ucrypt: `.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend::{FileBackend, FileOptions};
use crypto::table::Table;
use crypto::SectorCrypt;
use datapath::{Engine, EngineConfig};

use crate::control::{self, ExportKind, Flags, Handled, Ping, Reply, Request, Status};
use crate::error::{flat, invalid, Error, ErrorKind, Result};
use crate::resolve::VolumeType;
use crate::runtime::{self, Paths};
use crate::tls::TlsSpec;

/// Which frontend serves the device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExportSpec {
    /// NBD on a unix socket (`NAME.nbd.sock` in the runtime dir if `None`).
    NbdUnix(Option<PathBuf>),
    /// NBD on TCP (unencrypted on the wire unless [`TlsSpec`] turns TLS on).
    NbdTcp(SocketAddr),
    /// A FUSE file export at a mountpoint (`NAME.fuse` if `None`).
    Fuse(Option<PathBuf>),
    /// A ublk block device.
    Ublk,
}

impl ExportSpec {
    /// Parses `nbd[=SOCKET]`, `fuse[=MOUNTPOINT]` or `ublk`; with `listen`
    /// (`PORT` on loopback, or `ADDR:PORT`) NBD is served on TCP instead.
    /// Paths are made absolute (a detached daemon runs in `/`).
    pub fn parse(export: &str, listen: Option<&str>) -> Result<Self> {
        let (kind, arg) = match export.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (export, None),
        };
        let path = |v: &str| -> Result<PathBuf> {
            std::path::absolute(v)
                .map_err(|e| invalid(format!("Invalid path {v:?}")).with_source(e))
        };
        let spec = match (kind, arg, listen) {
            ("nbd", Some(_), Some(_)) => {
                return Err(invalid(
                    "Give either --export nbd=SOCKET or --listen, not both",
                ))
            }
            ("nbd", None, Some(l)) => Self::NbdTcp(parse_listen(l)?),
            ("nbd", None, None) => Self::NbdUnix(None),
            ("nbd", Some(p), None) => Self::NbdUnix(Some(path(p)?)),
            ("fuse", None, _) => Self::Fuse(None),
            ("fuse", Some(p), _) => Self::Fuse(Some(path(p)?)),
            ("ublk", None, _) => Self::Ublk,
            _ => {
                return Err(invalid(format!(
                    "Unknown export {export:?}: use nbd[=SOCKET], fuse[=MOUNTPOINT] or ublk"
                )))
            }
        };
        if listen.is_some() && !matches!(spec, Self::NbdTcp(_)) {
            return Err(invalid("--listen only applies to --export nbd"));
        }
        Ok(spec)
    }

    /// The inverse of [`ExportSpec::parse`]: the `export` and `listen`
    /// strings that parse back to `self` (for a re-executed daemon).
    pub fn to_args(&self) -> (String, Option<String>) {
        match self {
            Self::NbdUnix(None) => ("nbd".into(), None),
            Self::NbdUnix(Some(p)) => (format!("nbd={}", p.display()), None),
            Self::NbdTcp(a) => ("nbd".into(), Some(a.to_string())),
            Self::Fuse(None) => ("fuse".into(), None),
            Self::Fuse(Some(p)) => (format!("fuse={}", p.display()), None),
            Self::Ublk => ("ublk".into(), None),
        }
    }

    /// Fails early when this machine cannot serve the export (ublk needs
    /// the `ublk_drv` kernel module).
    pub fn check_available(&self) -> Result<()> {
        if *self == Self::Ublk && !ublk::available() {
            return Err(ublk_unavailable());
        }
        Ok(())
    }
}

/// `PORT` (loopback) or an explicit `ADDR:PORT` / `[V6]:PORT`.
fn parse_listen(s: &str) -> Result<SocketAddr> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        invalid(format!(
            "Invalid --listen {s:?}: use PORT or ADDR:PORT (e.g. 127.0.0.1:10809)"
        ))
    })
}

/// Everything the daemon needs, resolved by the caller.
pub struct Spec {
    /// Volume name (checked with [`runtime::check_name`]).
    pub name: String,
    /// The volume type, for `status`.
    pub volume_type: VolumeType,
    /// The mapping, with the key.
    pub table: Table,
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
}

/// The error for `--export ublk` on a kernel without ublk.
fn ublk_unavailable() -> Error {
    Error::new(
        ErrorKind::NoDevice,
        format!(
            "ublk export not available: {} is missing (load the ublk_drv kernel module); use --export nbd or --export fuse",
            ublk::CONTROL_PATH
        ),
    )
}

/// Serves `spec` until `close` or SIGTERM/SIGINT. `ready` gets the ping
/// answer (where clients connect) once the frontend and the control socket
/// are up and the pid file is written.
pub fn run(spec: Spec, ready: impl FnOnce(&Ping)) -> Result<()> {
    runtime::check_name(&spec.name)?;
    // The process holds the volume key: no core dumps, and no ptrace or
    // /proc/PID/mem reads by other processes of the same uid.
    nix::sys::prctl::set_dumpable(false).map_err(|e| {
        Error::new(ErrorKind::Io, "Cannot make the daemon non-dumpable")
            .with_source(std::io::Error::from(e))
    })?;
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
    } = spec;

    let engine = Arc::new(build_engine(&table, &cfg, io_engine, direct)?);
    let (frontend, export_kind, endpoint) =
        start_frontend(&engine, &name, &cfg, export, &tls, &paths)?;

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
        frontend: Mutex::new(Some(frontend)),
        started: Instant::now(),
        events: tx.clone(),
    });

    // Control socket: bind in the 0700 runtime dir, then restrict to 0600.
    let _ = std::fs::remove_file(&paths.ctl);
    let ctl = UnixListener::bind(&paths.ctl).map_err(|e| {
        Error::new(
            ErrorKind::Busy,
            format!("Cannot create control socket {}", paths.ctl.display()),
        )
        .with_source(e)
    })?;
    std::fs::set_permissions(&paths.ctl, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("Cannot restrict {}", paths.ctl.display()),
        )
        .with_source(e)
    })?;
    let d = Arc::clone(&daemon);
    spawn("ctl", move || control::serve(ctl, |req| d.handle(req)))?;

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
            Error::new(
                ErrorKind::PermissionDenied,
                format!("Cannot write {}", paths.pid.display()),
            )
            .with_source(e)
        })?;
    ready(&daemon.ping);

    let result = daemon.wait(&rx);
    let _ = std::fs::remove_file(&paths.ctl);
    let _ = std::fs::remove_file(&paths.pid);
    // Our default mountpoint goes; a mountpoint the user named stays.
    let _ = std::fs::remove_dir(&paths.fuse);
    result
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

/// The engine over the table's device.
fn build_engine(
    table: &Table,
    cfg: &EngineConfig,
    io_engine: backend::IoEngine,
    direct: backend::DirectIo,
) -> Result<Engine> {
    let opts = FileOptions {
        read_only: cfg.read_only,
        allow_discard: cfg.allow_discards,
        min_size: table.offset_bytes().saturating_add(table.len_bytes()),
        // Each engine thread runs one request at a time to completion, so a
        // blocking pread/pwrite is the cheapest path; io_uring adds a ring
        // round trip (and an io-wq hop where the filesystem cannot do
        // nowait IO, e.g. buffered tmpfs: ~14 us vs ~1.6 us per 4 KiB read).
        engine: Some(io_engine),
        direct,
        ..FileOptions::default()
    };
    let backend = FileBackend::open(&table.device, &opts).map_err(crate::map::backend_error)?;
    let crypt = SectorCrypt::new(&table.crypt_config())
        .map_err(|e| Error::transparent(ErrorKind::InvalidInput, e))?;
    let vol = datapath::Volume {
        backend: Arc::new(backend),
        crypt: Some(Arc::new(crypt)),
        data_offset: table.offset_bytes(),
        size: table.len_bytes(),
        sector_size: table.options.sector_size,
    };
    Engine::new(vol, cfg.clone()).map_err(|e| Error::transparent(ErrorKind::NoDevice, e))
}

enum Event {
    Signal(i32),
    /// Close: the result goes back on the first channel; the main thread
    /// then waits on the second until the reply has been written.
    Close(mpsc::Sender<Result<()>>, mpsc::Receiver<()>),
}

enum Frontend {
    Nbd(nbd::Server),
    Fuse(fuse::Export),
    Ublk {
        id: u32,
        thread: std::thread::JoinHandle<Result<(), ublk::Error>>,
    },
}

fn start_frontend(
    engine: &Arc<Engine>,
    name: &str,
    cfg: &EngineConfig,
    export: ExportSpec,
    tls: &TlsSpec,
    paths: &Paths,
) -> Result<(Frontend, ExportKind, String)> {
    match export {
        ExportSpec::NbdUnix(p) => start_nbd(
            engine,
            name,
            cfg,
            nbd::Endpoint::Unix(p.unwrap_or(paths.nbd.clone())),
            tls,
        ),
        ExportSpec::NbdTcp(a) => start_nbd(engine, name, cfg, nbd::Endpoint::Tcp(a), tls),
        ExportSpec::Fuse(p) => {
            let mnt = p.unwrap_or(paths.fuse.clone());
            let fcfg = fuse::ExportConfig {
                file_name: name.to_owned(),
                read_only: cfg.read_only,
                allow_discards: cfg.allow_discards,
                threads: 4,
            };
            let e = fuse::Export::mount(Arc::clone(engine), &mnt, fcfg)
                .map_err(|e| Error::transparent(ErrorKind::NoDevice, e))?;
            let file = e.file().display().to_string();
            Ok((Frontend::Fuse(e), ExportKind::Fuse, file))
        }
        ExportSpec::Ublk => start_ublk(engine),
    }
}

fn start_nbd(
    engine: &Arc<Engine>,
    name: &str,
    cfg: &EngineConfig,
    ep: nbd::Endpoint,
    tls: &TlsSpec,
) -> Result<(Frontend, ExportKind, String)> {
    let tls = tls.load()?;
    if let (nbd::Endpoint::Tcp(a), nbd::TlsMode::Off) = (&ep, tls.mode()) {
        eprintln!(
            "ucrypt: warning: NBD over TCP is unencrypted on the wire: anyone who can reach {a} can read and \
             write the decrypted device (prefer the default unix socket, or tunnel it)"
        );
    }
    let export = nbd::ExportConfig {
        name: name.to_owned(),
        description: format!("ucrypt volume {name}"),
        read_only: cfg.read_only,
        allow_trim: cfg.allow_discards,
    };
    let opts = nbd::ServerOptions {
        tls,
        ..nbd::ServerOptions::default()
    };
    let s = nbd::Server::start_with(Arc::clone(engine), export, ep, opts)
        .map_err(|e| Error::transparent(ErrorKind::Busy, e))?;
    let uri = s.uri();
    Ok((Frontend::Nbd(s), ExportKind::Nbd, uri))
}

/// Starts `/dev/ublkbN` on its own thread and waits until it exists.
fn start_ublk(engine: &Arc<Engine>) -> Result<(Frontend, ExportKind, String)> {
    let (tx, rx) = mpsc::channel();
    let e = Arc::clone(engine);
    let thread = std::thread::Builder::new()
        .name("ublk".into())
        .spawn(move || ublk::serve_with(e, &ublk::Options::default(), move |d| drop(tx.send(d))))
        .map_err(|e| Error::new(ErrorKind::Io, "Cannot start the ublk thread").with_source(e))?;
    match rx.recv() {
        Ok(dev) => Ok((
            Frontend::Ublk { id: dev.id, thread },
            ExportKind::Ublk,
            dev.path.display().to_string(),
        )),
        // The sender was dropped without a device: serve_with failed.
        Err(_) => {
            let unavailable = "ublk export not available";
            Err(match thread.join() {
                Ok(Err(e)) => Error::new(ErrorKind::NoDevice, unavailable).with_source(e),
                _ => Error::new(
                    ErrorKind::NoDevice,
                    format!("{unavailable}: the ublk thread ended without creating a device"),
                ),
            })
        }
    }
}

/// How long stopping the NBD frontend may take before `close` or a
/// signal goes on without it (see `Daemon::stop_nbd`).
const NBD_STOP_TIMEOUT: Duration = Duration::from_secs(5);

struct Daemon {
    ping: Ping,
    volume_type: VolumeType,
    table: Mutex<Table>,
    engine: Arc<Engine>,
    frontend: Mutex<Option<Frontend>>,
    started: Instant,
    events: mpsc::Sender<Event>,
}

impl Daemon {
    /// The main thread's loop: waits for close or a signal and shuts down.
    fn wait(&self, rx: &mpsc::Receiver<Event>) -> Result<()> {
        loop {
            match rx.recv() {
                Ok(Event::Close(reply, written)) => match self.stop_frontend(false) {
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
                        let _ = reply.send(Err(f));
                    }
                },
                Ok(Event::Signal(s)) => {
                    eprintln!(
                        "ucrypt: {}: signal {s}, draining and flushing",
                        self.ping.name
                    );
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
    /// server wakes its accept loop by connecting to its own socket path;
    /// if that file was removed or replaced, the wake never arrives and an
    /// unbounded wait would hang `close` and SIGTERM forever. Past the
    /// bound the stop goes on in the background while we flush and exit.
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
            Some(Frontend::Fuse(f)) => match f.unmount() {
                Ok(()) => {}
                Err(fuse::Error::Busy(p)) if !force => {
                    // Still mounted and serving: refuse, like `cryptsetup
                    // close` on a device that is in use.
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!(
                            "Device {} is still in use: {} is busy (detach the loop device or unmount first)",
                            self.ping.name,
                            p.display()
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
        let nbd = match &*self.frontend.lock().unwrap_or_else(|e| e.into_inner()) {
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
        Status {
            ping: self.ping.clone(),
            volume_type: self.volume_type,
            cipher: t.cipher.as_str().to_owned(),
            keysize_bits: t.key().len() * 8,
            device: t.device.clone(),
            sector_size: t.options.sector_size,
            offset_sectors: t.offset,
            iv_offset: t.iv_offset,
            size_sectors: t.len,
            read_only: cfg.read_only,
            allow_discards: cfg.allow_discards,
            flags: cfg.flags.into(),
            mode: cfg.mode,
            uptime_s: self.started.elapsed().as_secs(),
            stats: (&self.engine.stats()).into(),
            nbd,
        }
    }

    fn refresh(&self, mode: Option<datapath::CryptMode>, flags: Flags) -> Result<Reply> {
        let mut cfg = self.engine.config();
        if let Some(m) = mode {
            cfg.mode = m;
        }
        // As `cryptsetup refresh`: the perf flags given replace the old set.
        cfg.flags = flags.into();
        self.engine
            .reconfigure(cfg.clone())
            .map_err(|e| Error::transparent(ErrorKind::Io, e))?;
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.options.same_cpu_crypt = cfg.flags.same_cpu_crypt;
        t.options.submit_from_crypt_cpus = cfg.flags.submit_from_crypt_cpus;
        t.options.no_read_workqueue = cfg.flags.no_read_workqueue;
        t.options.no_write_workqueue = cfg.flags.no_write_workqueue;
        Ok(Reply::Refreshed {
            mode: cfg.mode,
            flags: cfg.flags.into(),
            allow_discards: cfg.allow_discards,
        })
    }

    fn handle(&self, req: Request) -> Handled {
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
            Request::Close => return self.close(),
        };
        r.unwrap_or_else(Reply::from).into()
    }

    /// Hands the close to the main thread and waits for its flush.
    fn close(&self) -> Handled {
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

    #[test]
    fn exports_parse_as_before() {
        let abs = |p: &str| std::path::absolute(p).unwrap();
        let ok = [
            ("nbd", None, ExportSpec::NbdUnix(None)),
            ("nbd=s.sock", None, ExportSpec::NbdUnix(Some(abs("s.sock")))),
            ("fuse", None, ExportSpec::Fuse(None)),
            ("fuse=/mnt/x", None, ExportSpec::Fuse(Some("/mnt/x".into()))),
            ("ublk", None, ExportSpec::Ublk),
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
            let (e2, l2) = want.to_args();
            assert_eq!(ExportSpec::parse(&e2, l2.as_deref()).unwrap(), want);
        }
        for (e, l) in [
            ("nbd=s", Some("1")),
            ("fuse", Some("1")),
            ("ublk=x", None),
            ("vhost", None),
            ("nbd", Some("host")),
        ] {
            let err = ExportSpec::parse(e, l).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{e} {l:?}");
        }
    }
}
