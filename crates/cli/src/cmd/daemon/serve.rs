//! The daemon process: builds the engine over the backing device, starts one
//! export (NBD or FUSE), answers the control socket, and shuts down cleanly.
//!
//! ```text
//!   control thread ──┐  (status/table/refresh answered directly;
//!   signal thread ───┼─► events ─► main thread: close = stop export,
//!                    │                          drain + flush engine,
//!                    │                          remove sockets/pid, exit
//!   export threads (nbd accept/conn, fuse session) ─► Engine
//! ```
//!
//! Control protocol (hand-written, one JSON object per line each way):
//! `{"cmd":"ping"|"status"|"table"|"refresh"|"close", ...}` →
//! `{"ok":true, ...}` or `{"ok":false,"error":"…","code":N}`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use backend::{FileBackend, FileOptions};
use crypto::table::Table;
use crypto::SectorCrypt;
use datapath::{CryptMode, Engine, EngineConfig, PerfFlags, Volume};
use serde_json::{json, Value};

use super::runtime::{self, Paths};
use crate::Failure;

/// Which frontend serves the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportSpec {
    /// NBD on a unix socket (default path if `None`).
    NbdUnix(Option<PathBuf>),
    /// NBD on TCP.
    NbdTcp(SocketAddr),
    /// FUSE file export at a mountpoint (default path if `None`).
    Fuse(Option<PathBuf>),
    /// ublk block device.
    Ublk,
}

/// Everything the daemon needs, resolved by the `open` command.
pub struct Spec {
    /// Volume name.
    pub name: String,
    /// "LUKS1", "LUKS2" or "PLAIN" (for status).
    pub kind: String,
    /// The mapping, with the key.
    pub table: Table,
    /// The frontend.
    pub export: ExportSpec,
    /// Initial engine configuration.
    pub engine: EngineConfig,
    /// How the backing file is accessed.
    pub io_engine: backend::IoEngine,
    /// O_DIRECT policy for the backing file.
    pub direct: backend::DirectIo,
}

enum Event {
    Signal(i32),
    /// Close: the result goes back on the first channel; the main thread
    /// then waits on the second until the reply has been written.
    Close(mpsc::Sender<Result<(), Failure>>, mpsc::Receiver<()>),
}

enum Frontend {
    Nbd(nbd::Server),
    Fuse(fuse::Export),
    Ublk {
        id: u32,
        thread: std::thread::JoinHandle<Result<(), ublk::Error>>,
    },
}

struct Daemon {
    name: String,
    kind: String,
    table: Mutex<Table>,
    engine: Arc<Engine>,
    export_kind: &'static str,
    export_where: String,
    frontend: Mutex<Option<Frontend>>,
    started: Instant,
    events: mpsc::Sender<Event>,
}

