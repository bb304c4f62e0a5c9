//! The one place ucrypt calls librados/librbd: safe handles over the
//! generated bindings (`sys.rs`), every `unsafe` block with its SAFETY note.
//!
//! librbd is opened at run time (`dlopen("librbd.so.1")` through
//! libloading, once per process), not linked: building ucrypt needs no
//! Ceph package, and a host without `librbd1` gets a clear error when it
//! names an `rbd:` device instead of a binary that does not start. The
//! `rados_*` symbols resolve through librbd's own dependency on librados.
//!
//! IO is asynchronous: [`Image::run`] submits every operation of a batch
//! with `rbd_aio_*` (each with a completion whose callback, on librbd's
//! finisher thread, records the result in the batch and wakes the
//! submitter once the last one lands), then waits. Buffers are borrowed
//! for the whole call and `run` never returns before librbd has completed
//! every operation it accepted, which is what keeps them alive.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::ptr;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

#[allow(
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
#[path = "sys.rs"]
#[rustfmt::skip]
mod sys;

/// The shared library's file name (Debian's `librbd1`).
pub(super) const LIBRARY: &str = "librbd.so.1";

/// librbd's `RBD_FEATURE_EXCLUSIVE_LOCK` (`rbd/features.h`).
pub(super) const FEATURE_EXCLUSIVE_LOCK: u64 = sys::RBD_FEATURE_EXCLUSIVE_LOCK as u64;

fn lib() -> io::Result<&'static sys::Lib> {
    static LIB: OnceLock<Result<sys::Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: loading librbd runs its (and librados's) initialisers,
        // which only set up their own state; every symbol the bindings
        // declare is required, so a mismatching library fails here rather
        // than at a call.
        unsafe { sys::Lib::new(LIBRARY) }.map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| io::Error::new(io::ErrorKind::Unsupported, format!("{LIBRARY}: {e}")))
}

/// A negative errno from librados/librbd as an [`io::Error`].
fn check(r: c_int) -> io::Result<c_int> {
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(r)
    }
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// A connected RADOS cluster handle (`rados_t`).
pub(super) struct Cluster {
    raw: sys::rados_t,
}

// SAFETY: a rados_t is an internally locked client object; librados allows
// its use from any thread.
unsafe impl Send for Cluster {}
// SAFETY: as above, concurrent calls on one rados_t are allowed.
unsafe impl Sync for Cluster {}

/// Which step of connecting failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// librbd could not be loaded.
    Library,
    /// Creating the handle or applying settings.
    Configure,
    /// Reading ceph.conf.
    ReadConf,
    /// Reaching the monitors and authenticating, bounded by
    /// `client_mount_timeout` (its value, in seconds).
    Connect(Option<String>),
}

