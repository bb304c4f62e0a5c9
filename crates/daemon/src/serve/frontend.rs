//! Starting the one frontend a daemon serves (NBD on a unix socket or TCP,
//! FUSE, ublk or vhost-user-blk) over its engine.
//!
//! What the export allows is built here once, as a [`datapath::Export`]
//! of the engine narrowed by the serving options (`read_only`,
//! `allow_discards`), and handed to the frontend, which advertises and
//! refuses by it.
//!
//! Paths are the daemon's business, not the frontends': the NBD and
//! vhost-user sockets are bound here ([`SocketFile::bind`]: nothing but a
//! stale socket of ours is replaced) and handed over as listeners; a FUSE
//! mountpoint the user names must be an empty directory, and only the
//! default one (`NAME.fuse` in the runtime directory) is created here.

use std::os::unix::fs::DirBuilderExt;
use std::sync::mpsc;
use std::sync::Arc;

use crypto::table::Targets;
use datapath::{Engine, EngineConfig, Export};

use super::ExportSpec;
use crate::control::ExportKind;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{Paths, SocketFile};
use crate::tls::TlsSpec;

pub(super) enum Frontend {
    Nbd(nbd::Server),
    Fuse(fuse::Export),
    Ublk {
        id: u32,
        thread: std::thread::JoinHandle<Result<(), ublk::Error>>,
    },
    Vhost(vhost_blk::Server),
}

/// A started frontend, what it exports, where, and the socket file bound
/// for it (removed when dropped, after the frontend stopped).
type Started = (Frontend, ExportKind, String, Option<SocketFile>);

#[allow(clippy::too_many_arguments)]
pub(super) fn start_frontend(
    engine: &Arc<Engine>,
    name: &str,
    cfg: &EngineConfig,
    export: ExportSpec,
    tls: &TlsSpec,
    paths: &Paths,
    table: &Targets,
    access: &luks::DeviceAccess,
) -> Result<Started> {
    let no_socket = |(f, k, e): (Frontend, ExportKind, String)| (f, k, e, None);
    let view = Export::new(Arc::clone(engine))
        .with_read_only(cfg.read_only)
        .with_discards(cfg.allow_discards);
    match export {
        ExportSpec::NbdUnix(p) => {
            let path = p.unwrap_or(paths.nbd.clone());
            let (listener, file) = SocketFile::bind(&path)?;
            let ep = nbd::Endpoint::Unix(path);
            let (f, k, e) = start_nbd(view, name, Bound::Unix(listener, ep), tls)?;
            Ok((f, k, e, Some(file)))
        }
        ExportSpec::NbdTcp(a) => {
            start_nbd(view, name, Bound::Tcp(nbd::Endpoint::Tcp(a)), tls).map(no_socket)
        }
        ExportSpec::Fuse { mountpoint, uring } => {
            let mnt = match mountpoint {
                Some(p) => p,
                None => {
                    // Ours, in the runtime directory: made here (a dead
                    // daemon's was removed when the name was claimed).
                    match std::fs::DirBuilder::new().mode(0o700).create(&paths.fuse) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => {
                            return Err(Error::new(
                                ErrorKind::PermissionDenied,
                                format!("Cannot create {}", paths.fuse.display()),
                            )
                            .with_source(e))
                        }
                    }
                    paths.fuse.clone()
                }
            };
            let fcfg = fuse::ExportConfig {
                file_name: name.to_owned(),
                threads: 4,
                uring: uring.into(),
            };
            let e = fuse::Export::mount(view, &mnt, fcfg).map_err(|e| {
                let kind = match e.kind() {
                    fuse::ErrorKind::Occupied => ErrorKind::Busy,
                    _ => ErrorKind::NoDevice,
                };
                Error::transparent(kind, e)
            })?;
            let file = e.file().display().to_string();
            Ok((Frontend::Fuse(e), ExportKind::Fuse, file, None))
        }
        ExportSpec::Ublk => start_ublk(view).map(no_socket),
        ExportSpec::VhostUserBlk { socket, num_queues } => {
            let (listener, file) = SocketFile::bind(&socket)?;
            let opts = vhost_blk::Options {
                num_queues,
                serial: volume_uuid(table, access),
                ..vhost_blk::Options::new(socket)
            };
            let s = vhost_blk::Server::start_on(view, listener, &opts)
                .map_err(|e| Error::transparent(ErrorKind::Busy, e))?;
            let sock = s.socket().display().to_string();
            Ok((
                Frontend::Vhost(s),
                ExportKind::VhostUserBlk,
                sock,
                Some(file),
            ))
        }
    }
}

/// The LUKS UUID of the table's device, for virtio-blk GET_ID (empty for
/// plain mappings and detached headers, which the daemon does not see).
fn volume_uuid(table: &Targets, access: &luks::DeviceAccess) -> String {
    luks::Volume::load(std::path::Path::new(table.device()), None, access)
        .map(|v| v.header().uuid().to_owned())
        .unwrap_or_default()
}

/// Where NBD is served: a unix socket bound here, or a TCP address the
/// server binds.
enum Bound {
    Unix(std::os::unix::net::UnixListener, nbd::Endpoint),
    Tcp(nbd::Endpoint),
}

fn start_nbd(
    view: Export,
    name: &str,
    at: Bound,
    spec: &TlsSpec,
) -> Result<(Frontend, ExportKind, String)> {
    let tls = spec.load()?;
    if let (Bound::Tcp(nbd::Endpoint::Tcp(a)), nbd::TlsMode::Off) = (&at, tls.mode()) {
        eprintln!(
            "ucrypt: warning: NBD over TCP is unencrypted on the wire: anyone who can reach {a} can read and \
             write the decrypted device (prefer the default unix socket, or tunnel it)"
        );
    }
    if let (Bound::Tcp(nbd::Endpoint::Tcp(a)), false) = (&at, spec.verify_peer) {
        if spec.certificates.is_some() && tls.mode() != nbd::TlsMode::Off {
            eprintln!(
                "ucrypt: warning: NBD over TCP with --tls-verify-peer=no serves any client that \
                 completes TLS: anyone who can reach {a} can read and write the decrypted device"
            );
        }
    }
    let export = nbd::ExportConfig {
        name: name.to_owned(),
        description: format!("ucrypt volume {name}"),
    };
    let opts = nbd::ServerOptions {
        tls,
        ..nbd::ServerOptions::default()
    };
    let s = match at {
        Bound::Unix(l, ep) => nbd::Server::start_on(view, export, l, ep, opts),
        Bound::Tcp(ep) => nbd::Server::start_with(view, export, ep, opts),
    }
    .map_err(|e| Error::transparent(ErrorKind::Busy, e))?;
    let uri = s.uri();
    Ok((Frontend::Nbd(s), ExportKind::Nbd, uri))
}

/// Starts `/dev/ublkbN` on its own thread and waits until it exists.
fn start_ublk(view: Export) -> Result<(Frontend, ExportKind, String)> {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("ublk".into())
        .spawn(move || ublk::serve_with(view, &ublk::Options::default(), move |d| drop(tx.send(d))))
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
