//! The filesystem the kernel talks to: one directory holding one file, the
//! decrypted device. Reads and writes are submitted to the engine and
//! answered from its completion; unaligned ones are widened or
//! read-modify-written under [`WriteGate`].

use std::ffi::OsStr;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use datapath::{Engine, Export as View, Op, OpKind, Request as IoRequest};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

use crate::ExportConfig;

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(1);

pub(crate) struct Fs {
    engine: Arc<Engine>,
    /// What the export allows, and its refusals.
    view: View,
    cfg: ExportConfig,
    sector: u64,
    uid: u32,
    gid: u32,
    started: SystemTime,
    /// Orders read-modify-write of partial sectors against other writes.
    gate: Arc<WriteGate>,
}

/// Writes in flight vs. a read-modify-write in progress. A partial-sector
/// write reads whole sectors, patches them and writes them back; a write
/// to the same sectors completing in between would be lost. So RMW waits
/// for the writes in flight to finish and holds new ones back meanwhile
/// (partial writes are rare: page-cache and direct IO are sector-aligned).
#[derive(Default)]
struct WriteGate {
    state: Mutex<GateState>,
    cv: std::sync::Condvar,
}

#[derive(Default)]
struct GateState {
    inflight: u64,
    rmw: bool,
}

impl WriteGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn wait<'a>(
        &self,
        g: std::sync::MutexGuard<'a, GateState>,
    ) -> std::sync::MutexGuard<'a, GateState> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }
    /// An aligned write starts.
    fn enter(&self) {
        let mut g = self.lock();
        while g.rmw {
            g = self.wait(g);
        }
        g.inflight += 1;
    }
    /// An aligned write completed.
    fn leave(&self) {
        let mut g = self.lock();
        g.inflight -= 1;
        if g.inflight == 0 {
            self.cv.notify_all();
        }
    }
    /// Runs `f` with no other write in flight.
    fn exclusive<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut g = self.lock();
        while g.rmw {
            g = self.wait(g);
        }
        g.rmw = true;
        while g.inflight > 0 {
            g = self.wait(g);
        }
        drop(g);
        let r = f();
        self.lock().rmw = false;
        self.cv.notify_all();
        r
    }
}

impl Fs {
    pub(crate) fn new(view: View, cfg: ExportConfig) -> Self {
        let sector = u64::from(view.sector_size().max(512));
        let (uid, gid) = owner();
        Self {
            engine: Arc::clone(view.engine()),
            view,
            cfg,
            sector,
            uid,
            gid,
            started: SystemTime::now(),
            gate: Arc::default(),
        }
    }

