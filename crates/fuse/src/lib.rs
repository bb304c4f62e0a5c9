//! FUSE single-file export: a mountpoint directory holding one regular file
//! whose contents are the decrypted device.
//!
//! ```text
//!   loop device / dd / qemu ──► kernel FUSE ──► fuser session threads
//!                                                   │ Export (this crate)
//!                                                   ▼
//!                                      Engine::submit ──► reply on completion
//! ```
//!
//! The file has a fixed size (the device size). Reads and writes go straight
//! to the engine and are answered from its completion callback, so several
//! requests are in flight at once; requests not aligned to the volume's
//! sector size are widened (reads) or read-modify-written (writes). `fsync`
//! becomes an engine flush; `O_SYNC`/`O_DSYNC` writes are FUA. An `open` with
//! `O_DIRECT` gets the FUSE `direct_io` flag (no page cache), and the kernel
//! routes `O_DIRECT` IO set later (as `losetup --direct-io=on` does) through
//! FUSE's direct-IO path, so the file works as a loop device's backing file.
//! `fallocate` punch-hole / zero-range map to discard / write-zeroes.
//!
//! Built on the `fuser` crate (pure-Rust mount; no libfuse needed).

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use datapath::{Engine, Op, Request as IoRequest};
use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenAccMode, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, WriteFlags,
};

/// Errors of the FUSE frontend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Mounting failed.
    #[error("Cannot mount FUSE export at {path}")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The exported file is still in use (e.g. a loop device is attached).
    #[error("FUSE export at {0} is busy (is a loop device still attached? try `losetup -j FILE`)")]
    Busy(PathBuf),
    /// Unmounting failed for another reason.
    #[error("Cannot unmount FUSE export at {path}: {message}")]
    Unmount {
        /// The mountpoint.
        path: PathBuf,
        /// The unmount tool's message.
        message: String,
    },
}

/// How the export looks.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Name of the single file inside the mountpoint.
    pub file_name: String,
    /// Refuse writes (`EROFS`) and mount read-only.
    pub read_only: bool,
    /// Pass `fallocate(PUNCH_HOLE)` down as discards.
    pub allow_discards: bool,
    /// FUSE session threads (each with its own cloned /dev/fuse fd).
    pub threads: usize,
}

/// A mounted export. Call [`Export::unmount`] to stop it cleanly.
pub struct Export {
    mountpoint: PathBuf,
    file: PathBuf,
    session: Option<BackgroundSession>,
}

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(1);

impl Export {
    /// Mounts the export at `mountpoint` (created if missing). A stale mount
    /// left there by a crashed daemon is detached first.
    pub fn mount(engine: Arc<Engine>, mountpoint: &Path, cfg: ExportConfig) -> Result<Self, Error> {
        let merr = |source| Error::Mount {
            path: mountpoint.to_owned(),
            source,
        };
        clean_stale_mount(mountpoint).map_err(merr)?;
        std::fs::create_dir_all(mountpoint).map_err(merr)?;
        if cfg.file_name.is_empty()
            || cfg.file_name.contains('/')
            || cfg.file_name == "."
            || cfg.file_name == ".."
        {
            return Err(merr(io::Error::new(
                io::ErrorKind::InvalidInput,
                "Invalid export file name",
            )));
        }
        let file = mountpoint.join(&cfg.file_name);
        let mut options = vec![
            MountOption::FSName(format!("ucrypt:{}", cfg.file_name)),
            MountOption::Subtype("ucrypt".into()),
            MountOption::DefaultPermissions,
            MountOption::NoAtime,
            MountOption::NoDev,
            MountOption::NoSuid,
        ];
        options.push(if cfg.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        });
        let mut config = Config::default();
        config.mount_options = options;
        config.n_threads = Some(cfg.threads.max(1));
        config.clone_fd = cfg.threads > 1;
        let fs = Fs::new(engine, cfg);
        let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(merr)?;
        Ok(Self {
            mountpoint: mountpoint.to_owned(),
            file,
            session: Some(session),
        })
    }

    /// The exported file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The mountpoint directory.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (not lazily: fails with [`Error::Busy`] while the file is in
    /// use, leaving the export mounted and serving) and waits for the session
    /// to end. Calling it again after success does nothing.
    pub fn unmount(&mut self) -> Result<(), Error> {
        if self.session.is_none() {
            return Ok(());
        }
        unmount(&self.mountpoint, false)?;
        if let Some(s) = self.session.take() {
            // The kernel closed the connection; the session threads exit.
            let _ = s.join();
        }
        Ok(())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            // Last resort (error paths): lazy detach, do not wait.
            let _ = unmount(&self.mountpoint, true);
            drop(s);
        }
    }
}

