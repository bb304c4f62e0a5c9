//! `RbdBackend`: a Ceph RBD image (or snapshot) over librbd.
//!
//! ```text
//!   read_at / write_at / read_batch / write_batch / flush / discard
//!        │  one batch = every entry submitted with rbd_aio_*, then one wait
//!        ▼
//!   ffi::Image::run ──► librbd ──► OSDs       completion callbacks (librbd's
//!        ▲                                    finisher thread) count the
//!        └────────── woken by the last ───────batch down and wake the caller
//! ```
//!
//! # Opening
//!
//! `rbd:POOL/IMAGE[@SNAP]` ([`RbdSpec`]) with the [`RbdConfig`] the caller
//! passes (ceph.conf, client id, keyring). Connecting is bounded: unless
//! ceph.conf sets them, `client_mount_timeout` and `rados_mon_op_timeout`
//! are [`DEFAULT_TIMEOUT`] (or [`RbdConfig::timeout`]), so a cluster that
//! does not answer fails the open with a timeout naming the image.
//!
//! # Exclusive lock
//!
//! A read-write open requires the image feature `exclusive-lock` and takes
//! the lock explicitly (`rbd_lock_acquire(EXCLUSIVE)`) for its lifetime:
//! librbd then refuses it to every other client instead of handing it
//! over, so a second read-write open anywhere fails with
//! [`ErrorKind::Locked`] (the cli's exit 5, as for a busy device). A
//! snapshot is always opened read-only and takes no lock.
//!
//! # Completing as the IO completes
//!
//! [`Backend::submit_async`] starts each read or write with `rbd_aio_*`
//! on a buffer the operation owns and returns. librbd's callback (its
//! finisher thread) only hands the result to this backend's completion
//! thread, which runs the entry's callback: a callback may then do
//! anything but wait for this backend's IO (it could not on librbd's own
//! thread, which delivers the completions such a wait needs). A FUA write
//! is flushed there before its callback. The thread exits once the
//! backend is dropped and every entry has completed.
//!
//! # Durability and space
//!
//! FUA is a write then `rbd_aio_flush` (librbd has no per-write FUA):
//! `can_fua` is false. Discard is `rbd_aio_discard` with
//! `rbd_skip_partial_discard = false`, so a discarded range reads back
//! zero as the trait's emulation promises; write-zeroes is
//! `rbd_aio_write_zeroes`.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use crate::{check_range, AsyncKind, AsyncOp, Backend, Caps, Error, ErrorKind, ReadOp, WriteOp};

mod ffi;
mod spec;

use ffi::{Aio, Cluster, Image, Step};
pub use spec::{is_rbd, RbdConfig, RbdSpec, DEFAULT_TIMEOUT, PREFIX};

/// How to open an image.
#[derive(Debug, Clone, Default)]
pub struct RbdOptions {
    /// Open read-only (no exclusive lock, writes refused).
    pub read_only: bool,
    /// Discards go to librbd; else they are refused by the caps (and the
    /// provided emulation writes zeroes).
    pub allow_discard: bool,
    /// Fail the open when the image is smaller than this many bytes.
    pub min_size: u64,
}

