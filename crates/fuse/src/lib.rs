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
//! Built on the `fuser` crate (pure-Rust mount; no libfuse needed). This
//! file mounts and unmounts; `ops.rs` says what each request does, and two
//! transports carry them: fuser's /dev/fuse threads (`fs.rs`, also INIT
//! and what the kernel never puts on the ring: forgets, interrupts), and
//! FUSE over io_uring (`uring/`, Linux 6.14+ with the `fuse` module's
//! `enable_uring` on), one pinned thread per kernel queue answering
//! without a read or write syscall per request. [`UringMode`] picks:
//! /dev/fuse by default (the ring measured slower at 4k QD1 on a 2-CPU
//! VM), the ring when asked and the kernel takes it, falling back to
//! /dev/fuse under `Auto` ([`Export::transport`] says which).
//! What the file allows (read-only, punch-hole) is the
//! [`datapath::Export`] it serves, and every refusal before submission is
//! that view's ([`datapath::Export::check`] on the whole sectors a request
//! covers), so it is the engine's own. Errors reach the kernel as
//! [`datapath::Error::errno`], the table every frontend shares.
// Only `uring/` (the ring's buffers and SQEs) has `unsafe`, each block
// with its `// SAFETY:` argument.
#![deny(unsafe_code)]

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use datapath::Export as View;
use fuser::{BackgroundSession, Config, MountOption, Session};

mod fs;
mod ops;
mod uring;

use fs::Fs;
use ops::Ops;

/// Errors of the FUSE frontend, in the workspace's shape
/// (docs/ARCHITECTURE.md, "Errors"): a stable [`ErrorKind`], the message
/// `Display` shows and the OS error that caused it as the source. A failed
/// request is not one of these: it is answered through
/// [`datapath::Error::errno`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<io::Error>,
}

/// What went wrong; stable for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Mounting failed.
    Mount,
    /// The mountpoint is not an empty directory (a file, or a directory
    /// with something in it): mounting would hide or misuse it.
    Occupied,
    /// The mountpoint does not exist.
    NoMountpoint,
    /// The exported file is still in use (e.g. a loop device is attached).
    Busy,
    /// Unmounting failed for another reason.
    Unmount,
}

impl Error {
    fn new(kind: ErrorKind, message: String) -> Self {
        Self {
            kind,
            message,
            source: None,
        }
    }

    /// [`ErrorKind::Mount`] at `path`.
    fn mount(path: &Path, source: io::Error) -> Self {
        Self {
            source: Some(source),
            ..Self::new(
                ErrorKind::Mount,
                format!("Cannot mount FUSE export at {}", path.display()),
            )
        }
    }

    /// [`ErrorKind::Occupied`]: what is wrong with `path` ("exists and is
    /// not a directory", "is not empty").
    fn occupied(path: &Path, what: &str) -> Self {
        Self::new(
            ErrorKind::Occupied,
            format!("FUSE mountpoint {} {what}", path.display()),
        )
    }

    /// [`ErrorKind::NoMountpoint`].
    fn no_mountpoint(path: &Path) -> Self {
        Self::new(
            ErrorKind::NoMountpoint,
            format!(
                "FUSE mountpoint {} does not exist (create an empty directory there)",
                path.display()
            ),
        )
    }

    /// [`ErrorKind::Busy`].
    fn busy(path: &Path) -> Self {
        Self::new(
            ErrorKind::Busy,
            format!(
                "FUSE export at {} is busy (is a loop device still attached? try `losetup -j FILE`)",
                path.display()
            ),
        )
    }

    /// [`ErrorKind::Unmount`]: `why` is the unmount tool's message.
    fn unmount(path: &Path, why: &str) -> Self {
        Self::new(
            ErrorKind::Unmount,
            format!("Cannot unmount FUSE export at {}: {why}", path.display()),
        )
    }

    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message (what `Display` shows; the source is apart).
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// How the export looks. What it allows (read-only: writes refused with
/// `EROFS` and a read-only mount; punch-hole passed down as discards) is
/// the [`datapath::Export`] given to [`Export::mount`].
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// Name of the single file inside the mountpoint.
    pub file_name: String,
    /// FUSE session threads (each with its own cloned /dev/fuse fd).
    pub threads: usize,
    /// Whether requests go over io_uring.
    pub uring: UringMode,
}

/// Whether the export's requests go over FUSE-over-io_uring
/// (`--export fuse=DIR,uring=auto|on|off`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UringMode {
    /// The ring when the kernel takes it, /dev/fuse otherwise.
    Auto,
    /// The ring, or the mount fails.
    On,
    /// /dev/fuse only (the default: see the daemon's `FuseUring`).
    #[default]
    Off,
}

impl std::str::FromStr for UringMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!("Invalid uring={s:?}: use auto, on or off")),
        }
    }
}

/// Which transport carries a mounted export's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// read(2)/write(2) on /dev/fuse (fuser's threads).
    DevFuse,
    /// FUSE over io_uring, one queue per CPU.
    Uring,
}

impl Transport {
    /// `dev-fuse` or `io_uring`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DevFuse => "dev-fuse",
            Self::Uring => "io_uring",
        }
    }
}

/// A mounted export. Call [`Export::unmount`] to stop it cleanly.
pub struct Export {
    mountpoint: PathBuf,
    file: PathBuf,
    session: Option<BackgroundSession>,
    transport: Transport,
    /// The io_uring queue threads, if any started.
    queues: Option<uring::Running>,
    stats: Arc<uring::Stats>,
}

