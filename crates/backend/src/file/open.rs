//! Opening a file or block device: the exclusive claim or advisory lock,
//! the size check, the O_DIRECT descriptor and its alignment, the IO
//! engine and whether the descriptors take nowait IO.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

use super::blockdev::{blockdev_discards, blockdev_logical_block, blockdev_size};
use super::dio::{self, statx_dio_align};
use super::{lock, sync, uring, DirectIo, FileBackend, FileOptions, IoEngine};
use crate::{Error, ErrorKind};

impl FileBackend {
    /// Opens `path` (a regular file or block device).
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let shown = path.display().to_string();
        let open_err = |e: io::Error| {
            Error::new(ErrorKind::Open {
                path: shown.clone(),
            })
            .with_source(e)
        };
        let mut oo = OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        let mut buffered = oo.open(&path).map_err(open_err)?;
        let meta = buffered.metadata().map_err(open_err)?;
        let is_blockdev = meta.file_type().is_block_device();
        if is_blockdev && opts.exclusive {
            // The claim lives as long as this descriptor; the O_DIRECT one
            // below is a plain open, which an exclusive claim allows.
            buffered = lock::open_exclusive(&oo, &path).map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => Error::new(ErrorKind::InUse {
                    path: shown.clone(),
                }),
                _ => open_err(e).with_context("exclusive open refused"),
            })?;
        }
        if !is_blockdev && !meta.is_file() {
            return Err(Error::new(ErrorKind::NotABlockDevice { path: shown }));
        }
        if !is_blockdev {
            // Block devices are claimed with O_EXCL above; files get an
            // advisory OFD lock held by `buffered` for our lifetime.
            if let Some(h) =
                lock::try_lock(buffered.as_raw_fd(), !opts.read_only).map_err(open_err)?
            {
                return Err(Error::new(ErrorKind::Locked {
                    path: shown,
                    holder: h.to_string(),
                }));
            }
        }
        let size = if is_blockdev {
            blockdev_size(&buffered).map_err(open_err)?
        } else {
            meta.len()
        };
        if size < opts.min_size {
            return Err(Error::new(ErrorKind::TooSmall {
                path: shown,
                size,
                required: opts.min_size,
            }));
        }
        let direct = match opts.direct {
            DirectIo::Never => None,
            DirectIo::Auto => oo.clone().custom_flags(libc::O_DIRECT).open(&path).ok(),
            DirectIo::Required => Some(
                oo.clone()
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)
                    .map_err(|e| open_err(e).with_context("O_DIRECT required but refused"))?,
            ),
        };
        let dio_align = match &direct {
            Some(_) if is_blockdev => blockdev_logical_block(&buffered).unwrap_or(4096),
            Some(_) => statx_dio_align(&path).unwrap_or(4096),
            None => 0,
        };
        let engine = match opts.engine {
            Some(IoEngine::Syscalls) => IoEngine::Syscalls,
            Some(IoEngine::Uring) => {
                uring::probe().map_err(|e| {
                    if uring::refused(&e) {
                        Error::new(ErrorKind::IoUringUnavailable {
                            path: shown.clone(),
                        })
                        .with_source(e)
                    } else {
                        open_err(e).with_context("io_uring setup failed")
                    }
                })?;
                IoEngine::Uring
            }
            None | Some(IoEngine::Auto) if uring::probe().is_ok() => IoEngine::Uring,
            None | Some(IoEngine::Auto) => IoEngine::Syscalls,
        };
        let nowait = nowait_files(&buffered, direct.as_ref(), dio_align);
        // Lending suits the automatic engine only: an explicit engine
        // means its syscalls (the file bench compares exactly those).
        let auto = matches!(opts.engine, None | Some(IoEngine::Auto));
        let mapped = (auto && !is_blockdev && opts.direct != DirectIo::Required)
            .then(|| super::mapped::Mapped::new(&buffered, size, !opts.read_only))
            .flatten();
        let discard_ok = opts.allow_discard && (!is_blockdev || blockdev_discards(&buffered));
        Ok(Self {
            path,
            buffered,
            direct,
            dio_align,
            nowait,
            is_blockdev,
            size: AtomicU64::new(size),
            opts: opts.clone(),
            engine,
            discard_ok: AtomicBool::new(discard_ok),
            zero_range_ok: AtomicBool::new(true),
            punch_ok: AtomicBool::new(true),
            stats: Arc::default(),
            aio: OnceLock::new(),
            mapped,
        })
    }
}

/// True when every descriptor IO goes through takes nowait IO
/// ([`sync::takes_nowait`]), so io_uring completes what does not block in
/// `io_uring_enter` instead of handing it to an io-wq worker thread.
fn nowait_files(buffered: &File, direct: Option<&File>, dio_align: u64) -> bool {
    let mut b = [0u8; 1];
    if !sync::takes_nowait(buffered.as_raw_fd(), &mut b) {
        return false;
    }
    let Some(d) = direct else { return true };
    let a = dio_align.max(512) as usize;
    dio::AlignedBuf::new(a, a)
        .is_ok_and(|mut b| sync::takes_nowait(d.as_raw_fd(), b.as_mut_slice()))
}