impl Cluster {
    /// Creates a handle for `client.<id>`, applies `settings` (name, value;
    /// applied before and after reading `conf` so they win over it except
    /// where `keep_conf` says ceph.conf's own value is kept), reads `conf`
    /// (librados's search path if `None`) and connects.
    pub(super) fn connect(
        id: Option<&str>,
        conf: Option<&str>,
        settings: &[(&str, String)],
        keep_conf: &[&str],
    ) -> Result<Self, (Step, io::Error)> {
        let lib = lib().map_err(|e| (Step::Library, e))?;
        let cfg = |e| (Step::Configure, e);
        let name = cstring(&format!("client.{}", id.unwrap_or("admin"))).map_err(cfg)?;
        let cluster_name = cstring("ceph").map_err(cfg)?;
        let mut raw: sys::rados_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; both strings are
        // NUL-terminated and outlive the call (librados copies them).
        check(unsafe { lib.rados_create2(&mut raw, cluster_name.as_ptr(), name.as_ptr(), 0) })
            .map_err(cfg)?;
        // From here `Drop` shuts the handle down on every error path.
        let c = Cluster { raw };
        let conf_c = conf.map(cstring).transpose().map_err(cfg)?;
        let path = conf_c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: `raw` is a live handle; `path` is NULL (search the
        // default locations) or a NUL-terminated string alive for the call.
        check(unsafe { lib.rados_conf_read_file(c.raw, path) }).map_err(|e| (Step::ReadConf, e))?;
        for (k, v) in settings {
            if keep_conf.contains(k) && c.get(k).is_some_and(|cur| !is_default(k, &cur)) {
                continue;
            }
            c.set(k, v).map_err(cfg)?;
        }
        // SAFETY: `raw` is a live, configured, not yet connected handle.
        check(unsafe { lib.rados_connect(c.raw) })
            .map_err(|e| (Step::Connect(c.get("client_mount_timeout")), e))?;
        Ok(c)
    }

    fn set(&self, k: &str, v: &str) -> io::Result<()> {
        let (k, v) = (cstring(k)?, cstring(v)?);
        // SAFETY: live handle; both strings NUL-terminated for the call.
        check(unsafe { lib()?.rados_conf_set(self.raw, k.as_ptr(), v.as_ptr()) }).map(drop)
    }

    fn get(&self, k: &str) -> Option<String> {
        let k = cstring(k).ok()?;
        let mut buf = [0u8; 256];
        // SAFETY: live handle; `buf` is writable for its whole length, which
        // is what we pass, and librados NUL-terminates what it writes.
        let r = unsafe {
            lib()
                .ok()?
                .rados_conf_get(self.raw, k.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        };
        check(r).ok()?;
        CStr::from_bytes_until_nul(&buf)
            .ok()
            .map(|s| s.to_string_lossy().into_owned())
    }
}

/// Whether `value` is librados's built-in default for `key` (so ceph.conf
/// did not set it).
fn is_default(key: &str, value: &str) -> bool {
    match key {
        "client_mount_timeout" => value == "300" || value == "300.000000",
        "rados_mon_op_timeout" => value == "0" || value == "0.000000",
        _ => false,
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: `raw` came from rados_create2 and every ioctx and
            // image on it holds an `Arc<Cluster>`, so none outlives it.
            unsafe { lib.rados_shutdown(self.raw) };
        }
    }
}

/// An open image (`rbd_image_t`) with the pool context and cluster it
/// lives on.
pub(super) struct Image {
    raw: sys::rbd_image_t,
    ioctx: sys::rados_ioctx_t,
    locked: bool,
    _cluster: Arc<Cluster>,
}

// SAFETY: librbd's ImageCtx is internally locked; its API (aio submission,
// size, flush) may be called from any thread and concurrently.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Image {
    /// Opens `image` (at `snap` if given) in `pool`; `read_only` opens it
    /// without taking part in exclusive-lock handovers.
    pub(super) fn open(
        cluster: Arc<Cluster>,
        pool: &str,
        image: &str,
        snap: Option<&str>,
        read_only: bool,
    ) -> io::Result<Self> {
        let lib = lib()?;
        let pool = cstring(pool)?;
        let name = cstring(image)?;
        let snap = snap.map(cstring).transpose()?;
        let mut ioctx: sys::rados_ioctx_t = ptr::null_mut();
        // SAFETY: live connected cluster; `pool` NUL-terminated; `ioctx` a
        // valid out-pointer.
        check(unsafe { lib.rados_ioctx_create(cluster.raw, pool.as_ptr(), &mut ioctx) })?;
        let mut raw: sys::rbd_image_t = ptr::null_mut();
        let snap_p: *const c_char = snap.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        // SAFETY: `ioctx` was just created; `name` and `snap_p` (NULL or
        // NUL-terminated) live for the call; `raw` a valid out-pointer.
        let r = unsafe {
            if read_only {
                lib.rbd_open_read_only(ioctx, name.as_ptr(), &mut raw, snap_p)
            } else {
                lib.rbd_open(ioctx, name.as_ptr(), &mut raw, snap_p)
            }
        };
        if let Err(e) = check(r) {
            // SAFETY: `ioctx` is ours and no image uses it.
            unsafe { lib.rados_ioctx_destroy(ioctx) };
            return Err(e);
        }
        Ok(Self {
            raw,
            ioctx,
            locked: false,
            _cluster: cluster,
        })
    }

    /// Size in bytes.
    pub(super) fn size(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: live image; `size` a valid out-pointer.
        check(unsafe { lib()?.rbd_get_size(self.raw, &mut size) })?;
        Ok(size)
    }