impl Export {
    /// Mounts the export at `mountpoint`, which must be an existing empty
    /// directory ([`ErrorKind::NoMountpoint`], [`ErrorKind::Occupied`] otherwise:
    /// nothing is created, and nothing is hidden under the mount). A stale
    /// mount left there by a crashed daemon is detached first.
    pub fn mount(
        view: impl Into<View>,
        mountpoint: &Path,
        cfg: ExportConfig,
    ) -> Result<Self, Error> {
        let view = view.into();
        let merr = |source| Error::mount(mountpoint, source);
        clean_stale_mount(mountpoint).map_err(merr)?;
        check_mountpoint(mountpoint)?;
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
        options.push(if view.read_only() {
            MountOption::RO
        } else {
            MountOption::RW
        });
        let mut config = Config::default();
        config.mount_options = options;
        config.n_threads = Some(cfg.threads.max(1));
        config.clone_fd = cfg.threads > 1;
        let mode = cfg.uring;
        let unavailable = |why: String| {
            merr(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("FUSE over io_uring is unavailable: {why}"),
            ))
        };
        // The rings exist before INIT asks for the ring protocol: once the
        // kernel agreed, it holds requests until the queues register.
        let prepared = match (mode, uring::enabled()) {
            (UringMode::Off, _) => None,
            (_, Some(true)) => match uring::prepare(fs::MAX_WRITE as usize) {
                Ok(p) => Some(p),
                Err(e) if mode == UringMode::On => return Err(unavailable(e.to_string())),
                Err(e) => {
                    log::debug!("FUSE export at {}: /dev/fuse ({e})", mountpoint.display());
                    None
                }
            },
            (UringMode::On, state) => {
                return Err(unavailable(format!(
                    "{} is {}",
                    uring::ENABLE_PARAM,
                    if state.is_some() { "off" } else { "absent" }
                )))
            }
            (UringMode::Auto, _) => {
                log::debug!(
                    "FUSE export at {}: /dev/fuse ({} is not on)",
                    mountpoint.display(),
                    uring::ENABLE_PARAM
                );
                None
            }
        };
        let agreed = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(Ops::new(view, cfg));
        let fs = Fs::new(Arc::clone(&ops), prepared.is_some(), Arc::clone(&agreed));
        let session = Session::new(fs, mountpoint, &config).map_err(merr)?;
        let stats = Arc::new(uring::Stats::default());
        let mut transport = Transport::DevFuse;
        let mut queues = None;
        let mut why = String::from("the kernel did not offer it at INIT");
        if let Some(p) = prepared.filter(|_| agreed.load(Ordering::Acquire)) {
            // A duplicate of the session's descriptor: the queues'
            // commands go to the same connection.
            let dev = session.as_fd().try_clone_to_owned().map_err(merr)?;
            let (running, res) = p.start(dev, Arc::clone(&ops), Arc::clone(&stats));
            queues = Some(running);
            match res {
                Ok(()) => transport = Transport::Uring,
                Err(e) => why = format!("the kernel refused the registration: {e}"),
            }
        }
        if transport == Transport::DevFuse {
            if mode == UringMode::On {
                // Dropping the session unmounts; the queues end with it.
                drop(session);
                if let Some(q) = queues {
                    q.join();
                }
                return Err(unavailable(why));
            }
            if mode == UringMode::Auto {
                log::debug!("FUSE export at {}: /dev/fuse ({why})", mountpoint.display());
            }
        }
        let session = session.spawn().map_err(merr)?;
        Ok(Self {
            mountpoint: mountpoint.to_owned(),
            file,
            session: Some(session),
            transport,
            queues,
            stats,
        })
    }

    /// Which transport carries the requests.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// How many requests the io_uring queues answered so far (0 over
    /// /dev/fuse).
    pub fn ring_requests(&self) -> u64 {
        self.stats.requests.load(Ordering::Relaxed)
    }

    /// The exported file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The mountpoint directory.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts (not lazily: fails with [`ErrorKind::Busy`] while the file is in
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
        if let Some(q) = self.queues.take() {
            // The kernel tore the ring's entries down at unmount.
            q.join();
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

/// Checks that `path` is an empty directory to mount on.
pub fn check_mountpoint(path: &Path) -> Result<(), Error> {
    let occupied = |what| Error::occupied(path, what);
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::no_mountpoint(path)),
        Err(e) => Err(Error::mount(path, e)),
        Ok(m) if !m.is_dir() => Err(occupied("exists and is not a directory")),
        Ok(_) => {
            let mut entries = std::fs::read_dir(path).map_err(|e| Error::mount(path, e))?;
            if entries.next().is_some() {
                return Err(occupied("is not empty"));
            }
            Ok(())
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
                    return Err(Error::busy(path));
                }
            }
            Err(e) => message = e.to_string(),
        }
    }
    Err(Error::unmount(path, &message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_directory_is_a_mountpoint() {
        let dir = std::env::temp_dir().join(format!("ucrypt-fuse-mnt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            check_mountpoint(&dir.join("absent")).map_err(|e| e.kind()),
            Err(ErrorKind::NoMountpoint)
        );
        let file = dir.join("disk.img");
        std::fs::write(&file, b"data").unwrap();
        let e = check_mountpoint(&file).unwrap_err();
        assert!(
            e.to_string().ends_with("exists and is not a directory"),
            "{e}"
        );
        let e = check_mountpoint(&dir).unwrap_err();
        assert!(e.to_string().ends_with("is not empty"), "{e}");
        let empty = dir.join("mnt");
        std::fs::create_dir(&empty).unwrap();
        check_mountpoint(&empty).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