/// Runs the daemon until `close` or SIGTERM/SIGINT. `ready` gets the ping
/// reply (export endpoint) once clients can connect.
pub fn run(spec: Spec, ready: impl FnOnce(&Value)) -> Result<(), Failure> {
    let paths = Paths::new(&runtime::ensure_dir()?, &spec.name);
    let Spec {
        name,
        kind,
        table,
        export,
        engine: cfg,
        io_engine,
        direct,
    } = spec;

    let ro = cfg.read_only;
    let opts = FileOptions {
        read_only: ro,
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
    let backend =
        FileBackend::open(&table.device, &opts).map_err(|e| Failure::device(chain(&e)))?;
    let crypt = SectorCrypt::new(&table.crypt_config()).map_err(|e| Failure::usage(chain(&e)))?;
    let vol = Volume {
        backend: Arc::new(backend),
        crypt: Some(Arc::new(crypt)),
        data_offset: table.offset_bytes(),
        size: table.len_bytes(),
        sector_size: table.options.sector_size,
    };
    let engine = Arc::new(Engine::new(vol, cfg.clone()).map_err(|e| Failure::device(chain(&e)))?);

    let (tx, rx) = mpsc::channel();
    let (frontend, export_kind, export_where) = match export {
        ExportSpec::NbdUnix(p) => start_nbd(
            &engine,
            &name,
            &cfg,
            nbd::Endpoint::Unix(p.unwrap_or(paths.nbd.clone())),
        )?,
        ExportSpec::NbdTcp(a) => start_nbd(&engine, &name, &cfg, nbd::Endpoint::Tcp(a))?,
        ExportSpec::Fuse(p) => {
            let mnt = p.unwrap_or(paths.fuse.clone());
            let fcfg = fuse::ExportConfig {
                file_name: name.clone(),
                read_only: ro,
                allow_discards: cfg.allow_discards,
                threads: 4,
            };
            let e = fuse::Export::mount(Arc::clone(&engine), &mnt, fcfg)
                .map_err(|e| Failure::device(chain(&e)))?;
            let file = e.file().display().to_string();
            (Frontend::Fuse(e), "fuse", file)
        }
        ExportSpec::Ublk => start_ublk(&engine)?,
    };

    let daemon = Arc::new(Daemon {
        name: name.clone(),
        kind,
        table: Mutex::new(table),
        engine: Arc::clone(&engine),
        export_kind,
        export_where,
        frontend: Mutex::new(Some(frontend)),
        started: Instant::now(),
        events: tx.clone(),
    });

    // Control socket: bind in the 0700 runtime dir, then restrict to 0600.
    let _ = std::fs::remove_file(&paths.ctl);
    let ctl = UnixListener::bind(&paths.ctl).map_err(|e| {
        Failure::busy(format!(
            "Cannot create control socket {}: {e}",
            paths.ctl.display()
        ))
    })?;
    std::fs::set_permissions(&paths.ctl, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Failure::denied(format!("Cannot restrict {}: {e}", paths.ctl.display())))?;
    let d = Arc::clone(&daemon);
    std::thread::Builder::new()
        .name("ctl".into())
        .spawn(move || control_loop(ctl, d))
        .map_err(|e| Failure::device(format!("Cannot start control thread: {e}")))?;

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| Failure::device(format!("Cannot install signal handlers: {e}")))?;
    let sig_tx = tx.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for s in signals.forever() {
                if sig_tx.send(Event::Signal(s)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| Failure::device(format!("Cannot start signal thread: {e}")))?;

    std::fs::write(&paths.pid, format!("{}\n", std::process::id()))
        .map_err(|e| Failure::denied(format!("Cannot write {}: {e}", paths.pid.display())))?;
    ready(&daemon.ping());

    let result = loop {
        match rx.recv() {
            Ok(Event::Close(reply, written)) => match daemon.stop_frontend(false) {
                Ok(()) => {
                    let r = daemon
                        .engine
                        .shutdown()
                        .map_err(|e| Failure::device(chain(&e)));
                    // Answer only after the flush: `ucrypt close` returning
                    // means the data is durable.
                    let failed = r.is_err();
                    let _ = reply.send(r);
                    let _ = written.recv_timeout(std::time::Duration::from_secs(5));
                    break if failed {
                        Err(Failure::device("Flush failed during close"))
                    } else {
                        Ok(())
                    };
                }
                Err(f) => {
                    let _ = reply.send(Err(f));
                }
            },
            Ok(Event::Signal(s)) => {
                eprintln!("ucrypt: {name}: signal {s}, draining and flushing");
                let _ = daemon.stop_frontend(true);
                break daemon
                    .engine
                    .shutdown()
                    .map_err(|e| Failure::device(chain(&e)));
            }
            Err(_) => break Ok(()),
        }
    };
    let _ = std::fs::remove_file(&paths.ctl);
    let _ = std::fs::remove_file(&paths.pid);
    // Our default mountpoint goes; a mountpoint the user named stays.
    let _ = std::fs::remove_dir(&paths.fuse);
    result
}

fn start_nbd(
    engine: &Arc<Engine>,
    name: &str,
    cfg: &EngineConfig,
    ep: nbd::Endpoint,
) -> Result<(Frontend, &'static str, String), Failure> {
    if let nbd::Endpoint::Tcp(a) = &ep {
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
    let s =
        nbd::Server::start(Arc::clone(engine), export, ep).map_err(|e| Failure::busy(chain(&e)))?;
    let uri = s.endpoint().to_string();
    Ok((Frontend::Nbd(s), "nbd", uri))
}

/// The message for `--export ublk` on a kernel without ublk.
pub fn ublk_unavailable() -> String {
    format!(
        "ublk export not available: {} is missing (load the ublk_drv kernel module); use --export nbd or --export fuse",
        ublk::CONTROL_PATH
    )
}

/// Starts `/dev/ublkbN` on its own thread and waits until it exists.
fn start_ublk(engine: &Arc<Engine>) -> Result<(Frontend, &'static str, String), Failure> {
    let (tx, rx) = mpsc::channel();
    let e = Arc::clone(engine);
    let thread = std::thread::Builder::new()
        .name("ublk".into())
        .spawn(move || ublk::serve_with(e, &ublk::Options::default(), move |d| drop(tx.send(d))))
        .map_err(|e| Failure::device(format!("Cannot start the ublk thread: {e}")))?;
    match rx.recv() {
        Ok(dev) => Ok((
            Frontend::Ublk { id: dev.id, thread },
            "ublk",
            dev.path.display().to_string(),
        )),
        // The sender was dropped without a device: serve_with failed.
        Err(_) => {
            let why = match thread.join() {
                Ok(Err(e)) => chain(&e),
                _ => "the ublk thread ended without creating a device".to_owned(),
            };
            Err(Failure::device(format!("ublk export not available: {why}")))
        }
    }
}

/// Error text with its sources, one level each ("A: B: C").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl Daemon {
    fn ping(&self) -> Value {
        json!({
            "ok": true,
            "name": self.name,
            "pid": std::process::id(),
            "export": self.export_kind,
            "where": self.export_where,
        })
    }

    /// Stops the frontend. `force` (signals): a busy FUSE mount is detached
    /// lazily; otherwise busy is an error and the daemon keeps serving.
    fn stop_frontend(&self, force: bool) -> Result<(), Failure> {
        let mut slot = self.frontend.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_mut() {
            Some(Frontend::Nbd(_)) => {
                if let Some(Frontend::Nbd(s)) = slot.take() {
                    s.shutdown();
                }
            }
            Some(Frontend::Ublk { id, .. }) => {
                if let Err(e) = ublk::stop(*id) {
                    if !force {
                        return Err(Failure::busy(chain(&e)));
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
                    return Err(Failure::busy(format!(
                        "Device {} is still in use: {} is busy (detach the loop device or unmount first)",
                        self.name,
                        p.display()
                    )));
                }
                Err(e) if !force => return Err(Failure::busy(chain(&e))),
                // Forced: dropping the export detaches the mount lazily.
                Err(e) => eprintln!("ucrypt: {}", chain(&e)),
            },
            None => {}
        }
        *slot = None;
        Ok(())
    }

    fn status(&self) -> Value {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let cfg = self.engine.config();
        let st = self.engine.stats();
        let dir = |d: &datapath::DirStats| {
            json!({
                "requests": d.requests, "bytes": d.bytes, "errors": d.errors,
                "inline": d.inline, "queued": d.queued, "split": d.split, "offloaded": d.offloaded,
                "p50_us": d.latency.p50_us, "p99_us": d.latency.p99_us, "p999_us": d.latency.p999_us,
            })
        };
        let nbd = match &*self.frontend.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(Frontend::Nbd(s)) => {
                let n = s.stats();
                json!({"connections": n.connections, "accepted": n.accepted, "protocol_errors": n.protocol_errors})
            }
            _ => Value::Null,
        };
        json!({
            "ok": true,
            "name": self.name,
            "pid": std::process::id(),
            "type": self.kind,
            "cipher": t.cipher.as_str(),
            "keysize_bits": t.key().len() * 8,
            "device": t.device,
            "sector_size": t.options.sector_size,
            "offset_sectors": t.offset,
            "iv_offset": t.iv_offset,
            "size_sectors": t.len,
            "read_only": cfg.read_only,
            "flags": flag_words(&cfg),
            "mode": mode_name(cfg.mode),
            "export": self.export_kind,
            "where": self.export_where,
            "uptime_s": self.started.elapsed().as_secs(),
            "stats": {
                "read": dir(&st.read), "write": dir(&st.write),
                "flushes": st.flushes, "discards": st.discards,
                "in_flight": st.in_flight, "max_in_flight": st.max_in_flight,
                "reconfigurations": st.reconfigurations,
            },
            "nbd": nbd,
        })
    }

    fn refresh(&self, req: &Value) -> Result<Value, Failure> {
        let mut cfg = self.engine.config();
        if let Some(m) = req["mode"].as_str() {
            cfg.mode = parse_mode(m)?;
        }
        let f = &req["flags"];
        // As `cryptsetup refresh`: the perf flags given replace the old set.
        cfg.flags = PerfFlags {
            same_cpu_crypt: f["same_cpu_crypt"].as_bool().unwrap_or(false),
            submit_from_crypt_cpus: f["submit_from_crypt_cpus"].as_bool().unwrap_or(false),
            no_read_workqueue: f["no_read_workqueue"].as_bool().unwrap_or(false),
            no_write_workqueue: f["no_write_workqueue"].as_bool().unwrap_or(false),
        };
        self.engine
            .reconfigure(cfg.clone())
            .map_err(|e| Failure::device(chain(&e)))?;
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.options.same_cpu_crypt = cfg.flags.same_cpu_crypt;
        t.options.submit_from_crypt_cpus = cfg.flags.submit_from_crypt_cpus;
        t.options.no_read_workqueue = cfg.flags.no_read_workqueue;
        t.options.no_write_workqueue = cfg.flags.no_write_workqueue;
        Ok(json!({"ok": true, "mode": mode_name(cfg.mode), "flags": flag_words(&cfg)}))
    }

    fn handle(&self, req: &Value, written: &mut Option<mpsc::Sender<()>>) -> Value {
        let r = match req["cmd"].as_str().unwrap_or("") {
            "ping" => Ok(self.ping()),
            "status" => Ok(self.status()),
            "table" => {
                let show = req["showkeys"].as_bool().unwrap_or(false);
                let line = self
                    .table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .format(show);
                Ok(json!({"ok": true, "table": line}))
            }
            "refresh" => self.refresh(req),
            "close" => {
                let (tx, rx) = mpsc::channel();
                let (wtx, wrx) = mpsc::channel();
                *written = Some(wtx);
                if self.events.send(Event::Close(tx, wrx)).is_err() {
                    Err(Failure::device("Daemon is already stopping"))
                } else {
                    rx.recv()
                        .unwrap_or_else(|_| {
                            Err(Failure::device("Daemon stopped without answering"))
                        })
                        .map(|()| json!({"ok": true}))
                }
            }
            other => Err(Failure::usage(format!("Unknown control command {other:?}"))),
        };
        r.unwrap_or_else(|f| json!({"ok": false, "error": f.message, "code": f.code}))
    }
}

fn control_loop(l: UnixListener, d: Arc<Daemon>) {
    let closing = AtomicBool::new(false);
    for conn in l.incoming() {
        let Ok(conn) = conn else { continue };
        if closing.load(Ordering::Relaxed) {
            continue;
        }
        // One short request per connection; a stuck client cannot block
        // others for long.
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let Ok(reader) = conn.try_clone() else {
            continue;
        };
        let mut line = String::new();
        let mut written = None;
        if BufReader::new(reader)
            .take(64 << 10)
            .read_line(&mut line)
            .is_err()
        {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => {
                let r = d.handle(&req, &mut written);
                if req["cmd"] == "close" && r["ok"] == true {
                    closing.store(true, Ordering::Relaxed);
                }
                r
            }
            Err(_) => {
                json!({"ok": false, "error": "Malformed control request (expected one JSON object per line)", "code": 1})
            }
        };
        reply_line(conn, &reply);
        if let Some(w) = written.take() {
            let _ = w.send(());
        }
    }
}

fn reply_line(mut conn: UnixStream, v: &Value) {
    let mut s = v.to_string();
    s.push('\n');
    let _ = conn.write_all(s.as_bytes());
}

/// `classic|inline|adaptive`.
pub fn parse_mode(s: &str) -> Result<CryptMode, Failure> {
    match s {
        "classic" => Ok(CryptMode::Classic),
        "inline" => Ok(CryptMode::Inline),
        "adaptive" => Ok(CryptMode::Adaptive),
        _ => Err(Failure::usage(format!(
            "Unknown mode {s:?}: use classic, inline or adaptive"
        ))),
    }
}

/// The name `parse_mode` accepts.
pub fn mode_name(m: CryptMode) -> &'static str {
    match m {
        CryptMode::Classic => "classic",
        CryptMode::Inline => "inline",
        CryptMode::Adaptive => "adaptive",
    }
}

/// `cryptsetup status` flag words for the current configuration.
fn flag_words(cfg: &EngineConfig) -> Vec<&'static str> {
    let mut w = Vec::new();
    if cfg.allow_discards {
        w.push("discards");
    }
    if cfg.flags.same_cpu_crypt {
        w.push("same_cpu_crypt");
    }
    if cfg.flags.submit_from_crypt_cpus {
        w.push("submit_from_crypt_cpus");
    }
    if cfg.flags.no_read_workqueue {
        w.push("no_read_workqueue");
    }
    if cfg.flags.no_write_workqueue {
        w.push("no_write_workqueue");
    }
    w
}
