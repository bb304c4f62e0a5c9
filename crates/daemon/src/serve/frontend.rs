//! Starting the one frontend a daemon serves (NBD on a unix socket or TCP,
//! FUSE, ublk or vhost-user-blk) over its engine.

use std::sync::mpsc;
use std::sync::Arc;

use crypto::table::Table;
use datapath::{Engine, EngineConfig};

use super::ExportSpec;
use crate::control::ExportKind;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::Paths;
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

pub(super) fn start_frontend(
    engine: &Arc<Engine>,
    name: &str,
    cfg: &EngineConfig,
    export: ExportSpec,
    tls: &TlsSpec,
    paths: &Paths,
    table: &Table,
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
        ExportSpec::VhostUserBlk { socket, num_queues } => {
            let opts = vhost_blk::Options {
                num_queues,
                serial: volume_uuid(table),
                ..vhost_blk::Options::new(socket)
            };
            let s = vhost_blk::Server::start(Arc::clone(engine), &opts)
                .map_err(|e| Error::transparent(ErrorKind::Busy, e))?;
            let sock = s.socket().display().to_string();
            Ok((Frontend::Vhost(s), ExportKind::VhostUserBlk, sock))
        }
    }
}

/// The LUKS UUID of the table's device, for virtio-blk GET_ID (empty for
/// plain mappings and detached headers, which the daemon does not see).
fn volume_uuid(table: &Table) -> String {
    luks::Volume::load(std::path::Path::new(&table.device), None)
        .map(|v| v.header().uuid().to_owned())
        .unwrap_or_default()
}

fn start_nbd(
    engine: &Arc<Engine>,
    name: &str,
    cfg: &EngineConfig,
    ep: nbd::Endpoint,
    spec: &TlsSpec,
) -> Result<(Frontend, ExportKind, String)> {
    let tls = spec.load()?;
    if let (nbd::Endpoint::Tcp(a), nbd::TlsMode::Off) = (&ep, tls.mode()) {
        eprintln!(
            "ucrypt: warning: NBD over TCP is unencrypted on the wire: anyone who can reach {a} can read and \
             write the decrypted device (prefer the default unix socket, or tunnel it)"
        );
    }
    if let (nbd::Endpoint::Tcp(a), false) = (&ep, spec.verify_peer) {
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