/// A Ceph RBD image accessed through librbd's asynchronous API.
pub struct RbdBackend {
    spec: RbdSpec,
    image: Arc<Image>,
    /// The completion thread of [`Backend::submit_async`], started on
    /// first use.
    done: Mutex<Option<Completer>>,
    /// Bytes addressable; re-read by [`Backend::refresh_size`].
    size: AtomicU64,
    read_only: bool,
    allow_discard: bool,
}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("spec", &self.spec)
            .field("size", &self.size())
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl RbdBackend {
    /// Opens `spec` reaching the cluster as `cfg` says.
    pub fn open_with(spec: &RbdSpec, opts: &RbdOptions, cfg: &RbdConfig) -> Result<Self, Error> {
        let shown = spec.to_string();
        let open_err = |e: io::Error| {
            Error::new(ErrorKind::Open {
                path: shown.clone(),
            })
            .with_source(e)
        };
        let read_only = opts.read_only || spec.snap.is_some();
        if spec.snap.is_some() && !opts.read_only {
            return Err(Error::new(ErrorKind::ReadOnly)
                .with_context(format!("{shown} is a snapshot: open it read-only")));
        }
        let timeout = cfg
            .timeout
            .unwrap_or(DEFAULT_TIMEOUT)
            .as_secs()
            .max(1)
            .to_string();
        let mut settings = vec![
            ("client_mount_timeout", timeout.clone()),
            ("rados_mon_op_timeout", timeout.clone()),
            ("rbd_skip_partial_discard", "false".to_owned()),
            // ucrypt reports failures itself, naming the image; librbd's own
            // log lines on stderr would only repeat them.
            ("log_to_stderr", "false".to_owned()),
            ("err_to_stderr", "false".to_owned()),
        ];
        if let Some(k) = &cfg.keyring {
            settings.push(("keyring", k.display().to_string()));
        }
        let conf = cfg.conf.as_ref().map(|c| c.display().to_string());
        let cluster = Cluster::connect(
            cfg.id.as_deref(),
            conf.as_deref(),
            &settings,
            &["client_mount_timeout", "rados_mon_op_timeout"],
        )
        .map_err(|(step, e)| match step {
            Step::Library => Error::new(ErrorKind::Unsupported(
                "librbd (Debian package librbd1) is needed for rbd: devices",
            ))
            .with_source(e)
            .with_context(shown.clone()),
            Step::Configure => open_err(e).with_context("invalid Ceph client settings"),
            Step::ReadConf => open_err(e).with_context(match &conf {
                Some(c) => format!("cannot read Ceph configuration {c}"),
                None => "no Ceph configuration found (give --ceph-conf)".to_owned(),
            }),
            Step::Connect(bound) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                // "3" or "3.000000": the seconds as ceph.conf would write them.
                let secs = bound
                    .as_deref()
                    .map_or(timeout.as_str(), |b| match b.split_once('.') {
                        Some((whole, frac)) if frac.bytes().all(|c| c == b'0') => whole,
                        _ => b,
                    });
                open_err(e).with_context(format!("the Ceph cluster did not answer within {secs} s"))
            }
            Step::Connect(_) => open_err(e).with_context("cannot connect to the Ceph cluster"),
        })?;
        let mut image = Image::open(
            std::sync::Arc::new(cluster),
            &spec.pool,
            &spec.image,
            spec.snap.as_deref(),
            read_only,
        )
        .map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ENOENT) => "no such pool, image or snapshot",
                Some(libc::EACCES) | Some(libc::EPERM) => "access denied by the cluster",
                _ => "cannot open the image",
            };
            open_err(e).with_context(why)
        })?;
        if !read_only {
            let features = image.features().map_err(open_err)?;
            if features & ffi::FEATURE_EXCLUSIVE_LOCK == 0 {
                return Err(Error::new(ErrorKind::Open {
                    path: shown.clone(),
                })
                .with_context(format!(
                    "read-write use needs the image feature exclusive-lock \
                         (rbd feature enable {}/{} exclusive-lock)",
                    spec.pool, spec.image
                )));
            }
            image.lock_exclusive().map_err(|e| match e.raw_os_error() {
                Some(libc::EROFS) | Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                    Error::new(ErrorKind::Locked {
                        path: shown.clone(),
                        holder: "another Ceph client".into(),
                    })
                    .with_source(e)
                }
                _ => open_err(e).with_context("cannot take the exclusive lock"),
            })?;
        }
        let size = image.size().map_err(open_err)?;
        if size < opts.min_size {
            return Err(Error::new(ErrorKind::TooSmall {
                path: shown,
                size,
                required: opts.min_size,
            }));
        }
        Ok(Self {
            spec: spec.clone(),
            image: Arc::new(image),
            done: Mutex::new(None),
            size: AtomicU64::new(size),
            read_only,
            allow_discard: opts.allow_discard,
        })
    }

    /// The image (and snapshot) it was opened with.
    pub fn spec(&self) -> &RbdSpec {
        &self.spec
    }

    /// Whether writes are refused (read-only open or a snapshot).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn io_err(&self, what: &str, offset: u64, e: io::Error) -> io::Error {
        Error::new(ErrorKind::Io {
            path: self.spec.to_string(),
        })
        .with_source(e)
        .with_context(format!("{what} at offset {offset} failed"))
        .into()
    }

    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(Error::new(ErrorKind::ReadOnly).into());
        }
        Ok(())
    }

    fn run_one(&self, op: Aio<'_>) -> io::Result<usize> {
        let mut ops = [op];
        self.image.run(&mut ops).pop().unwrap_or(Ok(0))
    }

    /// A sender to the completion thread, starting it if needed.
    fn completer(&self) -> io::Result<mpsc::Sender<Job>> {
        let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let thread = std::thread::Builder::new()
                .name("ucrypt-rbd-aio".into())
                .spawn(move || {
                    crate::mark_completion_thread();
                    // Ends once every sender is gone: the backend's, and
                    // each one an entry in flight holds.
                    for job in rx {
                        job();
                    }
                })?;
            *g = Some(Completer { tx, thread });
        }
        // Invariant: set just above.
        Ok(g.as_ref().expect("completer started").tx.clone())
    }

    /// Starts one entry of [`Backend::submit_async`]; an entry refused at
    /// once gets its error back.
    fn start(&self, op: AsyncOp, tx: mpsc::Sender<Job>) -> Result<(), (AsyncOp, io::Error)> {
        let len = op.buf.len();
        let (write, fua) = match op.kind {
            AsyncKind::Read => (false, false),
            AsyncKind::Write { fua } => (true, fua),
        };
        let refused = check_range(self.size(), op.offset, len as u64).and_then(|()| match write {
            true => self.writable(),
            false => Ok(()),
        });
        if let Err(e) = refused {
            return Err((op, e));
        }
        let AsyncOp {
            kind,
            offset,
            buf,
            done,
        } = op;
        let image = self.image.clone();
        let spec = self.spec.to_string();
        let then: ffi::Then = Box::new(move |buf, r| {
            // On librbd's thread: hand over, never run the callback here.
            let job: Job = Box::new(move || {
                let what = if write { "write" } else { "read" };
                let err = |e: io::Error| -> io::Error {
                    Error::new(ErrorKind::Io { path: spec })
                        .with_source(e)
                        .with_context(format!("{what} at offset {offset} failed"))
                        .into()
                };
                let res = if r < 0 {
                    Err(err(io::Error::from_raw_os_error(-r as i32)))
                } else if !write && r as usize != len {
                    Err(Error::new(ErrorKind::ShortRead {
                        offset: offset + r as u64,
                    })
                    .into())
                } else if fua {
                    let mut f = [Aio::Flush];
                    match image.run(&mut f).pop().unwrap_or(Ok(0)) {
                        Ok(_) => Ok(()),
                        Err(e) => Err(err(e)),
                    }
                } else {
                    Ok(())
                };
                let op = AsyncOp {
                    kind,
                    offset,
                    buf,
                    done,
                };
                // A panicking callback was reported by the panic hook; it
                // must not end the thread every other entry completes on.
                drop(op.finish(res));
            });
            // The receiver lives while this sender does.
            let _ = tx.send(job);
        });
        self.image.start(write, offset, buf, then);
        Ok(())
    }
}

