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
//! Errors are mapped to errno in one place, [`errno`]. The device advertises
//! the volume's sector size as its logical block size, a volatile write
//! cache with FUA (so flush and FUA reach the engine), discard when the
//! engine allows discards, write-zeroes always, and read-only when the engine
//! is read-only.
//!
//! Needs the `ublk_drv` kernel module (`/dev/ublk-control`) and, normally,
//! root; [`serve`] fails early with [`ErrorKind::Unavailable`] without it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use datapath::{Completion, Engine, Op, Request};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, UblkFlags, UblkIORes};

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

/// Errors of the ublk frontend.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct Error {
    kind: ErrorKind,
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
    /// libublk or the driver refused an operation.
    #[error("The ublk {what} step failed: {detail}")]
    Ublk {
        /// Which step.
        what: &'static str,
        /// libublk's error text.
        detail: String,
    },
}

impl Error {
    fn new(kind: ErrorKind) -> Self {
        Self { kind }
    }

    fn ublk(what: &'static str, e: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::Ublk {
            what,
            detail: e.to_string(),
        })
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

/// Serves `engine` as a new `/dev/ublkbN` until the device is stopped
/// ([`stop`], `ublk del`); see [`serve_with`].
pub fn serve(engine: Arc<Engine>, opts: &Options) -> Result<(), Error> {
    serve_with(engine, opts, |_| {})
}

/// Serves `engine` as a new `/dev/ublkbN`, calling `ready` once the block
/// device exists, and returns when the device has been stopped.
///
/// Requests still inside the engine when the device goes away complete into
/// the void; the caller flushes and shuts the engine down afterwards.
pub fn serve_with(
    engine: Arc<Engine>,
    opts: &Options,
    ready: impl FnOnce(Device) + Send + Sync + 'static,
) -> Result<(), Error> {
    let params = DeviceParams::new(&engine, opts)?;
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
    let q_engine = engine.clone();
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

/// Stops device `id` (its [`serve`] call returns).
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

/// One IO descriptor as the driver hands it over (`ublksrv_io_desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation in bits 0-7, `UBLK_IO_F_*` flags above.
    pub op_flags: u32,
    /// Length in 512-byte sectors.
    pub nr_sectors: u32,
    /// Start in 512-byte sectors.
    pub start_sector: u64,
}

/// Translates an IO descriptor into an engine request; `data` is the tag
/// buffer (write payload source). `Err(errno)` completes the command at once.
pub fn translate(d: &IoDesc, data: &[u8]) -> Result<Request, i32> {
    let op = d.op_flags & 0xff;
    let fua = d.op_flags & sys::UBLK_IO_F_FUA != 0;
    let offset = d.start_sector.checked_mul(512).ok_or(libc::EINVAL)?;
    let len = u64::from(d.nr_sectors) * 512;
    let len32 = u32::try_from(len).map_err(|_| libc::EINVAL)?;
    let op = match op {
        sys::UBLK_IO_OP_READ => {
            if len > data.len() as u64 {
                return Err(libc::EINVAL);
            }
            Op::Read { len: len32 }
        }
        sys::UBLK_IO_OP_WRITE => {
            let src = data.get(..len as usize).ok_or(libc::EINVAL)?;
            Op::Write { data: src.to_vec() }
        }
        sys::UBLK_IO_OP_FLUSH => Op::Flush,
        sys::UBLK_IO_OP_DISCARD => Op::Discard { len: len32 },
        sys::UBLK_IO_OP_WRITE_ZEROES => Op::WriteZeroes { len: len32 },
        _ => return Err(libc::EOPNOTSUPP),
    };
    Ok(Request { op, offset, fua })
}

/// The errno a failed request completes with (the block layer turns it into
/// a `blk_status_t`: `EOPNOTSUPP` → not supported, `ENOSPC` → no space, the
/// rest → IO error).
pub fn errno(e: &datapath::Error) -> i32 {
    use datapath::Error as E;
    match e {
        E::OutOfRange { .. } | E::Misaligned { .. } => libc::EINVAL,
        E::Unsupported(_) => libc::EOPNOTSUPP,
        E::Io(io) => os_errno(io).unwrap_or(libc::EIO),
        E::Shutdown => libc::ENODEV,
        _ => libc::EIO,
    }
}

/// The errno carried by an io::Error or by any error in its source chain.
fn os_errno(e: &std::io::Error) -> Option<i32> {
    if let Some(n) = e.raw_os_error() {
        return Some(n);
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|x| x as _);
    while let Some(err) = cur {
        if let Some(n) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return Some(n);
        }
        cur = err.source();
    }
    None
}