    /// The image's feature bits (`RBD_FEATURE_*`).
    pub(super) fn features(&self) -> io::Result<u64> {
        let mut f = 0u64;
        // SAFETY: live image; `f` a valid out-pointer.
        check(unsafe { lib()?.rbd_get_features(self.raw, &mut f) })?;
        Ok(f)
    }

    /// Takes the exclusive lock and keeps it until close: librbd then
    /// refuses the lock to every other client instead of handing it over.
    pub(super) fn lock_exclusive(&mut self) -> io::Result<()> {
        // SAFETY: live image opened read-write.
        check(unsafe {
            lib()?.rbd_lock_acquire(self.raw, sys::rbd_lock_mode_t_RBD_LOCK_MODE_EXCLUSIVE)
        })?;
        self.locked = true;
        Ok(())
    }

    /// Submits every operation of `ops` asynchronously and waits for all of
    /// them; one result per entry, in order (`Ok(bytes)` for reads).
    pub(super) fn run(&self, ops: &mut [Aio<'_>]) -> Vec<io::Result<usize>> {
        let lib = match lib() {
            Ok(l) => l,
            Err(e) => return ops.iter().map(|_| Err(io::Error::from(e.kind()))).collect(),
        };
        let batch = Arc::new(Batch {
            state: Mutex::new(State {
                left: ops.len(),
                results: vec![0; ops.len()],
            }),
            done: Condvar::new(),
        });
        // Only this thread touches the handles (the callback gets its own).
        let mut completions: Vec<sys::rbd_completion_t> = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter_mut().enumerate() {
            let token = Box::into_raw(Box::new(Token {
                batch: batch.clone(),
                index,
            }));
            let mut c: sys::rbd_completion_t = ptr::null_mut();
            // SAFETY: `token` is a leaked Box handed to exactly one
            // completion; `on_complete` reclaims it when it fires, or we do
            // below if the completion is never submitted.
            let r =
                unsafe { lib.rbd_aio_create_completion(token.cast(), Some(on_complete), &mut c) };
            let r = if r < 0 {
                r
            } else {
                completions.push(c);
                // SAFETY: live image; `c` a fresh completion; the buffers
                // are borrowed from `ops` for this whole call, and we wait
                // below for every completion librbd accepted before
                // returning, so librbd never touches them after that.
                unsafe {
                    match op {
                        Aio::Read(buf, off) => {
                            lib.rbd_aio_read(self.raw, *off, buf.len(), buf.as_mut_ptr().cast(), c)
                        }
                        Aio::Write(buf, off) => {
                            lib.rbd_aio_write(self.raw, *off, buf.len(), buf.as_ptr().cast(), c)
                        }
                        Aio::Flush => lib.rbd_aio_flush(self.raw, c),
                        Aio::Discard(off, len) => lib.rbd_aio_discard(self.raw, *off, *len, c),
                        Aio::WriteZeroes(off, len) => {
                            lib.rbd_aio_write_zeroes(self.raw, *off, *len as usize, c, 0, 0)
                        }
                    }
                }
            };
            if r < 0 {
                // Not submitted: the callback will never run.
                // SAFETY: `token` came from Box::into_raw above and nobody
                // else owns it.
                drop(unsafe { Box::from_raw(token) });
                let mut st = batch.lock();
                st.results[index] = r as i64;
                st.left -= 1;
            }
        }
        let mut st = batch.lock();
        while st.left > 0 {
            st = batch.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        for c in &completions {
            // SAFETY: every completion has fired (or was never submitted);
            // we release our reference once, librbd keeps its own until it
            // is done with it.
            unsafe { lib.rbd_aio_release(*c) };
        }
        st.results
            .iter()
            .map(|&r| {
                if r < 0 {
                    Err(io::Error::from_raw_os_error(-r as i32))
                } else {
                    Ok(r as usize)
                }
            })
            .collect()
    }
}

impl Image {
    /// Starts one read or write that owns its buffer and returns at once;
    /// `then` gets the buffer back with librbd's return value (bytes read,
    /// 0 for a write, `-errno`): from librbd's callback thread, or from
    /// this thread when librbd refuses the operation. `then` must not wait
    /// for librbd (hand the result to another thread).
    pub(super) fn start(&self, write: bool, offset: u64, buf: Vec<u8>, then: Then) {
        let lib = match lib() {
            Ok(l) => l,
            Err(e) => return then(buf, -(e.raw_os_error().unwrap_or(libc::EIO) as i64)),
        };
        let token = Box::into_raw(Box::new(Owned { buf, then }));
        let mut c: sys::rbd_completion_t = ptr::null_mut();
        // SAFETY: `token` is a leaked Box handed to exactly one completion;
        // `on_owned` reclaims it when it fires, or we do below if the
        // operation is never submitted.
        let mut r = unsafe { lib.rbd_aio_create_completion(token.cast(), Some(on_owned), &mut c) };
        if r >= 0 {
            // SAFETY: live image, fresh completion; the buffer lives in the
            // token, which only `on_owned` frees, after librbd is done.
            r = unsafe {
                let b = &mut (*token).buf;
                if write {
                    lib.rbd_aio_write(self.raw, offset, b.len(), b.as_ptr().cast(), c)
                } else {
                    lib.rbd_aio_read(self.raw, offset, b.len(), b.as_mut_ptr().cast(), c)
                }
            };
            if r < 0 {
                // SAFETY: created above, never submitted: ours to release.
                unsafe { lib.rbd_aio_release(c) };
            }
        }
        if r < 0 {
            // SAFETY: not submitted: nobody else owns the token.
            let t = unsafe { Box::from_raw(token) };
            (t.then)(t.buf, r as i64);
        }
    }
}

/// What [`Image::start`]'s callback gets: the buffer and the return value.
pub(super) type Then = Box<dyn FnOnce(Vec<u8>, i64) + Send>;

/// The callback argument of an [`Image::start`] operation.
struct Owned {
    buf: Vec<u8>,
    then: Then,
}

/// librbd's completion callback for [`Image::start`].
unsafe extern "C" fn on_owned(c: sys::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<Owned> leaked by `Image::start` for this one
    // completion; librbd calls this once per completion, so we own it now.
    let t = unsafe { Box::from_raw(arg.cast::<Owned>()) };
    let r = match lib() {
        // SAFETY: `c` is alive for its callback; we release our only
        // reference to it once (librbd keeps its own until done).
        Ok(lib) => unsafe {
            let r = lib.rbd_aio_get_return_value(c) as i64;
            lib.rbd_aio_release(c);
            r
        },
        Err(_) => -(libc::EIO as i64),
    };
    (t.then)(t.buf, r);
}

impl Drop for Image {
    fn drop(&mut self) {
        let Ok(lib) = lib() else { return };
        // SAFETY: live image and its ioctx, closed once; `run` borrows
        // `self`, so no operation is in flight.
        unsafe {
            if self.locked {
                lib.rbd_lock_release(self.raw);
            }
            lib.rbd_close(self.raw);
            lib.rados_ioctx_destroy(self.ioctx);
        }
    }
}

/// One asynchronous operation of [`Image::run`].
pub(super) enum Aio<'a> {
    /// Fill the buffer from the offset.
    Read(&'a mut [u8], u64),
    /// Write the buffer at the offset.
    Write(&'a [u8], u64),
    /// Make completed writes durable.
    Flush,
    /// Deallocate (offset, length); reads back zero.
    Discard(u64, u64),
    /// Zero (offset, length).
    WriteZeroes(u64, u64),
}

struct Batch {
    state: Mutex<State>,
    done: Condvar,
}

struct State {
    left: usize,
    results: Vec<i64>,
}

impl Batch {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a completion's callback argument points to.
struct Token {
    batch: Arc<Batch>,
    index: usize,
}

/// librbd's completion callback (on its finisher thread).
unsafe extern "C" fn on_complete(c: sys::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<Token> leaked by `Image::run` for this one
    // completion; librbd calls this once per completion, so we own it now.
    let token = unsafe { Box::from_raw(arg.cast::<Token>()) };
    let r = match lib() {
        // SAFETY: `c` is the completion being completed, alive for the
        // duration of its callback.
        Ok(lib) => (unsafe { lib.rbd_aio_get_return_value(c) }) as i64,
        Err(_) => -(libc::EIO as i64),
    };
    let mut st = token.batch.lock();
    st.results[token.index] = r;
    st.left -= 1;
    if st.left == 0 {
        token.batch.done.notify_all();
    }
}