/// Detaches a dead FUSE mount at `path` (its daemon crashed: `stat` fails
/// with `ENOTCONN`). Returns whether one was found.
pub fn clean_stale_mount(path: &Path) -> io::Result<bool> {
    match std::fs::metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            unmount(path, true).map_err(io::Error::other)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn unmount(path: &Path, lazy: bool) -> Result<(), Error> {
    // fusermount3 works for unprivileged owners too; umount(8) as a fallback.
    let mut tries: Vec<Command> = Vec::new();
    let mut f = Command::new("fusermount3");
    f.arg(if lazy { "-uz" } else { "-u" }).arg("--").arg(path);
    tries.push(f);
    let mut u = Command::new("umount");
    if lazy {
        u.arg("-l");
    }
    u.arg(path);
    tries.push(u);
    let mut message = String::new();
    for mut c in tries {
        match c.output() {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                message = String::from_utf8_lossy(&o.stderr).trim().to_owned();
                if message.contains("busy") {
                    return Err(Error::Busy(path.to_owned()));
                }
            }
            Err(e) => message = e.to_string(),
        }
    }
    Err(Error::Unmount {
        path: path.to_owned(),
        message,
    })
}

/// Maps an engine error to the errno returned to the kernel; the one place
/// this translation lives. `write` selects `ENOSPC` for out-of-range writes.
pub fn fuse_errno(err: &datapath::Error, write: bool) -> Errno {
    use datapath::Error as E;
    match err {
        E::OutOfRange { .. } if write => Errno::ENOSPC,
        E::OutOfRange { .. } | E::Misaligned { .. } => Errno::EINVAL,
        E::Unsupported(what) if what.contains("read-only") || what.contains("read only") => {
            Errno::EROFS
        }
        E::Unsupported(_) => Errno::EOPNOTSUPP,
        E::Io(e) => e
            .raw_os_error()
            .filter(|&n| n > 0)
            .map(Errno::from_i32)
            .unwrap_or(Errno::EIO),
        _ => Errno::EIO,
    }
}

struct Fs {
    engine: Arc<Engine>,
    cfg: ExportConfig,
    size: u64,
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
    fn new(engine: Arc<Engine>, cfg: ExportConfig) -> Self {
        let size = engine.size();
        let sector = u64::from(engine.sector_size().max(512));
        let (uid, gid) = owner();
        Self {
            engine,
            cfg,
            size,
            sector,
            uid,
            gid,
            started: SystemTime::now(),
            gate: Arc::default(),
        }
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let file = ino == FILE;
        let write_bits = if self.cfg.read_only { 0 } else { 0o200 };
        FileAttr {
            ino,
            size: if file { self.size } else { 0 },
            blocks: if file { self.size / 512 } else { 0 },
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
            .map_err(|e| fuse_errno(&e, false))?;
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
            .map_err(|e| fuse_errno(&e, false))?;
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        self.engine
            .write(start, buf, fua)
            .map_err(|e| fuse_errno(&e, true))
    }

    // `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
    #[allow(clippy::manual_is_multiple_of)]
    fn aligned(&self, offset: u64, len: u64) -> bool {
        offset % self.sector == 0 && len % self.sector == 0
    }
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
        // The device size is fixed; O_TRUNC-style resizes are refused.
        if size.is_some_and(|s| s != self.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.cfg.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
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
        if offset >= self.size || size == 0 {
            return reply.data(&[]);
        }
        let len = u64::from(size).min(self.size - offset);
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
            Err(e) => reply.error(fuse_errno(&e, false)),
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
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        if data.is_empty() {
            return reply.written(0);
        }
        if offset >= self.size {
            return reply.error(Errno::ENOSPC);
        }
        // A write running past the end is shortened, as on a block device.
        let len = (data.len() as u64).min(self.size - offset) as usize;
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
                Err(e) => reply.error(fuse_errno(&e, true)),
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
            Err(e) => reply.error(fuse_errno(&e, true)),
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
        reply.statfs(self.size / bs, 0, 0, 2, 0, bs as u32, 255, bs as u32);
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
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let Some(end) = offset.checked_add(length).filter(|&e| e <= self.size) else {
            // The size is fixed: growing is impossible.
            return reply.error(Errno::ENOSPC);
        };
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let op = if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            // Everything inside the device is already allocated.
            return reply.ok();
        } else if mode == punch && self.cfg.allow_discards {
            Op::Discard { len: 0 }
        } else if mode & !libc::FALLOC_FL_KEEP_SIZE == libc::FALLOC_FL_ZERO_RANGE {
            Op::WriteZeroes { len: 0 }
        } else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        // Only whole sectors; the kernel (loop) falls back to writing zeroes.
        if !self.aligned(offset, end - offset) || length > u64::from(u32::MAX) / 2 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let len = length as u32;
        let op = match op {
            Op::Discard { .. } => Op::Discard { len },
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
                    Err(e) => reply.error(fuse_errno(&e, true)),
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        use datapath::Error as E;
        let oor = E::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(fuse_errno(&oor, true), Errno::ENOSPC);
        assert_eq!(fuse_errno(&oor, false), Errno::EINVAL);
        assert_eq!(
            fuse_errno(&E::Io(io::Error::from_raw_os_error(libc::ENOSPC)), true),
            Errno::ENOSPC
        );
        assert_eq!(fuse_errno(&E::Io(io::Error::other("x")), false), Errno::EIO);
        assert_eq!(
            fuse_errno(&E::Unsupported("discard"), true),
            Errno::EOPNOTSUPP
        );
    }
}