/// The value a command completes with: bytes done, or `-errno`.
pub fn completion_result(req_len: u32, c: &Completion) -> i32 {
    match c {
        Ok(_) => i32::try_from(req_len).unwrap_or(i32::MAX),
        Err(e) => -errno(e),
    }
}

/// Block-device parameters derived from the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceParams {
    /// Device size in bytes.
    pub size: u64,
    /// log2 of the logical block size (the volume's sector size).
    pub logical_shift: u8,
    /// Largest read/write in 512-byte sectors.
    pub max_sectors: u32,
    /// Advertise discard.
    pub discard: bool,
    /// Advertise read-only.
    pub read_only: bool,
}

/// Largest discard / write-zeroes the device advertises (1 GiB; the engine
/// takes u32 lengths).
const MAX_DISCARD_SECTORS: u32 = (1 << 30) >> 9;

impl DeviceParams {
    /// Checks `opts` against the engine and derives the parameters.
    pub fn new(engine: &Engine, opts: &Options) -> Result<Self, Error> {
        let cfg = engine.config();
        Self::from_parts(
            engine.size(),
            engine.sector_size(),
            cfg.allow_discards,
            cfg.read_only,
            opts,
        )
    }

    fn from_parts(
        size: u64,
        sector: u32,
        discard: bool,
        read_only: bool,
        opts: &Options,
    ) -> Result<Self, Error> {
        let bad = |m: String| Err(Error::new(ErrorKind::InvalidOptions(m)));
        if !sector.is_power_of_two() || !(512..=4096).contains(&sector) {
            return bad(format!(
                "sector size {sector} is not 512..4096 and a power of two"
            ));
        }
        if opts.queues == 0 || opts.depth == 0 {
            return bad("queues and depth must be at least 1".into());
        }
        // `sector` is a power of two (checked above).
        if opts.max_io_bytes < sector || opts.max_io_bytes & (sector - 1) != 0 {
            return bad(format!(
                "max IO size {} is not a multiple of the sector size {sector}",
                opts.max_io_bytes
            ));
        }
        if size & (u64::from(sector) - 1) != 0 {
            return bad(format!(
                "device size {size} is not a multiple of the sector size {sector}"
            ));
        }
        Ok(Self {
            size,
            logical_shift: sector.trailing_zeros() as u8,
            max_sectors: opts.max_io_bytes >> 9,
            discard,
            read_only,
        })
    }

    /// Writes these parameters into the driver's parameter block.
    pub fn apply(&self, p: &mut sys::ublk_params) {
        p.types |= sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD;
        let b = &mut p.basic;
        b.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
        if self.read_only {
            b.attrs |= sys::UBLK_ATTR_READ_ONLY;
        }
        b.logical_bs_shift = self.logical_shift;
        b.physical_bs_shift = self.logical_shift.max(12);
        b.io_min_shift = self.logical_shift;
        b.io_opt_shift = self.logical_shift.max(12);
        b.max_sectors = self.max_sectors;
        b.dev_sectors = self.size >> 9;
        let d = &mut p.discard;
        d.discard_alignment = 0;
        d.discard_granularity = 1 << self.logical_shift;
        d.max_discard_segments = 1;
        d.max_discard_sectors = if self.discard && !self.read_only {
            MAX_DISCARD_SECTORS
        } else {
            0
        };
        d.max_write_zeroes_sectors = if self.read_only {
            0
        } else {
            MAX_DISCARD_SECTORS
        };
    }
}

/// Completions handed from engine threads back to one queue thread.
struct Mailbox {
    done: Mutex<Vec<(u16, u32, Completion)>>,
    eventfd: File,
}

