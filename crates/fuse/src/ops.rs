//! What each request does to the exported file, whichever transport
//! carried it (fuser's /dev/fuse loop in `fs.rs`, or the io_uring queues in
//! `uring.rs`): one directory holding one file, the decrypted device.
//!
//! Reads, writes, flushes and fallocate are submitted to the engine and
//! answered through `done` from its completion; unaligned reads and writes
//! are widened or read-modify-written under [`WriteGate`] on a helper
//! thread, so no transport thread waits for IO.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use datapath::{Engine, Export as View, Op, OpKind, Request as IoRequest};
use fuser::{Errno, FileAttr, FileType, INodeNo};

use crate::ExportConfig;

pub(crate) const ROOT: INodeNo = INodeNo::ROOT;
pub(crate) const FILE: INodeNo = INodeNo(2);
/// How long the kernel may cache entries and attributes.
pub(crate) const TTL: Duration = Duration::from_secs(1);

/// The export's answers, shared by the transports.
pub(crate) struct Ops {
    engine: Arc<Engine>,
    /// What the export allows, and its refusals.
    view: View,
    pub(crate) cfg: ExportConfig,
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
    /// An aligned write starts, unless a read-modify-write holds the gate
    /// (then `false`, and nothing is counted).
    fn try_enter(&self) -> bool {
        let mut g = self.lock();
        if g.rmw {
            return false;
        }
        g.inflight += 1;
        true
    }
    /// An aligned write starts (waiting out a read-modify-write).
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

/// The filesystem's numbers for `statfs`.
pub(crate) struct Statfs {
    pub(crate) blocks: u64,
    pub(crate) files: u64,
    pub(crate) bsize: u32,
    pub(crate) namelen: u32,
}

impl Ops {
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

    /// The uid the export serves (the daemon's).
    pub(crate) fn owner_uid(&self) -> u32 {
        self.uid
    }

    /// The device's size now (a live `resize` shows once the kernel's
    /// attribute cache, [`TTL`], expires).
    fn size(&self) -> u64 {
        self.view.size()
    }

    pub(crate) fn attr(&self, ino: INodeNo) -> FileAttr {
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

    pub(crate) fn lookup(&self, parent: INodeNo, name: &[u8]) -> Result<FileAttr, Errno> {
        if parent == ROOT && name == self.cfg.file_name.as_bytes() {
            Ok(self.attr(FILE))
        } else {
            Err(Errno::ENOENT)
        }
    }

    pub(crate) fn getattr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        match ino {
            ROOT | FILE => Ok(self.attr(ino)),
            _ => Err(Errno::ENOENT),
        }
    }

    /// `setattr`: only a size equal to the device's is accepted (the size
    /// follows the device, `ucrypt resize`; O_TRUNC-style resizes through
    /// the file are refused); the rest is ignored.
    pub(crate) fn setattr(&self, ino: INodeNo, size: Option<u64>) -> Result<FileAttr, Errno> {
        if ino != FILE && ino != ROOT {
            return Err(Errno::ENOENT);
        }
        if size.is_some_and(|s| s != self.size()) {
            return Err(Errno::EPERM);
        }
        Ok(self.attr(ino))
    }

    /// `open` with the open(2) flags; `Ok(true)`: serve it with FUSE's
    /// `direct_io` (an `O_DIRECT` open: no page cache).
    pub(crate) fn open(&self, ino: INodeNo, flags: i32) -> Result<bool, Errno> {
        if ino != FILE {
            return Err(Errno::EISDIR);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            if let Err(e) = self.view.check_op(OpKind::Write, 0) {
                return Err(errno(&e));
            }
        }
        Ok(flags & libc::O_DIRECT != 0)
    }

    pub(crate) fn statfs(&self) -> Statfs {
        let bs = self.sector.max(4096);
        Statfs {
            blocks: self.size() / bs,
            files: 2,
            bsize: bs as u32,
            namelen: 255,
        }
    }

