//! Unix sockets ucrypt creates (the control socket, NBD's, vhost-user's):
//! where they may go, how they appear, and when they go away.
//!
//! ```text
//!  path: absent ─────────────────────────────┐
//!        a socket of ours nobody listens on ──┤ (stale: replaced)
//!        anything else ── refused (Busy)      │
//!                                             v
//!  bind PARENT/.uXXXXXX/s (a fresh 0700 dir) ─ chmod 0600 ─ renameat2 into place
//!        (RENAME_NOREPLACE; over a stale one RENAME_EXCHANGE, then the
//!         stale one, checked by inode, is removed from the private dir)
//!  drop ── removes PATH only if it is still the socket bound here (inode)
//! ```
//!
//! A regular file, a directory, a symlink, another uid's socket or a socket
//! someone is listening on is never removed or replaced: a typo that names
//! a disk image where the socket belongs is refused, not unlinked. The
//! socket is bound inside a private directory and renamed into place with
//! its final mode, so it never exists at `path` with the umask's mode. The
//! frontends get the bound listener and never touch the path.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};

use crate::error::{Error, ErrorKind, Result};

/// A socket file bound by [`SocketFile::bind`]; removed when dropped if
/// `path` still names it.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

impl SocketFile {
    /// Binds a listening unix socket at `path`, mode 0600 from the moment
    /// the path exists. What is at `path` decides: nothing, or a stale
    /// socket of our uid (nobody accepts on it), is fine; anything else
    /// is refused with [`ErrorKind::Busy`] ("… exists and is not a
    /// socket", "… is in use by another server").
    pub fn bind(path: &Path) -> Result<(UnixListener, Self)> {
        let stale = check(path)?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let private = Private::new(parent).map_err(|e| io_error(path, e))?;
        let inner = private.0.join("s");
        let listener = UnixListener::bind(&inner).map_err(|e| io_error(path, e))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_error(path, e))?;
        let id = file_id(&inner).map_err(|e| io_error(path, e))?;
        place(&inner, path, stale)?;
        Ok((
            listener,
            Self {
                path: path.to_owned(),
                id,
            },
        ))
    }

    /// Where the socket is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if file_id(&self.path).ok() == Some(self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What is at `path`: `Ok(None)` nothing, `Ok(Some(inode))` a stale socket
/// of ours that may be replaced, else the refusal.
fn check(path: &Path) -> Result<Option<(u64, u64)>> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path, e)),
    };
    let shown = path.display();
    if !m.file_type().is_socket() {
        return Err(Error::new(
            ErrorKind::Busy,
            format!("{shown} exists and is not a socket"),
        ));
    }
    let me = super::euid();
    if m.uid() != me {
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "{shown} is in use by another server (a socket of uid {}, not uid {me})",
                m.uid()
            ),
        ));
    }
    match UnixStream::connect(path) {
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => Ok(Some((m.dev(), m.ino()))),
        Ok(_) => Err(Error::new(
            ErrorKind::Busy,
            format!("{shown} is in use by another server"),
        )),
        Err(e) => Err(Error::new(
            ErrorKind::Busy,
            format!("{shown} is in use by another server"),
        )
        .with_source(e)),
    }
}

/// Moves the bound socket `inner` to `path`: never over anything but the
/// stale socket `stale` found there.
fn place(inner: &Path, path: &Path, stale: Option<(u64, u64)>) -> Result<()> {
    let raced = || {
        check(path).err().unwrap_or_else(|| {
            Error::new(
                ErrorKind::Busy,
                format!("{} changed while the socket was created", path.display()),
            )
        })
    };
    match stale {
        None => match renameat2(
            AT_FDCWD,
            inner,
            AT_FDCWD,
            path,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST) => Err(raced()),
            // No RENAME_NOREPLACE here: link(2) never replaces either.
            Err(Errno::EINVAL) => match std::fs::hard_link(inner, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(raced()),
                Err(e) => Err(io_error(path, e)),
            },
            Err(e) => Err(io_error(path, e.into())),
        },
        Some(old) => {
            match renameat2(
                AT_FDCWD,
                inner,
                AT_FDCWD,
                path,
                RenameFlags::RENAME_EXCHANGE,
            ) {
                Ok(()) => {
                    // `inner` now holds what was at `path`: only the stale
                    // socket we checked may go; anything else goes back.
                    if file_id(inner).ok() == Some(old) {
                        let _ = std::fs::remove_file(inner);
                        return Ok(());
                    }
                    let _ = renameat2(
                        AT_FDCWD,
                        inner,
                        AT_FDCWD,
                        path,
                        RenameFlags::RENAME_EXCHANGE,
                    );
                    Err(raced())
                }
                Err(Errno::EINVAL) => {
                    // No exchange here: re-check, remove, then place as new.
                    if file_id(path).ok() != Some(old) {
                        return Err(raced());
                    }
                    std::fs::remove_file(path).map_err(|e| io_error(path, e))?;
                    place(inner, path, None)
                }
                Err(e) => Err(io_error(path, e.into())),
            }
        }
    }
}

/// A fresh private (0700) directory next to the socket, removed with
/// whatever is left in it.
struct Private(PathBuf);

impl Private {
    fn new(parent: &Path) -> std::io::Result<Self> {
        let d = nix::unistd::mkdtemp(&parent.join(".uXXXXXX"))?;
        Ok(Self(d))
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.join("s"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A path's (device, inode), not following a final symlink.
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::symlink_metadata(path).map(|m| (m.dev(), m.ino()))
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    let kind = match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorKind::PermissionDenied,
        Some(libc::ENOENT | libc::ENOTDIR) => ErrorKind::NoDevice,
        _ => ErrorKind::Io,
    };
    Error::new(kind, format!("Cannot create socket {}", path.display())).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(path: &Path) -> Error {
        SocketFile::bind(path).expect_err("refused")
    }

    #[test]
    fn what_is_in_the_way_is_refused_and_kept() {
        let dir = testutil::TempDir::new("sockfile-refuse");
        let file = dir.join("disk.img");
        std::fs::write(&file, b"precious").unwrap();
        let e = err(&file);
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert!(e.to_string().contains("exists and is not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");

        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(err(&sub).to_string().contains("is not a socket"));
        assert!(sub.is_dir());

        let link = dir.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(err(&link).to_string().contains("is not a socket"));

        let live = dir.join("live.sock");
        let _held = UnixListener::bind(&live).unwrap();
        let e = err(&live);
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert!(e.to_string().contains("in use by another server"), "{e}");
        assert!(UnixStream::connect(&live).is_ok(), "the live socket stays");
        // Nothing of ours is left behind in the directory.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with(".u"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_new_socket_is_0600_listens_and_goes_with_its_owner() {
        let dir = testutil::TempDir::new("sockfile-new");
        let p = dir.join("s.sock");
        let (l, f) = SocketFile::bind(&p).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o777, 0o600);
        let _c = UnixStream::connect(&p).unwrap();
        l.accept().unwrap();
        // A second bind while the first listens is refused.
        assert_eq!(err(&p).kind(), ErrorKind::Busy);
        drop(f);
        assert!(!p.exists(), "removed by its owner");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_stale_socket_is_replaced_but_a_replaced_one_is_not_removed() {
        let dir = testutil::TempDir::new("sockfile-stale");
        let p = dir.join("s.sock");
        drop(UnixListener::bind(&p).unwrap());
        let (_l, f) = SocketFile::bind(&p).unwrap();
        assert!(UnixStream::connect(&p).is_ok());
        // Someone put a file there since: the owner leaves it alone.
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"not ours").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&p).unwrap(), b"not ours");
    }
}