/// Work for the completion thread.
type Job = Box<dyn FnOnce() + Send>;

/// The completion thread of [`Backend::submit_async`] and its sender.
struct Completer {
    tx: mpsc::Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        // Entries in flight hold senders: the thread ends after the last
        // of them completed. Joined unless this drop runs on it (the last
        // reference can go with a callback).
        let c = self
            .done
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(Completer { tx, thread }) = c {
            drop(tx);
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Backend for RbdBackend {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn io_path(&self) -> crate::IoPath {
        crate::IoPath {
            engine: "librbd".into(),
            ..crate::IoPath::default()
        }
    }

    /// `rbd resize` of an open image: the resize either ran in this
    /// process (the exclusive-lock owner performs it for the requesting
    /// client) or reached librbd's header watch, and `rbd_get_size`
    /// refreshes the image header first when it is stale.
    fn refresh_size(&self) -> io::Result<u64> {
        let size = self.image.size().map_err(|e| {
            io::Error::from(
                Error::new(ErrorKind::Io {
                    path: self.spec.to_string(),
                })
                .with_source(e)
                .with_context("cannot read the image size"),
            )
        })?;
        self.size.store(size, Ordering::Relaxed);
        Ok(size)
    }

    fn caps(&self) -> Caps {
        Caps {
            can_discard: self.allow_discard && !self.read_only,
            can_fua: false,
            can_write_zeroes: true,
        }
    }

    /// Every entry of a batch is an `rbd_aio_*` in flight at once.
    fn batches(&self) -> bool {
        true
    }

    fn completes_async(&self) -> bool {
        true
    }

    fn submit_async(&self, ops: Vec<AsyncOp>) {
        let tx = match self.completer() {
            Ok(tx) => tx,
            Err(_) => return crate::run_async_inline(self, ops),
        };
        let mut refused = Vec::new();
        for op in ops {
            if let Err(r) = self.start(op, tx.clone()) {
                refused.push(r);
            }
        }
        let mut panicked = None;
        for (op, e) in refused {
            panicked = panicked.or(op.finish(Err(e)));
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut ops = [ReadOp { buf, offset }];
        self.read_batch(&mut ops).pop().unwrap_or(Ok(()))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_batch(&[WriteOp { buf, offset, fua }])
            .pop()
            .unwrap_or(Ok(()))
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.run_one(Aio::Flush)
            .map(drop)
            .map_err(|e| self.io_err("flush", 0, e))
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range(self.size(), offset, len)?;
        if !self.allow_discard {
            return self.write_zeroes(offset, len);
        }
        self.run_one(Aio::Discard(offset, len))
            .map(drop)
            .map_err(|e| self.io_err("discard", offset, e))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range(self.size(), offset, len)?;
        // librbd takes a size_t; 1 GiB pieces keep each request bounded.
        let mut ops: Vec<Aio<'_>> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(1 << 30);
            ops.push(Aio::WriteZeroes(at, n));
            at += n;
        }
        for r in self.image.run(&mut ops) {
            r.map_err(|e| self.io_err("write-zeroes", offset, e))?;
        }
        Ok(())
    }

    fn read_batch(&self, ops: &mut [ReadOp<'_>]) -> Vec<io::Result<()>> {
        let checks: Vec<io::Result<()>> = ops
            .iter()
            .map(|o| check_range(self.size(), o.offset, o.buf.len() as u64))
            .collect();
        let offsets: Vec<(u64, usize)> = ops.iter().map(|o| (o.offset, o.buf.len())).collect();
        let mut aio: Vec<Aio<'_>> = ops
            .iter_mut()
            .zip(&checks)
            .filter(|(_, c)| c.is_ok())
            .map(|(o, _)| Aio::Read(&mut *o.buf, o.offset))
            .collect();
        let mut done = self.image.run(&mut aio).into_iter();
        checks
            .into_iter()
            .zip(offsets)
            .map(|(c, (offset, len))| {
                c?;
                match done.next().unwrap_or(Ok(len)) {
                    Ok(n) if n == len => Ok(()),
                    Ok(n) => Err(Error::new(ErrorKind::ShortRead {
                        offset: offset + n as u64,
                    })
                    .into()),
                    Err(e) => Err(self.io_err("read", offset, e)),
                }
            })
            .collect()
    }

    fn write_batch(&self, ops: &[WriteOp<'_>]) -> Vec<io::Result<()>> {
        if self.read_only {
            return ops
                .iter()
                .map(|_| Err(Error::new(ErrorKind::ReadOnly).into()))
                .collect();
        }
        let checks: Vec<io::Result<()>> = ops
            .iter()
            .map(|o| check_range(self.size(), o.offset, o.buf.len() as u64))
            .collect();
        let mut aio: Vec<Aio<'_>> = ops
            .iter()
            .zip(&checks)
            .filter(|(_, c)| c.is_ok())
            .map(|(o, _)| Aio::Write(o.buf, o.offset))
            .collect();
        let mut done = self.image.run(&mut aio).into_iter();
        let mut results: Vec<io::Result<()>> = checks
            .into_iter()
            .zip(ops)
            .map(|(c, o)| {
                c?;
                match done.next().unwrap_or(Ok(0)) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(self.io_err("write", o.offset, e)),
                }
            })
            .collect();
        // FUA: one flush after the batch, before any FUA entry is reported.
        if ops.iter().zip(&results).any(|(o, r)| o.fua && r.is_ok()) {
            if let Err(e) = self.flush() {
                for (o, r) in ops.iter().zip(results.iter_mut()) {
                    if o.fua && r.is_ok() {
                        *r = Err(io::Error::new(e.kind(), e.to_string()));
                    }
                }
            }
        }
        results
    }
}