    /// The root's entries from `offset` on: `(inode, next offset, type,
    /// name)`.
    pub(crate) fn readdir(
        &self,
        ino: INodeNo,
        offset: u64,
    ) -> Result<Vec<(INodeNo, u64, FileType, &str)>, Errno> {
        if ino != ROOT {
            return Err(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.cfg.file_name.as_str()),
        ];
        Ok(entries
            .into_iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (ino, kind, name))| (ino, (i + 1) as u64, kind, name))
            .collect())
    }

    /// Reads `size` bytes at `offset` (clipped at the end of the device).
    pub(crate) fn read(
        &self,
        ino: INodeNo,
        offset: u64,
        size: u32,
        done: impl FnOnce(Result<Vec<u8>, Errno>) + Send + 'static,
    ) {
        if ino != FILE {
            return done(Err(Errno::EISDIR));
        }
        let end = self.size();
        if offset >= end || size == 0 {
            return done(Ok(Vec::new()));
        }
        let len = u64::from(size).min(end - offset);
        if !self.aligned(offset, len) {
            let engine = Arc::clone(&self.engine);
            let sector = self.sector;
            return spawn_helper(done, move || read_unaligned(&engine, sector, offset, len));
        }
        let req = IoRequest {
            op: Op::Read { len: len as u32 },
            offset,
            fua: false,
        };
        self.engine.submit(req, move |res| match res {
            Ok(Some(d)) => done(Ok(d)),
            Ok(None) => done(Err(Errno::EIO)),
            Err(e) => done(Err(errno(&e))),
        });
    }

    /// Writes `data` at `offset`; `open_flags` are the file's open(2)
    /// flags (`O_SYNC`/`O_DSYNC`: FUA). Answers the bytes written.
    pub(crate) fn write(
        &self,
        ino: INodeNo,
        offset: u64,
        data: &[u8],
        open_flags: i32,
        done: impl FnOnce(Result<u32, Errno>) + Send + 'static,
    ) {
        if ino != FILE {
            return done(Err(Errno::EISDIR));
        }
        if let Err(e) = self.view.check_op(OpKind::Write, data.len() as u64) {
            return done(Err(errno(&e)));
        }
        if data.is_empty() {
            return done(Ok(0));
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
            return done(Err(errno(&e)));
        }
        let data = data[..len].to_vec();
        let fua = open_flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let engine = Arc::clone(&self.engine);
        let gate = Arc::clone(&self.gate);
        if !self.aligned(offset, len as u64) {
            let sector = self.sector;
            return spawn_helper(done, move || {
                gate.exclusive(|| rmw(&engine, sector, offset, &data, fua))
                    .map(|()| len as u32)
            });
        }
        let req = IoRequest {
            op: Op::Write { data },
            offset,
            fua,
        };
        let submit = move |engine: &Engine, gate: Arc<WriteGate>| {
            engine.submit(req, move |res| {
                gate.leave();
                match res {
                    Ok(_) => done(Ok(len as u32)),
                    Err(e) => done(Err(errno(&e))),
                }
            })
        };
        if gate.try_enter() {
            submit(&engine, gate);
        } else {
            // A read-modify-write holds the gate: wait for it elsewhere.
            let spawned = std::thread::Builder::new()
                .name("ucrypt-fuse-rmw".into())
                .spawn(move || {
                    gate.enter();
                    submit(&engine, gate);
                });
            if let Err(e) = spawned {
                // The closure (and `done`) went with the failed spawn; the
                // kernel's request is answered when `done` drops. Nothing
                // else can be done without a thread.
                drop(e);
            }
        }
    }

    /// `fsync`: an engine flush.
    pub(crate) fn fsync(&self, done: impl FnOnce(Result<(), Errno>) + Send + 'static) {
        let req = IoRequest {
            op: Op::Flush,
            offset: 0,
            fua: false,
        };
        self.engine.submit(req, move |res| match res {
            Ok(_) => done(Ok(())),
            Err(e) => done(Err(errno(&e))),
        });
    }

    /// `fallocate`: punch-hole is a discard, zero-range a write-zeroes,
    /// plain preallocation a no-op inside the device.
    pub(crate) fn fallocate(
        &self,
        ino: INodeNo,
        offset: u64,
        length: u64,
        mode: i32,
        done: impl FnOnce(Result<(), Errno>) + Send + 'static,
    ) {
        if ino != FILE {
            return done(Err(Errno::EISDIR));
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
            return done(Err(Errno::EOPNOTSUPP));
        };
        // Refused as the engine refuses the sectors they cover (the size
        // is fixed: growing is impossible); a preallocation is refused as
        // a write-zeroes is (a write's errno, and no request-size limit).
        let (start, whole) = self.widen(offset, length);
        if let Err(e) = self
            .view
            .check(kind.unwrap_or(OpKind::WriteZeroes), start, whole)
        {
            return done(Err(errno(&e)));
        }
        let Some(kind) = kind else {
            // Everything inside the device is already allocated.
            return done(Ok(()));
        };
        // Only whole sectors; the kernel (loop) falls back to writing zeroes.
        if !self.aligned(offset, length) || length > u64::from(u32::MAX) / 2 {
            return done(Err(Errno::EOPNOTSUPP));
        }
        let len = length as u32;
        let op = match kind {
            OpKind::Discard => Op::Discard { len },
            _ => Op::WriteZeroes { len },
        };
        let req = IoRequest {
            op,
            offset,
            fua: false,
        };
        let gate = Arc::clone(&self.gate);
        let engine = Arc::clone(&self.engine);
        let submit = move || {
            engine.submit(req, move |res| {
                gate.leave();
                match res {
                    Ok(_) => done(Ok(())),
                    Err(e) => done(Err(errno(&e))),
                }
            })
        };
        if self.gate.try_enter() {
            submit();
        } else {
            let gate = Arc::clone(&self.gate);
            let _ = std::thread::Builder::new()
                .name("ucrypt-fuse-rmw".into())
                .spawn(move || {
                    gate.enter();
                    submit();
                });
        }
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

/// Runs blocking `work` on a helper thread and answers its result; if no
/// thread can be made, answers `EIO` at once.
fn spawn_helper<T: Send + 'static>(
    done: impl FnOnce(Result<T, Errno>) + Send + 'static,
    work: impl FnOnce() -> Result<T, Errno> + Send + 'static,
) {
    // The answer goes through a slot so a failed spawn can still answer.
    let slot = Arc::new(Mutex::new(Some(done)));
    let theirs = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("ucrypt-fuse-rmw".into())
        .spawn(move || {
            let r = work();
            if let Some(done) = theirs.lock().unwrap_or_else(|e| e.into_inner()).take() {
                done(r);
            }
        });
    if spawned.is_err() {
        if let Some(done) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            done(Err(Errno::EIO));
        }
    }
}

/// Blocking read of an arbitrary (clipped) range, widened to sectors.
fn read_unaligned(engine: &Engine, sector: u64, offset: u64, len: u64) -> Result<Vec<u8>, Errno> {
    let start = offset / sector * sector;
    let end = (offset + len).div_ceil(sector) * sector;
    let mut all = engine
        .read(
            start,
            u32::try_from(end - start).map_err(|_| Errno::EINVAL)?,
        )
        .map_err(|e| errno(&e))?;
    all.truncate((offset + len - start) as usize);
    Ok(all.split_off((offset - start) as usize))
}

/// Read-modify-write of the sectors `data` at `offset` touches.
fn rmw(engine: &Engine, sector: u64, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno> {
    let start = offset / sector * sector;
    let end = (offset + data.len() as u64).div_ceil(sector) * sector;
    let mut buf = engine
        .read(
            start,
            u32::try_from(end - start).map_err(|_| Errno::EINVAL)?,
        )
        .map_err(|e| errno(&e))?;
    let at = (offset - start) as usize;
    buf[at..at + data.len()].copy_from_slice(data);
    engine.write(start, buf, fua).map_err(|e| errno(&e))
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
