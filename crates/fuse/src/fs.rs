//! The /dev/fuse transport: fuser's session threads call this
//! [`Filesystem`], which answers through [`Ops`] (shared with the io_uring
//! queues of `uring.rs`). It also answers INIT, asking for
//! `FUSE_OVER_IO_URING` when the queues are ready to register, and
//! whatever the kernel keeps sending over /dev/fuse once they are
//! (forgets, interrupts).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

use crate::ops::{Ops, TTL};

/// Most bytes one read or write request carries (`max_write`; reads are
/// held to it too through `max_pages`).
pub(crate) const MAX_WRITE: u32 = 1 << 20;

pub(crate) struct Fs {
    ops: Arc<Ops>,
    /// Ask for `FUSE_OVER_IO_URING` at INIT.
    want_uring: bool,
    /// Set at INIT when the kernel agreed to it.
    uring: Arc<AtomicBool>,
}

impl Fs {
    pub(crate) fn new(ops: Arc<Ops>, want_uring: bool, uring: Arc<AtomicBool>) -> Self {
        Self {
            ops,
            want_uring,
            uring,
        }
    }
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Let direct IO (loop --direct-io=on, O_DIRECT) run several
        // requests in parallel instead of one at a time.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(64);
        let _ = config.set_max_write(MAX_WRITE);
        // Only offered by the kernel when its `enable_uring` is on.
        if self.want_uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok()
        {
            self.uring.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.ops.lookup(parent, name.as_bytes()) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.ops.getattr(ino) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
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
        match self.ops.setattr(ino, size) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.open(ino, flags.0) {
            Ok(direct) => {
                let mut f = FopenFlags::empty();
                if direct {
                    f |= FopenFlags::FOPEN_DIRECT_IO;
                }
                reply.opened(FileHandle(0), f)
            }
            Err(e) => reply.error(e),
        }
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
        self.ops.read(ino, offset, size, move |r| match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
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
        self.ops
            .write(ino, offset, data, flags.0, move |r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
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
        self.ops.fsync(move |r| match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
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
        match self.ops.readdir(ino, offset) {
            Ok(entries) => {
                for (ino, next, kind, name) in entries {
                    if reply.add(ino, next, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.ops.statfs();
        reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.bsize);
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
        self.ops
            .fallocate(ino, offset, length, mode, move |r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            });
    }
}