impl Mailbox {
    fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new
        // descriptor that nothing else owns, so File may take ownership.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: see above: `fd` is fresh and owned by no one else.
        let eventfd = unsafe { File::from_raw_fd(fd) };
        Ok(Self {
            done: Mutex::new(Vec::new()),
            eventfd,
        })
    }

    /// Called on an engine thread.
    fn post(&self, tag: u16, len: u32, c: Completion) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((tag, len, c));
        // The counter cannot overflow in practice (2^64-2); a failed write
        // (EAGAIN at the limit) still leaves it readable, which is all we need.
        let _ = (&self.eventfd).write(&1u64.to_ne_bytes());
    }

    /// Called on the queue thread after the eventfd poll fired.
    fn take(&self) -> Vec<(u16, u32, Completion)> {
        let mut counter = [0u8; 8];
        // Reset the counter before draining: a post racing with us either
        // lands in this drain or re-raises the counter for the next poll.
        let _ = (&self.eventfd).read(&mut counter);
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Marks the eventfd poll among the queue's target IOs.
const POLL_TAG: u16 = 0;
const POLL_OP: u32 = 0xfe;

fn arm_poll(q: &UblkQueue, fd: i32) -> Result<(), libublk::UblkError> {
    let sqe = io_uring::opcode::PollAdd::new(io_uring::types::Fd(fd), libc::POLLIN as u32)
        .build()
        .user_data(UblkIOCtx::build_user_data(POLL_TAG, POLL_OP, 0, true));
    q.ublk_submit_sqe_sync(sqe)
}

/// Serves one hardware queue until the device stops.
fn serve_queue(qid: u16, dev: &UblkDev, engine: &Arc<Engine>) {
    let mailbox = match Mailbox::new() {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("ublk queue {qid}: cannot create eventfd: {e}");
            return;
        }
    };
    let mut bufs = dev.alloc_queue_io_bufs();
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => {
            eprintln!("ublk queue {qid}: setup failed: {e}");
            return;
        }
    };
    let efd = mailbox.eventfd.as_raw_fd();
    if let Err(e) = arm_poll(&queue, efd) {
        eprintln!("ublk queue {qid}: cannot arm eventfd poll: {e}");
        return;
    }
    // `bufs` moves into the handler; the heap buffers the driver was given
    // above do not move with it.
    let handler = move |q: &UblkQueue, tag: u16, ctx: &UblkIOCtx| {
        if ctx.is_tgt_io() {
            if UblkIOCtx::user_data_to_op(ctx.user_data()) != POLL_OP {
                return;
            }
            for (tag, len, c) in mailbox.take() {
                finish(q, &mut bufs, tag, len, c);
            }
            // A failed poll (the ring is being torn down) is not re-armed, so
            // it cannot turn into a busy loop.
            if ctx.result() < 0 {
                eprintln!(
                    "ublk queue {qid}: eventfd poll failed with errno {}",
                    -ctx.result()
                );
            } else if let Err(e) = arm_poll(q, efd) {
                eprintln!("ublk queue {qid}: cannot re-arm eventfd poll: {e}");
            }
            return;
        }
        let iod = q.get_iod(tag);
        let d = IoDesc {
            op_flags: iod.op_flags,
            nr_sectors: iod.nr_sectors,
            start_sector: iod.start_sector,
        };
        let Some(buf) = bufs.get(usize::from(tag)) else {
            return;
        };
        match translate(&d, buf.as_slice()) {
            Ok(req) => {
                let len = d.nr_sectors.saturating_mul(512);
                let mb = mailbox.clone();
                engine.submit(req, move |c| mb.post(tag, len, c));
            }
            Err(errno) => complete(q, &bufs, tag, -errno),
        }
    };
    queue.wait_and_handle_io(handler);
}

/// Copies read data into the tag buffer and completes the command.
fn finish(
    q: &UblkQueue,
    bufs: &mut [libublk::helpers::IoBuf<u8>],
    tag: u16,
    len: u32,
    c: Completion,
) {
    let mut res = completion_result(len, &c);
    if let (Ok(Some(data)), Some(buf)) = (&c, bufs.get_mut(usize::from(tag))) {
        match buf.as_mut_slice().get_mut(..data.len()) {
            Some(dst) => dst.copy_from_slice(data),
            None => res = -libc::EIO,
        }
    }
    complete(q, bufs, tag, res);
}

