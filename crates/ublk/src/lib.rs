//! ublk frontend: exports a [`datapath::Engine`] as `/dev/ublkbN`.
//!
//! ```text
//!   kernel block layer ── /dev/ublkbN ── ublk_drv
//!        │ io descriptors (op, start_sector, nr_sectors, flags) per tag
//!        ▼
//!   queue thread (one per hw queue, libublk `wait_and_handle_io`)
//!        │ translate() ── engine.submit(Request, callback) ──► datapath::Engine
//!        │                                                     (any thread)
//!        │ ◄── eventfd + completion list ◄── callback ─────────┘
//!        ▼
//!   complete_io_cmd(tag, bytes or -errno)
//! ```
//!
//! Adapter glue over libublk (the kernel protocol is libublk's; nothing is
//! hand-written here but the translation). Each queue thread owns its tags'
//! IO buffers. A new IO command is translated by [`translate`] into a
//! [`datapath::Request`] (write data is copied out of the tag's buffer) and
//! submitted without blocking; the engine completes it on whatever thread it
//! likes, the callback pushes `(tag, result)` onto a list and bumps an
//! eventfd. The queue's io_uring has a poll armed on that eventfd (as a
//! libublk "target IO"), so the queue thread wakes, drains the list, copies
//! read data into the tag buffers and completes the commands. Queue depth is
//! therefore the ublk depth, not one request per thread.
//!
//! A failed request completes with [`datapath::Error::errno`], the table
//! every frontend shares (see [`completion_result`]). The device advertises
//! the volume's sector size as its logical block size, a volatile write
//! cache with FUA (so flush and FUA reach the engine), discard when the
//! export allows discards, write-zeroes always, and read-only when the
//! export is read-only: what the [`datapath::Export`] it serves allows.
//!
//! Needs the `ublk_drv` kernel module (`/dev/ublk-control`) and, normally,
//! root; [`serve`] fails early with [`ErrorKind::Unavailable`] without it.
//!
//! Modules: `translate` (IO descriptor to engine request and back, pure),
//! `params` (the device's parameters), `queue` (the queue threads and the
//! crate's only unsafe code, an eventfd).
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datapath::Export;
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::UblkFlags;

mod params;
#[allow(unsafe_code)] // eventfd(2), with its SAFETY notes
mod queue;
mod translate;

pub use params::DeviceParams;
pub use translate::{completion_result, translate, IoDesc};

use queue::serve_queue;

/// The ublk control device that must exist for [`serve`] to work.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// How to create the ublk device.
#[derive(Debug, Clone)]
pub struct Options {
    /// Device number N of `/dev/ublkbN`; `None` lets the kernel choose.
    pub id: Option<u32>,
    /// Hardware queues (one serving thread each).
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
    /// Largest read/write in bytes (the tag buffer size).
    pub max_io_bytes: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            id: None,
            queues: 1,
            depth: 64,
            max_io_bytes: 512 * 1024,
        }
    }
}

/// A running device, handed to the `ready` callback of [`serve_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// N of `/dev/ublkbN`.
    pub id: u32,
    /// `/dev/ublkbN`.
    pub path: PathBuf,
}

/// Errors of the ublk frontend: a stable [`ErrorKind`] and, when libublk
/// or the driver refused a step, libublk's error as the source. The
/// workspace's shape (docs/ARCHITECTURE.md, "Errors"), except that the
/// kind is the message.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct Error {
    kind: ErrorKind,
    #[source]
    source: Option<libublk::UblkError>,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The kernel has no ublk driver loaded.
    #[error("Cannot serve ublk: {0} not found (load the ublk_drv kernel module)")]
    Unavailable(&'static str),
    /// The options cannot describe a valid device.
    #[error("Invalid ublk options: {0}")]
    InvalidOptions(String),
    /// The block device is in use (mounted, or held open exclusively), so
    /// [`stop_if_idle`] left it serving.
    #[error("{} is in use (mounted or held open exclusively)", .0.display())]
    Busy(PathBuf),
    /// libublk or the driver refused an operation (the error's source
    /// says why).
    #[error("The ublk {what} step failed")]
    Ublk {
        /// Which step.
        what: &'static str,
    },
}

impl Error {
    fn new(kind: ErrorKind) -> Self {
        Self { kind, source: None }
    }

    fn ublk(what: &'static str, e: libublk::UblkError) -> Self {
        Self {
            kind: ErrorKind::Ublk { what },
            source: Some(e),
        }
    }