    /// The device's size now (a live `resize` shows once the kernel's
    /// attribute cache, [`TTL`], expires).
    fn size(&self) -> u64 {
        self.view.size()
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let file = ino == FILE;
        let write_bits = if self.view.read_only() { 0 } else { 0o200 };
        FileAttr {
            ino,
            size: if file { self.size() } else { 0 },
            blocks: if file { self.size() / 512 } else { 0 },
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind: if file {
                FileType::RegularFile
            } else {
                FileType::Directory
            },
            perm: if file {
                0o400 | write_bits
            } else {
                0o500 | write_bits
            },
            nlink: if file { 1 } else { 2 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.sector.max(4096) as u32,
            flags: 0,
        }
    }

    /// Blocking read of an arbitrary (clipped) range, widened to sectors.
    fn read_unaligned(&self, offset: u64, len: u64) -> Result<Vec<u8>, Errno> {
        let start = offset / self.sector * self.sector;
        let end = (offset + len).div_ceil(self.sector) * self.sector;
        let mut all = self
            .engine
            .read(
                start,
                u32::try_from(end - start).map_err(|_| Errno::EINVAL)?,
            )
            .map_err(|e| errno(&e))?;
        all.truncate((offset + len - start) as usize);
        Ok(all.split_off((offset - start) as usize))
    }

    fn write_unaligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno> {
        self.gate.exclusive(|| self.rmw(offset, data, fua))
    }

    fn rmw(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno> {
        let start = offset / self.sector * self.sector;
        let end = (offset + data.len() as u64).div_ceil(self.sector) * self.sector;
        let mut buf = self
            .engine
            .read(
                start,
                u32::try_from(end - start).map_err(|_| Errno::EINVAL)?,
            )
            .map_err(|e| errno(&e))?;
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        self.engine.write(start, buf, fua).map_err(|e| errno(&e))
    }

    // `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
    #[allow(clippy::manual_is_multiple_of)]
    fn aligned(&self, offset: u64, len: u64) -> bool {
        offset % self.sector == 0 && len % self.sector == 0
    }

    /// The whole sectors `offset..offset + len` touches, as `(start, len)`:
    /// the request as it reaches the engine (widened, or read-modify-
    /// written). A range past `u64::MAX` ends at the last whole sector,
    /// so it is out of range, not misaligned.
    fn widen(&self, offset: u64, len: u64) -> (u64, u64) {
        let s = self.sector;
        let start = offset / s * s;
        let end = offset
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(s))
            .unwrap_or(u64::MAX / s * s);
        (start, end - start)
    }
}

/// The errno of an engine error as fuser's type ([`datapath::Error::errno`],
/// the table every frontend shares).
fn errno(e: &datapath::Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn owner() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    // The daemon's own uid/gid, read without libc: a file we just created
    // is owned by us (/proc/self is owned by the process's euid/egid).
    std::fs::metadata("/proc/self")
        .map(|m| (m.uid(), m.gid()))
        .unwrap_or((0, 0))
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Let direct IO (loop --direct-io=on, O_DIRECT) run several
        // requests in parallel instead of one at a time.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(64);
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == OsStr::new(&self.cfg.file_name) {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT | FILE => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != FILE && ino != ROOT {
            return reply.error(Errno::ENOENT);
        }
        // The size follows the device (`ucrypt resize`); O_TRUNC-style
        // resizes through the file are refused.
        if size.is_some_and(|s| s != self.size()) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            if let Err(e) = self.view.check_op(OpKind::Write, 0) {
                return reply.error(errno(&e));
            }
        }
        let mut f = FopenFlags::empty();
        if flags.0 & libc::O_DIRECT != 0 {
            f |= FopenFlags::FOPEN_DIRECT_IO;
        }
        reply.opened(FileHandle(0), f);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let end = self.size();
        if offset >= end || size == 0 {
            return reply.data(&[]);
        }
        let len = u64::from(size).min(end - offset);
        if !self.aligned(offset, len) {
            return match self.read_unaligned(offset, len) {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(e),
            };
        }
        let req = IoRequest {
            op: Op::Read { len: len as u32 },
            offset,
            fua: false,
        };
        self.engine.submit(req, move |res| match res {
            Ok(Some(d)) => reply.data(&d),
            Ok(None) => reply.error(Errno::EIO),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if let Err(e) = self.view.check_op(OpKind::Write, data.len() as u64) {
            return reply.error(errno(&e));
        }
        if data.is_empty() {
            return reply.written(0);
        }
        // A write running past the end is shortened, as on a block device;
        // one starting at or past the end is refused as the engine refuses
        // the sectors it would write.
        let end = self.size();
        let len = if offset < end {
            (data.len() as u64).min(end - offset) as usize
        } else {
            data.len()
        };
        let (start, whole) = self.widen(offset, len as u64);
        if let Err(e) = self.view.check(OpKind::Write, start, whole) {
            return reply.error(errno(&e));
        }
        let data = &data[..len];
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        if !self.aligned(offset, len as u64) {
            return match self.write_unaligned(offset, data, fua) {
                Ok(()) => reply.written(len as u32),
                Err(e) => reply.error(e),
            };
        }
        let req = IoRequest {
            op: Op::Write {
                data: data.to_vec(),
            },
            offset,
            fua,
        };
        self.gate.enter();
        let gate = Arc::clone(&self.gate);
        self.engine.submit(req, move |res| {
            gate.leave();
            match res {
                Ok(_) => reply.written(len as u32),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): nothing is cached here; durability is fsync's job.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let req = IoRequest {
            op: Op::Flush,
            offset: 0,
            fua: false,
        };
        self.engine.submit(req, move |res| match res {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.cfg.file_name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.sector.max(4096);
        reply.statfs(self.size() / bs, 0, 0, 2, 0, bs as u32, 255, bs as u32);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // `None`: plain preallocation.
        let kind = if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            None
        } else if mode == punch {
            Some(OpKind::Discard)
        } else if mode & !libc::FALLOC_FL_KEEP_SIZE == libc::FALLOC_FL_ZERO_RANGE {
            Some(OpKind::WriteZeroes)
        } else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        // Refused as the engine refuses the sectors they cover (the size
        // is fixed: growing is impossible); a preallocation is refused as
        // a write-zeroes is (a write's errno, and no request-size limit).
        let (start, whole) = self.widen(offset, length);
        if let Err(e) = self
            .view
            .check(kind.unwrap_or(OpKind::WriteZeroes), start, whole)
        {
            return reply.error(errno(&e));
        }
        let Some(kind) = kind else {
            // Everything inside the device is already allocated.
            return reply.ok();
        };
        // Only whole sectors; the kernel (loop) falls back to writing zeroes.
        if !self.aligned(offset, length) || length > u64::from(u32::MAX) / 2 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let len = length as u32;
        let op = match kind {
            OpKind::Discard => Op::Discard { len },
            _ => Op::WriteZeroes { len },
        };
        self.gate.enter();
        let gate = Arc::clone(&self.gate);
        self.engine.submit(
            IoRequest {
                op,
                offset,
                fua: false,
            },
            move |res| {
                gate.leave();
                match res {
                    Ok(_) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                }
            },
        );
    }
}