fn complete(q: &UblkQueue, bufs: &[libublk::helpers::IoBuf<u8>], tag: u16, res: i32) {
    let Some(buf) = bufs.get(usize::from(tag)) else {
        return;
    };
    if let Err(e) = q.complete_io_cmd_unified(
        tag,
        BufDesc::Slice(buf.as_slice()),
        Ok(UblkIORes::Result(res)),
    ) {
        eprintln!(
            "ublk queue {}: completing tag {tag} failed: {e}",
            q.get_qid()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(op: u32, flags: u32, start: u64, sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: op | flags,
            nr_sectors: sectors,
            start_sector: start,
        }
    }

    #[test]
    fn translates_reads_and_writes_with_fua() {
        let buf: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let r = translate(&desc(sys::UBLK_IO_OP_READ, 0, 8, 4), &buf).unwrap();
        assert!(matches!(r.op, Op::Read { len: 2048 }) && r.offset == 4096 && !r.fua);
        let w = translate(&desc(sys::UBLK_IO_OP_WRITE, sys::UBLK_IO_F_FUA, 1, 3), &buf).unwrap();
        assert!(w.fua && w.offset == 512);
        match w.op {
            Op::Write { data } => assert_eq!(data, buf[..1536]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn translates_flush_discard_zeroes() {
        let r = translate(&desc(sys::UBLK_IO_OP_FLUSH, 0, 0, 0), &[]).unwrap();
        assert!(matches!(r.op, Op::Flush));
        let r = translate(&desc(sys::UBLK_IO_OP_DISCARD, 0, 100, 2048), &[]).unwrap();
        assert!(matches!(r.op, Op::Discard { len: 1_048_576 }) && r.offset == 51_200);
        let r = translate(
            &desc(sys::UBLK_IO_OP_WRITE_ZEROES, sys::UBLK_IO_F_NOUNMAP, 7, 1),
            &[],
        )
        .unwrap();
        assert!(matches!(r.op, Op::WriteZeroes { len: 512 }) && r.offset == 3584);
    }

    #[test]
    fn rejects_unknown_ops_and_oversized_or_overflowing_requests() {
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_WRITE_SAME, 0, 0, 1), &[0; 512]).unwrap_err(),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_ZONE_APPEND, 0, 0, 1), &[0; 512]).unwrap_err(),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            translate(&desc(0xff, 0, 0, 1), &[0; 512]).unwrap_err(),
            libc::EOPNOTSUPP
        );
        // Larger than the tag buffer.
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_READ, 0, 0, 3), &[0; 1024]).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_WRITE, 0, 0, 3), &[0; 1024]).unwrap_err(),
            libc::EINVAL
        );
        // Byte offset overflow and lengths beyond u32.
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_READ, 0, u64::MAX / 256, 1), &[0; 512]).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            translate(&desc(sys::UBLK_IO_OP_DISCARD, 0, 0, u32::MAX), &[]).unwrap_err(),
            libc::EINVAL
        );
    }

    #[test]
    fn maps_engine_errors_to_errno() {
        use datapath::Error as E;
        assert_eq!(
            errno(&E::OutOfRange {
                offset: 0,
                len: 1,
                size: 0
            }),
            libc::EINVAL
        );
        assert_eq!(errno(&E::Misaligned { sector_size: 4096 }), libc::EINVAL);
        assert_eq!(errno(&E::Unsupported("discard")), libc::EOPNOTSUPP);
        assert_eq!(errno(&E::Shutdown), libc::ENODEV);
        assert_eq!(
            errno(&E::Io(std::io::Error::from_raw_os_error(libc::ENOSPC))),
            libc::ENOSPC
        );
        // An errno wrapped inside a custom error (as backend errors are).
        let wrapped = std::io::Error::other(std::io::Error::from_raw_os_error(libc::EROFS));
        assert_eq!(errno(&E::Io(wrapped)), libc::EROFS);
        assert_eq!(errno(&E::Io(std::io::Error::other("no errno"))), libc::EIO);
        assert_eq!(completion_result(4096, &Ok(None)), 4096);
        assert_eq!(completion_result(4096, &Err(E::Shutdown)), -libc::ENODEV);
    }

    #[test]
    fn device_params_follow_the_volume() {
        let o = Options::default();
        let p = DeviceParams::from_parts(1 << 30, 4096, true, false, &o).unwrap();
        let mut raw = sys::ublk_params::default();
        p.apply(&mut raw);
        assert_eq!(raw.basic.logical_bs_shift, 12);
        assert_eq!(raw.basic.dev_sectors, (1 << 30) >> 9);
        assert_eq!(raw.basic.max_sectors, 1024);
        assert_ne!(raw.basic.attrs & sys::UBLK_ATTR_FUA, 0);
        assert_ne!(raw.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0);
        assert_eq!(raw.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(
            (
                raw.discard.discard_granularity,
                raw.discard.max_discard_segments
            ),
            (4096, 1)
        );
        assert!(raw.discard.max_discard_sectors > 0);

        let p = DeviceParams::from_parts(1 << 20, 512, false, true, &o).unwrap();
        let mut raw = sys::ublk_params::default();
        p.apply(&mut raw);
        assert_eq!(raw.basic.logical_bs_shift, 9);
        assert_ne!(raw.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!(
            (
                raw.discard.max_discard_sectors,
                raw.discard.max_write_zeroes_sectors
            ),
            (0, 0)
        );

        for (size, sector, opts) in [
            (1 << 20, 1024 + 512, o.clone()),
            (1 << 20, 8192, o.clone()),
            (1000, 512, o.clone()),
            (
                1 << 20,
                4096,
                Options {
                    max_io_bytes: 6000,
                    ..o.clone()
                },
            ),
            (
                1 << 20,
                512,
                Options {
                    depth: 0,
                    ..o.clone()
                },
            ),
        ] {
            let e = DeviceParams::from_parts(size, sector, false, false, &opts).unwrap_err();
            assert!(e.to_string().starts_with("Invalid ublk options"), "{e}");
        }
    }
}