    /// The stable kind.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

/// True when this kernel can serve ublk devices (`/dev/ublk-control`).
pub fn available() -> bool {
    Path::new(CONTROL_PATH).exists()
}

/// Serves `view` (an [`Export`], or an engine exported as configured) as
/// a new `/dev/ublkbN` until the device is stopped ([`stop`], `ublk del`);
/// see [`serve_with`].
pub fn serve(view: impl Into<Export>, opts: &Options) -> Result<(), Error> {
    serve_with(view, opts, |_| {})
}

/// Serves `view` as a new `/dev/ublkbN`, calling `ready` once the block
/// device exists, and returns when the device has been stopped.
///
/// Requests still inside the engine when the device goes away complete into
/// the void; the caller flushes and shuts the engine down afterwards.
pub fn serve_with(
    view: impl Into<Export>,
    opts: &Options,
    ready: impl FnOnce(Device) + Send + Sync + 'static,
) -> Result<(), Error> {
    let view = view.into();
    let params = DeviceParams::new(&view, opts)?;
    if !available() {
        return Err(Error::new(ErrorKind::Unavailable(CONTROL_PATH)));
    }
    let id = match opts.id {
        Some(n) => i32::try_from(n)
            .map_err(|_| Error::new(ErrorKind::InvalidOptions(format!("device id {n}"))))?,
        None => -1,
    };
    let ctrl = UblkCtrlBuilder::default()
        .name("ucrypt")
        .id(id)
        .nr_queues(opts.queues)
        .depth(opts.depth)
        .io_buf_bytes(opts.max_io_bytes)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        .build()
        .map_err(|e| Error::ublk("add device", e))?;
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(params.size);
        params.apply(&mut dev.tgt.params);
        Ok(())
    };
    let q_engine = Arc::clone(view.engine());
    let queue_fn = move |qid: u16, dev: &UblkDev| serve_queue(qid, dev, &q_engine);
    let on_start = move |c: &UblkCtrl| {
        let id = c.dev_info().dev_id;
        ready(Device {
            id,
            path: PathBuf::from(format!("/dev/ublkb{id}")),
        });
    };
    ctrl.run_target(tgt_init, queue_fn, on_start)
        .map_err(|e| Error::ublk("run", e))?;
    Ok(())
}

/// Stops device `id` unless its block device is in use, like `cryptsetup
/// close` on a busy mapping: a mounted (or otherwise exclusively opened)
/// `/dev/ublkbN` yields [`ErrorKind::Busy`] and keeps serving.
///
/// [`stop`] alone would delete the disk under a mounted filesystem (the
/// guest suite saw ext4 shut down by `ucrypt close`). The exclusive open is
/// held while the device is stopped, so no mount can slip in between.
pub fn stop_if_idle(id: u32) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = PathBuf::from(format!("/dev/ublkb{id}"));
    let claim = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&path)
    {
        Ok(f) => Some(f),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(Error::new(ErrorKind::Busy(path)))
        }
        // No node (already stopped, or udev has not made it): nothing holds it.
        Err(_) => None,
    };
    let r = stop(id);
    drop(claim);
    r
}

/// Changes the size of live device `id` to `bytes`
/// (`UBLK_U_CMD_UPDATE_SIZE`, Linux 6.16 and later; older kernels refuse
/// the command and the device keeps its size).
pub fn update_size(id: u32, bytes: u64) -> Result<(), Error> {
    if !available() {
        return Err(Error::new(ErrorKind::Unavailable(CONTROL_PATH)));
    }
    let id = i32::try_from(id)
        .map_err(|_| Error::new(ErrorKind::InvalidOptions(format!("device id {id}"))))?;
    let ctrl = UblkCtrl::new_simple(id).map_err(|e| Error::ublk("open device", e))?;
    ctrl.update_size(bytes)
        .map_err(|e| Error::ublk("update the device size", e))?;
    Ok(())
}

/// Stops device `id` (its [`serve`] call returns), even when it is in use;
/// see [`stop_if_idle`].
pub fn stop(id: u32) -> Result<(), Error> {
    if !available() {
        return Err(Error::new(ErrorKind::Unavailable(CONTROL_PATH)));
    }
    let id = i32::try_from(id)
        .map_err(|_| Error::new(ErrorKind::InvalidOptions(format!("device id {id}"))))?;
    let ctrl = UblkCtrl::new_simple(id).map_err(|e| Error::ublk("open device", e))?;
    ctrl.kill_dev().map_err(|e| Error::ublk("stop device", e))?;
    Ok(())
}
